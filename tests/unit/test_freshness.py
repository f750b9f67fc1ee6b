"""No report is older than the code it measures (devtools/freshness.py).

Why: figures in the README and docs came from reports made before later changes to the very code they
measure, and nothing said so. Each stamped report section records the commit it was made at; a commit
after it that touched what the section measures makes it stale, and `python -m devtools.freshness` names
it with the command that remakes it. The rule itself is checked on a git repository made here.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from devtools import freshness

ROOT = Path(__file__).resolve().parents[2]


def test_every_stamped_section_of_every_report_says_what_it_measures() -> None:
    unmapped = [f"{path.relative_to(ROOT)} {where}" for path in sorted((ROOT / "reports").glob("*.json"))
                for where, _ in freshness.stamps(json.loads(path.read_text()))
                if freshness.measured_paths(str(path.relative_to(ROOT)), where) is None]
    assert not unmapped, f"stamped report sections with no entry in devtools/freshness.py MEASURES: {unmapped}"
    for paths in freshness.MEASURES.values():
        missing = [p for p in paths if not (ROOT / p).exists()]
        assert not missing, f"MEASURES names paths that do not exist: {missing}"


def test_every_stale_section_is_named_with_the_command_that_remakes_it() -> None:
    """Which sections are stale is listed, not failed on: a section of reports/bench-cluster.json takes an hour
    of this machine to remake and any change to the serving code stales it, so remaking every report at every
    commit would stop all work; `python -m devtools.freshness` prints the list with each rerun command."""
    for section in freshness.sections():
        assert section.commit and section.command, f"{section.report} {section.section}: no commit or command"


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                          capture_output=True, text=True, check=True, timeout=60)
    return done.stdout.strip()


def test_a_commit_to_the_measured_code_makes_the_report_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    (repo / "reports").mkdir(parents=True)
    (repo / "extender" / "simulate").mkdir(parents=True)
    (repo / "docs").mkdir()
    _git(repo, "init", "-q")
    (repo / "extender" / "simulate" / "capacity.py").write_text("RATE = 1\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "code")
    made_at = _git(repo, "rev-parse", "HEAD")
    report = {"capacity": {"provenance": {"commit": made_at, "command": "deepres simulate --experiment capacity"}}}
    (repo / "reports" / "simulation.json").write_text(json.dumps(report))
    (repo / "docs" / "page.md").write_text("words\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "the report, and a page")
    monkeypatch.setattr(freshness, "ROOT", repo)
    (capacity,) = [s for s in freshness.sections(repo) if s.section == "capacity"]
    assert not capacity.stale, "a commit outside what it measures (the report itself, a page) is no change"
    (repo / "extender" / "simulate" / "capacity.py").write_text("RATE = 2\n")
    _git(repo, "commit", "-qam", "a new rate")
    (capacity,) = [s for s in freshness.sections(repo) if s.section == "capacity"]
    assert capacity.stale and capacity.changed_by[0].endswith("a new rate")
    report["capacity"]["provenance"]["commit"] = "0" * 40  # a commit this history does not hold
    (repo / "reports" / "simulation.json").write_text(json.dumps(report))
    (capacity,) = [s for s in freshness.sections(repo) if s.section == "capacity"]
    assert capacity.stale and "not in this history" in capacity.changed_by[0]
