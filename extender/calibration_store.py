"""The live online calibration's state: the pods deepres placed, where, for whom, with what offline point,
and the highest peak the agent reported for each; the shifts `extender.policy.calibration` learns from them.

The ledger owns one (`Ledger.calibration`) and feeds it the per-GPU peaks of its usage rule (a reading
of 0 or above the GPU's capacity is no reading), with how long the pod has run (`settle_s`: a pod
counts once it ran long enough to have reached its peak); the binder records each placement
(`placed`), with the pod's namespace and owning controller (the policy screens owners as it screens
nodes). Under its own small lock, never calling back into the ledger while holding it.

Learning is off the request path: a background thread (`start`) learns the keys whose pods changed,
at most every LEARN_EVERY_S, only from pods of nodes that report GPUs now (`nodes`, given by the
ledger: a pod of a node never seen, as a forged file may hold, is no observation), and publishes an
immutable snapshot that `shifts()` returns without a lock. No verb, no /metrics scrape and no
telemetry report waits on a fit; `observe` only records the reading. The learner shares the verbs'
interpreter (the GIL), so it spreads its work: after each key's fit it waits LEARN_PAUSE times the
fit's CPU time, and it encodes the file ENCODE_CHUNK pods at a time, letting the verbs run between.

Kept across restarts:
- local mode: a JSON file (`path`: `<state file>.calibration.json`) with the sha256 of its pods
  (`{"format": "deepres-calibration", "version": 2, "sha256": ..., "pods": {...}}`), written
  atomically (temporary file, fsync, rename) by the background thread, never under a lock a verb or a
  report takes: after a pod's first peak at the next round (about a second), after a grown peak at
  most every SAVE_EVERY_S, and by `flush()` at a clean shutdown (`start` registers it). A file that
  does not read (damaged, altered, or a version 1 file without a checksum) is kept aside and the
  store starts empty (the calibration is then relearned from new pods: never unsafe, a key without a
  shift admits at the offline bound);
- with the API server: a `Keeper` (extender/kube/calibration_configmap.py: a ConfigMap) on a thread of
  its own, so no verb and no telemetry report ever waits on the API: it reads what was kept first
  (retried with backoff; nothing is written before that read succeeded, so a failed read never
  overwrites what was learned), merges it with the pods placed meanwhile, then writes at most every
  KEEPER_EVERY_S after a peak changed, the KEPT_PODS_MAX most recent observed pods (bounded size),
  and once more at `flush()`.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import multiprocessing.util
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

from extender.kube.statefile import write_atomically
from extender.policy.calibration import PATHS, Key, Observation, Shift, learn

log = logging.getLogger(__name__)

FORMAT = "deepres-calibration"
VERSION = 2
#: Pods remembered (the most recent placements); the policy's window is smaller.
PODS_MAX = 20_000
#: A peak that grew is written at most this often (a pod's first peak at the learner's next round).
SAVE_EVERY_S = 5.0
#: The shifts are learned again at most this often after a pod showed its first peak or settled (off
#: the request path)...
LEARN_EVERY_S = 1.0
#: ...and a key whose pods' peaks only grew, at most this often (a peak grows early in a pod's life; a
#: fit of a full key is ~25-50 ms of CPU, taken from the verbs' interpreter while it runs).
GROWN_EVERY_S = 5.0
RELEARN_EVERY_S = LEARN_EVERY_S  # the name before
#: After each key's fit the learner waits this many times the fit's CPU time (at most LEARN_PAUSE_MAX_S):
#: it holds the interpreter (the GIL) at most a fifth of the time, and a verb arriving during a round
#: waits on one fit at most (10 keys fitted back to back held it for ~100 ms: measured, /filter's p99
#: then rose by tens of ms on a busy 2-CPU machine).
LEARN_PAUSE = 4.0
LEARN_PAUSE_MAX_S = 0.25
#: The learner looks at which nodes report GPUs (and with what software) at least this often; a node
#: reporting for the first time wakes it at once.
NODES_EVERY_S = 10.0
#: A keeper (the ConfigMap) is written at most this often, after a peak changed.
KEEPER_EVERY_S = 10.0
#: Observed pods a keeper keeps (the most recent): the policy's WINDOW of 200 for 10 keys, about
#: 250 bytes each (a ConfigMap holds 1 MiB at most).
KEPT_PODS_MAX = 2_000
#: Retries of a keeper's first read, from 1 s doubling to this.
KEEPER_BACKOFF_MAX_S = 60.0
#: Longest text field kept per pod (node, GPU model, software, namespace, owner): longer is cut.
MAX_TEXT = 256

REQUIRED = frozenset({"node", "gpu_model", "software", "path", "point_mib", "order", "peak_mib", "upper_mib"})
OPTIONAL = frozenset({"regime", "tenant", "owner", "settled"})

#: What the ledger tells the learner: the nodes that report GPUs now, and how many report each
#: (GPU model, node software).
NodesNow = tuple[frozenset[str], Mapping[tuple[str, str], int]]


class Keeper(Protocol):
    """Where the pods are kept with the API server (extender/kube/calibration_configmap.py)."""

    where: str

    def read(self) -> dict[str, Any] | None:
        """The kept payload; None when nothing is kept yet. Raises on any failure to read."""

    def write(self, payload: dict[str, Any], merge: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        """Keep `payload`; on a conflict (another writer since our read) the kept payload is passed to
        `merge`, whose answer is written instead. Raises when it could not."""


@dataclass(frozen=True)
class Placed:
    """One placed pod: an `Observation` without a peak until the agent reports one."""

    node: str
    gpu_model: str
    software: str
    path: str
    point_mib: float
    order: float
    peak_mib: float = 0.0
    upper_mib: float = 0.0  # the offline bound it was placed with
    regime: str = ""  # its batch regime (extender.policy.calibration.regime)
    tenant: str = ""  # its namespace
    owner: str = ""  # the controller that owns it ("owner/<uid>"), "pod/<ns>/<name>" without one
    settled: bool = False  # it ran long enough (`CalibrationStore.settle_s`) to have reached its peak

    @property
    def key(self) -> Key:
        return (self.gpu_model, self.software, self.path)


def _cut(text: str) -> str:
    return text[:MAX_TEXT]


class CalibrationStore:
    """Placements and peaks -> learned shifts per (GPU model, node software, path)."""

    def __init__(self, path: str = "", monotonic: Callable[[], float] | None = None,
                 keeper: Keeper | None = None, settle_s: float = 0.0) -> None:
        # `monotonic` is kept for callers; the store's pacing is real time (a thread's, not the verbs')
        del monotonic
        self.path = Path(path) if path else None
        self.keeper = keeper
        self.settle_s = settle_s
        #: the nodes reporting GPUs now (set by the ledger); None: every pod counts (no ledger)
        self.nodes: Callable[[], NodesNow] | None = None
        self._lock = threading.Lock()
        self._pods: OrderedDict[str, Placed] = OrderedDict()
        self._order = 0.0
        self._seen: dict[Key, int] = {}  # pods with a peak per key
        self._dirty: set[Key] = set()  # keys whose pods' peaks grew
        self._urgent: set[Key] = set()  # keys with a new observation (a first peak, a pod settled)
        self._grown_s = float("-inf")  # when keys whose peaks only grew were last learned
        self._all_dirty = False
        self._changes = 0  # changes to the pods, counted: saved and kept compare theirs with it
        self._saved_changes = 0
        self._kept_changes = 0
        self._first_unsaved = False  # a pod showed its first peak since the last save
        self._saved_s = float("-inf")
        self._learned_s = float("-inf")
        self._nodes_s = float("-inf")
        self._nodes_changed = False
        self._nodes_used: NodesNow | None = None
        self._shifts: Mapping[Key, Shift] = MappingProxyType({})
        self._save_lock = threading.Lock()
        self._learn_lock = threading.Lock()
        self._wake = threading.Event()  # the keeper's
        self._learner_wake = threading.Event()
        self._stop = threading.Event()
        self._started = False
        self.learnings = 0  # learnings run (each over the keys whose pods changed)
        self.load_problem = ""
        self.keeper_read = False  # the keeper's content was read (or found empty): writes may start
        if self.path is not None:
            self._load(self.path)
        if keeper is not None:
            threading.Thread(target=self._keep, name="deepres-calibration-keeper", daemon=True).start()

    # ---- the background learner ----
    def start(self) -> None:
        """Start the learner thread (learning and file writes off the request path) and register
        `flush` for a clean shutdown (atexit, and multiprocessing's exit of a server worker)."""
        if self._started:
            return
        self._started = True
        ref = weakref.ref(self)
        threading.Thread(target=_learner, args=(ref,), name="deepres-calibration-learner", daemon=True).start()

        def flush_at_exit() -> None:
            store = ref()
            if store is not None:
                store.flush()

        atexit.register(flush_at_exit)
        multiprocessing.util.Finalize(self, flush_at_exit, exitpriority=10)

    def nodes_changed(self) -> None:
        """A node reported for the first time (the ledger): the learner looks at the nodes again now."""
        self._nodes_changed = True
        self._learner_wake.set()

    def _round(self) -> float:
        """One round of the learner: learn the changed keys (at most every LEARN_EVERY_S), write the
        file when due. Returns how long to wait before the next round at most."""
        now = time.monotonic()
        wait = 1.0
        grown = bool(self._dirty) and now - self._grown_s >= GROWN_EVERY_S
        if self._nodes_changed or now - self._nodes_s >= NODES_EVERY_S or self._urgent or self._all_dirty or grown:
            since = now - self._learned_s
            if since >= LEARN_EVERY_S:
                self.learn_now(grown=grown)
            else:
                wait = min(wait, LEARN_EVERY_S - since)
        elif self._dirty:
            wait = min(wait, GROWN_EVERY_S - (now - self._grown_s))
        if self.path is not None and self._changes != self._saved_changes:
            since = now - self._saved_s
            if self._first_unsaved or since >= SAVE_EVERY_S:
                self.save_now()
            else:
                wait = min(wait, SAVE_EVERY_S - since)
        return max(wait, 0.01)

    def learn_now(self, grown: bool = True) -> None:
        """Learn the keys with a new observation, those whose peaks grew (`grown`), all of them when the
        nodes reporting changed, and publish the new snapshot (after each key: a reader sees each key
        whole). The learner calls it; tests may too. Between keys it lets other threads run."""
        with self._learn_lock:
            self._nodes_changed = False
            nodes = self.nodes() if self.nodes is not None else None
            now = time.monotonic()
            self._nodes_s = now
            with self._lock:
                if nodes is not None and nodes != self._nodes_used:
                    self._all_dirty = True
                    self._nodes_used = nodes
                if self._all_dirty or grown:
                    grown = True
                    self._grown_s = now
                keys = set(self._urgent)
                keys |= set(self._seen) | set(self._shifts) if self._all_dirty else set(self._dirty) if grown else set()
                self._urgent.clear()
                if grown:
                    self._dirty.clear()
                self._all_dirty = False
                if not keys:
                    return
                pods = list(self._pods.items())
                self._learned_s = now
            known = nodes[0] if nodes is not None else None
            by_key: dict[Key, list[Observation]] = {}
            for uid, p in pods:
                if p.peak_mib > 0 and p.key in keys and (known is None or p.node in known):
                    by_key.setdefault(p.key, []).append(Observation(
                        uid, p.node, p.gpu_model, p.software, p.path, p.point_mib, p.peak_mib, p.order, p.upper_mib,
                        p.regime, p.tenant, p.owner, p.settled))
            for key in keys:
                began = time.thread_time()
                learned = learn(by_key.get(key, ()), nodes_of=nodes[1] if nodes is not None else None)
                shifts = {k: v for k, v in self._shifts.items() if k != key}
                shifts.update(learned)
                self._shifts = MappingProxyType(shifts)  # one reference replaced: readers see old or new whole
                # the verbs' threads have the interpreter between two fits, for LEARN_PAUSE x the fit's CPU:
                # the keys of a round are spread out, a request waits on one fit at most, never a burst
                self._stop.wait(min(max(LEARN_PAUSE * (time.thread_time() - began), 0.001), LEARN_PAUSE_MAX_S))
            self.learnings += 1

    # ---- writes ----
    def placed(self, pod_uid: str, node: str, gpu_model: str, software: str, path: str, point_mib: float,
               upper_mib: float, regime: str = "", tenant: str = "", owner: str = "") -> None:
        """A pod deepres bound: its offline point and bound on this GPU model (before calibration), its
        namespace and the controller that owns it."""
        if not pod_uid or not gpu_model or path not in PATHS or not point_mib > 0:
            return
        with self._lock:
            if pod_uid in self._pods:
                return
            self._order += 1.0
            self._pods[pod_uid] = Placed(_cut(node), _cut(gpu_model), _cut(software), path, float(point_mib),
                                          self._order, upper_mib=float(upper_mib), regime=regime,
                                          tenant=_cut(tenant), owner=_cut(owner))
            while len(self._pods) > PODS_MAX:
                _, old = self._pods.popitem(last=False)
                if old.peak_mib > 0:
                    self._forget_seen(old.key)
                    self._urgent.add(old.key)
                self._changes += 1

    def _forget_seen(self, key: Key) -> None:
        left = self._seen.get(key, 0) - 1
        if left > 0:
            self._seen[key] = left
        else:
            self._seen.pop(key, None)

    def observe(self, pod_uid: str, peak_mib: float, ran_s: float = float("inf")) -> None:
        """A peak (MiB per GPU) the agent reported for a placed pod that has run `ran_s` since its bind;
        the highest one counts, and the pod counts once it has run `settle_s`. Only records: learning
        and writing are the background thread's."""
        with self._lock:
            pod = self._pods.get(pod_uid)
            if pod is None:
                return
            settled = pod.settled or ran_s >= self.settle_s
            grew = peak_mib > pod.peak_mib
            if not grew and settled == pod.settled:
                return
            first = pod.peak_mib <= 0 and grew
            if first:
                self._seen[pod.key] = self._seen.get(pod.key, 0) + 1
                self._first_unsaved = True
            self._pods[pod_uid] = replace(pod, peak_mib=max(float(peak_mib), pod.peak_mib), settled=settled)
            if (first and settled) or (settled and not pod.settled):
                self._urgent.add(pod.key)  # a new observation: learned at the next round
            else:
                self._dirty.add(pod.key)
            self._changes += 1
        self._learner_wake.set()
        if self.keeper is not None:
            self._wake.set()

    def flush(self) -> None:
        """Write what is not written yet (a clean shutdown): the file, and the keeper once its first
        read succeeded."""
        self.save_now()
        if self.keeper is not None and self.keeper_read:
            with self._lock:
                changes = self._changes
                if changes == self._kept_changes:
                    return
                pods = list(self._pods.items())
            payload = self._payload(pods)
            try:
                self.keeper.write(payload, self._merged_payload)
            except Exception as err:
                log.warning("calibration: writing %s at shutdown failed (%s)", self.keeper.where, err)
                return
            with self._lock:
                self._kept_changes = max(self._kept_changes, changes)

    def stop(self) -> None:
        """End the keeper's and the learner's threads (tests)."""
        self._stop.set()
        self._wake.set()
        self._learner_wake.set()

    # ---- the keeper (API server) ----
    def _keep(self) -> None:
        assert self.keeper is not None
        delay = 1.0
        while not self._stop.is_set():
            try:
                kept = self.keeper.read()
            except Exception as err:  # the API down, RBAC missing: learn in memory, write nothing yet
                log.error("calibration: reading %s failed (%s); retrying in %.0f s, nothing is written there "
                          "until it reads", self.keeper.where, err, delay)
                self._stop.wait(delay)
                delay = min(delay * 2.0, KEEPER_BACKOFF_MAX_S)
                continue
            if kept is not None:
                self.merge(kept, source=self.keeper.where)
            self.keeper_read = True
            break
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            if self._stop.wait(KEEPER_EVERY_S):  # debounce: one write for the peaks of this while
                return
            with self._lock:
                changes = self._changes
                if changes == self._kept_changes:
                    continue
                pods = list(self._pods.items())
            payload = self._payload(pods)
            try:
                self.keeper.write(payload, self._merged_payload)
            except Exception as err:
                self._wake.set()  # tried again after KEEPER_EVERY_S
                log.warning("calibration: writing %s failed (%s); learning goes on in memory, retried in %.0f s",
                            self.keeper.where, err, KEEPER_EVERY_S)
                continue
            with self._lock:
                self._kept_changes = max(self._kept_changes, changes)

    def _merged_payload(self, kept: dict[str, Any]) -> dict[str, Any]:
        """Another writer's payload merged into ours (a conflict), and ours to write now."""
        self.merge(kept, source=f"{self.keeper.where if self.keeper else ''} (conflict)")
        with self._lock:
            pods = list(self._pods.items())
        return self._payload(pods)

    def merge(self, payload: dict[str, Any], source: str = "") -> int:
        """Pods of a kept payload merged in: unknown ones added (older than any placed since the start),
        known ones keep the higher peak. A payload that does not read is refused (logged, 0)."""
        problem = _file_problem(payload, checksum_required=False)
        if problem:
            log.error("calibration: %s: %s; not used", source, problem)
            return 0
        loaded = {uid: _placed(fields) for uid, fields in payload["pods"].items()}
        with self._lock:
            top = max((p.order for p in loaded.values()), default=0.0)
            mine = list(self._pods.items())
            merged: dict[str, Placed] = dict(loaded)
            for uid, pod in mine:  # placed since the start: after the kept ones
                old = merged.get(uid)
                pod = replace(pod, order=pod.order + top)
                merged[uid] = pod if old is None or pod.peak_mib >= old.peak_mib else replace(old, order=pod.order)
            ordered = sorted(merged.items(), key=lambda item: item[1].order)[-PODS_MAX:]
            self._pods = OrderedDict(ordered)
            self._order = max((p.order for p in self._pods.values()), default=0.0)
            self._recount()
            self._all_dirty = True
            self._changes += 1
        self._learner_wake.set()
        log.info("calibration: %d observed pods read from %s", len(loaded), source)
        return len(loaded)

    def _recount(self) -> None:
        """`_seen` from the pods (lock held; a load or a merge)."""
        seen: dict[Key, int] = {}
        for p in self._pods.values():
            if p.peak_mib > 0:
                seen[p.key] = seen.get(p.key, 0) + 1
        self._seen = seen

    def _payload(self, pods: list[tuple[str, Placed]]) -> dict[str, Any]:
        """What a keeper keeps of `pods` (a copy taken under the lock; built outside it)."""
        kept = [(uid, p) for uid, p in pods if p.peak_mib > 0][-KEPT_PODS_MAX:]
        return {"format": FORMAT, "version": VERSION, "pods": {uid: asdict(p) for uid, p in kept}}

    # ---- reads (no lock for the shifts: the learner's published snapshot) ----
    def shifts(self) -> Mapping[Key, Shift]:
        return self._shifts

    def pods_seen(self) -> dict[Key, int]:
        """Pods with a peak per key (before any screen): kept as counts, never a walk over the pods."""
        with self._lock:
            return dict(self._seen)

    def software_for(self, gpu_model: str, path: str) -> str:
        """The node software with the most observed pods of this GPU model and path ("" when none)."""
        counts = {k[1]: n for k, n in self.pods_seen().items() if k[0] == gpu_model and k[2] == path}
        return max(counts, key=lambda s: (counts[s], s)) if counts else ""

    # ---- the file ----
    def _load(self, path: Path) -> None:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return
        except (OSError, UnicodeDecodeError, ValueError) as err:
            self._keep_aside(path, f"unreadable: {err}")
            return
        problem = _file_problem(data, checksum_required=True)
        if problem:
            self._keep_aside(path, problem)
            return
        for uid, fields in data["pods"].items():
            self._pods[uid] = _placed(fields)
            self._order = max(self._order, float(fields["order"]))
        self._recount()
        self._all_dirty = True
        log.info("calibration: %d placed pods read from %s", len(self._pods), path)

    def _keep_aside(self, path: Path, problem: str) -> None:
        self.load_problem = problem
        aside = path.with_name(path.name + ".damaged")
        with contextlib.suppress(OSError):
            os.replace(path, aside)
        log.error("calibration file %s: %s; kept aside as %s, starting empty", path, problem, aside)

    def save_now(self) -> bool:
        """Write the file now if anything changed since the last write (never under the store's lock
        while writing: a copy of the pods is taken under it). False when the write failed."""
        if self.path is None:
            return True
        with self._save_lock:
            with self._lock:
                changes = self._changes
                if changes == self._saved_changes:
                    return True
                pods = list(self._pods.items())
                self._first_unsaved = False
            try:
                _write(self.path, encode(pods))
            except OSError as err:  # learning goes on in memory; the next round retries
                log.warning("calibration file %s not written: %s", self.path, err)
                with self._lock:
                    self._first_unsaved = True
                return False
            with self._lock:
                self._saved_changes = max(self._saved_changes, changes)
                self._saved_s = time.monotonic()
            return True


def _learner(ref: weakref.ReferenceType[CalibrationStore]) -> None:
    """The learner thread: holds the store only while it works, so a store nobody uses is collected."""
    wait = 0.01
    while True:
        store = ref()
        if store is None or store._stop.is_set():
            return
        wake = store._learner_wake
        del store
        wake.wait(wait)
        wake.clear()
        store = ref()
        if store is None or store._stop.is_set():
            return
        try:
            wait = store._round()
        except Exception:  # never ends the learner: the next round tries again
            log.exception("calibration: the learner's round failed")
            wait = 1.0
        del store


#: Pods encoded between two yields of the interpreter while the file is written (one json.dumps of
#: 2,000 pods held the GIL ~6 ms, of 20,000 ~60 ms: a verb waited that long).
ENCODE_CHUNK = 250


def canonical(pods: list[tuple[str, Placed]]) -> bytes:
    """The checksummed payload: the pods by uid, as JSON with sorted keys and no spaces (the bytes of
    one json.dumps of them with sort_keys, made pod by pod: the learner's thread lets the verbs' threads
    run every ENCODE_CHUNK pods)."""
    parts = []
    by_uid = dict(pods)
    for n, uid in enumerate(sorted(by_uid)):
        if n and n % ENCODE_CHUNK == 0:
            time.sleep(0)  # (releases the GIL: a waiting verb takes it)
        parts.append(json.dumps(uid, ensure_ascii=True) + ":" + json.dumps(
            vars(by_uid[uid]), sort_keys=True, separators=(",", ":"), ensure_ascii=True))
    return ("{" + ",".join(parts) + "}").encode()


def encode(pods: list[tuple[str, Placed]]) -> bytes:
    payload = canonical(pods)
    head = json.dumps({"format": FORMAT, "version": VERSION, "sha256": hashlib.sha256(payload).hexdigest()})
    # the pods' canonical bytes go in verbatim, so the checksum is over exactly what is on disk
    return head[:-1].encode() + b', "pods": ' + payload + b"}\n"


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, data)  # the state file's atomic, durable replace


