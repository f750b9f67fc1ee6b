"""The background worker: tasks run in order off the caller's thread, a key queued twice runs once,
the queue is bounded, and a failing task does not stop the others."""

from __future__ import annotations

import threading

from extender.server.worker import Worker


def test_tasks_run_once_per_key_in_a_bounded_queue_and_survive_failures() -> None:
    gate, started = threading.Event(), threading.Event()
    ran: list[str] = []
    worker = Worker(limit=3)

    def block() -> None:
        started.set()
        gate.wait()

    assert worker.submit("block", block)  # holds the thread while the queue fills
    assert started.wait(5)
    assert worker.submit("a", lambda: ran.append("a"))
    assert not worker.submit("a", lambda: ran.append("a again"))  # already queued

    def broken() -> None:
        raise RuntimeError("a bug in one task")

    assert worker.submit("broken", broken)
    assert worker.submit("b", lambda: ran.append("b"))
    assert not worker.submit("c", lambda: ran.append("c"))  # full: dropped, the caller asks again later
    assert not worker.drain(timeout_s=0.2)  # still blocked
    gate.set()
    assert worker.drain()
    assert ran == ["a", "b"]
    assert worker.submit("a", lambda: ran.append("a"))  # done: the key may come again
    assert worker.drain() and ran == ["a", "b", "a"]
