"""The OpenAPI 3 description of every HTTP endpoint of the extender (served at /openapi.json).

The request bodies' schemas are generated from the records their decoders validate against, so the
document and the decoders cannot disagree: the verbs' from extender/protocol.py's msgspec records (keys
are kube-scheduler's Go field names; Pod and Node keep Kubernetes' casing and only the fields read are
listed), the agent's report from extender/telemetry.py's, and /v1/predict's annotation values from
extender/annotations.py's ACCEPTED table. The answers' schemas are written here, beside their encoders'
shapes. Rules across fields are stated in the descriptions.
"""

from __future__ import annotations

import inspect
from functools import cache
from typing import Any

import msgspec

from extender import __version__
from extender.annotations import ACCEPTED, PREFIX, value_schema
from extender.protocol import READ_AS, REQUEST_RECORDS
from extender.telemetry import NodeReport

_REF = "#/components/schemas/{name}"
_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_ERROR = {"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF.format(name=name)}


def _openapi30(schema: Any) -> Any:
    """msgspec's JSON Schema (2020-12) in OpenAPI 3.0's dialect: `anyOf [X, null]` -> X, nullable; no
    empty `required`."""
    if isinstance(schema, list):
        return [_openapi30(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _openapi30(value) for key, value in schema.items() if not (key == "required" and not value)}
    if isinstance(out.get("description"), str):  # a record's docstring
        out["description"] = inspect.cleandoc(out["description"])
    options = out.get("anyOf")
    if isinstance(options, list) and {"type": "null"} in options:
        rest = [o for o in options if o != {"type": "null"}]
        del out["anyOf"]
        single = rest[0] if len(rest) == 1 else {"anyOf": rest}
        out.update({"allOf": [single]} if "$ref" in single else single)
        out["nullable"] = True
    return out


def request_schemas() -> dict[str, Any]:
    """The request bodies' component schemas, generated from the decoders' records."""
    _, generated = msgspec.json.schema_components((*REQUEST_RECORDS, NodeReport), ref_template=_REF)
    schemas: dict[str, Any] = _openapi30(generated)
    for (record, field), target in READ_AS.items():  # kept as sent by the decoder, then read as `target`
        prop = schemas[record]["properties"][field]
        if prop.get("type") == "array":
            prop["items"] = _ref(target)
        else:
            schemas[record]["properties"][field] = _ref(target)
    for key in ACCEPTED:  # one component per value, named by both forms below
        schemas[f"Annotation.{key}"] = value_schema(key)
    job = {key: _ref(f"Annotation.{key}") for key in ACCEPTED}
    schemas["JobAnnotations"] = {
        "type": "object", "properties": job, "additionalProperties": False,
        "description": "A job's annotations without the `deepres.io/` prefix (the keys are accepted with it too)."}
    schemas["PodAnnotations"] = {
        "type": "object", "properties": {PREFIX + key: value for key, value in job.items()},
        "additionalProperties": {"type": "string"},
        "description": "A pod's annotations: the `deepres.io/` keys are read, others are ignored."}
    schemas["PredictRequest"] = {"description": "JobSpec keys, `{\"annotations\": {...}}` of them, or a Pod; "
                                                "with `gpu` (and optionally `software`): the demand on that GPU "
                                                "model (docs/calibration.md).",
                                 "anyOf": [
        _ref("JobAnnotations"),
        {"type": "object", "properties": {"annotations": _ref("JobAnnotations"), **_GPU_FIELDS},
         "required": ["annotations"], "additionalProperties": False},
        {"type": "object", "required": ["metadata"], "properties": {"metadata": {
            "type": "object", "properties": {"annotations": _ref("PodAnnotations")}}, **_GPU_FIELDS}},
    ]}
    return schemas


_GPU_FIELDS: dict[str, Any] = {
    "gpu": {"type": "string", "minLength": 1, "maxLength": 256,
            "description": "The GPU model's NVML name (e.g. `NVIDIA A100-SXM4-40GB`): answer `on_gpu`, the demand "
                           "the filter admits on that model now (per-GPU line + live calibration)."},
    "software": {"type": "string", "maxLength": 256,
                 "description": "The node software as the calibration keys it (`driver/CUDA`, as the agent "
                                "reports them); default: the one with the most observed pods of that GPU model. "
                                "Read only with `gpu`."},
}
_ON_GPU: dict[str, Any] = {"type": "object", "nullable": True, "description": (
    "The demand on the GPU model the request named (MiB per GPU); null for a pod admitted without a model "
    "prediction (gpu-memory override, not a GPU job)."), "properties": {
        "gpu": {"type": "string"}, "software": {"type": "string"},
        "path": {"type": "string", "enum": ["exact", "family"]},
        "offline_mib": {"type": "number"}, "offline_upper_mib": {"type": "number"},
        "line": {"type": "boolean", "description": "a measured per-GPU line applied"},
        "memory_mib": {"type": "number"}, "memory_mib_upper": {"type": "number"},
        "calibrated": {"type": "boolean", "description": "the live calibration applied"},
        "pods": {"type": "integer", "description": "pods the calibration was learned from"},
        "admission_mib": {"type": "number", "description": "what the filter admits the pod at on this model"},
        "regime": {"type": "string", "enum": ["small", "medium", "large"],
                   "description": "the batch regime whose scale the calibrated bound is taken at"}}}

RESPONSE_SCHEMAS: dict[str, Any] = {
    "ExtenderFilterResult": {"type": "object", "properties": {
        "Nodes": {"allOf": [_ref("NodeList")], "nullable": True},
        "NodeNames": {"type": "array", "items": {"type": "string"}},
        "FailedNodes": _STR_MAP, "FailedAndUnresolvableNodes": _STR_MAP, "Error": {"type": "string"}},
        "required": ["NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"]},
    "HostPriorityList": {"type": "array", "items": {"type": "object", "properties": {
        "Host": {"type": "string"}, "Score": {"type": "integer", "minimum": 0, "maximum": 10}},
        "required": ["Host", "Score"]}},
    "ExtenderBindingResult": {"type": "object", "properties": {"Error": {"type": "string"}}, "required": ["Error"]},
    "ExtenderPreemptionResult": {"type": "object", "properties": {
        "NodeNameToMetaVictims": {"type": "object", "additionalProperties": _ref("MetaVictims")}},
        "required": ["NodeNameToMetaVictims"]},
    "TelemetryResult": {"type": "object", "properties": {"accepted": {"type": "boolean"},
                                                          "outcome": {"type": "string"},
                                                          "deltas": {"type": "boolean"}}},
    "PredictResult": {"type": "object", "properties": {
        "gpu_job": {"type": "boolean"}, "gpus": {"type": "integer"},
        "demand": {"type": "object", "nullable": True, "properties": {
            "memory_mib": {"type": "number"}, "memory_mib_upper": {"type": "number"},
            "gflops_per_iteration": {"type": "number"}, "gpu_seconds": {"type": "number"},
            "model_version": {"type": "string"}, "warnings": {"type": "array", "items": {"type": "string"}},
            "step_seconds": {"type": "number"}, "step_parts": {"type": "array", "items": {"type": "number"}}}},
        "admission_memory_mib": {"type": "number"}, "admission_source": {"type": "string"},
        "priority": {"type": "number"}, "criticality": {"type": "integer"},
        "predictor_version": {"type": "string"}, "on_gpu": _ON_GPU}},
    "AllocateRequest": {"type": "object", "required": ["node", "resource", "size", "pods"], "properties": {
        "node": {"type": "string"}, "resource": {"type": "string"}, "size": {"type": "integer", "minimum": 1},
        "pods": {"type": "array", "items": {"type": "object", "required": ["uid", "namespace", "name", "allocated"],
                                            "properties": {"uid": {"type": "string"}, "namespace": {"type": "string"},
                                                           "name": {"type": "string"},
                                                           "allocated": {"type": "boolean"}}}}}},
    "AllocateResult": {"type": "object", "properties": {
        "pod": {"type": "object", "properties": {"uid": {"type": "string"}, "namespace": {"type": "string"},
                                                 "name": {"type": "string"}}},
        "gpus": {"type": "array", "items": {"type": "string"}}}},
    "AdmissionReview": {"type": "object", "required": ["apiVersion", "kind", "request"], "properties": {
        "apiVersion": {"type": "string", "enum": ["admission.k8s.io/v1"]},
        "kind": {"type": "string", "enum": ["AdmissionReview"]},
        "request": {"type": "object", "required": ["uid"], "properties": {
            "uid": {"type": "string", "minLength": 1, "maxLength": 128},
            "kind": {"type": "object", "properties": {"group": {"type": "string"}, "version": {"type": "string"},
                                                      "kind": {"type": "string"}}},
            "operation": {"type": "string"}, "object": {"type": "object", "nullable": True}}}}},
    "AdmissionReviewResult": {"type": "object", "properties": {
        "apiVersion": {"type": "string"}, "kind": {"type": "string"},
        "response": {"type": "object", "properties": {
            "uid": {"type": "string"}, "allowed": {"type": "boolean"}, "patchType": {"type": "string"},
            "patch": {"type": "string", "description": "base64 of an RFC 6902 JSON Patch"}}}}},
    "Error": _ERROR,
}


def _json(ref: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}}


def _verb(summary: str, args: str, result: str) -> dict[str, Any]:
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": _json(args)},
        "responses": {
            "200": {"description": "The answer; problems are reported in it (kube-scheduler treats non-200 as "
                                   "an error).", "content": _json(result)},
            "403": {"description": "A caller that server.verbs_access does not admit (the verbs answer only the "
                                   "scheduler: on loopback, or with its client certificate).",
                    "content": _json("Error")},
            "408": {"description": "Body not received within server.body_timeout_s.", "content": _json("Error")},
            "413": {"description": "Body too large.", "content": _json("Error")},
            "503": {"description": "Too many request bodies held at once (server.body_buffer_bytes): retry.",
                    "content": _json("Error")},
        },
    }}


