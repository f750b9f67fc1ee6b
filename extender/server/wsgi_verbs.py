"""kube-scheduler's verbs and the agents' telemetry as plain WSGI, in front of the Flask app.

These five routes carry all of the extender's traffic (per pod a filter and a prioritize, per node a
report every few seconds), and Flask's per-request machinery (request context, URL map, Response
object, after-request hooks) cost ~0.3 ms of the worker's one Python thread per call, measured
in-process: as much as the filter's own work at 500 candidate names. So they are answered here, in
a few dozen lines that read the body, decode it, call the `Extender` and encode the answer; every
other route (probes, /metrics, /v1/predict, /openapi.json) and every other method stay with Flask.

The rules are the app's: a verb answers HTTP 200 with its `Error` shape on bad input or a bug
(never a 5xx, never a traceback), a body over the limit is refused with 413 before it is read, a
body not sent within `server.body_timeout_s` gets 408, a verb caller that `server.verbs_access`
does not admit gets 403, telemetry needs a bearer token (401 with `WWW-Authenticate` otherwise;
503 while too many token reviews are in flight). extender/server/auth.py decides who may call what.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import orjson

from extender.protocol import binding_result, decode_extender_args, filter_error, preemption_result
from extender.server.auth import TelemetryAuth, verb_caller_refused
from extender.server.metrics import ExtenderMetrics
from extender.server.ratelimit import TokenBuckets, retry_after
from extender.server.report_fastpath import decode_report
from extender.settings import Settings
from predictor.parsing import ascii_digits

log = logging.getLogger(__name__)

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]
JSON = "application/json"
READ_CHUNK = 64 * 1024


class Verbs(Protocol):
    """What the routes call: the verbs and telemetry, each one call (`extender.server.app.Extender`)."""

    settings: Settings
    metrics: ExtenderMetrics
    auth: TelemetryAuth

    def filter(self, body: Any) -> Any: ...
    def prioritize(self, body: Any) -> Any: ...
    def bind(self, body: Any) -> Any: ...
    def preempt(self, body: Any) -> Any: ...
    def telemetry(self, body: Any, bound_node: str) -> tuple[int, dict[str, Any]]: ...
    def allocate(self, body: Any, bound_node: str) -> tuple[int, dict[str, Any]]: ...


class BadRequest(ValueError):
    """A request body that cannot be used (not JSON, not UTF-8, wrong shape)."""


class BodyTimeout(ValueError):
    """A body not received within the body timeout: 408."""


class BodyTooLarge(ValueError):
    """A body over the route's limit (declared or read): 413."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"request body larger than {limit} bytes")


#: environ key: True once `VerbRoutes.refusal` has admitted this request's caller (the RSGI bridge asks it
#: before reading the body; the check parses the caller's address, so it is not repeated).
CALLER_ADMITTED_KEY = "deepres.caller_admitted"
#: environ key: True when the request came through the scheduler's own listener (scheduler_listener.py).
SCHEDULER_PORT_KEY = "deepres.scheduler_port"
#: environ key: seconds a client has to send the body (set by VerbRoutes from server.body_timeout_s).
BODY_TIMEOUT_KEY = "deepres.body_timeout_s"


def read_body(environ: dict[str, Any], limit: int) -> bytes:
    """The request body, at most `limit` bytes. A declared length is checked before anything is read;
    a chunked body is read while it lasts, if the server marks its end (`wsgi.input_terminated`, as
    granian and gunicorn do), else it is empty (as werkzeug has it). Under gunicorn the body is read
    from the client's socket in pieces against a deadline (BodyTimeout); under granian the RSGI
    bridge (extender/server/rsgi.py) has read it, with its own deadline, before the app runs."""
    declared = environ.get("CONTENT_LENGTH") or ""
    stream = environ["wsgi.input"]
    sock = environ.get("gunicorn.socket")
    deadline = time.monotonic() + float(environ.get(BODY_TIMEOUT_KEY) or 0) if sock is not None else 0.0
    if declared:
        try:
            length = int(declared)
        except ValueError:
            raise BadRequest(f"Content-Length {declared[:40]!r} is not a number") from None
        if length > limit:
            raise BodyTooLarge(limit)
        if length <= 0:
            return b""
        if not deadline:
            data: bytes = stream.read(length)
            return data
    elif not environ.get("wsgi.input_terminated"):
        return b""
    parts: list[bytes] = []
    size = 0
    want = int(declared) if declared else -1
    while want < 0 or size < want:
        chunk = _read_before(stream, sock, deadline, READ_CHUNK if want < 0 else min(READ_CHUNK, want - size))
        if not chunk:
            break
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        parts.append(chunk)
    return b"".join(parts)


