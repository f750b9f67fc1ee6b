"""Test-set predictions of one model on one split, pooled over folds (what `evaluate` collects and
`report` plots; it sits below both so neither imports the other)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from predictor.metrics import over_reservation, under_rate

if TYPE_CHECKING:
    from predictor.trainset import Dataset

FloatArray = npt.NDArray[np.float64]

#: Coverages the bound is also recalibrated to (same fits, same held-out jobs) for the trade-off
#: curve: `splits.<split>.coverage_curve.<model>` in reports/predictor.json.
CURVE_COVERAGES: tuple[float, ...] = (0.90, 0.95, 0.97)


class Predictions:
    """Test-set predictions of one model on one split (pooled over folds for leave_family_out)."""

    def __init__(self) -> None:
        self.rows: list[npt.NDArray[np.int64]] = []
        self.points: list[FloatArray] = []
        self.upper: list[FloatArray] = []
        self.curve: list[FloatArray] = []  # (len(CURVE_COVERAGES), n) bounds per fold

    def add(self, rows: npt.NDArray[np.int64], points: FloatArray, upper: FloatArray,
            curve: FloatArray | None = None) -> None:
        self.rows.append(rows)
        self.points.append(points)
        self.upper.append(upper)
        if curve is not None:
            self.curve.append(curve)

    def coverage_curve(self, data: Dataset) -> list[dict[str, float]]:
        """Under-rate and over-reservation of the pooled test rows at each of CURVE_COVERAGES ([] if unknown)."""
        if not self.curve or len(self.curve) != len(self.rows):
            return []
        truth = data.y[np.concatenate(self.rows), 0]
        bounds = np.concatenate(self.curve, axis=1)
        return [{"coverage": c, "under_rate": round(under_rate(truth, b), 6),
                 "over_reservation": round(over_reservation(truth, b), 6)}
                for c, b in zip(CURVE_COVERAGES, bounds, strict=True)]

    def arrays(self) -> tuple[npt.NDArray[np.int64], FloatArray, FloatArray]:
        return np.concatenate(self.rows), np.concatenate(self.points), np.concatenate(self.upper)
