"""Check the energy meter against ``nvidia-smi``'s power readings over one long, steady workload.

    python -m cs336sys.measure.energy_check [--seconds 30] [--size 8192]

Runs bf16 matrix multiplications of ``size``³ on cuda:0 for ``seconds``, metered as a timed
block is (:class:`cs336sys.measure.energy.NvmlMeter`, one counter read per step), while
``nvidia-smi`` logs the board's power every 100 ms; prints both averages over the same window
and their ratio as one JSON line. ``nvidia-smi``'s ``power.draw`` is itself an average over a
period NVML chooses, so over a steady load of many periods the two should agree within a few percent.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from datetime import datetime


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


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the metered block (default 30)")
    parser.add_argument("--size", type=int, default=8192, help="matrix size of the bf16 matmuls (default 8192)")
    args = parser.parse_args(argv)
    import torch

    from cs336sys.measure.energy import NvmlMeter

    if not torch.cuda.is_available() or shutil.which("nvidia-smi") is None:
        raise SystemExit("needs a CUDA GPU and nvidia-smi")
    index = os.environ.get("CS336SYS_GPU_INDEX", "0")
    a = torch.randn(args.size, args.size, device="cuda", dtype=torch.bfloat16)
    for _ in range(20):  # warm: clocks up, cuBLAS chosen
        a @ a
    torch.cuda.synchronize()
    smi = subprocess.Popen(
        ["nvidia-smi", "-i", index, "--query-gpu=timestamp,power.draw", "--format=csv,noheader,nounits", "-lms", "100"],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.0)
    meter = NvmlMeter()
    start = time.time()
    t0 = time.monotonic()
    meter.begin()
    steps = 0
    while time.monotonic() - t0 < args.seconds:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()
        meter.mark()
        steps += 1
    joules, note = meter.end()
    seconds = time.monotonic() - t0
    end = time.time()
    time.sleep(0.5)
    smi.terminate()
    out, _ = smi.communicate(timeout=10)
    watts = _smi_samples(out, start, end)
    counter_w = joules / seconds if joules is not None else None
    smi_w = sum(watts) / len(watts) if watts else None
    result = {
        "device": torch.cuda.get_device_name(0),
        "seconds": round(seconds, 2),
        "source": meter.source,
        "note": note,
        "meter_w": None if counter_w is None else round(counter_w, 1),
        "nvidia_smi_w": None if smi_w is None else round(smi_w, 1),
        "nvidia_smi_samples": len(watts),
        "ratio": None if not (counter_w and smi_w) else round(counter_w / smi_w, 4),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
