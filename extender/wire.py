"""msgspec's validation errors as (place, problem): one reading for every decoder of the wire records
(the telemetry report, the extender protocol), each of which prefixes the place with its own root."""

from __future__ import annotations

import re

import msgspec

_AT = re.compile(r"^(?P<problem>.*?)(?: - at `\$(?P<at>[^`]*)`)?$", re.DOTALL)
_MISSING_FIELD = re.compile(r"^Object missing required field `(?P<field>[^`]*)`$")


def place(err: msgspec.ValidationError) -> tuple[str, str]:
    """"Expected `int` >= 0 - at `$.gpus[0].index`" -> (".gpus[0].index", "Expected `int` >= 0"); a
    missing field is named in the place ("Object missing required field `uuid` - at `$.gpus[0]`" ->
    (".gpus[0].uuid", "is required"))."""
    match = _AT.match(str(err))
    problem, at = (match.group("problem"), match.group("at") or "") if match else (str(err), "")
    missing = _MISSING_FIELD.match(problem)
    if missing:
        return f"{at}.{missing.group('field')}", "is required"
    return at, problem
