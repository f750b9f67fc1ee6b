"""Which pods the extender may act on: the API server's copy, never what a request body claims."""

from __future__ import annotations

from typing import Any

from extender.kube.cluster import TERMINAL_PHASES, Cluster, ClusterError
from extender.protocol import PodInfo, ProtocolError, parse_pod

Confirmed = tuple[dict[str, Any], PodInfo]


def confirmed_pod(cluster: Cluster, scheduler_name: str, namespace: str, name: str, uid: str, *,
                  pending_from_watch: bool = False) -> Confirmed | str:
    """The pod as the API server has it, when it is one this extender may act on: ours
    (schedulerName), the same pod (uid), not finished; else why not. What a request claimed
    about the pod never enters: a filter body is not the pod.

    `pending_from_watch` (bind): the pod watch's copy (the API server's, as of a moment ago)
    is enough when it shows that very pod pending and unbound: uid and schedulerName never
    change, and the Binding that follows carries the uid as a precondition, so the API server
    itself refuses a pod that was bound, deleted or replaced meanwhile. Anything else (not
    seen yet, another uid, bound, deleting) asks the API server, as every other caller does.
    This saves one API round trip per bind (about a fifth of the extender's CPU per pod)."""
    key = f"{namespace}/{name}"
    if pending_from_watch:
        watched = cluster.watched_pod(namespace, name)
        if watched is not None and not (watched.get("metadata") or {}).get("deletionTimestamp"):
            checked = check_pod(scheduler_name, key, watched, uid)
            if not isinstance(checked, str) and not checked[1].node_name:
                return checked
    try:
        raw = cluster.read_pod(namespace, name)
    except ClusterError as err:
        return f"pod {key} could not be read: {err}"
    if raw is None:
        return f"pod {key} does not exist"
    return check_pod(scheduler_name, key, raw, uid)


def check_pod(scheduler_name: str, key: str, raw: dict[str, Any], uid: str) -> Confirmed | str:
    try:
        pod = parse_pod(raw)
    except ProtocolError as err:
        return f"pod {key}: {err}"
    if not uid or pod.uid != uid:
        return f"pod {key} has uid {pod.uid or '(none)'}, not {uid or '(none)'}"
    if pod.scheduler_name != scheduler_name:
        return f"pod {key} is scheduled by {pod.scheduler_name or 'default-scheduler'}, not by {scheduler_name}"
    if pod.phase in TERMINAL_PHASES:
        return f"pod {key} is {pod.phase}"
    return raw, pod
