"""kube-scheduler's extender v1 wire types <-> Python records.

The Go structs (k8s.io/kube-scheduler/extender/v1) have no json tags, so the keys are the Go field
names: `Pod`, `Nodes`, `NodeNames`, `FailedNodes`, `FailedAndUnresolvableNodes`, `Error`,
`[{"Host", "Score"}]`, `PodName`/`PodNamespace`/`PodUID`/`Node`, `NodeNameToVictims`/
`NodeNameToMetaVictims`; the embedded Pod and Node objects keep Kubernetes' own casing.
Parsers raise only ProtocolError (naming the field path); encoders never emit null arrays.

The request bodies' fields that the extender reads are declared once, as the msgspec records below
(`Pod`, `ExtenderArgsBody`, `ExtenderBindingArgs`, `ExtenderPreemptionArgs`): msgspec decodes and
validates against them, and the OpenAPI document's request schemas are generated from them
(extender/server/openapi.py). Fields they do not name (the rest of a Pod or a Node) are ignored.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, TypeVar

import msgspec
import numpy as np
import numpy.typing as npt
import orjson

from extender.policy.types import FilterResult
from extender.wire import place


class ProtocolError(ValueError):
    """A request that does not follow the extender protocol; `path` names the offending field."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


@dataclass(frozen=True)
class PodInfo:
    """What the extender reads from a Pod object."""

    name: str
    namespace: str
    uid: str
    annotations: Mapping[str, str]
    created_s: float | None = None
    priority: int | None = None  # spec.priority (resolved from the PriorityClass by admission)
    priority_class: str = ""
    node_name: str = ""
    phase: str = ""
    scheduler_name: str = ""
    scheduled_s: float | None = None  # the PodScheduled condition's time (Unix s): when it was bound

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class ExtenderArgs:
    """Filter / prioritize input: the pod and the candidate nodes, by name or as full objects."""

    pod: PodInfo
    node_names: tuple[str, ...]
    #: the full Node objects when nodeCacheCapable is false: decoded dicts, or each Node's own JSON
    #: text (msgspec.Raw) from `decode_extender_args`, echoed as is in the filter's answer
    nodes: tuple[dict[str, Any] | msgspec.Raw, ...] | None
    raw_pod: Any = None  # the Pod object as sent (bind reads its annotations later)


@dataclass(frozen=True)
class BindingArgs:
    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


@dataclass(frozen=True)
class PreemptionArgs:
    """Preempt input: the preemptor and, per node, the victims kube-scheduler proposes (by UID)."""

    pod: PodInfo
    victims: dict[str, tuple[str, ...]]
    pdb_violations: dict[str, int]
    meta: bool  # True: NodeNameToMetaVictims (nodeCacheCapable), False: NodeNameToVictims


# ---- the wire records (the one definition of each field read) ----

#: A string that must be given and not be empty.
Required = Annotated[str, msgspec.Meta(min_length=1)]
#: Kubernetes' int32 (a priority, a count of PodDisruptionBudget violations).
Int32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]


class PodMetadata(msgspec.Struct):
    name: Required
    namespace: str | None = None  # none or empty: "default"
    uid: str | None = None
    annotations: dict[str, str] | None = None
    creationTimestamp: Annotated[str | None, msgspec.Meta(extra_json_schema={"format": "date-time"})] = None


class PodSpec(msgspec.Struct):
    priority: Int32 | None = None  # resolved from the PriorityClass by admission
    priorityClassName: str | None = None
    nodeName: str | None = None
    schedulerName: str | None = None


class PodStatus(msgspec.Struct):
    phase: str | None = None
    # read leniently (`_scheduled_s`): a condition the extender cannot read never makes the pod unreadable
    conditions: list[Any] | None = None


class Pod(msgspec.Struct):
    """A Kubernetes Pod (v1) as kube-scheduler serialises it: the fields the extender reads."""

    metadata: PodMetadata
    spec: PodSpec | None = None
    status: PodStatus | None = None


class NodeMetadata(msgspec.Struct):
    name: Required


class Node(msgspec.Struct):
    """A Kubernetes Node (v1): only its name is read; the filter echoes the object as sent."""

    metadata: NodeMetadata


class NodeList(msgspec.Struct):
    items: list[msgspec.Raw] | None = None