@cache
def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.0 document (made once: the caller must not change it)."""
    return {
        "openapi": "3.0.3",
        "info": {"title": "deepres extender", "version": __version__,
                 "description": "kube-scheduler extender v1 verbs, agent telemetry, predictions and probes."},
        "paths": {
            "/filter": _verb("Nodes that can take the pod, and why the others cannot.", "ExtenderArgsBody",
                             "ExtenderFilterResult"),
            "/prioritize": _verb("Scores 0..10 (DeepRes).", "ExtenderArgsBody", "HostPriorityList"),
            "/bind": _verb("Choose GPUs, reserve, annotate the pod, create the Binding.", "ExtenderBindingArgs",
                           "ExtenderBindingResult"),
            "/preempt": _verb("Victims per node (strictly lower priority only).", "ExtenderPreemptionArgs",
                              "ExtenderPreemptionResult"),
            "/v1/telemetry": {"post": {
                "summary": "An agent's report (bearer token).",
                "security": [{"bearer": []}],
                "requestBody": {"required": True, "content": _json("NodeReport")},
                "responses": {
                    "200": {"description": "Accepted, or ignored as an old sequence.",
                            "content": _json("TelemetryResult")},
                    "400": {"description": "Not a valid report, or of a node the cluster does not have.",
                            "content": _json("Error")},
                    "401": {"description": "Missing or invalid token, or a token bound to another node.",
                            "content": _json("Error")},
                    "408": {"description": "Body not received within server.body_timeout_s.",
                            "content": _json("Error")},
                    "409": {"description": "Accepted without the GPUs another node owns (named in the error and "
                                           "refused_gpus; a GPU UUID belongs to the node that reported it first), "
                                           "or a delta report that does not apply to the last report held "
                                           "(outcome full_report_needed: send it whole).",
                            "content": _json("Error")},
                    "413": {"description": "Body too large.", "content": _json("Error")},
                    "503": {"description": "Too many token reviews in flight: retry after Retry-After.",
                            "content": _json("Error")},
                }}},
            "/v1/allocate": {"post": {
                "summary": "The device plugin's handshake at a kubelet Allocate: which pod of the caller's node "
                           "and which GPUs (bearer token bound to that node).",
                "security": [{"bearer": []}],
                "requestBody": {"required": True, "content": _json("AllocateRequest")},
                "responses": {
                    "200": {"description": "The pod served and its GPUs.", "content": _json("AllocateResult")},
                    "400": {"description": "A malformed request.", "content": _json("Error")},
                    "401": {"description": "Missing or invalid token.", "content": _json("Error")},
                    "403": {"description": "The token is bound to another node.", "content": _json("Error")},
                    "409": {"description": "No pod can be told for this Allocate (the plugin refuses it).",
                            "content": _json("Error")},
                    "413": {"description": "Body too large.", "content": _json("Error")},
                    "503": {"description": "Too many token reviews in flight: retry after Retry-After.",
                            "content": _json("Error")},
                }}},
            "/v1/mutate": {"post": {
                "summary": "The mutating admission webhook (clusters without the MutatingAdmissionPolicy): a pod "
                           "carrying deepres job annotations gets deepres' schedulerName and its GPU request "
                           "(a JSON Patch); never refused.",
                "requestBody": {"required": True, "content": _json("AdmissionReview")},
                "responses": {
                    "200": {"description": "Allowed, with the patch when the pod needs one.",
                            "content": _json("AdmissionReviewResult")},
                    "400": {"description": "Not an admission.k8s.io/v1 AdmissionReview.", "content": _json("Error")},
                    "413": {"description": "Body too large.", "content": _json("Error")},
                }}},
            "/v1/predict": {"post": {
                "summary": "The demand of an annotated pod or JobSpec.",
                "requestBody": {"required": True, "content": _json("PredictRequest")},
                "responses": {
                    "200": {"description": "The demand and admission memory.", "content": _json("PredictResult")},
                    "400": {"description": "A malformed job description.", "content": _json("Error")},
                    "409": {"description": "The predictor is not loaded yet.", "content": _json("Error")},
                    "413": {"description": "Body too large.", "content": _json("Error")},
                    "429": {"description": "More than server.predict_rate_per_s requests a second from this "
                                           "address: retry after Retry-After.", "content": _json("Error")},
                }}},
            "/healthz": {"get": {"summary": "Liveness.", "responses": {"200": {"description": "Alive."}}}},
            "/readyz": {"get": {"summary": "Readiness: predictor loaded and, in a cluster, first sync done.",
                                "responses": {"200": {"description": "Ready."},
                                              "503": {"description": "Not ready; `waiting_for` says on what."}}}},
            "/metrics": {"get": {"summary": "Prometheus metrics.", "responses": {
                "200": {"description": "Text exposition format.", "content": {"text/plain": {"schema": {
                    "type": "string"}}}}}}},
            "/openapi.json": {"get": {"summary": "This document.",
                                      "responses": {"200": {"description": "OpenAPI 3."}}}},
        },
        "components": {
            "schemas": {**request_schemas(), **RESPONSE_SCHEMAS},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
