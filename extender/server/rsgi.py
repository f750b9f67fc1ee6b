"""granian's RSGI in front of the WSGI app: request bodies are read on the event loop, with a deadline.

Under granian's WSGI interface the app's `wsgi.input.read()` blocks one of the worker's request
threads until the client has sent the whole body, and granian has no body timeout (only a header
timeout): 8 clients that send headers and then stall held all 8 threads, and every verb and
/healthz stopped answering. Here the body is awaited on the worker's event loop (a stalled client
costs a pending coroutine, not a thread) with `body_timeout_s` and a size limit; only a complete
request reaches the unchanged WSGI app (Flask + `VerbRoutes`), with its body in memory.

Where that thread is: a request that may wait on the network (`may_block`, the app's say: a bind
calls the API server, a new agent token needs a TokenReview...) runs in a pool of `threads`
request threads, so the others go on meanwhile; every other request runs on the event loop's own
thread. Computation is serialised by the GIL either way, and the hand-off to a thread and back
cost more than a small verb itself; worse, the loop then waited for the GIL behind busy request
threads (every request in a thread gave 0.51-0.83x the pods/s with 500 names).

What the bridge costs against granian's WSGI interface (docs/benchmarks.md, "The extender alone"): the app's own work is
the same (in-process, 0.19 ms a filter and 0.14 ms a prioritize with 500 names, either way) and the
bridge's Python adds 0.02-0.03 ms a call; the rest, ~0.1 ms a call, is granian's RSGI transport.
granian's I/O thread must take the GIL twice per request, to schedule the request on the loop and
to resolve the body's future (which never completes at once, even for a body already received), and
each is a wake-up of the loop's thread: with the server on one CPU, perf counted ~9 context
switches per request against ~6 under WSGI. uvloop, rloop and granian's Rust task implementation
did not change that (serial latency within the noise); reading the body in pieces did not either.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from extender.server.wsgicall import call_wsgi
from predictor.parsing import ascii_digits

log = logging.getLogger(__name__)

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
Answer = tuple[int, list[tuple[str, str]], bytes]
CLOSE = ("connection", "close")
JSON_HEADERS = [("content-type", "application/json"), CLOSE]
#: A declared body up to this size is awaited whole and counted once received (a filter with 500
#: names is ~20 KB); larger ones are counted piece by piece as they arrive.
SMALL_BODY_BYTES = 64 * 1024
#: How often the body reads' deadlines are checked (a stalled body's 408 comes at most this late: seconds).
SWEEP_S = 0.25


class _TooLarge(Exception):
    pass


class _Busy(Exception):
    pass


class _Received:
    """A body's pieces so far and their size (what it holds of the budget)."""

    __slots__ = ("parts", "size")

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0


def _error(status: int, message: str, extra: tuple[tuple[str, str], ...] = ()) -> Answer:
    body = json.dumps({"error": message}).encode()
    return status, [*JSON_HEADERS, *extra, ("content-length", str(len(body)))], body


def _host_port(address: str, default_port: str) -> tuple[str, str]:
    host, sep, port = address.rpartition(":")
    if not sep or not ascii_digits(port):
        return address.strip("[]"), default_port
    return host.strip("[]"), port


