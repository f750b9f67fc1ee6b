"""The agent -> extender telemetry report: one schema, one parser, shared by both sides.

The agent builds a `NodeReport` and posts `report.to_dict()` as JSON to `POST /v1/telemetry`; the
extender turns the body back with `parse_report`, which never raises anything but `ReportError`
(naming the field path), so a malformed report from one node is refused with a clear message and
never disturbs the others. One GPU's bad reading (used above total, a NaN, no UUID, a UUID twice...)
does not refuse its node's report: that GPU is kept as unhealthy and full, with the problem in its
`error` ("invalid reading: ..."), and the node's other GPUs are taken. The agent passes its own
reports through the same parser before sending them (`checked`), so both sides apply one rule.

The records below are the one definition of each field: its type and its range are the annotations
(`msgspec.Meta`), from which msgspec validates (`parse_report` here, the extender's fast path in
extender/server/report_fastpath.py) and the OpenAPI document's schemas are generated (extender/server/openapi.py).
Only the rules across fields (`cross_field_problem`) are written by hand, and stated in the schema's
descriptions.

Units are in the names: MiB for memory, ratios in [0, 1] for utilisation, Celsius, watts, seconds.
`timestamp_s` is the agent's clock (Unix seconds); the extender measures staleness with its own clock
at receipt, so clock skew between nodes cannot make telemetry look fresh.
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass, replace
from functools import cached_property
from typing import Annotated, Any

import msgspec

from extender.wire import place

SCHEMA_VERSION = 1
MAX_GPUS_PER_NODE = 64
MAX_PROCESSES_PER_GPU = 1024
MAX_PODS_PER_NODE = 1024
MAX_BOOT_ID = 64
MAX_SOFTWARE = 64
#: Kubernetes' limit on a node name (a DNS subdomain).
MAX_NODE_NAME = 253
MAX_UUID = 256
#: Longest GPU model name (NVML names are ~30 characters), agent version, pod UID (Kubernetes': 36) and
#: container ID (a runtime prefix and 64 hex digits) taken: a report is kept per node, so an unbounded
#: string was memory an agent could make the extender keep (about 1 MiB per node).
MAX_MODEL = 256
MAX_AGENT_VERSION = 128
MAX_POD_UID = 128
MAX_CONTAINER_ID = 256
#: Longest `error` of a GPU taken (an agent's reason; the extender's own are cut at MAX_ERROR_CHARS).
MAX_GPU_ERROR = 1024
#: Every float must be finite (NaN fails every range): the upper bound of a figure that has no other.
FINITE = sys.float_info.max
#: Largest whole number taken (a signed 64-bit one): JSON readers turn larger ones into floats.
MAX_WHOLE = 2**63 - 1

# The field types: each is a type and its range, read by msgspec (validation) and by the OpenAPI
# generator (JSON Schema). Absurd but finite figures (a peak of 1e12 MiB) are taken: the ledger bounds
# what it learns by the GPU, and refusing them would refuse the node's whole report.
MiB = Annotated[float, msgspec.Meta(ge=0.0, le=FINITE)]
Seconds = Annotated[float, msgspec.Meta(ge=0.0, le=FINITE)]
Ratio = Annotated[float, msgspec.Meta(ge=0.0, le=1.0, description="a ratio in [0, 1]")]
Sensor = Annotated[float, msgspec.Meta(ge=-1e9, le=FINITE)]  # Celsius, watts
Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_WHOLE)]
Uuid = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_UUID)]
NodeName = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NODE_NAME)]
SOURCES = ("nvml", "simulated")
#: Where a pod's `gpu_duty` comes from: per-process utilisation samples, or the device's utilisation
#: charged whole to each pod on the GPU (`extender.agent.tracking.pod_duties`), or none.
DUTY_SOURCES = ("process", "device")
DutySource = Annotated[str, msgspec.Meta(pattern=f"^(?:{'|'.join(DUTY_SOURCES)})?$",
                                         extra_json_schema={"enum": ["", *DUTY_SOURCES]})]
Source = Annotated[str, msgspec.Meta(pattern=f"^(?:{'|'.join(SOURCES)})$", extra_json_schema={"enum": list(SOURCES)})]


class ReportError(ValueError):
    """A telemetry report that does not follow the schema; `path` names the offending field."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


