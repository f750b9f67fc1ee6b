"""Events on pods: best effort, off the request path (a bounded worker), warnings once per pod and message."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from extender.kube.cluster import Cluster
from extender.server.worker import Worker

WARNED_MAX = 10_000
#: Events waiting to be sent at most; more are dropped (events are best effort).
EVENTS_QUEUED_MAX = 4_096


class PodEvents:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        # a bind answers without waiting for its event
        self.worker = Worker("deepres-events", limit=EVENTS_QUEUED_MAX)
        self._warned: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, raw_pod: Mapping[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        """An Event on the pod, sent by the events worker (dropped when EVENTS_QUEUED_MAX are waiting)."""
        meta = {k: v for k, v in (raw_pod.get("metadata") or {}).items() if k in ("namespace", "name", "uid")}
        target = {"metadata": meta}

        def send() -> None:
            self.cluster.event(target, reason, message, warning=warning)

        self.worker.submit(f"{meta.get('uid') or meta.get('name')}/{reason}/{message}", send)

    def warn_once(self, raw_pod: Mapping[str, Any], uid: str, reason: str, message: str) -> None:
        """A Warning event on the pod, once per pod and message (kube-scheduler retries often)."""
        key = (uid, message)
        with self._lock:
            if key in self._warned:
                return
            self._warned[key] = None
            while len(self._warned) > WARNED_MAX:
                self._warned.popitem(last=False)
        self.record(raw_pod, reason, message, warning=True)
