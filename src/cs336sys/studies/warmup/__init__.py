"""Study ``warmup``: what too little warm-up does to the numbers (handout §1.1.3(c))."""

from cs336sys.catalog import LM
from cs336sys.studies import Study

STUDY = Study(
    name="warmup",
    question="What happens to the e2e numbers with 0, 1, 2 or 5 warm-up steps? (§1.1.3(c))",
    axes=("size", "context_length", "precision", "impl", "compile", "warmup_steps"),
    kind=LM,
    config_keys=("extra_sizes",),
    estimate_s=3.0,  # the median cell of the H100 default sweep (results/h100), rounded
    renamed={"ctx": "context_length", "attn": "impl", "warmup": "warmup_steps"},
)
