"""Delivers reports to the extender without ever holding up sampling.

Sampling hands each report to `Reporter.submit`, which only appends to a bounded queue; a sender
thread posts to `<extender>/v1/telemetry`. A report is a full snapshot (pod peaks included), so when
several wait, only the newest is sent and the older ones are counted as superseded: after an outage
the extender gets the current state at once and sequence numbers reach it in increasing order.

Deltas (issue #48): once the extender answers an accepted report with `"deltas": true`, each next
report goes as a delta against the last one it accepted: only the GPUs whose readings changed (an
idle node's heartbeat carries none), `base_sequence` naming that report; the node's GPUs changing, a
restart (a new boot id), or any refusal sends a full report. A delta the extender cannot apply (it
restarted, forgot the node, or lost the base) is refused with `full_report_needed`, and the same
report goes again whole at once, without backoff. An extender that never says `"deltas": true`
(older ones) gets full reports only.

Failures: connection errors, timeouts and 5xx are retried with exponential backoff and jitter
(`backoff_s`); 401/403 also (the token may just have rotated: it is re-read). Any other 4xx, or a
200 saying `{"accepted": false}`, is the extender refusing this report (e.g. a stale sequence
number): it is counted as rejected and not retried. The token is read from a file (projected
ServiceAccount token in a cluster, shared token outside), re-read when the file changes, and never
logged.
"""

from __future__ import annotations

import json
import logging
import os
import random
import ssl
import threading
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from extender.agent import AGENT_VERSION
from extender.telemetry import NodeReport, ReportError, checked, delta_of

log = logging.getLogger(__name__)

TELEMETRY_PATH = "/v1/telemetry"
RESULTS = ("ok", "unauthorized", "rejected", "error", "superseded")


class TokenFile:
    """The bearer token in a file, re-read whenever the file changes (kubelet rotates projected tokens)."""

    def __init__(self, path: Path | str | None) -> None:
        self.path = Path(path) if path else None
        self._stamp: tuple[int, int, int] | None = None
        self._token: str | None = None

    def __repr__(self) -> str:  # never show the token
        return f"TokenFile(path={str(self.path)!r})"

    def get(self) -> str | None:
        """The current token, or None when there is no file (reports then go without one)."""
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_ino, st.st_size)
            if stamp != self._stamp:
                self._token = self.path.read_text(encoding="utf-8").strip() or None
                self._stamp = stamp
        except OSError:
            self._stamp, self._token = None, None
        return self._token

    def invalidate(self) -> None:
        """Forget the cached token so the next `get` reads the file again."""
        self._stamp = None


def backoff_s(attempt: int, initial_s: float, max_s: float, rng: random.Random) -> float:
    """Delay before retry `attempt` (1, 2, ...): exponential, capped, with "equal jitter": half the
    step is fixed so retries never hammer, half is random so agents that lost the extender together
    do not come back in lockstep."""
    step = min(max_s, initial_s * 2.0 ** (attempt - 1))
    return step / 2.0 + rng.uniform(0.0, step / 2.0)


@dataclass(frozen=True)
class Delivery:
    """The outcome of one POST: `result` is one of RESULTS; `status` the HTTP status (0: none)."""

    result: str
    status: int = 0
    detail: str = ""
    #: the extender said it takes delta reports (`"deltas": true` in its answer)
    deltas: bool = False


Poster = Callable[[bytes, str | None], Delivery]


def extender_opener(url: str, ca_file: str | None) -> urllib.request.OpenerDirector:
    """An opener for the extender's URL: no proxy (a cluster-local service), its CA for https."""
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if url.startswith("https:"):
        handlers.append(urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=ca_file)))
    return urllib.request.build_opener(*handlers)


