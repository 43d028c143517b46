"""Study ``mha``: a multi-head attention layer, exact vs Performer, softmax vs ReLU (the ReLU/SoftMax benchmark pages)."""

from cs336sys.models.variants import MHA_CORES, mha_is_valid
from cs336sys.studies import Axes, Study


def _canonical(axes: Axes) -> Axes:
    # random features only mean something for the performer: exact cells carry num_features=0
    return axes if axes["variant"] == "performer" else {**axes, "num_features": 0}


STUDY = Study(
    name="mha",
    question="How do exact (eager, SDPA) and Performer attention layers scale with sequence length, with softmax and ReLU kernels?",
    axes=("embed_dim", "num_heads", "seq_len", "variant", "kernel", "num_features"),
    kind="attention-layer",  # a multi-head layer (projections around a core): exact or Performer
    valid=lambda axes, offered: mha_is_valid(axes["variant"], axes["kernel"]) and axes["embed_dim"] % axes["num_heads"] == 0,
    why_invalid="variant exact-sdpa has no relu kernel (it is softmax only), and embed_dim must be divisible by num_heads",
    canonical=_canonical,
    # performer cells never run the exact cores: editing models/attention.py leaves them alone (no mha
    # variant selects a catalog implementation, so no cell hashes our Triton kernels: pipeline.plan.cell_modules)
    # and exact cells never run Performer's: editing models/performer.py leaves them alone
    runs_impls=lambda axes: [MHA_CORES[axes["variant"]]] if axes["variant"] in MHA_CORES else [],
    optional_modules={
        "cs336sys.models.attention": lambda axes: axes["variant"] != "performer",
        "cs336sys.models.performer": lambda axes: axes["variant"] == "performer",
    },
    estimate_s=5.0,  # the median cell of the H100 default sweep (results/h100), rounded
    renamed={"embed": "embed_dim", "heads": "num_heads", "seq": "seq_len", "m": "num_features"},  # runs before the axes got one name each
)
