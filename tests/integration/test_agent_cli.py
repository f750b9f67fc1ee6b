"""`deepres agent` as a process: simulated GPUs reported to a loopback extender stub within one
interval and shown on /metrics; `--source nvml` without a GPU exits 1 with a clear message."""

from __future__ import annotations

import ctypes.util
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from extender.agent.kube import PodInfo, dump_pods
from extender.agent.simulated import simulated_uuid
from tests.integration.test_agent_reporter import StubExtender

POD_UID = "0f0f0f0f-1111-4222-8333-444444444444"


def _agent(*argv: str) -> subprocess.Popen[str]:
    env = dict(os.environ, NODE_NAME="sim-node")
    # not `-m extender.cli`: run as __main__, its UsageError would be a different class than the agent's
    entry = "import sys; from extender.cli import main; sys.exit(main())"
    return subprocess.Popen([sys.executable, "-c", entry, "agent", *argv], env=env, text=True,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)


def _read_until(stream: object, pattern: str, lines: list[str]) -> re.Match[str]:
    for line in stream:  # type: ignore[attr-defined]
        lines.append(line)
        match = re.search(pattern, line)
        if match:
            return match
    raise AssertionError("agent ended before: " + pattern + "\n" + "".join(lines))


def test_simulated_agent_reports_within_one_interval_and_serves_metrics(tmp_path: Path) -> None:
    stub = StubExtender()
    token = tmp_path / "token"
    token.write_text(stub.token)
    pods = tmp_path / "pods.json"
    gpu0 = simulated_uuid("sim-node", 0)
    pods.write_text(dump_pods([PodInfo(uid=POD_UID, namespace="ml", name="train", annotations={
        "deepres.io/assigned-gpus": gpu0, "deepres.io/predicted-memory-mib": "12000"})]))
    agent = _agent("--source", "simulated", "--simulated-gpus", "2xA100-40GB", "--no-kube", "--simulated-pods",
                   str(pods), "--extender-url", stub.url, "--token-file", str(token), "--listen", "127.0.0.1:0",
                   "--interval-s", "1", "--heartbeat-s", "1")
    lines: list[str] = []
    try:
        port = int(_read_until(agent.stderr, r"metrics=http://127\.0\.0\.1:(\d+)", lines).group(1))
        drain = threading.Thread(target=lambda: [lines.append(x) for x in agent.stderr], daemon=True)  # type: ignore[union-attr]
        drain.start()
        arrived = threading.Event()
        for _ in range(200):  # the first report is sent at start, well within one interval
            if stub.accepted:
                arrived.set()
                break
            arrived.wait(0.01)
        assert arrived.is_set(), "".join(lines)
        report = stub.accepted[0]
        assert report.node == "sim-node" and report.source == "simulated"
        by_uuid = {g.uuid: g for g in report.gpus}
        assert by_uuid[gpu0].memory_used_mib == pytest.approx(12000, rel=0.2)
        assert [p.pod_uid for p in report.pods] == [POD_UID]
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert f'uuid="{gpu0}"' in metrics and "deepres_gpu_memory_used_bytes" in metrics
        assert f'pod_uid="{POD_UID}"' in metrics
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).status == 200
    finally:
        agent.send_signal(signal.SIGTERM)
        code = agent.wait(10)
        stub.close()
    assert code == 0
    assert stub.token not in "".join(lines)


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has NVML (a real GPU)")
def test_nvml_without_a_driver_exits_1_with_a_clear_message() -> None:
    agent = _agent("--no-kube", "--listen", "127.0.0.1:0")
    _, err = agent.communicate(timeout=60)
    assert agent.returncode == 1
    assert "NVML could not start" in err and "--source simulated" in err
    assert "Traceback" not in err


def test_bad_flags_exit_2_with_one_line() -> None:
    agent = _agent("--no-kube", "--source", "simulated", "--simulated-gpus", "many")
    _, err = agent.communicate(timeout=60)
    assert agent.returncode == 2
    assert err.strip().count("\n") == 0 and "--simulated-gpus" in err


def test_without_cluster_credentials_the_agent_says_to_use_no_kube(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env.update(NODE_NAME="n1", HOME=str(tmp_path), KUBECONFIG=str(tmp_path / "missing-kubeconfig"))
    entry = "import sys; from extender.cli import main; sys.exit(main())"
    done = subprocess.run([sys.executable, "-c", entry, "agent", "--source", "simulated", "--listen", "127.0.0.1:0"],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert "--no-kube" in done.stderr and "Traceback" not in done.stderr
