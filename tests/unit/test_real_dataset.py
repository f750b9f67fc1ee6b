"""`deepres dataset real`: one trace serves every optimizer, fp16 = bf16 bytes, the batch fit, the
annotation rules, resumable deterministic outputs, and the exact-architecture table built from them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch
import torchvision
import transformers
from torch import nn

from predictor import exact
from predictor.dataset import archs as A
from predictor.dataset import real as R
from predictor.dataset import tracing
from predictor.spec import SpecError

OPTIMIZERS = ("sgd", "momentum", "adam", "adamw", "rmsprop", "adagrad")


def _image_batch(b: int, side: int = 64):  # type: ignore[no-untyped-def]
    return lambda dtype: (torch.randn(b, 3, side, side, dtype=dtype), torch.randint(0, 1000, (b,)))


def _tiny_gpt2() -> nn.Module:
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=500, n_positions=64, use_cache=False)
    return _Logits(transformers.AutoModelForCausalLM.from_config(config))


class _Logits(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=x).logits  # type: ignore[no-any-return]


def _token_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]).float(), y.reshape(-1))


CASES = [
    ("resnet18", lambda: torchvision.models.resnet18(weights=None), _image_batch(4), nn.functional.cross_entropy),
    ("gpt2-tiny", _tiny_gpt2, lambda dtype: (torch.randint(0, 500, (2, 64)), torch.randint(0, 500, (2, 64))),
     _token_loss),
]


@pytest.mark.parametrize("precision", ["fp32", "amp", "bf16"])
@pytest.mark.parametrize(("name", "make", "batch", "loss"), CASES, ids=[c[0] for c in CASES])
def test_one_forward_backward_gives_the_peak_under_every_optimizer(name, make, batch, loss, precision) -> None:  # type: ignore[no-untyped-def]
    with torch.device("meta"), tracing._SkipInit():
        model = make()
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    with R.gpu_attention():
        parts = tracing.trace_components(model, batch, loss, precision=precision)
        for optimizer in OPTIMIZERS:
            full = tracing.trace_training_step(make, batch, loss, optimizer=optimizer, precision=precision)
            state, step = tracing.optimizer_cost(optimizer, parts.numel_by_dtype)
            peak, breakdown = parts.peak_for(state, step)
            assert (peak, breakdown) == (full.peak_bytes, full.breakdown_bytes), optimizer


def test_fp16_and_bf16_steps_hold_the_same_bytes() -> None:
    traces = {}
    for dtype in (torch.float16, torch.bfloat16):
        with torch.device("meta"), tracing._SkipInit():
            model = torchvision.models.mobilenet_v3_small(weights=None).to(dtype)
        c = tracing.trace_components(model, _image_batch(8), nn.functional.cross_entropy,
                                     precision="fp16" if dtype == torch.float16 else "bf16")
        traces[dtype] = (c.fb_peak_bytes, c.end_bytes, c.flops,
                         tracing.optimizer_cost("adam", c.numel_by_dtype))
    assert traces[torch.float16] == traces[torch.bfloat16]


def test_peak_between_and_beyond_traced_batches_follows_the_fit() -> None:
    """The table keeps three traced batches and interpolates/extends linearly: check it against
    traces at batches it never saw (the data card shows the same on a larger sample)."""
    arch = next(a for a in A.torchvision_archs() if a.name == "torchvision/resnet18")
    traced = R.trace_input(arch, 224, batches=(8, 32, 128, 16, 64, 256), precisions=("amp",))
    by_batch = {t["batch"]: t for t in traced["traces"]}
    xs = [8, 32, 128]
    for b in (16, 64, 256):
        for field in ("fb", "end"):
            fitted = exact._piecewise(xs, [float(by_batch[x][field]) for x in xs], b)
            assert abs(fitted - by_batch[b][field]) / by_batch[b][field] < 0.01, (b, field)


def test_annotation_rules_per_family() -> None:
    assert A.image_family("resnet50d", "resnet") == "resnet"
    assert A.image_family("efficientnet_b0", "efficientnet") == "resnet"
    assert A.image_family("regnety_032", "regnet") == "resnet"
    assert A.image_family("vgg16_bn", "vgg") == "vgg"
    assert A.image_family("mobilenetv3_large_100", "mobilenetv3") == "cnn"
    assert A.image_family("inception_v3", "inception_v3") == "cnn"
    assert A.image_family("convnext_tiny", "convnext") == "cnn"
    assert A.image_family("swin_tiny_patch4_window7_224", "swin_transformer") == "vit"
    assert A.image_family("mixer_b16_224", "mlp_mixer") == "mlp"
    assert [A.name_depth(n) for n in ("resnet50", "resnet50d", "vgg16_bn", "densenet121", "wide_resnet50_2",
                                      "seresnext101_32x4d", "efficientnet_b0", "vit_base_patch16_224")] == [
        50, 50, 16, 121, 50, 101, None, None]


@pytest.mark.parametrize(("name", "layers"), [
    ("timm/vit_base_patch16_224", 12), ("timm/swin_tiny_patch4_window7_224", 12), ("timm/resnet50", 50),
    ("timm/efficientnet_b0", 82), ("hf/bert-base-uncased", 12), ("hf/t5-base", 24), ("nn/lstm-l2-h1024", 2),
    ("nn/mlp-d4-w1024", 4), ("nn/cnn-d5-w64-gap", 5), ("nn/cnn-d5-w128-fc", 5), ("hf/flan-t5-small", 16)])
def test_num_layers_rule(name: str, layers: int) -> None:
    arch = next(a for a in A.all_archs(("timm", "hf", "nn")) if a.name == name) if not name.startswith(
        "timm/") else next(a for a in A.timm_archs() if a.name == name)
    with torch.device("meta"), tracing._SkipInit():
        model, _, _ = A.build(arch, arch.inputs[0])
    assert A.num_layers(arch, model) == layers


def test_small_cnns_have_the_depth_of_their_name_in_weight_layers() -> None:
    cnns = [a for a in A.nn_archs() if a.family == "cnn"]
    assert {a.group for a in cnns} == {"nn-cnn"} and {a.source for a in cnns} == {"nn"} and len(cnns) >= 30
    for arch in cnns:
        depth = int(arch.name.split("-d")[1].split("-")[0])
        with torch.device("meta"):
            model, _, _ = A.build(arch, 32)
        convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
        linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
        assert len(convs) + len(linears) == depth, arch.name
        assert convs[0].in_channels == 3 and linears[-1].out_features == 1000
    # the data scientist's example (deploy/examples/cnn-small.yaml: 5 layers, 15 M parameters at 224 px)
    # lies inside the grid: 5-layer nets span 15 M
    sizes = []
    for arch in cnns:
        if arch.name.startswith("nn/cnn-d5-"):
            with torch.device("meta"):
                model, _, _ = A.build(arch, 224)
            sizes.append(A.trainable_params(model) / 1e6)
    assert min(sizes) < 15 < max(sizes)
    with pytest.raises(ValueError, match="no convolution"):
        A.small_cnn(2, 16, "fc")


def test_the_examples_family_fields_lie_inside_the_rows_of_their_family(repo_root: Path) -> None:
    """Every example pod's batch, input and depth are within what the training rows of its family
    hold (a 5-layer CNN, a transformer at batch 32), so the predictor answers them from data."""
    import csv

    import yaml

    from predictor.predict_cli import pod_annotations

    ranges: dict[str, dict[str, list[float]]] = {}
    with gzip.open(R.JOBS_OUT, "rt") as handle:
        for row in csv.DictReader(handle):
            r = ranges.setdefault(row["model_type"], {})
            for key in ("batch_size", "input_dim", "num_layers", "params_millions"):
                lo_hi = r.setdefault(key, [float("inf"), float("-inf")])
                value = float(row[key])
                lo_hi[0], lo_hi[1] = min(lo_hi[0], value), max(lo_hi[1], value)
    checked = 0
    for path in sorted((repo_root / "deploy" / "examples").glob("*.yaml")):
        notes = pod_annotations(yaml.safe_load(path.read_text()), path.name)  # a Pod, or a Job's template
        family = notes["deepres.io/model-type"]
        for key in ("batch_size", "input_dim", "num_layers", "params_millions"):
            value = float(notes["deepres.io/" + key.replace("_", "-")])
            lo, hi = ranges[family][key]
            assert lo <= value <= hi, (path.name, key, value, (lo, hi))
        checked += 1
    assert checked >= 4


def test_the_committed_records_rebuild_the_committed_outputs() -> None:
    """The repository alone resumes: the store holds a record for every traced input of the outputs."""
    done = R.read_work(R.STORE)
    summary = json.loads((R.DATA_DIR / "real_summary.json").read_text())
    traces = sum(len(i["traces"]) for r in done.values() for i in r["inputs"])
    assert (len(done), traces) == (summary["units"], summary["traces"])
    exact_names = set(json.loads(R.EXACT_OUT.read_text())["models"])
    assert exact_names <= {r["arch"]["name"] for r in done.values()}


def test_groups_join_sources_of_one_family() -> None:
    tv = {a.name: a.group for a in A.torchvision_archs()}
    timm_groups = {a.name: a.group for a in A.timm_archs()}
    assert tv["torchvision/resnet50"] == timm_groups["timm/resnet50"] == timm_groups["timm/resnet50d"]
    assert tv["torchvision/vit_b_16"] == timm_groups["timm/vit_base_patch16_224"]
    hf = {a.name: a.group for a in A.hf_archs()}
    assert hf["hf/roberta-base"] == hf["hf/bert-base-uncased"]
    assert hf["hf/Mistral-7B-v0.1"] == hf["hf/Llama-2-7b-hf"]


def _small_run(tmp_path: Path) -> tuple[list[A.Arch], Path]:
    arch_list = [a for a in A.nn_archs() if a.name in ("nn/mlp-d2-w256", "nn/gru-l1-h256")]
    arch_list += [a for a in A.torchvision_archs() if a.name == "torchvision/squeezenet1_1"]
    return arch_list, tmp_path / "work.jsonl"


def test_generation_resumes_and_rebuilds_identical_outputs(tmp_path: Path) -> None:
    arch_list, work = _small_run(tmp_path)
    R.generate(arch_list, work, workers=1, tiers=(0,), limit=2)
    assert len(R.read_work(work)) == 2
    done = R.generate(arch_list, work, workers=1, tiers=(0,))
    assert len(done) == 3 and len(work.read_text().splitlines()) == 3  # the first two were not traced again
    with open(work, "a") as handle:
        handle.write('{"key": "torn')  # an interrupted write
    first = R.write_outputs(R.read_work(work), tmp_path / "a")
    lines = work.read_text().splitlines()[:-1]
    work.write_text("\n".join(reversed(lines)) + "\n")  # units finished in another order
    second = R.write_outputs(R.read_work(work), tmp_path / "b")
    assert first == second
    for name in ("exact.json", "real_traces.csv.gz", "real_jobs.csv.gz", R.STORE.name):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    rows = gzip.decompress((tmp_path / "a" / "real_jobs.csv.gz").read_bytes()).decode().splitlines()
    assert len(rows) == 1 + 3 * 3 * 3 * 4  # header + archs x precisions x batches x optimizers
    assert "group" in rows[0] and "family" in rows[0]


def test_a_fresh_clone_resumes_from_the_store_and_retraces_changed_architectures(tmp_path: Path) -> None:
    arch_list, work = _small_run(tmp_path)
    done = R.generate(arch_list, work, workers=1, tiers=(0,))
    R.write_outputs(done, tmp_path / "data")
    store = tmp_path / "data" / R.STORE.name
    work.unlink()  # the git-ignored work file is gone: only the repository's files are left
    fresh = tmp_path / "fresh.jsonl"
    again = R.generate(arch_list, fresh, workers=1, tiers=(0,), store=store)
    assert again == json.loads(json.dumps(done)) and not fresh.read_text()  # nothing traced again
    changed = [A.Arch(a.name, a.source, a.group, a.family, a.kind, a.inputs, (1, 2, 4)) if a.source == "nn"
               and a.family == "mlp" else a for a in arch_list]
    R.generate(changed, fresh, workers=1, tiers=(0,), store=store)
    retraced = [json.loads(line) for line in fresh.read_text().splitlines()]
    assert [r["key"] for r in retraced] == ["nn/mlp-d2-w256|t0"]
    assert [t["batch"] for t in retraced[0]["inputs"][0]["traces"]][:3] == [1, 2, 4]
    R.write_outputs(again, tmp_path / "again")
    for name in (R.STORE.name, "exact.json", "real_traces.csv.gz"):
        assert (tmp_path / "data" / name).read_bytes() == (tmp_path / "again" / name).read_bytes(), name


def test_an_input_that_does_not_build_is_recorded_not_fatal() -> None:
    arch = A.Arch("timm/no_such_model_xyz", "timm", "x", "cnn", "image", (224,), (8,))
    record = R.run_unit(arch, 0)
    assert record["inputs"] == [] and "224" in record["errors"]


def test_exact_table_gives_the_calibrated_traced_peak(tmp_path: Path) -> None:
    arch = next(a for a in A.torchvision_archs() if a.name == "torchvision/squeezenet1_1")
    work = tmp_path / "work.jsonl"
    R.generate([arch], work, workers=1, tiers=(0, 1))
    R.write_outputs(R.read_work(work), tmp_path)
    table = str(tmp_path / "exact.json")
    # an independent full trace of the same step (adamw, amp, batch 32 at 224 px)
    full = tracing.trace_training_step(lambda: torchvision.models.squeezenet1_1(weights=None),
                                       _image_batch(32, 224), nn.functional.cross_entropy,
                                       optimizer="adamw", precision="amp")
    est = exact.estimate("torchvision/squeezenet1_1", 32, 224, "amp", "adamw", path=table)
    assert abs(est.traced_peak_mib - full.peak_mib) < 0.2
    cal = json.loads((tmp_path / "exact.json").read_text())["calibration"]
    assert est.memory_mib == pytest.approx(cal["context_mib"] + cal["factor"] * full.peak_mib, abs=0.5)
    assert est.memory_mib < est.memory_mib_upper <= est.memory_mib * 1.1
    assert not est.interpolated_input and not est.extrapolated_batch
    # fp16 reads bf16's curve; an untraced side is interpolated with a wider bound
    assert exact.estimate("torchvision/squeezenet1_1", 32, 224, "fp16", "adamw", path=table).memory_mib == \
        exact.estimate("torchvision/squeezenet1_1", 32, 224, "bf16", "adamw", path=table).memory_mib
    between = exact.estimate("torchvision/squeezenet1_1", 32, 256, "amp", "adamw", path=table)
    assert between.interpolated_input and est.memory_mib < between.memory_mib
    assert between.memory_mib_upper / between.memory_mib > est.memory_mib_upper / est.memory_mib
    with pytest.raises(SpecError, match="closest: torchvision/squeezenet1_1"):
        exact.resolve("torchvision/squeezenet1_2", path=table)
    with pytest.raises(SpecError, match="timm/<name>"):
        exact.resolve("squeezenet", path=table)


def test_bad_dataset_real_arguments_are_usage_errors(tmp_path: Path) -> None:
    from extender.cli import main

    assert main(["dataset", "real", "--sources", "timm,keras", "--real-work", str(tmp_path / "w")]) == 2
    assert main(["dataset", "real", "--tiers", "2", "--real-work", str(tmp_path / "w")]) == 2
