"""The local walk-throughs give the answers they show, with the shipped predictor: the README's tour and
docs/extender.md "Run it locally" (and the `deepres predict` output of docs/data-scientist.md).

Why: the curl example is the first thing a user runs; a retrained artifact or a changed message
must not leave the docs promising answers the extender no longer gives.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from extender.kube.local import InMemoryCluster
from extender.server.app import create_app
from extender.settings import Settings
from predictor.runtime import Predictor

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
EXTENDER_PAGE = (ROOT / "docs" / "extender.md").read_text()  # "Run it locally"
DATA_SCIENTIST_PAGE = (ROOT / "docs" / "data-scientist.md").read_text()
TOKEN = "local-dev-token"


def heredoc_after(marker: str, text: str = EXTENDER_PAGE) -> str:
    """The JSON heredoc of the first curl command in text that posts to `marker`."""
    start = text.index(marker)
    body = text[start:].split("<<'JSON'", 1)[1].split("\nJSON\n", 1)[0]
    return body.split("\n", 1)[1]


def test_the_local_walk_through_answers_as_documented() -> None:
    section = EXTENDER_PAGE[EXTENDER_PAGE.index("## Run it locally"):]
    settings = Settings()
    settings.kube.no_kube = True
    settings.telemetry.telemetry_token = TOKEN
    predictor = Predictor.load()
    client = create_app(settings, predictor=predictor, clock=lambda: 1_763_700_001.0,
                        cluster=InMemoryCluster()).test_client()
    auth = {"Authorization": f"Bearer {TOKEN}"}

    gpu_a = json.loads(heredoc_after("127.0.0.1:8888/v1/telemetry"))
    gpu_b = {**gpu_a, "node": "gpu-b", "gpus": [{"uuid": "GPU-b0", "index": 0, "model": "Tesla T4",
                                                 "memory_total_mib": 15360, "memory_used_mib": 14000}]}
    assert "one \"Tesla T4\", memory_total_mib 15360, memory_used_mib 14000" in section  # what gpu_b stands for
    for report in (gpu_a, gpu_b):
        answer = client.post("/v1/telemetry", json=report, headers=auth)
        assert answer.get_json() == {"accepted": True, "outcome": "accepted", "deltas": True}

    request = json.loads(heredoc_after("127.0.0.1:8888/filter"))
    shown = json.loads(section.split("```json\n", 1)[1].split("\n```", 1)[0])
    assert client.post("/filter", json=request).get_json() == shown
    said = re.search(r"none fits and every reason is given:\s+`(\{.*?\})` in `FailedNodes` and\s+`(\{.*?\})` in "
                     r"`FailedAndUnresolvableNodes`", section, re.S)
    assert said is not None
    none_fit = client.post("/filter", json={**request, "NodeNames": ["gpu-b", "gpu-c"]}).get_json()
    assert none_fit["NodeNames"] == []
    assert (none_fit["FailedNodes"], none_fit["FailedAndUnresolvableNodes"]) == (json.loads(said[1]),
                                                                                  json.loads(said[2]))

    scores = json.loads(re.search(r"`/prioritize` with the same body answers `(\[.*?\])`", section,
                                  re.S).group(1).replace("\n", ""))  # type: ignore[union-attr]
    assert client.post("/prioritize", json=request).get_json() == scores

    decided = client.post("/v1/predict", json={"annotations": request["Pod"]["metadata"]["annotations"]}).get_json()
    demand = decided["demand"]
    assert f"shipped predictor `{decided['predictor_version']}`" in section
    assert f"`memory_mib` {demand['memory_mib']}, `memory_mib_upper` {demand['memory_mib_upper']}" in section
    assert f"{demand['gflops_per_iteration']} GFLOP/iteration, {demand['gpu_seconds']:.0f} GPU-seconds" in section
    assert f"priority {decided['priority']:.1f}" in section


def test_the_data_scientist_example_is_what_deepres_predict_prints() -> None:
    """The `deepres predict -f deploy/examples/cnn-small.yaml` output docs/data-scientist.md and the README's
    tour show, verbatim."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "extender.cli", "predict", "-f", "deploy/examples/cnn-small.yaml"],
                          cwd=root, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    for text in (DATA_SCIENTIST_PAGE, README[README.index("## A three-minute tour"):]):
        shown = text.split("```text\n", 1)[1].split("\n```", 1)[0]
        assert done.stdout.rstrip("\n") == shown


def test_the_readme_tour_answers_as_shown() -> None:
    tour = README[README.index("## A three-minute tour"):README.index("## What it has measured")]
    settings = Settings()
    settings.kube.no_kube = True
    settings.telemetry.telemetry_token = TOKEN
    client = create_app(settings, predictor=Predictor.load(), clock=lambda: 1_763_700_001.0,
                        cluster=InMemoryCluster()).test_client()
    report = json.loads(heredoc_after("127.0.0.1:8888/v1/telemetry", tour))
    answer = client.post("/v1/telemetry", json=report, headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.get_json() == {"accepted": True, "outcome": "accepted", "deltas": True}
    assert '# answers {"accepted":true,"outcome":"accepted","deltas":true}' in tour
    request = json.loads(heredoc_after("127.0.0.1:8888/filter", tour))
    shown = json.loads(tour.split("```json\n", 1)[1].split("\n```", 1)[0])
    assert client.post("/filter", json=request).get_json() == shown
    said = re.search(r'`"NodeNames": (\[.*?\])` alone and the reason comes back.*?`(\{.*?\})` in\s+'
                     r"`FailedAndUnresolvableNodes`", tour, re.S)
    assert said is not None
    alone = client.post("/filter", json={**request, "NodeNames": json.loads(said[1])}).get_json()
    assert alone["NodeNames"] == [] and alone["FailedAndUnresolvableNodes"] == json.loads(said[2])
