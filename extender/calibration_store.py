"""The live online calibration's state: the pods deepres placed, where, with what offline point, and the
highest peak the agent reported for each; the shifts `extender.policy.calibration` learns from them.

The ledger owns one (`Ledger.calibration`) and feeds it the per-GPU peaks of its usage rule (the
same readings, already refused when 0 or above the GPU's capacity); the binder records each
placement (`placed`). Reads of the learned shifts take a snapshot that is recomputed only after a
pod's peak changed. Under its own small lock, never calling back into the ledger.

Kept across restarts in a JSON file (`path`; in local mode next to the state file:
`<state file>.calibration.json`), written atomically (temporary file, fsync, rename) when a pod
shows its first peak and at most every SAVE_EVERY_S otherwise. A file that does not read is kept
aside and the store starts empty (the calibration is then relearned from new pods: never unsafe,
a key without a shift admits at the offline bound).
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
from typing import Any

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

    def __init__(self, path: str = "", monotonic: Callable[[], float] | None = None) -> None:
        import time

        self.path = Path(path) if path else None
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
        if self.path is not None:
            self._load(self.path)

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

    def flush(self) -> None:
        """Write what is not written yet (shutdown)."""
        with self._lock:
            if self.path is not None and self._unsaved:
                self._save(self.path, self._mono())

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
        payload = {"format": FORMAT, "version": VERSION, "pods": {uid: asdict(p) for uid, p in self._pods.items()}}
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
