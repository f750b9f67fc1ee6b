"""gunicorn's gthread worker, except that a new connection waits for its first byte on the poller.

gunicorn's own gthread worker hands every accepted connection to a request thread at once, and that
thread waits up to 5 s for a first byte before it puts the connection back on the poller: 32 idle
connections held all 32 threads, and 40 stopped /healthz for seconds at a time (issue 26; 2,000 would
stop it for minutes). Here a new connection goes straight to the poller (gunicorn's "pending"
connections, which hold no thread) and reaches a thread only once it has sent something; one that
sends nothing within `keepalive` seconds (`server.header_timeout_s`) is closed; and a connection
closes without lingering in the main thread (`Conn`). Written against
gunicorn 27's gthread (`pending_conns`, `on_pending_socket_readable`, `murder_pending`).
"""

from __future__ import annotations

import errno
import selectors
import socket
import time
from functools import partial
from typing import Any

from gunicorn import util
from gunicorn.workers import gthread

#: Bytes already received that a closing connection reads off (so the kernel sends FIN, not RST).
DRAIN_MAX_BYTES = 64 * 1024


class Conn(gthread.TConn):  # type: ignore[misc]
    """A connection whose graceful close never waits: gunicorn's lingers up to 2 s in the worker's
    main thread for the client to close its side, so 100 clients that sent an HTTP/2 preface (a 400)
    and then nothing stopped the main thread, and every other connection, for minutes. Here the
    close sends FIN, reads off what has already arrived, and closes."""

    def close(self, graceful: bool = False) -> None:
        if not graceful:
            super().close()
            return
        sock = self.sock
        try:
            sock.shutdown(socket.SHUT_WR)
            sock.setblocking(False)
            drained = 0
            while drained < DRAIN_MAX_BYTES:
                data = sock.recv(4096)
                if not data:
                    break
                drained += len(data)
        except OSError:  # nothing more to read now (BlockingIOError, SSLWantReadError) or already gone
            pass
        util.close(sock)


class ThreadWorker(gthread.ThreadWorker):  # type: ignore[misc]
    """`gthread.ThreadWorker` whose accept leaves a connection on the poller until it is readable."""

    def accept(self, listener: Any) -> None:
        try:
            client_sock, client_addr = listener.accept()
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        conn = Conn(self.cfg, client_sock, client_addr, listener.getsockname())  # non-blocking
        # every pending connection gets the same deadline from now, so the deque stays in deadline
        # order, as murder_pending needs (none is deferred by a thread: each arrives with data)
        conn.timeout = time.monotonic() + self.cfg.keepalive
        self.pending_conns.append(conn)
        self.poller.register(client_sock, selectors.EVENT_READ, partial(self.on_pending_socket_readable, conn))
