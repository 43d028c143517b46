"""cs336sys: reproducible benchmarks of Transformer LMs and attention variants.

Layers, lowest first (each a package with its own docstring): ``models`` (what is measured),
``measure`` (how: timing, memory, FLOPs, state), ``studies`` (one package per study: axes,
measurement, figures, findings), ``pipeline`` (config, cell runner, rows, hashes) and
``analysis`` (merge, report, compare; never torch). ``MODEL_SIZES`` and the size helpers import
without torch; the model is imported on first use (``cs336sys.TransformerLM``).
"""

from cs336sys.models.sizes import BATCH_SIZE, MODEL_SIZES, VOCAB_SIZE, ModelSize, parameter_count, resolve_size

__all__ = ["BATCH_SIZE", "MODEL_SIZES", "VOCAB_SIZE", "ModelSize", "parameter_count", "resolve_size", "TransformerLM"]


def __getattr__(name: str):
    if name == "TransformerLM":
        from cs336sys.models.model import TransformerLM

        return TransformerLM
    raise AttributeError(f"module 'cs336sys' has no attribute {name!r}")
