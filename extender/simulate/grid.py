"""The packing grid (traces x policies x seeds) and the replay, in worker processes, cached, with progress.

A packing task is one (trace, policy) over all its seeds, so a worker's memoised node-state scores
carry from one seed to the next; the replay's (cluster slice, policy) runs share the same pool.
Results are cached per (trace, policy, seed) under a key that includes a hash of the simulator and
policy sources, so a code change never reuses stale numbers.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from extender.simulate import packing
from extender.simulate.traces import (
    build_workload,
    node_list_path,
    pod_list_path,
    read_nodes,
    read_pods,
    typical_pods,
)

log = logging.getLogger(__name__)

POLICIES: tuple[str, ...] = ("random", "bestfit", "fgd", "deepres", "deepres-nofrag")
SEEDS: tuple[int, ...] = tuple(range(42, 52))


@dataclass(frozen=True)
class RunRecord:
    """One packing run, reduced to what the report needs."""

    trace: str
    policy: str
    seed: int
    columns: list[float | None]  # allocation % at arrived load 0..130 %
    pods: int
    placed: int
    seconds: float


#: Bump when a change alters any packing decision of the simulator's own policies (random, bestfit, fgd)
#: or the workload; cached results of another version are not reused.
PACKING_VERSION = "1"
_POLICY_SOURCES = {
    "deepres": ("adapters.py", "../policy/*.py"),
    "deepres-nofrag": ("adapters.py", "../policy/*.py"),
}


def source_hash(policy: str) -> str:
    """Version of the code one policy's packing results depend on: PACKING_VERSION, plus the sources of
    the DeepRes policies (edited by others; any change to them re-runs those policies)."""
    digest = hashlib.sha256(PACKING_VERSION.encode())
    here = Path(__file__).resolve().parent
    for pattern in _POLICY_SOURCES.get(policy, ()):
        for path in sorted(here.glob(pattern)):
            digest.update(path.name.encode())
            digest.update(_code_only(path.read_text()).encode())
    return digest.hexdigest()[:16]


def _code_only(source: str) -> str:
    """The module's syntax tree without docstrings or comments, so documentation edits keep the cache."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def make_policy(name: str, seed: int, typical: Sequence[object], models: Sequence[str]) -> packing.Policy:
    if name == "random":
        return packing.RandomPolicy(seed)
    if name == "bestfit":
        return packing.BestFitPolicy()
    if name == "fgd":
        return packing.FgdPolicy(packing.Fragmentation(typical, models))  # type: ignore[arg-type]
    if name == "deepres":
        return packing.FragAwarePolicy(typical)  # type: ignore[arg-type]
    if name == "deepres-nofrag":
        return packing.DeepResPolicy()
    raise ValueError(f"unknown packing policy {name!r}; expected one of {', '.join(POLICIES)}")


def run_task(data: str, trace: str, policy: str, seeds: Sequence[int]) -> list[RunRecord]:
    """Run one policy over `seeds` on one trace (in a worker process)."""
    nodes = read_nodes(node_list_path(Path(data)))
    pods = read_pods(pod_list_path(Path(data), trace))
    typical = typical_pods(pods)
    models = sorted({n.model for n in nodes})
    capacity = sum(n.gpus for n in nodes) * 1000
    shared = None if policy == "random" else make_policy(policy, 0, typical, models)
    out = []
    for seed in seeds:
        start = time.perf_counter()
        workload = build_workload(pods, len(nodes), seed, capacity)
        chosen = shared if shared is not None else make_policy(policy, seed, typical, models)
        result = packing.run_packing(nodes, workload.pods, workload.node_order, chosen, seed)
        seconds = time.perf_counter() - start
        out.append(RunRecord(trace, policy, seed, packing.bin_allocation(result), len(workload.pods),
                             int(result.placed.sum()), round(seconds, 3)))
    return out


def _task_star(args: tuple[str, str, str, list[int]]) -> list[RunRecord]:
    return run_task(*args)


