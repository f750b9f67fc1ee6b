"""The agent's NVML source fed with REAL NVML answers, recorded on an H100 (driver 580.159.04).

tests/fixtures/nvml-h100-580.json holds, per sample, what pynvml answered on that machine (`raw`) and
what the agent's `NvmlSource` built there a moment later (`agent`). The recorded values reach the
source two ways, and every check runs with both: `Replay`, a pynvml-shaped object answering through
pynvml's function names (its error class and constants are the real binding's), and the real
nvidia-ml-py binding itself over `RecordedLibrary`, a stand-in for libnvidia-ml.so's C functions
that fills the binding's ctypes structures, so the binding's own conversions run too. Neither
computes anything. The expected report is worked out here from the raw answers by the rules nvml.py
documents and, where the two reads were close enough, compared with the report recorded there.
"""

from __future__ import annotations

import ctypes
import dataclasses
import inspect
import json
import warnings
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from extender.agent.cgroups import CgroupReader, parse_cgroup
from extender.agent.main import Agent, AgentSettings
from extender.agent.nvml import NvmlSource
from extender.telemetry import GpuReport, NodeReport
from tests.fakes.procfs import make_proc_root

with warnings.catch_warnings():  # a deprecated `pynvml` package, if installed too, warns on import
    warnings.simplefilter("ignore", FutureWarning)
    import pynvml

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "nvml-h100-580.json"
RECORD: dict[str, Any] = json.loads(FIXTURE.read_text(encoding="utf-8"))
SAMPLES: list[dict[str, Any]] = RECORD["samples"]
BYTES_PER_MIB = 1024 * 1024
# samples whose memory, utilisation or power moved between the raw reads and the agent's own read:
# there only what cannot move (identity, capacity, reserve, which processes) is compared
MOVED = {11, 44}


class Replay:
    """One recorded device, answering through pynvml's names with the values recorded, nothing else."""

    NVMLError = pynvml.NVMLError
    nvmlMemory_v2 = pynvml.nvmlMemory_v2
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE

    def __init__(self, raw: dict[str, Any], *, memory_v2: bool = True) -> None:
        self.raw = raw
        self.memory_v2 = memory_v2  # False: answer the v2 call as a driver without it would

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return str(RECORD["driver"])

    def nvmlDeviceGetCount(self) -> int:
        return 1  # the machine had one GPU

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        if index != 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return "handle-0"

    def nvmlDeviceGetUUID(self, handle: str) -> Any:
        return self._answer("uuid")

    def nvmlDeviceGetName(self, handle: str) -> Any:
        return self._answer("name")

    def nvmlDeviceGetMigMode(self, device: str) -> Any:
        return self._answer("mig_mode")

    def nvmlDeviceGetMemoryInfo(self, handle: str, version: int | None = None) -> SimpleNamespace:
        if version is None:
            return SimpleNamespace(**self._answer("memory"))
        if version != pynvml.nvmlMemory_v2 or not self.memory_v2:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return SimpleNamespace(version=version, **self._answer("memory_v2"))

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> SimpleNamespace:
        return SimpleNamespace(**self._answer("utilization"))

    def nvmlDeviceGetTemperature(self, handle: str, sensor: int) -> Any:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU  # what was recorded
        return self._answer("temperature")

    def nvmlDeviceGetPowerUsage(self, handle: str) -> Any:
        return self._answer("power_mw")

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=p["pid"], usedGpuMemory=p["used_gpu_memory"]) for p in self._answer("processes")]

    def _answer(self, key: str) -> Any:
        value = self.raw[key]
        if isinstance(value, dict) and "error" in value:  # the recorder's note of a failed call
            raise pynvml.NVMLError(value["code"])
        return value


_SUCCESS, _INVALID_ARGUMENT, _INSUFFICIENT_SIZE = 0, 2, 7


