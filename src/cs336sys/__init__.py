"""cs336sys: reproducible benchmarks of Transformer LMs and attention variants.

``MODEL_SIZES`` and the size helpers import without torch; the model and the
measurement modules are imported on first use (``cs336sys.TransformerLM``).
"""

from cs336sys.sizes import BATCH_SIZE, MODEL_SIZES, VOCAB_SIZE, ModelSize, parameter_count, resolve_size

__all__ = ["BATCH_SIZE", "MODEL_SIZES", "VOCAB_SIZE", "ModelSize", "parameter_count", "resolve_size", "TransformerLM"]


def __getattr__(name: str):
    if name == "TransformerLM":
        from cs336sys.model import TransformerLM

        return TransformerLM
    raise AttributeError(f"module 'cs336sys' has no attribute {name!r}")
