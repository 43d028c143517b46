"""Study ``memory``: the CUDA allocator's history, its timeline and largest allocations (handout §1.1.6)."""

from cs336sys.studies import Study

STUDY = Study(
    name="memory",
    question="How much memory do a forward and a training step of the 2.7B model take, and what takes it? (§1.1.6)",
    axes=("size", "context_length", "precision", "impl", "mode"),
    config_keys=("extra_sizes",),
    artifacts=True,
    cell_table=False,
)
