"""Error metrics of the comparison (the seed's Table 3 plus what admission cares about).

MAPE is in percent, as the seed reports it; `under_rate` is the fraction of jobs whose admission
bound (`memory_mib_upper`) is below the true peak, i.e. the jobs that would risk an OOM if
admitted on it; `over_reservation` is the mean relative excess of that bound over the truth.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
POINT_METRICS: tuple[str, ...] = ("mse", "rmse", "mae", "mape", "r2")


def _pair(y_true: npt.ArrayLike, y_pred: npt.ArrayLike) -> tuple[FloatArray, FloatArray]:
    t = np.asarray(y_true, dtype=np.float64).ravel()
    p = np.asarray(y_pred, dtype=np.float64).ravel()
    if t.shape != p.shape or t.size == 0:
        raise ValueError(f"need two non-empty arrays of the same length, got {t.size} and {p.size}")
    return t, p


def regression_metrics(y_true: npt.ArrayLike, y_pred: npt.ArrayLike) -> dict[str, float]:
    """MSE, RMSE, MAE, MAPE (%), R² (1 - SS_res / SS_tot; 0 when the truth is constant)."""
    t, p = _pair(y_true, y_pred)
    err = p - t
    mse = float(np.mean(err**2))
    ss_tot = float(np.sum((t - t.mean()) ** 2))
    r2 = 1.0 - float(np.sum(err**2)) / ss_tot if ss_tot > 0 else 0.0
    mape = float(np.mean(np.abs(err) / np.maximum(np.abs(t), 1e-12))) * 100.0
    return {"mse": mse, "rmse": float(np.sqrt(mse)), "mae": float(np.mean(np.abs(err))), "mape": mape, "r2": r2}


def under_rate(y_true: npt.ArrayLike, upper: npt.ArrayLike) -> float:
    """Fraction of jobs whose upper bound is strictly below the truth (the OOM risk)."""
    t, u = _pair(y_true, upper)
    return float(np.mean(u < t))


def over_reservation(y_true: npt.ArrayLike, upper: npt.ArrayLike) -> float:
    """Mean of (upper - truth) / truth over the jobs the bound covers (how much memory it wastes)."""
    t, u = _pair(y_true, upper)
    covered = u >= t
    if not covered.any():
        return 0.0
    return float(np.mean((u[covered] - t[covered]) / t[covered]))


def upper_margin(y_true: npt.ArrayLike, y_pred: npt.ArrayLike, coverage: float) -> float:
    """The log-scale margin m such that pred * exp(m) covers `coverage` of the jobs.

    Computed on a calibration fold (split-conformal style): the `coverage` quantile of
    log(truth / prediction). It is negative when the bound already over-covers (a quantile head).
    """
    if not 0.0 < coverage < 1.0:
        raise ValueError(f"coverage must be in (0, 1), got {coverage}")
    t, p = _pair(y_true, y_pred)
    ratio = np.log(np.maximum(t, 1e-12) / np.maximum(p, 1e-12))
    return float(np.quantile(ratio, coverage, method="higher"))
