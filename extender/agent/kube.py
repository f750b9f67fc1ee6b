"""The agent's only contact with the Kubernetes API: the pods on this node, and the Node annotation
that wakes kube-scheduler when GPU memory frees up. Both run off the sampling path (their own
threads), so a slow API server never delays a sample. Without a cluster (`--no-kube`) the file and
null variants stand in.

RBAC the agent needs: get/list/watch pods (cluster-wide list filtered by spec.nodeName) and patch
nodes.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

log = logging.getLogger(__name__)

FREE_MIB_ANNOTATION = "deepres.io/gpu-free-mib"
#: Written with every publication (Unix time, milliseconds): a patch that leaves the Node as it was is
#: no update (the API server writes nothing and sends no watch event), and a node whose jobs all ended
#: frees exactly what it had free at the last publication, so the value alone would wake nobody.
FREE_AT_ANNOTATION = "deepres.io/gpu-free-at"
ASSIGNED_GPUS_ANNOTATION = "deepres.io/assigned-gpus"
PREDICTED_MEMORY_ANNOTATION = "deepres.io/predicted-memory-mib"


@dataclass(frozen=True)
class PodInfo:
    """What the agent needs of a pod bound to its node."""

    uid: str
    namespace: str = ""
    name: str = ""
    phase: str = "Running"
    annotations: Mapping[str, str] = field(default_factory=dict)


class PodLister(Protocol):
    def pods(self) -> list[PodInfo]:
        """The pods bound to this node as last seen (never blocks on the network)."""
        ...


class NodeAnnotator(Protocol):
    def publish_free_mib(self, free_mib: int) -> None:
        """Ask for `deepres.io/gpu-free-mib` to be set on this node (asynchronously)."""
        ...


class NoPods:
    def pods(self) -> list[PodInfo]:
        return []


class NullAnnotator:
    def publish_free_mib(self, free_mib: int) -> None:
        log.debug("--no-kube: not publishing %s=%d", FREE_MIB_ANNOTATION, free_mib)


def pod_from_object(obj: Mapping[str, Any]) -> PodInfo | None:
    """A PodInfo from a Pod as JSON/YAML (Kubernetes casing); None when it has no uid."""
    meta = obj.get("metadata") or {}
    uid = str(meta.get("uid") or "")
    if not uid:
        return None
    annotations = meta.get("annotations") or {}
    return PodInfo(
        uid=uid,
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        phase=str((obj.get("status") or {}).get("phase") or "Running"),
        annotations={str(k): str(v) for k, v in annotations.items()},
    )


class FilePods:
    """Pods from a local YAML/JSON file (a PodList, a list of Pods, or one Pod), re-read when it
    changes: the `--no-kube` stand-in for the API, e.g. to drive the simulated source by hand."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._stamp: tuple[int, int] | None = None
        self._pods: list[PodInfo] = []

    def pods(self) -> list[PodInfo]:
        try:
            st = os.stat(self.path)
            if (st.st_mtime_ns, st.st_size) != self._stamp:
                self._stamp = (st.st_mtime_ns, st.st_size)
                self._pods = self._load()
        except OSError as err:
            if self._stamp is not None:
                log.warning("cannot read pods file %s: %s", self.path, err)
            self._stamp, self._pods = None, []
        return list(self._pods)

    def _load(self) -> list[PodInfo]:
        try:
            data = yaml.safe_load(self.path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as err:
            log.warning("pods file %s is not valid YAML/JSON: %s", self.path, err)
            return []
        items = data.get("items", [data]) if isinstance(data, dict) else data if isinstance(data, list) else []
        pods = [pod_from_object(item) for item in items if isinstance(item, dict)]
        return [p for p in pods if p is not None]


def core_api() -> Any:
    """A CoreV1Api from the in-cluster ServiceAccount, else from ~/.kube/config."""
    import importlib

    config: Any = importlib.import_module("kubernetes.config")
    client: Any = importlib.import_module("kubernetes.client")
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.CoreV1Api()


WatchStream = Callable[[Any, str, str, int], Iterable[Mapping[str, Any]]]


def watch_pods(api: Any, field_selector: str, resource_version: str, timeout_s: int) -> Iterable[Mapping[str, Any]]:
    """Pod watch events ({"type", "object": raw dict}) from `resource_version` on, for `timeout_s`."""
    import importlib

    watch: Any = importlib.import_module("kubernetes.watch")
    return watch.Watch().stream(  # type: ignore[no-any-return]
        api.list_pod_for_all_namespaces,
        field_selector=field_selector,
        resource_version=resource_version,
        timeout_seconds=timeout_s,
        allow_watch_bookmarks=True,
        deserialize=False,
        _request_timeout=timeout_s + 30,
    )


class KubePods:
    """Pods on `node`: listed once, then kept current by a watch filtered on spec.nodeName (one
    long request per node instead of a list every interval: at thousands of nodes the API server
    notices the difference). After a watch error (410 Gone, connection lost) it lists again."""

    def __init__(
        self,
        api: Any,
        node: str,
        *,
        watch_timeout_s: int = 300,
        retry_s: float = 5.0,
        stream: WatchStream | None = None,
    ) -> None:
        self._api, self._node = api, node
        self._selector = f"spec.nodeName={node}"
        self._watch_timeout_s, self._retry_s = watch_timeout_s, retry_s
        self._stream = stream or watch_pods
        self._pods: dict[str, PodInfo] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="deepres-pods", daemon=True)
        self._resource_version: str | None = None
        self._failing = False

    def start(self) -> KubePods:
        """List once now (so the first report already knows the pods), then watch in a thread."""
        self.relist()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def pods(self) -> list[PodInfo]:
        with self._lock:
            return list(self._pods.values())

    def relist(self) -> bool:
        """Replace the view with a fresh list; False (the last view kept) when the API fails."""
        try:
            answer = self._api.list_pod_for_all_namespaces(field_selector=self._selector, _request_timeout=10)
        except Exception as err:  # ApiException, connection errors
            self._complain(f"cannot list pods on node {self._node}: {_first_line(err)}")
            return False
        raw = (self._api.api_client.sanitize_for_serialization(item) for item in answer.items)
        pods = [p for p in (pod_from_object(obj) for obj in raw) if p is not None]
        with self._lock:
            self._pods = {p.uid: p for p in pods}
        self._resource_version = str(getattr(answer.metadata, "resource_version", "") or "") or None
        return True

    def apply(self, event: Mapping[str, Any]) -> None:
        """One watch event: ADDED/MODIFIED upsert, DELETED removes; BOOKMARK only moves the version."""
        obj = event.get("object")
        if not isinstance(obj, Mapping):
            return
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if version:
            self._resource_version = str(version)
        pod = pod_from_object(obj)
        if pod is None:
            return
        with self._lock:
            if event.get("type") == "DELETED":
                self._pods.pop(pod.uid, None)
            elif event.get("type") in ("ADDED", "MODIFIED"):
                self._pods[pod.uid] = pod

    def watch_once(self) -> None:
        """Relist if needed, then follow one watch until it ends; errors force a relist next time."""
        if self._resource_version is None and not self.relist():
            raise RuntimeError("pod list failed")
        try:
            for event in self._stream(self._api, self._selector, self._resource_version or "", self._watch_timeout_s):
                if self._stop.is_set():
                    return
                self.apply(event)
                self._failing = False
        except Exception:
            self._resource_version = None  # 410 Gone or a broken stream: start again from a list
            raise

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.watch_once()
            except Exception as err:
                self._complain(f"pod watch on node {self._node} failed: {_first_line(err)}; retrying")
                self._stop.wait(self._retry_s)

    def _complain(self, message: str) -> None:
        if not self._failing:  # once per failure streak, not every retry
            log.warning("%s", message)
        self._failing = True


