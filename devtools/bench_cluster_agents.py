"""The simulated agents of `deepres bench cluster` (devtools/bench_cluster.py): every node's report,
over lean kept-alive connections, once per heartbeat, spread evenly. As the agent does since issue
#48 (extender/agent/reporter.py), once the extender has accepted a node's report and said it takes
deltas, the next ones go as deltas against it: the simulated GPUs never change, so each heartbeat
is a delta naming no GPU; a refused delta goes again whole at once."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

GPU_MODEL, GPU_MEMORY_MIB, GPUS_PER_NODE = "NVIDIA A100-SXM4-80GB", 81920.0, 8
AGENT_THREADS = 4
#: The simulated agents' boot id (one per bench process: a delta is against a report of its boot).
BOOT_ID = os.urandom(8).hex()


def _report_body(node: str) -> bytes:
    return _ReportTemplate(node).body(time.time_ns() // 1000, time.time())


class _ReportTemplate:
    """One node's report as bytes with the sequence and timestamp left open: the GPUs of a simulated
    node never change, and encoding them anew for each of 5,000 nodes' reports took this process's
    CPU from what it measures."""

    def __init__(self, node: str) -> None:
        gpus = [{"uuid": f"GPU-{node}-{i}", "index": i, "model": GPU_MODEL,
                 "memory_total_mib": GPU_MEMORY_MIB, "memory_used_mib": 0.0, "utilization_gpu": 0.0}
                for i in range(GPUS_PER_NODE)]
        head = json.dumps({"node": node})[:-1]
        fixed = {"agent_version": "bench", "source": "simulated", "boot_id": BOOT_ID, "pods": []}
        tail = json.dumps({**fixed, "gpus": gpus})[1:]
        self.head, self.tail = f'{head}, "sequence": '.encode(), f", {tail}".encode()
        self.delta_tail = f", {json.dumps({**fixed, 'gpus': []})[1:-1]}, \"base_sequence\": ".encode()

    def body(self, sequence: int, timestamp_s: float) -> bytes:
        return b"".join((self.head, str(sequence).encode(), b', "timestamp_s": ', repr(timestamp_s).encode(),
                         self.tail))

    def delta(self, sequence: int, timestamp_s: float, base: int) -> bytes:
        """A delta naming no GPU against the report `base` (nothing changed since)."""
        return b"".join((self.head, str(sequence).encode(), b', "timestamp_s": ', repr(timestamp_s).encode(),
                         self.delta_tail, str(base).encode(), b"}"))


class _AgentConnection:
    """A keep-alive HTTP/1.1 connection that posts prepared reports and reads the status and body of
    each answer (Content-Length framed, as the extender answers): the simulated agents' client,
    leaner than http.client, whose per-request Python work was most of this process's CPU at 5,000
    nodes (~340 reports a second)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock: socket.socket | None = None
        self.pending = b""

    def post(self, path: str, token: str, body: bytes) -> tuple[int, bytes]:
        if self.sock is None:
            self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
            self.pending = b""
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nContent-Type: application/json\r\n"
                f"Authorization: Bearer {token}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        try:
            self.sock.sendall(head + body)
            return self._answer()
        except (OSError, ValueError):
            self.close()
            raise

    def _answer(self) -> tuple[int, bytes]:
        while b"\r\n\r\n" not in self.pending:
            self.pending += self._recv()
        head, _, rest = self.pending.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        fields = {k.strip().lower(): v.strip().lower() for k, _, v in (line.partition(b":") for line in lines[1:])}
        if b"content-length" not in fields:
            raise ValueError(f"an answer without Content-Length: {head[:200]!r}")
        length = int(fields[b"content-length"])
        while len(rest) < length:
            rest += self._recv()
        self.pending = rest[length:]
        if fields.get(b"connection") == b"close":  # e.g. after a refusal: the next post reconnects
            self.close()
        return status, rest[:length]

    def _recv(self) -> bytes:
        assert self.sock is not None
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the extender closed the connection")
        return chunk

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock = None


class _Agents:
    """The simulated agents of every node, from this process: each node reports once every
    `heartbeat_s`, the nodes spread evenly over the period, over keep-alive connections."""

    def __init__(self, port: int, tokens: dict[str, str], heartbeat_s: float) -> None:
        self.port, self.tokens, self.heartbeat_s = port, tokens, heartbeat_s
        self.sent = 0
        self.deltas = 0  # deltas the extender accepted
        self.refused: list[str] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        nodes = sorted(self.tokens)
        for k in range(AGENT_THREADS):
            thread = threading.Thread(target=self._run, args=(nodes[k::AGENT_THREADS],), daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def _run(self, nodes: list[str]) -> None:
        if not nodes:
            return
        conn = _AgentConnection(self.port)
        templates = {node: _ReportTemplate(node) for node in nodes}
        step = self.heartbeat_s / len(nodes)
        due = time.monotonic() + step * (len(self._threads) / AGENT_THREADS)  # threads start staggered
        base: dict[str, int] = {}  # per node, the last report the extender accepted, while it takes deltas
        i = 0
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            node = nodes[i % len(nodes)]
            i += 1
            due += step
            try:
                sequence, last = time.time_ns() // 1000, base.pop(node, None)
                template = templates[node]
                status, text = conn.post("/v1/telemetry", self.tokens[node], template.body(sequence, time.time())
                                         if last is None else template.delta(sequence, time.time(), last))
                self.sent += 1
                if status == 409 and last is not None:  # the delta did not apply: the same report, whole
                    status, text = conn.post("/v1/telemetry", self.tokens[node], template.body(sequence, time.time()))
                    self.sent += 1
                elif status == 200 and last is not None:
                    self.deltas += 1
                if status != 200:
                    self.refused.append(f"{node}: {status} {text[:200]!r}")
                elif b'"deltas":true' in text.replace(b" ", b""):
                    base[node] = sequence
            except (OSError, ValueError) as err:
                self.refused.append(f"{node}: {err}")
        conn.close()
