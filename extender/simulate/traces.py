"""Reading the openb trace files into plain arrays, and building FGD's workloads from them.

The trace CSVs are data/openb by default (data/README.md: their source and licence); nothing here is
needed by the product at run time.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from extender.simulate.gorand import GoRand
from predictor import datapaths

#: GPU capacity unit of the trace: one GPU is 1000 milli.
MILLI = 1000

DEFAULT_DATA = datapaths.OPENB  # data/openb (predictor/datapaths.py: the one home of the data paths)
FGD_DATA = datapaths.FGD

#: The 17 traces FGD reports (file names after `openb_pod_list_`).
FGD_TRACES: tuple[str, ...] = (
    "default", "cpu050", "cpu100", "cpu200", "cpu250",
    "gpushare40", "gpushare60", "gpushare80", "gpushare100",
    "gpuspec10", "gpuspec20", "gpuspec25", "gpuspec33",
    "multigpu20", "multigpu30", "multigpu40", "multigpu50",
)


class TraceError(ValueError):
    """A trace file that is missing or malformed; the message names the file and the problem."""


@dataclass(frozen=True)
class Node:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True)
class Pod:
    """One trace row. `spec` is the tuple of acceptable GPU models (empty: any model)."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    spec: tuple[str, ...] = ()
    qos: str = ""
    creation_s: int = 0
    deletion_s: int = 0

    @property
    def total_gpu_milli(self) -> int:
        return self.num_gpu * self.gpu_milli

    @property
    def is_share(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < MILLI


def _int(row: dict[str, str], key: str, path: Path, line: int) -> int:
    raw = row.get(key)
    if raw is None or raw == "":
        raise TraceError(f"{path}:{line}: column {key!r} is missing or empty")
    try:
        return int(float(raw))
    except ValueError:
        raise TraceError(f"{path}:{line}: column {key!r} must be a number, got {raw!r}") from None


def read_nodes(path: Path) -> list[Node]:
    """Nodes sorted by name (FGD ranks nodes over the name-sorted list)."""
    if not path.is_file():
        raise TraceError(f"node list {path} not found (use --data to point at the openb directory)")
    nodes = []
    with path.open(newline="") as handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            nodes.append(Node(row["sn"], _int(row, "cpu_milli", path, line), _int(row, "memory_mib", path, line),
                              _int(row, "gpu", path, line), row.get("model", "") or ""))
    if not nodes:
        raise TraceError(f"node list {path} has no rows")
    return sorted(nodes, key=lambda n: n.name)


def read_pods(path: Path) -> list[Pod]:
    """Pods sorted by name. Missing optional columns (multigpu traces have none) take defaults."""
    if not path.is_file():
        raise TraceError(f"pod list {path} not found (use --data to point at the openb directory)")
    pods = []
    with path.open(newline="") as handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            spec = tuple(part for part in (row.get("gpu_spec") or "").split("|") if part)
            num_gpu = _int(row, "num_gpu", path, line)
            milli = _int(row, "gpu_milli", path, line) if num_gpu else 0
            if num_gpu < 0 or not 0 <= milli <= MILLI or (num_gpu > 1 and milli != MILLI):
                raise TraceError(f"{path}:{line}: num_gpu={num_gpu} gpu_milli={milli} is neither a share of one GPU "
                                 "nor whole GPUs")
            creation = int(float(row.get("creation_time") or 0))
            deletion_raw = row.get("deletion_time") or ""
            deletion = int(float(deletion_raw)) if deletion_raw else -1
            pods.append(Pod(row["name"], _int(row, "cpu_milli", path, line), _int(row, "memory_mib", path, line),
                            num_gpu, milli, spec, row.get("qos") or "", creation, deletion))
    if not pods:
        raise TraceError(f"pod list {path} has no rows")
    return sorted(pods, key=lambda p: p.name)


def pod_list_path(data: Path, trace: str) -> Path:
    return data / f"openb_pod_list_{trace}.csv"


def node_list_path(data: Path) -> Path:
    return data / "openb_node_list_gpu_node.csv"


@dataclass(frozen=True)
class TypicalPod:
    """A frequent pod shape and its renormalised probability p_m (FGD §5)."""

    cpu_milli: int
    gpu_milli: int  # per GPU; 0 for CPU-only pods
    num_gpu: int
    spec: tuple[str, ...]
    probability: float


def typical_pods(pods: Sequence[Pod], coverage: float = 0.95) -> list[TypicalPod]:
    """The shortest most-frequent prefix of pod shapes covering `coverage` of the pods, renormalised.

    Shapes are keyed by (cpu, per-GPU milli, GPU count, spec) and sorted by count (largest first),
    ties by key descending; memory is not part of the key (FGD ignores it).
    """
    counts: dict[tuple[int, int, int, tuple[str, ...]], int] = {}
    for pod in pods:
        key = (pod.cpu_milli, pod.gpu_milli if pod.num_gpu else 0, pod.num_gpu, pod.spec)
        counts[key] = counts.get(key, 0) + 1
    ordered = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
    total = len(pods)
    kept: list[tuple[tuple[int, int, int, tuple[str, ...]], int]] = []
    cumulative = 0
    for key, count in ordered:
        if cumulative >= coverage * total:
            break
        kept.append((key, count))
        cumulative += count
    return [TypicalPod(k[0], k[1], k[2], k[3], c / cumulative) for k, c in kept]


@dataclass(frozen=True)
class Workload:
    """One seed's arrival order and node ranking, built exactly as FGD's simulator does."""

    pods: list[Pod]
    node_order: list[int]  # node_order[rank] = index into the name-sorted node list


def build_workload(pods: Sequence[Pod], n_nodes: int, seed: int, total_gpu_milli: int, tune: float = 1.3) -> Workload:
    """Shuffle, tune to `tune` x capacity and rank nodes with Go's math/rand seeded `seed` (METHOD.md §2).

    `pods` must be sorted by name. Growing draws clones with replacement from the name-sorted list and
    stops at the first GPU draw whose per-GPU milli would pass the target (FGD's own rule); shrinking
    deletes random pods until the total is within the target.
    """
    rng = GoRand(seed)
    rng.go_int()  # FGD logs one rand.Int() right after seeding
    order = rng.shuffle_indices(len(pods))
    arrival = [pods[i] for i in order]
    target = tune * total_gpu_milli
    demand = sum(p.total_gpu_milli for p in arrival)
    if demand < target:
        clones = 0
        while True:
            pod = pods[rng.intn(len(pods))]
            if demand + pod.gpu_milli > target:
                break
            clones += 1
            arrival.append(Pod(f"{pod.name}-clone-{clones}", pod.cpu_milli, pod.memory_mib, pod.num_gpu,
                               pod.gpu_milli, pod.spec, pod.qos, pod.creation_s, pod.deletion_s))
            demand += pod.total_gpu_milli
    elif demand > target:
        while demand > target:
            victim = arrival.pop(rng.intn(len(arrival)))
            demand -= victim.total_gpu_milli
    perm = rng.perm(n_nodes)
    return Workload(arrival, perm)