@dataclass(frozen=True)
class ReplayPlan:
    """The replay runs to do beside the packing grid: one task per (cluster slice, policy)."""

    seed: int = 42
    limit: int = 0
    strides: tuple[int, ...] = (128, 64, 1)
    policies: tuple[str, ...] = ()  # empty: replay.POLICIES


@dataclass
class GridOutcome:
    records: list[RunRecord]
    replays: list[Any]  # ReplayExperiment per stride, in the plan's order
    packing_cpu_s: float = 0.0  # seconds of the runs done by this invocation (cached ones cost nothing)
    replay_cpu_s: float = 0.0
    packing_runs_done: int = 0


def _replay_task(data: str, seed: int, limit: int, stride: int, policy: str) -> tuple[int, str, Any, float]:
    """One replay policy on one cluster slice (in a worker process)."""
    from extender.simulate.replay import run_replay_experiment

    start = time.perf_counter()
    tag = f"replay 1/{stride} {policy}"
    experiment = run_replay_experiment(
        Path(data), seed=seed, limit=limit, policies=[policy], node_stride=stride,
        progress=lambda line: print(f"  {tag}: {line.strip()}", file=sys.stderr, flush=True))
    return stride, policy, experiment, time.perf_counter() - start


_Task = tuple[str, tuple[Any, ...]]

#: Relative cost of one packing run per policy (measured), to start the longest tasks first.
_COST = {"deepres": 2.5, "deepres-nofrag": 1.2, "fgd": 1.1, "bestfit": 0.6, "random": 0.4}


def _any_task(task: _Task) -> tuple[str, Any]:
    kind, args = task
    if kind == "pack":
        return kind, run_task(*args)
    return kind, _replay_task(*args)


def run_all(data: Path, groups: Sequence[tuple[Sequence[str], Sequence[int]]], policies: Sequence[str], jobs: int,
            cache: Cache, replay: ReplayPlan | None = None, progress: Callable[[str], None] | None = None,
            dry: bool = False) -> GridOutcome:
    """The packing grid (every (trace, policy, seed) of `groups` not cached; none with `dry`) and the
    replay plan, in one pool of `jobs` processes, longest tasks first so both cores stay busy to the end.

    A packing task is one (trace, policy) over all its seeds, so memoised node-state scores carry from
    one seed to the next; a replay task is one policy on one cluster slice.
    """
    from extender.simulate.replay import POLICIES as REPLAY_POLICIES
    from extender.simulate.replay import ReplayExperiment

    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    pack: list[_Task] = []
    cached = 0
    for traces, seeds in groups:
        for trace in traces:
            for policy in policies:
                todo = [s for s in seeds if cache.get(trace, policy, s) is None]
                cached += len(seeds) - len(todo)
                if todo and not dry:
                    pack.append(("pack", (str(data), trace, policy, todo)))
    pack.sort(key=lambda t: -_COST.get(t[1][2], 1.0) * len(t[1][3]))  # stable: trace order within a cost
    rep: list[_Task] = []
    replay_policies = tuple(replay.policies or REPLAY_POLICIES) if replay else ()
    if replay is not None:
        for stride in sorted(replay.strides):  # the full cluster (stride 1) is the longest
            for policy in replay_policies:
                rep.append(("replay", (str(data), replay.seed, replay.limit, stride, policy)))
    tasks = rep + pack
    total_units = sum(_COST.get(t[1][2], 1.0) * len(t[1][3]) for t in pack)
    units = [0.0]
    total_runs = sum(len(t[1][3]) for t in pack)
    say(f"packing: {total_runs} runs to do in {len(pack)} tasks, {cached} cached; replay: {len(rep)} tasks; "
        f"{jobs} process(es)")
    started = time.monotonic()
    outcome = GridOutcome([], [])
    experiments: dict[int, dict[str, Any]] = {}
    done_runs = done_replays = 0

    def handle(kind: str, value: Any) -> None:
        nonlocal done_runs, done_replays
        if kind == "pack":
            cache.put(value)
            done_runs += len(value)
            outcome.packing_cpu_s += sum(r.seconds for r in value)
            units[0] += _COST.get(value[0].policy, 1.0) * len(value)
            # the rest at the pace measured so far (per cost unit), spread over the workers
            eta = outcome.packing_cpu_s / units[0] * (total_units - units[0]) / max(jobs, 1)
            _report(say, value, done_runs, total_runs, started, eta)
        else:
            stride, policy, experiment, seconds = value
            experiments.setdefault(stride, {})[policy] = experiment
            outcome.replay_cpu_s += seconds
            done_replays += 1
            say(f"  [replay {done_replays}/{len(rep)}] 1/{stride} of the nodes, {policy}: {seconds / 60:.1f} min; "
                f"elapsed {(time.monotonic() - started) / 60:5.1f} min")

    if tasks:
        if jobs > 1:
            with multiprocessing.get_context("fork").Pool(jobs) as pool:
                for kind, value in pool.imap_unordered(_any_task, tasks):
                    handle(kind, value)
        else:
            for task in tasks:
                handle(*_any_task(task))
    outcome.packing_runs_done = done_runs
    for traces, seeds in groups:
        for trace in traces:
            for policy in policies:
                for seed in seeds:
                    record = cache.get(trace, policy, seed)
                    if record is not None:
                        outcome.records.append(record)
    if replay is not None:
        for stride in replay.strides:
            parts = experiments.get(stride, {})
            if not parts:
                continue
            first = next(iter(parts.values()))
            outcomes = {p: parts[p].outcomes[p] for p in replay_policies if p in parts}
            noted = parts.get("deepres", first)  # its notes add what only DeepRes's run counts (whole GPUs)
            outcome.replays.append(ReplayExperiment(outcomes, noted.notes, first.qos_order, first.stride,
                                                    first.nodes, first.gpus))
    return outcome


