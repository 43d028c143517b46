"""Study ``profile``: where the GPU time goes, kernel by kernel, per phase (handout §1.1.4)."""

from cs336sys.catalog import LM
from cs336sys.studies import Study

STUDY = Study(
    name="profile",
    question="Which kernels take the time of a forward, a backward and an optimizer step? (§1.1.4)",
    axes=("size", "context_length", "precision", "impl"),
    kind=LM,
    config_keys=("extra_sizes",),
    artifacts=True,
    estimate_s=11.0,  # the median cell of the H100 default sweep (results/h100), rounded
    renamed={"ctx": "context_length", "attn": "impl"},
)