class RsgiBridge:
    """An RSGI application serving `app` (WSGI): on the event loop's thread, or in a pool of `threads`
    request threads for requests for which `may_block(environ)` is true (by default all)."""

    def __init__(self, app: WsgiApp, *, threads: int, body_timeout_s: float, max_body_bytes: int,
                 buffer_budget_bytes: int | None = None,
                 may_block: Callable[[dict[str, Any]], bool] = lambda environ: True,
                 body_limit: Callable[[str], int] | None = None,
                 refusal: Callable[[dict[str, Any]], tuple[int, str] | None] = lambda environ: None,
                 keeps_connection: Callable[[str, int], bool] = lambda path, status: True) -> None:
        self.app = app
        self.keeps_connection = keeps_connection
        self.may_block = may_block
        self.refusal = refusal
        self.body_timeout_s = body_timeout_s
        self.max_body_bytes = max_body_bytes
        self.body_limit = body_limit or (lambda path: max_body_bytes)
        self.buffer_budget_bytes = buffer_budget_bytes or 16 * max_body_bytes
        self.buffered = 0  # bytes of bodies received and not yet answered (touched on the loop only)
        self._deadlines: dict[asyncio.Task[Any], float] = {}  # tasks reading a body -> when they give up
        self._late: set[asyncio.Task[Any]] = set()  # cancelled by the sweep: their read answers 408
        self._sweeper: asyncio.Task[None] | None = None
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="deepres-request")
        self.base_environ: dict[str, Any] = {
            "SCRIPT_NAME": "", "SERVER_SOFTWARE": "granian (RSGI bridge)", "wsgi.errors": sys.stderr,
            "wsgi.input_terminated": True, "wsgi.multiprocess": False, "wsgi.multithread": True,
            "wsgi.run_once": False, "wsgi.version": (1, 0),
        }

    def __rsgi_init__(self, loop: Any) -> None:
        """Nothing to prepare: the pool starts its threads on demand."""

    def __rsgi_del__(self, loop: Any) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    async def __rsgi__(self, scope: Any, protocol: Any) -> None:
        if scope.proto != "http":  # websockets are off; nothing else is served
            return
        status, headers, body = await self._answer(scope, protocol)
        if not self.keeps_connection(scope.path, status) and not any(k.lower() == "connection" for k, _ in headers):
            headers.append(CLOSE)
        protocol.response_bytes(status, headers, body)

    async def _answer(self, scope: Any, protocol: Any) -> Answer:
        environ = self._environ(scope)
        refused = self.refusal(environ)  # e.g. a verb caller the access rule does not admit: before any body
        if refused is not None:
            return _error(*refused)
        limit = self.body_limit(scope.path)
        declared = scope.headers.get("content-length")
        if declared is not None:
            if not ascii_digits(declared.strip()):
                return _error(400, f"Content-Length {declared[:40]!r} is not a number")
            if int(declared) > limit:
                return _error(413, f"request body larger than {limit} bytes")
        received = _Received()
        task = asyncio.current_task()
        if task is None:  # granian runs each request in an asyncio task (its asyncio task implementation)
            raise RuntimeError("the RSGI bridge needs its requests in asyncio tasks: the body deadline cancels them")
        try:
            self._reading(task)
            try:
                if declared is not None and int(declared) <= SMALL_BODY_BYTES:
                    self._hold(received, await protocol())  # one await: cheaper than the pieces' loop
                else:
                    await self._read(protocol, received, limit)
            except asyncio.CancelledError:
                if task not in self._late:  # cancelled by someone else (the client went away): not a deadline
                    raise
                task.uncancel()
                raise TimeoutError from None
            finally:
                self._done_reading(task)
            body = b"".join(received.parts)
            received.parts.clear()
            environ["wsgi.input"], environ["CONTENT_LENGTH"] = io.BytesIO(body), str(len(body))
            if not self.may_block(environ):
                return self._call(environ)
            return await asyncio.get_running_loop().run_in_executor(self.pool, self._call, environ)
        except TimeoutError:
            return _error(408, f"request body not received within {self.body_timeout_s:g} s")
        except _TooLarge:
            return _error(413, f"request body larger than {limit} bytes")
        except _Busy:
            return _error(503, "too many request bodies being received; retry", (("retry-after", "1"),))
        except Exception as err:  # the client went away mid-body, or sent a broken chunked body
            log.debug("request body unreadable: %s", err)
            return _error(400, "request body could not be read")
        finally:
            self.buffered -= received.size

    def _reading(self, task: asyncio.Task[Any]) -> None:
        """`task` reads a body from now: cancelled by the sweep once `body_timeout_s` has passed.

        One deadline in a dict per request and one sweep every SWEEP_S, instead of a timer per request
        (`asyncio.timeout`: a TimerHandle pushed on the loop's heap and cancelled, ~45 us of the
        server's CPU per request in `deepres bench transport`, an eighth of granian's transport);
        a stalled body gets its 408 at most SWEEP_S late."""
        self._deadlines[task] = time.monotonic() + self.body_timeout_s
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    def _done_reading(self, task: asyncio.Task[Any]) -> None:
        self._deadlines.pop(task, None)
        self._late.discard(task)

    async def _sweep(self) -> None:
        """Cancel every body read past its deadline (`_reading`), every SWEEP_S, while any is open."""
        while self._deadlines:
            await asyncio.sleep(SWEEP_S)
            now = time.monotonic()
            for task, deadline in list(self._deadlines.items()):
                if deadline <= now and task not in self._late:
                    self._late.add(task)
                    task.cancel()

    async def _read(self, protocol: Any, received: _Received, limit: int) -> None:
        """The body into `parts` as it arrives, each piece counted against the budget of bytes held
        for all requests at once (received, not merely declared: a client that only promises a large
        body takes nothing from the others)."""
        async for chunk in protocol:
            if received.size + len(chunk) > limit:
                raise _TooLarge
            self._hold(received, chunk)

    def _hold(self, received: _Received, chunk: bytes) -> None:
        if self.buffered + len(chunk) > self.buffer_budget_bytes:
            raise _Busy
        self.buffered += len(chunk)
        received.size += len(chunk)
        received.parts.append(chunk)

    def _environ(self, scope: Any) -> dict[str, Any]:
        server_host, server_port = _host_port(scope.server, "80")
        client_host, client_port = _host_port(scope.client, "0")
        environ = dict(self.base_environ)
        environ.update({
            "REQUEST_METHOD": scope.method, "PATH_INFO": scope.path, "QUERY_STRING": scope.query_string,
            "SERVER_NAME": server_host, "SERVER_PORT": server_port, "REMOTE_ADDR": client_host,
            "REMOTE_PORT": client_port, "SERVER_PROTOCOL": f"HTTP/{scope.http_version}",
            "wsgi.url_scheme": scope.scheme,
        })
        for name, value in scope.headers.items():
            key = name.upper().replace("-", "_")
            if key == "CONTENT_LENGTH":
                continue
            if key != "CONTENT_TYPE":
                key = "HTTP_" + key
            environ[key] = f"{environ[key]},{value}" if key in environ else value
        return environ

    def _call(self, environ: dict[str, Any]) -> Answer:
        answer = call_wsgi(self.app, environ)
        return answer if answer is not None else _error(500, "internal error; see the extender's log")