class ExtenderArgsBody(msgspec.Struct):
    """Filter / prioritize input. Exactly one of `NodeNames` (nodeCacheCapable: true) and `Nodes` (false):
    with neither, the answer carries an Error. `Pod` is kept as sent and read as a `Pod`."""

    Pod: dict[str, Any]
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None


class ExtenderBindingArgs(msgspec.Struct):
    PodName: Required
    PodUID: Required
    Node: Required
    PodNamespace: str | None = None  # none or empty: "default"


class MetaPod(msgspec.Struct):
    UID: Required


class MetaVictims(msgspec.Struct):
    Pods: list[MetaPod] | None = None
    NumPDBViolations: Int32 | None = None


class Victims(msgspec.Struct):
    """Victims as full Pods: each must carry `metadata.uid`."""

    Pods: list[Pod] | None = None
    NumPDBViolations: Int32 | None = None


class ExtenderPreemptionArgs(msgspec.Struct):
    """Preempt input: `NodeNameToMetaVictims` (nodeCacheCapable) or `NodeNameToVictims`; one is needed."""

    Pod: Pod
    NodeNameToVictims: dict[str, Victims] | None = None
    NodeNameToMetaVictims: dict[str, MetaVictims] | None = None


#: The request records whose schemas the OpenAPI document is generated from.
REQUEST_RECORDS: tuple[type[msgspec.Struct], ...] = (ExtenderArgsBody, ExtenderBindingArgs, ExtenderPreemptionArgs, Pod,
                                                     Node)
#: (record, field) that the decoder keeps as sent and reads later as another record (`parse_pod`, the
#: Node's name): the schema names that record.
READ_AS: dict[tuple[str, str], str] = {("ExtenderArgsBody", "Pod"): "Pod", ("NodeList", "items"): "Node"}

_T = TypeVar("_T")


def _convert(raw: Any, record: type[_T], path: str) -> _T:
    """`raw` (decoded JSON) as `record`, or ProtocolError naming the field as `path` + msgspec's place."""
    try:
        return msgspec.convert(raw, record)
    except msgspec.ValidationError as err:
        at, problem = place(err)
        if at.endswith("[...]") and isinstance(raw, dict):  # a map's value: name its key
            at = _name_key(raw, at)
        raise ProtocolError(f"{path}{at}", problem) from None


def _name_key(raw: dict[str, Any], at: str) -> str:
    """`.metadata.annotations[...]` -> `.metadata.annotations[key]`, the first key whose value is not a string."""
    node: Any = raw
    for part in at.removesuffix("[...]").strip(".").split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
        key = next((k for k, v in node.items() if not isinstance(v, str)), None)
        if key is not None:
            return at.removesuffix("[...]") + f"[{key}]"
    return at


# ---- decoding ----

def parse_pod(raw: Any, path: str = "Pod") -> PodInfo:
    """A Pod object (as kube-scheduler serialises it) -> PodInfo."""
    pod = _convert(_object(raw, path), Pod, path)
    meta, spec, status = pod.metadata, pod.spec or _NO_SPEC, pod.status or _NO_STATUS
    return PodInfo(
        name=meta.name,
        namespace=meta.namespace or "default",
        uid=meta.uid or "",
        annotations=meta.annotations or {},
        created_s=_timestamp(meta.creationTimestamp, f"{path}.metadata.creationTimestamp"),
        priority=spec.priority,
        priority_class=spec.priorityClassName or "",
        node_name=spec.nodeName or "",
        phase=status.phase or "",
        scheduler_name=spec.schedulerName or "",
        scheduled_s=_scheduled_s(status.conditions),
    )


def _scheduled_s(conditions: list[Any] | None) -> float | None:
    """When the pod was bound: its `PodScheduled` condition's lastTransitionTime (set by the API server
    with the Binding; users cannot change a pod's status). None when absent or unreadable."""
    for condition in conditions or ():
        if isinstance(condition, dict) and condition.get("type") == "PodScheduled" and \
                condition.get("status") == "True":
            try:
                return _timestamp(condition.get("lastTransitionTime"), "status.conditions")
            except ProtocolError:
                return None
    return None


_NO_SPEC = PodSpec()
_NO_STATUS = PodStatus()


