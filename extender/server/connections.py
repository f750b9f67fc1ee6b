"""How many connections the server holds at once, and the file descriptors that takes.

granian's worker admits at most `backpressure` connections at once and leaves the rest in the
kernel's listen backlog, unaccepted. Connections that send nothing used to hold those slots for
ever (issue 26: 1,025 idle connections stopped every endpoint), because granian's automatic
HTTP/1-or-2 detection waits for the first bytes with no deadline. Served as HTTP/1.1 only, hyper's
header read timeout runs from the accept (and from the end of each answer on a kept-alive
connection), so an idle connection is closed after `server.header_timeout_s` whatever it sends;
an HTTP/2 preface is refused at once. The cap (`server.max_connections`) is then set far above
what legitimate callers hold (kube-scheduler, one connection per agent, probes), so that idle and
slow clients fill it only by opening `max_connections / header_timeout_s` new connections every
second, sustained (8,192 / 10 s: ~820 a second).

Each held connection is a file descriptor: the server raises its soft RLIMIT_NOFILE toward the hard
limit (containerd 2 starts containers at a soft limit of 1,024) and lowers the cap to what the
limit allows, with a warning.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger(__name__)

#: File descriptors kept for everything but client connections (the listening socket, API server
#: connections, the state file, logs, the predictor's files, Python's own).
FD_RESERVE = 512


def raise_fd_limit(wanted: int) -> int:
    """Raise the soft limit on open files to `wanted` (at most the hard limit); the soft limit after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError) as err:
            log.warning("could not raise the open-files limit from %d to %d: %s", soft, target, err)
    return soft if soft != resource.RLIM_INFINITY else wanted


def connection_cap(max_connections: int) -> int:
    """The connections the worker may hold at once: `max_connections`, lowered (with a warning) to
    what the open-files limit allows once raised as far as it goes."""
    limit = raise_fd_limit(max_connections + FD_RESERVE)
    allowed = max(limit - FD_RESERVE, 64)
    if allowed < max_connections:
        log.warning("server.max_connections=%d lowered to %d: the open-files limit is %d (raise the hard "
                    "limit, e.g. the container runtime's LimitNOFILE)", max_connections, allowed, limit)
        return allowed
    return max_connections
