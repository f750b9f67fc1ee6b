"""The OpenAPI 3 description of every HTTP endpoint of the extender (served at /openapi.json).

The extender v1 schemas mirror kube-scheduler's Go structs (keys are the Go field names); Pod and
Node objects are left open (`type: object`), as they are Kubernetes' own.
"""

from __future__ import annotations

from typing import Any

from extender import __version__

_OBJ = {"type": "object"}
_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_ERROR = {"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]}

SCHEMAS: dict[str, Any] = {
    "Pod": {"type": "object", "description": "A Kubernetes Pod (v1) as kube-scheduler serialises it.",
            "properties": {"metadata": {"type": "object", "properties": {
                "name": {"type": "string"}, "namespace": {"type": "string"}, "uid": {"type": "string"},
                "annotations": _STR_MAP, "creationTimestamp": {"type": "string"}}},
                "spec": _OBJ, "status": _OBJ}},
    "NodeList": {"type": "object", "properties": {"items": {"type": "array", "items": _OBJ}}},
    "ExtenderArgs": {"type": "object", "properties": {
        "Pod": {"$ref": "#/components/schemas/Pod"},
        "Nodes": {"oneOf": [{"$ref": "#/components/schemas/NodeList"}], "nullable": True},
        "NodeNames": {"type": "array", "items": {"type": "string"}, "nullable": True}}},
    "ExtenderFilterResult": {"type": "object", "properties": {
        "Nodes": {"oneOf": [{"$ref": "#/components/schemas/NodeList"}], "nullable": True},
        "NodeNames": {"type": "array", "items": {"type": "string"}},
        "FailedNodes": _STR_MAP, "FailedAndUnresolvableNodes": _STR_MAP, "Error": {"type": "string"}},
        "required": ["NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"]},
    "HostPriorityList": {"type": "array", "items": {"type": "object", "properties": {
        "Host": {"type": "string"}, "Score": {"type": "integer", "minimum": 0, "maximum": 10}},
        "required": ["Host", "Score"]}},
    "ExtenderBindingArgs": {"type": "object", "properties": {
        "PodName": {"type": "string"}, "PodNamespace": {"type": "string"}, "PodUID": {"type": "string"},
        "Node": {"type": "string"}}},
    "ExtenderBindingResult": {"type": "object", "properties": {"Error": {"type": "string"}}, "required": ["Error"]},
    "MetaVictims": {"type": "object", "properties": {
        "Pods": {"type": "array", "items": {"type": "object", "properties": {"UID": {"type": "string"}}}},
        "NumPDBViolations": {"type": "integer"}}},
    "Victims": {"type": "object", "properties": {
        "Pods": {"type": "array", "items": {"$ref": "#/components/schemas/Pod"}},
        "NumPDBViolations": {"type": "integer"}}},
    "ExtenderPreemptionArgs": {"type": "object", "properties": {
        "Pod": {"$ref": "#/components/schemas/Pod"},
        "NodeNameToVictims": {"type": "object", "additionalProperties": {"$ref": "#/components/schemas/Victims"},
                              "nullable": True},
        "NodeNameToMetaVictims": {"type": "object",
                                  "additionalProperties": {"$ref": "#/components/schemas/MetaVictims"},
                                  "nullable": True}}},
    "ExtenderPreemptionResult": {"type": "object", "properties": {
        "NodeNameToMetaVictims": {"type": "object",
                                  "additionalProperties": {"$ref": "#/components/schemas/MetaVictims"}}},
        "required": ["NodeNameToMetaVictims"]},
    "NodeReport": {"type": "object", "description": "Agent telemetry (extender/telemetry.py).",
                   "properties": {"node": {"type": "string"}, "sequence": {"type": "integer"},
                                  "timestamp_s": {"type": "number"}, "agent_version": {"type": "string"},
                                  "source": {"type": "string", "enum": ["nvml", "simulated"]},
                                  "gpus": {"type": "array", "items": _OBJ}, "pods": {"type": "array", "items": _OBJ},
                                  "interval_s": {"type": "number"}, "schema_version": {"type": "integer"},
                                  "boot_id": {"type": "string", "maxLength": 64}},
                   "required": ["node", "sequence", "timestamp_s", "agent_version", "source", "gpus"]},
    "TelemetryResult": {"type": "object", "properties": {"accepted": {"type": "boolean"},
                                                          "outcome": {"type": "string"}}},
    "PredictRequest": {"type": "object", "description": "A Pod, {\"annotations\": {...}}, or JobSpec keys "
                                                        "(`model-type`, `batch-size`, ... with or without prefix).",
                       "properties": {"annotations": _STR_MAP, "metadata": _OBJ},
                       "additionalProperties": {"type": "string"}},
    "PredictResult": {"type": "object", "properties": {
        "gpu_job": {"type": "boolean"}, "gpus": {"type": "integer"},
        "demand": {"type": "object", "nullable": True, "properties": {
            "memory_mib": {"type": "number"}, "memory_mib_upper": {"type": "number"},
            "gflops_per_iteration": {"type": "number"}, "gpu_seconds": {"type": "number"},
            "model_version": {"type": "string"}, "warnings": {"type": "array", "items": {"type": "string"}}}},
        "admission_memory_mib": {"type": "number"}, "admission_source": {"type": "string"},
        "priority": {"type": "number"}, "criticality": {"type": "integer"},
        "predictor_version": {"type": "string"}}},
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


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.0 document."""
    return {
        "openapi": "3.0.3",
        "info": {"title": "deepres extender", "version": __version__,
                 "description": "kube-scheduler extender v1 verbs, agent telemetry, predictions and probes."},
        "paths": {
            "/filter": _verb("Nodes that can take the pod, and why the others cannot.", "ExtenderArgs",
                             "ExtenderFilterResult"),
            "/prioritize": _verb("Scores 0..10 (DeepRes).", "ExtenderArgs", "HostPriorityList"),
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
                    "413": {"description": "Body too large.", "content": _json("Error")},
                    "503": {"description": "Too many token reviews in flight: retry after Retry-After.",
                            "content": _json("Error")},
                }}},
            "/v1/predict": {"post": {
                "summary": "The demand of an annotated pod or JobSpec.",
                "requestBody": {"required": True, "content": _json("PredictRequest")},
                "responses": {
                    "200": {"description": "The demand and admission memory.", "content": _json("PredictResult")},
                    "400": {"description": "A malformed job description.", "content": _json("Error")},
                    "409": {"description": "The predictor is not loaded yet.", "content": _json("Error")},
                    "413": {"description": "Body too large.", "content": _json("Error")},
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
            "schemas": SCHEMAS,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