def _read_before(stream: Any, sock: Any, deadline: float, size: int) -> bytes:
    """One read, failing with BodyTimeout once `deadline` (monotonic; 0: none) has passed."""
    if deadline:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise BodyTimeout("request body not received in time")
        sock.settimeout(remaining)
    try:
        data: bytes = stream.read(size)
    except TimeoutError:
        raise BodyTimeout("request body not received in time") from None
    finally:
        if deadline:
            sock.settimeout(None)
    return data


def decode_json(data: bytes) -> Any:
    """orjson (100 full Node objects, ~0.4 MB, parse in about a third of json.loads' time); the
    error says whether the bytes are not UTF-8 or not JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as err:  # a ValueError: invalid UTF-8 and lone surrogates land here too
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as bad:
            raise BadRequest(f"body is not UTF-8 ({bad.reason} at byte {bad.start})") from None
        raise BadRequest(f"body is not valid JSON: {err}") from None


def decode_candidates(data: bytes) -> Any:
    """A filter or prioritize body: ExtenderArgs read straight from the bytes when well-formed (the
    fast path, see `protocol.decode_extender_args`), else the decoded JSON, whose problem the
    verb then names."""
    try:
        fast = decode_extender_args(data)
    except ValueError:  # e.g. UnicodeDecodeError: the parser names the problem
        fast = None
    return fast or decode_json(data)


def encode_json(payload: Any) -> bytes:
    return orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)


def send(start_response: StartResponse, status: str, body: bytes,
         extra: tuple[tuple[str, str], ...] = ()) -> list[bytes]:
    start_response(status, [("Content-Type", JSON), ("Content-Length", str(len(body))), *extra])
    return [body]


def refuse(environ: dict[str, Any], start_response: StartResponse, status: str, body: bytes,
           extra: tuple[tuple[str, str], ...] = ()) -> list[bytes]:
    """An answer before (or instead of) reading the rest of the body; the connection then closes.
    Under gunicorn the client's socket stops reading too: gunicorn's graceful close otherwise
    lingers up to 2 s in its main thread draining what a stalled client never sends, and 64 such
    clients stalled every other connection."""
    stop_reading(environ)
    return send(start_response, status, body, (*extra, *CLOSE))


def stop_reading(environ: dict[str, Any]) -> None:
    """Under gunicorn, stop reading the client's socket (the answer then closes the connection)."""
    sock = environ.get("gunicorn.socket")
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            # the plain socket's shutdown: an SSLSocket's own would unwrap TLS before the answer is sent
            socket.socket.shutdown(sock, socket.SHUT_RD)


STATUS = {200: "200 OK", 400: "400 BAD REQUEST", 401: "401 UNAUTHORIZED", 403: "403 FORBIDDEN",
          405: "405 METHOD NOT ALLOWED", 408: "408 REQUEST TIMEOUT", 413: "413 REQUEST ENTITY TOO LARGE",
          409: "409 CONFLICT", 429: "429 TOO MANY REQUESTS",
          500: "500 INTERNAL SERVER ERROR", 503: "503 SERVICE UNAVAILABLE"}
