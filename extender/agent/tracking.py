"""What the agent derives from raw samples: pod attribution, per-pod peaks, when to report, when to
nudge the scheduler. Pure: no files, no network, and the clock is an argument.

A pod's memory is the sum over all its processes on all its GPUs (`gpu_uuids`): `current_memory_mib`
now, `peak_memory_mib` the largest such sum since the agent first saw the pod. The extender divides by
the number of GPUs to compare with its per-GPU reservation (extender/ledger.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from extender.agent.cgroups import PodRef
from extender.telemetry import MAX_PODS_PER_NODE, GpuReport, NodeReport, PodUsage, ProcessReport


def attribute_processes(gpus: Iterable[GpuReport], pod_of: Callable[[int], PodRef | None]) -> tuple[GpuReport, ...]:
    """Fill each process's pod UID and container id (processes a source already attributed are kept)."""
    cache: dict[int, PodRef | None] = {}
    out = []
    for gpu in gpus:
        processes = []
        for process in gpu.processes:
            if process.pod_uid:
                processes.append(process)
                continue
            if process.pid not in cache:
                cache[process.pid] = pod_of(process.pid)
            ref = cache[process.pid]
            if ref is not None:  # a plain constructor: dataclasses.replace costs 3x more per process
                process = ProcessReport(process.pid, process.used_memory_mib, ref.pod_uid, ref.container_id,
                                        process.sm_util)
            processes.append(process)
        out.append(replace(gpu, processes=tuple(processes)))
    return tuple(out)


def pod_duties(gpus: Iterable[GpuReport]) -> dict[str, tuple[float, str]]:
    """pod uid -> (GPU duty 0..1, source "process" or "device") observed in one round (see the module
    docstring); pods with no observation this round are left out. Unhealthy GPUs say nothing."""
    out: dict[str, tuple[float, str]] = {}
    for gpu in gpus:
        if not gpu.healthy:
            continue
        here: dict[str, float] = {}
        if gpu.process_samples:
            for process in gpu.processes:
                if process.pod_uid and process.sm_util is not None:
                    here[process.pod_uid] = here.get(process.pod_uid, 0.0) + process.sm_util
            source = "process"
        else:
            here = {p.pod_uid: gpu.utilization_gpu for p in gpu.processes if p.pod_uid}
            source = "device"
        for uid, duty in here.items():
            if uid not in out or duty > out[uid][0]:
                out[uid] = (min(duty, 1.0), source)
    return out


@dataclass
class _PodState:
    first_seen_s: float
    last_seen_s: float
    current_mib: float
    peak_mib: float
    gpu_uuids: frozenset[str]
    duties: deque[tuple[float, float, str]] = field(default_factory=deque)  # (time, duty, source)


