"""The docs' generated parts are what their sources say today, and every `deepres` flag the docs name
exists.

Why: the values table and the CLI reference were hand-kept copies in the README; a value added to the
chart or a flag renamed left them wrong without anything noticing. Fix a failure with
`deepres report docs` (it rewrites docs/values.md's table and docs/cli.md) and commit the result.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

import pytest

from devtools import docsgen

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]

# flags of other tools the guides show (helm, kubectl, pip, buildah, kube-scheduler): anything else
# that looks like a flag must be one of deepres'
FOREIGN_FLAGS = {
    "--all", "--build-arg", "--create-namespace", "--field-selector", "--include", "--index-url",
    "--isolation", "--kube-api-qps", "--namespace", "--raw", "--reuse-values", "--set", "--set-json", "--v",
    "--variant", "--strict",
    # kube-apiserver (docs/device-plugin.md) and pip (docs/trial.md's wheel download for a lent GPU)
    "--runtime-config", "--no-cache-dir", "--no-compile", "--no-deps", "--no-index", "--only-binary", "--platform",
    "--python-version", "--implementation", "--target", "--upgrade",
    "--zygote",  # devtools/trial_jobs.py's job starter, which docs/trial.md describes
    "--dry-run",  # helm's, and deploy/push-images.sh's (docs/getting-started.md, docs/admin.md)
    "--api-versions",  # helm template's (docs/device-plugin.md, docs/values.md: the webhook or the policy)
}


@pytest.fixture(scope="module")
def parsers() -> dict[str, argparse.ArgumentParser]:
    return docsgen.command_parsers()


def test_the_values_table_is_the_schema_s() -> None:
    page = docsgen.VALUES_PAGE.read_text()
    assert page == docsgen.render_values_page(page), "docs/values.md differs from values.schema.json: " \
        "run `deepres report docs`"


def test_every_schema_value_has_one_row_with_its_type() -> None:
    schema = json.loads((docsgen.CHART / "values.schema.json").read_text())
    rows = {}
    for line in docsgen.VALUES_PAGE.read_text().splitlines():
        found = re.match(r"\| `([^`]+)` \| ([^|]+) \|", line)
        if found:
            rows[found.group(1)] = found.group(2)
    for key in ("scheduler.replicas", "extender.port", "agent.intervalSeconds", "pdb.enabled"):
        node = schema
        for part in key.split("."):
            node = node["properties"][part]
        assert key in rows, f"docs/values.md has no row for {key}"
        assert str(node["type"]) in rows[key], f"{key}: the table says {rows[key]!r}, the schema {node['type']!r}"


def test_a_schema_change_changes_the_table(tmp_path: Path) -> None:
    chart = tmp_path / "deepres"
    shutil.copytree(docsgen.CHART, chart)
    schema = json.loads((chart / "values.schema.json").read_text())
    schema["properties"]["pdb"]["properties"]["enabled"]["type"] = "string"
    (chart / "values.schema.json").write_text(json.dumps(schema))
    page = docsgen.VALUES_PAGE.read_text()
    assert docsgen.render_values_page(page, chart) != page


def test_the_cli_reference_is_the_parsers(parsers: dict[str, argparse.ArgumentParser]) -> None:
    assert docsgen.CLI_PAGE.read_text() == docsgen.cli_reference(), "docs/cli.md differs from the parsers: " \
        "run `deepres report docs`"


def test_every_deepres_flag_the_docs_name_exists(parsers: dict[str, argparse.ArgumentParser]) -> None:
    from devtools import bench_calibration, calibration_offline, replay_probe, trial
    from predictor import family_eval

    runner = argparse.ArgumentParser()  # `python -m devtools.trial` (docs/trial.md), a tool beside the CLI
    trial.add_arguments(runner)
    probes = list(replay_probe.parsers().values())  # `python -m devtools.replay_probe` (docs/capacity.md)
    tools = [calibration_offline.parser(),  # `python -m devtools.calibration_offline` (docs/calibration.md)
             bench_calibration.parser(),  # `python -m devtools.bench_calibration --safety` (docs/calibration.md)
             family_eval.parser()]  # `python -m predictor.family_eval` (docs/predictor.md)
    every_flag = set().union(*(docsgen.flags_of(p) for p in [*parsers.values(), runner, *probes, *tools]))
    problems = []
    for page in PAGES:
        text = page.read_text()
        problems += [f"{page.name}: {p}" for p in docsgen.unknown_flags(text, parsers)]
        loose = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*[a-z0-9])(?![\w-])", text)) - every_flag - FOREIGN_FLAGS
        problems += [f"{page.name}: {flag} (no deepres command has it)" for flag in sorted(loose)]
    assert not problems, problems


def test_a_flag_that_does_not_exist_is_caught(parsers: dict[str, argparse.ArgumentParser]) -> None:
    text = "Run `deepres simulate --experiment compute --no-such-flag` then deepres bench extender --nodes 10 --nope"
    assert docsgen.unknown_flags(text, parsers) == ["deepres simulate --no-such-flag", "deepres bench extender --nope"]
    assert docsgen.unknown_flags("deepres simulate --experiment compute --json", parsers) == []


def test_every_metric_the_docs_name_is_exported() -> None:
    """A full `deepres_*` metric name in the docs (alerts, dashboard, agent table) is one the code exports
    (counters may be declared without `_total`, histograms are queried by `_bucket`/`_count`/`_sum`)."""
    code = " ".join(p.read_text() for p in (ROOT / "extender").rglob("*.py"))
    # a report's own keys (the capacity experiment's policies, e.g. `deepres_memory`) are named too: they are
    # checked against the reports, not the metrics
    report_keys: set[str] = set()

    def keys(value: object) -> None:
        if isinstance(value, dict):
            report_keys.update(value)
            for v in value.values():
                keys(v)
        elif isinstance(value, list):
            for v in value:
                keys(v)

    for report in (ROOT / "reports").glob("*.json"):
        keys(json.loads(report.read_text()))
    missing = []
    for page in PAGES:
        for name in set(re.findall(r"\bdeepres_[a-z0-9_]*[a-z0-9]\b", page.read_text())):
            base = re.sub(r"_(bucket|count|sum)$", "", name)
            if name in report_keys:
                continue
            if not any(f'"{n}"' in code for n in (base, base.removesuffix("_total"))):
                missing.append(f"{page.name}: {name}")
    assert not missing, missing