@dataclass(frozen=True)
class ProcessReport:
    """One compute process on a GPU, attributed to a pod through /proc/<pid>/cgroup when possible."""

    pid: Count
    used_memory_mib: MiB
    pod_uid: Annotated[str, msgspec.Meta(max_length=MAX_POD_UID)] = ""  # empty: not a pod's process
    container_id: Annotated[str, msgspec.Meta(max_length=MAX_CONTAINER_ID)] = ""
    #: the share of time the GPU's SMs were busy with this process over the sampling round (NVML's
    #: per-process utilisation samples, averaged); None: no sample (driver without them, or none
    #: this round): no observation, never 0
    sm_util: Ratio | None = None


@dataclass(frozen=True)
class GpuReport:
    """One GPU (or one MIG instance, reported as its own device) at sampling time.

    Across fields: `memory_used_mib` at most `memory_total_mib` (1% + 1 MiB of slack), and `uuid`
    unique in its report; a GPU breaking either is kept as unhealthy and full, as for any bad reading.
    """

    uuid: Uuid
    index: Count
    model: Annotated[str, msgspec.Meta(max_length=MAX_MODEL)]
    memory_total_mib: MiB
    memory_used_mib: MiB
    memory_reserved_mib: MiB = 0.0
    utilization_gpu: Ratio = 0.0
    utilization_memory: Ratio = 0.0
    temperature_c: Sensor | None = None
    power_w: Sensor | None = None
    healthy: bool = True
    error: Annotated[str, msgspec.Meta(max_length=MAX_GPU_ERROR)] = ""  # why it is unhealthy ("GPU is lost"...)
    processes: Annotated[tuple[ProcessReport, ...], msgspec.Meta(max_length=MAX_PROCESSES_PER_GPU)] = ()
    #: the driver gives per-process utilisation samples on this GPU (the processes' `sm_util`); False:
    #: it does not (or an older agent), and pods' duties come from `utilization_gpu`
    process_samples: bool = False


@dataclass(frozen=True)
class PodUsage:
    """A pod's GPU memory on this node now and at its peak since the agent first saw it.

    Both figures are summed over the pod's GPUs (`gpu_uuids`): divide by their count for per GPU.
    """

    pod_uid: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_POD_UID)]
    current_memory_mib: MiB
    peak_memory_mib: MiB
    gpu_uuids: Annotated[tuple[str, ...], msgspec.Meta(max_length=MAX_GPUS_PER_NODE)] = ()
    first_seen_s: Seconds = 0.0  # agent clock; lets the extender apply the usage rule's warm-up
    #: the pod's GPU duty: the share of time its busiest GPU was busy with its processes, averaged over
    #: the agent's duty window; None: not observed (no samples), never a silent 0
    gpu_duty: Ratio | None = None
    #: `process` (NVML per-process samples) or `device` (the device's utilisation charged whole to
    #: each pod on the GPU: an upper bound, exact for a pod alone); "" with no duty
    duty_source: DutySource = ""


