"""The family path's bound, earned per family and batch regime (predictor/data/family_bounds.json).

A job that names no architecture and states no activation count (`activations-millions`) gets the
network's point (the text families: the traced table's, where the file's `point` is `text_table`:
`served_point`, `predictor.family_table.served_point`); its bound widens the learned term (what the step
saves for backward; the weights and optimizer state are exact) by a log margin. The artifact's margin is
one for every family (x2.95 on the learned term), set by the families whose points err most, so a
ResNet-like job was bounded at 3x its real peak to cover a text encoder's error. Here the margin is that
family's own: the quantile of log((truth - fixed) / (point - fixed)) over jobs of architecture groups
the network never saw (`deepres train --split grouped`, several seeds; every group weighted alike), per
batch regime (per-GPU batch <= 16 or above) where SERVE_MIN_GROUPS (5) groups back it; a family with
fewer (the text families, the torch.nn recurrent stacks) keeps the artifact's margin.
`python -m predictor.family_eval --write` refits the file and measures the
result on held-out groups (leave one group out inside the held-out side: `family_path` in
reports/predictor.json). Serving reads the JSON (no numpy).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

BOUNDS_PATH = Path(__file__).resolve().parent / "data" / "family_bounds.json"
#: The per-GPU batch at or below which a job is in the `small` regime (as the live calibration's).
SMALL_BATCH = 16


def regime(batch_size: float) -> str:
    return "small" if float(batch_size) <= SMALL_BATCH else "large"


@cache
def load(path: str = str(BOUNDS_PATH)) -> dict[str, Any]:
    """{"margins": {family: {"small"|"large"|"any": log margin}}, ...}; {} when absent."""
    file = Path(path)
    if not file.is_file():
        return {}
    data: dict[str, Any] = json.loads(file.read_text())
    return data


def served_point(path: str = str(BOUNDS_PATH)) -> str:
    """The family-path point the margins were earned on (`--point` of `predictor.family_eval`): `network`,
    or `text_table` (the traced table's neighbours for the text families, `predictor.family_table`)."""
    return str(load(path).get("point", "network"))


def margin(family: str, batch_size: float, path: str = str(BOUNDS_PATH)) -> float | None:
    """The earned log margin of a bare family-path job (None: no file or no margin earned for the family:
    the artifact's margin stays)."""
    data = load(path)
    if not data:
        return None
    by_family = data.get("margins", {}).get(family, {})
    value = by_family.get(regime(batch_size), by_family.get("any"))
    return None if value is None else float(value)