def run_grid(data: Path, traces: Sequence[str], policies: Sequence[str], seeds: Sequence[int], jobs: int,
             cache: Cache, progress: Callable[[str], None] | None = None, dry: bool = False) -> list[RunRecord]:
    """Every (trace, policy, seed) not in the cache is run (none with `dry`); returns the records held."""
    return run_all(data, [(traces, seeds)], policies, jobs, cache, None, progress, dry).records


class Cache:
    """JSON-lines cache of RunRecords keyed by source hash; `None` path disables it."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.versions = {p: source_hash(p) for p in POLICIES}
        self._records: dict[tuple[str, str, int], RunRecord] = {}
        if path is not None and path.is_file():
            for line in path.read_text().splitlines():
                try:
                    raw = json.loads(line)
                    version = raw.pop("version", None)
                    record = RunRecord(**raw)
                except (json.JSONDecodeError, TypeError):
                    continue
                if version == self.versions.get(record.policy):
                    self._records[(record.trace, record.policy, record.seed)] = record

    def get(self, trace: str, policy: str, seed: int) -> RunRecord | None:
        return self._records.get((trace, policy, seed))

    def put(self, records: Iterable[RunRecord]) -> None:
        records = list(records)
        for r in records:
            self._records[(r.trace, r.policy, r.seed)] = r
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as handle:
                for r in records:
                    handle.write(json.dumps({**asdict(r), "version": self.versions.get(r.policy)}) + "\n")


def default_jobs() -> int:
    """Both cores when the machine is idle, one when others are using it (load average)."""
    cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    return max(1, min(cores, int(cores - load + 0.5)))


def _report(say: Callable[[str], None], records: Sequence[RunRecord], done: int, total: int, started: float,
            eta: float) -> None:
    elapsed = time.monotonic() - started
    r = records[0]
    mean130 = [x.columns[130] for x in records if x.columns[130] is not None]
    avg = sum(mean130) / len(mean130) if mean130 else math.nan
    per_run = sum(x.seconds for x in records) / len(records)
    say(f"  [{done}/{total}] {r.trace:<11} {r.policy:<12} {len(records)} seeds, alloc@130 {avg:6.2f}%, "
        f"{per_run:5.1f} s/run; elapsed {elapsed / 60:5.1f} min, eta {eta / 60:5.1f} min")
