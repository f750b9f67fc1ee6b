"""Delta reports through the live path (issue #48): the agent's real reporter posts to the real
extender (`deepres serve --no-kube` on loopback). After its first accepted report each next one goes
as a delta (only the GPUs that changed), the extender's state is the full report it stands for
(seen through /filter), and a fresh extender, which holds no base, refuses the delta by name, upon
which the same report goes again whole and is taken."""

from __future__ import annotations

import json
import random
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.localserver import LocalServer
from extender.agent.reporter import Delivery, HttpPoster, Reporter, TokenFile
from extender.telemetry import GpuReport, NodeReport

TOKEN = "delta-agent-token"
NODE = "delta-node-1"
GPU_MIB = 40960.0


class Recording:
    """The real HTTP poster, re-pointable (an extender replaced by a fresh one), keeping each body
    sent and each answer."""

    def __init__(self, url: str) -> None:
        self.target = HttpPoster(url, timeout_s=10.0)
        self.sent: list[tuple[dict[str, Any], Delivery]] = []
        self.lock = threading.Lock()

    def __call__(self, body: bytes, token: str | None) -> Delivery:
        delivery = self.target(body, token)
        with self.lock:
            self.sent.append((json.loads(body), delivery))
        return delivery

    def bodies(self) -> list[tuple[dict[str, Any], Delivery]]:
        with self.lock:
            return list(self.sent)


def _report(sequence: int, used: tuple[float, float]) -> NodeReport:
    gpus = tuple(GpuReport(uuid=f"GPU-delta-{i}", index=i, model="NVIDIA A100-SXM4-40GB", memory_total_mib=GPU_MIB,
                           memory_used_mib=u) for i, u in enumerate(used))
    return NodeReport(node=NODE, sequence=sequence, timestamp_s=1000.0 + sequence, agent_version="test",
                      source="simulated", gpus=gpus, boot_id="boot-delta")


def _filter(url: str, uid: str, memory: str, gpus: int = 1) -> list[str]:
    pod = {"metadata": {"name": f"train-{uid}", "namespace": "ml", "uid": uid,
                        "annotations": {"deepres.io/gpu-memory": memory, "deepres.io/gpus": str(gpus)}},
           "spec": {"schedulerName": "deepres-scheduler"}}
    request = urllib.request.Request(url + "/filter", data=json.dumps({"Pod": pod, "NodeNames": [NODE]}).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        names: list[str] = json.loads(response.read()).get("NodeNames") or []
        return names


def _wait(condition: Any, what: str, timeout_s: float = 30.0) -> None:
    pause = threading.Event()
    for _ in range(int(timeout_s / 0.02)):
        if condition():
            return
        pause.wait(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture()
def token(tmp_path: Path) -> Path:
    path = tmp_path / "agent-token"
    path.write_text(TOKEN + "\n")
    return path


@pytest.fixture()
def servers(tmp_path: Path) -> Iterator[tuple[LocalServer, LocalServer]]:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with LocalServer(tmp_path / "a", token=TOKEN) as first, LocalServer(tmp_path / "b", token=TOKEN) as second:
        yield first, second


def test_deltas_carry_what_changed_and_a_fresh_extender_gets_the_report_whole(
        servers: tuple[LocalServer, LocalServer], token: Path) -> None:
    first, second = servers
    poster = Recording(first.url)
    reporter = Reporter(poster, TokenFile(token), backoff_initial_s=0.02, backoff_max_s=0.1,
                        rng=random.Random(0)).start()
    try:
        reporter.submit(_report(1, (0.0, 0.0)))
        _wait(lambda: reporter.delivered_sequence == 1, "the first report")
        reporter.submit(_report(2, (GPU_MIB, 0.0)))  # GPU 0 fills; GPU 1 as it was
        _wait(lambda: reporter.delivered_sequence == 2, "the second report")
        (full, answer1), (delta, answer2) = poster.bodies()
        assert full["base_sequence"] is None and len(full["gpus"]) == 2 and answer1.deltas
        assert delta["base_sequence"] == 1 and [g["uuid"] for g in delta["gpus"]] == ["GPU-delta-0"]
        assert answer2.result == "ok"
        # the extender holds the full report the delta stands for: GPU 0 full (two GPUs of 30 GiB
        # do not fit), GPU 1 still empty (one of 30 GiB does)
        assert _filter(first.url, "00000000-0000-4000-8000-000000000001", "30Gi", gpus=2) == []
        assert _filter(first.url, "00000000-0000-4000-8000-000000000002", "30Gi") == [NODE]

        poster.target = HttpPoster(second.url, timeout_s=10.0)  # a fresh extender: no base held
        reporter.submit(_report(3, (GPU_MIB, GPU_MIB)))
        _wait(lambda: reporter.delivered_sequence == 3, "the third report, whole")
        refused, taken = poster.bodies()[2:]
        assert refused[0]["base_sequence"] == 2 and refused[1].result == "rejected" and refused[1].status == 409
        assert "full_report_needed" in refused[1].detail
        assert taken[0]["base_sequence"] is None and taken[0]["sequence"] == 3 and len(taken[0]["gpus"]) == 2
        assert taken[1].result == "ok"
        assert _filter(second.url, "00000000-0000-4000-8000-000000000003", "8Gi") == []  # both GPUs full there
    finally:
        reporter.stop()
