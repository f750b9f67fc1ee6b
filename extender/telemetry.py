"""The agent -> extender telemetry report: one schema, one parser, shared by both sides.

The agent builds a `NodeReport` and posts `report.to_dict()` as JSON to `POST /v1/telemetry`; the
extender turns the body back with `parse_report`, which never raises anything but `ReportError`
(naming the field path), so a malformed report from one node is refused with a clear message and
never disturbs the others. One GPU's bad reading (used above total, a NaN, no UUID...) does not
refuse its node's report: that GPU is kept as unhealthy and full, with the problem in its `error`
("invalid reading: ..."), and the node's other GPUs are taken. The agent passes its own reports
through the same parser before sending them (`checked`), so both sides apply one rule.

Units are in the names: MiB for memory, ratios in [0, 1] for utilisation, Celsius, watts, seconds.
`timestamp_s` is the agent's clock (Unix seconds); the extender measures staleness with its own clock
at receipt, so clock skew between nodes cannot make telemetry look fresh.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

SCHEMA_VERSION = 1
MAX_GPUS_PER_NODE = 64
MAX_PROCESSES_PER_GPU = 1024
MAX_PODS_PER_NODE = 1024
MAX_BOOT_ID = 64


class ReportError(ValueError):
    """A telemetry report that does not follow the schema; `path` names the offending field."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


@dataclass(frozen=True)
class ProcessReport:
    """One compute process on a GPU, attributed to a pod through /proc/<pid>/cgroup when possible."""

    pid: int
    used_memory_mib: float
    pod_uid: str = ""  # empty: not a pod's process (or attribution failed)
    container_id: str = ""


@dataclass(frozen=True)
class GpuReport:
    """One GPU (or one MIG instance, reported as its own device) at sampling time."""

    uuid: str
    index: int
    model: str
    memory_total_mib: float
    memory_used_mib: float
    memory_reserved_mib: float = 0.0
    utilization_gpu: float = 0.0  # ratio 0..1
    utilization_memory: float = 0.0  # ratio 0..1
    temperature_c: float | None = None
    power_w: float | None = None
    healthy: bool = True
    error: str = ""  # why the GPU is unhealthy ("GPU is lost", "NVML timeout", ...)
    processes: tuple[ProcessReport, ...] = ()


@dataclass(frozen=True)
class PodUsage:
    """A pod's GPU memory on this node now and at its peak since the agent first saw it.

    Both figures are summed over the pod's GPUs (`gpu_uuids`): divide by their count for per GPU.
    """

    pod_uid: str
    current_memory_mib: float
    peak_memory_mib: float
    gpu_uuids: tuple[str, ...] = ()
    first_seen_s: float = 0.0  # agent clock; lets the extender apply the usage rule's warm-up


