#!/usr/bin/env python3
"""The extender's memory under the bench's load, per cluster size, for two trees side by side.

For each size (default 1,000 and 5,000 nodes) and each tree (alternating, so the VM's drift hits
both alike), a `deepres serve --no-kube` from that tree gets what `deepres bench extender` gives it
(telemetry for every node, 200 binds, then a round of each mode: 500 names, 100 Node objects, names
under 500 reports/s; `--duration-s` each), and then the server's processes (granian's main process
and its worker) are read:
- rss_mib: the sum of their VmRSS, as the bench's `rss_mib` (pages shared by both, the libraries
  and what the worker inherited from the fork, count twice);
- pss_mib: the sum of their Pss (shared pages split between them): what the container's memory
  cgroup is charged, near enough, and what the chart's requests and limits are about;
- per process: VmRSS, RssAnon, RssFile.
`--trace` adds, per size for the last tree given, tracemalloc's view of the worker (Python heap and numpy
arrays by file: what holds the memory), from a separate traced run (tracing costs memory itself).

    scripts/bench-extender-memory.py --tree main=/tmp/deepres-main --tree this=. [--nodes 1000 5000] [--trace]

Writes reports/bench-extender-memory.json (`--out`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

# Loaded into the traced server's processes (PYTHONPATH): when the file `go` appears in
# $DEEPRES_TRACE_DIR each process dumps its tracemalloc snapshot there (the worker is forked).
TRACE_HOOK = """
import os, threading, time, tracemalloc
_dir = os.environ.get("DEEPRES_TRACE_DIR")
def _watch():
    mine = os.path.join(_dir, f"snap-{os.getpid()}")
    while not os.path.exists(mine):
        if os.path.exists(os.path.join(_dir, "go")) and tracemalloc.is_tracing():
            tracemalloc.take_snapshot().dump(mine + ".tmp")
            os.rename(mine + ".tmp", mine)
        time.sleep(0.5)
def _start():
    threading.Thread(target=_watch, daemon=True).start()
if _dir:
    _start()
    os.register_at_fork(after_in_child=_start)
"""


def bench_module() -> Any:
    """The bench's helpers from the tree on PYTHONPATH (devtools/ after the move, extender/ before)."""
    try:
        import devtools.bench_extender as bench  # type: ignore[import-not-found]
    except ImportError:
        import extender.bench_extender as bench
    return bench


def read_process(pid: int) -> dict[str, float]:
    found: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            found[key] = round(int(value.split()[0]) / 1024.0, 1)
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, value = line.partition(":")
        if key == "Pss":
            found["Pss"] = round(int(value.split()[0]) / 1024.0, 1)
    return found


def measure(nodes: int, duration_s: float, trace: bool) -> dict[str, Any]:
    """One server from the tree on PYTHONPATH under the bench's load; its memory afterwards."""
    bench = bench_module()
    args = argparse.Namespace(predictor_factory="", server_cpus=set(), clients=4, duration_s=duration_s,
                              candidates=min(500, nodes), full_nodes=min(100, nodes), telemetry_rate=500.0)
    rng = random.Random(0)
    with tempfile.TemporaryDirectory(prefix="deepres-mem-") as tmp:
        if trace:
            Path(tmp, "hook").mkdir()
            Path(tmp, "hook", "sitecustomize.py").write_text(TRACE_HOOK)
            os.environ.update(PYTHONTRACEMALLOC="8", DEEPRES_TRACE_DIR=tmp,
                              PYTHONPATH=f"{tmp}/hook:{os.environ.get('PYTHONPATH', '')}")
        with bench._Server(Path(tmp), args) as server:
            ready = {pid: read_process(pid) for pid in server._pids()}
            names = [f"gpu-node-{i:05d}" for i in range(nodes)]
            cluster = bench._Cluster(names, rng)
            bench._post_many(server, [cluster.report(n) for n in names], threads=4)
            bench._bind_pods(server, names, args.candidates, rng)
            bench._scheduler_load(server, bench._names_bodies(names, args.candidates, rng), args)
            bench._scheduler_load(server, bench._node_bodies(names, args.full_nodes, rng), args)
            reporter = bench._Reporter(server, cluster, names, args.telemetry_rate)
            reporter.start()
            bench._scheduler_load(server, bench._names_bodies(names, args.candidates, rng), args)
            reporter.stop()
            pids = server._pids()
            loaded = {pid: read_process(pid) for pid in pids}
            result: dict[str, Any] = {
                "rss_mib": round(server.rss_mib(), 1),
                "pss_mib": round(sum(p["Pss"] for p in loaded.values()), 1),
                "processes": {"main": loaded[pids[0]], "worker": loaded[pids[-1]]},
                "at_ready": {"main": ready[pids[0]], "worker": ready.get(pids[-1], {})},
            }
            if trace:
                result = {"worker_traced": traced(Path(tmp), pids[-1])}
    return result


