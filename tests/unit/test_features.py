"""Feature sets: shapes, codes, and that the analytic estimates follow the physics they claim."""

from __future__ import annotations

import numpy as np
import pytest

from predictor import features as feats
from predictor.spec import MODEL_FAMILIES, JobSpec


def _one(spec: JobSpec) -> dict[str, float]:
    est = feats.analytic_estimates(feats.columns_from_specs([spec]))
    return {k: float(v[0]) for k, v in est.items()}


def test_seed_features_are_the_11_seed_columns_with_codes() -> None:
    spec = JobSpec("gpt", params_millions=10, batch_size=8, precision="bf16", optimizer="sgd", regularization=True)
    fm = feats.seed_features(feats.columns_from_specs([spec]))
    assert fm.names == feats.SEED_COLUMNS and fm.values.shape == (1, 11)
    row = dict(zip(fm.names, fm.values[0], strict=True))
    assert row["model_type"] == MODEL_FAMILIES.index("gpt")
    assert (row["batch_size"], row["regularization"]) == (8.0, 1.0)


def test_physics_features_end_with_categorical_codes() -> None:
    specs = [JobSpec(f) for f in MODEL_FAMILIES]
    fm = feats.physics_features(feats.columns_from_specs(specs))
    assert fm.values.shape == (len(specs), len(fm.names))
    assert fm.categorical == (len(MODEL_FAMILIES), 4, 6)
    assert list(fm.values[:, -3]) == list(range(len(MODEL_FAMILIES)))
    assert np.isfinite(fm.values).all()


@pytest.mark.parametrize(("optimizer", "states"), [("sgd", 0), ("momentum", 1), ("adam", 2), ("adamw", 2)])
def test_optimizer_state_scales_with_state_count(optimizer: str, states: int) -> None:
    est = _one(JobSpec("mlp", params_millions=10, optimizer=optimizer))
    assert est["optimizer_bytes"] == pytest.approx(states * est["grads_bytes"])


def test_half_precision_halves_weights_and_amp_keeps_fp32_masters() -> None:
    fp32 = _one(JobSpec("transformer", params_millions=50, precision="fp32"))
    fp16 = _one(JobSpec("transformer", params_millions=50, precision="fp16"))
    amp = _one(JobSpec("transformer", params_millions=50, precision="amp"))
    assert fp16["weights_bytes"] == pytest.approx(fp32["weights_bytes"] / 2)
    assert amp["grads_bytes"] == pytest.approx(fp32["grads_bytes"])
    assert amp["weights_bytes"] == pytest.approx(fp32["weights_bytes"])  # fp32 master weights
    # half-precision activations plus autocast's half copy of the weights (2 bytes per parameter)
    assert amp["activation_bytes"] == pytest.approx(fp32["activation_bytes"] / 2 + fp16["weights_bytes"])


@pytest.mark.parametrize("family", MODEL_FAMILIES)
def test_activations_and_flops_grow_with_batch(family: str) -> None:
    small = _one(JobSpec(family, params_millions=20, batch_size=8))
    big = _one(JobSpec(family, params_millions=20, batch_size=64))
    assert big["activation_bytes"] > small["activation_bytes"] > 0
    assert big["flops"] == pytest.approx(8 * small["flops"], rel=0.05)
    assert big["static_bytes"] == pytest.approx(small["static_bytes"])


def test_attention_term_is_quadratic_in_sequence() -> None:
    short = _one(JobSpec("gpt", params_millions=20, input_dim=256))
    long = _one(JobSpec("gpt", params_millions=20, input_dim=1024))
    # 4x the tokens: the linear term grows ~4x, the score term ~16x (a bit less: positions take
    # parameters, so the realised width and head count shrink)
    assert long["act_attention_bytes"] / short["act_attention_bytes"] > 10
    assert long["act_linear_bytes"] / short["act_linear_bytes"] < 5
    assert long["act_logits_bytes"] > 0 and _one(JobSpec("transformer"))["act_logits_bytes"] == 0


def test_frame_and_specs_give_the_same_features() -> None:
    pd = pytest.importorskip("pandas")
    specs = [JobSpec("resnet", params_millions=11.7, batch_size=32), JobSpec("lstm", optimizer="rmsprop")]
    frame = pd.DataFrame([{k: getattr(s, k) for k in feats.SEED_COLUMNS} for s in specs])
    a = feats.physics_features(feats.columns_from_frame(frame)).values
    b = feats.physics_features(feats.columns_from_specs(specs)).values
    np.testing.assert_allclose(a, b)


def test_unknown_category_is_a_clear_error() -> None:
    cols = feats.columns_from_specs([JobSpec("mlp")])
    cols["precision"] = np.asarray(["fp8"])
    with pytest.raises(ValueError, match=r"precision.*fp8"):
        feats.seed_features(cols)
    with pytest.raises(ValueError, match="unknown feature set"):
        feats.build_features(cols, "magic")
