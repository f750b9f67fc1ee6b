"""`deepres serve --no-kube` in a child process on a free port: the one way tests, benchmarks and the
simulator's HTTP driver start a real server.

The child runs `python -m extender.cli serve` with the caller's environment (so `PYTHONPATH` picks
the same code), its log goes to a file, and `start` returns once `/readyz` (or `/healthz`) answers
200, raising with the log's tail when the server exits or does not come up in time.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

REPO = Path(__file__).resolve().parents[1]


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the kernel's pick; another process may still take it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class LocalServer:
    """A `deepres serve --no-kube` child; use as a context manager (stops it on exit)."""

    def __init__(self, workdir: Path, *, token: str, env: Mapping[str, str] | None = None,
                 bind_host: str = "127.0.0.1", args: Sequence[str] = (), probe: str = "/readyz",
                 ready_timeout_s: float = 90.0, log_level: str = "warning",
                 preexec_fn: Callable[[], None] | None = None, tls: ssl.SSLContext | None = None,
                 cwd: Path | None = REPO) -> None:
        self.workdir = workdir
        self.token = token
        self.env = dict(env or {})
        self.bind_host = bind_host
        self.args = list(args)
        self.probe = probe
        self.ready_timeout_s = ready_timeout_s
        self.log_level = log_level
        self.preexec_fn = preexec_fn
        self.tls = tls  # the client context that trusts the server's certificate (`--tls-cert` in args)
        host = "127.0.0.1" if bind_host in ("127.0.0.1", "0.0.0.0") else bind_host
        self.port = free_port(host)
        self.url = f"{'https' if tls is not None else 'http'}://{host}:{self.port}"
        self.log_path = workdir / f"server-{self.port}.log"
        self.cwd = cwd  # None: the caller's (the server then imports the tree on PYTHONPATH first)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> LocalServer:
        token_file = self.workdir / f"token-{self.port}"
        token_file.write_text(self.token + "\n")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "extender.cli", "serve", "--no-kube", "--bind", f"{self.bind_host}:{self.port}",
                 "--telemetry-token-file", str(token_file), "--log-level", self.log_level, *self.args],
                cwd=self.cwd, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=self.preexec_fn,
            )
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + self.probe, timeout=2, context=self.tls) as response:
                    if response.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"server not ready after {self.ready_timeout_s:g} s: {self.log_tail()}")
            time.sleep(0.1)

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def worker_pids(self) -> list[int]:
        """The child's own children (the engine's worker process)."""
        if self.proc is None:
            return []
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        return [int(p) for p in children.read_text().split()] if children.exists() else []

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