def _placed(fields: Mapping[str, Any]) -> Placed:
    checked: dict[str, Any] = {k: _cut(v) if isinstance(v, str) else v for k, v in fields.items()}
    return Placed(**checked)


def _file_problem(data: Any, *, checksum_required: bool) -> str:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return f"not a {FORMAT} file"
    if data.get("version") != VERSION or isinstance(data.get("version"), bool):
        return (f"version {data.get('version')!r}, not {VERSION} (a version 1 file has no checksum: the "
                "calibration is learned again)")
    pods = data.get("pods")
    if not isinstance(pods, dict):
        return "'pods' must be an object"
    digest = data.get("sha256")
    if checksum_required or digest is not None:
        found = hashlib.sha256(json.dumps(pods, sort_keys=True, separators=(",", ":"),
                                          ensure_ascii=True).encode()).hexdigest()
        if digest != found:
            return f"checksum mismatch (recorded {str(digest)[:16]!r}, content {found[:16]!r}): altered or damaged"
    for uid, fields in pods.items():
        if not isinstance(fields, dict) or not REQUIRED <= set(fields) <= REQUIRED | OPTIONAL:
            return (f"pods[{uid!r}]: fields must be {', '.join(sorted(REQUIRED))} (and "
                    f"{', '.join(sorted(OPTIONAL))})")
        numbers = ("point_mib", "order", "peak_mib", "upper_mib")
        texts = ("node", "gpu_model", "software", "path", "regime", "tenant", "owner")
        if not all(isinstance(fields.get(k, ""), str) for k in texts) or not all(
                isinstance(fields[k], int | float) and not isinstance(fields[k], bool) and fields[k] >= 0
                for k in numbers) or not isinstance(fields.get("settled", False), bool):
            return f"pods[{uid!r}]: bad field types"
    return ""
