"""Study ``e2e``: TransformerLM inference forward and training step (handout §1.1.3, §1.1.5, §1.3)."""

from cs336sys.catalog import LM
from cs336sys.studies import Pair, Study


def _eager(axes) -> bool:
    return not axes["cuda_graphs"]


STUDY = Study(
    name="e2e",
    question="How long do a forward and a training step of each model size take, by context, precision and attention? (§1.1.3, §1.1.5)",
    axes=("size", "context_length", "precision", "impl", "compile", "cuda_graphs"),
    kind=LM,
    config_keys=("extra_sizes",),
    estimate_s=5.0,  # the median cell of the H100 default sweep (results/h100), rounded
    renamed={"ctx": "context_length", "attn": "impl"},  # runs before the axes got one name each
    added_axes={"cuda_graphs": 0},
    # The handout's ratios, each timed in one process as interleaved blocks (measure.timing.time_arms);
    # in eager-launch cells: a graph cell's steps are GPU-bound, and its own intervals are tight.
    pairs=(
        Pair("cuda_graphs", False, True, "eager launches / CUDA graphs", always=True),  # the GPU time of every eager step
        Pair("precision", "fp32", "bf16", "fp32 / bf16 autocast", when=_eager),
        Pair("compile", False, True, "eager / torch.compile", when=_eager),
        Pair("impl", "eager", "sdpa", "eager attention / SDPA", when=_eager),
    ),
)
