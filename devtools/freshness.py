"""Reports not older than the code they measure: each stamped report section (its `provenance.commit`,
extender/provenance.py) against the commits since then that touched what it measures.

A section is stale when a commit after the one it was made at changed one of its paths (MEASURES):
its figures may no longer be the code's. `python -m devtools.freshness` lists every stamped section
with its state and exits 1 when one is stale; tests/unit/test_freshness.py fails the build then. A
stamp made from a tree with uncommitted changes (`dirty`) counts from its commit, as the rest does.
"""

from __future__ import annotations

import fnmatch
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
_SERVING = ("extender/server", "extender/policy", "extender/ledger.py", "extender/model_keys.py", "extender/kube",
            "extender/allocations.py", "extender/pod_requests.py", "extender/annotations.py", "extender/settings.py",
            "extender/telemetry.py", "extender/protocol.py", "extender/wire.py")
#: (report, section pattern) -> the paths whose code (or data) the section's figures come from
MEASURES: dict[tuple[str, str], tuple[str, ...]] = {
    ("reports/simulation.json", "capacity"): ("extender/simulate", "extender/policy", "extender/settings.py",
                                              "data/openb", "data/colocation"),
    ("reports/simulation.json", "replay"): ("extender/simulate", "extender/policy", "extender/settings.py",
                                            "data/openb", "data/colocation"),
    ("reports/interference.json", "(top)"): ("extender/simulate/interference.py", "extender/policy/interference.py",
                                             "data/colocation"),
    ("reports/bench-cluster.json", "nodes_*"): ("devtools/bench_cluster.py", "devtools/bench_cluster_agents.py",
                                                "devtools/bench_cluster_rounds.py", "devtools/localcluster.py",
                                                "cluster/go.mod", *_SERVING),
    ("reports/bench-cluster-floor.json", "*"): ("devtools/bench_cluster.py", "devtools/bench_cluster_agents.py",
                                                 "devtools/bench_cluster_rounds.py", "devtools/floor_extender.py",
                                                 "devtools/localcluster.py", "cluster/go.mod", *_SERVING),
    ("reports/bench-extender.json", "(top)"): ("devtools/bench_extender.py", *_SERVING),
    ("reports/bench-extender.json", "per_nodes"): ("devtools/bench_pernodes.py", *_SERVING),
    ("reports/bench-intake.json", "(top)"): ("devtools/bench_intake.py", *_SERVING),
    # the serving install's size and first start (scripts/measure-make-run.sh): what pip installs for `make run`
    ("reports/make-run.json", "(top)"): ("pyproject.toml", "constraints.txt"),
    ("reports/predictor.json", "live_calibration*"): ("devtools/bench_calibration.py", "extender/server/gpu_demand.py",
                                                      "extender/calibration_store.py", "extender/policy",
                                                      "predictor/gpucal.py", "predictor/artifacts"),
    ("reports/calibration-check.json", "(top)"): ("devtools/check_calibration.py", "extender/server/gpu_demand.py",
                                                  "extender/calibration_store.py", "extender/policy",
                                                  "predictor/gpucal.py", "predictor/artifacts",
                                                  "predictor/data/measured"),
}


@dataclass(frozen=True)
class Section:
    report: str
    section: str
    commit: str
    command: str
    changed_by: tuple[str, ...]  # commits after `commit` that touched what it measures ("?": unknown commit)

    @property
    def stale(self) -> bool:
        return bool(self.changed_by)


def stamps(doc: Any, where: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every `provenance` object in a report, at any depth ("(top)", "section", "section.sub")."""
    if not isinstance(doc, dict):
        return
    if isinstance(doc.get("provenance"), dict):
        yield where or "(top)", doc["provenance"]
    for key, value in doc.items():
        if key != "provenance":
            yield from stamps(value, f"{where}.{key}" if where else key)


def measured_paths(report: str, section: str) -> tuple[str, ...] | None:
    for (name, pattern), paths in MEASURES.items():
        if name == report and fnmatch.fnmatchcase(section, pattern):
            return paths
    return None


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)


def sections(root: Path = ROOT) -> list[Section]:
    """Every stamped section of the reports MEASURES names, with the commits that made it stale."""
    out = []
    for report in sorted({name for name, _ in MEASURES}):
        path = root / report
        if not path.is_file():
            continue
        for where, stamp in stamps(json.loads(path.read_text(encoding="utf-8"))):
            paths = measured_paths(report, where)
            if paths is None:
                continue
            commit = str(stamp.get("commit", ""))
            if _git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
                changed: tuple[str, ...] = (f"? (its commit {commit[:12] or 'none'} is not in this history)",)
            else:
                log = _git("log", "--format=%h %s", f"{commit}..HEAD", "--", *paths)
                changed = tuple(line[:100] for line in log.stdout.splitlines())
            out.append(Section(report, where, commit, str(stamp.get("command", "")), changed))
    return out


def main() -> int:
    found = sections()
    for s in found:
        state = f"STALE: {len(s.changed_by)} commit(s) since, e.g. {s.changed_by[0]}" if s.stale else "fresh"
        print(f"{s.report} {s.section} (made at {s.commit[:12]}): {state}")
        if s.stale:
            print(f"    rerun: {s.command}")
    return 1 if any(s.stale for s in found) else 0


if __name__ == "__main__":
    sys.exit(main())