VERBS = frozenset({"/filter", "/prioritize", "/bind", "/preempt"})
#: The agents' routes (bearer token, bound to the agent's node): telemetry and the device plugin's handshake.
AGENT_PATHS = frozenset({"/v1/telemetry", "/v1/allocate"})
#: Routes whose handler waits on the API server or computes at length (extender/server/rsgi.py says why it
#: matters): /bind (pod, annotations, Binding), /preempt, /v1/predict. The filter's rare API calls (an
#: Event for a bad annotation, its own evictions) are short and bounded by the client's timeouts.
BLOCKING_PATHS = frozenset({"/bind", "/preempt", "/v1/predict"})
#: Seconds between two log lines about refused verb callers.
REFUSAL_LOG_S = 1.0
#: On a refusal before the body is read: close rather than drain what the client may still send.
CLOSE = (("Connection", "close"),)


class VerbRoutes:
    """WSGI middleware: POST /filter, /prioritize, /bind, /preempt and /v1/telemetry answered from
    `ext`; anything else goes to `fallback` (the Flask app)."""

    def __init__(self, ext: Verbs, fallback: WsgiApp) -> None:
        self.ext = ext
        self.fallback = fallback
        self.max_body = ext.settings.server.max_body_bytes
        self.telemetry_max = ext.settings.telemetry.telemetry_max_bytes
        self.predict_max = min(ext.settings.server.predict_max_bytes, self.max_body)
        self.body_timeout_s = ext.settings.server.body_timeout_s
        self.verbs_access = ext.settings.server.verbs_access
        self.scheduler_bind = ext.settings.server.scheduler_bind
        self._refused, self._refusal_logged_s = 0, -REFUSAL_LOG_S
        server = ext.settings.server
        self.predict_limit = TokenBuckets(server.predict_rate_per_s, server.predict_burst, server.predict_clients)
        self._predict_limited = ext.metrics.requests.labels("predict", "rate_limited")
        self.routes: dict[str, Callable[[dict[str, Any], StartResponse], list[bytes]]] = {
            "/filter": self._verb("filter", ext.filter, filter_error, decode_candidates),
            "/prioritize": self._verb("prioritize", ext.prioritize, lambda message: [], decode_candidates),
            "/bind": self._verb("bind", ext.bind, binding_result),
            "/preempt": self._verb("preempt", ext.preempt, lambda message: preemption_result({}, {})),
            "/v1/telemetry": self._telemetry,
            "/v1/allocate": self._allocate,
        }
        metrics = ext.metrics
        self._telemetry_latency = metrics.latency.labels("telemetry")
        self._reports = {outcome: metrics.telemetry_reports.labels(outcome) for outcome in ("unauthorized", "invalid")}

    def _verb_refused(self, environ: dict[str, Any]) -> str:
        """Why this caller may not call a verb here, "" when it may: with a scheduler's listener
        (`server.scheduler_bind`) the main port answers no verb at all."""
        if environ.get(SCHEDULER_PORT_KEY):
            return ""
        if self.scheduler_bind:
            return (f"the verbs are answered on the scheduler's own port only "
                    f"(server.scheduler_bind={self.scheduler_bind})")
        return verb_caller_refused(environ, self.verbs_access)

    def keeps_connection(self, path: str, status: int) -> bool:
        """Whether the connection stays open after this answer: only for the callers that use it
        again at once (the scheduler's verbs, the agents' accepted reports). Probes, scrapes,
        predictions and refusals close theirs, so kept-alive connections that only poll cannot hold
        the main port's `server.max_connections` (issue 34)."""
        return status < 400 and (path in VERBS or path in AGENT_PATHS)

    def refusal(self, environ: dict[str, Any]) -> tuple[int, str] | None:
        """(status, why) when this request is refused whatever its body (the RSGI bridge asks before
        reading it): a verb from a caller that `server.verbs_access` does not admit. An admitted
        caller is marked in `environ`, so that `__call__` does not check it a second time."""
        if environ.get("PATH_INFO", "") in VERBS and environ.get("REQUEST_METHOD") == "POST":
            refused = self._verb_refused(environ)
            if refused:
                self._log_refusal(str(environ.get("PATH_INFO")), refused)
                return 403, refused
            environ[CALLER_ADMITTED_KEY] = True
        return None

    def _log_refusal(self, path: str, why: str) -> None:
        """A refused verb caller is worth a warning, but a flood of them must not flood the log: at
        most one line per REFUSAL_LOG_S, with the count since the last."""
        now = time.monotonic()
        self._refused += 1
        if now - self._refusal_logged_s >= REFUSAL_LOG_S:
            log.warning("refused POST %s: %s (%d refusals since the last line)", path, why, self._refused)
            self._refused, self._refusal_logged_s = 0, now

    def body_limit(self, path: str) -> int:
        """Largest body this path takes (413 above)."""
        if path == "/v1/predict":
            return self.predict_max
        return self.telemetry_max if path in AGENT_PATHS else self.max_body

    def may_block(self, environ: dict[str, Any]) -> bool:
        """Whether answering this request may wait on the network (see BLOCKING_PATHS); telemetry
        does when its token is not in the review cache."""
        path = environ.get("PATH_INFO", "")
        if path in AGENT_PATHS:
            return self.ext.auth.needs_review(environ.get("HTTP_AUTHORIZATION", ""))
        return path in BLOCKING_PATHS

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        environ[BODY_TIMEOUT_KEY] = self.body_timeout_s
        path = environ.get("PATH_INFO", "")
        route = self.routes.get(path)
        if route is None:
            answer = self._other(environ, start_response, path)
            stop_reading(environ)  # gunicorn: the connection closes after this answer (keeps_connection)
            return answer
        if environ.get("REQUEST_METHOD") != "POST":
            method = str(environ.get("REQUEST_METHOD"))[:16]
            return send(start_response, STATUS[405], encode_json({"error": f"{method} not allowed; use POST"}),
                        (("Allow", "POST"),))
        if path in VERBS and not environ.get(CALLER_ADMITTED_KEY):  # gunicorn: not asked before the body
            refused = self._verb_refused(environ)
            if refused:
                self._log_refusal(path, refused)
                return refuse(environ, start_response, STATUS[403], encode_json({"error": refused}))
        return route(environ, start_response)

    def _other(self, environ: dict[str, Any], start_response: StartResponse, path: str) -> Iterable[bytes]:
        """Every route but the verbs and telemetry: Flask's, /v1/predict's limits checked first."""
        if path == "/v1/predict":
            declared = str(environ.get("CONTENT_LENGTH") or "")
            if ascii_digits(declared) and int(declared) > self.predict_max:  # before anything is read
                return refuse(environ, start_response, STATUS[413], encode_json(
                    {"error": f"request body larger than {self.predict_max} bytes (server.predict_max_bytes)"}))
            wait = self.predict_limit.take(str(environ.get("REMOTE_ADDR", "")), time.monotonic())
            if wait:
                self._predict_limited.inc()
                return send(start_response, STATUS[429], encode_json(
                    {"error": f"too many /v1/predict requests from this address (at most "
                              f"{self.predict_limit.rate_per_s:g} a second); retry later"}),
                    (("Retry-After", retry_after(wait)),))
        return self.fallback(environ, start_response)

    def _verb(self, name: str, handler: Callable[[Any], Any], error_shape: Callable[[str], Any],
              decode: Callable[[bytes], Any] = decode_json) -> Callable[[dict[str, Any], StartResponse], list[bytes]]:
        """One verb: decoded body -> `handler` -> JSON, with its latency and outcome counted (the
        labelled metric children are looked up once, here, not per request)."""
        latency = self.ext.metrics.latency.labels(name)
        outcomes = {o: self.ext.metrics.requests.labels(name, o) for o in ("ok", "error")}

        def route(environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
            started = time.perf_counter()
            outcome = "ok"
            try:
                try:
                    payload = handler(decode(read_body(environ, self.max_body)))
                except BadRequest as err:
                    outcome, payload = "error", error_shape(str(err))
                except BodyTooLarge as err:
                    outcome = "error"
                    return refuse(environ, start_response, STATUS[413], encode_json({"error": str(err)}))
                except BodyTimeout as err:
                    outcome = "error"
                    return refuse(environ, start_response, STATUS[408], encode_json({"error": str(err)}))
                except Exception as err:  # a bug: log it, never leak a traceback
                    log.exception("unexpected error on POST /%s", name)
                    outcome = "error"
                    payload = error_shape(f"internal error ({type(err).__name__}); see the extender's log")
                if type(payload) is dict and payload.get("Error"):
                    outcome = "error"
                return send(start_response, STATUS[200], encode_json(payload))
            finally:
                latency.observe(time.perf_counter() - started)
                outcomes[outcome].inc()

        return route

    def _telemetry(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        started = time.perf_counter()
        try:
            verdict = self.ext.auth.authenticate(environ.get("HTTP_AUTHORIZATION", ""))
            if verdict.status == 503:
                return send(start_response, STATUS[503], encode_json({"error": verdict.why}), (("Retry-After", "1"),))
            if verdict.status != 200:
                self._reports["unauthorized"].inc()
                return refuse(environ, start_response, STATUS[401],
                              encode_json({"error": f"unauthorized: {verdict.why}"}),
                              (("WWW-Authenticate", 'Bearer realm="deepres-extender"'),))
            bound_node = verdict.node
            try:
                data = read_body(environ, self.telemetry_max)
                body = decode_report(data) or decode_json(data)  # the fast path, else the parser names the problem
            except BadRequest as err:
                self._reports["invalid"].inc()
                return send(start_response, STATUS[400], encode_json({"error": str(err)}))
            except BodyTooLarge as err:
                self._reports["invalid"].inc()
                return refuse(environ, start_response, STATUS[413], encode_json({"error": str(err)}))
            except BodyTimeout as err:
                self._reports["invalid"].inc()
                return refuse(environ, start_response, STATUS[408], encode_json({"error": str(err)}))
            try:
                status, payload = self.ext.telemetry(body, bound_node)
            except Exception as err:  # a bug (not bad input): the agent retries; never a traceback
                log.exception("unexpected error on POST /v1/telemetry")
                return send(start_response, STATUS[500],
                            encode_json({"error": f"internal error ({type(err).__name__}); see the extender's log"}))
            return send(start_response, STATUS[status], encode_json(payload))
        finally:
            self._telemetry_latency.observe(time.perf_counter() - started)

    def _allocate(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        """The device plugin's handshake (extender/server/allocate.py): the agent's token, as telemetry."""
        verdict = self.ext.auth.authenticate(environ.get("HTTP_AUTHORIZATION", ""))
        if verdict.status == 503:
            return send(start_response, STATUS[503], encode_json({"error": verdict.why}), (("Retry-After", "1"),))
        if verdict.status != 200:
            return refuse(environ, start_response, STATUS[401], encode_json({"error": f"unauthorized: {verdict.why}"}),
                          (("WWW-Authenticate", 'Bearer realm="deepres-extender"'),))
        try:
            body = decode_json(read_body(environ, self.telemetry_max))
        except BadRequest as err:
            return send(start_response, STATUS[400], encode_json({"error": str(err)}))
        except BodyTooLarge as err:
            return refuse(environ, start_response, STATUS[413], encode_json({"error": str(err)}))
        except BodyTimeout as err:
            return refuse(environ, start_response, STATUS[408], encode_json({"error": str(err)}))
        try:
            status, payload = self.ext.allocate(body, verdict.node)
        except Exception as err:  # a bug: the plugin refuses this Allocate; never a traceback
            log.exception("unexpected error on POST /v1/allocate")
            return send(start_response, STATUS[500],
                        encode_json({"error": f"internal error ({type(err).__name__}); see the extender's log"}))
        return send(start_response, STATUS[status], encode_json(payload))
