"""The Transformer-BiGRU's forward pass in numpy: what the torch-free runtime serves.

`predictor.model` trains the network with torch and writes its weights as a plain `name -> array`
mapping (the module's state-dict names, saved as .npz); this module rebuilds the forward pass from
that mapping alone, so `deepres serve` and `deepres predict` never import torch. It mirrors
`TransformerBiGRU.forward` in eval mode line by line (dropout is the identity) and the tests hold
the two to the same outputs.

`ModelConfig` lives here too: the runtime needs the architecture to read the weights back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
#: torch.nn.LayerNorm's default epsilon (the network uses the default).
LAYER_NORM_EPS = 1e-5


@dataclass(frozen=True)
class ModelConfig:
    """Architecture and training settings of one Transformer-BiGRU."""

    name: str = "tuned"
    feature_set: str = "physics"
    """Which `predictor.features` set the model reads (`seed` or `physics`)."""
    tokens: bool = True
    """True: each feature is a token of width `d_token`. False (paper): one time step, channels = features."""
    d_token: int = 32
    """Token embedding width (tokens=True only)."""
    token_groups: tuple[tuple[int, ...], ...] = ()
    """Numeric columns embedded together as one token each (tokens=True); empty: one token per column."""
    max_positions: int = 512
    """Size of the learned position embedding table (the paper's maximum position 512)."""
    attention_layers: int = 2
    heads: int = 4
    key_channels: int = 32
    """Query/key (and value) channels per head."""
    gru_forward_units: int = 6
    gru_backward_units: int = 10
    dropout: float = 0.01
    pool: str = "mean"
    """How the sequence becomes one vector: `mean` over steps, or `flatten` (keeps each feature's slot)."""
    head_hidden: int = 0
    """Hidden units of the output MLP; 0 = the paper's single fully connected layer."""
    wide: bool = False
    """Add a linear path from the numeric inputs to the outputs (wide & deep)."""
    log_targets: bool = False
    """Learn log(target) (relative error) instead of the target itself."""
    upper_quantile: float | None = None
    """If set, a head for this quantile of the first target (memory), trained with the pinball loss."""
    epochs: int = 200
    batch_size: int = 256
    learning_rate: float = 0.01
    lr_schedule: str = "piecewise"
    """`piecewise` (the paper: learning_rate, then `lr_after` from epoch `lr_drop_epoch`) or `cosine`."""
    lr_drop_epoch: int = 80
    lr_after: float = 0.001
    weight_decay: float = 1e-3
    """L2 regularisation (coupled, as MATLAB's L2Regularization) for `adam`; decoupled for `adamw`."""
    optimizer: str = "adam"
    grad_clip: float = 10.0
    target_weights: tuple[float, ...] = field(default=())
    """Loss weight per target (empty: all 1)."""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["target_weights"] = list(self.target_weights)
        data["token_groups"] = [list(g) for g in self.token_groups]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelConfig:
        values = dict(data)
        values["target_weights"] = tuple(values.get("target_weights", ()))
        values["token_groups"] = tuple(tuple(g) for g in values.get("token_groups", ()))
        return cls(**values)


class NumpyNetwork:
    """The forward pass from state-dict arrays: (B, n_features) scaled inputs -> (B, n_outputs)."""

    def __init__(self, config: ModelConfig, n_features: int, n_categorical: int,
                 weights: Mapping[str, npt.ArrayLike]) -> None:
        def arr(name: str) -> FloatArray:
            if name not in weights:
                raise ValueError(f"the weights lack {name!r}")
            return np.asarray(weights[name], dtype=np.float64)

        self.config = config
        self.n_numeric = n_features - n_categorical
        if config.tokens:
            groups = config.token_groups or tuple((i,) for i in range(self.n_numeric))
            self.groups = [(np.asarray(g, dtype=np.int64), arr(f"group_embeddings.{i}.weight"),
                            arr(f"group_embeddings.{i}.bias")) for i, g in enumerate(groups)]
            self.cats = [arr(f"cat_embeddings.{i}.weight") for i in range(n_categorical)]
            self.steps = len(groups) + n_categorical
        else:
            self.groups, self.cats, self.steps = [], [], 1
        self.position = arr("position.weight")[: self.steps]
        gru_names = ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")
        self.grus = [tuple(arr(f"{gru}.{name}") for name in gru_names) for gru in ("gru_forward", "gru_backward")]
        self.attention = [
            tuple(arr(f"attention.{i}.{name}") for name in
                  ("qkv.weight", "qkv.bias", "out.weight", "out.bias", "norm.weight", "norm.bias"))
            for i in range(config.attention_layers)
        ]
        if config.head_hidden:
            self.head = [(arr("head.0.weight"), arr("head.0.bias")), (arr("head.2.weight"), arr("head.2.bias"))]
        else:
            self.head = [(arr("head.weight"), arr("head.bias"))]
        self.wide = (arr("wide.weight"), arr("wide.bias")) if config.wide else None

    @staticmethod
    def _gru(seq: FloatArray, w_ih: FloatArray, w_hh: FloatArray, b_ih: FloatArray, b_hh: FloatArray) -> FloatArray:
        batch, steps, _ = seq.shape
        hidden = w_hh.shape[1]
        gi = seq @ w_ih.T + b_ih  # (B, T, 3H), gates r, z, n as in torch.nn.GRU
        h = np.zeros((batch, hidden))
        out = np.empty((batch, steps, hidden))
        for t in range(steps):
            gh = h @ w_hh.T + b_hh
            r = 1.0 / (1.0 + np.exp(-(gi[:, t, :hidden] + gh[:, :hidden])))
            z = 1.0 / (1.0 + np.exp(-(gi[:, t, hidden : 2 * hidden] + gh[:, hidden : 2 * hidden])))
            n = np.tanh(gi[:, t, 2 * hidden :] + r * gh[:, 2 * hidden :])
            h = (1.0 - z) * n + z * h
            out[:, t] = h
        return out

    def __call__(self, x: FloatArray) -> FloatArray:
        config = self.config
        if config.tokens:
            tokens = [x[:, idx] @ w.T + b for idx, w, b in self.groups]
            tokens += [table[x[:, self.n_numeric + i].astype(np.int64)] for i, table in enumerate(self.cats)]
            seq = np.stack(tokens, axis=1)  # (B, T, C)
        else:
            seq = x[:, None, :]
        seq = seq + self.position[None]
        fwd = self._gru(seq, *self.grus[0])
        bwd = self._gru(seq[:, ::-1], *self.grus[1])[:, ::-1]
        h = np.concatenate([fwd, bwd], axis=2)  # (B, T, Uf+Ub)
        batch, steps, _ = h.shape
        heads, keys = config.heads, config.key_channels
        for w_qkv, b_qkv, w_out, b_out, gamma, beta in self.attention:
            q, k, v = (h @ w_qkv.T + b_qkv).reshape(batch, steps, 3, heads, keys).transpose(2, 0, 3, 1, 4)
            scores = q @ k.transpose(0, 1, 3, 2) * keys**-0.5  # (B, H, T, T)
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            attended = (scores / scores.sum(axis=-1, keepdims=True)) @ v  # (B, H, T, K)
            y = h + attended.transpose(0, 2, 1, 3).reshape(batch, steps, heads * keys) @ w_out.T + b_out
            mean = y.mean(axis=-1, keepdims=True)
            var = y.var(axis=-1, keepdims=True)
            h = (y - mean) / np.sqrt(var + LAYER_NORM_EPS) * gamma + beta
        h = np.maximum(h, 0.0)
        out = h.reshape(batch, -1) if config.pool == "flatten" else h.mean(axis=1)
        for i, (w, b) in enumerate(self.head):
            out = out @ w.T + b
            if i < len(self.head) - 1:  # GELU (tanh approximation), as in the torch head
                out = 0.5 * out * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (out + 0.044715 * out**3)))
        if self.wide is not None:
            out = out + x[:, : self.n_numeric] @ self.wide[0].T + self.wide[1]
        result: FloatArray = out
        return result


