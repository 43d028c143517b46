"""Study ``attention``: one attention core, batch × one head, time and memory vs length (handout §1.2.1)."""

from cs336sys import catalog
from cs336sys.studies import Axes, Study


def _offered() -> str:
    """'eager, compiled, triton × softmax, relu; sdpa × softmax': the implementations grouped by their activations."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for impl in catalog.impls(catalog.CORE):
        groups.setdefault(impl.activations, []).append(impl.name)
    return "; ".join(f"{', '.join(names)} × {', '.join(acts)}" for acts, names in groups.items())


def _valid(axes: Axes, offered: catalog.Catalog) -> bool:
    """An implementation × activation that its catalog line offers (SDPA has no ReLU), of the config's implementations."""
    return axes["impl"] in offered.names(catalog.CORE) and axes["activation"] in offered.lookup(axes["impl"]).activations


STUDY = Study(
    name="attention",
    question="How do eager softmax and ReLU attention (and our fused kernels) scale in time and memory with sequence length? (§1.2.1)",
    axes=("d_model", "seq_len", "activation", "impl", "causal", "precision"),
    kind=catalog.CORE,
    valid=_valid,
    why_invalid=f"that impl × activation is not offered (valid: {_offered()})",
    estimate_s=4.0,  # the median cell of the H100 default sweep (results/h100), rounded
    attention_shape=lambda row: (row.get("batch_size"), 1, row.get("seq_len"), row.get("d_model"), row.get("causal")),
    renamed={"d": "d_model", "seq": "seq_len", "act": "activation"},  # runs before the axes got one name each
)
