"""`deepres serve`: the extender under a production WSGI server, granian (default) or gunicorn.

One worker process (the cluster state and the reservations ledger live in it: a single writer, so
no cross-process over-commit is possible) with a pool of request threads. The app is built inside
the worker (not preloaded), so the predictor loader and the API watches run in the process that
serves. Settings: defaults < `--config` YAML < `DEEPRES_*` env < flags; every problem is listed
and the server refuses to start.

Why granian by default: the single worker's Python thread is the extender's bottleneck, and
granian parses HTTP and moves bytes in Rust outside the GIL. Measured here, an empty request costs
the worker 0.23 ms of CPU under granian against 0.71 ms under gunicorn's gthread worker, which is
most of the difference between the two in `deepres bench extender` (docs/benchmarks.md). granian
runs the app through its RSGI interface and `extender/server/rsgi.py`, which reads bodies on the event
loop with a deadline (granian's WSGI interface reads them in request threads without one).
gunicorn stays available (`--engine gunicorn`) for sites that standardise on it. `verbs_access: mtls`
works under either engine with the scheduler's own listener (`scheduler_bind`, scheduler_listener.py),
which checks the client certificate in its handshake; without it only gunicorn can (the verbs see the
certificate through its socket).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import functools
import logging
import os
import ssl
import threading
import time
from pathlib import Path
from typing import Any

from extender.cli import UsageError
from extender.settings import ENGINES, VERBS_ACCESS, Settings, SettingsError, load_settings

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bind", metavar="HOST:PORT", help="listen address (default 0.0.0.0:8888)")
    parser.add_argument("--config", metavar="FILE", help="YAML settings (keys = Settings fields)")
    parser.add_argument("--no-kube", action="store_true", default=None,
                        help="local mode: no API server (pods known from requests, bindings in memory)")
    parser.add_argument("--telemetry-token-file", metavar="FILE", help="shared agent token (local mode)")
    parser.add_argument("--tls-cert", metavar="FILE", help="PEM certificate: serve HTTPS")
    parser.add_argument("--tls-key", metavar="FILE", help="PEM key for --tls-cert")
    parser.add_argument("--tls-client-ca", metavar="FILE", help="PEM CA of the scheduler's client certificate")
    parser.add_argument("--verbs-access", choices=VERBS_ACCESS,
                        help="who may call the verbs: loopback (default), mtls, any (docs/security.md)")
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"), help="log level")
    parser.add_argument("--threads", type=int, help="request threads of the worker (default 32)")
    parser.add_argument("--engine", choices=ENGINES, help="WSGI server (default granian)")
    parser.add_argument("--state-file", metavar="FILE", help="local mode: file keeping the bound pods across restarts")
    parser.add_argument("--state-file-reset", action="store_true", default=None,
                        help="local mode: a damaged state file is moved aside and the extender starts empty "
                             "(without it a damaged file keeps the extender not ready)")


def settings_from_args(args: argparse.Namespace) -> Settings:
    overrides = {
        "bind": args.bind, "no_kube": args.no_kube, "telemetry_token_file": args.telemetry_token_file,
        "tls_cert": args.tls_cert, "tls_key": args.tls_key, "log_level": args.log_level,
        "threads": getattr(args, "threads", None), "engine": getattr(args, "engine", None),
        "tls_client_ca": getattr(args, "tls_client_ca", None), "verbs_access": getattr(args, "verbs_access", None),
        "state_file": getattr(args, "state_file", None), "state_file_reset": getattr(args, "state_file_reset", None),
    }
    try:
        return load_settings(args.config, overrides=overrides)
    except SettingsError as err:
        raise UsageError("invalid settings: " + "; ".join(err.problems)) from None


def gunicorn_options(settings: Settings) -> dict[str, Any]:
    s = settings.server
    options: dict[str, Any] = {
        "bind": s.bind,
        "workers": 1,
        # gthread, but a new connection waits for its first byte without a thread (issue 26)
        "worker_class": "extender.server.gunicorn_worker.ThreadWorker",
        "worker_connections": s.max_connections,
        "threads": s.threads,
        "timeout": int(max(s.timeout_s, 1)),
        "graceful_timeout": 10,
        "keepalive": max(int(s.header_timeout_s), 1),  # first byte and idle keep-alive
        "loglevel": s.log_level,
        "accesslog": None,
        "errorlog": "-",
        "proc_name": "deepres-extender",
        "preload_app": False,
        "limit_request_line": 8190,
        "control_socket_disable": True,  # several servers may share a host (tests, bench)
    }
    if s.tls_cert:
        options["certfile"] = s.tls_cert
        options["keyfile"] = s.tls_key
    if s.tls_client_ca:  # optional at the handshake: the verbs require it (auth.py), probes and agents do not
        options["ca_certs"] = s.tls_client_ca
        options["cert_reqs"] = ssl.CERT_OPTIONAL
    return options


def granian_options(settings: Settings) -> dict[str, Any]:
    """granian.server.Server keyword arguments: one worker process, `threads` WSGI threads."""
    from granian.constants import HTTPModes, Interfaces, SSLProtocols
    from granian.http import HTTP1Settings
    from granian.log import LogLevels

    s = settings.server
    host, _, port = s.bind.rpartition(":")
    options: dict[str, Any] = {
        "address": host.strip("[]") or "0.0.0.0",
        "port": int(port),
        "interface": Interfaces.RSGI,  # bodies read on the event loop (extender/server/rsgi.py says why)
        "workers": 1,
        "blocking_threads": 1,  # the event loop's; the request threads are the bridge's pool
        "runtime_threads": 1,
        # HTTP/1.1 only: automatic HTTP/2 detection waits for a first byte with no deadline, and no
        # caller needs HTTP/2. The header deadline then runs from the accept (extender/server/connections.py)
        "http": HTTPModes.http1,
        "http1_settings": HTTP1Settings(header_read_timeout=int(s.header_timeout_s * 1000), keep_alive=True),
        "backpressure": s.max_connections,
        "log_level": LogLevels(s.log_level),
        "log_access": False,
        "websockets": False,
        "respawn_failed_workers": True,  # a crashed worker comes back; in a cluster it rebuilds its ledger
        "workers_kill_timeout": 10,
    }
    if s.tls_cert:
        options["ssl_cert"] = Path(s.tls_cert)
        options["ssl_key"] = Path(s.tls_key)
        options["ssl_protocol_min"] = SSLProtocols.tls12  # what Go's TLS client (kube-scheduler) offers first
    return options


def load_app(settings: Settings, main_pid: int = 0, target: str = "") -> Any:
    """Build the app in the worker process (granian's loader passes its nominal target): the WSGI
    app, behind the RSGI bridge under granian. The worker dies with the server's main process."""
    from extender.server.app import create_app

    logging.getLogger().setLevel(settings.server.log_level.upper())
    if main_pid:
        die_with_parent(main_pid)
    keep_freed_memory()
    app = create_app(settings)
    if settings.server.scheduler_bind:
        start_scheduler_listener(settings, app)
    if settings.server.webhook_bind:
        start_webhook_listener(settings, app)
    if settings.server.engine != "granian":
        return app
    from extender.server.rsgi import RsgiBridge
    from extender.server.wsgi_verbs import VerbRoutes

    routes = app.wsgi_app
    s = settings.server
    if not isinstance(routes, VerbRoutes):  # pragma: no cover - create_app always installs them
        raise TypeError("create_app did not install the verb routes")
    return RsgiBridge(app, threads=s.threads, body_timeout_s=s.body_timeout_s,
                      max_body_bytes=max(s.max_body_bytes, settings.telemetry.telemetry_max_bytes),
                      buffer_budget_bytes=s.body_buffer_bytes, may_block=routes.may_block,
                      body_limit=routes.body_limit, refusal=routes.refusal,
                      keeps_connection=routes.keeps_connection)


def start_scheduler_listener(settings: Settings, app: Any) -> Any:
    """The scheduler's own listener (`server.scheduler_bind`) in this worker, beside the engine's port."""
    from extender.server.scheduler_listener import SchedulerListener, server_context

    s = settings.server
    cert, key = (s.scheduler_tls_cert, s.scheduler_tls_key) if s.scheduler_tls_cert else (s.tls_cert, s.tls_key)
    context = server_context(cert, key, s.tls_client_ca if s.verbs_access == "mtls" else "") if cert else None
    return SchedulerListener(app, bind=s.scheduler_bind, ssl_context=context, access=s.verbs_access,
                             max_connections=s.scheduler_max_connections, header_timeout_s=s.header_timeout_s,
                             body_timeout_s=s.body_timeout_s, max_body_bytes=s.max_body_bytes,
                             threads=max(2, min(s.threads, 8))).start()


def start_webhook_listener(settings: Settings, app: Any) -> Any:
    """The mutating admission webhook's own TLS listener (`server.webhook_bind`): /v1/mutate and /healthz
    only, any caller (the answer is a patch of the caller's own pod; it grants nothing)."""
    from extender.server.scheduler_listener import SchedulerListener, server_context

    s = settings.server
    context = server_context(s.webhook_tls_cert, s.webhook_tls_key, "")
    return SchedulerListener(app, bind=s.webhook_bind, ssl_context=context, access="any",
                             max_connections=s.scheduler_max_connections,
                             header_timeout_s=s.header_timeout_s, body_timeout_s=s.body_timeout_s,
                             max_body_bytes=s.max_body_bytes, threads=2, served=frozenset({"/v1/mutate", "/healthz"}),
                             blocking=frozenset(), name="webhook", admits_verbs=False).start()


#: How often a worker checks that the process that started it is still there (die_with_parent).
PARENT_CHECK_S = 0.25


def die_with_parent(main_pid: int, interval_s: float = PARENT_CHECK_S) -> threading.Thread:
    """Exit the worker at once when the server's main process is gone.

    A `kill -9` of granian's or gunicorn's main process leaves the worker orphaned and still serving
    on the inherited socket; a restarted server then runs a second worker with its own ledger beside
    it, and the two answer at random (4 binds on one 16 GiB GPU were seen). The worker polls its
    parent pid (PR_SET_PDEATHSIG would fire when the parent's spawning *thread* ends, not only the
    process, so it is not used) and leaves with os._exit: nothing of a ledger whose owner is gone
    must answer again."""

    def watch() -> None:
        while True:
            if os.getppid() != main_pid:
                log.error("the server's main process %d is gone: the worker exits", main_pid)
                os._exit(70)
            time.sleep(interval_s)

    if os.getppid() != main_pid:
        os._exit(70)
    thread = threading.Thread(target=watch, name="deepres-parent-watch", daemon=True)
    thread.start()
    return thread


#: glibc mallopt parameters and the values the worker sets (see keep_freed_memory).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
TRIM_THRESHOLD_BYTES = 64 * 1024 * 1024
MMAP_THRESHOLD_BYTES = 16 * 1024 * 1024


def keep_freed_memory() -> bool:
    """Let glibc keep freed memory for reuse instead of handing it back to the kernel at once.

    Every verb allocates and frees blocks above glibc's default 128 KiB thresholds (request bodies,
    the packing score's arrays), and each then comes back as fresh pages the kernel must fault in
    and zero. Measured here, the packing score over 500 candidates took 2.1 ms per call with the
    defaults and 1.2 ms with these. The worker keeps at most TRIM_THRESHOLD_BYTES of freed memory.
    False where the C library has no mallopt (musl, macOS): nothing changes there.
    """
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) and mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


