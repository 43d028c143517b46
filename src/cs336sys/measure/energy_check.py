"""Check the timed blocks' energy meter against a plain window meter on real steps, in one process.

    python -m cs336sys.measure.energy_check [--window-s 6] [--blocks 4] [--pairs 10] [--reads 300]

Workloads on cuda:0 (NVML device ``$CS336SYS_GPU_INDEX``, else 0), one after another: the e2e
study's inference forward (batch 4, context 256, SDPA, vocabulary 10 000: ``measure.lm_steps``) of
the small model in bf16 and in fp32 and of the large model in fp32, and ten bf16 matmuls of 8192².
Each is warmed up, then measured by:

- the pipeline's meter (``pipeline J``): ``--blocks`` timed blocks as an e2e cell's energy blocks
  are timed (``time_steps``: 5 warm-up steps, 2 steps and at least ``MIN_BLOCK_S`` per block), half
  before the window below and half after it; the median of their J/step (``energy_j``);
- a plain window meter (``window J``): the counter read only at the two ends of ``--window-s``
  seconds of steps run back to back, its joules over its steps; ``window W`` its joules over its
  seconds (for the matmuls, ``nvidia-smi``'s mean ``power.draw`` over the same window beside it);
- the metering cost (``cost``): the block's median step time with the meter's sampler running over
  without, as ``--pairs`` interleaved pairs of blocks (on off, off on, ...), the paired ratio's
  geometric mean and 95% interval (``measure.stats.paired_ratio``); ``step ms`` the median of the
  blocks without the sampler;
- the read cost (``read ms``): ``--reads`` counter reads back to back from this thread, GPU idle:
  median and 90th percentile.

``ratio`` is pipeline J / window J. It prints a JSON line per workload as it goes, the table last but
one, and one JSON line last. Each workload runs ``--warm-s`` + ``--window-s`` seconds of steps and
2 × ``--pairs`` + ``--blocks`` blocks of at least 0.5 s, besides building its model and the reads.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

SIZE = 8192  # the matmul workload's matrices (bf16)
LM = {"context_length": 256, "impl": "sdpa", "batch_size": 4, "vocab_size": 10000, "optimizer": "course", "extra_sizes": {}}
WORKLOADS = (  # (name, model size or None for the matmuls, precision)
    ("small bf16 inference", "small", "bf16"),
    ("small fp32 inference", "small", "fp32"),
    ("large fp32 inference", "large", "fp32"),
    ("bf16 matmuls", None, "bf16"),
)
MAX_RATIO_OFF, MAX_COST = 0.03, 0.02  # the acceptance: J/step within 3% of the window's, metering costs at most 2%


def _smi_samples(text: str, start: float, end: float) -> list[float]:
    """Power readings (W) of ``nvidia-smi --query-gpu=timestamp,power.draw`` lines inside [start, end] (epoch seconds)."""
    watts = []
    for line in text.splitlines():
        stamp, _, power = line.partition(",")
        try:
            t = datetime.strptime(stamp.strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
            w = float(power.strip().split()[0])
        except (ValueError, IndexError):
            continue
        if start <= t <= end:
            watts.append(w)
    return watts


def window(step: Callable[[], None], read_mj: Callable[[], float], seconds: float) -> tuple[float, float, int]:
    """(joules, seconds, steps) of ``step`` run back to back for ``seconds``, the counter read at the two ends only."""
    start_mj, t0, steps = read_mj(), time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        step()
        steps += 1
    t1 = time.perf_counter()
    return (read_mj() - start_mj) / 1e3, t1 - t0, steps


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile of ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def verdict(row: dict[str, Any]) -> str:
    """ok where the pipeline's J/step is within MAX_RATIO_OFF of the window's and metering costs at most MAX_COST."""
    ratio, cost = row.get("ratio"), row.get("cost")
    good = ratio is not None and abs(ratio - 1) <= MAX_RATIO_OFF and cost is not None and cost <= 1 + MAX_COST
    return "ok" if good else "FAIL"


def _num(x: Any, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


def table(rows: list[dict[str, Any]]) -> str:
    """The summary: one line per workload."""
    head = "| workload | step ms | window J | pipeline J [95%] | ratio | window W | smi W | read ms (p50/p90) | cost [95%] | |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        cells = [
            r["workload"],
            _num(r["step_ms"], ".4g"),
            _num(r["window_j"], ".4g"),
            f"{_num(r['pipeline_j'], '.4g')} [{_num(r['pipeline_low_j'], '.4g')}, {_num(r['pipeline_high_j'], '.4g')}]",
            _num(r["ratio"], ".4f"),
            _num(r["window_w"], ".4g"),
            _num(r["smi_w"], ".4g"),
            f"{_num(r['read_ms'], '.3g')}/{_num(r['read_p90_ms'], '.3g')}",
            f"{_num(r['cost'], '.4f')} [{_num(r['cost_low'], '.4f')}, {_num(r['cost_high'], '.4f')}]",
            verdict(r),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _steps(size: str | None, precision: str, device) -> tuple[Callable, Callable[[], None]]:
    """(a step as the timing harness calls it, the same step synchronised without a clock): the workload's work."""
    import torch

    from cs336sys.measure.lm_steps import LMCell, inference_step_fn
    from cs336sys.measure.timing import StepClock, synchronize

    if size is None:
        a = torch.randn(SIZE, SIZE, device=device, dtype=torch.bfloat16)

        def timed(clock: StepClock) -> None:
            with clock.phase("forward"):
                for _ in range(10):
                    a @ a

    else:
        model, inputs, _ = LMCell(size=size, precision=precision, **LM).setup(device)
        timed = inference_step_fn(model, inputs, precision, device)

    def plain() -> None:
        timed(StepClock(device))
        synchronize(device)

    return timed, plain


