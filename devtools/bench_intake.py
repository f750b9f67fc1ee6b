"""`deepres bench intake`: what the agents' reports cost the extender, per node, at cluster sizes.

Issue #48: every node reports every heartbeat (the chart's 15 s) whether or not anything changed,
so the intake's CPU grows with the cluster; what must not grow is the cost of one report. Per size
in `--nodes` (default 1,000, 5,000 and 20,000 simulated nodes of 8 80 GB GPUs), the production
server on a loopback port (`deepres serve --no-kube`, as `deepres bench extender` starts it) first
gets one full report from every node, then, in `--repeats` rounds, one report from every node of
each kind (several at sizes under 5,000, for at least 5,000 reports a kind), posted over 4
connections, and the server's CPU (its processes' user + system time) is
read around each pass:
- full_idle: a full report that says what the last one said (an old agent's heartbeat of an idle node)
- full_changed: a full report with every GPU's utilisation moved (an old agent's heartbeat of a busy node)
- delta_idle: a delta that names no GPU (a new agent's heartbeat of an idle node: nothing changed)
- delta_one_gpu: a delta that names the one GPU whose reading moved
Per kind: the server's CPU per report (ms), and per node per minute at the heartbeat (`--heartbeat-s`,
one report per node per period: 60 / heartbeat_s reports) in ms of CPU. The figures are medians over
the rounds; the server's RSS is read after the last. Writes `reports/bench-intake.json` (`nodes_<N>`
sections, and `size_ratio`: each kind's CPU per report at the largest size over the smallest's).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from devtools.bench_extender import _post_many, _reference_loop_ms, _Server
from extender.cli import UsageError
from extender.provenance import stamp

GPUS = 8
GPU_MIB = 81920.0
KINDS = ("full_idle", "full_changed", "delta_idle", "delta_one_gpu")
#: Reports of each kind per round at least (small clusters report several times in a round).
MIN_REPORTS = 5000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000, 20000], metavar="N",
                        help="simulated cluster sizes (default 1000 5000 20000)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds per size; each figure the median (default 3)")
    parser.add_argument("--heartbeat-s", type=float, default=15.0,
                        help="each node's report period, for the per-minute figure (default 15: the chart's)")
    parser.add_argument("--predictor-factory", default="",
                        help="module:callable predictor instead of the shipped one (DEEPRES_PREDICTOR_FACTORY)")


def run(args: argparse.Namespace) -> int:
    if min(args.nodes) < 10 or args.repeats < 1 or args.heartbeat_s <= 0:
        raise UsageError("--nodes sizes >= 10, --repeats >= 1, --heartbeat-s > 0")
    _progress(f"load average {os.getloadavg()[0]:.1f}; a reference loop of 1M additions takes "
              f"{_reference_loop_ms():.0f} ms here")
    results: dict[str, Any] = {}
    for nodes in args.nodes:
        results[f"nodes_{nodes}"] = _measure(nodes, args)
    smallest, largest = results[f"nodes_{min(args.nodes)}"], results[f"nodes_{max(args.nodes)}"]
    results["size_ratio"] = {kind: round(largest[kind]["cpu_ms_per_report"] / smallest[kind]["cpu_ms_per_report"], 3)
                             if smallest[kind]["cpu_ms_per_report"] > 0 else None for kind in KINDS}
    results["provenance"] = stamp(f"deepres bench intake --nodes {' '.join(map(str, args.nodes))} "
                                  f"--repeats {args.repeats} --heartbeat-s {args.heartbeat_s:g}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"{'nodes':>8}" + "".join(f"{kind + ' ms/report':>26}" for kind in KINDS))
        for nodes in args.nodes:
            section = results[f"nodes_{nodes}"]
            print(f"{nodes:>8}" + "".join(f"{section[kind]['cpu_ms_per_report']:>26}" for kind in KINDS))
        print(f"written to {out}")
    return 0


def _measure(nodes: int, args: argparse.Namespace) -> dict[str, Any]:
    fleet = _Fleet([f"gpu-{i:05d}" for i in range(nodes)])
    with tempfile.TemporaryDirectory(prefix="deepres-bench-") as tmp, _Server(Path(tmp), args) as server:
        _progress(f"{nodes} nodes: a first full report from each")
        _post_many(server, [fleet.full(n, moved=True) for n in fleet.names], threads=4)
        rounds: dict[str, list[float]] = {kind: [] for kind in KINDS}
        passes = -(-MIN_REPORTS // nodes)  # the CPU clock ticks in 10 ms: enough reports to read it
        for k in range(args.repeats):
            for kind in KINDS:
                cpu_s, sent = 0.0, 0
                for _ in range(passes):  # a pass: one report from every node
                    bodies = [fleet.body(kind, n) for n in fleet.names]  # encoded before the CPU is read
                    cpu0 = server.cpu_s()
                    _post_many(server, bodies, threads=4)
                    cpu_s += server.cpu_s() - cpu0
                    sent += len(bodies)
                rounds[kind].append(cpu_s * 1000.0 / sent)
            _progress(f"  round {k + 1}: " + ", ".join(f"{kind} {rounds[kind][-1]:.3f}" for kind in KINDS)
                      + " ms of server CPU per report")
        rss = round(server.rss_mib(), 1)
    per_minute = 60.0 / args.heartbeat_s
    section: dict[str, Any] = {"nodes": nodes, "rounds": args.repeats, "heartbeat_s": args.heartbeat_s}
    for kind in KINDS:
        per_report = statistics.median(rounds[kind])
        section[kind] = {"cpu_ms_per_report": round(per_report, 4),
                         "cpu_ms_per_node_per_minute": round(per_report * per_minute, 4),
                         "cpu_s_per_minute_whole_cluster": round(per_report * per_minute * nodes / 1000.0, 3)}
    section["rss_mib"] = rss
    section["load_average_1m"] = round(os.getloadavg()[0], 2)
    return section


class _Fleet:
    """Per node 8 80 GB GPUs and one boot id; what the last report said, to send it again (idle),
    moved (busy), or as a delta against it."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.rng = random.Random(0)
        self.boot = os.urandom(8).hex()
        self.sequence = dict.fromkeys(names, 0)
        self.util: dict[str, list[float]] = {n: [0.0] * GPUS for n in names}

    def _gpu(self, node: str, i: int) -> dict[str, Any]:
        return {"uuid": f"GPU-{node}-{i}", "index": i, "model": "NVIDIA A100-SXM4-80GB", "memory_total_mib": GPU_MIB,
                "memory_used_mib": 0.0, "utilization_gpu": self.util[node][i]}

    def _envelope(self, node: str, gpus: list[dict[str, Any]], base: int | None) -> bytes:
        self.sequence[node] += 1
        body = {"node": node, "sequence": self.sequence[node], "timestamp_s": time.time(), "agent_version": "bench",
                "source": "simulated", "gpus": gpus, "pods": [], "boot_id": self.boot, "interval_s": 5.0}
        if base is not None:
            body["base_sequence"] = base
        return json.dumps(body, separators=(",", ":")).encode()

    def full(self, node: str, moved: bool) -> bytes:
        if moved:
            self.util[node] = [round(self.rng.random(), 2) for _ in range(GPUS)]
        return self._envelope(node, [self._gpu(node, i) for i in range(GPUS)], None)

    def body(self, kind: str, node: str) -> bytes:
        if kind == "full_idle":
            return self.full(node, moved=False)
        if kind == "full_changed":
            return self.full(node, moved=True)
        base = self.sequence[node]
        if kind == "delta_idle":
            return self._envelope(node, [], base)
        moved = self.rng.randrange(GPUS)
        self.util[node][moved] = round((self.util[node][moved] + 0.37) % 1.0, 2)
        return self._envelope(node, [self._gpu(node, moved)], base)


def _progress(message: str) -> None:
    print(f"[bench intake] {message}", file=sys.stderr, flush=True)
