"""The scheduler's own listener (`server.scheduler_bind`): the verbs on a port no other caller can fill.

On the main port every client shares `server.max_connections`: 8,256 kept-alive connections that
each poll every ~8 s held it full, and a fresh /filter waited seconds (issue 34). kube-scheduler holds
a handful of kept-alive connections and nothing else should ever call the verbs, so they get a port
of their own, served in the worker process (one ledger) by an asyncio server on a thread of its own:

- only the verbs (and /healthz) are answered; `server.verbs_access` is enforced at the connection:
  `mtls` requires a client certificate signed by `server.tls_client_ca` in the TLS handshake (a
  port-forward or a sibling container on loopback has no such key), `loopback` closes any peer not
  on 127.0.0.1/::1 at once, `any` checks nothing;
- `server.scheduler_max_connections` connections at most, counted from the accept (before the TLS
  handshake); a new one beyond it closes the one idle longest, and connections still in their TLS
  handshake or sending their first request come first
  (the scheduler's own kept-alive connections, busy or recently used, are kept);
- every wait has a deadline: the TLS handshake and each request's headers `server.header_timeout_s`,
  the body `server.body_timeout_s` (then 408), an idle kept-alive connection `server.header_timeout_s`
  too (Go's client reopens one the server closed), an answer the client does not read
  `server.body_timeout_s`, so a stalled client holds a coroutine, never a thread. Past the TLS
  handshake the deadlines are one number per connection that a sweep checks every `SWEEP_S` (a
  connection past it is closed, at most `SWEEP_S` late): a timer per wait (`asyncio.timeout`, three
  per request) cost ~17 us each on this machine, a quarter of the listener's CPU per request;
- a verb that may wait on the API server (/bind, /preempt) runs in a small pool of threads, the others
  on the listener's thread; both call the same WSGI app as the main port, marked as an admitted caller.
Works the same under granian and gunicorn (it does not go through either engine).
"""

from __future__ import annotations

import asyncio
import io
import ipaddress
import logging
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from extender.server.wsgicall import call_wsgi
from predictor.parsing import ascii_digits

log = logging.getLogger(__name__)

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
#: environ key the verb routes read: the listener has admitted this caller (wsgi_verbs.CALLER_ADMITTED_KEY).
ADMITTED_KEY = "deepres.caller_admitted"
#: environ key: the request came through the scheduler's listener (the main port refuses the verbs then).
SCHEDULER_PORT_KEY = "deepres.scheduler_port"
SERVED = frozenset({"/filter", "/prioritize", "/bind", "/preempt", "/healthz"})
BLOCKING = frozenset({"/bind", "/preempt"})
MAX_HEADER_BYTES = 32 * 1024
#: How often the deadlines of the connections are checked (at most this late: seconds).
SWEEP_S = 0.25
NO_DEADLINE = float("inf")
REASONS = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
           408: "Request Timeout", 411: "Length Required", 413: "Content Too Large",
           431: "Request Header Fields Too Large", 500: "Internal Server Error", 503: "Service Unavailable"}


