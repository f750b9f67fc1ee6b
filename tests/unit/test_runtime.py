"""The runtime Predictor: loads an artifact, deterministic, cached, thread-safe, clear errors."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from predictor.runtime import WEIGHTS_FILE, ArtifactError, Predictor, clip_bounds, out_of_range
from predictor.spec import Demand, JobSpec
from predictor.splits import random_split
from predictor.train import fit_model, save_artifact, score
from predictor.trainset import load_dataset
from tests.unit._predictor_frames import write_jobs_csv

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny artifact: the tuned model trained 2 epochs on a synthetic frame (fast, not accurate)."""
    root = tmp_path_factory.mktemp("artifact")
    data = load_dataset(write_jobs_csv(root / "jobs.csv", n=120))
    split = random_split(data.n_rows, 0.3, 0)
    model = fit_model("transformer_bigru_tuned", data, split, seed=0, epochs_scale=2 / 120)
    save_artifact(model, data, root / "art", 0, score(model, data, split.test), 1.0)
    return root / "art"


SPECS = [
    JobSpec("cnn", params_millions=15, batch_size=64, input_dim=224, num_layers=5, precision="amp", optimizer="sgd"),
    JobSpec("gpt", params_millions=350, batch_size=8, input_dim=1024, num_layers=24, optimizer="adamw"),
    JobSpec("lstm", params_millions=5, batch_size=32),
]


def test_predict_returns_a_consistent_demand(artifact: Path) -> None:
    p = Predictor.load(artifact)
    meta = json.loads((artifact / "metadata.json").read_text())
    for spec in SPECS:
        d = p.predict(spec)
        assert isinstance(d, Demand)
        assert d.model_version == p.version == meta["version"]
        assert 0 < d.memory_mib <= d.memory_mib_upper
        assert d.gflops_per_iteration > 0
        # the job's GPU time is its steps on the reference GPU: step_seconds x iterations (issue 30 point 5)
        assert d.step_seconds > 0
        assert d.gpu_seconds == pytest.approx(d.step_seconds * spec.iterations, rel=1e-3)


def test_deterministic_across_loads_and_batch(artifact: Path) -> None:
    a, b = Predictor.load(artifact), Predictor.load(artifact)
    assert [a.predict(s) for s in SPECS] == [b.predict(s) for s in SPECS]
    assert b.with_cache_size(0).predict_many(SPECS) == [a.predict(s) for s in SPECS]


def test_cache_hits_and_bound(artifact: Path) -> None:
    p = Predictor.load(artifact, cache_size=2)
    first = p.predict(SPECS[0])
    again = p.predict(JobSpec.parse(SPECS[0].to_annotations()))  # equal spec, different object
    assert again is first and p.hits == 1 and p.misses == 1
    p.predict(SPECS[1])
    p.predict(SPECS[2])  # evicts SPECS[0] (least recently used)
    p.predict(SPECS[0])
    assert p.misses == 4


