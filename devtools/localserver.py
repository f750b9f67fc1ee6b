"""`deepres serve --no-kube` in a child process on a free port: the one way tests, benchmarks and the
simulator's HTTP driver start a real server.

The child runs `python -m extender.cli serve` with the caller's environment (so `PYTHONPATH` picks
the same code), its log goes to a file, and `start` returns once `/readyz` (or `/healthz`) answers
200, raising with the log's tail when the server exits or does not come up in time.

Ports: the server cannot be told to bind port 0 and report it (two engines, a worker process), so its
port is the kernel's pick of a free one, which another process on the machine may take before the
child binds it. `start` therefore (1) counts the server up only when the answer to its probe came from
a socket the child's own processes listen on (not another server that took the port), and (2) starts
the child again on fresh ports when one was taken ("Address already in use" in its log), up to
PORT_TRIES times. Other ports the server binds (`DEEPRES_SCHEDULER_BIND`, ...) take the same care
when written as `LocalServer.port_ref("NAME")` in `env` or `args`: they are filled in per try, held
before the server counts as up, and read back as `server.ports["NAME"]`.
"""

from __future__ import annotations

import os
import re
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
#: how many times `start` picks fresh ports when another process took one
PORT_TRIES = 5
_PORT_REF = re.compile(r"\{port:([A-Za-z0-9_-]+)\}")
_TAKEN = ("address already in use", "eaddrinuse", "os error 98")  # matched in lower case


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the kernel's pick; another process may still take it: the
    process that binds it should retry on "Address already in use", as `LocalServer.start` does)."""
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def listening_inodes(port: int) -> set[str] | None:
    """The socket inodes listening on TCP `port` (any address, v4 or v6); None where /proc cannot say."""
    found: set[str] = set()
    readable = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(fields[9])
    return found if readable else None


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (from /proc; just `pid` where /proc cannot say)."""
    tree, queue = [], [pid]
    while queue:
        current = queue.pop()
        tree.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                queue += [int(child) for child in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
    return tree


def holds_port(pid: int, port: int) -> bool:
    """Whether `pid` or one of its descendants listens on TCP `port` (True where /proc cannot say)."""
    inodes = listening_inodes(port)
    if inodes is None:
        return True
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for member in process_tree(pid):
        try:
            fds = list(Path(f"/proc/{member}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) in wanted:
                    return True
            except OSError:
                continue
    return False


class _PortTaken(RuntimeError):
    """Another process had one of the server's ports."""


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
        self.host = "127.0.0.1" if bind_host in ("127.0.0.1", "0.0.0.0") else bind_host
        self.cwd = cwd  # None: the caller's (the server then imports the tree on PYTHONPATH first)
        self.proc: subprocess.Popen[bytes] | None = None
        #: the other ports named by `port_ref` in env or args, filled in per try
        self.ports: dict[str, int] = {}
        self._pick_ports()

    @staticmethod
    def port_ref(name: str) -> str:
        """A port of the server's other than its main one, in `env` or `args` (`127.0.0.1:{port:NAME}`)."""
        return f"{{port:{name}}}"

    def _pick_ports(self) -> None:
        # probed on the wildcard address: free there, it is free on every address
        self.port = free_port("0.0.0.0" if self.bind_host == "0.0.0.0" else self.host)
        names = {m for text in (*self.env.values(), *self.args) for m in _PORT_REF.findall(text)}
        self.ports = {name: free_port("0.0.0.0") for name in sorted(names)}
        self.url = f"{'https' if self.tls is not None else 'http'}://{self.host}:{self.port}"
        self.log_path = self.workdir / f"server-{self.port}.log"

    def _fill(self, text: str) -> str:
        return _PORT_REF.sub(lambda m: str(self.ports[m[1]]), text)

    def start(self) -> LocalServer:
        """Start the child; returns once it answers its probe on ports its own processes hold."""
        taken: list[str] = []
        for _ in range(PORT_TRIES):
            try:
                return self._start_once()
            except _PortTaken as err:
                taken.append(str(err))
                self._pick_ports()
        raise RuntimeError(f"no free ports in {PORT_TRIES} tries (other processes took them): {taken[-1]}")

    def _start_once(self) -> LocalServer:
        token_file = self.workdir / f"token-{self.port}"
        token_file.write_text(self.token + "\n")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **{k: self._fill(v) for k, v in self.env.items()}}
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "extender.cli", "serve", "--no-kube", "--bind", f"{self.bind_host}:{self.port}",
                 "--telemetry-token-file", str(token_file), "--log-level", self.log_level,
                 *(self._fill(arg) for arg in self.args)],
                cwd=self.cwd, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=self.preexec_fn,
            )
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            exited = self.proc.poll() is not None
            if self.port_taken():
                self.stop()
                raise _PortTaken(f"port {self.port} {self.ports}: {self.log_tail(500)}")
            if exited:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + self.probe, timeout=2, context=self.tls) as response:
                    # the answer may come from another process that took the port: ours holds them all
                    if response.status == 200 and all(holds_port(self.proc.pid, port)
                                                      for port in (self.port, *self.ports.values())):
                        return self
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"server not ready after {self.ready_timeout_s:g} s: {self.log_tail()}")
            time.sleep(0.1)

    def port_taken(self) -> bool:
        """The child's log says one of its ports was taken."""
        tail = self.log_tail(20000).lower()
        return any(sign in tail for sign in _TAKEN)

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
