"""``cs336sys``: run one benchmark cell and print a markdown table.

    cs336sys e2e --model-size small --context-length 128 --precision bf16 [--only-forward] [--attention sdpa] [--compile]
    cs336sys attention --d-model 64 --seq-len 4096 --activation relu --impl eager
    cs336sys mha --embed-dim 256 --num-heads 8 --seq-len 1024 --variant performer --kernel relu --num-features 128
    cs336sys flash --seq-len 16384 --head-dim 64 --num-heads 16 --impl triton

Every value is checked before anything touches the GPU; the measurement runs
through the same cell runner as the workflow, so an OOM prints as a row.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import yaml

from cs336sys import attention as attn
from cs336sys.dtypes import PRECISIONS
from cs336sys.mha import VARIANTS, is_valid as mha_is_valid
from cs336sys.performer import KERNELS
from cs336sys.sizes import known_sizes
from cs336sys.bench_attention import FLASH_IMPLS

SHOW_COLUMNS = [
    "status", "mode", "phase", "median_ms", "mean_ms", "std_ms", "n", "tflops", "mfu_pct",
    "tokens_per_s", "peak_mem_bytes", "mem_before_bwd_bytes", "error",
]  # fmt: skip


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="where to run (auto: CUDA if present, else CPU)")
    p.add_argument("--timeout", type=float, default=1800, help="per-cell time limit in seconds (default 1800)")
    p.add_argument("--memory-fraction", type=float, default=None, help="cap GPU memory to this fraction (torch.cuda.set_per_process_memory_fraction)")
    p.add_argument("--csv", default=None, help="also write the rows to this CSV (atomically)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cs336sys", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="study", required=True)

    e2e = sub.add_parser("e2e", help="end-to-end TransformerLM forward / training step (handout §1.1.3)")
    e2e.add_argument("--model-size", default="small", help="small, medium, large, xl, 2.7B, or a size from --config's extra_sizes")
    e2e.add_argument("--config", default=None, help="YAML config whose extra_sizes / vocab_size / batch_size are used")
    e2e.add_argument("--context-length", type=_positive, default=128)
    e2e.add_argument("--batch-size", type=_positive, default=None, help="default 4 (the handout's), or the config's")
    e2e.add_argument("--vocab-size", type=_positive, default=None, help="default 10000, or the config's")
    e2e.add_argument("--warmup-steps", type=_non_negative, default=5)
    e2e.add_argument("--measure-steps", type=_positive, default=10)
    e2e.add_argument("--precision", choices=PRECISIONS, default="fp32")
    e2e.add_argument("--attention", choices=("eager", "sdpa", "triton"), default="eager")
    e2e.add_argument("--compile", action="store_true", help="torch.compile the model (compile time lands in warm-up)")
    e2e.add_argument("--only-forward", action="store_true", help="measure the inference forward only")
    e2e.add_argument("--optimizer", choices=("course", "fused"), default="course")
    _common(e2e)

    at = sub.add_parser("attention", help="one attention core, batch × one head (handout §1.2.1)")
    at.add_argument("--d-model", type=_positive, default=64)
    at.add_argument("--seq-len", type=_positive, default=1024)
    at.add_argument("--activation", choices=attn.ACTIVATIONS, default="softmax")
    at.add_argument("--impl", choices=attn.IMPLS, default="eager")
    at.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    at.add_argument("--precision", choices=PRECISIONS, default="fp32")
    at.add_argument("--batch-size", type=_positive, default=8)
    at.add_argument("--warmup-steps", type=_non_negative, default=5)
    at.add_argument("--measure-steps", type=_positive, default=100)
    _common(at)

    mha = sub.add_parser("mha", help="multi-head self-attention layer: exact vs performer")
    mha.add_argument("--embed-dim", type=_positive, default=256)
    mha.add_argument("--num-heads", type=_positive, default=8)
    mha.add_argument("--seq-len", type=_positive, default=1024)
    mha.add_argument("--variant", choices=VARIANTS, default="exact-eager")
    mha.add_argument("--kernel", choices=KERNELS, default="softmax")
    mha.add_argument("--num-features", type=_positive, default=None, help="random features m (performer only)")
    mha.add_argument("--batch-size", type=_positive, default=1)
    mha.add_argument("--precision", choices=PRECISIONS, default="fp32")
    mha.add_argument("--warmup-steps", type=_non_negative, default=3)
    mha.add_argument("--measure-steps", type=_positive, default=10)
    _common(mha)

    fl = sub.add_parser("flash", help="fused attention forward/backward timed by triton.testing.do_bench")
    fl.add_argument("--seq-len", type=_positive, default=4096)
    fl.add_argument("--head-dim", type=_positive, default=64)
    fl.add_argument("--num-heads", type=_positive, default=1)
    fl.add_argument("--batch-size", type=_positive, default=1)
    fl.add_argument("--precision", choices=("fp32", "bf16"), default="bf16")
    fl.add_argument("--impl", choices=FLASH_IMPLS, default="triton")
    fl.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    _common(fl)
    return parser


def _cell_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser):
    from cs336sys.cells import Cell

    if args.study == "e2e":
        try:
            config = yaml.safe_load(Path(args.config).read_text()) if args.config else {}
        except OSError as exc:
            parser.error(f"--config: cannot read {args.config}: {exc.strerror}")
        extra = config.get("extra_sizes") or {}
        sizes = known_sizes(extra)
        if args.model_size not in sizes:
            parser.error(f"unknown --model-size {args.model_size!r}; known sizes: {', '.join(sizes)}")
        e2e_conf = config.get("e2e", {}) or {}
        kwargs = dict(
            size=args.model_size, context_length=args.context_length, precision=args.precision,
            attention=args.attention, compile=args.compile, warmup_steps=args.warmup_steps,
            measure_steps=args.measure_steps, batch_size=args.batch_size or e2e_conf.get("batch_size", 4),
            vocab_size=args.vocab_size or e2e_conf.get("vocab_size", 10_000),
            modes=("inference",) if args.only_forward else ("inference", "train"),
            optimizer=args.optimizer, extra_sizes=extra,
        )  # fmt: skip
        axes = dict(size=args.model_size, ctx=args.context_length, prec=args.precision, attn=args.attention, compile=int(args.compile))
        target = "cs336sys.bench_lm:measure_e2e"
    elif args.study == "attention":
        if not attn.is_valid(args.impl, args.activation):
            parser.error(f"--impl {args.impl} has no {args.activation} attention; valid: eager/compiled/triton × softmax/relu, sdpa × softmax")
        kwargs = dict(d_model=args.d_model, seq_len=args.seq_len, activation=args.activation, impl=args.impl, causal=args.causal,
                      precision=args.precision, batch_size=args.batch_size, warmup_steps=args.warmup_steps, measure_steps=args.measure_steps)  # fmt: skip
        axes = dict(d=args.d_model, seq=args.seq_len, act=args.activation, impl=args.impl, causal=int(args.causal), prec=args.precision)
        target = "cs336sys.bench_attention:measure_attention"
    elif args.study == "mha":
        if not mha_is_valid(args.variant, args.kernel):
            parser.error(f"--variant {args.variant} has no {args.kernel} kernel (exact-sdpa is softmax only)")
        if args.embed_dim % args.num_heads:
            parser.error(f"--embed-dim {args.embed_dim} is not divisible by --num-heads {args.num_heads}")
        if args.variant == "performer" and not args.num_features:
            parser.error("--variant performer needs --num-features")
        kwargs = dict(embed_dim=args.embed_dim, num_heads=args.num_heads, seq_len=args.seq_len, variant=args.variant, kernel=args.kernel,
                      num_features=args.num_features if args.variant == "performer" else None, batch_size=args.batch_size,
                      precision=args.precision, warmup_steps=args.warmup_steps, measure_steps=args.measure_steps)  # fmt: skip
        axes = dict(embed=args.embed_dim, heads=args.num_heads, seq=args.seq_len, variant=args.variant, kernel=args.kernel, m=args.num_features or 0)
        target = "cs336sys.bench_mha:measure_mha"
    else:
        kwargs = dict(seq_len=args.seq_len, head_dim=args.head_dim, precision=args.precision, impl=args.impl,
                      batch_size=args.batch_size, num_heads=args.num_heads, causal=args.causal)  # fmt: skip
        axes = dict(seq=args.seq_len, d=args.head_dim, prec=args.precision, impl=args.impl, heads=args.num_heads)
        target = "cs336sys.bench_attention:measure_flash"
    cell_id = "_".join(f"{k}={v}" for k, v in axes.items())
    axes["precision"] = kwargs.get("precision", "fp32")
    return Cell(args.study, cell_id, axes, target, kwargs, device=args.device, timeout_s=args.timeout, memory_fraction=args.memory_fraction)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.memory_fraction is not None and not 0 < args.memory_fraction <= 1:
        parser.error("--memory-fraction must be in (0, 1]")
    cell = _cell_from_args(args, parser)

    from cs336sys.cells import rows_to_frame, run_cell, write_csv_atomic
    from cs336sys.metrics import add_derived

    # The child resolves --device auto: asking torch.cuda here would poison a fork
    # (torch marks a process that queried CUDA), and fork is otherwise safe because
    # this process has run no torch computation (see cells._context).
    frame = add_derived(rows_to_frame(run_cell(cell, start_method="fork"), cell.axes))
    if args.device == "auto" and (frame.get("device") == "cpu").all():
        print("note: no CUDA device found; running on CPU (memory columns stay empty)", file=sys.stderr)
    if args.csv:
        write_csv_atomic(frame, args.csv)
    first = frame.iloc[0]
    print(f"# {args.study} {cell.cell_id} on {first.get('device_name', '?')} (torch {first.get('torch_version', '?')})\n")
    shown = frame[[c for c in SHOW_COLUMNS if c in frame.columns]]
    print(shown.to_markdown(index=False, floatfmt=".4g"))
    return 0 if (frame["status"] == "ok").all() else 1


if __name__ == "__main__":
    sys.exit(main())
