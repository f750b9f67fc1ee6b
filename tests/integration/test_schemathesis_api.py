"""A bounded schemathesis run against the production server's own /openapi.json: every operation,
generated bodies, and the responses must conform to the document and never be a server error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import checks

from tests.fixtures.kube.server import running_server

EXAMPLES_PER_OPERATION = 15


def test_api_conforms_to_its_openapi_document(tmp_path: Path) -> None:
    with running_server(tmp_path) as url:
        schema = schemathesis.openapi.from_url(url + "/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
        labels = {op.label for op in operations}
        assert {"POST /filter", "POST /prioritize", "POST /bind", "POST /preempt", "POST /v1/telemetry",
                "POST /v1/predict", "GET /readyz"} <= labels, labels
        for operation in operations:

            @given(case=operation.as_strategy())
            @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, suppress_health_check=list(HealthCheck),
                      database=None, derandomize=True)
            def check(case: Any) -> None:
                # semantic validation (a JobSpec's ranges, the report's cross-field rules) is stricter
                # than a JSON schema can say: a schema-valid body may rightly get a 400 with a reason
                case.call_and_validate(excluded_checks=[checks.positive_data_acceptance])

            check()
