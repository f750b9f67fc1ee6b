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


def test_fixed_bytes_are_weights_plus_optimizer_state() -> None:
    """10M parameters: fp32 Adam holds 4 bytes x (weights + 2 moments); bf16 SGD 2 bytes x weights;
    amp keeps fp32 master weights, so momentum is 4 bytes x 2."""
    specs = [JobSpec("resnet", params_millions=10, precision="fp32", optimizer="adam"),
             JobSpec("resnet", params_millions=10, precision="bf16", optimizer="sgd"),
             JobSpec("resnet", params_millions=10, precision="amp", optimizer="momentum")]
    terms = feats.decomposition(feats.columns_from_specs(specs))
    mib = 10e6 / 2**20
    np.testing.assert_allclose(terms.fixed_mib, [12 * mib, 2 * mib, 8 * mib])


def test_activation_scale_follows_what_activations_grow_with() -> None:
    def scale(spec: JobSpec) -> float:
        return float(feats.decomposition(feats.columns_from_specs([spec])).act_scale[0])

    image = JobSpec("cnn", params_millions=20, batch_size=16, input_dim=224, num_layers=50)
    assert scale(JobSpec("cnn", params_millions=20, batch_size=32, input_dim=224, num_layers=50)) == pytest.approx(
        2 * scale(image))  # linear in the batch
    assert scale(JobSpec("cnn", params_millions=20, batch_size=16, input_dim=448, num_layers=50)) == pytest.approx(
        4 * scale(image))  # an image's pixels
    text = JobSpec("gpt", params_millions=100, batch_size=4, input_dim=512, num_layers=12)
    assert scale(JobSpec("gpt", params_millions=100, batch_size=4, input_dim=1024, num_layers=12)) == pytest.approx(
        2 * scale(text))  # a sequence's tokens
    # an MLP's hidden activations do not grow with its number of input features
    assert scale(JobSpec("mlp", params_millions=5, input_dim=784)) == scale(JobSpec("mlp", params_millions=5,
                                                                                     input_dim=16384))


def test_the_decomposition_decodes_what_it_encodes() -> None:
    specs = [JobSpec("vit", params_millions=86, batch_size=32), JobSpec("lstm", params_millions=3, batch_size=8)]
    terms = feats.decomposition(feats.columns_from_specs(specs), 1462.25, 1.1)
    y = np.asarray([[30000.0, 5000.0], [2500.0, 40.0]])
    dens = terms.encode(y)
    assert (dens > 0).all()
    np.testing.assert_allclose(terms.memory(dens[:, 0]), y[:, 0])
    np.testing.assert_allclose(terms.flops(dens[:, 1]), y[:, 1])
