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
    attention: tuple[int, int, int] = (2, 4, 32)
    """Self-attention after the BiGRU as (blocks, heads, query/key/value channels per head); each block
    adds its input back and layer-normalises (the paper: 2 blocks of 4 heads x 32 channels)."""
    gru_units: tuple[int, int] = (6, 10)
    """Hidden units of the GRU reading the steps in order, and of the one reading them reversed, whose
    outputs are concatenated per step (the paper: 6 and 10)."""
    dropout: float = 0.01
    """Dropout after the attention blocks' ReLU (the paper: 0.01); identity at inference."""
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
    huber_delta: float = 0.0
    """0: squared error on the (scaled) targets; > 0: Huber loss with this delta (robust to the few
    architectures unlike any other, which would otherwise pull every prediction towards them)."""

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
        for pair in ("attention", "gru_units"):
            if pair in values:
                values[pair] = tuple(values[pair])
        return cls(**values)


class NumpyNetwork:
    """The forward pass from state-dict arrays: (B, n_features) scaled inputs -> (B, n_outputs).

    Built for one row at a time (the extender's request): what does not depend on the input is
    folded into a few matrices once, at load. The token embeddings, positions and both GRUs' input
    projections are linear in the inputs, so they become one matrix over the numeric columns plus
    one lookup table per categorical column, giving every step's gate inputs in a single product;
    the two GRU directions run as one recurrence over their stacked state (block matrices), the
    backward one reading the steps in reverse; the attention scale is folded into the query weights.
    The result equals `TransformerBiGRU.forward` in eval mode (dropout is the identity) to float
    precision, which the tests check.
    """

    def __init__(self, config: ModelConfig, n_features: int, n_categorical: int,
                 weights: Mapping[str, npt.ArrayLike]) -> None:
        def arr(name: str) -> FloatArray:
            if name not in weights:
                raise ValueError(f"the weights lack {name!r}")
            return np.asarray(weights[name], dtype=np.float64)

        self.config = config
        self.n_numeric = n_numeric = n_features - n_categorical
        # per step: (numeric columns -> token matrix (C, k), token bias (C,)); categorical steps: tables (card, C)
        if config.tokens:
            groups = config.token_groups or tuple((i,) for i in range(n_numeric))
            tokens = [(np.asarray(g, dtype=np.int64), arr(f"group_embeddings.{i}.weight"),
                       arr(f"group_embeddings.{i}.bias")) for i, g in enumerate(groups)]
            tables = [arr(f"cat_embeddings.{i}.weight") for i in range(n_categorical)]
        else:  # the paper's layout: one step whose channels are the features
            tokens = [(np.arange(n_numeric), np.eye(n_numeric), np.zeros(n_numeric))]
            tables = []
        self.steps = steps = len(tokens) + len(tables)
        position = arr("position.weight")[:steps]
        (wf_ih, wf_hh, bf_ih, bf_hh), (wb_ih, wb_hh, bb_ih, bb_hh) = (
            tuple(arr(f"{gru}.{name}") for name in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"))
            for gru in ("gru_forward", "gru_backward"))
        hf, hb = wf_hh.shape[1], wb_hh.shape[1]
        self.hidden_forward, self.hidden = hf, hf + hb
        h3 = 3 * self.hidden
        # gate layout of the stacked state: [r_f r_b | z_f z_b | n_f n_b]
        cols_f = np.concatenate([np.arange(hf) + g * self.hidden for g in range(3)])
        cols_b = np.concatenate([hf + np.arange(hb) + g * self.hidden for g in range(3)])
        # step s: the forward GRU reads token s, the backward GRU token steps-1-s
        self.gate_matrix = np.zeros((n_numeric, steps * h3))
        self.gate_bias = np.zeros(steps * h3)
        self.gate_tables: list[FloatArray] = []
        for t in range(steps):
            for s_, w_ih, b_ih, cols in ((t, wf_ih, bf_ih, cols_f), (steps - 1 - t, wb_ih, bb_ih, cols_b)):
                at = s_ * h3 + cols
                self.gate_bias[at] += position[t] @ w_ih.T + b_ih
                if t < len(tokens):
                    idx, w_tok, b_tok = tokens[t]
                    self.gate_matrix[np.ix_(idx, at)] += (w_ih @ w_tok).T
                    self.gate_bias[at] += b_tok @ w_ih.T
        for i, table in enumerate(tables):
            t = len(tokens) + i
            full = np.zeros((len(table), steps * h3))
            full[:, t * h3 + cols_f] = table @ wf_ih.T
            full[:, (steps - 1 - t) * h3 + cols_b] = table @ wb_ih.T
            self.gate_tables.append(full)
        self.w_hh = np.zeros((self.hidden, h3))  # h @ w_hh: the stacked state's recurrent gates
        self.w_hh[:hf, cols_f] = wf_hh.T
        self.w_hh[hf:, cols_b] = wb_hh.T
        self.b_hh = np.zeros(h3)
        self.b_hh[cols_f], self.b_hh[cols_b] = bf_hh, bb_hh
        layers, heads, keys = config.attention
        scale = np.ones(3 * heads * keys)
        scale[: heads * keys] = keys**-0.5  # queries
        self.attention = []
        for i in range(layers):
            w_qkv, b_qkv, w_out, b_out, gamma, beta = (arr(f"attention.{i}.{name}") for name in (
                "qkv.weight", "qkv.bias", "out.weight", "out.bias", "norm.weight", "norm.bias"))
            self.attention.append(((w_qkv * scale[:, None]).T.copy(), b_qkv * scale, w_out.T.copy(), b_out, gamma,
                                   beta))
        names = (("head.0", "head.2") if config.head_hidden else ("head",))
        self.head = [(arr(f"{n}.weight").T.copy(), arr(f"{n}.bias")) for n in names]
        self.wide = (arr("wide.weight").T.copy(), arr("wide.bias")) if config.wide else None

    def _bigru(self, gates: FloatArray) -> FloatArray:
        """(B, steps, 3H) gate inputs -> (B, steps, H): forward outputs then backward outputs per step."""
        batch = gates.shape[0]
        hidden, hf = self.hidden, self.hidden_forward
        h = np.zeros((batch, hidden))
        states = np.empty((batch, self.steps, hidden))
        for t in range(self.steps):
            g = gates[:, t]
            gh = h @ self.w_hh + self.b_hh
            rz = 1.0 / (1.0 + np.exp(-(g[:, : 2 * hidden] + gh[:, : 2 * hidden])))  # r, z as in torch.nn.GRU
            n = np.tanh(g[:, 2 * hidden :] + rz[:, :hidden] * gh[:, 2 * hidden :])
            z = rz[:, hidden:]
            h = n + z * (h - n)  # (1 - z) n + z h
            states[:, t] = h
        states[:, :, hf:] = states[:, ::-1, hf:]  # the backward GRU's step t read token steps-1-t
        return states

    def __call__(self, x: FloatArray) -> FloatArray:
        config = self.config
        gates = x[:, : self.n_numeric] @ self.gate_matrix + self.gate_bias
        for i, table in enumerate(self.gate_tables):
            gates += table[x[:, self.n_numeric + i].astype(np.int64)]
        h = self._bigru(gates.reshape(len(x), self.steps, 3 * self.hidden))
        batch, steps, _ = h.shape
        _, heads, keys = config.attention
        for w_qkv, b_qkv, w_out, b_out, gamma, beta in self.attention:
            q, k, v = (h @ w_qkv + b_qkv).reshape(batch, steps, 3, heads, keys).transpose(2, 0, 3, 1, 4)
            scores = q @ k.transpose(0, 1, 3, 2)  # (B, H, T, T); q carries the 1/sqrt(K) scale
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            attended = (scores / scores.sum(axis=-1, keepdims=True)) @ v  # (B, H, T, K)
            y = h + attended.transpose(0, 2, 1, 3).reshape(batch, steps, heads * keys) @ w_out + b_out
            y -= y.mean(axis=-1, keepdims=True)
            h = y / np.sqrt((y * y).mean(axis=-1, keepdims=True) + LAYER_NORM_EPS) * gamma + beta
        h = np.maximum(h, 0.0)
        out = h.reshape(batch, -1) if config.pool == "flatten" else h.mean(axis=1)
        for i, (w, b) in enumerate(self.head):
            out = out @ w + b
            if i < len(self.head) - 1:  # GELU (tanh approximation), as in the torch head
                out = 0.5 * out * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (out + 0.044715 * out**3)))
        if self.wide is not None:
            out = out + x[:, : self.n_numeric] @ self.wide[0] + self.wide[1]
        result: FloatArray = out
        return result


