"""The agent's API adapters with the real kubernetes client models and a recording CoreV1Api double."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from kubernetes import client

from extender.agent.kube import FREE_AT_ANNOTATION, FREE_MIB_ANNOTATION, KubeNodeAnnotator, KubePods


class FakeCoreV1:
    """Answers like CoreV1Api (real V1PodList models); records the calls it gets."""

    def __init__(self, pods: list[client.V1Pod], fail: bool = False) -> None:
        self.api_client = client.ApiClient()
        self.pods = pods
        self.fail = fail
        self.selectors: list[str] = []
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.patched = threading.Event()

    def list_pod_for_all_namespaces(self, field_selector: str, _request_timeout: float) -> client.V1PodList:
        self.selectors.append(field_selector)
        if self.fail:
            raise client.ApiException(status=403, reason="Forbidden")
        return client.V1PodList(items=self.pods, metadata=client.V1ListMeta(resource_version="10"))

    def patch_node(self, name: str, body: dict[str, Any], _request_timeout: float) -> None:
        if self.fail:
            raise client.ApiException(status=403, reason="Forbidden: cannot patch nodes")
        self.patches.append((name, body))
        self.patched.set()


def v1pod(uid: str, name: str, phase: str = "Running", annotations: dict[str, str] | None = None) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(uid=uid, name=name, namespace="ml", annotations=annotations),
        status=client.V1PodStatus(phase=phase),
    )


def raw(uid: str, name: str, version: str, phase: str = "Running") -> dict[str, Any]:
    """A pod as a watch event carries it (raw JSON, Kubernetes casing)."""
    return {"metadata": {"uid": uid, "name": name, "namespace": "ml", "resourceVersion": version},
            "status": {"phase": phase}}


def test_pods_on_the_node_are_listed_with_a_field_selector() -> None:
    api = FakeCoreV1([v1pod("u1", "a", annotations={"deepres.io/assigned-gpus": "GPU-1"}), v1pod("u2", "b", "Pending")])
    pods = KubePods(api, "gpu-7", stream=lambda *a: [])
    assert pods.pods() == []  # nothing before the first list
    assert pods.relist()
    assert api.selectors == ["spec.nodeName=gpu-7"]
    assert sorted((p.uid, p.name, p.namespace, p.phase) for p in pods.pods()) == [("u1", "a", "ml", "Running"),
                                                                                 ("u2", "b", "ml", "Pending")]
    assert next(p for p in pods.pods() if p.uid == "u1").annotations == {"deepres.io/assigned-gpus": "GPU-1"}


def test_api_failure_keeps_the_last_list() -> None:
    api = FakeCoreV1([v1pod("u1", "a")])
    pods = KubePods(api, "gpu-7", stream=lambda *a: [])
    pods.relist()
    api.fail = True
    assert not pods.relist()
    assert [p.uid for p in pods.pods()] == ["u1"]


def test_watch_follows_the_node_and_relists_after_gone() -> None:
    api = FakeCoreV1([v1pod("u1", "a")])
    calls: list[tuple[str, str, int]] = []
    rounds = [
        [{"type": "ADDED", "object": raw("u2", "b", "11")},
         {"type": "MODIFIED", "object": raw("u2", "b", "12", phase="Succeeded")},
         {"type": "DELETED", "object": raw("u1", "a", "13")},
         {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "20"}}}],
        client.ApiException(status=410, reason="Gone: too old resource version"),
        [],
    ]

    def stream(api_: Any, selector: str, version: str, timeout_s: int) -> list[dict[str, Any]]:
        calls.append((selector, version, timeout_s))
        answer = rounds.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    pods = KubePods(api, "gpu-7", watch_timeout_s=60, stream=stream)
    pods.watch_once()  # lists (no version yet), then follows the watch
    assert [(p.uid, p.phase) for p in pods.pods()] == [("u2", "Succeeded")]
    with pytest.raises(client.ApiException):
        pods.watch_once()  # resumes from the bookmark's version; the server says it is gone
    api.pods = [v1pod("u3", "c")]
    pods.watch_once()  # so it lists again before watching
    assert [p.uid for p in pods.pods()] == ["u3"]
    assert [c[1] for c in calls] == ["10", "20", "10"] and all(c[0] == "spec.nodeName=gpu-7" for c in calls)
    assert api.selectors == ["spec.nodeName=gpu-7"] * 2


def test_annotator_patches_the_node_off_the_sampling_thread() -> None:
    api = FakeCoreV1([])
    annotator = KubeNodeAnnotator(api, "gpu-7", clock=lambda: 1_800_000_000.25).start()
    try:
        annotator.publish_free_mib(81234)
        assert api.patched.wait(5)
    finally:
        annotator.stop()
    assert api.patches == [("gpu-7", {"metadata": {"annotations": {FREE_MIB_ANNOTATION: "81234",
                                                                   FREE_AT_ANNOTATION: "1800000000250"}}})]


def test_annotator_survives_a_forbidden_patch(caplog: pytest.LogCaptureFixture) -> None:
    api = FakeCoreV1([], fail=True)
    annotator = KubeNodeAnnotator(api, "gpu-7")
    assert annotator.patch_now(1) is False  # logged, not raised
    assert api.patches == [] and annotator.patched == 0
    assert "cannot annotate node gpu-7" in caplog.text and "403" in caplog.text
    api.fail = False
    assert annotator.patch_now(2) is True and annotator.patched == 1
