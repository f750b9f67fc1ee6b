"""`POST /v1/mutate`: the mutating admission webhook for clusters without the MutatingAdmissionPolicy.

The API server sends an `admission.k8s.io/v1` AdmissionReview for each pod CREATE the chart's
MutatingWebhookConfiguration matches; the answer allows it with the JSON Patch of
extender/policy/wiring.py (the rule the chart's MutatingAdmissionPolicy applies in CEL where the API
server has it). The webhook never refuses a pod: refusals are the ValidatingAdmissionPolicy's, so a
webhook answer cannot stop a pod the policy would have admitted. A request that is not an
AdmissionReview gets a 400 with what is wrong (the API server then applies the webhook's
failurePolicy). The chart serves it on its own TLS listener (`server.webhook_bind`), the only way
the API server calls a webhook.
"""

from __future__ import annotations

import base64
from typing import Any

import orjson

from extender.policy.wiring import wiring_patch

API_VERSION = "admission.k8s.io/v1"
#: A uid the API server sends is a UUID; anything much longer is not one of its requests.
MAX_UID_CHARS = 128


class NotAReview(ValueError):
    """The body is not an admission.k8s.io/v1 AdmissionReview request for a pod."""


def _request(review: Any) -> tuple[str, dict[str, Any]]:
    if not isinstance(review, dict):
        raise NotAReview("the body must be a JSON AdmissionReview object")
    if review.get("apiVersion") != API_VERSION or review.get("kind") != "AdmissionReview":
        raise NotAReview(f"expected apiVersion {API_VERSION} and kind AdmissionReview "
                         "(the webhook's admissionReviewVersions must be [v1])")
    request = review.get("request")
    if not isinstance(request, dict):
        raise NotAReview("AdmissionReview.request is missing")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid or len(uid) > MAX_UID_CHARS:
        raise NotAReview("AdmissionReview.request.uid must be a non-empty string")
    return uid, request


def review_answer(review: Any, *, scheduler_name: str, resource: str) -> dict[str, Any]:
    """The AdmissionReview answering `review`: allowed, with the wiring patch when the pod needs one."""
    uid, request = _request(review)
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    kind = request.get("kind")
    pod = request.get("object")
    is_pod = isinstance(kind, dict) and kind.get("group", "") == "" and kind.get("kind") == "Pod"
    if is_pod and request.get("operation") == "CREATE" and isinstance(pod, dict):
        patch = wiring_patch(pod, scheduler_name=scheduler_name, resource=resource)
        if patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(orjson.dumps(patch)).decode("ascii")
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}
