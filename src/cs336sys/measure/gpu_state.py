"""The GPU's and host's state around a timed block, recorded in the row.

A timing taken while the GPU was power-capped, thermally throttled or idling at low
clocks, or while the host was busy, looks like any other number in a CSV. Reading the
clocks, temperature, power and NVML's clock-event ("throttle") reasons at the start and
end of each timed block puts that evidence into the row, so a suspicious cell can be
explained or flagged instead of guessed at. Everything goes through NVML (the
``nvidia-ml-py`` package, imported lazily) and never raises: a missing library, driver
or field leaves the value empty and says why in ``gpu_state_note``, because a state
reading must never cost a measurement. No torch import: NVML needs no CUDA context.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable

# NVML clock-event reason bits, as in nvml.h (nvmlClocksEventReason*, formerly
# nvmlClocksThrottleReason*); hard-coded so decoding works without nvidia-ml-py.
THROTTLE_BITS: dict[int, str] = {
    0x001: "gpu_idle",  # nvmlClocksEventReasonGpuIdle
    0x002: "applications_clocks_setting",  # nvmlClocksEventReasonApplicationsClocksSetting
    0x004: "sw_power_cap",  # nvmlClocksEventReasonSwPowerCap
    0x008: "hw_slowdown",  # nvmlClocksEventReasonHwSlowdown
    0x010: "sync_boost",  # nvmlClocksEventReasonSyncBoost
    0x020: "sw_thermal",  # nvmlClocksEventReasonSwThermalSlowdown
    0x040: "hw_thermal",  # nvmlClocksEventReasonHwThermalSlowdown
    0x080: "hw_power_brake",  # nvmlClocksEventReasonHwPowerBrakeSlowdown
    0x100: "display_clocks",  # nvmlClocksEventReasonDisplayClockSetting
}
# reasons that do not slow a timed kernel: idle between launches, or clocks set on purpose
BENIGN_REASONS = frozenset({"gpu_idle", "applications_clocks_setting", "none"})

GPU_COLUMNS = (
    "gpu_index",
    "gpu_uuid",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "max_sm_clock_mhz",
    "temperature_c",
    "power_w",
    "throttle_reasons",
    "gpu_state_note",
)


def decode_throttle_reasons(mask: int) -> list[str]:
    """Readable names of the bits set in an NVML clock-event mask; ["none"] for 0.

    A bit this table does not know becomes "bit_0x...", so a reason added by a newer
    driver is still visible (and counts as throttling).
    """
    if mask == 0:
        return ["none"]
    names = []
    for bit in range(64):
        if mask & (1 << bit):
            names.append(THROTTLE_BITS.get(1 << bit, f"bit_{1 << bit:#x}"))
    return names


def _reasons(nvml, handle) -> str:
    try:
        mask = nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
    except (AttributeError, nvml.NVMLError):  # drivers/bindings older than the rename
        mask = nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)
    return ";".join(decode_throttle_reasons(int(mask)))


def gpu_state(index: int | None = None) -> dict[str, object]:
    """Clocks, temperature, power and throttle reasons of NVML device ``index``.

    ``index`` is the NVML (nvidia-smi) index, not the CUDA one: under
    CUDA_VISIBLE_DEVICES=<uuid> the process's cuda:0 may be NVML device 3. None means
    ``$CS336SYS_GPU_INDEX`` (set by gpulock.pin_environment), else 0. Each field is read
    on its own, so one unsupported field empties only itself; never raises.
    """
    state: dict[str, object] = dict.fromkeys(GPU_COLUMNS, "")
    if index is None:
        try:
            index = int(os.environ.get("CS336SYS_GPU_INDEX") or 0)
        except ValueError:
            state["gpu_state_note"] = f"bad CS336SYS_GPU_INDEX={os.environ['CS336SYS_GPU_INDEX']!r}"
            return state
    try:
        import pynvml as nvml
    except ImportError:
        state["gpu_state_note"] = "no NVML bindings (pip install nvidia-ml-py)"
        return state
    try:
        nvml.nvmlInit()
    except Exception as err:  # noqa: BLE001 - NVMLError, or OSError from a broken library
        state["gpu_state_note"] = f"NVML unavailable: {err}"
        return state
    notes = []
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        state["gpu_index"] = index
        readers: dict[str, Callable[[], object]] = {
            "gpu_uuid": lambda: str(nvml.nvmlDeviceGetUUID(handle)),
            "sm_clock_mhz": lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
            "mem_clock_mhz": lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM),
            "max_sm_clock_mhz": lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM),
            "temperature_c": lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
            "power_w": lambda: round(nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0, 1),  # mW
            "throttle_reasons": lambda: _reasons(nvml, handle),
        }
        for column, read in readers.items():
            try:
                state[column] = read()
            except Exception as err:  # noqa: BLE001 - one field's failure must not cost the others
                notes.append(f"{column}: {err}")
    except Exception as err:  # noqa: BLE001
        notes.append(f"GPU {index}: {err}")
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    state["gpu_state_note"] = "; ".join(notes)
    return state


def host_state() -> dict[str, object]:
    """CPU model, core count and 1-minute load: a busy host slows kernel launches."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    try:
        load = float(os.getloadavg()[0])
    except OSError:
        load = float("nan")
    return {"cpu_model": model or platform.processor() or platform.machine(), "cpu_count": os.cpu_count(), "load_avg_1m": load}


def throttled(reasons: str) -> bool:
    """True when ``reasons`` (a throttle_reasons value) holds one that slows kernels.

    gpu_idle, applications_clocks_setting and none do not; an empty value (not measured)
    is not evidence of throttling either.
    """
    return any(r.strip() and r.strip() not in BENIGN_REASONS for r in reasons.split(";"))


def below_clocks(sm_mhz: object, max_mhz: object, frac: float = 0.9) -> bool:
    """True when the SM clock was under ``frac`` of its maximum; False when either is unknown."""
    try:
        sm, top = float(sm_mhz), float(max_mhz)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return top > 0 and sm < frac * top


SAMPLED = ("sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_w", "throttle_reasons")


def sample() -> dict[str, object]:
    """What changes during a cell, read at the start and end of its timing: clocks, heat, power, load."""
    state = gpu_state()
    return {**{k: state[k] for k in SAMPLED}, **host_load()}


def host_load() -> dict[str, object]:
    """The host's 1-minute load: the part of the host state that changes during a cell."""
    return {"load_avg_1m": host_state()["load_avg_1m"]}


AT_CLOCKS = 0.97  # of the maximum: under load the H200's SM clock sits at 1980 MHz or a bin or two below


def clocks_up(index: int | None = None) -> Callable[[], bool] | None:
    """A reader of whether NVML device ``index`` (see :func:`gpu_state`) runs its SM clock at its maximum
    now, keeping NVML initialised while it lives; None where NVML cannot tell."""
    try:
        import pynvml as nvml

        nvml.nvmlInit()
        handle = nvml.nvmlDeviceGetHandleByIndex(int(os.environ.get("CS336SYS_GPU_INDEX") or 0) if index is None else index)
        top = nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM)
    except Exception:  # noqa: BLE001 - no bindings, no driver, a bad index: the warm-up waits its time
        return None

    def up() -> bool:
        try:
            return not below_clocks(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM), top, AT_CLOCKS)
        except Exception:  # noqa: BLE001
            return False

    return up
