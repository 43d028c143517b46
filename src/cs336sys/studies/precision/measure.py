"""Mixed-precision experiments of the handout's §1.1.5.

(mixed_precision_accumulation and benchmarking_mixed_precision(a).)

Two small tables: what accumulating 0.01 a thousand times gives in each
accumulator/summand precision, and which dtype each tensor of the handout's
ToyModel gets under `torch.autocast`.

Autocast differs by device (torch 2.13, checked): on CUDA `layer_norm` is on
autocast's fp32 list, so the LayerNorm output is fp32 even from bf16/fp16
inputs; on CPU it is not on the list and simply follows its input, so under CPU
bf16 autocast the LayerNorm output is bf16. CPU autocast accepts bf16 and fp16;
other dtypes make torch warn and disable autocast, which the table reports.
"""

from __future__ import annotations

import warnings

import pandas as pd
import torch
from torch import nn

from cs336sys.measure.session import Session

EXACT_SUM = 10.0  # 1000 × 0.01

# (case, accumulator dtype, summand dtype, cast summand to the accumulator's dtype first)
ACCUMULATION_CASES = [
    ("a", torch.float32, torch.float32, False),
    ("b", torch.float16, torch.float16, False),
    ("c", torch.float32, torch.float16, False),
    ("d", torch.float32, torch.float16, True),
    ("bf16", torch.bfloat16, torch.bfloat16, False),
    ("fp32+bf16", torch.float32, torch.bfloat16, False),
]


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def accumulate(acc: torch.dtype, summand: torch.dtype, cast: bool = False, n: int = 1000) -> float:
    """The handout's loop: s = tensor(0, acc); s += tensor(0.01, summand), n times."""
    s = torch.tensor(0, dtype=acc)
    for _ in range(n):
        x = torch.tensor(0.01, dtype=summand)
        if cast:
            x = x.type(acc)
        s += x  # in-place: the result keeps the accumulator's dtype, rounding at every step
    return float(s)


def accumulation_table() -> pd.DataFrame:
    """Columns case, accumulator, summand, result, abs_error (against the exact 10.0)."""
    rows = []
    for case, acc, summand, cast in ACCUMULATION_CASES:
        result = accumulate(acc, summand, cast)
        summand_name = f"{_name(summand)} cast to {_name(acc)}" if cast else _name(summand)
        rows.append(dict(case=case, accumulator=_name(acc), summand=summand_name, result=result, abs_error=abs(result - EXACT_SUM)))
    return pd.DataFrame(rows, columns=["case", "accumulator", "summand", "result", "abs_error"])


class ToyModel(nn.Module):
    """The handout's ToyModel, verbatim in structure."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, 10, bias=False)
        self.ln = nn.LayerNorm(10)
        self.fc2 = nn.Linear(10, out_features, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.fc1(x))
        x = self.ln(x)
        x = self.fc2(x)
        return x


QUANTITIES = ["parameters", "fc1 output", "layer-norm output", "logits", "loss", "gradients"]


def _dtypes(tensors) -> str:
    return ",".join(sorted({_name(t.dtype) for t in tensors}))


def autocast_dtypes(device: str, dtype: torch.dtype) -> pd.DataFrame:
    """Dtype of each ToyModel quantity under torch.autocast(device, dtype).

    Columns device, autocast_dtype, quantity, dtype, note. When autocast cannot
    run with this dtype on this device, every row has an empty dtype and the reason
    in `note` (torch would otherwise silently run in fp32).
    """

    def table(dtypes: dict[str, str | None], note: str = "") -> pd.DataFrame:
        return pd.DataFrame(
            [dict(device=device, autocast_dtype=_name(dtype), quantity=q, dtype=dtypes.get(q), note=note) for q in QUANTITIES]
        )

    if device == "cuda" and not torch.cuda.is_available():
        return table({}, "CUDA is not available")
    torch.manual_seed(0)
    model = ToyModel(16, 5).to(device)
    x = torch.randn(4, 16, device=device)
    target = torch.randint(0, 5, (4,), device=device)
    seen: dict[str, str] = {}

    def record(quantity: str):
        def hook(module, inputs, output) -> None:
            seen[quantity] = _name(output.dtype)

        return hook

    # hooks read the modules' outputs without changing the handout's forward
    hooks = [
        model.fc1.register_forward_hook(record("fc1 output")),
        model.ln.register_forward_hook(record("layer-norm output")),
    ]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.autocast(device_type=device, dtype=dtype):
                # an unsupported dtype makes torch warn and turn autocast off
                if not torch.is_autocast_enabled(device):
                    # one line: the note lands in markdown tables
                    reason = " ".join(" ".join(str(w.message).split()) for w in caught)
                    return table({}, f"autocast to {_name(dtype)} unsupported on {device}: {reason or 'autocast disabled'}")
                logits = model(x)
                loss = nn.functional.cross_entropy(logits, target)
        loss.backward()  # outside autocast, as recommended; grads follow the params' dtype
    except RuntimeError as e:  # e.g. an op without a kernel for this dtype on this device
        return table({}, f"{type(e).__name__}: {e}")
    finally:
        for h in hooks:
            h.remove()
    seen.update(
        {
            "parameters": _dtypes(model.parameters()),
            "logits": _name(logits.dtype),
            "loss": _name(loss.dtype),
            "gradients": _dtypes(p.grad for p in model.parameters()),
        }
    )
    return table(seen)


PARTS = ("accumulation", "autocast-bf16", "autocast-fp16")


def measure(device: torch.device, context: dict, session: Session, *, part: str):
    """Cell measurement of the ``precision`` study: one table as rows (kind = part); it times nothing (``session``)."""
    context["mode"] = part
    if part == "accumulation":
        table = accumulation_table()
    elif part in ("autocast-bf16", "autocast-fp16"):
        table = autocast_dtypes(device.type, torch.bfloat16 if part.endswith("bf16") else torch.float16)
    else:
        raise ValueError(f"unknown precision part {part!r}; known: {', '.join(PARTS)}")
    for rec in table.to_dict("records"):
        yield {"kind": part, **rec}