def parse_extender_args(body: Any) -> ExtenderArgs:
    """ExtenderArgs JSON -> ExtenderArgs; exactly one of NodeNames / Nodes must be given."""
    obj = _object(body, "ExtenderArgs")
    pod = parse_pod(obj.get("Pod"))
    names_raw = obj.get("NodeNames")
    nodes_raw = obj.get("Nodes")
    if names_raw is not None:
        names = tuple(_string_list(names_raw, "NodeNames"))
        return ExtenderArgs(pod, names, None, obj.get("Pod"))
    if nodes_raw is not None:
        node_list = _object(nodes_raw, "Nodes")
        items = node_list.get("items") or []
        if not isinstance(items, list):
            raise ProtocolError("Nodes.items", f"must be a list, got {_kind(items)}")
        nodes: list[dict[str, Any]] = []
        names_list: list[str] = []
        for i, item in enumerate(items):
            node = _object(item, f"Nodes.items[{i}]")
            names_list.append(_convert(node, Node, f"Nodes.items[{i}]").metadata.name)
            nodes.append(node)
        return ExtenderArgs(pod, tuple(names_list), tuple(nodes), obj.get("Pod"))
    raise ProtocolError("ExtenderArgs", "needs NodeNames (nodeCacheCapable: true) or Nodes (false)")


_ARGS_DECODER = msgspec.json.Decoder(ExtenderArgsBody)
_NODE_NAME_DECODER = msgspec.json.Decoder(Node)


def decode_extender_args(data: bytes) -> ExtenderArgs | None:
    """ExtenderArgs straight from the request bytes, or None when they are not well-formed (then
    `parse_extender_args` over the decoded JSON names the problem).

    For the full-Node mode (nodeCacheCapable: false; ~0.4 MB for 100 Nodes) decoding every Node
    into Python objects cost more than all the rest of a pod's work: msgspec reads the body once,
    keeps each Node as its JSON text and reads only its name, and the filter echoes the passed
    Nodes' text unchanged. Measured in-process, 1.3 ms to decode the body with orjson against 0.6 ms.
    """
    try:
        fast = _ARGS_DECODER.decode(data)
        if fast.NodeNames is not None:
            pod = parse_pod(fast.Pod)
            return ExtenderArgs(pod, tuple(fast.NodeNames), None, fast.Pod)
        if fast.Nodes is None:
            return None
        items = tuple(fast.Nodes.items or ())
        names = tuple(_NODE_NAME_DECODER.decode(item).metadata.name for item in items)
        return ExtenderArgs(parse_pod(fast.Pod), names, items, fast.Pod)
    except (msgspec.DecodeError, ProtocolError, RecursionError):  # ValidationError is a DecodeError
        return None


#: The pod's own preferences over nodes that kube-scheduler's score plugins weigh (NodeAffinity,
#: InterPodAffinity): a shortlisted filter answer would hide nodes they prefer.
_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def soft_preferences(raw_pod: Any) -> bool:
    """Whether the Pod (as kube-scheduler sent it) has preferences that kube-scheduler scores itself:
    a preferred node affinity, a preferred pod affinity or anti-affinity, or a topology spread
    constraint with `whenUnsatisfiable: ScheduleAnyway`. Such a pod gets every node that fits from
    the filter, not a shortlist. A shape this cannot read counts as a preference (the full answer)."""
    if not isinstance(raw_pod, dict):
        return True
    spec = raw_pod.get("spec")
    if spec is None:
        return False
    if not isinstance(spec, dict):
        return True
    affinity = spec.get("affinity")
    if affinity is not None:
        if not isinstance(affinity, dict):
            return True
        for kind in ("nodeAffinity", "podAffinity", "podAntiAffinity"):
            terms = affinity.get(kind)
            if terms is not None and (not isinstance(terms, dict) or terms.get(_PREFERRED)):
                return True
    constraints = spec.get("topologySpreadConstraints")
    if constraints is not None:
        if not isinstance(constraints, list):
            return True
        return any(not isinstance(c, dict) or c.get("whenUnsatisfiable") == "ScheduleAnyway" for c in constraints)
    return False


def parse_binding_args(body: Any) -> BindingArgs:
    args = _convert(_object(body, "ExtenderBindingArgs"), ExtenderBindingArgs, "ExtenderBindingArgs")
    return BindingArgs(pod_name=args.PodName, pod_namespace=args.PodNamespace or "default", pod_uid=args.PodUID,
                       node=args.Node)


