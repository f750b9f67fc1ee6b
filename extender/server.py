"""`deepres serve`: the extender under gunicorn, the production server.

One worker process (the cluster state and the reservations ledger live in it: a single writer, so
no cross-process over-commit is possible) with a pool of request threads. The app is built inside
the worker (not preloaded), so the predictor loader and the API watches run in the process that
serves. Settings: defaults < `--config` YAML < `DEEPRES_*` env < flags; every problem is listed
and the server refuses to start.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from extender.cli import UsageError
from extender.settings import Settings, SettingsError, load_settings

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bind", metavar="HOST:PORT", help="listen address (default 0.0.0.0:8888)")
    parser.add_argument("--config", metavar="FILE", help="YAML settings (keys = Settings fields)")
    parser.add_argument("--no-kube", action="store_true", default=None,
                        help="local mode: no API server (pods known from requests, bindings in memory)")
    parser.add_argument("--telemetry-token-file", metavar="FILE", help="shared agent token (local mode)")
    parser.add_argument("--tls-cert", metavar="FILE", help="PEM certificate: serve HTTPS")
    parser.add_argument("--tls-key", metavar="FILE", help="PEM key for --tls-cert")
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"), help="log level")
    parser.add_argument("--threads", type=int, help="request threads of the worker (default 8)")


def settings_from_args(args: argparse.Namespace) -> Settings:
    overrides = {
        "bind": args.bind, "no_kube": args.no_kube, "telemetry_token_file": args.telemetry_token_file,
        "tls_cert": args.tls_cert, "tls_key": args.tls_key, "log_level": args.log_level,
        "threads": getattr(args, "threads", None),
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
        "worker_class": "gthread",
        "threads": s.threads,
        "timeout": int(max(s.timeout_s, 1)),
        "graceful_timeout": 10,
        "keepalive": 30,
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
    return options


def make_server(settings: Settings) -> Any:
    """A gunicorn application serving `create_app(settings)`; `.run()` blocks."""
    from gunicorn.app.base import BaseApplication

    class ExtenderServer(BaseApplication):  # type: ignore[misc]
        def __init__(self) -> None:
            self._options = gunicorn_options(settings)
            super().__init__()

        def load_config(self) -> None:
            for key, value in self._options.items():
                self.cfg.set(key, value)

        def load(self) -> Any:
            from extender.app import create_app

            logging.getLogger().setLevel(settings.server.log_level.upper())
            return create_app(settings)

    return ExtenderServer()


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    mode = "local (--no-kube)" if settings.kube.no_kube else "cluster"
    log.info("deepres extender listening on %s, %s mode", settings.server.bind, mode)
    make_server(settings).run()
    return 0
