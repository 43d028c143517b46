"""Peak dense TFLOP/s and peak DRAM bandwidth per GPU, from the vendors' datasheets. Torch-free.

Peak dense TFLOP/s per GPU and precision, from NVIDIA's datasheets (dense, i.e.
without 2:4 sparsity): H100 SXM5 / H200 SXM: FP32 66.9, TF32 494.7, BF16 989.4;
H100 PCIe: 51.2 / 378 / 756; H100 NVL: 60 / 417.5 / 835; A100: 19.5 / 156 / 312.
``fp32`` means strict FP32 (TF32 off); ``tf32`` FP32 storage with TF32 matmuls.
A device not in a table gets no MFU or roof (empty, with the reason), never a guess.
A config's ``peak_tflops`` mapping (device-name substring → precision → TFLOP/s) and
``peak_gbps`` mapping (device-name substring → GB/s) override or extend the tables.
MFU (:mod:`cs336sys.analysis.metrics`) and the roofline (:mod:`cs336sys.analysis.roofline`) read them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# Matched as peak_gbps matches (whole words of torch.cuda.get_device_name(), longest key first).
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100 PCIe": {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0},
    "H100 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.0},
    "H100": {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4},
    "H200": {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4},
    "A100": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0},
}


def peak_tflops(device_name: str, precision: str, overrides: Mapping[str, Mapping[str, float]] | None = None) -> float | None:
    """Dense peak TFLOP/s for ``precision`` on ``device_name``, or ``None`` if unknown."""
    for table in (overrides or {}, PEAK_TFLOPS):
        if (key := _device_key(table, device_name)) is not None and precision in table[key]:
            return float(table[key][precision])
    return None


def _device_key(table: Mapping[str, object], device_name: str) -> str | None:
    """The longest key of ``table`` found as whole words in ``device_name`` ("GH200" is not "H200")."""
    for pattern in sorted(table, key=len, reverse=True):
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(pattern)}(?![A-Za-z0-9])", str(device_name)):
            return pattern
    return None


# Peak DRAM (HBM, GDDR) bandwidth in GB/s (10⁹ bytes/s), from NVIDIA's datasheets: H100 SXM5 3350,
# H100 PCIe 2000, H100 NVL 3900 (H100 Tensor Core GPU datasheet); H200 SXM and NVL 4800 (H200
# datasheet); A100 80GB SXM 2039, 80GB PCIe 1935, 40GB 1555 (A100 datasheet); A10G 600 (A10: 600);
# L4 300; T4 320; V100 SXM2 and PCIe 900 (V100 datasheet); GeForce RTX 4090 1008 (its spec page).
# Matched as whole words of torch.cuda.get_device_name(), longest key first: "NVIDIA H100 PCIe" is
# the PCIe card, "NVIDIA H100 80GB HBM3" the SXM one, and "GH200" or "V100S" match nothing (not a guess).
PEAK_GBPS: dict[str, float] = {
    "H100 PCIe": 2000.0,
    "H100 NVL": 3900.0,
    "H100": 3350.0,
    "H200": 4800.0,
    "A100-SXM4-80GB": 2039.0,
    "A100 80GB PCIe": 1935.0,
    "A100-SXM4-40GB": 1555.0,
    "A100-PCIE-40GB": 1555.0,
    "A10G": 600.0,
    "L4": 300.0,
    "T4": 320.0,
    "V100": 900.0,
    "RTX 4090": 1008.0,
}


def peak_gbps(device_name: str, overrides: Mapping[str, float] | None = None) -> float | None:
    """Peak DRAM bandwidth (GB/s) of ``device_name``, or ``None`` if unknown; ``overrides`` (name → GB/s) first."""
    for table in (overrides or {}, PEAK_GBPS):
        if (key := _device_key(table, device_name)) is not None:
            return float(table[key])
    return None
