"""Delta reports (issue #48): a delta stands for exactly the full report it was made from, and one
that cannot apply is refused by name, never applied to the wrong base."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.server.report_fastpath import decode_report
from extender.telemetry import GpuReport, NodeReport, ReportError, apply_delta, delta_of, parse_report


def _gpu(i: int, used: float, util: float = 0.0) -> GpuReport:
    return GpuReport(uuid=f"GPU-{i}", index=i, model="NVIDIA A100-SXM4-80GB", memory_total_mib=81920.0,
                     memory_used_mib=used, utilization_gpu=util)


def _report(sequence: int, used: list[float], util: list[float] | None = None, boot: str = "boot-a") -> NodeReport:
    util = util or [0.0] * len(used)
    gpus = tuple(_gpu(i, u, x) for i, (u, x) in enumerate(zip(used, util, strict=True)))
    return NodeReport(node="gpu-1", sequence=sequence, timestamp_s=1000.0 + sequence, agent_version="t",
                      source="simulated", gpus=gpus, boot_id=boot)


readings = st.lists(st.tuples(st.sampled_from([0.0, 1024.0, 40000.0]), st.sampled_from([0.0, 0.5, 1.0])),
                    min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(before=readings, data=st.data())
def test_a_delta_applied_to_its_base_is_the_report_it_was_made_from(before: list[tuple[float, float]],
                                                                    data: st.DataObject) -> None:
    after = data.draw(st.lists(st.tuples(st.sampled_from([0.0, 1024.0, 40000.0]), st.sampled_from([0.0, 0.5, 1.0])),
                               min_size=len(before), max_size=len(before)))
    base = _report(3, [u for u, _ in before], [x for _, x in before])
    report = _report(4, [u for u, _ in after], [x for _, x in after])
    delta = delta_of(report, base)
    assert delta.base_sequence == 3
    assert len(delta.gpus) == sum(a != b for a, b in zip(after, before, strict=True))  # only what changed travels
    wire = json.dumps(delta.to_dict()).encode()  # through both of the extender's readers
    for read in (decode_report(wire), parse_report(json.loads(wire))):
        assert read is not None and apply_delta(read, base) == report


def test_a_changed_gpu_set_or_a_new_boot_goes_whole() -> None:
    base = _report(3, [0.0, 0.0])
    assert delta_of(_report(4, [0.0, 0.0, 0.0]), base).base_sequence is None  # a GPU more
    assert delta_of(_report(4, [0.0]), base).base_sequence is None  # a GPU gone
    assert delta_of(_report(1, [0.0, 0.0], boot="boot-b"), base).base_sequence is None  # the agent restarted
    assert delta_of(_report(4, [0.0, 0.0], boot=""), replace(base, boot_id="")).base_sequence is None  # no boot id


@pytest.mark.parametrize(("base", "why"), [
    (None, "no report of node gpu-1 is held"),
    (_report(2, [0.0, 0.0]), "the last report held of node gpu-1 is 2"),  # a report between was lost
    (_report(3, [0.0, 0.0], boot="boot-b"), "of boot 'boot-b'"),  # the base is another boot's
    (_report(3, [0.0]), "one its base report does not have"),  # GPU-1 unknown to the base
])
def test_a_delta_that_does_not_apply_is_refused_by_name(base: NodeReport | None, why: str) -> None:
    delta = replace(_report(4, [0.0, 5.0]), gpus=(_gpu(1, 5.0),), base_sequence=3)
    with pytest.raises(ReportError, match=why) as err:
        apply_delta(delta, base)
    assert err.value.path.startswith("report.")


def test_a_delta_without_boot_id_is_refused() -> None:
    delta = replace(_report(4, [0.0], boot=""), base_sequence=3)
    with pytest.raises(ReportError, match="boot_id"):
        apply_delta(delta, _report(3, [0.0], boot=""))


def test_an_old_agents_full_report_reads_as_before() -> None:
    """No `base_sequence` on the wire (agents before deltas): a full report, as it always was."""
    body = _report(4, [0.0, 5.0]).to_dict()
    del body["base_sequence"]
    assert parse_report(body).base_sequence is None
    assert parse_report(body) == _report(4, [0.0, 5.0])
