"""The scenarios both suites run as they are: imported by tests/e2e/test_kind.py and
tests/cluster/test_scenarios.py, so pytest collects them in each, with that suite's `clean` and
`priority_classes` fixtures (a kind cluster, or the local control plane). Scenarios that differ
between the two (containers, restarts) stay in each suite's own file."""

from __future__ import annotations

from tests.e2e import scenarios as s
from tests.e2e.scenarios import ScenarioCluster

__all__ = [
    "test_2_a_pod_larger_than_any_gpu_stays_pending_with_the_reason",
    "test_3_critical_pod_goes_first_and_preemption_evicts_only_lower_priority",
    "test_4_a_waiting_pod_is_scheduled_within_seconds_when_a_job_ends",
]


def test_2_a_pod_larger_than_any_gpu_stays_pending_with_the_reason(clean: ScenarioCluster) -> None:
    s.a_pod_larger_than_any_gpu_stays_pending_with_the_reason(clean)


def test_3_critical_pod_goes_first_and_preemption_evicts_only_lower_priority(
    clean: ScenarioCluster, priority_classes: None
) -> None:
    s.critical_pod_goes_first_and_preemption_evicts_only_lower_priority(clean)


def test_4_a_waiting_pod_is_scheduled_within_seconds_when_a_job_ends(clean: ScenarioCluster) -> None:
    s.a_waiting_pod_is_scheduled_within_seconds_when_a_job_ends(clean)