def is_loopback(host: str) -> bool:
    try:
        ip = ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def server_context(cert: str, key: str, client_ca: str) -> ssl.SSLContext:
    """TLS 1.2+ with the server's certificate; with `client_ca`, a client certificate signed by it is
    required in the handshake (no certificate, or another CA's: the handshake fails)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    if client_ca:
        ctx.load_verify_locations(cafile=client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class _Conn:
    __slots__ = ("busy", "deadline", "late_answer", "served", "since", "writer")

    def __init__(self, writer: asyncio.StreamWriter, now: float) -> None:
        self.writer = writer
        self.since = now  # accepted, or last answer sent
        self.busy = False  # a request is being answered
        self.served = 0  # requests answered on it
        self.deadline = NO_DEADLINE  # time.monotonic() by which the wait under way must end
        self.late_answer = b""  # what the sweep sends before closing it then (the 408 of a body)

    def wait_until(self, seconds: float, late_answer: bytes = b"") -> None:
        self.deadline, self.late_answer = time.monotonic() + seconds, late_answer


class SchedulerListener:
    """The listener; `start()` serves it on a daemon thread until `stop()`."""

    def __init__(self, app: WsgiApp, *, bind: str, ssl_context: ssl.SSLContext | None, access: str,
                 max_connections: int, header_timeout_s: float, body_timeout_s: float, max_body_bytes: int,
                 threads: int = 4, clock: Callable[[], float] = time.monotonic, served: frozenset[str] = SERVED,
                 blocking: frozenset[str] = BLOCKING, name: str = "scheduler", admits_verbs: bool = True) -> None:
        """`served`/`blocking`/`name`/`admits_verbs`: the scheduler's listener by default; the admission
        webhook's (serve.start_webhook_listener) serves /v1/mutate and admits no verb caller."""
        host, _, port = bind.rpartition(":")
        self.served, self.blocking, self.name, self.admits_verbs = served, blocking, name, admits_verbs
        self.host, self.port = host.strip("[]") or "0.0.0.0", int(port)
        self.app = app
        self.ssl_context = ssl_context
        self.access = access
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self.max_body_bytes = max_body_bytes
        self.clock = clock
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"deepres-{name}-call")
        self.late_body = self._head(408, [("Content-Type", "application/json")], orjson.dumps(
            {"error": f"request body not received within {body_timeout_s:g} s"}), close=True)
        self.conns: dict[asyncio.StreamWriter, _Conn] = {}
        self.closed_at_cap = 0
        self.refused_peers = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.server: asyncio.Server | None = None
        self.thread: threading.Thread | None = None
        self.started = threading.Event()
        self.error: BaseException | None = None

    # ---- life ----
    def start(self, timeout_s: float = 10.0) -> SchedulerListener:
        self.thread = threading.Thread(target=self._run, name=f"deepres-{self.name}-listener", daemon=True)
        self.thread.start()
        if not self.started.wait(timeout_s) or self.error is not None:
            raise RuntimeError(f"the {self.name} listener could not start on {self.host}:{self.port}: {self.error}")
        log.info("%s listener on %s:%d (%s, verbs_access=%s, at most %d connections)", self.name, self.host, self.port,
                 "TLS" + (" with client certificates" if self._client_certs else "") if self.ssl_context else "plain",
                 self.access, self.max_connections)
        return self

    @property
    def _client_certs(self) -> bool:
        return self.ssl_context is not None and self.ssl_context.verify_mode == ssl.CERT_REQUIRED

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self.loop = loop
        try:
            # TLS is started per connection (_serve), after the connection has a slot under the cap: a
            # flood of handshakes that never finish is bounded like any other, not only by its deadline
            self.server = loop.run_until_complete(asyncio.start_server(
                self._serve, self.host, self.port, limit=MAX_HEADER_BYTES, backlog=1024, reuse_address=True))
        except BaseException as err:  # the port is taken, a bad address: start() says so
            self.error = err
            self.started.set()
            loop.close()
            return
        self.started.set()
        sweep = loop.create_task(self._sweep())
        try:
            loop.run_forever()
        finally:  # stopped: the connections' tasks end here, not as "destroyed but pending" at exit
            tasks = [sweep, *asyncio.all_tasks(loop)]
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.close()

    async def _sweep(self) -> None:
        """Close every connection past its deadline, every SWEEP_S (a body's with its 408 first)."""
        while True:
            await asyncio.sleep(SWEEP_S)
            now = time.monotonic()
            for conn in [c for c in self.conns.values() if c.deadline < now]:
                self.conns.pop(conn.writer, None)
                if conn.late_answer:
                    conn.writer.write(conn.late_answer)
                conn.writer.close()

    def stop(self) -> None:
        loop = self.loop
        if loop is not None and loop.is_running():
            def close() -> None:
                if self.server is not None:
                    self.server.close()
                for writer in list(self.conns):
                    writer.close()
                loop.stop()
            loop.call_soon_threadsafe(close)
        if self.thread is not None:
            self.thread.join(5)
        self.pool.shutdown(wait=False, cancel_futures=True)

    # ---- connections ----
    def _make_room(self, now: float) -> bool:
        """Close one connection to stay within the cap: the one idle longest among those that never
        completed a request (a flood), else among idle kept-alive ones; False when all are busy."""
        idle = [c for c in self.conns.values() if not c.busy]
        if not idle:
            return False
        fresh = [c for c in idle if c.served == 0]
        victim = min(fresh or idle, key=lambda c: c.since)
        del self.conns[victim.writer]
        victim.writer.close()
        self.closed_at_cap += 1
        return True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername") or ("", 0)
        host = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if self.access == "loopback" and not is_loopback(host):
            self.refused_peers += 1
            writer.close()
            return
        now = self.clock()
        if len(self.conns) >= self.max_connections and not self._make_room(now):
            writer.close()
            return
        conn = _Conn(writer, now)
        self.conns[writer] = conn
        try:
            if self.ssl_context is not None:  # with mtls, a caller without the scheduler's certificate stops here
                await writer.start_tls(self.ssl_context, ssl_handshake_timeout=self.header_timeout_s)
            while await self._one_request(reader, writer, conn, host, peer):
                pass
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError, asyncio.LimitOverrunError,
                ssl.SSLError, OSError, ValueError):
            pass
        finally:
            self.conns.pop(writer, None)
            writer.close()

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: _Conn,
                           host: str, peer: Any) -> bool:
        """Read one request and answer it; whether the connection stays open for another."""
        conn.wait_until(self.header_timeout_s)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            await self._answer(writer, 431, {"error": "request headers too large"}, close=True)
            return False
        conn.busy = True
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await self._answer(writer, 400, {"error": "not an HTTP/1.x request line"}, close=True)
            return False
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        keep = headers.get("connection", "").lower() != "close" and version == "HTTP/1.1"
        path, _, query = target.partition("?")
        if path not in self.served:
            await self._answer(writer, 404, {"error": f"{path[:64]} is not served on the {self.name}'s port"},
                               close=True)
            return False
        if "transfer-encoding" in headers:
            await self._answer(writer, 411, {"error": "send a Content-Length"}, close=True)
            return False
        declared = headers.get("content-length", "0")
        if not ascii_digits(declared):
            await self._answer(writer, 400, {"error": "Content-Length is not a number"}, close=True)
            return False
        length = int(declared)
        if length > self.max_body_bytes:
            await self._answer(writer, 413, {"error": f"request body larger than {self.max_body_bytes} bytes"},
                               close=True)
            return False
        if length:
            conn.wait_until(self.body_timeout_s, self.late_body)
            body = await reader.readexactly(length)
        else:
            body = b""
        conn.deadline = NO_DEADLINE  # the app's own time is not the client's
        environ = self._environ(method, path, query, version, headers, body, host, peer, writer)
        if path in self.blocking:
            status, out_headers, payload = await asyncio.get_running_loop().run_in_executor(
                self.pool, self._call, environ)
        else:
            status, out_headers, payload = self._call(environ)
        await self._send(writer, status, out_headers, payload, close=not keep, conn=conn)
        conn.busy, conn.since = False, self.clock()
        conn.served += 1
        return keep

    def _environ(self, method: str, path: str, query: str, version: str, headers: dict[str, str], body: bytes,
                 host: str, peer: Any, writer: asyncio.StreamWriter) -> dict[str, Any]:
        environ: dict[str, Any] = {
            "REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query, "SCRIPT_NAME": "",
            "SERVER_NAME": self.host, "SERVER_PORT": str(self.port), "SERVER_PROTOCOL": version,
            "REMOTE_ADDR": host, "REMOTE_PORT": str(peer[1] if isinstance(peer, tuple) and len(peer) > 1 else 0),
            "CONTENT_LENGTH": str(len(body)), "CONTENT_TYPE": headers.get("content-type", ""),
            "wsgi.input": io.BytesIO(body), "wsgi.input_terminated": True, "wsgi.errors": io.StringIO(),
            "wsgi.url_scheme": "https" if self.ssl_context else "http", "wsgi.version": (1, 0),
            "wsgi.multithread": True, "wsgi.multiprocess": False, "wsgi.run_once": False,
            ADMITTED_KEY: self.admits_verbs, SCHEDULER_PORT_KEY: self.admits_verbs,
        }
        for name, value in headers.items():
            if name not in ("content-length", "content-type"):
                environ["HTTP_" + name.upper().replace("-", "_")] = value
        return environ

    def _call(self, environ: dict[str, Any]) -> tuple[int, list[tuple[str, str]], bytes]:
        answer = call_wsgi(self.app, environ, f" ({self.name}'s port)")
        if answer is None:
            return 500, [("Content-Type", "application/json")], orjson.dumps({"error": "internal error"})
        return answer

    async def _answer(self, writer: asyncio.StreamWriter, status: int, payload: Any, close: bool) -> None:
        await self._send(writer, status, [("Content-Type", "application/json")], orjson.dumps(payload), close)

    async def _send(self, writer: asyncio.StreamWriter, status: int, headers: list[tuple[str, str]], body: bytes,
                    close: bool, conn: _Conn | None = None) -> None:
        writer.write(self._head(status, headers, body, close))
        if conn is not None:
            conn.wait_until(self.body_timeout_s)  # a client that does not read its answer is dropped
            await writer.drain()
        else:  # an error answer before the connection is closed
            async with asyncio.timeout(self.body_timeout_s):
                await writer.drain()

    @staticmethod
    def _head(status: int, headers: list[tuple[str, str]], body: bytes, close: bool) -> bytes:
        """The answer's bytes: status line, headers, body."""
        head = [f"HTTP/1.1 {status} {REASONS.get(status, 'OK')}"]
        head += [f"{k}: {v}" for k, v in headers if k.lower() not in ("content-length", "connection")]
        head += [f"Content-Length: {len(body)}", "Connection: close" if close else "Connection: keep-alive", "", ""]
        return "\r\n".join(head).encode("latin-1") + body
