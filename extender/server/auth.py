"""Who may call the extender, and how that is checked (docs/security.md, "Threat model").

- The verbs (/filter, /prioritize, /preempt, /bind) move real pods, so only the scheduler may call
  them. `verb_caller_refused` enforces `server.verbs_access`: `loopback` (sidecar mode: the caller's
  address must be 127.0.0.1 or ::1, which nothing off the pod can have), `mtls` (deployment mode: a
  client certificate signed by `server.tls_client_ca`, which kube-scheduler presents through its
  extender `tlsConfig.certFile/keyFile`; kube-scheduler's extender client cannot send a bearer
  token, so TLS is the only credential it has), or `any` (no check: only behind your own guard).
- /v1/telemetry takes an agent's bearer token: in local mode the shared token; in a cluster a
  projected ServiceAccount token checked by TokenReview, which must name our audience (an empty
  `status.audiences` is refused), belong to one of `kube.agent_service_accounts` (empty: nobody)
  and be bound to a node. Reviews are cached in a bounded LRU and at most `MAX_CONCURRENT_REVIEWS`
  run at once: a flood of invented tokens gets 503 answers, never a request thread per token held
  on the API server.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from extender.kube.cluster import TokenIdentity
from extender.settings import VERBS_ACCESS

log = logging.getLogger(__name__)

#: Reviews cached (least recently used forgotten first); each entry is ~200 bytes.
TOKEN_CACHE_MAX = 10_000
#: TokenReviews in flight at once; a request finding them all busy gets 503 at once.
MAX_CONCURRENT_REVIEWS = 4
#: How long a refused token is remembered (a rotating agent token is re-read within this).
REFUSED_CACHE_S = 5.0
#: A successful review is trusted for `cache_s` shortened by up to this share, drawn per token: the
#: agents' first reports after a start all come within one heartbeat, and a fixed lifetime brought
#: their reviews back together every `cache_s` (a burst of N reviews at N nodes) instead of evenly.
CACHE_JITTER = 0.25


def verb_caller_refused(environ: dict[str, Any], access: str) -> str:
    """Why this request may not call a verb, or "" when it may."""
    if access == "any":
        return ""
    if access == "loopback":
        address = str(environ.get("REMOTE_ADDR") or "")
        try:
            ip = ipaddress.ip_address(address.strip("[]"))
        except ValueError:
            ip = None
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # a dual-stack listener shows 127.0.0.1 as ::ffff:127.0.0.1
        if ip is not None and ip.is_loopback:
            return ""
        return (f"the verbs answer only the scheduler on loopback (server.verbs_access=loopback); "
                f"caller {address[:64] or 'unknown'}")
    sock = environ.get("gunicorn.socket")
    getpeercert = getattr(sock, "getpeercert", None)
    if getpeercert is not None and getpeercert():
        return ""
    return "the verbs need the scheduler's client certificate (server.verbs_access=mtls)"


class Reviewer(Protocol):
    def review_token(self, token: str, audience: str) -> TokenIdentity | None: ...


@dataclass(frozen=True)
class AuthResult:
    """`status` 200: accepted (`node`: the node the token is bound to, "" in local mode); else the
    HTTP status to answer (401 refused, 503 too many reviews in flight) and why."""

    status: int
    node: str = ""
    why: str = ""


class TokenCache:
    """A bounded LRU of review outcomes by token digest, each with its own expiry."""

    def __init__(self, max_entries: int = TOKEN_CACHE_MAX) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[str, tuple[float, TokenIdentity | None]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str, now: float) -> tuple[bool, TokenIdentity | None]:
        """(hit, identity); a hit with None is a token refused recently."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return False, None
            if entry[0] <= now:
                del self._entries[key]
                return False, None
            self._entries.move_to_end(key)
            return True, entry[1]

    def put(self, key: str, identity: TokenIdentity | None, until: float) -> None:
        with self._lock:
            self._entries[key] = (until, identity)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


class TelemetryAuth:
    """Checks an agent's `Authorization` header (see the module doc)."""

    def __init__(self, *, local: bool, shared_token: str, reviewer: Reviewer, audience: str,
                 allowed_accounts: list[str], cache_s: float, clock: Callable[[], float] = time.monotonic,
                 max_concurrent: int = MAX_CONCURRENT_REVIEWS, cache_max: int = TOKEN_CACHE_MAX,
                 rng: Callable[[], float] = random.random) -> None:
        self.local = local
        self.shared_token = shared_token.encode("utf-8")
        self.reviewer = reviewer
        self.audience = audience
        self.allowed = frozenset(allowed_accounts)
        self.cache_s = cache_s
        self.clock = clock
        self.rng = rng
        self.cache = TokenCache(cache_max)
        self._slots = threading.BoundedSemaphore(max_concurrent)
        if not local and not self.allowed:
            log.warning("kube.agent_service_accounts is empty: /v1/telemetry refuses every report "
                        "(name the agents' ServiceAccount, system:serviceaccount:NS:NAME)")

    def needs_review(self, header: str) -> bool:
        """Whether `authenticate(header)` would ask the API server (a bearer token not in the cache)."""
        if self.local or not self.allowed:
            return False
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return False
        return not self.cache.get(self._key(token), self.clock())[0]

    @staticmethod
    def _key(token: str) -> str:
        return hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()

    def authenticate(self, header: str) -> AuthResult:
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return AuthResult(401, why="missing bearer token")
        if self.local:
            if self.shared_token and hmac.compare_digest(token.encode("utf-8", "replace"), self.shared_token):
                return AuthResult(200)
            return AuthResult(401, why="invalid token")
        if not self.allowed:
            return AuthResult(401, why="no ServiceAccount may post telemetry (kube.agent_service_accounts is empty)")
        key = self._key(token)
        now = self.clock()
        hit, identity = self.cache.get(key, now)
        if not hit:
            if not self._slots.acquire(blocking=False):
                return AuthResult(503, why="too many token reviews in flight; retry")
            try:
                identity = self.reviewer.review_token(token, self.audience)
            finally:
                self._slots.release()
            # a refused token is remembered briefly too: a bad agent cannot make us hammer the API server
            trusted_s = self.cache_s * (1.0 - CACHE_JITTER * self.rng())
            self.cache.put(key, identity, now + (trusted_s if identity is not None else min(self.cache_s,
                                                                                            REFUSED_CACHE_S)))
        return self._judge(identity)

    def _judge(self, identity: TokenIdentity | None) -> AuthResult:
        if identity is None or self.audience not in identity.audiences:
            return AuthResult(401, why="token not authenticated for audience " + self.audience)
        if identity.username not in self.allowed:
            return AuthResult(401, why=f"{identity.username[:120]} may not post telemetry")
        if not identity.node_name:
            return AuthResult(401, why="token is not bound to a node (use a projected ServiceAccount token)")
        return AuthResult(200, node=identity.node_name)


__all__ = ["VERBS_ACCESS", "AuthResult", "TelemetryAuth", "TokenCache", "verb_caller_refused"]
