"""The images as the cluster admin gets them: `deploy/build-images.sh` builds deepres/extender and
deepres/agent from deploy/Dockerfile.* with buildah (no Docker, no registry: the base is made from
Debian's packages) and runs them as uid 10001; these tests assert on what it measured inside the
built images. Where buildah cannot run (not root, no apt-get, no mounts) the script says why in one
line and the tests skip with that line; any other failure fails them.

Why: the chart's first step is pulling these images. A broken COPY, a build check that always
fails, a uid that cannot read the predictor's artifact, torch pulled in by a dependency: the admin
would find it first.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# cold here: ~2 min for the base, ~3 min per image (pip from PyPI), ~1 min of smoke; seconds for the
# base once it is in buildah's storage
BUDGET_S = 1800
KINDS = ("extender", "agent")


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("images") / "images.json"
    done = subprocess.run(["bash", "deploy/build-images.sh", "--report", str(out)], cwd=REPO, timeout=BUDGET_S,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
    if not out.is_file():
        pytest.fail(f"deploy/build-images.sh wrote no report (exit {done.returncode}):\n{tail}")
    data: dict[str, Any] = json.loads(out.read_text())
    if data.get("skipped"):
        pytest.skip(f"images not built: {data['skipped']}")
    failed = {kind: {name: c for name, c in data[kind].get("checks", {}).items() if not c["ok"]} for kind in KINDS}
    assert done.returncode == 0, f"build-images failed: {data.get('error')} {failed}\n{tail}"
    return data


@pytest.mark.parametrize("kind", KINDS)
def test_image_built_and_smoke_test_passed(report: dict[str, Any], kind: str) -> None:
    entry = report[kind]
    failed = {name: c["detail"] for name, c in entry["checks"].items() if not c["ok"]}
    assert entry["built"], entry.get("error")
    assert entry["smoke_test_passed"] and not failed, failed
    assert entry["size_mib"] > 0


def test_extender_served_and_predicted_in_its_image(report: dict[str, Any]) -> None:
    checks = report["extender"]["checks"]
    assert {"version", "predictor", "healthz", "readyz", "writes_only_tmp"} <= set(checks)
    assert json.loads(checks["readyz"]["detail"]["body"])["ready"] is True
    assert checks["predictor"]["detail"]["memory_mib"] > 0
    assert checks["predictor"]["detail"]["memory_mib_upper"] >= checks["predictor"]["detail"]["memory_mib"]


def test_agent_in_its_image_reported_to_the_extender_in_its_image(report: dict[str, Any]) -> None:
    checks = report["agent"]["checks"]
    assert checks["reports_accepted"]["detail"]["accepted_by_extender"] >= 1
    assert checks["healthz"]["ok"] and checks["livez"]["ok"]


@pytest.mark.parametrize("kind", KINDS)
def test_images_carry_no_torch_and_no_cuda_libraries(report: dict[str, Any], kind: str) -> None:
    entry = report[kind]
    names = {name.lower() for name in entry["packages"]}
    assert entry["has_torch"] is False
    assert "torch" not in names
    assert not [n for n in names if n.startswith("nvidia-") and n != "nvidia-ml-py"], sorted(names)


def test_agent_image_has_only_what_the_agent_imports(report: dict[str, Any]) -> None:
    """Dockerfile.agent installs the agent's own dependencies and deepres --no-deps: no numpy, pandas
    or web framework in it (the agent never predicts)."""
    names = {re.sub(r"[-_.]+", "-", name).lower() for name in report["agent"]["packages"]}
    assert {"deepres", "kubernetes", "msgspec", "nvidia-ml-py", "prometheus-client"} <= names
    assert not names & {"numpy", "pandas", "flask", "granian", "gunicorn"}, sorted(names)


@pytest.mark.parametrize("kind", KINDS)
def test_images_honour_the_constraints(report: dict[str, Any], kind: str) -> None:
    """Every package pinned in constraints.txt is at its pinned version inside the image."""
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        found = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^\s*]+)", line.strip())
        if found:
            pins[re.sub(r"[-_.]+", "-", found.group(1)).lower()] = found.group(2)
    inside = {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in report[kind]["packages"].items()}
    off = {name: (version, pins[name]) for name, version in inside.items() if name in pins and version != pins[name]}
    assert not off, f"image version != constraints.txt pin: {off}"
    assert len(inside.keys() & pins.keys()) >= 5
