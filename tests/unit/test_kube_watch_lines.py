"""The pod and node watches' line splitter (extender.kube.cluster.watch_lines): every event the API
server sent comes out whole, however its bytes were cut into chunks."""

from __future__ import annotations

import json

import orjson

from extender.kube.cluster import watch_lines


def _events(n: int) -> list[bytes]:
    return [json.dumps({"type": "MODIFIED", "object": {"metadata": {"name": f"pod-{i}", "note": "é" * i}}},
                       ensure_ascii=False).encode() for i in range(n)]


def test_events_cut_anywhere_come_out_whole_and_in_order() -> None:
    events = _events(7)
    body = b"".join(e + b"\n" for e in events)
    for size in (1, 2, 3, 5, 17, 64, len(body)):
        chunks = [body[i:i + size] for i in range(0, len(body), size)]
        assert list(watch_lines(chunks)) == events, size


def test_several_events_in_one_chunk_and_empty_chunks_and_blank_lines() -> None:
    a, b, c = _events(3)
    chunks = [b"", a + b"\n" + b + b"\n\n" + c[:5], b"", c[5:] + b"\n"]
    assert [orjson.loads(line) for line in watch_lines(chunks)] == [orjson.loads(x) for x in (a, b, c)]


def test_a_last_line_without_its_newline_is_given() -> None:
    a, b = _events(2)
    assert list(watch_lines([a + b"\n", b[:10], b[10:]])) == [a, b]