class KubeNodeAnnotator:
    """Patches `deepres.io/gpu-free-mib` (and `deepres.io/gpu-free-at`) on the Node from a background
    thread (newest value wins)."""

    def __init__(self, api: Any, node: str, clock: Callable[[], float] = time.time) -> None:
        self._api, self._node, self._clock = api, node, clock
        self._value: int | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="deepres-annotator", daemon=True)
        self.patched = 0

    def start(self) -> KubeNodeAnnotator:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def publish_free_mib(self, free_mib: int) -> None:
        self._value = free_mib
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            value, self._value = self._value, None
            if value is not None and not self._stop.is_set():
                self.patch_now(value)

    def patch_now(self, free_mib: int) -> bool:
        """One PATCH of the annotations (the free memory and when it was published, so that every
        publication is a Node update kube-scheduler sees); False (logged) on RBAC or API trouble:
        the next change retries."""
        body = {"metadata": {"annotations": {FREE_MIB_ANNOTATION: str(free_mib),
                                             FREE_AT_ANNOTATION: str(int(self._clock() * 1000))}}}
        try:
            self._api.patch_node(self._node, body, _request_timeout=10)
        except Exception as err:
            log.warning("cannot annotate node %s: %s", self._node, _first_line(err))
            return False
        self.patched += 1
        log.debug("node %s: %s=%d", self._node, FREE_MIB_ANNOTATION, free_mib)
        return True


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def dump_pods(pods: list[PodInfo]) -> str:
    """A pods file FilePods reads back (used by tests and local demos)."""
    items = [
        {
            "metadata": {"uid": p.uid, "name": p.name, "namespace": p.namespace, "annotations": dict(p.annotations)},
            "status": {"phase": p.phase},
        }
        for p in pods
    ]
    return json.dumps({"items": items}, indent=1)