class NumpyEstimator:
    """A fitted Transformer-BiGRU for inference: input scaling, the numpy network, output unscaling.

    Built from the estimator metadata the trainer writes (`TransformerBiGRURegressor.get_state`)
    and the weight arrays; predictions equal the torch estimator's to float precision.
    """

    def __init__(self, meta: Mapping[str, Any], weights: Mapping[str, npt.ArrayLike]) -> None:
        self.config = ModelConfig.from_dict(meta["config"])
        self.n_features = int(meta["n_features"])
        self.n_targets = int(meta["n_targets"])
        self.n_categorical = len(meta["categorical"])
        self.x_mean = np.asarray(meta["x_mean"], dtype=np.float64)
        self.x_scale = np.asarray(meta["x_scale"], dtype=np.float64)
        self.y_mean = np.asarray(meta["y_mean"], dtype=np.float64)
        self.y_scale = np.asarray(meta["y_scale"], dtype=np.float64)
        if len(self.x_mean) != self.n_features - self.n_categorical:
            raise ValueError(f"x_mean has {len(self.x_mean)} entries for {self.n_features - self.n_categorical} "
                             f"numeric features")
        self.network = NumpyNetwork(self.config, self.n_features, self.n_categorical, weights)

    def predict_with_upper(self, X: FloatArray) -> tuple[FloatArray, FloatArray | None]:
        """Point predictions (n, n_targets) and the upper quantile of target 0 (n,) or None."""
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValueError(f"X must have shape (n, {self.n_features}), got {X.shape}")
        scaled = X.copy()
        split = self.n_features - self.n_categorical
        scaled[:, :split] = (X[:, :split] - self.x_mean) / self.x_scale
        out = self.network(scaled)
        point = self._unscale(out[:, : self.n_targets], slice(0, self.n_targets))
        if self.config.upper_quantile is None:
            return point, None
        gap = np.logaddexp(0.0, out[:, self.n_targets])  # softplus: the bound never below the point
        return point, self._unscale(out[:, 0] + gap, 0)

    def _unscale(self, z: FloatArray, target: int | slice) -> FloatArray:
        values: FloatArray = z * self.y_scale[target] + self.y_mean[target]
        return np.exp(values) if self.config.log_targets else values
