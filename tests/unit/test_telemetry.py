"""The telemetry report schema: round trip, and every malformed field refused with its path."""

from __future__ import annotations

import contextlib
import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.server.report_fastpath import decode_report
from extender.telemetry import (
    GpuReport,
    NodeReport,
    PodUsage,
    ProcessReport,
    ReportError,
    checked,
    parse_report,
)


def sample_report() -> NodeReport:
    gpu = GpuReport(
        uuid="GPU-1111", index=0, model="NVIDIA A100-SXM4-40GB", memory_total_mib=40960.0,
        memory_used_mib=12000.0, utilization_gpu=0.5, temperature_c=55.0, power_w=210.0,
        processes=(ProcessReport(pid=4242, used_memory_mib=11500.0, pod_uid="uid-a", container_id="c1"),),
    )
    return NodeReport(node="gpu-1", sequence=7, timestamp_s=1_700_000_000.0, agent_version="0.1.0",
                      source="nvml", gpus=(gpu,),
                      pods=(PodUsage("uid-a", 11500.0, 12800.0, ("GPU-1111",), 1_699_999_000.0),))


def test_round_trip_through_json() -> None:
    report = sample_report()
    assert parse_report(json.loads(json.dumps(report.to_dict()))) == report
    assert decode_report(json.dumps(report.to_dict()).encode()) == report


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda d: d.pop("node"), "report.node"),
        (lambda d: d.update(sequence=-1), "report.sequence"),
        (lambda d: d.update(sequence="7"), "report.sequence"),
        (lambda d: d.update(source="fake"), "report.source"),
        (lambda d: d.update(boot_id="b" * 65), "report.boot_id"),
        (lambda d: d.update(node="n" * 254), "report.node"),
        (lambda d: d.update(sequence=2**63), "report.sequence"),  # past 64 bits JSON readers give a float
        (lambda d: d["pods"][0].update(peak_memory_mib=float("nan")), "report.pods[0].peak_memory_mib"),
        (lambda d: d.update(gpus={}), "report.gpus"),
    ],
)
def test_bad_fields_are_named(mutate: Any, path: str) -> None:
    body = sample_report().to_dict()
    mutate(body)
    with pytest.raises(ReportError) as info:
        parse_report(body)
    assert info.value.path == path
    assert decode_report(json.dumps(body).encode()) is None  # the fast path leaves the wording to the parser


def with_second_gpu(body: dict[str, Any]) -> dict[str, Any]:
    second = copy.deepcopy(body["gpus"][0])
    second.update(uuid="GPU-2222", index=1, processes=[])
    body["gpus"].append(second)
    return body


@pytest.mark.parametrize(
    ("mutate", "path", "uuid"),
    [
        (lambda g: g.update(memory_used_mib=99999.0), "report.gpus[0].memory_used_mib", "GPU-1111"),
        (lambda g: g.update(utilization_gpu=55), "report.gpus[0].utilization_gpu", "GPU-1111"),
        (lambda g: g.update(temperature_c=float("nan")), "report.gpus[0].temperature_c", "GPU-1111"),
        (lambda g: g.update(uuid=""), "report.gpus[0].uuid", "gpu-1/invalid-gpu-0"),
        (lambda g: g["processes"][0].update(pid=None), "report.gpus[0].processes[0].pid", "GPU-1111"),
        (lambda g: g.update(memory_total_mib="lots"), "report.gpus[0].memory_total_mib", "GPU-1111"),
    ],
)
def test_one_bad_gpu_reading_keeps_the_node_report(mutate: Any, path: str, uuid: str) -> None:
    """Issue 13 item 13: the bad GPU is kept, unhealthy and full, saying why; the others are read."""
    body = with_second_gpu(sample_report().to_dict())
    mutate(body["gpus"][0])
    report = parse_report(body)
    bad, good = report.gpus
    assert bad.uuid == uuid and not bad.healthy and bad.error.startswith(f"invalid reading: {path}")
    assert bad.memory_used_mib == bad.memory_total_mib and bad.processes == ()
    assert good.healthy and good.uuid == "GPU-2222" and good.memory_used_mib == 12000.0
    assert report.node == "gpu-1" and len(report.pods) == 1
    assert checked(report) == report  # what the agent sends is what the extender reads


