"""Local mode's cluster (`deepres serve --no-kube`) and the tests': the `Cluster` interface with no API
server. Pods live in memory; in local mode the bound ones are also kept in a durable state file
(`extender/kube/statefile.py`), the only record of what is bound there."""

from __future__ import annotations

import copy
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from extender.kube import journal, statefile
from extender.kube.cluster import LEARNED_MAX, ClusterError, ClusterHandlers, TokenIdentity, pod_meta

log = logging.getLogger(__name__)


class InMemoryCluster:
    """A cluster double: pods in a dict, Bindings set `spec.nodeName`, Events kept in a list.

    With `learn_pods` (local mode), a pod it does not have is learned from the first request that
    names it (`learn_pod`; later requests do not change it) and kept once bound; without it (a
    stand-in for an API server in tests) only `add_pod` creates pods. `state_file` keeps the bound
    pods across restarts. `fail_bind` makes the next Bindings fail (tests).
    """

    def __init__(self, tokens: Mapping[str, TokenIdentity] | None = None, *, learn_pods: bool = True,
                 state_file: str = "", learned_max: int = LEARNED_MAX, state_file_reset: bool = False) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.learn_pods = learn_pods
        self.learned_max = learned_max
        self.state_file = state_file
        self._learned: OrderedDict[tuple[str, str], Mapping[str, Any]] = OrderedDict()
        self.node_annotations: dict[str, dict[str, str]] = {}
        self.events: list[tuple[str, str, str, bool]] = []  # (namespace/name, reason, message, warning)
        self.tokens: dict[str, TokenIdentity] = dict(tokens or {})
        self.fail_bind = False
        #: the phase a Binding leaves: local mode has no kubelet, so a bound pod counts as running (a test
        #: standing in for an API server sets "Pending": the kubelet, not the Binding, moves it)
        self.bound_phase = "Running"
        self.evictions: list[str] = []  # namespace/name, in order
        self.deleted_nodes: list[str] = []
        self._handlers: ClusterHandlers | None = None
        self._synced = False
        self._lock = threading.Lock()
        self.state_problem = ""  # the state file is damaged: nothing may be bound (extender/kube/statefile.py)
        self.state_write_error = ""  # the last write of the state file failed (cleared by the next good one)
        self.state_write_failures = 0
        self._journal: journal.Journal | None = None  # each change one appended line (extender/kube/journal.py)
        self._state_bytes = 0  # the state file's size when last written (the journal is folded in past it)
        if state_file:
            self._load(Path(state_file), state_file_reset)

    def _load(self, path: Path, reset: bool) -> None:
        """The bound pods from the state file. A damaged one is never replaced silently: it is kept
        (copied aside) and `state_problem` keeps the extender not ready, unless `reset` (the admin's
        `--state-file-reset`) moves it aside and starts empty. No file: written empty at once, so an
        unwritable place shows at start (`state_write_error`), not at the first bind."""
        for tmp in statefile.remove_temporaries(path):  # a write killed midway (kill -9 during a bind)
            log.warning("state file %s: removed %s, left by an interrupted write", path, tmp.name)
        try:
            pods = statefile.read(path)
            if pods is None and journal.path_of(path).exists():
                raise statefile.StateFileDamaged(path, f"is missing but its journal {journal.path_of(path).name} "
                                                       "is there: restore the file, or remove both to start empty")
            replayed, journal_bytes = journal.replay(path, pods or [])
            pods = None if pods is None else replayed
        except statefile.StateFileDamaged as err:
            if reset:
                try:
                    if journal.path_of(path).exists() or journal.path_of(path).is_symlink():
                        statefile.move_aside(journal.path_of(path))  # its changes are to the damaged file
                    moved = statefile.move_aside(path) if path.exists() or path.is_symlink() else path
                except OSError as move_err:
                    self.state_problem = (f"state file {path} is damaged ({err.reason}) and could not be moved "
                                          f"aside for --state-file-reset: {move_err}")
                    log.error("%s", self.state_problem)
                    return
                log.warning("state file %s damaged (%s): moved to %s, starting empty (--state-file-reset)",
                            path, err.reason, moved)
                pods, journal_bytes = None, 0
            else:
                try:
                    kept = statefile.keep_aside(err.path)
                    where = f"a copy is kept as {kept}" if kept else "left as it is"
                except OSError as copy_err:
                    where = f"not copied aside ({copy_err}); left in place"
                self.state_problem = (
                    f"state file {path} is damaged: {err.reason}; {where}. Nothing is bound until you restore "
                    f"a good copy at {path} or restart with --state-file-reset (DEEPRES_STATE_FILE_RESET=true) "
                    "to move it aside and start with no bound pods")
                log.error("%s", self.state_problem)
                return
        self._journal = journal.Journal(path, journal_bytes)
        self._state_bytes = path.stat().st_size if pods is not None and path.is_file() else 0
        for pod in pods or []:
            self.pods[pod_meta(pod)[:2]] = pod
        with self._lock:
            if pods is None or self._journal.wants_compaction(self._state_bytes):  # a first start, or fold it in
                self._save()
        if pods is not None:
            log.info("state file %s: %d bound pods (%d journal bytes folded in)", path, len(pods), journal_bytes)

    def _save(self, key: tuple[str, str] | None = None) -> str:
        """Record the change to the pod at `key` (lock held), durably: one line appended to the journal,
        or the whole file rewritten (`key` None, or the journal grown past the file: extender/kube/journal.py);
        the error, or "" once written. A damaged state file is never written over."""
        if not self.state_file or self.state_problem or self._journal is None:
            return ""
        try:
            if key is not None and not self._journal.wants_compaction(self._state_bytes):
                pod = self.pods.get(key)
                bound = pod is not None and bool((pod.get("spec") or {}).get("nodeName"))
                self._journal.append(journal.record(pod if bound else None, key))
            else:
                bound_pods = [p for p in self.pods.values() if (p.get("spec") or {}).get("nodeName")]
                self._state_bytes = statefile.write(Path(self.state_file), bound_pods)
                self._journal.emptied()
        except OSError as err:
            self.state_write_failures += 1
            self.state_write_error = f"state file {self.state_file} not written: {err}"
            log.error("%s", self.state_write_error)
            return self.state_write_error
        if self.state_write_error:
            log.warning("state file %s written again", self.state_file)
            self.state_write_error = ""
        return ""

    def start(self, handlers: ClusterHandlers) -> None:
        self._handlers = handlers
        with self._lock:
            pods = [copy.deepcopy(p) for p in self.pods.values()]
        handlers.pods_listed(pods)
        self._synced = True

    def synced(self) -> bool:
        return self._synced

    def stop(self) -> None:
        self._handlers = None

    def add_pod(self, pod: Mapping[str, Any]) -> None:
        ns, name, _ = pod_meta(pod)
        with self._lock:
            self.pods[(ns, name)] = copy.deepcopy(dict(pod))

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            pod = self.pods.get((namespace, name)) or self._learned.get((namespace, name))
            return copy.deepcopy(dict(pod)) if pod is not None else None

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get_pod(namespace, name)

    def watched_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The stored pod (this double is its own watch); never one only learned from a request."""
        with self._lock:
            pod = self.pods.get((namespace, name))
            return copy.deepcopy(pod) if pod is not None else None

    def learn_pod(self, pod: Mapping[str, Any]) -> None:
        if not self.learn_pods:
            return
        key = pod_meta(pod)[:2]
        with self._lock:
            if key in self.pods or key in self._learned:
                return
            self._learned[key] = pod  # copied when it is first changed (_stored): a filter costs no copy
            while len(self._learned) > self.learned_max:
                self._learned.popitem(last=False)

    def patch_node_annotations(self, node: str, annotations: Mapping[str, str]) -> None:
        with self._lock:
            self.node_annotations.setdefault(node, {}).update(annotations)

    def _stored(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        """The pod as this cluster has it (lock held): known, learned, or (learning) the one given."""
        key = pod_meta(pod)[:2]
        stored = self.pods.get(key)
        if stored is None:
            learned = self._learned.pop(key, None)
            if learned is None and not self.learn_pods:
                raise ClusterError(f"pod {key[0]}/{key[1]} not found")
            stored = copy.deepcopy(dict(learned if learned is not None else pod))
            self.pods[key] = stored
        return stored

    def bind(self, pod: Mapping[str, Any], node: str, annotations: Mapping[str, str] | None = None) -> None:
        if self.fail_bind:
            raise ClusterError("create binding: injected failure")
        ns, name, uid = pod_meta(pod)
        with self._lock:
            if self.state_problem:
                raise ClusterError(f"create binding: {self.state_problem}")
            key = (ns, name)
            learned = self._learned.get(key)
            before = copy.deepcopy(self.pods[key]) if key in self.pods else None
            stored = self._stored(pod)
            meta = stored.setdefault("metadata", {})
            stored_uid = str(meta.get("uid") or "")
            if uid and stored_uid and stored_uid != uid:
                raise ClusterError(f"create binding: pod {ns}/{name} has uid {stored_uid}, not {uid}")
            spec = stored.setdefault("spec", {})
            if spec.get("nodeName"):
                raise ClusterError(f"create binding: pod {ns}/{name} is already assigned to {spec['nodeName']}")
            if meta.get("deletionTimestamp"):
                raise ClusterError(f"create binding: pod {ns}/{name} is being deleted")
            spec["nodeName"] = node
            if annotations:
                meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
            stored.setdefault("status", {})["phase"] = self.bound_phase
            failed = self._save(key)
            if failed:  # in local mode the file is the Binding's only record: no record, no Binding
                if before is not None:
                    self.pods[key] = before
                else:
                    del self.pods[key]
                    if learned is not None:
                        self._learned[key] = learned
                raise ClusterError(f"create binding: {failed}")
        handlers = self._handlers
        if handlers is not None:
            handlers.pod_changed(self.get_pod(ns, name) or {}, False)

    def delete_pod(self, namespace: str, name: str) -> None:
        with self._lock:
            pod = self.pods.pop((namespace, name), None)
            self._learned.pop((namespace, name), None)
            self._save((namespace, name))
        if pod is not None and self._handlers is not None:
            self._handlers.pod_changed(pod, True)

    def finish_pod(self, namespace: str, name: str, phase: str = "Succeeded") -> None:
        with self._lock:
            pod = self.pods[(namespace, name)]
            pod.setdefault("status", {})["phase"] = phase
            snapshot = copy.deepcopy(pod)
            self._save((namespace, name))
        if self._handlers is not None:
            self._handlers.pod_changed(snapshot, False)

    def forget_pod(self, namespace: str, name: str) -> None:
        """Drop a pod without telling the handlers (local mode: its reservation expired)."""
        with self._lock:
            self.pods.pop((namespace, name), None)
            self._learned.pop((namespace, name), None)
            self._save((namespace, name))

    def delete_node(self, name: str) -> None:
        self.deleted_nodes.append(name)
        if self._handlers is not None:
            self._handlers.node_deleted(name)

    def event(self, pod: Mapping[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        ns, name, _ = pod_meta(pod)
        with self._lock:
            self.events.append((f"{ns}/{name}", reason, message, warning))
            del self.events[:-1000]

    def evict(self, namespace: str, name: str, uid: str) -> None:
        with self._lock:
            pod = self.pods.get((namespace, name))
            if pod is None or (uid and (pod.get("metadata") or {}).get("uid") not in (None, "", uid)):
                raise ClusterError(f"evict pod {namespace}/{name}: not found")
        self.evictions.append(f"{namespace}/{name}")
        self.delete_pod(namespace, name)

    def review_token(self, token: str, audience: str) -> TokenIdentity | None:
        identity = self.tokens.get(token)
        if identity is None or (identity.audiences and audience not in identity.audiences):
            return None
        return identity
