"""Per-process GPU utilisation on REAL NVML answers: an H100 (driver 580.159.04) running two resnet50
training processes, pid 465 GPU-bound and pid 466 input-bound, read every second
(tests/fixtures/nvml-process-utilization-h100-580.json, copied from
../shared/data/colocation/nvml-process-utilization-h100-2026-11-27.json).

Each read's recorded answers reach `NvmlSource` through the recorded-answer stand-ins of
test_nvml_recorded.py (pynvml-shaped, and the real nvidia-ml-py binding over a stand-in C library),
now also answering `nvmlDeviceGetProcessUtilization`. The expected figures are worked out here from
the raw answers by the rules nvml.py and tracking.py document.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from extender.agent.cgroups import PodRef
from extender.agent.nvml import NvmlSource
from extender.agent.tracking import PodTracker, attribute_processes, pod_duties
from extender.telemetry import NodeReport, parse_report
from tests.unit.test_nvml_recorded import SAMPLES, RecordedLibrary, Replay, pynvml

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "nvml-process-utilization-h100-580.json"
RECORD: dict[str, Any] = json.loads(FIXTURE.read_text(encoding="utf-8"))
READS: list[dict[str, Any]] = RECORD["samples"]
GPU_BOUND, INPUT_BOUND = RECORD["pids"]["gpu_bound"], RECORD["pids"]["input_bound"]
BASE = next(s["raw"] for s in SAMPLES if len(s["raw"]["processes"]) >= 2)  # the device's other answers
MIB = 1024 * 1024
_NOT_FOUND, _SUCCESS, _INSUFFICIENT_SIZE = 6, 0, 7


def _raw(read: dict[str, Any]) -> dict[str, Any]:
    """The fixture H100's answers with this read's processes, utilisation and process samples."""
    return {**BASE, "utilization": dict(read["device"]),
            "processes": [{"pid": p["pid"], "used_gpu_memory": int(p["mib"] * MIB)} for p in read["procs"]],
            "process_utilization": read["process"]}


class Reads:
    """The recorded reads in order; `asked` collects the lastSeenTimeStamp each call was given."""

    def __init__(self) -> None:
        self.k = 0
        self.asked: list[int] = []

    @property
    def raw(self) -> dict[str, Any]:
        return _raw(READS[self.k])


class ProcReplay(Replay):
    def __init__(self, reads: Reads) -> None:
        super().__init__(reads.raw)
        self.reads = reads

    def __getattribute__(self, name: str) -> Any:
        if name == "raw":
            return object.__getattribute__(self, "reads").raw
        return object.__getattribute__(self, name)

    def nvmlDeviceGetProcessUtilization(self, handle: str, timeStamp: int) -> list[SimpleNamespace]:
        self.reads.asked.append(timeStamp)
        samples = self.raw["process_utilization"]
        if not samples:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return [SimpleNamespace(pid=s["pid"], timeStamp=s["ts"], smUtil=s["smUtil"], memUtil=s["memUtil"],
                                encUtil=0, decUtil=0) for s in samples]


class ProcLibrary(RecordedLibrary):
    def __init__(self, reads: Reads) -> None:
        super().__init__(reads.raw)
        self.reads = reads

    def __getattribute__(self, name: str) -> Any:
        if name == "raw":
            return object.__getattribute__(self, "reads").raw
        return super().__getattribute__(name)

    def nvmlDeviceGetProcessUtilization(self, device: Any, utilization: Any, count: Any, timeStamp: Any) -> int:
        samples = self.raw["process_utilization"]
        if utilization is None:  # the binding asks for the count first
            self.reads.asked.append(int(timeStamp.value))
            count._obj.value = len(samples)
            return _INSUFFICIENT_SIZE if samples else _NOT_FOUND
        if count._obj.value < len(samples):
            return _INSUFFICIENT_SIZE
        for info, s in zip(utilization, samples, strict=False):
            info.pid, info.timeStamp, info.smUtil, info.memUtil = s["pid"], s["ts"], s["smUtil"], s["memUtil"]
            info.encUtil = info.decUtil = 0
        count._obj.value = len(samples)
        return _SUCCESS


@pytest.fixture(params=["pynvml-shaped", "real-binding"])
def source_of(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Callable[[Reads], NvmlSource]:
    def make(reads: Reads) -> NvmlSource:
        if request.param == "pynvml-shaped":
            return NvmlSource.open(ProcReplay(reads))
        monkeypatch.setattr(pynvml, "nvmlLib", ProcLibrary(reads))
        monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
        return NvmlSource.open(pynvml)

    return make


def test_the_stand_in_has_pynvml_s_parameters() -> None:
    real = list(inspect.signature(pynvml.nvmlDeviceGetProcessUtilization).parameters)
    assert list(inspect.signature(ProcReplay(Reads()).nvmlDeviceGetProcessUtilization).parameters) == real


def test_the_recording_has_reads_where_a_process_has_no_sample() -> None:
    assert any(len(r["process"]) < len(r["procs"]) for r in READS)
    assert all(len(r["procs"]) == 2 for r in READS)


def test_each_read_gives_each_process_its_sample_or_none(source_of: Callable[[Reads], NvmlSource]) -> None:
    reads = Reads()
    source = source_of(reads)
    newest = 0
    for k, read in enumerate(READS):
        reads.k = k
        (gpu,) = source.sample().gpus
        assert reads.asked[-1] == newest  # asks only for samples newer than those already read
        newest = max([newest, *(s["ts"] for s in read["process"])])
        assert gpu.healthy and gpu.process_samples and gpu.error == ""
        busy = {s["pid"]: s["smUtil"] / 100 for s in read["process"]}
        assert {p.pid: p.sm_util for p in gpu.processes} == {p["pid"]: busy.get(p["pid"]) for p in read["procs"]}
        assert gpu.utilization_gpu == pytest.approx(read["device"]["gpu"] / 100)


def test_a_repeated_sample_is_not_counted_twice(source_of: Callable[[Reads], NvmlSource]) -> None:
    reads = Reads()
    source = source_of(reads)
    reads.k = 2
    (first,) = source.sample().gpus
    (again,) = source.sample().gpus  # NVML answers the same samples again: nothing newer
    assert all(p.sm_util is not None for p in first.processes)
    assert all(p.sm_util is None for p in again.processes)


def test_pod_duties_over_the_window_are_the_mean_of_the_samples(source_of: Callable[[Reads], NvmlSource]) -> None:
    reads = Reads()
    source = source_of(reads)
    pods = {GPU_BOUND: PodRef("pod-gpu-bound", "c1"), INPUT_BOUND: PodRef("pod-input-bound", "c2")}
    tracker = PodTracker(duty_window_s=60.0)
    usage = ()
    for k, read in enumerate(READS):
        reads.k = k
        gpus = attribute_processes(source.sample().gpus, pods.get)
        usage = tracker.update(gpus, now_s=1000.0 + read["t"])
    duty = {u.pod_uid: u for u in usage}

    def mean(pid: int) -> float:
        values = [s["smUtil"] / 100 for r in READS for s in r["process"] if s["pid"] == pid]
        return sum(values) / len(values)

    assert duty["pod-gpu-bound"].gpu_duty == pytest.approx(mean(GPU_BOUND), abs=1e-3)
    assert duty["pod-input-bound"].gpu_duty == pytest.approx(mean(INPUT_BOUND), abs=1e-3)
    assert duty["pod-gpu-bound"].gpu_duty > duty["pod-input-bound"].gpu_duty  # the busy one shows busier
    assert {u.duty_source for u in usage} == {"process"}


def test_a_driver_without_process_samples_charges_the_device_s_utilisation(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real binding over a library that does not export the call (an older driver): the GPU stays
    healthy, says it has no per-process samples, and each pod is charged the device's utilisation."""

    class OldLibrary(RecordedLibrary):
        missing = frozenset({"nvmlDeviceGetProcessUtilization"})

        def __getattribute__(self, name: str) -> Any:
            if name == "nvmlDeviceGetProcessUtilization":
                raise AttributeError(name)
            return super().__getattribute__(name)

    read = READS[3]
    monkeypatch.setattr(pynvml, "nvmlLib", OldLibrary(_raw(read)))
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    (gpu,) = NvmlSource.open(pynvml).sample().gpus
    assert gpu.healthy and not gpu.process_samples and gpu.error == ""
    assert all(p.sm_util is None for p in gpu.processes)
    pods = {GPU_BOUND: PodRef("a", "c1"), INPUT_BOUND: PodRef("b", "c2")}
    duties = pod_duties(attribute_processes((gpu,), pods.get))
    assert duties == {"a": (read["device"]["gpu"] / 100, "device"), "b": (read["device"]["gpu"] / 100, "device")}


