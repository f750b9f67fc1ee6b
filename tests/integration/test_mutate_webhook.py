"""The mutating webhook's listener over real TLS on loopback (`deepres serve` with server.webhook_bind).

What the API server relies on: HTTPS with the configured certificate, an AdmissionReview answer carrying
the request's uid, never a refusal of a pod, a clear 400 for what is not a review, and nothing else
served on that port (the verbs stay on theirs). What the patch does to a pod is judged by the real
kube-apiserver applying it (tests/cluster/test_admission_webhook.py).
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from devtools.localcluster import free_port
from tests.fixtures.kube.certs import serving_certificate
from tests.fixtures.kube.server import running_server


def review(pod: Any, *, uid: str = "7d9c0b43-1f7e-4d0a-9a49-2b0f1c9d2a11", operation: str = "CREATE") -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "operation": operation, "object": pod}}


def call(url: str, body: Any, context: ssl.SSLContext, raw: bytes | None = None) -> tuple[int, Any]:
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_the_webhook_listener_answers_reviews_over_tls(tmp_path: Path) -> None:
    cert, key, ca = serving_certificate(tmp_path)
    context = ssl.create_default_context(cadata=ca.decode())
    port = free_port()
    env = {"DEEPRES_WEBHOOK_BIND": f"127.0.0.1:{port}", "DEEPRES_WEBHOOK_TLS_CERT": str(cert),
           "DEEPRES_WEBHOOK_TLS_KEY": str(key), "DEEPRES_SCHEDULER_NAME": "gpu-sched"}
    with running_server(tmp_path, env=env) as main_url:
        url = f"https://127.0.0.1:{port}/v1/mutate"
        job = {"metadata": {"name": "p", "annotations": {"deepres.io/model": "resnet50"}},
               "spec": {"containers": [{"name": "train", "image": "x"}]}}
        status, answer = call(url, review(job), context)
        assert status == 200 and answer["kind"] == "AdmissionReview"
        response = answer["response"]
        assert response["uid"] == "7d9c0b43-1f7e-4d0a-9a49-2b0f1c9d2a11" and response["allowed"] is True
        assert response["patchType"] == "JSONPatch"
        patch = json.loads(base64.b64decode(response["patch"]))
        assert {"op": "add", "path": "/spec/schedulerName", "value": "gpu-sched"} in patch
        # not a job, or not a creation: allowed untouched
        for pod, operation in ((dict(job, metadata={"name": "q"}), "CREATE"), (job, "UPDATE")):
            status, answer = call(url, review(pod, operation=operation), context)
            assert status == 200 and answer["response"]["allowed"] is True and "patch" not in answer["response"]
        # what is not a review: a clear 400 (the API server then applies the webhook's failurePolicy)
        for bad in ({"kind": "AdmissionReview"}, {**review(job), "apiVersion": "admission.k8s.io/v1beta1"},
                    {**review(job), "request": {"uid": ""}}, [1, 2]):
            status, answer = call(url, bad, context)
            assert status == 400 and answer["error"], bad
        status, answer = call(url, None, context, raw=b"{not json")
        assert status == 400
        # the webhook's port serves nothing else: the verbs are the scheduler's
        status, answer = call(f"https://127.0.0.1:{port}/filter", {"Pod": {}}, context)
        assert status == 404
        # a client that does not trust the chart's CA cannot talk to it (the API server uses the caBundle)
        try:
            call(url, review(job), ssl.create_default_context())
        except urllib.error.URLError as err:
            assert isinstance(err.reason, ssl.SSLCertVerificationError)
        else:
            raise AssertionError("a client without the CA completed the TLS handshake")
        # the same route on the main port (plain HTTP there), for a cluster that terminates TLS itself
        request = urllib.request.Request(main_url + "/v1/mutate", data=json.dumps(review(job)).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=10) as answer_main:
            assert json.loads(answer_main.read())["response"]["patch"] == response["patch"]


def test_a_webhook_listener_without_its_certificate_is_a_clear_settings_error() -> None:
    from extender.settings import SettingsError, load_settings

    try:
        load_settings(env={"DEEPRES_WEBHOOK_BIND": "127.0.0.1:9443"})
    except SettingsError as err:
        assert "webhook_tls_cert" in str(err)
    else:
        raise AssertionError("a webhook listener without TLS was accepted")
