"""Error metrics of the comparison (the seed's Table 3 plus what admission cares about).

MAPE is in percent, as the seed reports it; `median_abs_rel_err` and `p90_abs_rel_err` are the
median and 90th percentile of |pred - truth| / truth (what a user feels on one job); `under_rate` is
the fraction of jobs whose admission bound (`memory_mib_upper`) is below the true peak, i.e. the
jobs that would risk an OOM if admitted on it; `over_reservation` is the mean of upper / truth - 1
over all jobs (how much memory the bound reserves beyond the real peak, on average).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
POINT_METRICS: tuple[str, ...] = ("mse", "rmse", "mae", "mape", "r2", "median_abs_rel_err", "p90_abs_rel_err")


def _pair(y_true: npt.ArrayLike, y_pred: npt.ArrayLike) -> tuple[FloatArray, FloatArray]:
    t = np.asarray(y_true, dtype=np.float64).ravel()
    p = np.asarray(y_pred, dtype=np.float64).ravel()
    if t.shape != p.shape or t.size == 0:
        raise ValueError(f"need two non-empty arrays of the same length, got {t.size} and {p.size}")
    return t, p


def regression_metrics(y_true: npt.ArrayLike, y_pred: npt.ArrayLike) -> dict[str, float]:
    """MSE, RMSE, MAE, MAPE (%), R² (1 - SS_res / SS_tot; 0 when the truth is constant), and the
    median and 90th percentile of the absolute relative error."""
    t, p = _pair(y_true, y_pred)
    err = p - t
    mse = float(np.mean(err**2))
    ss_tot = float(np.sum((t - t.mean()) ** 2))
    r2 = 1.0 - float(np.sum(err**2)) / ss_tot if ss_tot > 0 else 0.0
    rel = np.abs(err) / np.maximum(np.abs(t), 1e-12)
    return {"mse": mse, "rmse": float(np.sqrt(mse)), "mae": float(np.mean(np.abs(err))),
            "mape": float(np.mean(rel)) * 100.0, "r2": r2,
            "median_abs_rel_err": float(np.median(rel)), "p90_abs_rel_err": float(np.percentile(rel, 90))}


def under_rate(y_true: npt.ArrayLike, upper: npt.ArrayLike) -> float:
    """Fraction of jobs whose upper bound is strictly below the truth (the OOM risk)."""
    t, u = _pair(y_true, upper)
    return float(np.mean(u < t))


def over_reservation(y_true: npt.ArrayLike, upper: npt.ArrayLike) -> float:
    """Mean of upper / truth - 1 over all jobs (negative where the bound falls short)."""
    t, u = _pair(y_true, upper)
    return float(np.mean(u / np.maximum(t, 1e-12) - 1.0))


def upper_margin(y_true: npt.ArrayLike, y_pred: npt.ArrayLike, coverage: float) -> float:
    """The log-scale margin m such that pred * exp(m) covers `coverage` of the jobs.

    Split conformal: on a calibration fold the model did not fit, the ceil((n + 1) * coverage)-th
    smallest of log(truth / prediction) (the finite-sample correction: with n calibration jobs
    exchangeable with the next one, its bound covers it with probability >= coverage). Above the
    largest score (too few jobs for the coverage asked) the largest is used. It is negative when
    the bound already over-covers (a quantile head).
    """
    if not 0.0 < coverage < 1.0:
        raise ValueError(f"coverage must be in (0, 1), got {coverage}")
    t, p = _pair(y_true, y_pred)
    tiny = np.finfo(np.float64).tiny  # scale-free: the scores may be of densities far below 1
    return conformal_quantile(np.log(np.maximum(t, tiny) / np.maximum(p, tiny)), coverage)


def conformal_quantile(scores: npt.ArrayLike, level: float) -> float:
    """The ceil((n + 1) x level)-th smallest score (split conformal; the largest when n is too small):
    the one rank rule of `upper_margin` and of the bound's margins (`predictor.train.conformal_plan`)."""
    ordered = np.sort(np.asarray(scores, dtype=np.float64))
    rank = min(len(ordered), max(1, int(np.ceil((len(ordered) + 1) * level))))
    return float(ordered[rank - 1])


def bound_figures(y_true: npt.ArrayLike, y_pred: npt.ArrayLike, upper: npt.ArrayLike) -> dict[str, float | int]:
    """How a predictor's point and bound met measured peaks (rounded for reports): the point's median,
    90th percentile and signed median relative error, and the bound's under-rate and over-reservation."""
    t, p = _pair(y_true, y_pred)
    rel = p / np.maximum(t, 1e-12) - 1.0
    return {"n": int(t.size), "median_abs_rel_err": round(float(np.median(np.abs(rel))), 6),
            "p90_abs_rel_err": round(float(np.percentile(np.abs(rel), 90)), 6),
            "median_signed_rel_err": round(float(np.median(rel)), 6),
            "under_rate": round(under_rate(t, upper), 6), "over_reservation": round(over_reservation(t, upper), 6)}