def test_old_reports_stay_valid_and_new_fields_round_trip() -> None:
    old = {"node": "n", "sequence": 1, "timestamp_s": 1.0, "agent_version": "0", "source": "nvml",
           "gpus": [{"uuid": "g", "index": 0, "model": "m", "memory_total_mib": 100.0, "memory_used_mib": 10.0,
                     "processes": [{"pid": 1, "used_memory_mib": 5.0, "pod_uid": "p"}]}],
           "pods": [{"pod_uid": "p", "current_memory_mib": 5.0, "peak_memory_mib": 5.0}]}
    parsed = parse_report(old)
    assert parsed.gpus[0].processes[0].sm_util is None and parsed.pods[0].gpu_duty is None
    assert parsed.pods[0].duty_source == "" and parsed.gpus[0].process_samples is False
    new = json.loads(json.dumps(old))
    new["gpus"][0]["process_samples"] = True
    new["gpus"][0]["processes"][0]["sm_util"] = 0.4
    new["pods"][0].update(gpu_duty=0.4, duty_source="process")
    again = parse_report(NodeReport.to_dict(parse_report(new)))
    assert again.pods[0].gpu_duty == 0.4 and again.gpus[0].processes[0].sm_util == 0.4


@pytest.mark.parametrize(("value", "clamped"), [(1.5, 1.0), (-0.1, 0.0)])
def test_a_duty_outside_0_1_is_clamped_not_a_refused_report(value: float, clamped: float) -> None:
    """Issue 34 row 11: one pod's duty out of range used to refuse the whole node's report."""
    body = {"node": "n", "sequence": 1, "timestamp_s": 1.0, "agent_version": "0", "source": "nvml", "gpus": [],
            "pods": [{"pod_uid": "p", "current_memory_mib": 5.0, "peak_memory_mib": 5.0, "gpu_duty": value}]}
    assert parse_report(body).pods[0].gpu_duty == clamped


@pytest.mark.parametrize(("field", "value"), [("gpu_duty", "lots"), ("duty_source", "guess")])
def test_bad_duty_fields_are_refused_by_name(field: str, value: Any) -> None:
    from extender.telemetry import ReportError

    body = {"node": "n", "sequence": 1, "timestamp_s": 1.0, "agent_version": "0", "source": "nvml", "gpus": [],
            "pods": [{"pod_uid": "p", "current_memory_mib": 5.0, "peak_memory_mib": 5.0, field: value}]}
    with pytest.raises(ReportError, match=field):
        parse_report(body)