def parse_preemption_args(body: Any) -> PreemptionArgs:
    obj = _object(body, "ExtenderPreemptionArgs")
    pod = parse_pod(obj.get("Pod"))
    victims: dict[str, tuple[str, ...]] = {}
    pdbs: dict[str, int] = {}
    meta_raw = obj.get("NodeNameToMetaVictims")
    full_raw = obj.get("NodeNameToVictims")
    meta = meta_raw is not None
    source = meta_raw if meta else full_raw
    key = "NodeNameToMetaVictims" if meta else "NodeNameToVictims"
    if source is None:
        raise ProtocolError("ExtenderPreemptionArgs", "needs NodeNameToMetaVictims or NodeNameToVictims")
    for node, raw in _object(source, key).items():
        path = f"{key}[{node}]"
        if meta:
            by_uid = _convert(_object(raw, path), MetaVictims, path)
            uids, violations = [victim.UID for victim in by_uid.Pods or ()], by_uid.NumPDBViolations
        else:
            full = _convert(_object(raw, path), Victims, path)
            uids, violations = [victim.metadata.uid or "" for victim in full.Pods or ()], full.NumPDBViolations
            if "" in uids:
                raise ProtocolError(f"{path}.Pods[{uids.index('')}].metadata.uid", "is required")
        victims[node] = tuple(uids)
        pdbs[node] = violations or 0
    return PreemptionArgs(pod, victims, pdbs, meta)


# ---- encoding ----

def filter_result(result: FilterResult, args: ExtenderArgs) -> dict[str, Any]:
    """ExtenderFilterResult JSON: NodeNames always; Nodes (the passed objects) in full-object mode."""
    nodes: dict[str, Any] | None = None
    if args.nodes is not None:
        passed = set(result.passed)
        seen: set[str] = set()
        unique: list[Any] = []
        for name, node in zip(args.node_names, args.nodes, strict=True):
            if name in passed and name not in seen:
                seen.add(name)
                unique.append(orjson.Fragment(bytes(node)) if isinstance(node, msgspec.Raw) else node)
        nodes = {"metadata": {}, "items": unique}
    return {
        "Nodes": nodes,
        "NodeNames": list(result.passed),
        "FailedNodes": dict(result.failed),
        "FailedAndUnresolvableNodes": dict(result.unresolvable),
        "Error": "",
    }


def filter_error(message: str, args: ExtenderArgs | None = None) -> dict[str, Any]:
    """A filter answer carrying an Error (kube-scheduler fails this scheduling attempt)."""
    return {
        "Nodes": None if args is None or args.nodes is None else {"metadata": {}, "items": []},
        "NodeNames": [],
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": message,
    }


def filter_all_unresolvable(args: ExtenderArgs, reason: str) -> dict[str, Any]:
    """Every node failed as unresolvable with one reason (a pod whose annotations are wrong)."""
    return {
        "Nodes": None if args.nodes is None else {"metadata": {}, "items": []},
        "NodeNames": [],
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": dict.fromkeys(args.node_names, reason),
        "Error": "",
    }


def host_priority_list(scores: Iterable[tuple[str, int]]) -> list[dict[str, Any]]:
    """HostPriorityList. The scores are Python ints already (an int() per host doubled the cost)."""
    return [{"Host": host, "Score": score} for host, score in scores]


