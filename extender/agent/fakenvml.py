"""A pynvml-shaped fake for tests and `deepres bench agent`: same function names, constants, error
classes and codes, with devices and failures configured in Python.

It is NOT a source: `deepres agent --source` offers only `nvml` and `simulated`, and nothing in the
agent imports this module. Tests and the benchmark hand a `FakeNvml` to `NvmlSource` in place of
the real `pynvml` module, so the production code path is exercised unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, ClassVar

MIB = 1024 * 1024

# the codes and messages of pynvml (nvml.h), so the source's error handling sees real values
ERROR_CODES: dict[str, tuple[int, str]] = {
    "UNINITIALIZED": (1, "Uninitialized"),
    "INVALID_ARGUMENT": (2, "Invalid Argument"),
    "NOT_SUPPORTED": (3, "Not Supported"),
    "NO_PERMISSION": (4, "Insufficient Permissions"),
    "ALREADY_INITIALIZED": (5, "Already Initialized"),
    "NOT_FOUND": (6, "Not Found"),
    "INSUFFICIENT_SIZE": (7, "Insufficient Size"),
    "DRIVER_NOT_LOADED": (9, "Driver Not Loaded"),
    "TIMEOUT": (10, "Timeout"),
    "LIBRARY_NOT_FOUND": (12, "NVML Shared Library Not Found"),
    "FUNCTION_NOT_FOUND": (13, "Function Not Found"),
    "GPU_IS_LOST": (15, "GPU is lost"),
    "RESET_REQUIRED": (16, "GPU requires restart"),
    "LIB_RM_VERSION_MISMATCH": (18, "RM has detected an NVML/RM version mismatch."),
    "ARGUMENT_VERSION_MISMATCH": (25, "Argument version mismatch"),
    "GPU_NOT_FOUND": (28, "GPU not found"),
    "UNKNOWN": (999, "Unknown Error"),
}


class NVMLError(Exception):
    """Like pynvml.NVMLError: `value` is the NVML return code; subclasses per code."""

    _by_code: ClassVar[dict[int, type[NVMLError]]] = {}

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return next((text for code, text in ERROR_CODES.values() if code == self.value), f"NVML Error {self.value}")


def _error_class(name: str, code: int) -> type[NVMLError]:
    class_name = "NVMLError_" + "".join(part.capitalize() for part in name.split("_"))

    def init(self: NVMLError, *_args: Any) -> None:
        NVMLError.__init__(self, code)

    cls = type(class_name, (NVMLError,), {"__init__": init})
    NVMLError._by_code[code] = cls
    return cls


ERROR_CLASSES: dict[str, type[NVMLError]] = {name: _error_class(name, code) for name, (code, _) in ERROR_CODES.items()}


def nvml_error(name: str) -> NVMLError:
    """An instance of the subclass pynvml would raise for NVML_ERROR_<name>."""
    return ERROR_CLASSES[name](ERROR_CODES[name][0])


@dataclass
class FakeGpu:
    """One device. `failures` maps a pynvml function name to the NVML_ERROR_<name> it raises."""

    uuid: str
    name: str = "NVIDIA A100-SXM4-40GB"
    total_mib: int = 40960
    used_mib: int = 0  # v1 semantics: total - free (includes reserved)
    reserved_mib: int = 0
    util_gpu_pct: int = 0
    util_memory_pct: int = 0
    temperature_c: int = 40
    power_mw: int = 60000
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, used MiB or None)
    mig: list[FakeGpu] | None = None  # MIG instances; None: MIG not supported
    supports_memory_v2: bool = True
    failures: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Handle:
    gpu: FakeGpu


class FakeNvml:
    """An object with pynvml's attribute names; pass it where a `pynvml` module is expected."""

    NVMLError = NVMLError
    NVML_TEMPERATURE_GPU = 0
    NVML_DEVICE_MIG_DISABLE = 0
    NVML_DEVICE_MIG_ENABLE = 1
    nvmlMemory_v2 = 0x02000028

    def __init__(self, gpus: list[FakeGpu], init_error: str = "", count_error: str = "") -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.count_error = count_error
        self.initialized = False
        self.calls = 0
        for name, (code, _) in ERROR_CODES.items():
            setattr(self, f"NVML_ERROR_{name}", code)
            setattr(self, ERROR_CLASSES[name].__name__, ERROR_CLASSES[name])

    # library
    def nvmlInit(self) -> None:
        if self.init_error:
            raise nvml_error(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._check()
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check()
        return "550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        if self.count_error:
            raise nvml_error(self.count_error)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._check()
        if not 0 <= index < len(self.gpus):
            raise nvml_error("INVALID_ARGUMENT")
        return self._call(_Handle(self.gpus[index]), "nvmlDeviceGetHandleByIndex")

    # identity
    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        return self._call(handle, "nvmlDeviceGetUUID").gpu.uuid

    def nvmlDeviceGetName(self, handle: _Handle) -> bytes:
        return self._call(handle, "nvmlDeviceGetName").gpu.name.encode()  # older pynvml returns bytes

    # MIG
    def nvmlDeviceGetMigMode(self, device: _Handle) -> list[int]:
        gpu = self._call(device, "nvmlDeviceGetMigMode").gpu
        if gpu.mig is None:
            raise nvml_error("NOT_SUPPORTED")
        mode = self.NVML_DEVICE_MIG_ENABLE if gpu.mig else self.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: _Handle) -> int:
        self._call(device, "nvmlDeviceGetMaxMigDeviceCount")
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: _Handle, index: int) -> _Handle:
        gpu = self._call(device, "nvmlDeviceGetMigDeviceHandleByIndex").gpu
        if not gpu.mig or index >= len(gpu.mig):
            raise nvml_error("NOT_FOUND")
        return _Handle(gpu.mig[index])

    # figures
    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> SimpleNamespace:
        gpu = self._call(handle, "nvmlDeviceGetMemoryInfo").gpu
        total, used = gpu.total_mib * MIB, gpu.used_mib * MIB
        if version is None:
            return SimpleNamespace(total=total, free=total - used, used=used)
        if not gpu.supports_memory_v2:
            raise nvml_error("FUNCTION_NOT_FOUND")
        reserved = gpu.reserved_mib * MIB  # v2: `used` excludes what the driver reserves
        return SimpleNamespace(version=version, total=total, reserved=reserved, free=total - used, used=used - reserved)

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> SimpleNamespace:
        gpu = self._call(handle, "nvmlDeviceGetUtilizationRates").gpu
        return SimpleNamespace(gpu=gpu.util_gpu_pct, memory=gpu.util_memory_pct)

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        return self._call(handle, "nvmlDeviceGetTemperature").gpu.temperature_c

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        return self._call(handle, "nvmlDeviceGetPowerUsage").gpu.power_mw

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[SimpleNamespace]:
        gpu = self._call(handle, "nvmlDeviceGetComputeRunningProcesses").gpu
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=None if mib is None else mib * MIB, gpuInstanceId=0xFFFFFFFF)
            for pid, mib in gpu.processes
        ]

    def _check(self) -> None:
        self.calls += 1
        if not self.initialized:
            raise nvml_error("UNINITIALIZED")

    def _call(self, handle: _Handle, function: str) -> _Handle:
        self._check()
        failure = handle.gpu.failures.get(function)
        if failure:
            raise nvml_error(failure)
        return handle


def fleet(n_gpus: int = 8, n_processes: int = 64, first_pid: int = 10_000) -> list[FakeGpu]:
    """A busy node for the benchmark: `n_processes` spread evenly over `n_gpus` 80 GB GPUs."""
    gpus = [
        FakeGpu(uuid=f"GPU-fake-{i:04d}-0000-0000-0000-000000000000", name="NVIDIA H100 80GB HBM3", total_mib=81559)
        for i in range(n_gpus)
    ]
    for p in range(n_processes):
        gpu = gpus[p % n_gpus]
        gpu.processes.append((first_pid + p, 1024 + 37 * p))
    for gpu in gpus:
        gpu.used_mib = 600 + sum(mib or 0 for _, mib in gpu.processes)
        gpu.util_gpu_pct, gpu.util_memory_pct = 87, 41
    return gpus
