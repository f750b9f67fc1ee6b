"""The simulated source: spec parsing, stable UUIDs, usage from the pods placed on the node."""

from __future__ import annotations

from pathlib import Path

import pytest

from extender.agent.kube import FilePods, PodInfo, dump_pods
from extender.agent.simulated import SimulatedSource, parse_gpu_spec, simulated_uuid
from extender.telemetry import NodeReport, parse_report


class Pods:
    def __init__(self, pods: list[PodInfo]) -> None:
        self.items = pods

    def pods(self) -> list[PodInfo]:
        return list(self.items)


def pod(uid: str, gpus: list[str], mib: str, phase: str = "Running") -> PodInfo:
    return PodInfo(uid=uid, namespace="ml", name=f"job-{uid}", phase=phase, annotations={
        "deepres.io/assigned-gpus": ",".join(gpus), "deepres.io/predicted-memory-mib": mib})


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("2xA100-40GB,1xT4-16GB",
         [("NVIDIA A100-40GB", 40960), ("NVIDIA A100-40GB", 40960), ("NVIDIA T4-16GB", 16384)]),
        ("H100-80GB", [("NVIDIA H100-80GB", 81920)]),
        ("1 x RTX-A6000-48GiB", [("NVIDIA RTX-A6000-48GB", 49152)]),
    ],
)
def test_spec(spec: str, expected: list[tuple[str, float]]) -> None:
    assert [(g.model, g.memory_mib) for g in parse_gpu_spec(spec)] == expected


@pytest.mark.parametrize("spec", ["", "2xA100", "A100-0GB", "0xT4-16GB", "65xA100-40GB", "2xA100-40GB,,"])
def test_bad_spec_names_the_item(spec: str) -> None:
    with pytest.raises(ValueError, match=r"GPU|at most"):
        parse_gpu_spec(spec)


def test_uuids_are_stable_per_node_and_index() -> None:
    assert simulated_uuid("n1", 0) == simulated_uuid("n1", 0)
    assert len({simulated_uuid("n1", 0), simulated_uuid("n1", 1), simulated_uuid("n2", 0)}) == 3


def test_usage_is_the_assigned_pods_prediction_with_bounded_noise() -> None:
    gpus = parse_gpu_spec("2xA100-40GB")
    u0, u1 = simulated_uuid("n1", 0), simulated_uuid("n1", 1)
    pods = Pods([
        pod("p1", [u0], "10000"),
        pod("p2", [u0, u1], "4000"),
        pod("p3", [u1], "999999", phase="Succeeded"),  # finished: holds nothing
        pod("p4", ["GPU-of-another-node"], "5000"),
        pod("p5", [u1], "lots"),  # malformed: ignored
    ])
    source = SimulatedSource("n1", gpus, pods, seed=7, noise=0.03)
    sample = source.sample()
    report = parse_report(NodeReport("n1", 1, 1.0, "t", "simulated", sample.gpus).to_dict())
    g0, g1 = report.gpus
    assert {p.pod_uid for p in g0.processes} == {"p1", "p2"} and {p.pod_uid for p in g1.processes} == {"p2"}
    assert g0.memory_used_mib == pytest.approx(14000, rel=0.15)
    assert g1.memory_used_mib == pytest.approx(4000, rel=0.15)
    assert g0.memory_used_mib != 14000  # noise is applied
    assert g0.utilization_gpu > 0


def test_noise_is_seeded() -> None:
    gpus = parse_gpu_spec("1xT4-16GB")
    pods = Pods([pod("p1", [simulated_uuid("n", 0)], "5000")])
    runs = [[SimulatedSource("n", gpus, pods, seed=s).sample() for _ in range(3)] for s in (1, 1, 2)]
    assert runs[0] == runs[1] != runs[2]


def test_memory_is_capped_at_capacity() -> None:
    pods = Pods([pod("p1", [simulated_uuid("n", 0)], "90000")])
    (g,) = SimulatedSource("n", parse_gpu_spec("1xT4-16GB"), pods).sample().gpus
    assert g.memory_used_mib == g.memory_total_mib == 16384


def test_pods_file_is_reread_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "pods.json"
    lister = FilePods(path)
    assert lister.pods() == []  # no file yet: no pods, no crash
    path.write_text(dump_pods([pod("p1", ["g"], "1")]))
    assert [p.uid for p in lister.pods()] == ["p1"]
    path.write_text(dump_pods([pod("p1", ["g"], "1"), pod("p2", ["g"], "2")]) + "\n")
    assert [p.uid for p in lister.pods()] == ["p1", "p2"]
    path.write_text("{not yaml: [")
    assert lister.pods() == []


def test_usage_is_the_true_usage_when_the_pod_carries_it_not_the_prediction() -> None:
    """The usage model's truth (simulated.deepres.io/usage-mib) wins over the extender's prediction,
    so a misprediction shows on the simulated GPU as on a real one; above the GPU it is capped."""
    gpus = parse_gpu_spec("2xA100-40GB")
    u0, u1 = simulated_uuid("n1", 0), simulated_uuid("n1", 1)
    under = pod("under", [u0], "4000")
    under.annotations["simulated.deepres.io/usage-mib"] = "12000"  # the job uses 3x what was predicted
    over = pod("over", [u1], "30000")
    over.annotations["simulated.deepres.io/usage-mib"] = "90000"  # larger than the GPU: out of memory there
    sample = SimulatedSource("n1", gpus, Pods([under, over]), noise=0.0).sample()
    by_uuid = {g.uuid: g for g in sample.gpus}
    assert by_uuid[u0].memory_used_mib == 12000
    assert by_uuid[u1].memory_used_mib == 40960
