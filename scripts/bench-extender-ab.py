"""Two extender builds side by side under the same load, in alternating rounds.

The build VM's speed changes by ~2x from hour to hour, so two `deepres bench extender` runs taken
apart compare the VM as much as the code. This starts both servers at once (each from its own
source tree, e.g. a `git worktree` of an older revision), loads both with the same cluster and
alternates short rounds between them, so each figure's ratio is free of the VM's drift.

    git worktree add /tmp/deepres-old <rev>
    .venv/bin/python scripts/bench-extender-ab.py /tmp/deepres-old . --rounds 3

`--clients 1` plays kube-scheduler's serial scheduling cycle (one pod at a time: per-call latency
is what counts there); the default, 4 clients, measures throughput. `--cycle 1000 5000` runs
`deepres bench extender --cycle`'s rounds instead (every node's name per filter, in a new order;
prioritize; bind; agents at the chart's heartbeat), per cluster size, to --out
(default reports/bench-extender-ab-cycle.json). Prints the medians per build
and mode and writes them to reports/bench-extender-ab.json (or --out). Each server imports the tree
given (PYTHONPATH, run from a neutral directory), so both use this venv.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from devtools import bench_extender as bench

MODES = ("names", "nodes", "under_telemetry")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs=2, type=Path, help="two source trees (A, then B)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=4,
                        help="scheduler clients per server (1: kube-scheduler's serial cycle, one pod at a time)")
    parser.add_argument("--no-pin", action="store_true",
                        help="servers and load share every CPU (default: servers on the first CPU, load on the rest)")
    parser.add_argument("--out", default="")
    parser.add_argument("--cycle", type=int, nargs="+", default=[], metavar="NODES",
                        help="kube-scheduler's serial cycle at these cluster sizes (bench extender --cycle)")
    parser.add_argument("--cycle-pods", type=int, default=200)
    parser.add_argument("--heartbeat-s", type=float, default=15.0)
    args = parser.parse_args()
    args.out = args.out or ("reports/bench-extender-ab-cycle.json" if args.cycle else "reports/bench-extender-ab.json")
    if args.cycle:
        cycle_ab(args)
        return
    out = Path(args.out).resolve()
    trees = [tree.resolve() for tree in args.trees]  # before leaving the working directory
    cpus = sorted(os.sched_getaffinity(0))
    pinned = len(cpus) >= 2 and not args.no_pin
    load = argparse.Namespace(predictor_factory="", server_cpus=set(cpus[:1]) if pinned else set(),
                              clients=args.clients, duration_s=args.duration_s)
    if pinned:
        os.sched_setaffinity(0, set(cpus[1:]))
    os.chdir(tempfile.gettempdir())  # `python -m` puts the working directory first on sys.path
    rng = random.Random(0)
    names = [f"gpu-node-{i:05d}" for i in range(5000)]
    cluster = bench._Cluster(names, rng)
    with servers_of(trees, load) as servers:
        for server in servers:
            bench._post_many(server, [cluster.report(n) for n in names], threads=4)
            bench._bind_pods(server, names, 500, random.Random(1))
        bodies = {"names": bench._names_bodies(names, 500, rng), "nodes": bench._node_bodies(names, 100, rng)}
        runs: list[dict[str, list[dict[str, float]]]] = [{m: [] for m in MODES} for _ in servers]
        for _ in range(args.rounds):
            for server, run in zip(servers, runs, strict=True):
                run["names"].append(bench._scheduler_load(server, bodies["names"], load))
                run["nodes"].append(bench._scheduler_load(server, bodies["nodes"], load))
                reporter = bench._Reporter(server, cluster, names, 500.0)
                reporter.start()
                run["under_telemetry"].append(bench._scheduler_load(server, bodies["names"], load))
                reporter.stop()
        rss = [round(server.rss_mib(), 1) for server in servers]
    results: dict[str, Any] = {"rounds": args.rounds, "duration_s": args.duration_s, "clients": args.clients,
                               "server_pinned_to_one_cpu": pinned}
    for label, tree, run, rss_mib in zip("AB", trees, runs, rss, strict=True):
        medians = {m: {k: statistics.median(r[k] for r in run[m]) for k in bench.KEYS} for m in MODES}
        results[label] = {"tree": str(tree), "rss_mib": rss_mib, **medians}
    for mode in MODES:
        a, b = results["A"][mode], results["B"][mode]
        print(f"{mode:<16} A {a['pods_per_s']:7.1f} pods/s p99 {a['filter_p99_ms']:5.1f}/{a['prioritize_p99_ms']:5.1f}"
              f"   B {b['pods_per_s']:7.1f} pods/s p99 {b['filter_p99_ms']:5.1f}/{b['prioritize_p99_ms']:5.1f}"
              f"   B/A {b['pods_per_s'] / a['pods_per_s']:.2f}x")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {out}")


@contextlib.contextmanager
def servers_of(trees: list[Path], load: argparse.Namespace) -> Iterator[list[Any]]:
    """One production server per tree (its code first on PYTHONPATH), each in its own state folder."""
    with tempfile.TemporaryDirectory() as tmp_a, tempfile.TemporaryDirectory() as tmp_b:
        servers = []
        try:
            for tree, tmp in zip(trees, (tmp_a, tmp_b), strict=True):
                os.environ["PYTHONPATH"] = str(tree)
                servers.append(bench._Server(Path(tmp), load).__enter__())
            os.environ.pop("PYTHONPATH")
            yield servers
        finally:
            for server in servers:
                server.__exit__()


def cycle_ab(args: argparse.Namespace) -> None:
    """Per cluster size: both servers loaded with the same nodes, `--rounds` alternating cycle rounds."""
    out = Path(args.out).resolve()
    trees = [tree.resolve() for tree in args.trees]
    load = argparse.Namespace(predictor_factory="", server_cpus=set(), cycle_pods=args.cycle_pods,
                              heartbeat_s=args.heartbeat_s)
    os.chdir(tempfile.gettempdir())
    results: dict[str, Any] = {"rounds": args.rounds, "cycle_pods": args.cycle_pods, "heartbeat_s": args.heartbeat_s,
                               "A": str(trees[0]), "B": str(trees[1])}
    for nodes in args.cycle:
        names = [f"gpu-{i:05d}" for i in range(nodes)]
        with servers_of(trees, load) as servers:
            fleets = [bench._Fleet(names) for _ in servers]
            for server, fleet in zip(servers, fleets, strict=True):
                bench._post_many(server, [fleet.report(n) for n in names], threads=4)
            runs: list[list[dict[str, float]]] = [[], []]
            for k in range(args.rounds):
                for server, fleet, run in zip(servers, fleets, runs, strict=True):
                    run.append(bench.cycle_round(server, names, fleet, load, k))
        section: dict[str, Any] = {}
        for label, run in zip("AB", runs, strict=True):
            section[label] = {key: round(statistics.median(r[key] for r in run), 3) for key in bench.CYCLE_KEYS}
        section["B_over_A"] = {key: round(section["B"][key] / section["A"][key], 2) for key in bench.CYCLE_KEYS
                               if section["A"][key]}
        section["load_average_1m"] = round(os.getloadavg()[0], 2)
        results[f"nodes_{nodes}"] = section
        print(f"{nodes} nodes: " + ", ".join(f"{key} A {section['A'][key]} B {section['B'][key]}"
                                              for key in bench.CYCLE_KEYS))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
