"""extender/server/ratelimit.py: per-client buckets, refilled at the rate, never more than `clients` kept."""

from __future__ import annotations

from extender.server.ratelimit import TokenBuckets, retry_after


def test_a_client_gets_its_burst_then_the_rate() -> None:
    buckets = TokenBuckets(rate_per_s=2.0, burst=3, clients=10)
    assert [buckets.take("a", 0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take("a", 0.0) == 0.5  # one token comes every 0.5 s
    assert buckets.take("b", 0.0) == 0.0  # another client is not held back
    assert buckets.take("a", 0.5) == 0.0 and buckets.take("a", 0.5) > 0.0
    assert retry_after(0.2) == "1" and retry_after(2.1) == "3"


def test_buckets_are_bounded_and_zero_rate_is_no_limit() -> None:
    buckets = TokenBuckets(rate_per_s=1.0, burst=1, clients=100)
    for i in range(10_000):
        buckets.take(f"10.0.{i // 256}.{i % 256}", 0.0)
    assert len(buckets._buckets) == 100
    unlimited = TokenBuckets(rate_per_s=0.0, burst=1, clients=1)
    assert all(unlimited.take("a", 0.0) == 0.0 for _ in range(100))
