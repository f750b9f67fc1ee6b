"""`deepres train` on a tiny dataset, then `deepres predict` on pods as a data scientist writes them."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from extender.cli import main
from tests.unit._predictor_frames import write_jobs_csv

POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: bert-base
  annotations:
    deepres.io/model-type: bert
    deepres.io/params-millions: "110"
    deepres.io/batch-size: "32"
    deepres.io/precision: amp
spec:
  schedulerName: deepres-scheduler
  containers: [{name: train, image: busybox}]
"""

DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: trainer}
spec:
  selector: {matchLabels: {app: t}}
  template:
    metadata:
      labels: {app: t}
      annotations: {deepres.io/model-type: resnet, deepres.io/params-millions: "25", deepres.io/batch-size: "128"}
    spec:
      containers: [{name: train, image: busybox}]
"""


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli")
    data = write_jobs_csv(root / "jobs.csv", n=120)
    code = main(["train", "--data", str(data), "--out", str(root / "art"), "--seed", "1", "--epochs-scale", "0.02"])
    assert code == 0
    meta = json.loads((root / "art" / "metadata.json").read_text())
    assert meta["seed"] == 1 and len(meta["data_sha256"]) == 64
    return root / "art"


def _predict(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["predict", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_pod_human_output_marks_defaults(artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pod = tmp_path / "pod.yaml"
    pod.write_text(POD)
    code, out, _ = _predict(["-f", str(pod), "--artifact", str(artifact)], capsys)
    assert code == 0
    assert "deepres.io/model-type" in out and "transformer" in out
    assert next(line for line in out.splitlines() if "optimizer" in line).endswith("(default)")
    assert "(default)" not in next(line for line in out.splitlines() if "batch-size" in line)
    assert "MiB" in out and "GFLOPs per iteration" in out and "GPU time" in out


def test_json_output_and_example_pod(artifact: Path, repo_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    example = repo_root / "deploy" / "examples" / "cnn-small.yaml"
    code, out, _ = _predict(["-f", str(example), "--artifact", str(artifact), "--json"], capsys)
    assert code == 0
    payload = json.loads(out)
    assert payload["job_spec"]["model_type"] == "cnn" and payload["job_spec"]["batch_size"] == 64
    demand = payload["demand"]
    assert 0 < demand["memory_mib"] <= demand["memory_mib_upper"]
    assert "learning-rate" in payload["defaulted"]


def test_stdin_and_deployment_template(artifact: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(DEPLOYMENT))
    code, out, _ = _predict(["-f", "-", "--artifact", str(artifact), "--json"], capsys)
    assert code == 0
    assert json.loads(out)["job_spec"]["model_type"] == "resnet"


@pytest.mark.parametrize(("key", "value"), [("batch-size", "lots"), ("precision", "fp8"), ("model-type", "svm")])
def test_bad_annotation_exits_2_naming_the_key(artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               key: str, value: str) -> None:
    pod = tmp_path / "bad.yaml"
    text = POD.replace("deepres.io/model-type: bert", f"deepres.io/model-type: {value}") if key == "model-type" \
        else POD.replace("    deepres.io/precision: amp", f'    deepres.io/{key}: "{value}"')
    pod.write_text(text)
    code, out, err = _predict(["-f", str(pod), "--artifact", str(artifact)], capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert f"deepres.io/{key}" in err and value in err and "expected" in err


def test_not_a_gpu_job_and_unreadable_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pod = tmp_path / "plain.yaml"
    pod.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec: {containers: []}\n")
    code, _, err = _predict(["-f", str(pod)], capsys)
    assert code == 2 and "not a GPU job" in err and "deepres.io/model-type" in err
    code, _, err = _predict(["-f", str(tmp_path / "missing.yaml")], capsys)
    assert code == 2 and "cannot read" in err
    (tmp_path / "broken.yaml").write_text("kind: Pod\nmetadata: [\n")
    code, _, err = _predict(["-f", str(tmp_path / "broken.yaml")], capsys)
    assert code == 2 and "not valid YAML" in err
    (tmp_path / "svc.yaml").write_text("kind: Service\nmetadata: {name: s}\n")
    code, _, err = _predict(["-f", str(tmp_path / "svc.yaml")], capsys)
    assert code == 2 and "does not run a pod" in err


def test_missing_artifact_is_exit_1_with_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pod = tmp_path / "pod.yaml"
    pod.write_text(POD)
    code, _, err = _predict(["-f", str(pod), "--artifact", str(tmp_path / "none")], capsys)
    assert code == 1 and "deepres train" in err


def test_gpu_flag_and_the_task_head_on_the_family_path(artifact: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """`--gpu` reads the Demand on the GPU model's measured line (the H100's; none for a T4) and says the
    live calibration is the extender's; `deepres.io/task` changes a BERT's family-path memory."""
    from predictor import family_heads

    pod = tmp_path / "pod.yaml"
    pod.write_text(POD)
    code, out, _ = _predict(["-f", str(pod), "--artifact", str(artifact), "--json", "--gpu", "NVIDIA H100 80GB HBM3"],
                            capsys)
    plain = json.loads(out)
    assert code == 0 and plain["on_gpu"]["line"] is True and plain["on_gpu"]["path"] == "family"
    assert plain["on_gpu"]["memory_mib"] != plain["demand"]["memory_mib"]
    code, out, _ = _predict(["-f", str(pod), "--artifact", str(artifact), "--gpu", "Tesla T4"], capsys)
    assert code == 0 and "no measured line" in out and "/v1/predict" in out
    classifier = tmp_path / "cls.yaml"
    classifier.write_text(POD.replace("deepres.io/precision: amp", "deepres.io/precision: amp\n"
                                      "    deepres.io/task: sequence-classification"))
    code, out, _ = _predict(["-f", str(classifier), "--artifact", str(artifact), "--json"], capsys)
    head = json.loads(out)["demand"]
    ratio = family_heads.ratios()["transformer"]["sequence-classification"]
    assert head["memory_mib"] == pytest.approx(plain["demand"]["memory_mib"] * ratio["point"], rel=1e-3)
    assert head["memory_mib"] < 0.9 * plain["demand"]["memory_mib"]
    assert any("sequence-classification" in w for w in head["warnings"])
