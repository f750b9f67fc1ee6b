"""extender/server/auth.py: who may call the verbs, and agent tokens under a flood of invented ones (issue 13: 2, 7)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from extender.kube.cluster import TokenIdentity
from extender.kube.local import InMemoryCluster
from extender.server.app import create_app
from extender.server.auth import MAX_CONCURRENT_REVIEWS, TelemetryAuth, TokenCache, verb_caller_refused
from extender.settings import Settings
from tests.fixtures.kube.doubles import FormulaPredictor
from tests.fixtures.kube.payloads import extender_args, pod, report

AGENT = "system:serviceaccount:deepres:deepres-agent"
AUDIENCE = "deepres-extender"


class SlowReviewer:
    """An API server whose TokenReview takes `delay_s`; counts the reviews in flight at once."""

    def __init__(self, tokens: dict[str, TokenIdentity], delay_s: float = 0.0) -> None:
        self.tokens = tokens
        self.delay_s = delay_s
        self.reviews = 0
        self.in_flight = 0
        self.most_in_flight = 0
        self._lock = threading.Lock()

    def review_token(self, token: str, audience: str) -> TokenIdentity | None:
        with self._lock:
            self.reviews += 1
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        time.sleep(self.delay_s)
        with self._lock:
            self.in_flight -= 1
        return self.tokens.get(token)


def cluster_auth(reviewer: SlowReviewer, allowed: list[str] | None = None, **kw: Any) -> TelemetryAuth:
    return TelemetryAuth(local=False, shared_token="", reviewer=reviewer, audience=AUDIENCE,
                         allowed_accounts=[AGENT] if allowed is None else allowed, cache_s=60.0, **kw)


def test_a_flood_of_invented_tokens_runs_a_bounded_number_of_reviews() -> None:
    good = TokenIdentity(AGENT, "gpu-1", (AUDIENCE,))
    reviewer = SlowReviewer({"good": good}, delay_s=0.2)
    auth = cluster_auth(reviewer, cache_max=100)
    assert auth.authenticate("Bearer good").status == 200  # cached from now on
    outcomes: list[int] = []
    lock = threading.Lock()

    def attacker(i: int) -> None:
        status = auth.authenticate(f"Bearer bogus-{i}").status
        with lock:
            outcomes.append(status)

    threads = [threading.Thread(target=attacker, args=(i,)) for i in range(300)]
    started = time.monotonic()
    for t in threads:
        t.start()
    good_started = time.monotonic()
    assert auth.authenticate("Bearer good").status == 200  # served from the cache, not queued behind them
    assert time.monotonic() - good_started < 0.1
    for t in threads:
        t.join()
    assert reviewer.most_in_flight <= MAX_CONCURRENT_REVIEWS
    assert set(outcomes) <= {401, 503} and outcomes.count(503) >= 200
    assert time.monotonic() - started < 20 * 0.2  # nobody waited in line for a review
    assert len(auth.cache) <= 100


def test_the_cache_is_an_lru_not_cleared_wholesale() -> None:
    cache = TokenCache(max_entries=3)
    identity = TokenIdentity(AGENT, "n", (AUDIENCE,))
    for key in ("a", "b", "c"):
        cache.put(key, identity, until=100.0)
    assert cache.get("a", now=1.0) == (True, identity)  # a is now the most recent
    cache.put("d", None, until=100.0)
    assert cache.get("b", now=1.0) == (False, None)  # the least recent went
    assert cache.get("a", now=1.0)[0] and cache.get("c", now=1.0)[0] and cache.get("d", now=1.0) == (True, None)
    assert cache.get("a", now=200.0) == (False, None) and len(cache) == 2  # expired entries go


@pytest.mark.parametrize(("identity", "why"), [
    (TokenIdentity(AGENT, "gpu-1", ()), "not authenticated for audience"),  # empty status.audiences
    (TokenIdentity(AGENT, "gpu-1", ("kubernetes",)), "not authenticated for audience"),
    (TokenIdentity("system:serviceaccount:ml:anything", "gpu-1", (AUDIENCE,)), "may not post telemetry"),
    (TokenIdentity(AGENT, "", (AUDIENCE,)), "not bound to a node"),
    (None, "not authenticated"),
])
def test_reviews_the_api_server_accepts_are_still_judged(identity: TokenIdentity | None, why: str) -> None:
    auth = cluster_auth(SlowReviewer({"t": identity} if identity else {}))
    verdict = auth.authenticate("Bearer t")
    assert verdict.status == 401 and why in verdict.why


def test_no_listed_service_account_means_nobody_may_report() -> None:
    reviewer = SlowReviewer({"t": TokenIdentity(AGENT, "gpu-1", (AUDIENCE,))})
    verdict = cluster_auth(reviewer, allowed=[]).authenticate("Bearer t")
    assert verdict.status == 401 and "agent_service_accounts is empty" in verdict.why and reviewer.reviews == 0


def test_local_mode_takes_only_the_shared_token() -> None:
    auth = TelemetryAuth(local=True, shared_token="s3cret", reviewer=SlowReviewer({}), audience=AUDIENCE,
                         allowed_accounts=[], cache_s=60.0)
    assert auth.authenticate("Bearer s3cret").status == 200
    assert auth.authenticate("Bearer s3cre").status == 401 and auth.authenticate("Basic s3cret").status == 401
    assert auth.authenticate("Bearer \udcff").status == 401  # never a crash on odd header bytes


@pytest.mark.parametrize(("access", "environ", "admitted"), [
    ("loopback", {"REMOTE_ADDR": "127.0.0.1"}, True),
    ("loopback", {"REMOTE_ADDR": "::1"}, True),
    ("loopback", {"REMOTE_ADDR": "10.244.1.7"}, False),
    ("loopback", {"REMOTE_ADDR": "::ffff:10.0.0.1"}, False),
    ("loopback", {"REMOTE_ADDR": "::ffff:127.0.0.1"}, True),
    ("loopback", {"REMOTE_ADDR": "not an address"}, False),
    ("loopback", {}, False),
    ("mtls", {"REMOTE_ADDR": "127.0.0.1"}, False),  # loopback is no credential in deployment mode
    ("any", {"REMOTE_ADDR": "203.0.113.9"}, True),
])
def test_who_may_call_the_verbs(access: str, environ: dict[str, Any], admitted: bool) -> None:
    assert (verb_caller_refused(environ, access) == "") is admitted


def test_mtls_admits_a_verified_client_certificate_only() -> None:
    class Sock:
        def __init__(self, cert: dict[str, Any]) -> None:
            self.cert = cert

        def getpeercert(self) -> dict[str, Any]:
            return self.cert

    assert verb_caller_refused({"gunicorn.socket": Sock({"subject": ((("commonName", "deepres-scheduler"),),)})},
                               "mtls") == ""
    assert "client certificate" in verb_caller_refused({"gunicorn.socket": Sock({})}, "mtls")


def test_only_a_token_not_yet_reviewed_sends_the_request_to_a_thread() -> None:
    """extender/server/rsgi.py answers on the event loop unless the request may wait on the API server."""
    reviewer = SlowReviewer({"good": TokenIdentity(AGENT, "gpu-1", (AUDIENCE,))})
    auth = cluster_auth(reviewer)
    assert auth.needs_review("Bearer good") and auth.needs_review("Bearer bogus")
    auth.authenticate("Bearer good")
    auth.authenticate("Bearer bogus")
    assert not auth.needs_review("Bearer good") and not auth.needs_review("Bearer bogus")  # both cached now
    assert not auth.needs_review("") and not auth.needs_review("Basic x")
    local = TelemetryAuth(local=True, shared_token="s", reviewer=reviewer, audience=AUDIENCE, allowed_accounts=[],
                          cache_s=60.0)
    assert not local.needs_review("Bearer anything")


class SlowApiCluster(InMemoryCluster):
    """The in-memory cluster with a TokenReview that takes 50 ms, like a busy API server."""

    def __init__(self, tokens: dict[str, TokenIdentity]) -> None:
        super().__init__(tokens=tokens)
        self.reviewer = SlowReviewer(tokens, delay_s=0.05)

    def review_token(self, token: str, audience: str) -> TokenIdentity | None:
        return self.reviewer.review_token(token, audience)


def test_a_bogus_token_flood_leaves_the_agents_and_the_filter_served() -> None:
    """Issue 13 item 7 through the app: 400 reports with invented tokens from 40 threads, while the
    real agent reports and the scheduler filters; at most 4 reviews run at once."""
    cluster = SlowApiCluster({"agent-a": TokenIdentity(AGENT, "a", (AUDIENCE,))})
    settings = Settings()
    settings.kube.no_kube = False
    settings.kube.agent_service_accounts = [AGENT]
    app = create_app(settings, predictor=FormulaPredictor(), cluster=cluster)
    client = app.test_client()
    body = report("a", 1, time.time(), [(16000.0, 0.0)])
    assert client.post("/v1/telemetry", json=body, headers={"Authorization": "Bearer agent-a"}).status_code == 200
    statuses: list[int] = []
    lock = threading.Lock()

    def flood(k: int) -> None:
        attacker = app.test_client()
        for i in range(10):
            status = attacker.post("/v1/telemetry", json=body, headers={"Authorization": f"Bearer bogus-{k}-{i}"})
            with lock:
                statuses.append(status.status_code)

    threads = [threading.Thread(target=flood, args=(k,)) for k in range(40)]
    for t in threads:
        t.start()
    latencies = []
    for seq in range(2, 12):
        started = time.monotonic()
        # one pod filtered again and again (a filter answering one node reserves it for its pod until the bind:
        # ten pods would fill the GPU)
        out = client.post("/filter", json=extender_args(pod("p", {"deepres.io/gpu-memory": "4Gi"}), names=["a"]))
        latencies.append(time.monotonic() - started)
        assert out.get_json()["NodeNames"] == ["a"]
        agent = client.post("/v1/telemetry", json=report("a", seq, time.time(), [(16000.0, 0.0)]),
                            headers={"Authorization": "Bearer agent-a"})
        assert agent.status_code == 200  # its review is cached: never queued behind the flood
    for t in threads:
        t.join()
    assert cluster.reviewer.most_in_flight <= MAX_CONCURRENT_REVIEWS
    assert set(statuses) <= {401, 503} and len(statuses) == 400
    assert max(latencies) < 1.0  # generous: the filter never waits for a review


def test_a_successful_review_is_trusted_for_the_cache_time_less_a_share_drawn_per_token() -> None:
    """Tokens reviewed together (agents' first reports after a start) are not reviewed again together."""
    good = TokenIdentity(AGENT, "gpu-1", (AUDIENCE,))
    reviewer = SlowReviewer({"a": good, "b": good}, delay_s=0.0)
    now = [0.0]
    draws = iter([0.0, 1.0, 0.5, 0.5])
    auth = cluster_auth(reviewer, clock=lambda: now[0], rng=lambda: next(draws))
    assert auth.authenticate("Bearer a").status == auth.authenticate("Bearer b").status == 200
    now[0] = 44.0  # a is trusted for 60 s, b for 45 s
    assert auth.authenticate("Bearer a").status == auth.authenticate("Bearer b").status == 200
    assert reviewer.reviews == 2
    now[0] = 46.0
    assert auth.authenticate("Bearer b").status == 200 and reviewer.reviews == 3
    assert auth.authenticate("Bearer a").status == 200 and reviewer.reviews == 3
    now[0] = 61.0
    assert auth.authenticate("Bearer a").status == 200 and reviewer.reviews == 4
