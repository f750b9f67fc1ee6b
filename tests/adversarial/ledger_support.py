"""Shared by the ledger's adversarial tests: telemetry bodies with chosen GPU uuids and processes, an
extender in cluster mode on a loopback port with an in-memory API server that only knows the pods
the test created (it learns nothing from requests), and the over-commit count."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from werkzeug.serving import make_server

from extender.kube.cluster import TokenIdentity
from extender.kube.local import InMemoryCluster
from extender.server.app import create_app, extender_of
from extender.settings import Settings
from tests.fixtures.kube.doubles import FormulaPredictor

GIB = 1024.0
#: The agents' tokens in cluster mode: each bound to its node (TokenReview's node-name extra).
NODE_TOKENS = {f"token-{n}": TokenIdentity(f"system:serviceaccount:deepres:agent-{n}", n, ("deepres-extender",))
               for n in ("a", "b", "c", "n1", "n2", "n3")}


def gpu(uuid: str, total: float, used: float = 0.0, index: int = 0,
        processes: list[tuple[int, float, str]] | None = None) -> dict[str, Any]:
    return {"uuid": uuid, "index": index, "model": "Tesla T4", "memory_total_mib": total, "memory_used_mib": used,
            "utilization_gpu": 0.0,
            "processes": [{"pid": pid, "used_memory_mib": mib, "pod_uid": uid} for pid, mib, uid in processes or []]}


def report(node: str, sequence: int, gpus: list[dict[str, Any]], *, pods: list[dict[str, Any]] | None = None,
           timestamp_s: float | None = None, boot_id: str = "boot-1") -> dict[str, Any]:
    return {"node": node, "sequence": sequence, "timestamp_s": time.time() if timestamp_s is None else timestamp_s,
            "agent_version": "test", "source": "simulated", "interval_s": 5.0, "gpus": gpus, "pods": pods or [],
            "boot_id": boot_id}


def overcommitted(bound_mib: list[float], capacity_mib: float, foreign_mib: float = 0.0) -> float:
    """MiB promised beyond the GPU (0: none)."""
    return max(sum(bound_mib) + foreign_mib - capacity_mib, 0.0)


@contextmanager
def cluster_mode(cluster: InMemoryCluster, *, settings: Settings | None = None,
                 clock: Callable[[], float] = time.time) -> Iterator[tuple[str, Any]]:
    """An extender in cluster mode (agents' tokens reviewed by the 'API server') over real HTTP on a
    loopback port; yields (base URL, the Extender)."""
    if settings is None:  # the attacks here are on the memory ledger: several pods share a GPU, which the
        settings = Settings()  # compute rule (policy/sharing.py, tests/unit/test_sharing.py) would refuse
        settings.policy.sharing = False
    settings.kube.no_kube = False
    if not settings.kube.agent_service_accounts:  # the agents the API server knows may report (server/auth.py)
        settings.kube.agent_service_accounts = sorted({i.username for i in cluster.tokens.values()})
    app = create_app(settings, predictor=FormulaPredictor(), clock=clock, cluster=cluster)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", extender_of(app)
    finally:
        server.shutdown()
        thread.join()


def api_server() -> InMemoryCluster:
    """The in-memory API server: only pods the test adds exist; agents' tokens are node-bound."""
    try:
        return InMemoryCluster(NODE_TOKENS, learn_pods=False)
    except TypeError:  # a build before learn_pods (to show these tests fail there): it learned from requests
        return InMemoryCluster(NODE_TOKENS)