def test_thread_safe(artifact: Path) -> None:
    p = Predictor.load(artifact, cache_size=8)
    expected = {s: Predictor.load(artifact).predict(s) for s in SPECS}
    errors: list[str] = []

    def worker(k: int) -> None:
        for i in range(30):
            spec = SPECS[(i + k) % len(SPECS)]
            if p.predict(spec) != expected[spec]:
                errors.append(f"thread {k} call {i}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert p.hits + p.misses == 180


def test_missing_artifact_names_the_command(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="deepres train"):
        Predictor.load(tmp_path)


def test_corrupt_artifact_is_a_clear_error(artifact: Path, tmp_path: Path) -> None:
    (tmp_path / "metadata.json").write_text((artifact / "metadata.json").read_text())
    (tmp_path / WEIGHTS_FILE).write_bytes(b"not an npz")
    with pytest.raises(ArtifactError, match="unreadable"):
        Predictor.load(tmp_path)
    # a well-formed archive that lacks a layer's weights
    with np.load(artifact / WEIGHTS_FILE) as archive:
        partial = {k: archive[k] for k in archive.files if not k.startswith("head.")}
    np.savez(tmp_path / WEIGHTS_FILE, **partial)
    with pytest.raises(ArtifactError, match="head"):
        Predictor.load(tmp_path)


def test_artifact_holds_npz_weights_and_no_pickle(artifact: Path) -> None:
    assert (artifact / WEIGHTS_FILE).suffix == ".npz"
    assert not list(artifact.glob("*.pt"))
    with np.load(artifact / WEIGHTS_FILE, allow_pickle=False) as archive:
        network = [k for k in archive.files if not k.startswith(("tree", "ada"))]
        assert "position.weight" in network and all(archive[k].dtype == np.float32 for k in network)
        # the blend's LightGBM and AdaBoost members, one flattened ensemble per target (predictor.trees)
        assert {"tree0.threshold", "tree1.threshold", "tree0.roots"} <= set(archive.files)
        assert {"ada0.threshold", "ada1.roots", "ada0.weights", "ada1.weights"} <= set(archive.files)


def _leaves(arrays: dict[str, Any], prefix: str, row: np.ndarray) -> list[float]:
    """The leaf each tree reaches for one row, node by node (a plain reading of the flattened trees)."""
    out = []
    for root in arrays[prefix + "roots"]:
        node = int(root)
        while arrays[prefix + "feature"][node] >= 0:
            go_left = row[arrays[prefix + "feature"][node]] <= arrays[prefix + "threshold"][node]
            node = int(arrays[prefix + "left"][node] if go_left else arrays[prefix + "right"][node])
        out.append(float(arrays[prefix + "value"][node]))
    return out


def _adaboost(arrays: dict[str, Any], prefix: str, row: np.ndarray) -> float:
    """AdaBoost.R2's weighted median, written out: the trees' predictions in ascending order, the first
    whose running weight reaches half the total (features read as float32, as scikit-learn's trees do)."""
    values = _leaves(arrays, prefix, row.astype(np.float32).astype(np.float64))
    weights = arrays[prefix + "weights"]
    total, running = float(np.sum(weights)), 0.0
    for i in sorted(range(len(values)), key=lambda j: values[j]):
        running += float(weights[i])
        if running >= 0.5 * total:
            return values[i]
    raise AssertionError("weights do not add up")


def test_numpy_runtime_matches_the_torch_estimator(artifact: Path) -> None:
    """The served numbers are the trained blend's: the torch network's forward, the LightGBM booster and
    the AdaBoost regressor (both rebuilt from the artifact's trees by hand here), the median of the three
    in log space, vs the npz-in-numpy runtime."""
    from predictor import features as feats
    from predictor.model import TransformerBiGRURegressor

    meta = json.loads((artifact / "metadata.json").read_text())
    with np.load(artifact / WEIGHTS_FILE) as archive:
        arrays = {k: archive[k] for k in archive.files}
    est = TransformerBiGRURegressor.from_state({k: v for k, v in arrays.items() if not k.startswith(("tree", "ada"))},
                                               meta["estimator"])
    cols = feats.columns_from_specs(SPECS)
    x = feats.physics_features(cols).values
    network, upper = est.predict_with_upper(x)  # torch: the learned densities
    assert upper is not None
    assert meta["blend"]["rule"] == "median" and meta["blend"]["members"] == ["network", "lightgbm", "adaboost"]
    assert meta["memory_upper_base"] == "point"
    boosted = np.exp(np.column_stack([[sum(_leaves(arrays, f"tree{k}.", row)) for row in x] for k in range(2)]))
    ada = np.exp(np.column_stack([[_adaboost(arrays, f"ada{k}.", row) for row in x] for k in range(2)]))
    # the middle one of three, per row and target (the trees learn log densities)
    density = np.maximum(np.minimum(network, boosted), np.minimum(np.maximum(network, boosted), ada))
    low, high = clip_bounds(meta["target_ranges"], [s.model_type for s in SPECS], 2)  # each family's range
    density, upper = np.clip(density, low, high), np.clip(upper, low[:, 0], high[:, 0])
    calibration = meta["memory_calibration"]
    terms = feats.decomposition(cols, calibration["context_mib"], calibration["factor"])
    memory, flops = terms.memory(density[:, 0]), terms.flops(density[:, 1])
    p = Predictor.load(artifact, cache_size=0)
    for i, spec in enumerate(SPECS):
        d = p.predict(spec)
        assert d.memory_mib == pytest.approx(memory[i], rel=1e-4)
        assert d.gflops_per_iteration == pytest.approx(flops[i], rel=1e-4)
        table = _margins_serving(meta, spec)
        shift = table["by_family"].get(spec.model_type, table["shift"])
        ranges = {f: {c: (lo, hi) for c, (lo, hi) in cols_.items()} for f, cols_ in meta["input_ranges"].items()}
        factor = out_of_range(spec, ranges)[0]
        base = upper[i] if table["base"] == "quantile" else density[i, 0]
        # the margin widens the learned activation term only; the fixed bytes stay as they are
        widened = calibration["context_mib"] + calibration["factor"] * (
            terms.fixed_mib[i] + base * math.exp(shift) * factor * terms.act_scale[i])
        assert d.memory_mib_upper == pytest.approx(max(widened, memory[i]), rel=1e-4)


@pytest.mark.parametrize("code", [
    "import extender.server.app, extender.server.serve, predictor.runtime, predictor.predict_cli",
    "from extender.cli import main; main(['predict', '-f', 'deploy/examples/cnn-small.yaml', '--artifact', ART])",
])
def test_serving_imports_no_torch(artifact: Path, code: str) -> None:
    """serve and predict run without torch, nor the tree learners whose trees the blend serves: checked in
    a fresh interpreter (this one has them loaded)."""
    program = (f"import sys\nART = {str(artifact)!r}\n{code}\n"
               "for name in ('torch', 'sklearn', 'lightgbm'):\n"
               "    assert name not in sys.modules, name + ' imported'\n")
    done = subprocess.run([sys.executable, "-c", program], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def _margins_serving(meta: dict[str, Any], spec: JobSpec) -> dict[str, Any]:
    """The margin table that serves `spec`: the artifact's own for a job stating `activations-millions`,
    `memory_upper_without_shapes` (calibrated without the shape annotations) for one that does not."""
    own = {"base": meta["memory_upper_base"], "shift": meta["memory_upper_shift"],
           "by_family": meta["memory_upper_shift_by_family"]}
    bare = meta.get("memory_upper_without_shapes")
    return own if spec.activations_millions > 0 or not bare else dict(bare)


def _with_metadata(artifact: Path, tmp_path: Path, **changes: object) -> Path:
    shutil.copytree(artifact, tmp_path / "art")
    meta = json.loads((tmp_path / "art" / "metadata.json").read_text())
    meta.update(changes)
    (tmp_path / "art" / "metadata.json").write_text(json.dumps(meta))
    return tmp_path / "art"


def test_family_margin_applies_to_its_family_only(artifact: Path, tmp_path: Path) -> None:
    base = Predictor.load(artifact, cache_size=0)
    meta = json.loads((artifact / "metadata.json").read_text())
    cnn, gpt = SPECS[0], SPECS[1]
    table = _margins_serving(meta, cnn)
    shifts = dict(table["by_family"])
    shifts["cnn"] = shifts.get("cnn", table["shift"]) + math.log(2.0)
    serves_bare = cnn.activations_millions == 0 and bool(meta.get("memory_upper_without_shapes"))
    changed = ({"memory_upper_without_shapes": {**table, "by_family": shifts}} if serves_bare
               else {"memory_upper_shift_by_family": shifts})
    wider = Predictor.load(_with_metadata(artifact, tmp_path, **changed), cache_size=0)
    # twice the margin: twice the learned (activation) part of the bound; the fixed bytes stay
    fixed = _fixed_part(meta, cnn)
    assert wider.predict(cnn).memory_mib_upper - fixed == pytest.approx(
        2.0 * (base.predict(cnn).memory_mib_upper - fixed), rel=1e-3)
    assert wider.predict(gpt) == base.predict(gpt)


def _fixed_part(meta: dict[str, Any], spec: JobSpec) -> float:
    """The part of a bound that no margin widens: context + factor x (weights + optimizer state)."""
    from predictor import features as feats

    calibration = meta["memory_calibration"]
    terms = feats.decomposition(feats.columns_from_specs([spec]), calibration["context_mib"], calibration["factor"])
    return float(terms.memory(np.zeros(1))[0])


def test_outside_the_training_range_widens_the_bound_and_warns(artifact: Path) -> None:
    p = Predictor.load(artifact, cache_size=0)
    meta = json.loads((artifact / "metadata.json").read_text())
    ranges = meta["input_ranges"]["gpt"]
    inside = JobSpec("gpt", params_millions=ranges["params_millions"][1], batch_size=int(ranges["batch_size"][1]),
                     input_dim=int(ranges["input_dim"][1]), num_layers=int(ranges["num_layers"][1]))
    d_in = p.predict(inside)
    assert d_in.warnings == ()
    far = JobSpec("gpt", params_millions=inside.params_millions, batch_size=inside.batch_size * 16,
                  input_dim=inside.input_dim, num_layers=inside.num_layers)
    d_far = p.predict(far)
    assert len(d_far.warnings) == 1 and "batch-size" in d_far.warnings[0] and "x4.00" in d_far.warnings[0]
    # 16x the largest batch: 4 doublings out -> x2^(0.5*4) = x4 on the learned part of the calibrated bound
    fixed = _fixed_part(meta, far)
    raw = fixed + (d_far.memory_mib_upper - fixed) / 4.0
    assert raw >= d_far.memory_mib * 0.999
    assert d_far.to_dict()["warnings"] == list(d_far.warnings)


def test_out_of_range_rule_by_hand() -> None:
    ranges = {"vit": {"batch_size": (8.0, 128.0), "input_dim": (224.0, 384.0)}}
    assert out_of_range(JobSpec("vit", batch_size=64, input_dim=224), ranges) == (1.0, ())
    factor, warnings = out_of_range(JobSpec("vit", batch_size=512, input_dim=224), ranges)  # 2 doublings out
    assert factor == pytest.approx(2.0) and "batch-size=512 is outside 8..128" in warnings[0]
    # a little out: widened in proportion (2^(0.5 x log2(160/128)) = 1.118), not by a fixed step
    factor, warnings = out_of_range(JobSpec("vit", batch_size=160, input_dim=224), ranges)
    assert factor == pytest.approx(1.25**0.5) and "batch-size=160" in warnings[0]
    factor, _ = out_of_range(JobSpec("vit", batch_size=134, input_dim=224), ranges)
    assert 1.0 < factor < 1.05
    factor, warnings = out_of_range(JobSpec("vit", batch_size=2, input_dim=1536), ranges)  # two keys out
    assert factor == pytest.approx(2.0) and len(warnings) == 2
    factor, warnings = out_of_range(JobSpec("lstm"), ranges)
    assert factor == 2.0 and "no job of this family" in warnings[0]
    assert out_of_range(JobSpec("lstm"), {}) == (1.0, ())


def test_clip_bounds_hold_each_family_to_its_own_range() -> None:
    ranges = {"cnn": [[1e-6, 2.0], [1e-4, 9.0]], "mlp": [[0.5, 1.0], [3.0, 4.0]]}
    low, high = clip_bounds(ranges, ["mlp", "cnn", "vit"], 2)
    np.testing.assert_array_equal(low, [[0.5, 1.0], [1e-6, 2.0], [0.0, 0.0]])
    np.testing.assert_array_equal(high, [[3.0, 4.0], [1e-4, 9.0], [np.inf, np.inf]])  # vit: no range, no clip


def test_runtime_probe_reports_every_round_at_normal_priority(artifact: Path) -> None:
    """The serving figures `deepres evaluate` writes: a fresh process, no torch, each round kept, and the
    probe back at nice 0 where the caller may raise it (root here; a niced caller otherwise keeps its own)."""
    import os

    from predictor.bench import runtime_figures

    figures = runtime_figures(artifact, calls=50, rounds=2)
    assert figures["imports_torch"] is False
    assert len(figures["rounds"]) == 2 and figures["p99_ms"] in [r["p99_ms"] for r in figures["rounds"]]
    assert 0 < figures["p50_ms"] <= figures["p99_ms"] <= figures["p99_ms_worst_round"]
    assert figures["probe_nice"] == (0 if os.geteuid() == 0 else os.nice(0))
    assert figures["predict_cli_wall_s"] < 10


def _spec_of_row(data: Any, r: int) -> JobSpec:
    c = data.cols
    return JobSpec(str(c["model_type"][r]), params_millions=float(c["params_millions"][r]),
                   batch_size=int(c["batch_size"][r]), input_dim=int(c["input_dim"][r]),
                   num_layers=int(c["num_layers"][r]), iterations=int(c["iterations"][r]),
                   precision=str(c["precision"][r]), optimizer=str(c["optimizer"][r]),
                   learning_rate=float(c["learning_rate"][r]), regularization=bool(c["regularization"][r]),
                   data_augmentation=bool(c["data_augmentation"][r]))


def test_the_served_bound_is_the_one_evaluate_scores(tmp_path: Path) -> None:
    """`deepres evaluate` scores `FittedModel.predict`; the numpy runtime must serve that same bound,
    margins and out-of-range widening included, and warn exactly where it widened."""
    from predictor.splits import Split
    from predictor.train import range_factors

    data = load_dataset(write_jobs_csv(tmp_path / "jobs.csv", n=160, seed=3))
    batch = data.cols["batch_size"].astype(float)
    rows = np.arange(data.n_rows, dtype=np.int64)
    big = batch > np.quantile(batch, 0.8)  # jobs with the largest batches: outside the trained range
    unseen = data.families == "rnn"  # a family the model never trains on
    test = np.unique(np.concatenate([rows[big], rows[~big][::5], rows[unseen]]))
    split = Split("t", np.setdiff1d(rows, test), np.sort(test))
    model = fit_model("transformer_bigru_tuned", data, split, seed=0, epochs_scale=2 / 120, cv_folds=1)
    save_artifact(model, data, tmp_path / "art", 0, {}, 1.0)
    _, upper = model.predict(data, split.test)
    factors = range_factors(data, split.test, model.ranges)
    assert (factors > 1.0).any() and (factors == 1.0).any() and unseen[split.test].any()
    assert model.unseen_shift is not None and "rnn" not in model.ranges
    served = Predictor.load(tmp_path / "art", cache_size=0)
    for i, r in enumerate(split.test):
        d = served.predict(_spec_of_row(data, int(r)))
        assert d.memory_mib_upper == pytest.approx(upper[i], rel=1e-4, abs=0.1)
        assert bool(d.warnings) == (factors[i] > 1.0)


def test_a_job_stating_its_activation_count_takes_the_margins_calibrated_with_it(artifact: Path,
                                                                                 tmp_path: Path) -> None:
    """Mondrian on `activations-millions`: doubling the margins of jobs without it widens only those."""
    meta = json.loads((artifact / "metadata.json").read_text())
    bare = meta["memory_upper_without_shapes"]
    assert bare is not None
    wider = {**bare, "shift": bare["shift"] + math.log(2.0),
             "by_family": {f: v + math.log(2.0) for f, v in bare["by_family"].items()}}
    base = Predictor.load(artifact, cache_size=0)
    changed = Predictor.load(_with_metadata(artifact, tmp_path, memory_upper_without_shapes=wider), cache_size=0)
    plain = SPECS[0]
    stated = JobSpec("cnn", params_millions=15, batch_size=64, input_dim=224, num_layers=5, precision="amp",
                     optimizer="sgd", activations_millions=6.0)
    assert changed.predict(stated) == base.predict(stated)
    fixed = _fixed_part(meta, plain)
    assert changed.predict(plain).memory_mib_upper - fixed == pytest.approx(
        2.0 * (base.predict(plain).memory_mib_upper - fixed), rel=1e-3)


def test_a_damaged_adaboost_member_is_refused_at_load(artifact: Path, tmp_path: Path) -> None:
    """The AdaBoost trees are checked like the booster's: missing weights or a tree splitting on a feature
    the artifact does not have fails the load, never a prediction."""
    with np.load(artifact / WEIGHTS_FILE) as archive:
        arrays = {k: archive[k] for k in archive.files}
    for name, broken in (("no weights", {k: v for k, v in arrays.items() if k != "ada1.weights"}),
                         ("short weights", {**arrays, "ada0.weights": arrays["ada0.weights"][:-1]}),
                         ("bad feature", {**arrays, "ada0.feature": np.where(arrays["ada0.feature"] >= 0, 99,
                                                                            arrays["ada0.feature"])})):
        target = tmp_path / name
        shutil.copytree(artifact, target)
        np.savez(target / WEIGHTS_FILE, **broken)
        with pytest.raises(ArtifactError, match="unreadable"):
            Predictor.load(target)