class HttpPoster:
    """POSTs a JSON body with urllib (stdlib; no proxy: the extender is a cluster-local service)."""

    def __init__(self, base_url: str, timeout_s: float = 5.0, ca_file: str | None = None) -> None:
        self.url = base_url.rstrip("/") + TELEMETRY_PATH
        self.timeout_s = timeout_s
        self._opener = extender_opener(self.url, ca_file)

    def __call__(self, body: bytes, token: str | None) -> Delivery:
        headers = {"Content-Type": "application/json", "User-Agent": f"deepres-agent/{AGENT_VERSION}"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                answer = _decoded(response.read())
                if answer.get("accepted") is False:  # 200 with {"accepted": false}: e.g. an old sequence number
                    return Delivery("rejected", response.status, _short(json.dumps(answer).encode()))
                return Delivery("ok", response.status, deltas=answer.get("deltas") is True)
        except urllib.error.HTTPError as err:
            detail = _short(err.read())
            if err.code in (401, 403):
                return Delivery("unauthorized", err.code, detail)
            if 400 <= err.code < 500 and err.code not in (408, 429):
                return Delivery("rejected", err.code, detail)
            return Delivery("error", err.code, detail)
        except (OSError, ValueError) as err:  # URLError, refused, reset, timeout, bad URL
            return Delivery("error", 0, str(getattr(err, "reason", err)))


def _decoded(answer: bytes) -> dict[str, object]:
    """The extender's JSON answer as a dict ({} when it is none)."""
    try:
        decoded = json.loads(answer) if answer else None
    except ValueError:
        return {}
    return decoded if isinstance(decoded, dict) else {}


def _short(raw: bytes, limit: int = 300) -> str:
    text = raw.decode("utf-8", errors="replace").strip().replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "..."


def encode_report(report: NodeReport) -> bytes:
    """The wire body: compact JSON of the shared schema, as the extender will read it (`checked`: a
    GPU with a bad reading goes as unhealthy, never as a NaN that would make the whole body invalid
    JSON). Raises ReportError when the extender would refuse the whole report."""
    return _json_body(checked(report))


def _json_body(report: NodeReport) -> bytes:
    return json.dumps(report.to_dict(), separators=(",", ":"), allow_nan=False).encode("utf-8")


class ReportSink(Protocol):
    def submit(self, report: NodeReport) -> None:
        """Hand a report over for delivery; must not block."""
        ...


class Reporter:
    """The sender thread and its newest-wins queue."""

    def __init__(
        self,
        post: Poster,
        token: TokenFile,
        *,
        queue_size: int = 4,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        on_result: Callable[[str], None] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._post = post
        self._token = token
        self._queue: deque[NodeReport] = deque(maxlen=max(1, queue_size))
        self._backoff = (backoff_initial_s, backoff_max_s)
        self._on_result = on_result or (lambda _result: None)
        self._rng = rng or random.Random()
        self._cond = threading.Condition()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="deepres-reporter", daemon=True)
        self.last_delivery: Delivery | None = None
        self.delivered_sequence = -1
        #: the last report the extender accepted, as it read it, while it takes deltas; None: send whole
        self._base: NodeReport | None = None
        self._delivered_listeners: list[Callable[[int], None]] = []

    def on_delivered(self, listener: Callable[[int], None]) -> None:
        """Call `listener(sequence)` (on the sender's thread) after each report the extender accepted."""
        self._delivered_listeners.append(listener)

    def start(self) -> Reporter:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
        self._thread.join(timeout_s)

    def submit(self, report: NodeReport) -> None:
        """Queue a report; never blocks. When the queue is full the oldest report is dropped."""
        with self._cond:
            if len(self._queue) == self._queue.maxlen:
                self._on_result("superseded")
            self._queue.append(report)
            self._cond.notify()

    def pending(self) -> int:
        with self._cond:
            return len(self._queue)

    def _next(self) -> NodeReport | None:
        with self._cond:
            while not self._queue and not self._stopping.is_set():
                self._cond.wait()
            if not self._queue:
                return None
            report = self._queue.pop()
            for _ in self._queue:
                self._on_result("superseded")
            self._queue.clear()
            return report

    def _run(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            report = self._next()
            if report is None:
                return
            full: NodeReport | None = None
            sent = report
            try:
                full = checked(report)
                sent = delta_of(full, self._base) if self._base is not None else full
                body = _json_body(sent)
            except ReportError as err:  # a bug in sampling: say so (health, log); the next round may do better
                delivery = Delivery("rejected", 0, f"invalid report, not sent: {err}")
            else:
                delivery = self._post(body, self._token.get())
            self.last_delivery = delivery
            if delivery.result != "error":  # accepted with deltas taken: the next goes as one; else whole
                self._base = full if delivery.result == "ok" and delivery.deltas else None
            if delivery.result == "rejected" and sent.base_sequence is not None:
                log.info("extender could not apply delta report seq=%d (%s): sending it whole", report.sequence,
                         delivery.detail)
                with self._cond:
                    if not self._queue:  # nothing newer arrived: this one again, whole
                        self._queue.append(report)
                continue
            self._on_result(delivery.result)
            if delivery.result in ("ok", "rejected"):
                if delivery.result == "ok":
                    self.delivered_sequence = report.sequence
                    for listener in self._delivered_listeners:
                        try:
                            listener(report.sequence)
                        except Exception:  # a listener's bug must not stop the reports
                            log.exception("a delivery listener failed")
                    if failures:
                        log.info("extender reachable again after %d failed attempts", failures)
                else:
                    log.warning("extender refused report seq=%d (HTTP %d): %s", report.sequence, delivery.status,
                                delivery.detail)
                failures = 0
                continue
            failures += 1
            if delivery.result == "unauthorized":
                self._token.invalidate()  # it may have rotated: read the file again before the retry
                if failures == 1 or failures % 20 == 0:
                    log.warning("extender refused our token (HTTP %d: %s; token file %s): check the token "
                                "audience or the shared token; retrying", delivery.status, delivery.detail,
                                self._token.path)
            elif failures == 1:
                status = f"HTTP {delivery.status}: " if delivery.status else ""
                log.warning("cannot deliver report seq=%d: %s%s; retrying with backoff", report.sequence, status,
                            delivery.detail)
            with self._cond:
                if not self._queue:  # nothing newer arrived: retry this one
                    self._queue.append(report)
            self._stopping.wait(backoff_s(failures, *self._backoff, self._rng))