#: The JSON of one HostPriority entry around its host's name (`host_priority_json`).
_HOST_OPEN, _HOST_CLOSE = b'{"Host":"', b'","Score":'
#: Bytes of an entry besides its name: the two above, a 2-character score and "}"; then a ",".
_ENTRY_EXTRA = len(_HOST_OPEN) + len(_HOST_CLOSE) + 3
#: Scores 0..99 as two characters: a space for the tens below 10 (JSON allows it before a number).
_TENS = np.frombuffer(b"".join(b" " if v < 10 else str(v // 10).encode() for v in range(100)), dtype=np.uint8)
_ONES = np.frombuffer(b"".join(str(v % 10).encode() for v in range(100)), dtype=np.uint8)


def host_priority_json(hosts: Sequence[str], scores: npt.NDArray[np.int64],
                       derived: dict[str, object] | None = None) -> bytes:
    """The HostPriorityList JSON of `hosts` with `scores` (0..99), written without a Python object
    per host: the JSON of the list with every score "00" is made from the names' JSON (orjson) and
    the digits are written at their places with numpy. At 5,000 hosts ~0.3 ms against ~1 ms for a
    list of pairs then of dicts through orjson; ~0.04 ms when `derived` (kept with the list, see
    `columnar.Lookup`) holds the template already. Names that JSON must escape, or not ASCII, take
    the dicts' path."""
    if not hosts:
        return b"[]"
    template = derived.get(_TEMPLATE_KEY) if derived is not None else None
    if template is None:
        template = _host_priority_template(hosts)
        if derived is not None and len(hosts) <= TEMPLATE_KEPT_MAX_HOSTS:
            derived[_TEMPLATE_KEY] = template
    if not isinstance(template, tuple) or scores.min() < 0 or scores.max() > 99:
        return orjson.dumps(host_priority_list(zip(hosts, scores.tolist(), strict=True)))
    body, at = template
    out = np.frombuffer(body, dtype=np.uint8).copy()
    out[at] = _TENS[scores]
    out[at + 1] = _ONES[scores]
    return out.tobytes()


_TEMPLATE_KEY = "host_priority_json"
#: Longest list whose template is kept with it (~40 bytes a host; the lists kept are bounded too).
TEMPLATE_KEPT_MAX_HOSTS = 20_000


def _host_priority_template(hosts: Sequence[str]) -> tuple[bytes, npt.NDArray[np.int64]] | bool:
    """(the answer's JSON with every score "00", where each score's 2 characters are); False when a
    name is escaped by JSON or not ASCII."""
    names = orjson.dumps(hosts if isinstance(hosts, list) else list(hosts))  # ["a","b",...]
    if not names.isascii() or b"\\" in names:
        return False
    # nothing escaped, so every '"' delimits a name and every '","' separates two of them
    quotes = np.flatnonzero(np.frombuffer(names, dtype=np.uint8) == ord('"'))
    lengths = quotes[1::2] - quotes[::2] - 1
    body = b"[" + _HOST_OPEN + names[2:-2].replace(b'","', _HOST_CLOSE + b'00},' + _HOST_OPEN) + _HOST_CLOSE + b"00}]"
    ends = np.cumsum(lengths + _ENTRY_EXTRA + 1)  # one past each entry: where its "," (or the "]") is
    at: npt.NDArray[np.int64] = ends - 3  # an entry ends with its 2 score characters and "}"
    at.flags.writeable = False
    return body, at


def binding_result(error: str = "") -> dict[str, str]:
    return {"Error": error}


def preemption_result(victims: Mapping[str, Sequence[str]], pdb_violations: Mapping[str, int]) -> dict[str, Any]:
    """ExtenderPreemptionResult: always NodeNameToMetaVictims (victims by UID)."""
    return {
        "NodeNameToMetaVictims": {
            node: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": int(pdb_violations.get(node, 0))}
            for node, uids in victims.items()
        }
    }


# ---- helpers ----

def _object(raw: Any, path: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ProtocolError(path, f"must be an object, got {_kind(raw)}")
    return raw


def _string_list(raw: Any, path: str) -> list[str]:
    if not isinstance(raw, list):
        raise ProtocolError(path, f"must be a list, got {_kind(raw)}")
    if set(map(type, raw)) <= {str}:  # the common case, checked in C
        return raw
    for i, item in enumerate(raw):
        if not isinstance(item, str):
            raise ProtocolError(f"{path}[{i}]", f"must be a string, got {_kind(item)}")
    return raw


#: RFC 3339 allows a leap second (23:59:60); Python's datetime does not: read as :59.
_LEAP_SECOND = re.compile(r"([Tt ]\d\d:\d\d:)60")


def _timestamp(raw: Any, path: str) -> float | None:
    if raw is None or raw == "":
        return None
    if not isinstance(raw, str):
        raise ProtocolError(path, f"must be an RFC 3339 string, got {_kind(raw)}")
    text = _LEAP_SECOND.sub(r"\g<1>59", raw.replace("Z", "+00:00").replace("z", "+00:00"))
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ProtocolError(path, f"must be an RFC 3339 time, got {raw[:64]!r}") from None
    if moment.tzinfo is None:
        raise ProtocolError(path, f"must carry a time zone, got {raw[:64]!r}")
    value = moment.timestamp()
    return value if math.isfinite(value) else None


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