class PodTracker:
    """Each pod's peak GPU memory over its life on this node.

    A pod whose processes are gone is still reported (current 0, peak kept) for `forget_after_s`, so
    the extender receives its final peak even if one report is lost; after that it is forgotten.
    """

    def __init__(self, forget_after_s: float = 600.0, duty_window_s: float = 60.0) -> None:
        self.forget_after_s = forget_after_s
        self.duty_window_s = duty_window_s
        self._pods: dict[str, _PodState] = {}

    def update(self, gpus: Iterable[GpuReport], now_s: float) -> tuple[PodUsage, ...]:
        per_gpu: dict[str, dict[str, float]] = {}  # pod uid -> gpu uuid -> MiB
        for gpu in gpus:
            for process in gpu.processes:
                if process.pod_uid:
                    by_gpu = per_gpu.setdefault(process.pod_uid, {})
                    by_gpu[gpu.uuid] = by_gpu.get(gpu.uuid, 0.0) + process.used_memory_mib
        for gone in self._pods.values():
            gone.current_mib = 0.0
        for uid, by_gpu in per_gpu.items():
            current = sum(by_gpu.values())
            state = self._pods.get(uid)
            if state is None:
                self._pods[uid] = _PodState(now_s, now_s, current, current, frozenset(by_gpu))
            else:
                state.last_seen_s = now_s
                state.current_mib = current
                state.peak_mib = max(state.peak_mib, current)
                state.gpu_uuids = state.gpu_uuids | frozenset(by_gpu)
        for uid, (duty, source) in pod_duties(gpus).items():
            state = self._pods.get(uid)
            if state is not None:
                state.duties.append((now_s, duty, source))
        for state in self._pods.values():
            while state.duties and now_s - state.duties[0][0] > self.duty_window_s:
                state.duties.popleft()
        for uid in [uid for uid, s in self._pods.items() if now_s - s.last_seen_s > self.forget_after_s]:
            del self._pods[uid]
        # the most recently seen pods first when the schema's cap bites
        ordered = sorted(self._pods.items(), key=lambda item: (-item[1].last_seen_s, item[0]))[:MAX_PODS_PER_NODE]
        return tuple(
            PodUsage(
                pod_uid=uid,
                current_memory_mib=round(state.current_mib, 1),
                peak_memory_mib=round(state.peak_mib, 1),
                gpu_uuids=tuple(sorted(state.gpu_uuids)),
                first_seen_s=state.first_seen_s,
                gpu_duty=round(sum(d for _, d, _ in state.duties) / len(state.duties), 4) if state.duties else None,
                duty_source=state.duties[-1][2] if state.duties else "",
            )
            for uid, state in sorted(ordered)
        )


def significant_change(previous: NodeReport | None, current: NodeReport, threshold_mib: float) -> bool:
    """True when the extender should hear about `current` before the next heartbeat: a GPU appeared,
    vanished or changed health, its used memory moved by `threshold_mib` or more, or the set of pods
    (or one's peak) changed."""
    if previous is None:
        return True
    before = {g.uuid: g for g in previous.gpus}
    if set(before) != {g.uuid for g in current.gpus}:
        return True
    for gpu in current.gpus:
        old = before[gpu.uuid]
        if (gpu.healthy, gpu.error) != (old.healthy, old.error):
            return True
        if abs(gpu.memory_used_mib - old.memory_used_mib) >= threshold_mib:
            return True
    old_pods = {p.pod_uid: p for p in previous.pods}
    if set(old_pods) != {p.pod_uid for p in current.pods}:
        return True
    return any(p.peak_memory_mib - old_pods[p.pod_uid].peak_memory_mib >= threshold_mib for p in current.pods)


def free_memory_mib(gpus: Iterable[GpuReport]) -> float:
    """GPU memory free on the node, over healthy GPUs only."""
    return sum(max(g.memory_total_mib - g.memory_used_mib, 0.0) for g in gpus if g.healthy)


class FreeMemoryTrigger:
    """When to publish `deepres.io/gpu-free-mib` on the Node so kube-scheduler retries waiting pods.

    kube-scheduler retries a pod the extender rejected only on a cluster event (or after 5 minutes);
    a Node update is such an event. Publish when free memory has grown by more than `threshold_mib`
    since its lowest point after the last publication (so "a job ended" counts even if free memory
    returns to the last published value), at most once per `min_interval_s`, and once at start.
    """

    def __init__(self, threshold_mib: float = 1024.0, min_interval_s: float = 10.0) -> None:
        self.threshold_mib = threshold_mib
        self.min_interval_s = min_interval_s
        self._low_mib: float | None = None
        self._published_s: float | None = None

    def observe(self, free_mib: float, now_s: float) -> int | None:
        """The value to publish now, or None."""
        if self._low_mib is not None:
            self._low_mib = min(self._low_mib, free_mib)
            if free_mib - self._low_mib <= self.threshold_mib:
                return None
            if self._published_s is not None and now_s - self._published_s < self.min_interval_s:
                return None  # keep the low-water mark: publish once the interval has passed
        self._low_mib = free_mib
        self._published_s = now_s
        return int(free_mib)
