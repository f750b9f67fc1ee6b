"""`deepres bench cluster`'s simulated agents (its own lean HTTP client) against a real `deepres serve`:
their reports are accepted as the production agent's are, each node's sequence rises, and an
answer other than 200 is counted as refused, never silently; after a node's first report its
heartbeats go as deltas naming no GPU, and the extender still has every GPU of the node."""

from __future__ import annotations

import time
from pathlib import Path

from devtools.bench_cluster_agents import _AgentConnection, _Agents, _ReportTemplate
from devtools.localserver import LocalServer
from tests.fixtures.kube.payloads import extender_args, pod
from tests.fixtures.kube.server import TOKEN, post

DOUBLE = {"DEEPRES_PREDICTOR_FACTORY": "tests.fixtures.kube.doubles:make_predictor"}


def test_simulated_agents_report_over_keep_alive_and_refusals_are_counted(tmp_path: Path) -> None:
    # every node that fits is named (no shortlist): which nodes the reports made known is what is checked
    with LocalServer(tmp_path, token=TOKEN, env={**DOUBLE, "DEEPRES_FILTER_SHORTLIST": "0"}) as server:
        conn = _AgentConnection(server.port)
        first = conn.post("/v1/telemetry", TOKEN, _ReportTemplate("n1").body(5, time.time()))
        older = conn.post("/v1/telemetry", TOKEN, _ReportTemplate("n1").body(4, time.time()))  # same connection
        wrong = conn.post("/v1/telemetry", "not-the-token", _ReportTemplate("n1").body(6, time.time()))
        conn.close()
        assert first[0] == 200 and b'"outcome":"accepted"' in first[1].replace(b" ", b"")
        assert older[0] == 200 and b"old sequence" in older[1]
        assert wrong[0] == 401

        nodes = ["n2", "n3", "n4"]
        agents = _Agents(server.port, {**{n: TOKEN for n in nodes}, "bad": "nope"}, heartbeat_s=0.2)
        agents.start()
        time.sleep(1.0)
        agents.stop()
        assert agents.sent >= 8
        assert agents.deltas >= 3  # after each node's first report, its heartbeats went as deltas (issue #48)
        refused = [r for r in agents.refused if r.startswith("bad: 401")]
        assert refused and len(refused) == len(agents.refused)  # only the bad token's reports
        status, out = post(server.url + "/filter", extender_args(pod("p", {"deepres.io/gpu-memory": "30Gi"}),
                                                                 names=[*nodes, "n5"]))
        assert status == 200 and sorted(out["NodeNames"]) == nodes, out  # every reporting node fits