class GranianServer:
    """`create_app(settings)` under granian; `.run()` blocks until SIGTERM/SIGINT."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def run(self) -> None:
        from granian.server import Server

        from extender.server.connections import connection_cap

        # the open-files limit is raised here, in the main process, so the worker inherits it
        self.settings.server.max_connections = connection_cap(self.settings.server.max_connections)
        if self.settings.server.tls_cert:
            log.warning("granian sets no deadline on the TLS handshake: a connection that never sends its "
                        "ClientHello holds one of server.max_connections=%d slots until it closes (docs/security.md, "
                        "\"Threat model\"); keep the port behind the chart's NetworkPolicy",
                        self.settings.server.max_connections)
        server = Server("extender.server.app:create_app", **granian_options(self.settings))
        server.serve(target_loader=functools.partial(load_app, self.settings, os.getpid()))


def make_server(settings: Settings) -> Any:
    """The configured engine serving `create_app(settings)`; `.run()` blocks."""
    if settings.server.engine == "granian":
        return GranianServer(settings)
    return make_gunicorn_server(settings)


def make_gunicorn_server(settings: Settings) -> Any:
    """A gunicorn application serving `create_app(settings)`; `.run()` blocks."""
    from gunicorn.app.base import BaseApplication

    class ExtenderServer(BaseApplication):  # type: ignore[misc]
        def __init__(self) -> None:
            from extender.server.connections import connection_cap

            settings.server.max_connections = connection_cap(settings.server.max_connections)
            self._options = gunicorn_options(settings)
            self._main_pid = os.getpid()
            super().__init__()

        def load_config(self) -> None:
            for key, value in self._options.items():
                self.cfg.set(key, value)

        def load(self) -> Any:
            return load_app(settings, self._main_pid)

    return ExtenderServer()


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    mode = "local (--no-kube)" if settings.kube.no_kube else "cluster"
    log.info("deepres extender listening on %s, %s mode, %s", settings.server.bind, mode, settings.server.engine)
    make_server(settings).run()
    return 0