def metering_cost(timed: Callable, meter: Any, device: Any, pairs: int) -> tuple[list[float], Any]:
    """(median step ms of the blocks without the sampler, the paired ratio with / without): blocks on off, off on, ..."""
    from cs336sys.measure import energy
    from cs336sys.measure.stats import paired_ratio
    from cs336sys.measure.timing import STEP, synchronize, timed_block

    medians: dict[bool, list[float]] = {True: [], False: []}
    for k in range(pairs):
        for on in (True, False) if k % 2 == 0 else (False, True):
            block = timed_block(timed, 2, energy.MIN_BLOCK_S, device, time.perf_counter, synchronize, meter if on else None)
            medians[on].append(statistics.median(block[STEP]))
    return medians[False], paired_ratio(medians[True], medians[False])


def smi_watts(smi: subprocess.Popen | None, start: float, end: float) -> float | None:
    """nvidia-smi's mean power.draw over [start, end] (epoch seconds), stopping it; None without it."""
    if smi is None:
        return None
    smi.terminate()
    watts = _smi_samples(smi.communicate(timeout=10)[0], start, end)
    return statistics.fmean(watts) if watts else None


def check(
    name: str, size: str | None, precision: str, args: argparse.Namespace, nvml: Any, handle: Any, device: Any, session: Any
) -> dict[str, Any]:
    """One workload's figures (module doc) on ``device``, NVML's ``handle`` the same GPU, ``session`` its meter's."""
    from cs336sys.measure import energy
    from cs336sys.measure.session import Policy
    from cs336sys.measure.timing import time_steps

    timed, plain = _steps(size, precision, device)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < args.warm_s:  # clocks up, kernels chosen, the board warm
        plain()
    settings = {"warmup": 5, "steps": 2, "device": device}
    before = time_steps(timed, session, policy=Policy(args.blocks // 2, min_measure_s=energy.MIN_BLOCK_S), **settings)
    smi = None
    if size is None and shutil.which("nvidia-smi"):
        query = ["--query-gpu=timestamp,power.draw", "--format=csv,noheader,nounits", "-lms", "100"]
        smi = subprocess.Popen(["nvidia-smi", "-i", os.environ.get("CS336SYS_GPU_INDEX", "0"), *query], stdout=subprocess.PIPE, text=True)
        time.sleep(1.0)
    start = time.time()
    joules, seconds, steps = window(plain, lambda: float(nvml.nvmlDeviceGetTotalEnergyConsumption(handle)), args.window_s)
    end = time.time()
    after = time_steps(timed, session, policy=Policy(args.blocks - args.blocks // 2, min_measure_s=energy.MIN_BLOCK_S), **settings)
    smi_w = smi_watts(smi, start, end)
    pipeline = energy.energy_stats([b.energy for b in before.blocks + after.blocks])
    unmetered, cost = metering_cost(timed, session.meter("cuda"), device, args.pairs)
    reads = []
    for _ in range(args.reads):
        r0 = time.perf_counter()
        nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        reads.append((time.perf_counter() - r0) * 1e3)
    window_j = joules / steps
    bounds = [x if x == x else None for x in (cost.median, cost.low, cost.high)]  # nan: too few pairs
    return {
        "workload": name,
        "step_ms": statistics.median(unmetered),
        "window_j": window_j,
        "window_s": seconds,
        "window_steps": steps,
        "window_w": joules / seconds,
        "smi_w": smi_w,
        "pipeline_j": pipeline["energy_j"],
        "pipeline_low_j": pipeline["energy_ci_low_j"],
        "pipeline_high_j": pipeline["energy_ci_high_j"],
        "pipeline_blocks_j": pipeline["energy_samples_j"],
        "pipeline_note": pipeline["energy_note"],
        "ratio": pipeline["energy_j"] / window_j if pipeline["energy_j"] else None,
        "read_ms": statistics.median(reads),
        "read_p90_ms": percentile(reads, 0.9),
        "cost": bounds[0],
        "cost_low": bounds[1],
        "cost_high": bounds[2],
        "pairs": args.pairs,
    }


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(prog="python -m cs336sys.measure.energy_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--window-s", type=float, default=6.0, help="length of the plain window (default 6 s)")
    parser.add_argument(
        "--blocks", type=int, default=4, help="the pipeline meter's timed blocks (default 4: an e2e cell's 2 per pass × 2 passes)"
    )
    parser.add_argument("--pairs", type=int, default=10, help="interleaved pairs of blocks with and without the sampler (default 10)")
    parser.add_argument("--reads", type=int, default=300, help="counter reads timed back to back (default 300)")
    parser.add_argument("--warm-s", type=float, default=2.0, help="seconds of each workload's steps before it is measured (default 2)")
    args = parser.parse_args(argv)
    if args.window_s < 6 or args.blocks < 2 or args.pairs < 2 or args.reads < 10:
        parser.error("--window-s must be at least 6, --blocks and --pairs at least 2, --reads at least 10")
    import pynvml
    import torch

    from cs336sys.measure import energy
    from cs336sys.measure.session import Session

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    session = Session()
    meter = session.meter("cuda")
    if meter.source != energy.COUNTER:
        raise SystemExit(f"NVML's energy counter is not available here: {meter.note}")
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(int(os.environ.get("CS336SYS_GPU_INDEX") or 0))
    rows = []
    for name, size, precision in WORKLOADS:
        rows.append(check(name, size, precision, args, pynvml, handle, torch.device("cuda", 0), session))
        print(json.dumps(rows[-1]), flush=True)
        torch.cuda.empty_cache()
    result = {
        "device": torch.cuda.get_device_name(0),
        "driver": pynvml.nvmlSystemGetDriverVersion(),
        "torch": torch.__version__,
        "accept": all(verdict(r) == "ok" for r in rows[:3]),  # the three LM workloads
        "workloads": rows,
    }
    print(table(rows))
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
