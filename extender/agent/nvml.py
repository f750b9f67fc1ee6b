"""The production GPU source: NVML through nvidia-ml-py (NVIDIA's binding, imported as `pynvml`).

Figures per device (each MIG instance is its own device with its own memory and processes):
memory total/used/reserved, utilisation, temperature, power and the compute processes.
`memory_used_mib` is always total - free, so it includes what the driver reserves (nvidia-smi's
classic figure) whether or not the driver offers the v2 memory call that reports `reserved`.

Failure policy (`_call_failure`): a call that fails with anything but "not supported" makes that
GPU unhealthy (`healthy=false`, the error text per call) and the agent keeps running. "Not
supported" is normal for utilisation on MIG instances and for temperature/power on some boards: the
figure is left out. "Not supported" for the process list keeps the GPU healthy but says so in
`error`: its memory figures are still exact, only per-pod attribution is missing, and taking the
whole GPU out of scheduling for that would strand it. A GPU whose memory cannot be read is reported
as full (used = last known total), so no extender can mistake it for free.

Per-process utilisation (`nvmlDeviceGetProcessUtilization(handle, lastSeenTimeStamp)`): each round
asks for the samples newer than the newest one seen on that GPU, and a process's `sm_util` is the
mean SM busy share of its samples (NVML gives one per process that was busy in its last sampling
period; a process with none this round has `sm_util` None: no observation, never 0). A driver or
GPU without these samples ("not supported", or the function missing) keeps the GPU healthy and
reports `process_samples` false: pods' duties then come from the device's utilisation
(`tracking.pod_duties`). "Not found" means no process was busy since the last read; any other error
of this optional call is logged and leaves the samples out for the round.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from dataclasses import dataclass, replace
from typing import Any

from extender.agent.sources import Sample, SourceUnavailable
from extender.telemetry import MAX_GPUS_PER_NODE, MAX_PROCESSES_PER_GPU, GpuReport, ProcessReport

log = logging.getLogger(__name__)

MIB = 1024 * 1024
_NOT_SUPPORTED, _NOT_FOUND, _FUNCTION_NOT_FOUND, _UNINITIALIZED, _DRIVER_NOT_LOADED = 3, 6, 13, 1, 9
_ARGUMENT_VERSION_MISMATCH, _INVALID_ARGUMENT, _LIB_RM_VERSION_MISMATCH = 25, 2, 18
# no per-process utilisation on this driver or GPU
_NO_PROCESS_SAMPLES = frozenset({_NOT_SUPPORTED, _FUNCTION_NOT_FOUND})
# after these the library must be initialised again before it can answer
_REINIT_CODES = frozenset({_UNINITIALIZED, _DRIVER_NOT_LOADED, _LIB_RM_VERSION_MISMATCH})
# the driver has no v2 memory call: fall back to v1
_NO_V2_CODES = frozenset({_FUNCTION_NOT_FOUND, _NOT_SUPPORTED, _ARGUMENT_VERSION_MISMATCH, _INVALID_ARGUMENT})

_HINTS = {
    12: "libnvidia-ml.so.1 was not found: install the NVIDIA driver on the node and run the agent with the "
    "NVIDIA container runtime (or mount the driver's libraries)",
    9: "the NVIDIA kernel driver is not loaded on this node (nvidia-smi would fail too)",
    4: "no permission to open /dev/nvidia*: the agent needs the NVIDIA device files",
    18: "the NVML library and the kernel driver versions differ: reboot the node or reinstall the driver",
}


@dataclass(frozen=True)
class _Known:
    uuid: str
    model: str
    total_mib: float


def _code(err: Exception) -> int:
    value = getattr(err, "value", -1)
    return value if isinstance(value, int) else -1


def _text(value: Any) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _mib(value: Any) -> float:
    return round(float(value) / MIB, 1) if isinstance(value, int | float) else 0.0


def describe_init_failure(err: Exception) -> str:
    """One actionable line for an NVML that cannot start."""
    hint = _HINTS.get(_code(err), "check the NVIDIA driver with nvidia-smi on the node")
    return (
        f"NVML could not start ({err}): {hint}. The agent does not fall back to simulated GPUs; "
        "use --source simulated explicitly for kind or local runs."
    )


class NvmlSource:
    """Samples every GPU through a pynvml-shaped module (nvidia-ml-py's `pynvml`, or a fake in tests)."""

    name = "nvml"

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._error_type: type[Exception] = nvml.NVMLError
        self._known: dict[int, _Known] = {}  # by index: what to report when a GPU stops answering
        self._memory_v2: dict[str, bool] = {}
        self._samples_seen: dict[str, int] = {}  # uuid -> newest per-process sample timestamp read
        self._no_samples: set[str] = set()  # uuids whose driver gives no per-process samples
        self._needs_init = False
        self.driver_version = ""  # reported with each NodeReport: the online calibration's node software
        self.cuda_version = ""

    @classmethod
    def open(cls, nvml: Any | None = None) -> NvmlSource:
        """Initialise NVML or raise SourceUnavailable with a message a person can act on."""
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")  # provided by nvidia-ml-py
            except ImportError as err:
                raise SourceUnavailable(f"NVML could not start: nvidia-ml-py is missing ({err})") from err
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as err:
            raise SourceUnavailable(describe_init_failure(err)) from err
        source = cls(nvml)
        with contextlib.suppress(nvml.NVMLError, AttributeError):
            source.driver_version = _text(nvml.nvmlSystemGetDriverVersion())[:64]
            log.info("NVML started: driver %s", source.driver_version)
        with contextlib.suppress(nvml.NVMLError, AttributeError):
            cuda = int(nvml.nvmlSystemGetCudaDriverVersion())  # e.g. 12040 -> "12.4"
            source.cuda_version = f"{cuda // 1000}.{cuda % 1000 // 10}"
        return source

    def close(self) -> None:
        with contextlib.suppress(self._error_type):
            self._nvml.nvmlShutdown()

    def sample(self) -> Sample:
        nvml = self._nvml
        try:
            if self._needs_init:
                nvml.nvmlInit()
                self._needs_init = False
            count = int(nvml.nvmlDeviceGetCount())
        except self._error_type as err:
            self._needs_init = _code(err) in _REINIT_CODES
            message = f"NVML did not answer: {err}"
            lost = tuple(self._lost(i, message) for i in sorted(self._known))
            return Sample(gpus=lost, responsive=False, error=message)
        gpus: list[GpuReport] = []
        for index in range(count):
            gpus.extend(self._device(index))
        unique = _unique(gpus)
        if len(unique) > MAX_GPUS_PER_NODE:  # more MIG instances than the schema takes: say so, keep the first
            log.warning("%d devices, the report takes %d: the rest are not reported", len(unique), MAX_GPUS_PER_NODE)
        return Sample(gpus=unique[:MAX_GPUS_PER_NODE])

    def _device(self, index: int) -> list[GpuReport]:
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        except self._error_type as err:
            return [self._lost(index, f"handle: {err}")]
        try:
            model = _text(nvml.nvmlDeviceGetName(handle))
        except self._error_type:
            model = self._known[index].model if index in self._known else ""
        mig_handles = self._mig_instances(handle)
        if mig_handles is None:
            report = self._read(handle, index, uuid, model, parent=None)
            if report.healthy:
                self._known[index] = _Known(uuid, model, report.memory_total_mib)
            return [report]
        self._known[index] = _Known(uuid, model, self._known[index].total_mib if index in self._known else 0.0)
        temperature, power, _ = self._thermals(handle)
        reports: list[GpuReport] = []
        for mig_handle in mig_handles:
            try:
                mig_uuid = _text(nvml.nvmlDeviceGetUUID(mig_handle))
                mig_model = _text(nvml.nvmlDeviceGetName(mig_handle))
            except self._error_type as err:
                reports.append(self._lost(index, f"MIG instance: {err}", uuid_suffix=f"-mig{len(reports)}"))
                continue
            reports.append(self._read(mig_handle, index, mig_uuid, mig_model, parent=(temperature, power)))
        return reports

    def _mig_instances(self, handle: Any) -> list[Any] | None:
        """The MIG device handles when MIG is enabled on this GPU; None for a whole GPU."""
        nvml = self._nvml
        try:
            current_mode = nvml.nvmlDeviceGetMigMode(handle)[0]
        except self._error_type:  # not supported (no MIG on this board) or not answering: a whole GPU
            return None
        if current_mode != getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
            return None
        handles = []
        try:
            for j in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
                try:
                    handles.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, j))
                except self._error_type as err:
                    if _code(err) != _NOT_FOUND:  # NOT_FOUND: that slot holds no instance
                        raise
        except self._error_type as err:
            log.warning("cannot list MIG instances: %s", err)
        return handles

    def _read(
        self, handle: Any, index: int, uuid: str, model: str, parent: tuple[float | None, float | None] | None
    ) -> GpuReport:
        nvml = self._nvml
        try:
            total, used, reserved = self._memory(handle, uuid)
        except self._error_type as err:
            return self._lost(index, f"memory: {err}", uuid=uuid, model=model)
        problems: list[str] = []
        unhealthy = False
        util_gpu = util_memory = 0.0
        try:
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            util_gpu, util_memory = _ratio(rates.gpu), _ratio(rates.memory)
        except self._error_type as err:
            unhealthy |= _call_failure("utilization", err, problems)
        if parent is None:
            temperature, power, thermal_fatal = self._thermals(handle, problems)
            unhealthy |= thermal_fatal
        else:
            temperature, power = parent
        processes: tuple[ProcessReport, ...] = ()
        try:
            processes = tuple(
                ProcessReport(pid=int(p.pid), used_memory_mib=_mib(p.usedGpuMemory))
                for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            )
        except self._error_type as err:
            unhealthy |= _call_failure("processes", err, problems)
        busy = self._process_utilization(handle, uuid)
        if busy is not None:
            processes = tuple(replace(p, sm_util=busy.get(p.pid)) for p in processes)
        if len(processes) > MAX_PROCESSES_PER_GPU:  # the schema's bound: keep the largest
            processes = tuple(sorted(processes, key=lambda p: -p.used_memory_mib)[:MAX_PROCESSES_PER_GPU])
        return GpuReport(
            uuid=uuid,
            index=index,
            model=model,
            memory_total_mib=total,
            memory_used_mib=used,
            memory_reserved_mib=reserved,
            utilization_gpu=util_gpu,
            utilization_memory=util_memory,
            temperature_c=temperature,
            power_w=power,
            healthy=not unhealthy,
            error="; ".join(problems),
            processes=processes,
            process_samples=busy is not None,
        )

    def _process_utilization(self, handle: Any, uuid: str) -> dict[int, float] | None:
        """pid -> mean SM busy share (0..1) of its samples newer than the last read ({} when none
        was busy); None when this GPU's driver gives no per-process samples (see the module doc)."""
        nvml = self._nvml
        call = getattr(nvml, "nvmlDeviceGetProcessUtilization", None)
        if call is None or uuid in self._no_samples:
            return None
        last = self._samples_seen.get(uuid, 0)
        try:
            samples = call(handle, last)
        except self._error_type as err:
            if _code(err) in _NO_PROCESS_SAMPLES:
                self._no_samples.add(uuid)
                log.info("GPU %s gives no per-process utilisation (%s): duties from the device's", uuid, err)
                return None
            if _code(err) != _NOT_FOUND:
                log.warning("GPU %s: per-process utilisation failed: %s", uuid, err)
            return {}
        sums: dict[int, tuple[float, int]] = {}
        newest = last
        for sample in samples:
            stamp = int(sample.timeStamp)
            if stamp <= last:
                continue  # already counted in an earlier round
            newest = max(newest, stamp)
            total, count = sums.get(int(sample.pid), (0.0, 0))
            sums[int(sample.pid)] = (total + _ratio(sample.smUtil), count + 1)
        self._samples_seen[uuid] = newest
        return {pid: round(total / count, 4) for pid, (total, count) in sums.items()}

    def _thermals(self, handle: Any, problems: list[str] | None = None) -> tuple[float | None, float | None, bool]:
        nvml = self._nvml
        sink: list[str] = [] if problems is None else problems
        temperature: float | None = None
        power: float | None = None
        fatal = False
        try:
            temperature = float(nvml.nvmlDeviceGetTemperature(handle, getattr(nvml, "NVML_TEMPERATURE_GPU", 0)))
        except self._error_type as err:
            fatal |= _call_failure("temperature", err, sink)
        try:
            power = round(float(nvml.nvmlDeviceGetPowerUsage(handle)) / 1000.0, 1)  # milliwatts
        except self._error_type as err:
            fatal |= _call_failure("power", err, sink)
        return temperature, power, fatal

    def _memory(self, handle: Any, uuid: str) -> tuple[float, float, float]:
        """(total, used = total - free, reserved) in MiB; the v2 call where the driver has it."""
        nvml = self._nvml
        version = getattr(nvml, "nvmlMemory_v2", None)
        if version is not None and self._memory_v2.get(uuid, True):
            try:
                info = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
                return _mib(info.total), _mib(info.total - info.free), _mib(info.reserved)
            except self._error_type as err:
                if _code(err) not in _NO_V2_CODES:
                    raise
                self._memory_v2[uuid] = False  # an older driver: use the v1 call from now on
        info = nvml.nvmlDeviceGetMemoryInfo(handle)
        return _mib(info.total), _mib(info.total - info.free), 0.0

    def _lost(self, index: int, error: str, *, uuid: str = "", model: str = "", uuid_suffix: str = "") -> GpuReport:
        """A GPU that does not answer: unhealthy and, conservatively, full."""
        known = self._known.get(index)
        total = known.total_mib if known is not None else 0.0
        return GpuReport(
            uuid=uuid or (known.uuid if known is not None else f"unknown-gpu-{index}") + uuid_suffix,
            index=index,
            model=model or (known.model if known is not None else ""),
            memory_total_mib=total,
            memory_used_mib=total,
            healthy=False,
            error=error,
        )


def _call_failure(call: str, err: Exception, problems: list[str]) -> bool:
    """Record a failed optional call; True when it makes the GPU unhealthy (see the module doc)."""
    if _code(err) == _NOT_SUPPORTED:
        if call == "processes":
            problems.append(f"processes: {err} (no per-pod attribution on this GPU)")
        return False
    problems.append(f"{call}: {err}")
    return True


def _ratio(percent: Any) -> float:
    return min(max(float(percent) / 100.0, 0.0), 1.0)


def _unique(gpus: list[GpuReport]) -> tuple[GpuReport, ...]:
    """Drop repeated UUIDs (the report schema requires unique ones); the first occurrence wins."""
    seen: set[str] = set()
    out = []
    for gpu in gpus:
        if gpu.uuid not in seen:
            seen.add(gpu.uuid)
            out.append(gpu)
    return tuple(out)
