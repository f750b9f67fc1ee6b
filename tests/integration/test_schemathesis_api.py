"""Schemathesis against the production server's own /openapi.json, with every check but one (below): each
operation gets generated bodies, a schema-valid body must be accepted (positive_data_acceptance; for
/filter and /bind, which answer 200 either way, not refused as malformed in `Error`), the answers must
conform to the document, and none may be a server error.

The request schemas are generated from the records the decoders validate against (extender/server/openapi.py),
so a rule tightened in a decoder alone makes this test fail (seen: `deepres.io/gpus` capped at 8 in the
annotation parser, `interval_s` capped at 600 in the report parser, a Pod name capped at 5 characters).
negative_data_rejection stays off, by the protocols' design, not for convenience: the verbs answer a
malformed body with 200 and the problem in `Error` (kube-scheduler reads any other status as an
extender failure), a report keeps a schema-breaking GPU as an unhealthy one, and a number in an
annotation is a string whose spellings (3e-4, 032) a pattern cannot list. Bounded for CI (~1 minute).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import checks

from extender.annotations import TASK_ACROSS_KEYS
from extender.server.openapi import openapi_document
from tests.fixtures.kube.server import TOKEN, running_server

EXAMPLES_PER_OPERATION = 150
#: every operation of the document (schemathesis leaves out the document's own URL)
OPERATIONS = {"POST /filter", "POST /prioritize", "POST /bind", "POST /preempt", "POST /v1/telemetry",
              "POST /v1/allocate", "POST /v1/mutate", "POST /v1/predict", "GET /healthz", "GET /readyz", "GET /metrics"}


def verb_takes_a_schema_valid_body(path: str, body: Any, answer: Any) -> None:
    """positive_data_acceptance for the verbs, which answer 200 either way: a schema-valid body must not
    be refused as malformed (`bad Extender...Args`), unless it breaks the one rule across fields that
    the schema states in words (one of NodeNames / Nodes given)."""
    if path == "/filter" and body.get("NodeNames") is None and body.get("Nodes") is None:
        return
    assert not answer["Error"].startswith("bad Extender"), f"{path} refused a schema-valid body: {answer['Error']}"


#: /v1/predict's one refusal of a schema-valid body: the task/model rule the `task` schema states in words
TASK_OF_MODEL = re.compile(r"^deepres\.io/task='[^']*' is not valid: expected one of .+ for \S+$")


def predict_takes_a_schema_valid_body(body: Any, status: int, answer: Any) -> None:
    """positive_data_acceptance for /v1/predict: a schema-valid body is answered (200, or 409 while the
    predictor loads), or refused (400) only for the rule across keys that the schema states in words."""
    if status == 400:
        annotations = body.get("annotations", body) if isinstance(body, dict) else {}
        if isinstance(body, dict) and isinstance(body.get("metadata"), dict):  # a Pod: its prefixed annotations
            annotations = {k.removeprefix("deepres.io/"): v for k, v in
                           (body["metadata"].get("annotations") or {}).items()}
        assert "model" in annotations and "task" in annotations, f"schema-valid body refused: {answer}"
        assert TASK_OF_MODEL.match(answer["error"]), f"schema-valid body refused: {answer}"
        assert TASK_ACROSS_KEYS in json.dumps(openapi_document())  # the rule is in the document
        return
    assert status in (200, 409), f"schema-valid body answered {status}: {answer}"


def test_api_conforms_to_its_openapi_document(tmp_path: Path) -> None:
    started = time.monotonic()
    # 150 predictions a second from one address: the rate limit (a 429 is documented) would refuse most
    with running_server(tmp_path, env={"DEEPRES_PREDICT_RATE_PER_S": "0"}) as url:
        schema = schemathesis.openapi.from_url(url + "/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
        assert {op.label for op in operations} == OPERATIONS
        for operation in operations:

            @given(case=operation.as_strategy())
            @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, suppress_health_check=list(HealthCheck),
                      database=None, derandomize=True)
            def check(case: Any) -> None:
                excluded = [checks.negative_data_rejection]
                if case.path == "/v1/predict":  # positive_data_acceptance, less the rule stated in words
                    excluded.append(checks.positive_data_acceptance)
                if case.path == "/v1/allocate":  # a valid request is answered 409 while no pod awaits its GPUs
                    excluded.append(checks.positive_data_acceptance)
                response = case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN}"},
                                                  excluded_checks=excluded)
                if case.path in ("/filter", "/bind"):
                    verb_takes_a_schema_valid_body(case.path, case.body, response.json())
                if case.path == "/v1/predict":
                    predict_takes_a_schema_valid_body(case.body, response.status_code, response.json())

            check()
    print(f"{len(operations)} operations, {EXAMPLES_PER_OPERATION} examples each, {time.monotonic() - started:.1f} s")
