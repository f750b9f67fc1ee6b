"""The RSGI bridge's body deadline (extender/server/rsgi.py): one sweep over the reads in flight
instead of a timer per request (issue 31). A stalled body gets its 408 and leaves its task as it
found it; a read cancelled by anything else is not taken for a deadline."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from extender.server import rsgi
from extender.server.rsgi import RsgiBridge

BODY = b'{"PodName": "p"}'


def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    got = environ["wsgi.input"].read()
    start_response("200 OK", [("content-type", "application/json")])
    return [b'{"got": %d}' % len(got)]


class Scope:
    proto, method, path, query_string, http_version, scheme = "http", "POST", "/filter", "", "1.1", "http"
    server, client = "127.0.0.1:8888", "127.0.0.1:5555"

    def __init__(self, length: int) -> None:
        self.headers = {"content-type": "application/json", "content-length": str(length)}


class Protocol:
    """A client: its body arrives when `arrive` is set (never, for a stalled one)."""

    def __init__(self, body: bytes, arrive: asyncio.Event) -> None:
        self.body, self.arrive = body, arrive
        self.answers: list[tuple[int, bytes, int]] = []

    async def __call__(self) -> bytes:
        await self.arrive.wait()
        return self.body

    def response_bytes(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        task = asyncio.current_task()
        self.answers.append((status, body, task.cancelling() if task is not None else -1))


def bridge(timeout_s: float) -> RsgiBridge:
    return RsgiBridge(app, threads=2, body_timeout_s=timeout_s, max_body_bytes=1 << 20,
                      may_block=lambda environ: False)


def test_a_stalled_body_gets_its_408_and_its_task_is_not_left_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rsgi, "SWEEP_S", 0.05)

    async def main() -> tuple[Protocol, Protocol]:
        server = bridge(0.2)
        stalled = Protocol(BODY, asyncio.Event())  # never arrives
        arrived = asyncio.Event()
        sent = Protocol(BODY, arrived)
        arrived.set()
        both = asyncio.gather(server.__rsgi__(Scope(len(BODY)), stalled), server.__rsgi__(Scope(len(BODY)), sent))
        await asyncio.wait_for(both, 30.0)  # a bridge without its deadline fails here instead of hanging
        assert not server._deadlines and not server._late  # nothing left behind
        return stalled, sent

    stalled, sent = asyncio.run(main())
    status, body, cancelling = stalled.answers[0]
    assert status == 408 and b"not received within 0.2 s" in body
    assert cancelling == 0  # the deadline's cancellation was taken back: the task answers normally
    assert sent.answers[0][:2] == (200, b'{"got": %d}' % len(BODY))


def test_a_body_read_cancelled_by_something_else_is_not_a_timeout() -> None:
    async def main() -> None:
        server = bridge(30.0)
        protocol = Protocol(BODY, asyncio.Event())
        task = asyncio.get_running_loop().create_task(server.__rsgi__(Scope(len(BODY)), protocol))
        while not server._deadlines:  # the read has begun
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert protocol.answers == [] and not server._deadlines

    asyncio.run(main())
