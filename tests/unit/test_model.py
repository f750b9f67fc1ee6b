"""The Transformer-BiGRU: the paper's numbers, shapes, the estimator contract, learning."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from predictor.inference import NumpyNetwork
from predictor.model import (
    ModelConfig,
    SelfAttention,
    TransformerBiGRU,
    TransformerBiGRURegressor,
    paper_config,
    pinball_loss,
    tuned_config,
)


def test_paper_config_matches_the_seed() -> None:
    c = paper_config()
    assert (c.max_positions, c.attention) == (512, (2, 4, 32))  # 2 blocks, 4 heads, 32 key channels
    assert (c.gru_units, c.dropout) == ((6, 10), 0.01)  # forward, backward GRU units
    assert (c.optimizer, c.epochs, c.batch_size, c.learning_rate) == ("adam", 200, 256, 0.01)
    assert (c.lr_schedule, c.lr_drop_epoch, c.lr_after) == ("piecewise", 80, 0.001)
    assert (c.weight_decay, c.grad_clip) == (1e-3, 10.0)
    assert (c.tokens, c.feature_set, c.log_targets, c.head_hidden, c.upper_quantile) == (False, "seed", False, 0, None)


def test_paper_network_layers() -> None:
    net = TransformerBiGRU(paper_config(), n_features=11, categorical=(), n_outputs=1)
    assert net.steps == 1 and net.position.num_embeddings == 512
    assert (net.gru_forward.hidden_size, net.gru_backward.hidden_size) == (6, 10)
    assert len(net.attention) == 2
    attn = net.attention[0]
    assert isinstance(attn, SelfAttention)
    assert attn.qkv.out_features == 3 * 4 * 32 and attn.out.out_features == 16
    assert isinstance(net.head, torch.nn.Linear) and net.head.out_features == 1
    assert net(torch.randn(5, 11)).shape == (5, 1)


def test_tuned_network_shapes() -> None:
    config = tuned_config()
    n_numeric = 1 + max(i for group in config.token_groups for i in group)
    net = TransformerBiGRU(config, n_features=n_numeric + 3, categorical=(9, 4, 6), n_outputs=3)
    x = torch.randn(7, n_numeric + 3)
    x[:, n_numeric:] = torch.tensor([8.0, 3.0, 5.0])  # highest valid codes
    assert net.steps == len(config.token_groups) + 3
    assert net(x).shape == (7, 3)


def _toy(n: int = 300, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (n, 4))
    y = np.column_stack([np.exp(1.0 + x[:, 0] + 0.5 * x[:, 1]), np.exp(2.0 - x[:, 2])])
    return x, y


QUICK = ModelConfig(name="quick", tokens=True, d_token=8, gru_units=(4, 4), attention=(2, 2, 4), head_hidden=16,
                    wide=True, log_targets=True, upper_quantile=0.9, epochs=25,
                    batch_size=64, learning_rate=1e-2, lr_schedule="cosine", optimizer="adamw", weight_decay=0.0,
                    grad_clip=1.0, dropout=0.0, pool="flatten")


def test_fit_reduces_loss_and_upper_head_sits_above() -> None:
    x, y = _toy()
    est = TransformerBiGRURegressor(QUICK, random_state=0).fit(x, y)
    assert est.loss_curve_[-1] < 0.5 * est.loss_curve_[0]
    points, upper = est.predict_with_upper(x)
    assert points.shape == (300, 2) and upper is not None
    assert (upper >= points[:, 0] * (1 - 1e-6)).all()
    assert np.mean(np.abs(np.log(points / y))) < np.mean(np.abs(np.log(y.mean(axis=0) / y)))


def test_same_seed_same_model_and_state_round_trip() -> None:
    x, y = _toy(120)
    a = TransformerBiGRURegressor(QUICK, random_state=3, epochs=3).fit(x, y)
    b = TransformerBiGRURegressor(QUICK, random_state=3, epochs=3).fit(x, y)
    np.testing.assert_array_equal(a.predict(x), b.predict(x))
    weights, meta = a.get_state()
    c = TransformerBiGRURegressor.from_state(weights, meta)
    np.testing.assert_allclose(a.predict(x), c.predict(x), rtol=1e-6)


def test_estimator_contract() -> None:
    est = TransformerBiGRURegressor(QUICK, random_state=1, epochs=1)
    assert not hasattr(est, "module_")  # __init__ only stores
    with pytest.raises(RuntimeError, match="not fitted"):
        est.predict(np.zeros((1, 4)))
    with pytest.raises(ValueError, match="positive"):
        est.fit(np.zeros((3, 4)), -np.ones((3, 2)))
    with pytest.raises(ValueError, match="shape"):
        est.fit(np.zeros((3, 4)), np.ones((3, 2))).predict(np.zeros((2, 5)))


def test_pinball_loss_by_hand() -> None:
    pred, target = torch.tensor([1.0, 1.0]), torch.tensor([2.0, 0.0])
    # under by 1 costs q, over by 1 costs 1 - q
    assert float(pinball_loss(pred, target, 0.9)) == pytest.approx((0.9 + 0.1) / 2)


@pytest.mark.parametrize("config", [paper_config(), QUICK], ids=["paper", "tokens"])
def test_numpy_forward_matches_torch(config: ModelConfig) -> None:
    torch.manual_seed(0)
    categorical = () if not config.tokens else (5, 3)
    net = TransformerBiGRU(config, n_features=6 if config.tokens else 11, categorical=categorical, n_outputs=3).eval()
    x = torch.randn(9, 6 if config.tokens else 11)
    if config.tokens:
        x[:, 4] = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2, 3])
        x[:, 5] = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2])
    with torch.no_grad():
        expected = net(x).double().numpy()
    weights = {k: v.numpy() for k, v in net.state_dict().items()}  # what the .npz artifact holds
    numpy_net = NumpyNetwork(config, x.shape[1], len(categorical), weights)
    np.testing.assert_allclose(numpy_net(x.double().numpy()), expected, rtol=1e-4, atol=1e-5)


def test_predictions_stay_inside_the_targets_seen_in_training() -> None:
    """Far outside the training inputs the wide (linear) path would extrapolate a log target without
    limit (a 1000x memory bound); outputs are held to the range of the training targets."""
    x, y = _toy()
    est = TransformerBiGRURegressor(QUICK, random_state=0).fit(x, y)
    wild = x[:5].copy()
    wild[:, 0] = 1e6  # a numeric input a million standard deviations out
    points, upper = est.predict_with_upper(wild)
    assert upper is not None
    for k in range(y.shape[1]):
        assert (points[:, k] >= y[:, k].min() * (1 - 1e-9)).all() and (points[:, k] <= y[:, k].max() * (1 + 1e-9)).all()
    assert (upper <= y[:, 0].max() * (1 + 1e-9)).all()