def test_a_gpu_uuid_given_twice_keeps_the_first_and_the_report() -> None:
    """Uniqueness is a rule across GPUs: the second holder is the bad reading, kept unhealthy and full."""
    body = sample_report().to_dict()
    body["gpus"].append({**copy.deepcopy(body["gpus"][0]), "index": 1, "processes": []})
    report = parse_report(body)
    first, second = report.gpus
    assert first.healthy and first.uuid == "GPU-1111"
    assert not second.healthy and second.uuid == "gpu-1/invalid-gpu-1" and second.memory_used_mib == 40960.0
    assert second.error.startswith("invalid reading: report.gpus[1].uuid")
    assert decode_report(json.dumps(body).encode()) is None  # the fast path leaves it to the parser
    assert checked(report) == report


def near(valid: st.SearchStrategy[Any], *, field: bool = True) -> st.SearchStrategy[Any]:
    """Mostly a valid value, sometimes a wrong type, null, a negative, an extreme or (a field) nothing."""
    bad = st.sampled_from([None, True, -1, 1e308, "x", 1.5, 2**70, *([MISSING] if field else [])])
    return st.integers(0, 59).flatmap(lambda k: valid if k else bad)


MISSING = object()
numbers = st.floats(min_value=0, max_value=5e4, allow_nan=False) | st.integers(0, 50_000)


def present(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not MISSING}


processes = st.builds(present, pid=near(st.integers(0, 10**6)), used_memory_mib=near(numbers),
                      pod_uid=near(st.text(max_size=3)))
gpus = st.builds(present, uuid=near(st.sampled_from(["GPU-a", "GPU-b", ""])), index=near(st.integers(0, 8)),
                 model=near(st.just("A100")), memory_total_mib=near(numbers), memory_used_mib=near(numbers),
                 memory_reserved_mib=near(numbers), utilization_gpu=near(st.floats(0, 1)),
                 utilization_memory=near(st.floats(0, 1)), temperature_c=near(st.floats(-50, 120)),
                 power_w=near(numbers), healthy=near(st.booleans()), error=near(st.text(max_size=3)),
                 processes=near(st.lists(processes, max_size=2)))
pods = st.builds(present, pod_uid=near(st.sampled_from(["uid-a", ""])), current_memory_mib=near(numbers),
                 peak_memory_mib=near(numbers),
                 gpu_uuids=near(st.lists(near(st.just("GPU-a"), field=False), max_size=2)),
                 first_seen_s=near(numbers))
reports = st.builds(present, node=near(st.sampled_from(["gpu-1", ""])), sequence=near(st.integers(0, 10)),
                    timestamp_s=near(numbers), agent_version=near(st.just("0.1")),
                    source=near(st.sampled_from(["nvml", "simulated", "fake"])),
                    gpus=near(st.lists(gpus, max_size=3)), pods=near(st.lists(pods, max_size=2)),
                    interval_s=near(numbers), schema_version=near(st.integers(0, 2)))


@settings(max_examples=400, deadline=None)
@given(reports)
def test_fast_decoding_equals_the_parser_or_defers_to_it(body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    fast = decode_report(data)
    try:
        slow = parse_report(json.loads(data))
    except ReportError:
        assert fast is None
        return
    if fast is not None:
        assert fast == slow
    else:  # only where the parser is lenient: it takes null for a field with a default, and it keeps a
        # GPU whose reading breaks the schema as unhealthy (the fast path leaves that to it)
        assert "null" in data.decode() or any(g.error.startswith("invalid reading: ") for g in slow.gpus)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                 max_size=4), max_leaves=20))
def test_arbitrary_json_raises_only_report_error(body: Any) -> None:
    with contextlib.suppress(ReportError):
        parse_report(body)