class RecordedLibrary:
    """libnvidia-ml.so's C functions as nvidia-ml-py calls them (ctypes arguments, an NVML return
    code), filling the binding's structures with the recorded values. A function it lacks is one the
    library does not export: the binding raises FUNCTION_NOT_FOUND, as with an older driver."""

    def __init__(self, raw: dict[str, Any], *, memory_v2: bool = True) -> None:
        self.raw = raw
        self.missing = frozenset() if memory_v2 else frozenset({"nvmlDeviceGetMemoryInfo_v2"})

    def __getattribute__(self, name: str) -> Any:
        if name in object.__getattribute__(self, "missing"):  # not exported by this "driver"
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    def nvmlInitWithFlags(self, flags: int) -> int:
        return _SUCCESS

    def nvmlShutdown(self) -> int:
        return _SUCCESS

    def nvmlErrorString(self, code: int) -> bytes:
        return f"recorded NVML error {code}".encode()

    def nvmlSystemGetDriverVersion(self, buffer: Any, size: Any) -> int:
        buffer.value = str(RECORD["driver"]).encode()
        return _SUCCESS

    def nvmlDeviceGetCount_v2(self, count: Any) -> int:
        count._obj.value = 1
        return _SUCCESS

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, device: Any) -> int:
        return _SUCCESS if index.value == 0 else _INVALID_ARGUMENT

    def nvmlDeviceGetName(self, device: Any, buffer: Any, size: Any) -> int:
        return self._fill(lambda name: setattr(buffer, "value", name.encode()), "name")

    def nvmlDeviceGetUUID(self, device: Any, buffer: Any, size: Any) -> int:
        return self._fill(lambda uuid: setattr(buffer, "value", uuid.encode()), "uuid")

    def nvmlDeviceGetMigMode(self, device: Any, current: Any, pending: Any) -> int:
        def fill(modes: list[int]) -> None:
            current._obj.value, pending._obj.value = modes

        return self._fill(fill, "mig_mode")

    def nvmlDeviceGetMemoryInfo(self, device: Any, memory: Any) -> int:
        return self._fill(lambda v1: _set_fields(memory._obj, v1), "memory")

    def nvmlDeviceGetMemoryInfo_v2(self, device: Any, memory: Any) -> int:
        if memory._obj.version != pynvml.nvmlMemory_v2:
            return int(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return self._fill(lambda v2: _set_fields(memory._obj, v2), "memory_v2")

    def nvmlDeviceGetUtilizationRates(self, device: Any, utilization: Any) -> int:
        return self._fill(lambda rates: _set_fields(utilization._obj, rates), "utilization")

    def nvmlDeviceGetTemperature(self, device: Any, sensor: Any, temperature: Any) -> int:
        if sensor.value != pynvml.NVML_TEMPERATURE_GPU:
            return _INVALID_ARGUMENT
        return self._fill(lambda celsius: setattr(temperature._obj, "value", celsius), "temperature")

    def nvmlDeviceGetPowerUsage(self, device: Any, power: Any) -> int:
        return self._fill(lambda milliwatts: setattr(power._obj, "value", milliwatts), "power_mw")

    def nvmlDeviceGetComputeRunningProcesses_v3(self, device: Any, count: Any, infos: Any) -> int:
        code, processes = self._answer("processes")
        if code != _SUCCESS:
            return code
        if infos is None:  # the binding asks for the count first
            count._obj.value = len(processes)
            return _INSUFFICIENT_SIZE if processes else _SUCCESS
        if count._obj.value < len(processes):
            return _INSUFFICIENT_SIZE
        for info, process in zip(infos, processes, strict=False):
            info.pid, info.usedGpuMemory = process["pid"], process["used_gpu_memory"]
            info.gpuInstanceId = info.computeInstanceId = 0xFFFFFFFF  # no MIG
        count._obj.value = len(processes)
        return _SUCCESS

    def _answer(self, key: str) -> tuple[int, Any]:
        """(NVML return code, recorded value)."""
        value = self.raw[key]
        if isinstance(value, dict) and "error" in value:  # the recorder's note of a failed call
            return int(value["code"]), None
        return _SUCCESS, value

    def _fill(self, fill: Callable[[Any], None], key: str) -> int:
        code, value = self._answer(key)
        if code == _SUCCESS:
            fill(value)
        return code


def _set_fields(structure: ctypes.Structure, values: dict[str, int]) -> None:
    for name, value in values.items():
        setattr(structure, name, value)


@pytest.fixture(params=["pynvml-shaped", "real-binding"])
def nvml_of(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """raw answers (+ memory_v2=False for a driver without the v2 call) -> what NvmlSource is given."""
    if request.param == "pynvml-shaped":
        return Replay

    def binding(raw: dict[str, Any], **kw: Any) -> Any:
        monkeypatch.setattr(pynvml, "nvmlLib", RecordedLibrary(raw, **kw))  # loaded: no real library is opened
        monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
        return pynvml

    return binding


def _replayed(nvml_of: Callable[..., Any], sample: dict[str, Any], **kw: Any) -> GpuReport:
    source = NvmlSource.open(nvml_of(sample["raw"], **kw))
    result = source.sample()
    assert result.responsive and result.error == ""
    (gpu,) = result.gpus
    return gpu


def _mib(n_bytes: int) -> float:
    return n_bytes / BYTES_PER_MIB


def _ids(samples: list[dict[str, Any]]) -> list[str]:
    return [f"{s['index']}-{len(s['raw']['processes'])}proc" for s in samples]


def test_the_fixture_covers_idle_one_and_several_processes() -> None:
    counts = {len(s["raw"]["processes"]) for s in SAMPLES}
    assert {0, 1} <= counts and max(counts) >= 2
    assert RECORD["driver"] == "580.159.04" and all(s["raw"]["name"] == "NVIDIA H100 80GB HBM3" for s in SAMPLES)
    assert {s["index"] for s in SAMPLES} >= MOVED


def test_replay_functions_match_pynvml_by_name_and_parameters() -> None:
    names = [n for n in vars(Replay) if n.startswith("nvml") and callable(getattr(Replay, n))]
    assert len(names) >= 12
    for name in names:
        real = list(inspect.signature(getattr(pynvml, name)).parameters)
        assert list(inspect.signature(getattr(Replay({}), name)).parameters) == real, name


@pytest.mark.parametrize("sample", SAMPLES, ids=_ids(SAMPLES))
def test_report_follows_the_documented_rules(nvml_of: Callable[..., Any], sample: dict[str, Any]) -> None:
    raw = sample["raw"]
    v1, v2 = raw["memory"], raw["memory_v2"]
    # what this driver answered: v2 splits total - free into `used` + `reserved`, v1's `used` is the
    # whole of total - free (nvidia-smi's figure); the two calls were read one after the other, so
    # their `free` may differ by what moved in between, and the agent's figures are v2's
    assert v2["total"] - v2["free"] == v2["used"] + v2["reserved"] and v2["reserved"] > 0
    assert v1["used"] == v1["total"] - v1["free"] and v1["total"] == v2["total"]

    gpu = _replayed(nvml_of, sample)
    assert (gpu.uuid, gpu.model, gpu.index) == (raw["uuid"], raw["name"], 0)
    assert gpu.memory_total_mib == pytest.approx(_mib(v2["total"]), abs=0.05)
    assert gpu.memory_used_mib == pytest.approx(_mib(v2["total"] - v2["free"]), abs=0.05)  # reserve included
    assert gpu.memory_reserved_mib == pytest.approx(_mib(v2["reserved"]), abs=0.05)
    assert gpu.utilization_gpu == pytest.approx(raw["utilization"]["gpu"] / 100)
    assert gpu.utilization_memory == pytest.approx(raw["utilization"]["memory"] / 100)
    assert gpu.temperature_c == raw["temperature"]
    assert gpu.power_w == pytest.approx(raw["power_mw"] / 1000, abs=0.05)
    expected = [(p["pid"], _mib(p["used_gpu_memory"])) for p in raw["processes"]]
    assert len(gpu.processes) == len(expected)
    for process, (pid, mib) in zip(gpu.processes, expected, strict=True):
        assert process.pid == pid and process.used_memory_mib == pytest.approx(mib, abs=0.05)
        assert process.pod_uid == "" and process.container_id == ""  # the source does not attribute
    assert gpu.healthy and gpu.error == ""


def test_the_figures_are_those_of_an_80_gb_board(nvml_of: Callable[..., Any]) -> None:
    """Absolute anchors, so a scale error shared by the rules above and the source cannot pass."""
    idle = _replayed(nvml_of, SAMPLES[0])
    assert 81_000 < idle.memory_total_mib < 82_000  # 80 GB HBM3: 81,559 MiB
    assert idle.memory_used_mib == idle.memory_reserved_mib == 480.0  # idle: only the driver's reserve
    assert 30 < (idle.temperature_c or 0) < 90 and 50 < (idle.power_w or 0) < 700


@pytest.mark.parametrize("sample", SAMPLES, ids=_ids(SAMPLES))
def test_replay_matches_the_report_the_agent_made_on_the_gpu(
    nvml_of: Callable[..., Any], sample: dict[str, Any]
) -> None:
    replayed = json.loads(json.dumps(msgspec.to_builtins(_replayed(nvml_of, sample))))
    (made,) = sample["agent"]["gpus"]
    # the report the agent of that day made, read through today's schema: fields added since (the
    # per-process utilisation) take their defaults, as any older agent's report does at the extender;
    # this recording has no per-process utilisation call, so the replay reports none either
    recorded = json.loads(json.dumps(dataclasses.asdict(msgspec.convert(made, GpuReport))))
    assert replayed["process_samples"] is False
    if sample["index"] not in MOVED:
        assert replayed == recorded
        return
    stable = ("uuid", "index", "model", "memory_total_mib", "memory_reserved_mib", "healthy", "error")
    assert {k: replayed[k] for k in stable} == {k: recorded[k] for k in stable}
    assert [p["pid"] for p in replayed["processes"]] == [p["pid"] for p in recorded["processes"]]  # same processes
    assert replayed != recorded  # the sample really did move: else it belongs with the others


@pytest.mark.parametrize("sample", SAMPLES[:2], ids=_ids(SAMPLES[:2]))
def test_a_driver_without_the_v2_call_gives_the_same_used_figure(
    nvml_of: Callable[..., Any], sample: dict[str, Any]
) -> None:
    v1 = sample["raw"]["memory"]
    gpu = _replayed(nvml_of, sample, memory_v2=False)
    assert gpu.memory_used_mib == pytest.approx(_mib(v1["total"] - v1["free"]), abs=0.05)
    assert gpu.memory_reserved_mib == 0.0  # v1 cannot tell the reserve apart


def test_recorded_cgroup_is_no_pod_and_the_round_goes_on(nvml_of: Callable[..., Any], tmp_path: Path) -> None:
    """There the processes ran in a sandbox's cgroup v2 (`0::/process_api/<hex>`), not under a
    kubelet: the agent reports them with no pod and tracks no pod, without failing the round."""
    sample = max(SAMPLES, key=lambda s: len(s["raw"]["processes"]))
    procs = sample["raw"]["processes"]
    assert all(p["cgroup"].startswith("0::/process_api/") for p in procs)
    assert all(parse_cgroup(p["cgroup"]) is None for p in procs)
    proc_root = make_proc_root(tmp_path / "proc", {p["pid"]: p["cgroup"] + "\n" for p in procs})
    assert all(CgroupReader(proc_root).pod_of(p["pid"]) is None for p in procs)

    sent: list[NodeReport] = []

    class Sink:
        def submit(self, report: NodeReport) -> None:
            sent.append(report)

    settings = AgentSettings(node="h100", proc_root=str(proc_root))
    agent = Agent(settings, NvmlSource.open(nvml_of(sample["raw"])), Sink(), clock=lambda: 1.0e9, monotonic=lambda: 5.0)
    report = agent.step()
    assert sent == [report]
    (gpu,) = report.gpus
    assert [p.pid for p in gpu.processes] == [p["pid"] for p in procs]
    assert all(p.pod_uid == "" and p.container_id == "" for p in gpu.processes)
    assert report.pods == ()
