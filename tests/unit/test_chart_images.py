"""The chart's images come from the registry the admin pushed them to, and a demo that could not place a
GPU pod is refused with the fix.

Why: the chart's default images are published nowhere, so a plain `helm install` pulled images that do
not exist; `make push-images REGISTRY=...` (deploy/push-images.sh) and `--set imageRegistry=...` must
name the same images, and they are written twice (a shell script, a Helm template), so this checks
one against the other. With simulated agents and the device plugin on, GPU pods stayed Pending (nothing
advertises the resource) and the chart said nothing. The refusal of default images at a live install
is checked against a real API server in tests/cluster/test_examples.py (`helm template` renders them).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "deepres"
HELM = shutil.which("helm") or (str(REPO / ".venv" / "bin" / "helm") if (REPO / ".venv" / "bin" / "helm").exists()
                                else None)
pytestmark = pytest.mark.skipif(HELM is None, reason="helm not on PATH: run `make tools` (installs it into .venv/bin)")
DEMO = ["--set", "agent.source=simulated", "--set", "agent.simulated.default=1xT4-16GB"]


def template(*args: str) -> subprocess.CompletedProcess[str]:
    assert HELM is not None
    return subprocess.run([HELM, "template", "deepres", str(CHART), "--namespace", "deepres", *args],
                          capture_output=True, text=True, timeout=120)


def images(rendered: str) -> set[str]:
    found: set[str] = set()
    for doc in yaml.safe_load_all(rendered):
        spec: dict[str, Any] = ((doc or {}).get("spec") or {}).get("template", {}).get("spec", {})
        found |= {c["image"] for c in spec.get("containers", []) + spec.get("initContainers", [])}
    return {image for image in found if "/deepres/" in f"/{image}"}


def test_pushed_images_are_the_ones_the_chart_pulls_from_that_registry() -> None:
    registry = "registry.example.com:5000/ml"
    pushed = subprocess.run(["bash", str(REPO / "deploy" / "push-images.sh"), "--dry-run", registry],
                            capture_output=True, text=True, timeout=60, check=True)
    targets = {line.split(" -> ")[1] for line in pushed.stdout.splitlines()}
    assert len(targets) == 2, pushed.stdout
    rendered = template("--set", f"imageRegistry={registry}")
    assert rendered.returncode == 0, rendered.stderr
    assert images(rendered.stdout) == targets


def test_push_images_says_what_is_missing_and_pushes_nothing(tmp_path: Path) -> None:
    script = str(REPO / "deploy" / "push-images.sh")
    no_registry = subprocess.run(["bash", script], capture_output=True, text=True, timeout=60)
    assert no_registry.returncode == 2 and "REGISTRY=registry.example.com/ml" in no_registry.stderr
    url = subprocess.run(["bash", script, "https://registry.example.com"], capture_output=True, text=True, timeout=60)
    assert url.returncode == 2 and "not a URL" in url.stderr
    # a machine with none of the tools (PATH: only what the script itself needs)
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("sed", "dirname", "bash"):
        found = shutil.which(tool)
        assert found, tool
        (bare / tool).symlink_to(found)
    none = subprocess.run([str(bare / "bash"), script, "registry.example.com/ml"], capture_output=True, text=True,
                          timeout=60, env={"PATH": str(bare)})
    assert none.returncode == 2 and "none of buildah, podman or docker" in none.stderr, none.stderr


def test_a_registry_with_a_scheme_is_refused_by_the_schema() -> None:
    result = template("--set", "imageRegistry=https://registry.example.com")
    assert result.returncode != 0 and "imageRegistry" in result.stderr


def test_simulated_agents_with_the_device_plugin_and_nothing_advertising_are_refused_with_the_fix() -> None:
    refused = template(*DEMO)
    assert refused.returncode != 0
    assert "leaves every GPU pod Pending" in refused.stderr
    assert "devicePlugin.enabled=false" in refused.stderr and "devicePlugin.simulatedGpus=true" in refused.stderr
    for fix in ("devicePlugin.enabled=false", "devicePlugin.simulatedGpus=true",
                "devicePlugin.advertisedElsewhere=true"):
        fixed = template(*DEMO, "--set", fix)
        assert fixed.returncode == 0, (fix, fixed.stderr)
    # the plugin is what advertises: with simulatedGpus the agents run it
    plugin = template(*DEMO, "--set", "devicePlugin.simulatedGpus=true")
    assert "--device-plugin" in plugin.stdout
