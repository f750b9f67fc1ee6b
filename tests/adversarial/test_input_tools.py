"""Inputs besides annotations (#34 rows 9 and 11): `deepres profile`'s sizes and the serving install
without torch, and one pod's out-of-range GPU duty in a node's telemetry report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from extender.settings import Settings
from tests.adversarial.ledger_support import api_server, cluster_mode, gpu, report
from tests.fixtures.kube.payloads import extender_args, pod
from tests.fixtures.kube.server import post

REPO = Path(__file__).resolve().parents[2]


def deepres(*argv: str, prelude: str = "") -> subprocess.CompletedProcess[str]:
    """`deepres ARGV` in a fresh interpreter (`prelude` runs first: e.g. hide torch as a serving install)."""
    code = f"import sys\n{prelude}\nfrom extender.cli import main\nsys.exit(main({list(argv)!r}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize(("flag", "value"), [("--batch-size", "1000000000"), ("--input-dim", "99999999999"),
                                             ("--target-dim", "1000000000"), ("--batch-size", "0")])
def test_profile_refuses_huge_sizes_in_one_line(flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch", reason="deepres profile traces with torch (the train extra)")
    from extender.cli import main

    assert main(["profile", "torchvision/resnet18", flag, value]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0] and value in lines[0], lines


def test_profile_on_the_serving_install_names_the_extra() -> None:
    hide = "for m in ('torch', 'timm', 'torchvision', 'transformers'): sys.modules[m] = None"
    done = deepres("profile", "torchvision/resnet18", prelude=hide)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'deepres[train]'" in lines[0] and "Traceback" not in done.stderr


@pytest.mark.parametrize("duty", [1.5, 1.0000001, 7.0, -0.2])
def test_one_pods_duty_out_of_range_never_refuses_the_node_report(duty: float) -> None:
    settings = Settings()
    settings.kube.telemetry_grace_s = 0.0
    with cluster_mode(api_server(), settings=settings) as (url, ext):
        usage = [{"pod_uid": "uid-other", "current_memory_mib": 100.0, "peak_memory_mib": 100.0,
                  "gpu_uuids": ["a-gpu0"], "gpu_duty": duty, "duty_source": "device"}]
        status, answer = post(url + "/v1/telemetry", report("a", 1, [gpu("a-gpu0", 16_384.0)], pods=usage),
                              token="token-a")
        assert status == 200 and answer["accepted"] is True, answer
        view = ext.state.node_view("a")
        assert view is not None and [g.uuid for g in view.gpus] == ["a-gpu0"]
        small = pod("small", {"deepres.io/gpu-memory": "1Gi"})
        assert post(url + "/filter", extender_args(small, names=["a"]))[1]["NodeNames"] == ["a"]
