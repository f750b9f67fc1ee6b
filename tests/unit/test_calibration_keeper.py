"""The calibration store's keeper (with the API server, a ConfigMap): never a write before a read
succeeded, merged on a conflict, bounded in size (extender/calibration_store.py,
extender/kube/calibration_configmap.py). The real API server's side: tests/cluster/test_calibration.py."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from extender import calibration_store as cs
from extender.kube import calibration_configmap as ccm
from extender.kube.cluster import ClusterError, ConflictError


class Api:
    """A ConfigMap API with the API server's resourceVersion rule (a replace at a stale version, or
    a create of an existing name, is a 409); `fail_reads` reads fail first (the API down)."""

    def __init__(self, fail_reads: int = 0) -> None:
        self.version = 0
        self.data: dict[str, str] | None = None
        self.fail_reads = fail_reads
        self.writes = 0
        self.lock = threading.Lock()

    def read_config_map(self, namespace: str, name: str) -> tuple[str, dict[str, str]] | None:
        with self.lock:
            if self.fail_reads:
                self.fail_reads -= 1
                raise ClusterError("read configmap: HTTP 503")
            return None if self.data is None else (str(self.version), dict(self.data))

    def write_config_map(self, namespace: str, name: str, data: dict[str, str], resource_version: str,
                         labels: dict[str, str] | None = None) -> str:
        with self.lock:
            exists = self.data is not None
            if (not resource_version and exists) or (resource_version and resource_version != str(self.version)):
                raise ConflictError("HTTP 409 Conflict")
            self.version += 1
            self.data = dict(data)
            self.writes += 1
            return str(self.version)

    def pods(self) -> dict[str, Any]:
        with self.lock:
            found: dict[str, Any] = json.loads((self.data or {}).get(ccm.KEY, "{}")).get("pods", {})
            return found


def payload(pods: dict[str, float]) -> dict[str, Any]:
    return {"format": cs.FORMAT, "version": cs.VERSION, "pods": {
        uid: {"node": "n0", "gpu_model": "G", "software": "s", "path": "exact", "point_mib": 1000.0,
              "order": float(i + 1), "peak_mib": peak, "upper_mib": 1100.0, "regime": "large"}
        for i, (uid, peak) in enumerate(pods.items())}}


def wait(check: Any, what: str) -> None:
    event = threading.Event()
    for _ in range(400):
        if check():
            return
        event.wait(0.025)
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture(autouse=True)
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cs, "KEEPER_EVERY_S", 0.05)
    monkeypatch.setattr(cs, "KEEPER_BACKOFF_MAX_S", 0.05)


def test_kept_pods_are_read_back_and_a_new_peak_is_written() -> None:
    api = Api()
    api.data = {ccm.KEY: json.dumps(payload({"old-1": 900.0, "old-2": 950.0}))}
    store = cs.CalibrationStore(keeper=ccm.ConfigMapKeeper(api, "ns", "cm"))
    try:
        wait(lambda: store.keeper_read, "the first read")
        assert sum(store.pods_seen().values()) == 2
        store.placed("new", "n1", "G", "s", "exact", 1000.0, 1100.0, "large")
        store.observe("new", 1234.0)
        wait(lambda: "new" in api.pods(), "the new pod written")
        assert {"old-1", "old-2", "new"} == set(api.pods()) and api.pods()["new"]["peak_mib"] == 1234.0
    finally:
        store.stop()


def test_nothing_is_written_before_a_read_succeeded() -> None:
    """The API failing at start: learning goes on in memory, and what is kept is not overwritten by
    the little learned since; once a read succeeds both are kept."""
    api = Api(fail_reads=3)
    api.data = {ccm.KEY: json.dumps(payload({"old": 900.0}))}
    store = cs.CalibrationStore(keeper=ccm.ConfigMapKeeper(api, "ns", "cm"))
    try:
        store.placed("new", "n1", "G", "s", "exact", 1000.0, 1100.0)
        store.observe("new", 1000.0)
        assert api.writes == 0
        wait(lambda: {"old", "new"} <= set(api.pods()), "both pods kept")
    finally:
        store.stop()


def test_a_conflicting_write_is_merged_not_lost() -> None:
    api = Api()
    store = cs.CalibrationStore(keeper=ccm.ConfigMapKeeper(api, "ns", "cm"))
    try:
        wait(lambda: store.keeper_read, "the first read")
        store.placed("mine", "n1", "G", "s", "exact", 1000.0, 1100.0)
        store.observe("mine", 1000.0)
        wait(lambda: "mine" in api.pods(), "the first write")
        with api.lock:  # another writer meanwhile
            api.data = {ccm.KEY: json.dumps(payload({"theirs": 800.0, "mine": 1500.0}))}
            api.version += 1
        store.placed("mine-2", "n1", "G", "s", "exact", 1000.0, 1100.0)
        store.observe("mine-2", 1100.0)
        wait(lambda: "mine-2" in api.pods(), "the write after the conflict")
        kept = api.pods()
        assert set(kept) == {"mine", "theirs", "mine-2"}
        assert kept["mine"]["peak_mib"] == 1500.0  # the higher peak of the two
        assert sum(store.pods_seen().values()) == 3
    finally:
        store.stop()


def test_the_kept_payload_is_bounded_oldest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ccm, "MAX_BYTES", 5_000)
    big = payload({f"pod-{i}": 1000.0 + i for i in range(200)})
    text = ccm.bounded(big)
    kept = json.loads(text)["pods"]
    assert len(text.encode()) <= 5_000 and 0 < len(kept) < 200
    assert "pod-199" in kept and "pod-0" not in kept  # the most recent kept