@dataclass(frozen=True)
class NodeReport:
    """One node's report. A GPU entry that breaks its schema does not refuse the report: it is taken as
    an unhealthy, full GPU whose `error` says why."""

    node: NodeName
    sequence: Count
    timestamp_s: Seconds
    agent_version: Annotated[str, msgspec.Meta(max_length=MAX_AGENT_VERSION)]
    source: Source
    gpus: Annotated[tuple[GpuReport, ...], msgspec.Meta(max_length=MAX_GPUS_PER_NODE)]
    pods: Annotated[tuple[PodUsage, ...], msgspec.Meta(max_length=MAX_PODS_PER_NODE)] = ()
    interval_s: Seconds = 5.0
    schema_version: Annotated[int, msgspec.Meta(ge=1, le=MAX_WHOLE)] = SCHEMA_VERSION
    #: new at every agent start: the extender orders reports by sequence within it
    boot_id: Annotated[str, msgspec.Meta(max_length=MAX_BOOT_ID)] = ""
    #: the node's NVIDIA driver and the CUDA version it supports (NVML), "" when not known (older
    #: agents, simulated GPUs): with the GPU model they key the online calibration (docs/calibration.md)
    driver_version: Annotated[str, msgspec.Meta(max_length=MAX_SOFTWARE)] = ""
    cuda_version: Annotated[str, msgspec.Meta(max_length=MAX_SOFTWARE)] = ""
    #: set: a delta report. `gpus` then lists only the GPUs whose readings changed since the report of
    #: this `boot_id` with this sequence, which must be the node's last one the extender accepted; the
    #: node's other GPUs read as there (the node's GPUs are the same ones: a GPU added or gone goes in a
    #: full report). `pods` is whole as in any report. None: a full report (every GPU), what agents
    #: send first, after a refusal, and to an extender that does not answer `"deltas": true`.
    base_sequence: Annotated[int, msgspec.Meta(ge=0, le=MAX_WHOLE)] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (lists, not tuples), the inverse of `parse_report`."""
        return asdict(self, dict_factory=_json_ready)

    @cached_property
    def model_key(self) -> tuple[tuple[str, ...], str]:
        """(the distinct GPU models in GPU order, the node software "driver/CUDA", "" when neither is
        known): what admission per GPU model and the online calibration key a node by. Computed once
        per report: a filter asks it of every node it is offered (recomputed per name, it was ~40% of
        the filter's time at 1,000 nodes)."""
        software = (f"{self.driver_version or '?'}/{self.cuda_version or '?'}"
                    if self.driver_version or self.cuda_version else "")
        return tuple(dict.fromkeys(g.model for g in self.gpus)), software


def cross_field_problem(gpu: GpuReport) -> tuple[str, str] | None:
    """The rule across a GPU's fields that a type cannot state: (field, problem), or None."""
    if gpu.memory_used_mib > gpu.memory_total_mib * 1.01 + 1.0:
        return "memory_used_mib", f"{gpu.memory_used_mib:g} exceeds memory_total_mib {gpu.memory_total_mib:g}"
    return None


def parse_report(body: Any) -> NodeReport:
    """Validate a decoded JSON body; raises ReportError naming the first bad field."""
    obj = _mapping(body, "report")
    gpus_raw = obj.get("gpus")
    if not isinstance(gpus_raw, list):  # the GPUs are read one by one below; the rest in one go
        problem = "is required" if gpus_raw is None else f"must be a list, got {_kind(gpus_raw)}"
        raise ReportError("report.gpus", problem)
    try:
        report = msgspec.convert({**obj, "gpus": [], **_duties_clamped(obj.get("pods"))}, NodeReport)
    except msgspec.ValidationError as err:
        raise _report_error(err, "report") from None
    if len(gpus_raw) > MAX_GPUS_PER_NODE:
        raise ReportError("report.gpus", f"has {len(gpus_raw)} entries, at most {MAX_GPUS_PER_NODE} allowed")
    gpus: list[GpuReport] = []
    seen: set[str] = set()
    for i, raw in enumerate(gpus_raw):
        gpu = _gpu_or_invalid(raw, f"report.gpus[{i}]", report.node, i, seen)
        seen.add(gpu.uuid)
        gpus.append(gpu)
    return replace(report, gpus=tuple(gpus))


def _duties_clamped(pods: Any) -> dict[str, Any]:
    """`{"pods": ...}` with each pod's numeric `gpu_duty` clamped into [0, 1], or {} when none is out
    of it. Device utilisation is sampled and rounded: a duty of 1.02 or 1.5 is "busy all the time", and
    one pod's figure must not refuse its node's report (the agent clamps too; an older one may not).
    A duty that is not a number is still refused, by its field's name."""
    if not isinstance(pods, list):
        return {}
    out, changed = [], False
    for pod in pods:
        duty = pod.get("gpu_duty") if isinstance(pod, dict) else None
        if isinstance(duty, (int, float)) and not isinstance(duty, bool) and math.isfinite(duty) and \
                not 0.0 <= duty <= 1.0:
            pod = {**pod, "gpu_duty": min(max(float(duty), 0.0), 1.0)}
            changed = True
        out.append(pod)
    return {"pods": out} if changed else {}


#: The outcome (and the answer's `outcome`) of a delta report the extender cannot apply: the agent
#: sends the same report whole at once.
FULL_REPORT_NEEDED = "full_report_needed"


def delta_of(report: NodeReport, base: NodeReport) -> NodeReport:
    """The delta of `report` against `base` (the last report the extender accepted of this boot):
    only the GPUs whose readings differ; the full `report` when the node's GPUs are not the same
    ones (or it restarted). `apply_delta(delta, base)` gives `report` back."""
    if report.boot_id != base.boot_id or not report.boot_id or \
            [g.uuid for g in report.gpus] != [g.uuid for g in base.gpus]:
        return report
    changed = tuple(g for g, b in zip(report.gpus, base.gpus, strict=True) if g != b)
    return replace(report, gpus=changed, base_sequence=base.sequence)


def apply_delta(delta: NodeReport, base: NodeReport | None) -> NodeReport:
    """The full report a delta stands for, over `base` (the node's last accepted report, None when
    none is held); raises ReportError (path `report.base_sequence`) when it does not apply: no base
    held (an extender restarted, a node forgotten), another boot or sequence (a report lost or
    refused between), a GPU the base does not have. O(the node's GPUs): never the cluster's size."""
    assert delta.base_sequence is not None
    if not delta.boot_id:
        raise ReportError("report.boot_id", "a delta report (base_sequence set) needs the agent's boot_id")
    if base is None:
        raise ReportError("report.base_sequence", f"no report of node {delta.node} is held here (the extender "
                                                  "restarted or forgot the node): send a full report")
    if base.boot_id != delta.boot_id or base.sequence != delta.base_sequence:
        raise ReportError("report.base_sequence",
                          f"is {delta.base_sequence} of boot {delta.boot_id!r}, but the last report held of node "
                          f"{delta.node} is {base.sequence} of boot {base.boot_id!r}: send a full report")
    by_uuid = {g.uuid: g for g in delta.gpus}
    if len(by_uuid) != len(delta.gpus) or not by_uuid.keys() <= {g.uuid for g in base.gpus}:
        raise ReportError("report.gpus", "a delta report names a GPU twice or one its base report does not "
                                         "have: send a full report")
    return replace(delta, gpus=tuple(by_uuid.get(g.uuid, g) for g in base.gpus), base_sequence=None)


def checked(report: NodeReport) -> NodeReport:
    """The report as the extender will read it (bad GPU readings demoted); raises ReportError for
    what would refuse the whole report. The agent sends only what this returns."""
    return parse_report(report.to_dict())


#: Longest `error` kept for a GPU whose reading was refused.
MAX_ERROR_CHARS = 300


def _gpu_or_invalid(raw: Any, path: str, node: str, position: int, seen: set[str]) -> GpuReport:
    """A GPU entry; one that breaks the schema becomes an unhealthy GPU reported as full (nothing
    can be placed on it) that says why. Without a usable UUID (none, or one already in the report)
    it is named after its node and place."""
    try:
        gpu = msgspec.convert(_mapping(raw, path), GpuReport)
        problem = cross_field_problem(gpu)
        if problem is not None:
            raise ReportError(f"{path}.{problem[0]}", problem[1])
        if gpu.uuid in seen:
            raise ReportError(f"{path}.uuid", f"{gpu.uuid!r} is already the uuid of another GPU of the report")
        return gpu
    except (ReportError, msgspec.ValidationError) as failure:
        err = failure if isinstance(failure, ReportError) else _report_error(failure, path)
        obj = raw if isinstance(raw, dict) else {}
        uuid, index, model, total = obj.get("uuid"), obj.get("index"), obj.get("model"), obj.get("memory_total_mib")
        if isinstance(total, bool) or not isinstance(total, int | float) or not 0 <= total <= FINITE:
            total = 0.0
        if not (isinstance(uuid, str) and 0 < len(uuid) <= MAX_UUID) or uuid in seen:
            uuid = f"{node}/invalid-gpu-{position}"
            while uuid in seen:  # a GPU of the report may carry that name itself
                uuid += "~"
        reason = f"invalid reading: {err}"
        return GpuReport(
            uuid=uuid,
            index=index if isinstance(index, int) and not isinstance(index, bool) and index >= 0 else position,
            model=model if isinstance(model, str) and len(model) <= MAX_MODEL else "",
            memory_total_mib=float(total),
            memory_used_mib=float(total),
            healthy=False,
            error=reason if len(reason) <= MAX_ERROR_CHARS else reason[:MAX_ERROR_CHARS] + "...",
        )


def _report_error(err: msgspec.ValidationError, root: str) -> ReportError:
    at, problem = place(err)
    return ReportError(root + at, problem)


def _json_ready(items: list[tuple[str, Any]]) -> dict[str, Any]:
    return {key: list(value) if isinstance(value, tuple) else value for key, value in items}


def _mapping(raw: Any, path: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ReportError(path, f"must be an object, got {_kind(raw)}")
    return raw


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
