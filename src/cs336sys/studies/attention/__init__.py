"""Study ``attention``: one attention core, batch × one head, time and memory vs length (handout §1.2.1)."""

from cs336sys.models.variants import is_valid
from cs336sys.studies import Study

STUDY = Study(
    name="attention",
    question="How do eager softmax and ReLU attention (and our fused kernels) scale in time and memory with sequence length? (§1.2.1)",
    axes=("d_model", "seq_len", "activation", "impl", "causal", "precision"),
    valid=lambda axes: is_valid(axes["impl"], axes["activation"]),  # SDPA has no ReLU: not a cell
    why_invalid="impl sdpa has no relu activation (valid: eager, compiled, triton × softmax, relu; sdpa × softmax)",
    optional_modules={"cs336sys.models.triton_attention": lambda axes: axes["impl"] == "triton"},
    attention_shape=lambda row: (row.get("batch_size"), 1, row.get("seq_len"), row.get("d_model"), row.get("causal")),
)
