"""The exact-architecture annotation (`deepres.io/model`), `deepres.io/traced-peak-mib` and
`deepres profile`: parsing, the predictor hook, the printed annotations."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from extender.annotations import AnnotationError, parse_job
from predictor import exact, profile
from predictor.dataset import tracing
from predictor.spec import JobSpec, SpecError

SHIPPED = exact.names()
pytestmark = pytest.mark.skipif(not SHIPPED, reason="no exact-architecture table shipped (predictor/data/exact.json)")


def _a_shipped_model() -> str:
    preferred = [n for n in ("timm/resnet50", "torchvision/resnet50", "hf/bert-base-uncased") if n in SHIPPED]
    return (preferred or SHIPPED)[0]


def test_model_annotation_fills_the_family_fields_from_the_table() -> None:
    name = _a_shipped_model()
    entry = exact.entry(name)
    spec = JobSpec.parse({"model": name.upper(), "batch-size": "16"})
    assert spec.model == name
    assert spec.input_dim == entry["default_input"]
    at = entry["inputs"][str(entry["default_input"])]
    assert spec.params_millions == pytest.approx(at["params_millions"])
    assert spec.num_layers == at["num_layers"]
    assert JobSpec.parse(spec.to_annotations()) == spec


def test_unknown_model_names_close_matches() -> None:
    name = _a_shipped_model()
    with pytest.raises(SpecError) as err:
        JobSpec.parse({"model": name + "x"})
    assert name in str(err.value) and err.value.key == "model"


def test_a_pod_with_only_a_model_annotation_is_a_gpu_job() -> None:
    name = _a_shipped_model()
    request = parse_job({"deepres.io/model": name, "deepres.io/batch-size": "8"}, created_s=None, now_s=0.0)
    assert request.gpu_job and request.spec is not None and request.spec.model == name
    with pytest.raises(AnnotationError, match=r"deepres\.io/model"):
        parse_job({"deepres.io/model": "timm/not_a_model_at_all"}, created_s=None, now_s=0.0)
    with pytest.raises(AnnotationError, match=r"deepres\.io/traced-peak-mib"):
        parse_job({"deepres.io/model-type": "cnn", "deepres.io/traced-peak-mib": "-3"}, created_s=None, now_s=0.0)


def test_predictor_uses_the_table_and_the_traced_peak() -> None:
    from predictor.runtime import ArtifactError, Predictor

    try:
        predictor = Predictor.load()
    except ArtifactError as err:
        pytest.skip(f"no shipped predictor artifact: {err}")
    name = _a_shipped_model()
    spec = JobSpec.parse({"model": name, "batch-size": "32", "precision": "amp", "optimizer": "adamw"})
    demand = predictor.predict(spec)
    est = exact.estimate(name, 32, spec.input_dim, "amp", "adamw")
    assert (demand.memory_mib, demand.memory_mib_upper) == (est.memory_mib, est.memory_mib_upper)
    assert demand.model_version.endswith("+exact")
    family_only = JobSpec.parse({k: v for k, v in spec.to_annotations().items() if k != "model"})
    assert predictor.predict(family_only).memory_mib != demand.memory_mib  # the hook, not the network
    traced = predictor.predict(JobSpec.parse({"model-type": "cnn", "traced-peak-mib": "9000"}))
    assert (traced.memory_mib, traced.memory_mib_upper) == exact.traced_memory(9000.0)


def test_profile_equals_a_full_trace_of_the_same_step() -> None:
    def build():  # type: ignore[no-untyped-def]
        model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        return model, optimizer, (torch.randn(64, 256), torch.randint(0, 10, (64,))), nn.functional.cross_entropy

    model, optimizer, batch, loss = profile.build_on_meta(build)
    prof = profile.profile_step(model, optimizer, batch, loss, precision="amp")
    full = tracing.trace_training_step(lambda: nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)),
                                       lambda dtype: (torch.randn(64, 256, dtype=dtype), torch.randint(0, 10, (64,))),
                                       nn.functional.cross_entropy, optimizer="adamw", precision="amp")
    assert prof.traced_peak_mib == pytest.approx(full.peak_mib, abs=0.05)
    assert (prof.optimizer, prof.batch_size, prof.input_dim, prof.model_type) == ("adamw", 64, 256, "mlp")
    assert prof.params_millions == pytest.approx((256 * 512 + 512 + 512 * 10 + 10) / 1e6)


def test_profile_command_prints_annotations_a_pod_accepts(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(
        "import torch\nfrom torch import nn\n\n"
        "def build():\n"
        "    model = nn.LSTM(64, 128, num_layers=2, batch_first=True)\n"
        "    class Head(nn.Module):\n"
        "        def __init__(self):\n"
        "            super().__init__(); self.rnn = model; self.fc = nn.Linear(128, 5)\n"
        "        def forward(self, x):\n"
        "            return self.fc(self.rnn(x)[0][:, -1])\n"
        "    net = Head()\n"
        "    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)\n"
        "    return net, opt, (torch.randn(16, 32, 64), torch.randint(0, 5, (16,))), nn.functional.cross_entropy\n")
    out = subprocess.run([sys.executable, "-m", "extender.cli", "profile", f"{script}:build"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("deepres.io/")]
    annotations = {k: v.strip().strip('"') for k, v in (ln.split(": ", 1) for ln in lines)}
    request = parse_job(annotations, created_s=None, now_s=0.0)
    assert request.spec is not None and request.spec.traced_peak_mib > 0
    assert (request.spec.model_type, request.spec.optimizer, request.spec.batch_size, request.spec.input_dim) == (
        "lstm", "momentum", 16, 32)
    bad = subprocess.run([sys.executable, "-m", "extender.cli", "profile", f"{script}:nope"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "nope" in bad.stderr


def test_predict_command_answers_for_a_model_only_pod(tmp_path: Path) -> None:
    name = _a_shipped_model()
    pod = tmp_path / "pod.yaml"
    pod.write_text("apiVersion: v1\nkind: Pod\nmetadata:\n  name: exact\n  annotations:\n"
                   f"    deepres.io/model: {name}\n    deepres.io/batch-size: \"16\"\n"
                   "spec:\n  schedulerName: deepres-scheduler\n  containers: [{name: t, image: x}]\n")
    out = subprocess.run([sys.executable, "-m", "extender.cli", "predict", "-f", str(pod), "--json"],
                         capture_output=True, text=True, timeout=300)
    if out.returncode == 1 and "no trained predictor" in out.stderr:
        pytest.skip("no shipped predictor artifact")
    assert out.returncode == 0, out.stderr
    payload = json.loads(out.stdout)
    est = exact.estimate(name, 16, None, "fp32", "adam")
    assert payload["job_spec"]["model"] == name
    assert payload["demand"]["memory_mib"] == est.memory_mib


def test_readme_exact_example_is_what_the_table_answers(repo_root: Path) -> None:
    readme = (repo_root / "docs" / "data-scientist.md").read_text()
    block = readme[readme.index("$ deepres predict -f bert-finetune.yaml"):]
    point = float(block.split("predicted peak GPU memory: ", 1)[1].split(" MiB", 1)[0].replace(",", ""))
    upper = float(block.split("admission bound (upper):   ", 1)[1].split(" MiB", 1)[0].replace(",", ""))
    est = exact.estimate("hf/bert-base-uncased", 32, 512, "amp", "adamw")
    assert (point, upper) == (round(est.memory_mib), round(est.memory_mib_upper))
