"""One WSGI call answered in memory: (status, headers, body), for the engines that drive the WSGI app
themselves (granian's RSGI bridge, rsgi.py, and the scheduler's own listener, scheduler_listener.py)."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def call_wsgi(app: Any, environ: dict[str, Any], where: str = "") -> tuple[int, list[tuple[str, str]], bytes] | None:
    """The app's answer, its iterable joined and closed; None when the app raised (a bug in it: logged
    with `where`, never a traceback out; the caller answers 500 in its own shape)."""
    started: list[Any] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        started[:] = [status, headers]

    try:
        result = app(environ, start_response)
        try:
            body = b"".join(result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
    except Exception:  # the app answers its own errors
        log.exception("unexpected error on %s %s%s", environ.get("REQUEST_METHOD"), environ.get("PATH_INFO"), where)
        return None
    return int(started[0][:3]), list(started[1]), body