def traced(tmp: Path, worker: int) -> dict[str, Any]:
    (tmp / "go").touch()
    deadline = time.monotonic() + 600
    while not (tmp / f"snap-{worker}").exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    snapshot = tracemalloc.Snapshot.load(str(tmp / f"snap-{worker}"))
    by_file = snapshot.statistics("filename")
    total = sum(s.size for s in by_file)
    imports = sum(s.size for s in by_file if s.traceback[0].filename.startswith("<frozen importlib"))
    top = [{"file": s.traceback[0].filename.replace(str(REPO) + "/", ""), "mib": round(s.size / 2**20, 2),
            "blocks": s.count} for s in by_file[:15]]
    return {"total_mib": round(total / 2**20, 1), "code_and_modules_mib": round(imports / 2**20, 1), "top_files": top}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=PATH",
                        help="a tree to measure (repeatable; e.g. main=/tmp/deepres-main; default: this=.)")
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--duration-s", type=float, default=10.0, help="seconds per load mode (default 10)")
    parser.add_argument("--trace", action="store_true", help="also tracemalloc the worker (a separate run)")
    parser.add_argument("--out", type=Path, default=REPO / "reports/bench-extender-memory.json")
    parser.add_argument("--measure", type=int, help=argparse.SUPPRESS)  # child: one size, this PYTHONPATH
    parser.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.duration_s, args.traced)))
        return 0
    trees = {name: Path(path) for name, _, path in (t.partition("=") for t in args.tree)} or {"this": REPO}
    last_name, last_tree = list(trees.items())[-1]
    report: dict[str, Any] = {"duration_s_per_mode": args.duration_s,
                              "trees": {k: str(v) for k, v in trees.items()}}
    for nodes in args.nodes:
        section: dict[str, Any] = {}
        runs = [(name, tree, False) for name, tree in trees.items()]
        if args.trace:
            runs.append((f"{last_name}_traced", last_tree, True))
        for name, tree, trace in runs:
            print(f"[bench memory] {nodes} nodes: {name} ({tree})", file=sys.stderr, flush=True)
            env = {**os.environ, "PYTHONPATH": str(tree.resolve())}
            cmd = [sys.executable, str(Path(__file__).resolve()), "--measure", str(nodes),
                   "--duration-s", str(args.duration_s), *(["--traced"] if trace else [])]
            done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=3600)
            if done.returncode != 0:
                print(done.stderr[-3000:], file=sys.stderr)
                return 1
            section[name] = json.loads(done.stdout.strip().splitlines()[-1])
        report[f"nodes_{nodes}"] = section
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    for nodes in args.nodes:
        row = report[f"nodes_{nodes}"]
        print(f"{nodes:>6} nodes: " + "; ".join(f"{name} rss {r['rss_mib']} MiB, pss {r['pss_mib']} MiB"
                                                for name, r in row.items() if "rss_mib" in r))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
