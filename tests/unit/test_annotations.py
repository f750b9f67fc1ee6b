"""Pod annotations -> JobRequest: defaults, overrides, deadlines, criticality caps, clear errors."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.annotations import (
    ACCEPTED,
    KNOWN_KEYS,
    PREFIX,
    SCHEDULING_KEYS,
    WRITTEN_KEYS,
    AnnotationError,
    parse_duration_s,
    parse_job,
    parse_memory_quantity,
    value_schema,
)

NOW = 1_800_000_000.0
CREATED = NOW - 3600.0


def job(**annotations: str):  # type: ignore[no-untyped-def]
    return parse_job({PREFIX + k.replace("_", "-"): v for k, v in annotations.items()}, created_s=CREATED, now_s=NOW)


def test_not_a_gpu_job_without_model_type_or_gpu_memory() -> None:
    assert not parse_job({"app": "web"}, created_s=None, now_s=NOW).gpu_job


def test_job_keys_go_to_jobspec_and_scheduling_keys_are_read() -> None:
    request = job(model_type="BERT", batch_size="16", gpus="2", deadline="6h", criticality="high")
    assert request.gpu_job and request.spec is not None
    assert request.spec.model_type == "transformer" and request.spec.batch_size == 16
    assert request.gpus == 2 and request.deadline_s == CREATED + 6 * 3600
    assert request.criticality == 2 and request.memory_override_mib is None
    assert request.signature and request.signature == job(model_type="bert", batch_size="16").signature


def test_gpu_memory_override_alone_is_a_gpu_job_without_prediction() -> None:
    request = job(gpu_memory="24Gi")
    assert request.gpu_job and request.spec is None and request.memory_override_mib == 24 * 1024


@pytest.mark.parametrize(("text", "mib"), [("24Gi", 24576.0), ("24576Mi", 24576.0), ("1Ti", 1048576.0),
                                           ("2G", 2e9 / 2**20), ("512Mi", 512.0), (" 1.5Gi ", 1536.0)])
def test_memory_quantities(text: str, mib: float) -> None:
    assert parse_memory_quantity(text) == pytest.approx(mib)


@pytest.mark.parametrize(("text", "seconds"), [("6h", 21600.0), ("1h30m", 5400.0), ("2d", 172800.0), ("90s", 90.0)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration_s(text) == seconds


def test_rfc3339_deadline() -> None:
    expected = datetime(2027, 1, 15, 7, 0, tzinfo=UTC).timestamp()
    assert job(model_type="cnn", deadline="2027-01-15T08:00:00+01:00").deadline_s == expected
    assert job(model_type="cnn", deadline="2027-01-15T07:00:00Z").deadline_s == expected


@pytest.mark.parametrize(
    ("annotations", "key", "accepted_part"),
    [
        ({"model-type": "cnnx"}, "deepres.io/model-type", "cnn"),
        ({"model-type": "cnn", "batch-size": "big"}, "deepres.io/batch-size", "whole number"),
        ({"model-type": "cnn", "gpus": "0"}, "deepres.io/gpus", "1 to 64"),
        ({"model-type": "cnn", "gpus": "1.5"}, "deepres.io/gpus", "1 to 64"),
        ({"model-type": "cnn", "deadline": "tomorrow"}, "deepres.io/deadline", "RFC 3339"),
        ({"model-type": "cnn", "deadline": "2027-01-15T08:00:00"}, "deepres.io/deadline", "zone"),
        ({"model-type": "cnn", "criticality": "urgent"}, "deepres.io/criticality", "low, normal, high, critical"),
        ({"gpu-memory": "24"}, "deepres.io/gpu-memory", "24Gi"),
        ({"gpu-memory": "10Ki"}, "deepres.io/gpu-memory", "64Mi to 4Ti"),
        ({"model-type": "cnn", "batchsize": "3"}, "deepres.io/batchsize", "deepres.io/batch-size"),
        ({"model-type": "cnn", "input-dim": "0"}, "deepres.io/input-dim", "from 1 to 10,000,000"),
        ({"model-type": "gpt", "num-layers": "0.0"}, "deepres.io/num-layers", "leave the key out"),
    ],
)
def test_errors_name_key_value_and_accepted_values(annotations: dict[str, str], key: str, accepted_part: str) -> None:
    with pytest.raises(AnnotationError) as err:
        parse_job({PREFIX + k: v for k, v in annotations.items()}, created_s=CREATED, now_s=NOW)
    assert err.value.key == key
    assert accepted_part in err.value.accepted
    assert key in str(err.value) and repr(annotations[key[len(PREFIX):]]) in str(err.value)


def test_criticality_capped_by_namespace_and_priority_class_wins() -> None:
    annotations = {PREFIX + "model-type": "cnn", PREFIX + "criticality": "critical"}
    capped = parse_job(annotations, created_s=None, now_s=NOW, criticality_ceiling=1)
    assert capped.criticality == 1 and capped.criticality_source == "annotation (capped)"
    from_class = parse_job(annotations, created_s=None, now_s=NOW, priority_value=-10, priority_class="batch-low",
                           criticality_ceiling=3)
    assert from_class.criticality == 0 and from_class.criticality_source == "PriorityClass"
    no_class = parse_job(annotations, created_s=None, now_s=NOW, priority_value=0, criticality_ceiling=3)
    assert no_class.criticality == 3


@given(st.dictionaries(
    st.sampled_from(["model-type", "batch-size", "gpus", "deadline", "criticality", "gpu-memory", "params-millions",
                     "precision", "input-dim", "unknown-key"]),
    st.one_of(st.text(max_size=12), st.sampled_from(["cnn", "gpt", "4", "0", "6h", "high", "24Gi", "amp", "-1"]))))
def test_parser_never_fails_but_with_an_annotation_error(raw: dict[str, str]) -> None:
    try:
        request = parse_job({PREFIX + k: v for k, v in raw.items()}, created_s=CREATED, now_s=NOW)
    except AnnotationError as err:
        assert err.key.startswith(PREFIX) and err.key[len(PREFIX):] in raw
        return
    assert request.gpu_job == ("model-type" in raw or "gpu-memory" in raw)
    if request.gpu_job:
        assert 1 <= request.gpus <= 64 and 0 <= request.criticality <= 3


# ---- ACCEPTED, the table /v1/predict's schema is generated from, against the parsers ----

def test_the_table_covers_every_key_a_pod_may_carry() -> None:
    assert set(ACCEPTED) == KNOWN_KEYS - set(WRITTEN_KEYS)
    assert set(SCHEDULING_KEYS) <= set(ACCEPTED)


def parses(key: str, value: str) -> bool:
    base = {} if key in ("model-type", "model", "gpu-memory") else {"model-type": "cnn"}
    try:
        parse_job({PREFIX + k: v for k, v in {**base, key: value}.items()}, created_s=CREATED, now_s=NOW)
    except AnnotationError:
        return False
    return True


@pytest.mark.parametrize("key", [k for k, rule in ACCEPTED.items() if rule.kind == "integer"])
def test_whole_number_ranges_are_the_parsers_at_both_ends(key: str) -> None:
    """The schema's range is the parser's: both ends taken, one past either end refused, by both."""
    rule, pattern = ACCEPTED[key], re.compile(value_schema(key)["pattern"])
    for value, inside in ((rule.low, True), (rule.high, True), (rule.low - 1, False), (rule.high + 1, False)):
        text = str(int(value))
        assert bool(pattern.match(text)) is inside, (key, text)
        assert parses(key, text) is inside, (key, text)


def schema_values(key: str) -> st.SearchStrategy[str]:
    schema = value_schema(key)
    if "enum" in schema:
        return st.sampled_from(schema["enum"][:50])
    return st.from_regex(schema["pattern"], fullmatch=True)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(ACCEPTED)).flatmap(lambda key: st.tuples(st.just(key), schema_values(key))))
def test_every_value_the_schema_allows_is_parsed(item: tuple[str, str]) -> None:
    key, value = item
    assert parses(key, value), item
