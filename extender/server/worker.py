"""The extender's background worker: what a request must not wait on or do itself."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

log = logging.getLogger(__name__)


class Worker:
    """One background thread for what the verbs must not wait on or do in a request: evictions
    (re-checked against the API server first) and Node nudges. Tasks carry a key; a key already
    queued is not queued twice, and the queue is bounded (a task that does not fit is dropped, and
    the next filter of its pod asks again)."""

    def __init__(self, name: str = "deepres-worker", limit: int = 1_024) -> None:
        self._tasks: OrderedDict[str, Callable[[], None]] = OrderedDict()
        self._cond = threading.Condition()
        self._busy = False
        self._limit = limit
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, key: str, task: Callable[[], None]) -> bool:
        with self._cond:
            if key in self._tasks or len(self._tasks) >= self._limit:
                return False
            self._tasks[key] = task
            self._cond.notify()
            return True

    def drain(self, timeout_s: float = 10.0) -> bool:
        """Wait until every task queued so far has run (tests, shutdown)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._tasks or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._tasks:
                    self._cond.wait()
                _, task = self._tasks.popitem(last=False)
                self._busy = True
            try:
                task()
            except Exception:  # a bug in one task must not stop the others
                log.exception("background task failed")
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
