"""Study ``memory``: the CUDA allocator's history, its timeline and largest allocations (handout §1.1.6)."""

from cs336sys.catalog import LM
from cs336sys.studies import Study

STUDY = Study(
    name="memory",
    question="How much memory do a forward and a training step of the 2.7B model take, and what takes it? (§1.1.6)",
    axes=("size", "context_length", "precision", "impl", "mode"),
    kind=LM,
    config_keys=("extra_sizes",),
    artifacts=True,
    cell_table=False,
    estimate_s=4.0,  # the median cell of the H100 default sweep (results/h100), rounded
    renamed={"ctx": "context_length", "attn": "impl"},
    added_axes={"impl": "eager"},  # a section-level setting then, eager in every committed run
)
