"""`deepres simulate`: replay the openb traces through the policies and write reports/simulation.*.

    deepres simulate --report                      # everything: packing grid + replay + report
    deepres simulate --experiment packing --traces default --seeds 42 --policies fgd,bestfit
    deepres simulate --experiment replay
    deepres simulate --experiment interference     # fit the interference model: reports/interference.json
    deepres simulate --experiment compute --seeds 5  # the compute-aware replay: reports/simulation.json "replay"
    deepres simulate --experiment capacity --seeds 5 # capacity at equal service: reports/simulation.json "capacity"
    deepres simulate --via-http --trace-limit 200  # the live server decides the same as the simulator

Data come from data/openb in the repository (or --data). Long runs show progress on stderr.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from extender.simulate.traces import DEFAULT_DATA, FGD_DATA, FGD_TRACES, TraceError


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _seeds(text: str) -> list[int]:
    """`42..51`, `42,43` or `3` (the first three of 42..51)."""
    try:
        if ".." in text:
            lo, hi = text.split("..", 1)
            return list(range(int(lo), int(hi) + 1))
        parts = [int(p) for p in _csv(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds must look like 42..51, 42,43 or 3; got {text!r}") from None
    if len(parts) == 1 and parts[0] < 42:
        return list(range(42, 42 + parts[0]))
    return parts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="directory of the openb CSV files")
    parser.add_argument("--fgd-data", type=Path, default=FGD_DATA, help="directory of FGD's cached results")
    parser.add_argument("--report", action="store_true",
                        help="run both experiments in full and write reports/simulation.{md,json} and plots")
    parser.add_argument("--experiment", choices=("packing", "replay", "interference", "compute", "capacity", "all"),
                        default="all")
    parser.add_argument("--colocation-data", type=Path, default=None,
                        help="--experiment interference or capacity: directory of co-location measurements "
                             "(default data/colocation)")
    parser.add_argument("--traces", type=_csv, default=None, help="packing traces (default: FGD's 17)")
    parser.add_argument("--policies", type=_csv, default=None,
                        help="packing policies (default: random,bestfit,fgd,deepres,deepres-nofrag)")
    parser.add_argument("--seeds", type=_seeds, default=None, help="42..51 (default), 42,43, or a count")
    parser.add_argument("--seeds-other", type=_seeds, default=None,
                        help="deprecated (the full 10 seeds now fit the time budget): seeds for the traces other "
                             "than `default` (default: as --seeds)")
    parser.add_argument("--from-cache", action="store_true",
                        help="report only what the cache holds; run nothing new for the packing grid")
    parser.add_argument("--jobs", type=int, default=0, help="worker processes (0: both cores when idle)")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "deepres" / "simulate-packing.jsonl",
                        help="packing results cache (keyed by a hash of the code)")
    parser.add_argument("--no-cache", action="store_true", help="ignore and do not write the cache")
    parser.add_argument("--out", type=Path, default=Path("reports"), help="report directory")
    parser.add_argument("--replay-seed", type=int, default=42, help="seed of the replay's job draw")
    parser.add_argument("--replay-limit", type=int, default=0, help="replay only the first N GPU pods (0: all)")
    parser.add_argument("--replay-strides", type=_csv, default=["128", "64", "1"],
                        help="cluster slices for the replay: every k-th node; the first is the headline (JSON)")
    parser.add_argument("--via-http", action="store_true",
                        help="drive a local `deepres serve --no-kube` and check it decides as the simulator")
    parser.add_argument("--server", default="", help="--via-http: URL of a running server (default: start one)")
    parser.add_argument("--trace-limit", type=int, default=150, help="--via-http: pods to replay")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--world", choices=("capworld", "measured-harsh", "measured-kind"), default="capworld",
                        help="--experiment capacity: the world the jobs run in (issue 33's capworld, or issue 46's "
                             "measured one, light-beside-heavy both ways: extender/simulate/measuredworld.py)")
    parser.add_argument("--quick", action="store_true",
                        help="--experiment compute or capacity: a small load, nothing written (a smoke run)")


def run(args: argparse.Namespace) -> int:
    from extender.cli import UsageError

    if args.experiment == "interference":
        return _interference(args)
    if not args.data.is_dir():
        raise UsageError(f"trace directory {args.data} not found; pass --data PATH to the openb CSV files")
    if args.experiment == "capacity":
        from extender.simulate.capacity import run as run_capacity

        cache = None if args.no_cache else args.cache.with_name("simulate-capacity.jsonl")
        result = run_capacity(args.out, args.data, args.seeds or list(range(42, 47)), quick=args.quick,
                              workers=args.jobs or 2, cache=cache, colocation=args.colocation_data,
                              world=args.world)
        shown = ("deepres_vs_static", "deepres_vs_static_sjf", "deepres", "capacity_by_seed")
        print(json.dumps({d: {k: result[d].get(k) for k in shown} for d in ("pai", "philly") if d in result}
                         | {"never_worse_than_static_sjf": result["never_worse_than_static_sjf"]}, indent=2))
        return 0
    if args.experiment == "compute":
        from extender.simulate.compute import readme_section
        from extender.simulate.compute import run as run_compute

        quiet = {"log": lambda line: None} if args.json else {}  # --json: the JSON alone, no log lines
        result = run_compute(args.out, args.data, args.seeds or list(range(42, 47)), quick=args.quick, **quiet)
        if not args.json:
            print("docs/evaluation.md (scheduling results):\n" + readme_section(result), file=sys.stderr)
        keys = ("deepres_vs_static", "deepres_vs_request", "deepres_vs_static_sjf")
        print(json.dumps({load: {k: result[load].get(k) for k in keys} for load in ("gpu_bound", "default")},
                         indent=2))
        return 0
    try:
        if args.via_http:
            # the HTTP driver starts a local server: a development tool, loaded by name so that the
            # extender never imports the tools package (docs/ARCHITECTURE.md)
            try:
                driver = importlib.import_module("devtools.simulate_http")
            except ModuleNotFoundError as err:
                if err.name not in ("devtools", "devtools.simulate_http"):
                    raise
                raise UsageError(f"--via-http needs the development tools, which are not installed ({err})") from None
            code: int = driver.run_via_http(args)
            return code
        return _run(args)
    except TraceError as err:
        raise UsageError(str(err)) from None


def _run(args: argparse.Namespace) -> int:
    from extender.simulate import grid
    from extender.simulate.report import write_report

    traces = args.traces or list(FGD_TRACES)
    policies = args.policies or list(grid.POLICIES)
    seeds = args.seeds or list(grid.SEEDS)
    unknown = [p for p in policies if p not in grid.POLICIES]
    if unknown:
        from extender.cli import UsageError

        raise UsageError(f"unknown policy {unknown[0]!r}; expected some of {','.join(grid.POLICIES)}")
    # the report is the one long run that should use every core; other runs leave room for others
    jobs = args.jobs or ((os.cpu_count() or 1) if args.report else grid.default_jobs())
    summary: dict[str, Any] = {}
    timings: dict[str, Any] = {"command": "deepres simulate " + " ".join(sys.argv[2:] if len(sys.argv) > 2 else []),
                               "jobs": jobs, "load_before": _load()}
    started = time.monotonic()
    do_packing = args.report or args.experiment in ("packing", "all")
    do_replay = args.report or args.experiment in ("replay", "all")
    groups: list[tuple[list[str], list[int]]] = []
    if do_packing:
        others = args.seeds_other or seeds
        if args.seeds_other:
            print("note: --seeds-other is deprecated; the report runs the same seeds on every trace by default",
                  file=sys.stderr)
        wanted_default = [t for t in traces if t == "default"]
        wanted_other = [t for t in traces if t != "default"]
        groups = [(g, s) for g, s in ((wanted_default, seeds), (wanted_other, others)) if g]
    plan = None
    if do_replay:
        try:
            strides = tuple(int(s) for s in args.replay_strides)
        except ValueError:
            from extender.cli import UsageError

            raise UsageError(f"--replay-strides must be whole numbers, got {args.replay_strides}") from None
        plan = grid.ReplayPlan(seed=args.replay_seed, limit=args.replay_limit, strides=strides)
    cache = grid.Cache(None if args.no_cache or not do_packing else args.cache)
    outcome = grid.run_all(args.data, groups, policies, jobs, cache, plan, dry=args.from_cache)
    packing_records = outcome.records
    replay_results = outcome.replays
    timings["wall_s"] = round(time.monotonic() - started, 1)
    timings["load_after"] = _load()
    timings["packing_runs_done"] = outcome.packing_runs_done
    timings["packing_cpu_s"] = round(outcome.packing_cpu_s, 1)
    if do_replay:
        timings["replay_cpu_s"] = round(outcome.replay_cpu_s, 1)
    summary = write_report(args.out, packing_records, replay_results, args.fgd_data, timings,
                           write_files=args.report)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(summary.get("_text", ""))
    return 0


def _interference(args: argparse.Namespace) -> int:
    from extender.cli import UsageError
    from extender.simulate.interference import COLOCATION, ColocationError
    from extender.simulate.interference import run as fit_interference

    data = args.colocation_data or COLOCATION
    if not data.is_dir():
        raise UsageError(f"co-location directory {data} not found; pass --colocation-data PATH")
    try:
        report = fit_interference(args.out, data)
    except ColocationError as err:
        raise UsageError(str(err)) from None
    summary = {"fit": report["fit"], "leave_one_group_out": {k: v for k, v in report["leave_one_group_out"].items()
                                                             if k != "per_group"},
               "baselines": {k: v["median_abs_rel_err"] for k, v in report["baselines"].items()}}
    print(json.dumps(summary, indent=2))
    print(f"wrote {args.out / 'interference.json'}", file=sys.stderr)
    return 0


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None
