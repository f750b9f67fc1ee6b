"""The telemetry report schema: round trip, and every malformed field refused with its path."""

from __future__ import annotations

import contextlib
import copy
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extender.telemetry import GpuReport, NodeReport, PodUsage, ProcessReport, ReportError, parse_report


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


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda d: d.pop("node"), "report.node"),
        (lambda d: d.update(sequence=-1), "report.sequence"),
        (lambda d: d.update(sequence="7"), "report.sequence"),
        (lambda d: d.update(source="fake"), "report.source"),
        (lambda d: d["gpus"][0].update(memory_used_mib=99999.0), "report.gpus[0].memory_used_mib"),
        (lambda d: d["gpus"][0].update(utilization_gpu=55), "report.gpus[0].utilization_gpu"),
        (lambda d: d["gpus"][0].update(uuid=""), "report.gpus[0].uuid"),
        (lambda d: d["gpus"][0]["processes"][0].update(pid=None), "report.gpus[0].processes[0].pid"),
        (lambda d: d["gpus"].append(copy.deepcopy(d["gpus"][0])), "report.gpus"),
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


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                 max_size=4), max_leaves=20))
def test_arbitrary_json_raises_only_report_error(body: Any) -> None:
    with contextlib.suppress(ReportError):
        parse_report(body)
