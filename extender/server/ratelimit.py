"""Per-client token buckets in a bounded LRU: how /v1/predict is rate-limited.

/v1/predict is open to any caller (it answers a prediction, it moves nothing), and a prediction runs
on the worker's one Python thread: one client looping on it took 93% of the core and tripled the
filter's median (issue 26). Each client address gets a bucket of `burst` tokens refilled at
`rate_per_s`; a request takes one or is answered 429 with the seconds until the next token. At most
`clients` buckets are kept, the least recently used forgotten first (a forgotten client starts with
a full bucket again, so forgetting only ever lets a client through, and only after `clients` others
came since).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict


class TokenBuckets:
    """`take(client, now_s)`: 0.0 when the request may go, else the seconds to wait."""

    def __init__(self, rate_per_s: float, burst: int, clients: int) -> None:
        self.rate_per_s = rate_per_s
        self.burst = float(burst)
        self.clients = clients
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # client -> (tokens, at)
        self._lock = threading.Lock()
        self.refused = 0

    def take(self, client: str, now_s: float) -> float:
        if self.rate_per_s <= 0:
            return 0.0
        with self._lock:
            tokens, at = self._buckets.pop(client, (self.burst, now_s))
            tokens = min(self.burst, tokens + max(now_s - at, 0.0) * self.rate_per_s)
            wait = 0.0
            if tokens >= 1.0:
                tokens -= 1.0
            else:
                wait = (1.0 - tokens) / self.rate_per_s
                self.refused += 1
            self._buckets[client] = (tokens, now_s)
            while len(self._buckets) > self.clients:
                self._buckets.popitem(last=False)
            return wait


def retry_after(wait_s: float) -> str:
    """The Retry-After header's value (whole seconds, at least 1)."""
    return str(max(1, math.ceil(wait_s)))
