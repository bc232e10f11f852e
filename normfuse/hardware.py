"""Read the GPU as it is (never set clocks, power limits or modes) and compare it with the configured hardware.

Reads through NVML (``nvidia-ml-py``), falling back to ``nvidia-smi``; on a machine without a GPU returns
``{"available": False}``.
"""

from __future__ import annotations

import shutil
import subprocess
import warnings


def _handle(index: int = 0, uuid: str | None = None):
    """NVML handle of the GPU with this UUID ('GPU-...', as a worker reports it for its own CUDA device), else of
    the first GPU that ``CUDA_VISIBLE_DEVICES`` names (a UUID or an index; NVML's indices follow the PCI bus order,
    which is CUDA's only with CUDA_DEVICE_ORDER=PCI_BUS_ID, so prefer passing the worker's UUID), else ``index``."""
    import os

    import pynvml

    pynvml.nvmlInit()
    if uuid:
        return pynvml.nvmlDeviceGetHandleByUUID(uuid)
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if first.startswith("GPU-"):
        return pynvml.nvmlDeviceGetHandleByUUID(first)
    if first.isdigit():
        index = int(first)
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def read_gpu(index: int = 0, uuid: str | None = None) -> dict:
    """Name, UUID, SM count (via torch if CUDA is up), driver, power limit (W), SM/memory clocks (MHz),
    temperature (°C) of the GPU named by ``uuid`` (see ``_handle``; default: the first visible one)."""
    info: dict = {"available": False}
    try:
        import pynvml

        h = _handle(index, uuid)
        name = pynvml.nvmlDeviceGetName(h)
        info = {
            "available": True,
            "gpu_name": name.decode() if isinstance(name, bytes) else name,
            "driver": _s(pynvml.nvmlSystemGetDriverVersion()),
            "power_limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
            "power_draw_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
            "max_sm_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
            "temperature_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
            "memory_total_gib": pynvml.nvmlDeviceGetMemoryInfo(h).total / 2**30,
            "gpu_uuid": _s(pynvml.nvmlDeviceGetUUID(h)),
        }
    except Exception:  # no NVML / no GPU: try nvidia-smi
        info = _read_nvidia_smi(index)
    if info.get("available"):
        try:
            import torch

            if torch.cuda.is_available() and torch.cuda.is_initialized():  # never create a context just for this
                p = torch.cuda.get_device_properties(0)
                info["sm_count"] = p.multi_processor_count
                info["compute_capability"] = f"{p.major}.{p.minor}"
                info["l2_cache_mb"] = getattr(p, "L2_cache_size", 0) / 2**20
        except Exception:
            pass
    return info


def _s(v):
    return v.decode() if isinstance(v, bytes) else v


def _read_nvidia_smi(index: int) -> dict:
    if not shutil.which("nvidia-smi"):
        return {"available": False}
    q = "name,driver_version,power.limit,clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu"
    try:
        out = subprocess.run(["nvidia-smi", f"--id={index}", f"--query-gpu={q}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout.strip()
    except Exception:
        return {"available": False}
    f = [x.strip() for x in out.split(",")]
    return {"available": True, "gpu_name": f[0], "driver": f[1], "power_limit_w": _num(f[2]),
            "sm_clock_mhz": _num(f[3]), "mem_clock_mhz": _num(f[4]), "max_sm_clock_mhz": _num(f[5]),
            "temperature_c": _num(f[6])}


def _num(x):
    try:
        return float(x)
    except ValueError:
        return None


def sm_clock_mhz(index: int = 0, uuid: str | None = None):
    """Current SM clock in MHz of the GPU named by ``uuid`` (see ``_handle``), or None where it cannot be read."""
    try:
        import pynvml

        return pynvml.nvmlDeviceGetClockInfo(_handle(index, uuid), pynvml.NVML_CLOCK_SM)
    except Exception:
        return None


class Sampler:
    """Background NVML sampling of one GPU (SM clock MHz, temperature °C, power W) every ``period_s`` while a
    paired-timing window runs: ``with Sampler(uuid) as s: ...`` then ``s.stats()`` -> min/median/max of each (None
    without NVML). Reads only; never sets anything."""

    def __init__(self, uuid: str | None = None, period_s: float = 0.05):
        import threading

        self.uuid, self.period_s = uuid, period_s
        self.samples: list[tuple] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="nvml-sampler")

    def _run(self):
        try:
            import pynvml

            h = _handle(0, self.uuid)
        except Exception:  # noqa: BLE001
            return
        while not self._stop.is_set():
            try:
                self.samples.append((pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                                     pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
                                     pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0))
            except Exception:  # noqa: BLE001
                return
            self._stop.wait(self.period_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=2)

    def stats(self) -> dict:
        import statistics

        out = {}
        for i, name in enumerate(("sm_clock_mhz", "temperature_c", "power_w")):
            vals = [s[i] for s in self.samples]
            out[f"{name}_min"] = min(vals) if vals else None
            out[f"{name}_median"] = statistics.median(vals) if vals else None
            out[f"{name}_max"] = max(vals) if vals else None
        out["nvml_samples"] = len(self.samples)
        return out


def compare(configured: dict, read: dict, *, strict: bool = False) -> list[str]:
    """Compare the configured hardware (``configs/hardware/*.yaml``) with what was read.

    Returns the list of mismatch messages (also issued as warnings). With ``strict=True`` a mismatch raises
    RuntimeError. Checked: GPU name (``gpu_name_contains``), SM count, power limit (±5 W).
    """
    problems: list[str] = []
    if not read.get("available"):
        problems.append(f"configured hardware {configured.get('name')!r} but no GPU was found (CPU mode)")
    else:
        want = configured.get("gpu_name_contains")
        if want and want.lower() not in str(read.get("gpu_name", "")).lower():
            problems.append(f"configured {configured.get('name')!r} expects a GPU named like {want!r}, "
                            f"found {read.get('gpu_name')!r}")
        if configured.get("sm_count") and read.get("sm_count") and int(configured["sm_count"]) != int(read["sm_count"]):
            problems.append(f"SM count: configured {configured['sm_count']}, read {read['sm_count']}")
        pl = configured.get("power_limit_w")
        if pl and read.get("power_limit_w") and abs(float(pl) - float(read["power_limit_w"])) > 5:
            problems.append(f"power limit: configured {pl} W, read {read['power_limit_w']:.0f} W (not changed)")
    for p in problems:
        warnings.warn(f"hardware mismatch: {p}", stacklevel=2)
    if problems and strict and read.get("available"):
        raise RuntimeError("hardware mismatch (hardware.strict=true): " + "; ".join(problems))
    return problems
