"""GPU and host state columns: no NVML here, a fake NVML, throttle decoding, flags."""

import math
import sys
import types

import pytest

from cs336sys.measure import gpu_state as gs


class FakeNVMLError(Exception):
    pass


def fake_nvml(*, event_reasons=None, throttle_reasons=0x4, fail=(), init_error=None):
    """A stand-in pynvml module: one GPU at NVML index 2 running at 1200 of 1980 MHz."""
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError = FakeNVMLError
    nvml.NVML_CLOCK_SM, nvml.NVML_CLOCK_MEM, nvml.NVML_TEMPERATURE_GPU = 1, 2, 0
    calls = []

    def call(name, value):
        def fn(*args):
            calls.append(name)
            if name in fail:
                raise FakeNVMLError(f"{name} Not Supported")
            return value(*args) if callable(value) else value

        return fn

    def init():
        if init_error:
            raise init_error

    nvml.nvmlInit = init
    nvml.nvmlShutdown = call("shutdown", None)
    nvml.nvmlDeviceGetHandleByIndex = call(
        "handle", lambda i: ("handle", i) if i == 2 else (_ for _ in ()).throw(FakeNVMLError("Invalid Argument"))
    )
    nvml.nvmlDeviceGetUUID = call("uuid", "GPU-1234")
    nvml.nvmlDeviceGetClockInfo = call("clock", lambda h, kind: {1: 1200, 2: 2619}[kind])
    nvml.nvmlDeviceGetMaxClockInfo = call("maxclock", lambda h, kind: 1980)
    nvml.nvmlDeviceGetTemperature = call("temp", 71)
    nvml.nvmlDeviceGetPowerUsage = call("power", 612345)  # mW
    if event_reasons is not None:
        nvml.nvmlDeviceGetCurrentClocksEventReasons = call("events", event_reasons)
    nvml.nvmlDeviceGetCurrentClocksThrottleReasons = call("throttle", throttle_reasons)
    nvml.calls = calls
    return nvml


def _assert_empty_with_note(state):
    assert set(state) == set(gs.GPU_COLUMNS)
    assert all(state[c] == "" for c in gs.GPU_COLUMNS if c != "gpu_state_note")
    assert state["gpu_state_note"]


def test_real_nvml_never_raises():
    # CPU-only machine: nvidia-ml-py may be installed but no driver library: empty + note.
    # On a GPU machine the same call fills the clocks instead.
    for state in (gs.gpu_state(), gs.gpu_state(0)):
        if state["gpu_uuid"] == "":
            _assert_empty_with_note(state)
        else:
            assert isinstance(state["sm_clock_mhz"], int) and state["throttle_reasons"]


def test_no_bindings_gives_empty_values_and_a_note(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    state = gs.gpu_state()
    _assert_empty_with_note(state)
    assert "nvidia-ml-py" in state["gpu_state_note"]


def test_nvml_init_failure_is_a_note(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(init_error=OSError("libnvidia-ml.so.1: cannot open")))
    state = gs.gpu_state(0)
    assert state["sm_clock_mhz"] == ""
    assert "libnvidia-ml" in state["gpu_state_note"]


def test_fake_nvml_fills_the_columns(monkeypatch):
    nvml = fake_nvml(event_reasons=0x1 | 0x20)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv("CS336SYS_GPU_INDEX", "2")
    state = gs.gpu_state()
    assert state == {
        "gpu_index": 2,
        "gpu_uuid": "GPU-1234",
        "sm_clock_mhz": 1200,
        "mem_clock_mhz": 2619,
        "max_sm_clock_mhz": 1980,
        "temperature_c": 71,
        "power_w": 612.3,
        "throttle_reasons": "gpu_idle;sw_thermal",
        "gpu_state_note": "",
    }
    assert "throttle" not in nvml.calls  # the new name is used when it exists
    assert nvml.calls[-1] == "shutdown"


def test_old_bindings_fall_back_to_throttle_reasons(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(throttle_reasons=0x4))
    assert gs.gpu_state(2)["throttle_reasons"] == "sw_power_cap"


def test_one_unsupported_field_empties_only_itself(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(fail=("power",)))
    state = gs.gpu_state(2)
    assert state["power_w"] == ""
    assert state["sm_clock_mhz"] == 1200
    assert "power_w" in state["gpu_state_note"] and "Not Supported" in state["gpu_state_note"]


def test_bad_index_is_a_note_not_an_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    state = gs.gpu_state(5)
    assert state["gpu_index"] == "" and state["sm_clock_mhz"] == ""
    assert "Invalid Argument" in state["gpu_state_note"]
    monkeypatch.setenv("CS336SYS_GPU_INDEX", "fake")
    assert "CS336SYS_GPU_INDEX" in gs.gpu_state()["gpu_state_note"]


@pytest.mark.parametrize(
    "mask, names",
    [
        (0, ["none"]),
        (0x1, ["gpu_idle"]),
        (0x2, ["applications_clocks_setting"]),
        (0x4 | 0x8, ["sw_power_cap", "hw_slowdown"]),
        (0x10 | 0x20 | 0x40 | 0x80 | 0x100, ["sync_boost", "sw_thermal", "hw_thermal", "hw_power_brake", "display_clocks"]),
        (0x1 | 0x400, ["gpu_idle", "bit_0x400"]),
    ],
)
def test_decode_throttle_reasons(mask, names):
    assert gs.decode_throttle_reasons(mask) == names


def test_host_state():
    host = gs.host_state()
    assert isinstance(host["cpu_model"], str) and host["cpu_model"]
    assert isinstance(host["cpu_count"], int) and host["cpu_count"] >= 1
    assert isinstance(host["load_avg_1m"], float) and not math.isnan(host["load_avg_1m"])


@pytest.mark.parametrize(
    "reasons, expected",
    [
        ("", False),
        ("none", False),
        ("gpu_idle", False),
        ("applications_clocks_setting;gpu_idle", False),
        ("sw_power_cap", True),
        ("gpu_idle;hw_thermal", True),
        ("bit_0x400", True),
        ("gpu_idle; sw_thermal", True),
    ],
)
def test_throttled(reasons, expected):
    assert gs.throttled(reasons) is expected


@pytest.mark.parametrize(
    "sm, top, expected",
    [
        (1980, 1980, False),
        (1800, 1980, False),
        (1700, 1980, True),
        (100, 1980, True),
        ("", 1980, False),
        (1500, "", False),
        (None, None, False),
        (1500, 0, False),
    ],
)
def test_below_clocks(sm, top, expected):
    assert gs.below_clocks(sm, top) is expected
    assert gs.below_clocks(1800, 1980, frac=0.95) is True