@dataclass(frozen=True)
class Scaling:
    """Everything a fitted Transformer-BiGRU needs besides its weights: the configuration, the
    categorical columns, and how inputs and outputs are scaled. The trainer (`predictor.model`)
    fits it and writes it as JSON (`to_meta`); the runtime reads it back (`from_meta`): one home
    for the scaling both sides apply."""

    config: ModelConfig
    categorical: tuple[int, ...]
    x_mean: FloatArray
    x_scale: FloatArray
    y_mean: FloatArray
    y_scale: FloatArray
    y_range: FloatArray
    """(2, n_targets): the lowest and highest target seen in training (log space if logged): outputs
    are held inside it, so a network never extrapolates a density to something no job ever had."""
    random_state: int = 0

    @classmethod
    def fit(cls, config: ModelConfig, categorical: tuple[int, ...], X: FloatArray, targets: FloatArray,
            random_state: int) -> Scaling:
        """Standardise the numeric columns of X and the targets (already in log space if the config says so)."""
        numeric = X[:, : X.shape[1] - len(categorical)]
        return cls(config, tuple(categorical), numeric.mean(axis=0), _nonzero(numeric.std(axis=0)),
                   targets.mean(axis=0), _nonzero(targets.std(axis=0)),
                   np.stack([targets.min(axis=0), targets.max(axis=0)]), random_state)

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> Scaling:
        x_mean, x_scale, y_mean, y_scale = (np.asarray(meta[k], dtype=np.float64)
                                            for k in ("x_mean", "x_scale", "y_mean", "y_scale"))
        y_range = np.asarray(meta.get("y_range", [[-np.inf] * len(y_mean), [np.inf] * len(y_mean)]), dtype=np.float64)
        scaling = cls(ModelConfig.from_dict(meta["config"]), tuple(int(c) for c in meta["categorical"]),
                      x_mean, x_scale, y_mean, y_scale, y_range, int(meta.get("random_state", 0)))
        if int(meta.get("n_features", scaling.n_features)) != scaling.n_features:
            raise ValueError(f"x_mean has {len(scaling.x_mean)} entries for {meta['n_features']} features "
                             f"({len(scaling.categorical)} categorical)")
        return scaling

    def to_meta(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(), "categorical": list(self.categorical), "n_features": self.n_features,
                "n_targets": self.n_targets, "x_mean": self.x_mean.tolist(), "x_scale": self.x_scale.tolist(),
                "y_mean": self.y_mean.tolist(), "y_scale": self.y_scale.tolist(), "y_range": self.y_range.tolist(),
                "random_state": self.random_state}

    @property
    def n_features(self) -> int:
        return len(self.x_mean) + len(self.categorical)

    @property
    def n_targets(self) -> int:
        return len(self.y_mean)

    @property
    def n_outputs(self) -> int:
        """Network outputs: one per target, plus the quantile head's gap if the config has one."""
        return self.n_targets + (1 if self.config.upper_quantile is not None else 0)

    def scale_x(self, X: npt.ArrayLike) -> FloatArray:
        """Checked (n, n_features) copy of X with its numeric columns standardised."""
        scaled = np.array(X, dtype=np.float64, copy=True)
        if scaled.ndim != 2 or scaled.shape[1] != self.n_features:
            raise ValueError(f"X must have shape (n, {self.n_features}), got {scaled.shape}")
        split = len(self.x_mean)
        scaled[:, :split] -= self.x_mean
        scaled[:, :split] /= self.x_scale
        return scaled

    def outputs(self, out: FloatArray) -> tuple[FloatArray, FloatArray | None]:
        """Network outputs -> (points (n, n_targets), upper quantile of target 0 (n,) or None) in target units."""
        n = self.n_targets
        point = self._unscale(out[:, :n], slice(0, n))
        if self.config.upper_quantile is None:
            return point, None
        gap = np.logaddexp(0.0, out[:, n])  # softplus: the bound never below the point
        return point, self._unscale(out[:, 0] + gap, 0)

    def _unscale(self, z: FloatArray, target: int | slice) -> FloatArray:
        values: FloatArray = np.clip(z * self.y_scale[target] + self.y_mean[target], self.y_range[0, target],
                                     self.y_range[1, target])
        return np.exp(values) if self.config.log_targets else values


def _nonzero(std: FloatArray) -> FloatArray:
    out: FloatArray = np.where(std > 0, std, 1.0)
    return out


class NumpyEstimator:
    """A fitted Transformer-BiGRU for inference: input scaling, the numpy network, output unscaling.

    Built from the estimator metadata the trainer writes (`TransformerBiGRURegressor.get_state`)
    and the weight arrays; predictions equal the torch estimator's to float precision.
    """

    def __init__(self, meta: Mapping[str, Any], weights: Mapping[str, npt.ArrayLike]) -> None:
        self.scaling = Scaling.from_meta(meta)
        self.config = self.scaling.config
        self.network = NumpyNetwork(self.config, self.scaling.n_features, len(self.scaling.categorical), weights)

    def predict_with_upper(self, X: FloatArray) -> tuple[FloatArray, FloatArray | None]:
        """Point predictions (n, n_targets) and the upper quantile of target 0 (n,) or None."""
        return self.scaling.outputs(self.network(self.scaling.scale_x(X)))
