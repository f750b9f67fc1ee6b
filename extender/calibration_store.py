"""The live online calibration's state: the pods deepres placed, where, with what offline point, and the
highest peak the agent reported for each; the shifts `extender.policy.calibration` learns from them.

The ledger owns one (`Ledger.calibration`) and feeds it the per-GPU peaks of its usage rule (the
same readings, already refused when 0 or above the GPU's capacity); the binder records each
placement (`placed`). Reads of the learned shifts take a snapshot that is recomputed only after a
pod's peak changed. Under its own small lock, never calling back into the ledger.

Kept across restarts:
- local mode: a JSON file (`path`: `<state file>.calibration.json`), written atomically (temporary
  file, fsync, rename) when a pod shows its first peak and at most every SAVE_EVERY_S otherwise. A
  file that does not read is kept aside and the store starts empty (the calibration is then
  relearned from new pods: never unsafe, a key without a shift admits at the offline bound);
- with the API server: a `Keeper` (extender/kube/calibration_configmap.py: a ConfigMap) on a thread of
  its own, so no verb and no telemetry report ever waits on the API: it reads what was kept first
  (retried with backoff; nothing is written before that read succeeded, so a failed read never
  overwrites what was learned), merges it with the pods placed meanwhile, then writes at most every
  KEEPER_EVERY_S after a peak changed, the KEPT_PODS_MAX most recent observed pods (bounded size).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from extender.policy.calibration import PATHS, Key, Observation, Shift, learn

log = logging.getLogger(__name__)

FORMAT = "deepres-calibration"
VERSION = 1
#: Pods remembered (the most recent placements); the policy's window is smaller.
PODS_MAX = 20_000
#: A peak that grew is written at most this often (a pod's first peak is written at once).
SAVE_EVERY_S = 5.0
#: The shifts are learned again at most this often after peaks grew (a filter reads them); at once
#: after a pod's first peak.
RELEARN_EVERY_S = 1.0
#: A keeper (the ConfigMap) is written at most this often, after a peak changed.
KEEPER_EVERY_S = 10.0
#: Observed pods a keeper keeps (the most recent): the policy's WINDOW of 200 for 10 keys, about
#: 200 bytes each (a ConfigMap holds 1 MiB at most).
KEPT_PODS_MAX = 2_000
#: Retries of a keeper's first read, from 1 s doubling to this.
KEEPER_BACKOFF_MAX_S = 60.0


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


class CalibrationStore:
    """Placements and peaks -> learned shifts per (GPU model, node software, path)."""

    def __init__(self, path: str = "", monotonic: Callable[[], float] | None = None,
                 keeper: Keeper | None = None) -> None:
        import time

        self.path = Path(path) if path else None
        self.keeper = keeper
        self._mono = monotonic or time.monotonic
        self._lock = threading.Lock()
        self._pods: OrderedDict[str, Placed] = OrderedDict()
        self._order = 0.0
        self._shifts: dict[Key, Shift] = {}
        self._dirty = False
        self._unsaved = False
        self._saved_s = float("-inf")
        self._learned_s = float("-inf")
        self._new_pod = False  # a pod showed its first peak since the last learning: learn at the next read
        self.load_problem = ""
        self.keeper_read = False  # the keeper's content was read (or found empty): writes may start
        self._wake = threading.Event()
        self._stop = threading.Event()
        if self.path is not None:
            self._load(self.path)
        if keeper is not None:
            threading.Thread(target=self._keep, name="deepres-calibration-keeper", daemon=True).start()

    # ---- writes ----
    def placed(self, pod_uid: str, node: str, gpu_model: str, software: str, path: str, point_mib: float,
               upper_mib: float, regime: str = "") -> None:
        """A pod deepres bound: its offline point and bound on this GPU model (before calibration)."""
        if not pod_uid or not gpu_model or path not in PATHS or not point_mib > 0:
            return
        with self._lock:
            if pod_uid in self._pods:
                return
            self._order += 1.0
            self._pods[pod_uid] = Placed(node, gpu_model, software, path, float(point_mib), self._order,
                                          upper_mib=float(upper_mib), regime=regime)
            while len(self._pods) > PODS_MAX:
                self._pods.popitem(last=False)
                self._dirty = True

    def observe(self, pod_uid: str, peak_mib: float) -> None:
        """A peak (MiB per GPU) the agent reported for a placed pod; the highest one counts."""
        with self._lock:
            pod = self._pods.get(pod_uid)
            if pod is None or not peak_mib > pod.peak_mib:
                return
            first = pod.peak_mib <= 0
            self._pods[pod_uid] = replace(pod, peak_mib=float(peak_mib))
            self._dirty = self._unsaved = True
            self._new_pod = self._new_pod or first
            now = self._mono()
            if self.path is not None and (first or now - self._saved_s >= SAVE_EVERY_S):
                self._save(self.path, now)
        if self.keeper is not None:
            self._wake.set()

    def flush(self) -> None:
        """Write what is not written yet (shutdown)."""
        with self._lock:
            if self.path is not None and self._unsaved:
                self._save(self.path, self._mono())

    def stop(self) -> None:
        """End the keeper's thread (tests)."""
        self._stop.set()
        self._wake.set()

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
                if not self._unsaved:
                    continue
                self._unsaved = False
                payload = self._payload(kept_only=True)
            try:
                self.keeper.write(payload, self._merged_payload)
            except Exception as err:
                with self._lock:
                    self._unsaved = True
                self._wake.set()  # tried again after KEEPER_EVERY_S
                log.warning("calibration: writing %s failed (%s); learning goes on in memory, retried in %.0f s",
                            self.keeper.where, err, KEEPER_EVERY_S)

    def _merged_payload(self, kept: dict[str, Any]) -> dict[str, Any]:
        """Another writer's payload merged into ours (a conflict), and ours to write now."""
        self.merge(kept, source=f"{self.keeper.where if self.keeper else ''} (conflict)")
        with self._lock:
            return self._payload(kept_only=True)

    def merge(self, payload: dict[str, Any], source: str = "") -> int:
        """Pods of a kept payload merged in: unknown ones added (older than any placed since the start),
        known ones keep the higher peak. A payload that does not read is refused (logged, 0)."""
        problem = _file_problem(payload)
        if problem:
            log.error("calibration: %s: %s; not used", source, problem)
            return 0
        loaded = {uid: Placed(**fields) for uid, fields in payload["pods"].items()}
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
            self._dirty = self._new_pod = True
        log.info("calibration: %d observed pods read from %s", len(loaded), source)
        return len(loaded)

    def _payload(self, *, kept_only: bool = False) -> dict[str, Any]:
        pods = list(self._pods.items())
        if kept_only:
            pods = [(uid, p) for uid, p in pods if p.peak_mib > 0][-KEPT_PODS_MAX:]
        return {"format": FORMAT, "version": VERSION, "pods": {uid: asdict(p) for uid, p in pods}}

    # ---- reads ----
    def shifts(self) -> Mapping[Key, Shift]:
        with self._lock:
            now = self._mono()
            if self._dirty and (self._new_pod or now - self._learned_s >= RELEARN_EVERY_S):
                self._learned_s, self._new_pod = now, False
                self._shifts = learn(Observation(uid, p.node, p.gpu_model, p.software, p.path, p.point_mib,
                                                 p.peak_mib, p.order, p.upper_mib, p.regime)
                                     for uid, p in self._pods.items() if p.peak_mib > 0)
                self._dirty = False
            return self._shifts

    def pods_seen(self) -> dict[Key, int]:
        """Pods with a peak per key (before the node screen)."""
        with self._lock:
            counts: dict[Key, int] = {}
            for p in self._pods.values():
                if p.peak_mib > 0:
                    key = (p.gpu_model, p.software, p.path)
                    counts[key] = counts.get(key, 0) + 1
            return counts

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
        problem = _file_problem(data)
        if problem:
            self._keep_aside(path, problem)
            return
        for uid, fields in data["pods"].items():
            self._pods[uid] = Placed(**fields)
            self._order = max(self._order, float(fields["order"]))
        self._dirty = True
        log.info("calibration: %d placed pods read from %s", len(self._pods), path)

    def _keep_aside(self, path: Path, problem: str) -> None:
        self.load_problem = problem
        aside = path.with_name(path.name + ".damaged")
        with contextlib.suppress(OSError):
            os.replace(path, aside)
        log.error("calibration file %s: %s; kept aside as %s, starting empty", path, problem, aside)

    def _save(self, path: Path, now: float) -> None:
        payload = self._payload()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
            with os.fdopen(fd, "w") as handle:
                json.dump(payload, handle, separators=(",", ":"))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except OSError as err:  # learning goes on in memory; the next save retries
            log.warning("calibration file %s not written: %s", path, err)
            return
        self._saved_s, self._unsaved = now, False


def _file_problem(data: Any) -> str:
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
        return f"not a {FORMAT} version {VERSION} file"
    pods = data.get("pods")
    if not isinstance(pods, dict):
        return "'pods' must be an object"
    for uid, fields in pods.items():
        if not isinstance(fields, dict) or set(fields) - {"regime"} != {
                "node", "gpu_model", "software", "path", "point_mib", "order", "peak_mib", "upper_mib"}:
            return (f"pods[{uid!r}]: fields must be node, gpu_model, software, path, point_mib, order, peak_mib, "
                    "upper_mib (and regime)")
        numbers = ("point_mib", "order", "peak_mib", "upper_mib")
        texts = ("node", "gpu_model", "software", "path", "regime")
        if not all(isinstance(fields.get(k, ""), str) for k in texts) or not all(
                isinstance(fields[k], int | float) and fields[k] >= 0 for k in numbers):
            return f"pods[{uid!r}]: bad field types"
    return ""
