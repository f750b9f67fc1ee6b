"""Reports that cannot go stale (issue 33): a report the README cites records what made it
(`provenance`: commit, predictor version, policy parameters' hash, command), and this test fails when
the shipped predictor or the policy defaults no longer match what such a report was made with."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from devtools import freshness
from extender.provenance import policy_hash, predictor_version, stamp

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
CITED = sorted(set(re.findall(r"reports/[A-Za-z0-9_.-]+\.json", README)))
#: Report sections that must carry a stamp (their writers call `extender.provenance.stamp`; "(top)": the
#: report's top level); docs/capacity.md "Provenance" lists them and says which sections carry none.
STAMPED = {
    "reports/simulation.json": ("capacity", "replay"),
    "reports/interference.json": ("(top)",),
    "reports/bench-cluster.json": tuple(f"nodes_{n}.{limit}" for n in (1000, 5000)
                                        for limit in ("default_limits", "high_qps")),
    "reports/bench-extender.json": ("(top)",),
    "reports/predictor.json": ("live_calibration",),
}


@pytest.mark.parametrize("path", CITED)
def test_a_cited_reports_stamp_matches_the_shipped_predictor_and_policy(path: str) -> None:
    file = ROOT / path
    if not file.is_file():
        pytest.skip(f"{path} is cited but not committed")
    doc = json.loads(file.read_text(encoding="utf-8"))
    stamps = dict(freshness.stamps(doc))
    for section in STAMPED.get(path, ()):
        assert section in stamps, f"{path} `{section}` has no provenance: regenerate it"
    for section, prov in stamps.items():
        assert prov.get("predictor_version") == predictor_version(), (
            f"{path} {section} was made with predictor {prov.get('predictor_version')}, the shipped one is "
            f"{predictor_version()}: rerun `{prov.get('command')}`")
        assert prov.get("policy_params_hash") == policy_hash(), (
            f"{path} {section} was made with other policy defaults: rerun `{prov.get('command')}`")
        assert prov.get("commit") and prov.get("command")


def test_a_stamp_says_what_made_it() -> None:
    made = stamp("deepres simulate --experiment capacity")
    assert made["command"] == "deepres simulate --experiment capacity"
    assert made["predictor_version"] == predictor_version() != ""
    assert re.fullmatch(r"[0-9a-f]{40}|unknown", made["commit"])
    assert made["policy_params_hash"] == policy_hash()


def test_a_tree_is_dirty_for_its_code_not_for_the_reports_being_written(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`deepres bench cluster` writes its report after each cluster size: the second size's stamp must
    not call the tree dirty for the first size's part (it did: nodes_5000 `dirty: true` on clean trees)."""
    import shutil
    import subprocess

    from extender import provenance

    if shutil.which("git") is None:
        pytest.skip("no git on this machine")

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "bench.json").write_text("{}\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "one")
    monkeypatch.setattr(provenance, "REPO", tmp_path)
    assert provenance.stamp("c")["dirty"] is False
    (tmp_path / "reports" / "bench.json").write_text('{"nodes_1000": {}}\n')
    assert provenance.stamp("c")["dirty"] is False
    (tmp_path / "code.py").write_text("x = 2\n")
    assert provenance.stamp("c")["dirty"] is True


def test_a_field_added_at_the_prior_behaviour_keeps_the_hash_and_any_other_value_changes_it() -> None:
    from dataclasses import replace

    from extender.provenance import ADDED_AT_PRIOR_BEHAVIOUR, params_hash
    from extender.settings import PolicySettings

    live = PolicySettings().params()
    for name, prior in ADDED_AT_PRIOR_BEHAVIOUR.items():
        assert getattr(live, name) == prior, f"{name}'s default is no longer its prior behaviour: drop it from the list"
        assert params_hash(replace(live, **{name: "wait"})) != params_hash(live)
    assert params_hash(replace(live, max_slowdown=live.max_slowdown + 0.1)) != params_hash(live)
