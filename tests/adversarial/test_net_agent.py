"""One GPU's bad reading must not hide its node (issue 13, item 13): the production agent code
(`Agent` + `NvmlSource` over the pynvml-shaped fake + `Reporter` + `HttpPoster`) reports to a real
`deepres serve`; the node's good GPU takes pods, the bad ones are out with their reason."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from devtools.localserver import LocalServer
from extender.agent.fakenvml import FakeGpu, FakeNvml
from extender.agent.main import Agent, AgentSettings
from extender.agent.nvml import NvmlSource
from extender.agent.reporter import HttpPoster, Reporter, TokenFile
from tests.fixtures.kube.payloads import extender_args, pod
from tests.fixtures.kube.server import TOKEN, post

# memory decides here (pods share GPUs): the compute rule is off (tests/unit/test_sharing.py covers it)
DOUBLE = {"DEEPRES_PREDICTOR_FACTORY": "tests.fixtures.kube.doubles:make_predictor", "DEEPRES_SHARING": "false"}
NODE = "gpu-odd"


def filter_gpus(url: str, gpus: int) -> dict[str, Any]:
    body = extender_args(pod(f"p{gpus}", {"deepres.io/gpu-memory": "30Gi", "deepres.io/gpus": str(gpus)}),
                         names=[NODE])
    status, out = post(url + "/filter", body)
    assert status == 200
    answer: dict[str, Any] = out
    return answer


def test_bad_readings_of_some_gpus_leave_the_others_schedulable(tmp_path: Path) -> None:
    gpus = [
        FakeGpu(uuid="GPU-nan-temperature", temperature_c=float("nan")),  # type: ignore[arg-type]
        FakeGpu(uuid="GPU-free-above-total", used_mib=-512),  # NVML's free > total
        FakeGpu(uuid=""),  # no UUID
        FakeGpu(uuid="GPU-good", used_mib=1000),
    ]
    token = tmp_path / "agent-token"
    token.write_text(TOKEN)
    with LocalServer(tmp_path, token=TOKEN, env=DOUBLE) as server:
        reporter = Reporter(HttpPoster(server.url), TokenFile(token)).start()
        try:
            agent = Agent(AgentSettings(node=NODE, extender_url=server.url, no_kube=True),
                          NvmlSource.open(FakeNvml(gpus)), reporter)
            agent.step()
            deadline = time.monotonic() + 20
            while reporter.delivered_sequence < 0 and time.monotonic() < deadline:
                threading.Event().wait(0.1)
            assert reporter.last_delivery is not None and reporter.last_delivery.result == "ok", reporter.last_delivery
        finally:
            reporter.stop()
        assert filter_gpus(server.url, 1)["NodeNames"] == [NODE]  # GPU-good takes it
        two = filter_gpus(server.url, 2)  # only one GPU of four is usable
        assert two["NodeNames"] == [] and NODE in {**two["FailedNodes"], **two["FailedAndUnresolvableNodes"]}