@dataclass(frozen=True)
class NodeReport:
    node: str
    sequence: int
    timestamp_s: float
    agent_version: str
    source: str  # "nvml" or "simulated"
    gpus: tuple[GpuReport, ...]
    pods: tuple[PodUsage, ...] = ()
    interval_s: float = 5.0
    schema_version: int = SCHEMA_VERSION
    boot_id: str = ""  # new at every agent start: the extender orders reports by sequence within it

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (lists, not tuples), the inverse of `parse_report`."""
        return asdict(self, dict_factory=_json_ready)


def parse_report(body: Any) -> NodeReport:
    """Validate a decoded JSON body; raises ReportError naming the first bad field."""
    obj = _mapping(body, "report")
    gpus_raw = _list(obj, "gpus", "report", limit=MAX_GPUS_PER_NODE)
    pods_raw = _list(obj, "pods", "report", limit=MAX_PODS_PER_NODE, required=False)
    source = _str(obj, "source", "report")
    if source not in ("nvml", "simulated"):
        raise ReportError("report.source", f"must be 'nvml' or 'simulated', got {source!r}")
    node = _str(obj, "node", "report")
    if not node:
        raise ReportError("report.node", "must not be empty")
    gpus = tuple(_gpu_or_invalid(g, f"report.gpus[{i}]", node, i) for i, g in enumerate(gpus_raw))
    uuids = [g.uuid for g in gpus]
    if len(set(uuids)) != len(uuids):
        raise ReportError("report.gpus", "GPU uuids must be unique")
    return NodeReport(
        node=node,
        sequence=_int(obj, "sequence", "report", minimum=0),
        timestamp_s=_number(obj, "timestamp_s", "report", minimum=0.0),
        agent_version=_str(obj, "agent_version", "report"),
        source=source,
        gpus=gpus,
        pods=tuple(_pod(p, f"report.pods[{i}]") for i, p in enumerate(pods_raw)),
        interval_s=_number(obj, "interval_s", "report", minimum=0.0, default=5.0),
        schema_version=_int(obj, "schema_version", "report", minimum=1, default=SCHEMA_VERSION),
        boot_id=_boot_id(obj),
    )


def checked(report: NodeReport) -> NodeReport:
    """The report as the extender will read it (bad GPU readings demoted); raises ReportError for
    what would refuse the whole report. The agent sends only what this returns."""
    return parse_report(report.to_dict())


#: Longest `error` kept for a GPU whose reading was refused.
MAX_ERROR_CHARS = 300


def _gpu_or_invalid(raw: Any, path: str, node: str, position: int) -> GpuReport:
    """A GPU entry; one that breaks the schema becomes an unhealthy GPU reported as full (nothing
    can be placed on it) that says why. Without a usable UUID it is named after its node and place."""
    try:
        return _gpu(raw, path)
    except ReportError as err:
        obj = raw if isinstance(raw, dict) else {}
        uuid, index, model, total = obj.get("uuid"), obj.get("index"), obj.get("model"), obj.get("memory_total_mib")
        if isinstance(total, bool) or not isinstance(total, int | float) or not math.isfinite(total) or total < 0:
            total = 0.0
        reason = f"invalid reading: {err}"
        return GpuReport(
            uuid=uuid if isinstance(uuid, str) and uuid else f"{node}/invalid-gpu-{position}",
            index=index if isinstance(index, int) and not isinstance(index, bool) and index >= 0 else position,
            model=model if isinstance(model, str) else "",
            memory_total_mib=float(total),
            memory_used_mib=float(total),
            healthy=False,
            error=reason if len(reason) <= MAX_ERROR_CHARS else reason[:MAX_ERROR_CHARS] + "...",
        )


def _boot_id(obj: dict[str, Any]) -> str:
    value = _str(obj, "boot_id", "report", default="")
    if len(value) > MAX_BOOT_ID:
        raise ReportError("report.boot_id", f"at most {MAX_BOOT_ID} characters, got {len(value)}")
    return value


def _gpu(raw: Any, path: str) -> GpuReport:
    obj = _mapping(raw, path)
    total = _number(obj, "memory_total_mib", path, minimum=0.0)
    used = _number(obj, "memory_used_mib", path, minimum=0.0)
    if used > total * 1.01 + 1.0:
        raise ReportError(f"{path}.memory_used_mib", f"{used:g} exceeds memory_total_mib {total:g}")
    processes = _list(obj, "processes", path, limit=MAX_PROCESSES_PER_GPU, required=False)
    return GpuReport(
        uuid=_nonempty(obj, "uuid", path),
        index=_int(obj, "index", path, minimum=0),
        model=_str(obj, "model", path),
        memory_total_mib=total,
        memory_used_mib=used,
        memory_reserved_mib=_number(obj, "memory_reserved_mib", path, minimum=0.0, default=0.0),
        utilization_gpu=_ratio(obj, "utilization_gpu", path),
        utilization_memory=_ratio(obj, "utilization_memory", path),
        temperature_c=_optional_number(obj, "temperature_c", path),
        power_w=_optional_number(obj, "power_w", path),
        healthy=_bool(obj, "healthy", path, default=True),
        error=_str(obj, "error", path, default=""),
        processes=tuple(_process(p, f"{path}.processes[{i}]") for i, p in enumerate(processes)),
    )


def _process(raw: Any, path: str) -> ProcessReport:
    obj = _mapping(raw, path)
    return ProcessReport(
        pid=_int(obj, "pid", path, minimum=0),
        used_memory_mib=_number(obj, "used_memory_mib", path, minimum=0.0),
        pod_uid=_str(obj, "pod_uid", path, default=""),
        container_id=_str(obj, "container_id", path, default=""),
    )


def _pod(raw: Any, path: str) -> PodUsage:
    obj = _mapping(raw, path)
    uuids = _list(obj, "gpu_uuids", path, limit=MAX_GPUS_PER_NODE, required=False)
    for i, uuid in enumerate(uuids):
        if not isinstance(uuid, str):
            raise ReportError(f"{path}.gpu_uuids[{i}]", f"must be a string, got {type(uuid).__name__}")
    return PodUsage(
        pod_uid=_nonempty(obj, "pod_uid", path),
        current_memory_mib=_number(obj, "current_memory_mib", path, minimum=0.0),
        peak_memory_mib=_number(obj, "peak_memory_mib", path, minimum=0.0),
        gpu_uuids=tuple(uuids),
        first_seen_s=_number(obj, "first_seen_s", path, minimum=0.0, default=0.0),
    )


def _json_ready(items: list[tuple[str, Any]]) -> dict[str, Any]:
    return {key: list(value) if isinstance(value, tuple) else value for key, value in items}


_MISSING = object()


def _mapping(raw: Any, path: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ReportError(path, f"must be an object, got {_kind(raw)}")
    return raw


def _get(obj: dict[str, Any], key: str, path: str, default: Any) -> Any:
    value = obj.get(key, _MISSING)
    if value is _MISSING or value is None:
        if default is _MISSING:
            raise ReportError(f"{path}.{key}", "is required")
        return default
    return value


def _list(obj: dict[str, Any], key: str, path: str, *, limit: int, required: bool = True) -> list[Any]:
    value = _get(obj, key, path, _MISSING if required else [])
    if not isinstance(value, list):
        raise ReportError(f"{path}.{key}", f"must be a list, got {_kind(value)}")
    if len(value) > limit:
        raise ReportError(f"{path}.{key}", f"has {len(value)} entries, at most {limit} allowed")
    return value


def _str(obj: dict[str, Any], key: str, path: str, default: Any = _MISSING) -> str:
    value = _get(obj, key, path, default)
    if not isinstance(value, str):
        raise ReportError(f"{path}.{key}", f"must be a string, got {_kind(value)}")
    return value


def _nonempty(obj: dict[str, Any], key: str, path: str) -> str:
    value = _str(obj, key, path)
    if not value:
        raise ReportError(f"{path}.{key}", "must not be empty")
    return value


def _bool(obj: dict[str, Any], key: str, path: str, default: Any = _MISSING) -> bool:
    value = _get(obj, key, path, default)
    if not isinstance(value, bool):
        raise ReportError(f"{path}.{key}", f"must be true or false, got {_kind(value)}")
    return value


def _number(
    obj: dict[str, Any], key: str, path: str, *, minimum: float, default: Any = _MISSING
) -> float:
    value = _get(obj, key, path, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ReportError(f"{path}.{key}", f"must be a finite number, got {_kind(value)}")
    if value < minimum:
        raise ReportError(f"{path}.{key}", f"must be >= {minimum:g}, got {value:g}")
    return float(value)


def _optional_number(obj: dict[str, Any], key: str, path: str) -> float | None:
    if obj.get(key) is None:
        return None
    return _number(obj, key, path, minimum=-1e9)


def _int(obj: dict[str, Any], key: str, path: str, *, minimum: int, default: Any = _MISSING) -> int:
    value = _get(obj, key, path, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ReportError(f"{path}.{key}", f"must be a whole number, got {_kind(value)}")
    if value < minimum:
        raise ReportError(f"{path}.{key}", f"must be >= {minimum}, got {value}")
    return value


def _ratio(obj: dict[str, Any], key: str, path: str) -> float:
    value = _number(obj, key, path, minimum=0.0, default=0.0)
    if value > 1.0:
        raise ReportError(f"{path}.{key}", f"must be a ratio in [0, 1], got {value:g}")
    return value


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
