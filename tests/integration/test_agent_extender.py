"""The agent against the real extender (`deepres serve --no-kube` with a shared token file):
a simulated node shows up in the extender's state and metrics, and its GPUs decide /filter."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.localserver import PORT_TRIES, LocalServer, free_port, holds_port

ENTRY = "import sys; from extender.cli import main; sys.exit(main())"
NODE = "sim-node-1"


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError:
        return 0, ""


def _post(url: str, body: object) -> dict[str, object]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, object] = json.loads(response.read())
        return answer


def _wait(condition: object, what: str, timeout_s: float = 60.0) -> None:
    pause = threading.Event()
    for _ in range(int(timeout_s / 0.1)):
        if condition():  # type: ignore[operator]
            return
        pause.wait(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _stop(process: subprocess.Popen[bytes]) -> int:
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait(5)


@pytest.fixture(scope="module")
def extender(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    workdir = tmp_path_factory.mktemp("extender")
    # ready: predictor loaded and first sync applied (the verbs answer "not ready" before)
    with LocalServer(workdir, token="shared-agent-token", args=["--threads", "2"]) as server:
        token = workdir / "agent-token"
        token.write_text("shared-agent-token\n")
        yield server.url, token


def _agent(extender_url: str, token: Path, *extra: str) -> tuple[subprocess.Popen[bytes], int]:
    """A simulated agent whose metrics listener holds its port: another process may take a free port
    before the agent binds it, so the agent is started again on a fresh one when that happened."""
    for _ in range(PORT_TRIES):
        metrics_port = free_port()
        log = tempfile.NamedTemporaryFile(prefix="agent-", suffix=".log", delete=False)  # noqa: SIM115
        with log:
            process = subprocess.Popen(
                [sys.executable, "-c", ENTRY, "agent", "--source", "simulated", "--simulated-gpus", "2xA100-40GB",
                 "--no-kube", "--node-name", NODE, "--extender-url", extender_url, "--token-file", str(token),
                 "--listen", f"127.0.0.1:{metrics_port}", "--interval-s", "60", "--heartbeat-s", "60", *extra],
                env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=log,
            )
        try:
            _wait(lambda: process.poll() is not None or holds_port(process.pid, metrics_port),  # noqa: B023
                  "the agent's metrics listener", 30.0)
            if process.poll() is None:
                return process, metrics_port
            output = Path(log.name).read_text(errors="replace")
            if "address already in use" not in output.lower():
                raise AssertionError(f"the agent exited with {process.returncode}: {output[-2000:]}")
        finally:
            os.unlink(log.name)
    raise AssertionError(f"no free port for the agent's metrics in {PORT_TRIES} tries")


def _filter(url: str, memory: str) -> dict[str, object]:
    pod = {"metadata": {"name": "train", "namespace": "ml", "uid": "9d9d9d9d-0000-4000-8000-000000000001",
                        "annotations": {"deepres.io/gpu-memory": memory}},
           "spec": {"schedulerName": "deepres-scheduler"}}
    return _post(url + "/filter", {"Pod": pod, "NodeNames": [NODE]})


def test_simulated_node_appears_in_the_extender(extender: tuple[str, Path]) -> None:
    url, token = extender
    assert NODE not in _filter(url, "8Gi").get("NodeNames", [])  # no telemetry yet: the node fails
    agent, metrics_port = _agent(url, token)
    try:
        # the first report goes out at start-up: the extender knows the node after the agent's first
        # sampling round, i.e. within one (60 s) interval
        _wait(lambda: f'node="{NODE}"' in _get(url + "/metrics")[1], "the node in the extender's metrics")
        assert _agent_value(metrics_port, "deepres_agent_sample_seconds_count") == 1
        assert _filter(url, "30Gi")["NodeNames"] == [NODE]  # an idle simulated A100-40GB fits 30 GiB
        refused = _filter(url, "60Gi")  # but no GPU has 60 GiB
        failed = {**refused["FailedNodes"], **refused["FailedAndUnresolvableNodes"]}  # type: ignore[dict-item]
        assert refused["NodeNames"] == [] and NODE in failed
        _wait(lambda: _agent_count(metrics_port, "ok") >= 1, "the agent to count a delivered report")
        assert _get(f"http://127.0.0.1:{metrics_port}/healthz") == (200, "ok\n")
    finally:
        assert _stop(agent) == 0


def test_wrong_token_is_refused_and_counted(extender: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = extender
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-token")
    agent, metrics_port = _agent(url, wrong, "--node-name", "intruder-node", "--report-failure-grace-s", "1")
    try:
        _wait(lambda: _agent_count(metrics_port, "unauthorized") >= 1, "a 401 counted by the agent")
        assert 'node="intruder-node"' not in _get(url + "/metrics")[1]
        # reports that keep failing make the agent unready (issue 13 item 13); sampling itself is alive
        _wait(lambda: _get(f"http://127.0.0.1:{metrics_port}/healthz")[0] == 503, "/healthz to say 503")
        _, text = _get(f"http://127.0.0.1:{metrics_port}/healthz")
        assert "reports failing for" in text and "unauthorized" in text
        assert _get(f"http://127.0.0.1:{metrics_port}/livez")[0] == 200
    finally:
        assert _stop(agent) == 0


def _agent_count(port: int, result: str) -> float:
    return _agent_value(port, f'deepres_agent_reports_total{{result="{result}"}}')


def _agent_value(port: int, series: str) -> float:
    status, text = _get(f"http://127.0.0.1:{port}/metrics")
    if status != 200:
        return 0.0
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0
