"""The NVML source against the pynvml-shaped fake: figures, MIG, and every failure mode."""

from __future__ import annotations

import pytest

from extender.agent.fakenvml import MIB, FakeGpu, FakeNvml, fleet
from extender.agent.nvml import NvmlSource, describe_init_failure
from extender.agent.sources import SourceUnavailable
from extender.telemetry import NodeReport, parse_report


def _gpu(i: int, **kw: object) -> FakeGpu:
    return FakeGpu(uuid=f"GPU-{i:08d}-aaaa-bbbb-cccc-dddddddddddd", **kw)  # type: ignore[arg-type]


def _report(source: NvmlSource) -> NodeReport:
    """Round-trip a sample through the wire schema: what the source emits must always parse."""
    sample = source.sample()
    report = NodeReport(node="n1", sequence=1, timestamp_s=1.0, agent_version="t", source="nvml", gpus=sample.gpus)
    return parse_report(report.to_dict())


def test_figures_of_a_healthy_gpu() -> None:
    gpu = _gpu(0, total_mib=40960, used_mib=12000, reserved_mib=500, util_gpu_pct=73, util_memory_pct=20,
               temperature_c=61, power_mw=251_300, processes=[(100, 5000), (101, None)])
    source = NvmlSource.open(FakeNvml([gpu]))
    (report,) = _report(source).gpus
    assert report.uuid == gpu.uuid and report.model == gpu.name and report.index == 0
    assert report.memory_total_mib == 40960 and report.memory_used_mib == 12000  # total - free
    assert report.memory_reserved_mib == 500
    assert report.utilization_gpu == pytest.approx(0.73) and report.utilization_memory == pytest.approx(0.20)
    assert report.temperature_c == 61 and report.power_w == pytest.approx(251.3)
    assert [(p.pid, p.used_memory_mib) for p in report.processes] == [(100, 5000), (101, 0.0)]
    assert report.healthy and report.error == ""


def test_old_driver_without_memory_v2_falls_back_to_v1_once() -> None:
    nvml = FakeNvml([_gpu(0, used_mib=1000, reserved_mib=300, supports_memory_v2=False)])
    source = NvmlSource.open(nvml)
    (first,) = source.sample().gpus
    calls = nvml.calls
    (second,) = source.sample().gpus
    assert first.memory_used_mib == 1000 and first.memory_reserved_mib == 0.0 and first.healthy
    assert second == first
    assert nvml.calls - calls < calls  # the failing v2 call is not repeated


def test_mig_instances_are_devices_with_their_own_memory() -> None:
    parent = _gpu(0, name="NVIDIA A100-SXM4-40GB", temperature_c=55, power_mw=90_000, mig=[
        FakeGpu(uuid="MIG-1111", name="NVIDIA A100-SXM4-40GB MIG 3g.20gb", total_mib=19968, used_mib=7000,
                processes=[(300, 6900)], failures={"nvmlDeviceGetUtilizationRates": "NOT_SUPPORTED"}),
        FakeGpu(uuid="MIG-2222", name="NVIDIA A100-SXM4-40GB MIG 2g.10gb", total_mib=9856, used_mib=12,
                failures={"nvmlDeviceGetUtilizationRates": "NOT_SUPPORTED"}),
    ])
    whole = _gpu(1, mig=[])  # MIG-capable, MIG disabled
    gpus = _report(NvmlSource.open(FakeNvml([parent, whole]))).gpus
    assert [g.uuid for g in gpus] == ["MIG-1111", "MIG-2222", whole.uuid]
    mig = gpus[0]
    assert (mig.memory_total_mib, mig.memory_used_mib, mig.index) == (19968, 7000, 0)
    assert [p.pid for p in mig.processes] == [300]
    assert mig.temperature_c == 55 and mig.power_w == 90  # from the parent board
    assert mig.healthy and mig.error == ""  # utilisation is simply not available per MIG instance
    assert gpus[1].memory_total_mib == 9856


def test_lost_gpu_is_unhealthy_and_full_while_others_report() -> None:
    nvml = FakeNvml([_gpu(0, used_mib=100), _gpu(1, used_mib=200)])
    source = NvmlSource.open(nvml)
    source.sample()
    nvml.gpus[0].failures["nvmlDeviceGetMemoryInfo"] = "GPU_IS_LOST"
    lost, fine = _report(source).gpus
    assert not lost.healthy and "GPU is lost" in lost.error
    assert lost.uuid == nvml.gpus[0].uuid
    assert lost.memory_used_mib == lost.memory_total_mib == nvml.gpus[0].total_mib  # never looks free
    assert fine.healthy and fine.memory_used_mib == 200


@pytest.mark.parametrize("call", ["nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID"])
def test_gpu_fallen_off_the_bus_keeps_its_last_identity(call: str) -> None:
    nvml = FakeNvml([_gpu(0)])
    source = NvmlSource.open(nvml)
    source.sample()
    nvml.gpus[0].failures[call] = "GPU_IS_LOST"
    (gpu,) = _report(source).gpus
    assert gpu.uuid == nvml.gpus[0].uuid and not gpu.healthy and "GPU is lost" in gpu.error


def test_unknown_gpu_that_never_answered_gets_a_placeholder() -> None:
    (gpu,) = _report(NvmlSource.open(FakeNvml([_gpu(0, failures={"nvmlDeviceGetUUID": "UNKNOWN"})]))).gpus
    assert gpu.uuid == "unknown-gpu-0" and not gpu.healthy and gpu.memory_total_mib == 0


