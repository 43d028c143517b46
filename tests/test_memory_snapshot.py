"""Active-memory timeline and largest allocations from a snapshot with the real structure."""

import os
import sysconfig

import pytest
import torch

from cs336sys.measure.memory_snapshot import (
    MIB,
    active_timeline,
    clock_us,
    dump_snapshot,
    largest_allocations,
    load_snapshot,
    plot_timeline,
    record_history,
)

USER = {"filename": "/home/u/cs336sys/model.py", "line": 42, "name": "forward"}
CALLER = {"filename": "/home/u/bench.py", "line": 7, "name": "step"}
TORCH = {"filename": "/site-packages/torch/nn/modules/module.py", "line": 1775, "name": "_call_impl"}
STDLIB = {"filename": os.path.join(sysconfig.get_paths()["stdlib"], "contextlib.py"), "line": 81, "name": "inner"}
CPP = {"filename": "/pytorch/c10/cuda/CUDACachingAllocator.cpp", "line": 1200, "name": "malloc"}
STACK = [CPP, TORCH, USER, STDLIB, CALLER]  # innermost first, as torch stores it


def synthetic_snapshot() -> dict:
    # Device 0: block 0x1000 (500 B requested) was allocated before recording and is
    # still live; 0x3000 (200 B) was allocated before recording and freed during it;
    # 0x1200 is allocated during the trace and still live, so its block must not
    # count twice. Device 1 exists only to check that it is ignored.
    seg0 = {
        "device": 0,
        "address": 0x1000,
        "total_size": 4096,
        "stream": 0,
        "blocks": [
            {"address": 0x1000, "size": 512, "requested_size": 500, "state": "active_allocated", "frames": []},
            {"address": 0x1200, "size": 512, "requested_size": 512, "state": "active_allocated", "frames": STACK},
            {"address": 0x1400, "size": 3072, "requested_size": 0, "state": "inactive", "frames": []},
        ],
    }
    seg1 = {
        "device": 1,
        "address": 0x9000,
        "total_size": 1024,
        "stream": 0,
        "blocks": [{"address": 0x9000, "size": 1024, "requested_size": 1024, "state": "active_allocated", "frames": []}],
    }

    def ev(action, addr, size, t, frames=()):
        return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": list(frames), "time_us": t}

    trace0 = [
        ev("segment_alloc", 0x1000, 4096, 1_000_100),
        ev("alloc", 0x5000, 300, 1_000_110, [USER, CALLER]),
        ev("free_requested", 0x3000, 200, 1_000_120),
        ev("free_completed", 0x3000, 200, 1_000_121),
        ev("alloc", 0x6000, 1000, 1_000_130, STACK),
        ev("free_requested", 0x5000, 300, 1_000_140),
        ev("free_completed", 0x5000, 300, 1_000_141),
        {"action": "oom", "device_free": 0, "size": 10**9, "stream": 0, "frames": [], "time_us": 1_000_150},
        ev("alloc", 0x1200, 512, 1_000_160, [TORCH, STDLIB]),
    ]
    return {"segments": [seg0, seg1], "device_traces": [trace0, [ev("alloc", 0x9000, 1024, 5)]]}


def test_active_timeline_exact():
    tl = active_timeline(synthetic_snapshot(), device=0)
    assert list(tl.columns) == ["time_us", "allocated_bytes"]
    assert tl["time_us"].tolist() == [1_000_100, 1_000_110, 1_000_121, 1_000_130, 1_000_141, 1_000_160]
    # baseline 700 = 500 (live block from before) + 200 (freed during the trace)
    assert tl["allocated_bytes"].tolist() == [700, 1000, 800, 1800, 1500, 2012]


def test_active_timeline_block_addresses_from_segment():
    # legacy blocks without "address" tile the segment: the same answer
    snap = synthetic_snapshot()
    for b in snap["segments"][0]["blocks"]:
        del b["address"]
    assert active_timeline(snap)["allocated_bytes"].tolist() == [700, 1000, 800, 1800, 1500, 2012]


def test_empty_trace():
    tl = active_timeline({"segments": [], "device_traces": [[]]})
    assert tl.empty and list(tl.columns) == ["time_us", "allocated_bytes"]


def test_largest_allocations():
    top = largest_allocations(synthetic_snapshot(), top_n=2)
    assert top["size_bytes"].tolist() == [1000, 512]
    assert top["size_mib"].tolist() == [1000 / MIB, 512 / MIB]
    assert top["time_us"].tolist() == [1_000_130, 1_000_160]
    # C++, torch and stdlib frames are skipped when user frames exist
    assert top["frames"].iloc[0] == "model.py:42 forward ← bench.py:7 step"
    # with no user frame, fall back to the Python frames there are
    assert top["frames"].iloc[1] == "module.py:1775 _call_impl ← contextlib.py:81 inner"
    assert len(largest_allocations(synthetic_snapshot(), top_n=10)) == 3


def test_plot_timeline(tmp_path):
    snap = synthetic_snapshot()
    tl = active_timeline(snap)
    out = tmp_path / "fig" / "timeline.png"
    phases = [("forward", 1_000_100, 1_000_135), ("backward", 1_000_135, 1_000_160)]
    plot_timeline(tl, str(out), title="2.7B ctx=128 fp32 forward", phases=phases)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.parent.glob(".tmp-*"))


def test_cuda_only_helpers_fail_clearly(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(RuntimeError, match="CUDA"):
        with record_history():
            pass
    with pytest.raises(RuntimeError, match="CUDA"):
        dump_snapshot(str(tmp_path / "s.pickle"))


@pytest.mark.gpu
def test_real_snapshot(tmp_path):
    path = tmp_path / "snapshot.pickle"
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
    x = torch.randn(256, 1024, device="cuda")
    torch.cuda.synchronize()
    with record_history():
        t0 = clock_us()
        loss = model(x).square().mean()
        t1 = clock_us()
        loss.backward()
        torch.cuda.synchronize()
        t2 = clock_us()
        dump_snapshot(str(path))
    snap = load_snapshot(str(path))
    tl = active_timeline(snap)
    assert len(tl) > 2
    # parameters and the input were allocated before recording: they form the baseline
    params_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert tl["allocated_bytes"].iloc[0] >= params_bytes + x.numel() * 4
    # the allocator's epoch-µs clock agrees with clock_us() to well within a second
    assert abs(tl["time_us"].iloc[0] - t0) < 1e6
    top = largest_allocations(snap, top_n=5)
    assert top["size_bytes"].iloc[0] >= 256 * 4096 * 4  # the hidden activation
    assert top["frames"].str.contains("test_memory_snapshot.py").any()
    # Python stacks only: C++ frames cost seconds to symbolise in the dump (record_history)
    frames = [f["filename"] for e in snap["device_traces"][0] for f in e.get("frames", [])]
    assert frames and not [f for f in frames if f.endswith((".cpp", ".h", ".cu"))]
    out = tmp_path / "timeline.png"
    plot_timeline(tl, str(out), title="gpu test", phases=[("forward", t0, t1), ("backward", t1, t2)])
    assert out.stat().st_size > 0
