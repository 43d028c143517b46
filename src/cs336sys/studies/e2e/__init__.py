"""Study ``e2e``: TransformerLM inference forward and training step (handout §1.1.3, §1.1.5, §1.3)."""

from cs336sys.studies import Study

STUDY = Study(
    name="e2e",
    question="How long do a forward and a training step of each model size take, by context, precision and attention? (§1.1.3, §1.1.5)",
    axes=("size", "context_length", "precision", "impl", "compile", "cuda_graphs"),
    config_keys=("extra_sizes",),
    optional_modules={"cs336sys.models.triton_attention": lambda axes: axes["impl"] == "triton"},
)