@pytest.mark.parametrize(
    ("call", "code", "healthy", "text"),
    [
        ("nvmlDeviceGetComputeRunningProcesses", "NOT_SUPPORTED", True, "processes: Not Supported"),
        ("nvmlDeviceGetComputeRunningProcesses", "TIMEOUT", False, "processes: Timeout"),
        ("nvmlDeviceGetUtilizationRates", "GPU_IS_LOST", False, "utilization: GPU is lost"),
        ("nvmlDeviceGetTemperature", "NOT_SUPPORTED", True, ""),
        ("nvmlDeviceGetPowerUsage", "UNKNOWN", False, "power: Unknown Error"),
        ("nvmlDeviceGetMemoryInfo", "TIMEOUT", False, "memory: Timeout"),
    ],
)
def test_per_call_failures(call: str, code: str, healthy: bool, text: str) -> None:
    source = NvmlSource.open(FakeNvml([_gpu(0, processes=[(1, 10)], failures={call: code})]))
    (gpu,) = _report(source).gpus
    assert gpu.healthy is healthy
    assert (text in gpu.error) if text else gpu.error == ""


def test_driver_gone_mid_run_makes_the_source_unresponsive_then_recovers() -> None:
    nvml = FakeNvml([_gpu(0, used_mib=10)])
    source = NvmlSource.open(nvml)
    source.sample()
    nvml.count_error = "DRIVER_NOT_LOADED"
    down = source.sample()
    assert not down.responsive and "Driver Not Loaded" in down.error
    assert [g.healthy for g in down.gpus] == [False]  # the GPUs it knew, reported unhealthy
    nvml.count_error = ""
    nvml.initialized = False  # the driver came back: the library must be initialised again
    up = source.sample()  # the source re-initialises NVML by itself
    assert up.responsive and up.gpus[0].healthy and nvml.initialized


def test_uninitialised_library_is_reinitialised_on_the_next_round() -> None:
    nvml = FakeNvml([_gpu(0)])
    source = NvmlSource.open(nvml)
    nvml.initialized = False  # e.g. someone called nvmlShutdown
    down = source.sample()
    assert not down.responsive and "Uninitialized" in down.error
    assert source.sample().responsive


@pytest.mark.parametrize("code", ["DRIVER_NOT_LOADED", "LIBRARY_NOT_FOUND", "NO_PERMISSION", "UNKNOWN"])
def test_init_failure_is_a_clear_error_never_a_fallback(code: str) -> None:
    with pytest.raises(SourceUnavailable) as caught:
        NvmlSource.open(FakeNvml([_gpu(0)], init_error=code))
    message = str(caught.value)
    assert message.startswith("NVML could not start") and "--source simulated" in message


def test_init_hint_names_the_cause() -> None:
    from extender.agent.fakenvml import nvml_error

    assert "kernel driver" in describe_init_failure(nvml_error("DRIVER_NOT_LOADED"))
    assert "/dev/nvidia" in describe_init_failure(nvml_error("NO_PERMISSION"))


def test_benchmark_fleet_shape() -> None:
    gpus = _report(NvmlSource.open(FakeNvml(fleet(8, 64)))).gpus
    assert len(gpus) == 8 and sum(len(g.processes) for g in gpus) == 64
    for gpu in gpus:
        assert gpu.memory_used_mib >= sum(p.used_memory_mib for p in gpu.processes)


def test_fake_errors_are_pynvml_shaped() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pynvml
    fake = FakeNvml([])
    for name in ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_TIMEOUT",
                 "NVML_ERROR_DRIVER_NOT_LOADED", "NVML_ERROR_UNINITIALIZED", "nvmlMemory_v2"):
        assert getattr(fake, name) == getattr(pynvml, name)
    for cls in ("NVMLError_NotSupported", "NVMLError_GpuIsLost", "NVMLError_Timeout", "NVMLError_DriverNotLoaded"):
        real, fake_cls = getattr(pynvml, cls), getattr(fake, cls)
        assert str(fake_cls()) == str(real(0)) and fake_cls().value == real(0).value
        assert issubclass(fake_cls, fake.NVMLError)
    assert MIB == 1 << 20


def test_reports_stay_within_the_schema_bounds() -> None:
    from extender.telemetry import MAX_GPUS_PER_NODE, MAX_PROCESSES_PER_GPU

    crowded = _gpu(0, total_mib=10**7, processes=[(i + 1, i % 7) for i in range(MAX_PROCESSES_PER_GPU + 10)])
    # 1 + 10 x 7 MIG instances = 71 devices, more than a report takes
    gpus = [crowded] + [_gpu(i + 1, mig=[FakeGpu(uuid=f"MIG-{i}-{j}") for j in range(7)]) for i in range(10)]
    report = _report(NvmlSource.open(FakeNvml(gpus)))  # parses: within every bound
    assert len(report.gpus) == MAX_GPUS_PER_NODE
    kept = report.gpus[0].processes
    assert len(kept) == MAX_PROCESSES_PER_GPU and min(p.used_memory_mib for p in kept) >= 0
    assert sum(p.used_memory_mib for p in kept) == sum(sorted((i % 7 for i in range(MAX_PROCESSES_PER_GPU + 10)),
                                                              reverse=True)[:MAX_PROCESSES_PER_GPU])


def test_every_fake_function_matches_pynvml_by_name_and_parameters() -> None:
    import inspect
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pynvml
    names = [n for n in vars(FakeNvml) if n.startswith("nvml") and callable(getattr(FakeNvml, n))]
    assert len(names) >= 14
    for name in names:
        real = inspect.signature(getattr(pynvml, name))
        fake = inspect.signature(getattr(FakeNvml([]), name))
        real_params = [p for p in real.parameters if p not in ("self",)]
        assert list(fake.parameters) == real_params, name
