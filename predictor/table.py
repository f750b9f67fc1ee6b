"""The traced table (predictor/data/exact.json) and its names: read once, names resolved.

It sits below both `spec` (which resolves `deepres.io/model` and fills the family fields from the
table's entry) and `exact` (which turns an entry into a Demand), so neither imports the other's
caller. An unknown name raises `SpecError` naming the closest known names (difflib).
"""

from __future__ import annotations

import difflib
import json
from functools import cache
from pathlib import Path
from typing import Any

from predictor.errors import SpecError

TABLE_PATH = Path(__file__).resolve().parent / "data" / "exact.json"
TASKS_PATH = Path(__file__).resolve().parent / "data" / "exact_tasks.json"
HF_TABLE_PATH = Path(__file__).resolve().parent / "dataset" / "hf_models.json"
SOURCES = ("timm", "torchvision", "hf")


@cache
def load_table(path: str = str(TABLE_PATH)) -> dict[str, Any]:
    """The shipped table (read once). An absent table is an empty one: every name is then unknown."""
    file = Path(path)
    if not file.is_file():
        return {"models": {}, "calibration": {"context_mib": 0.0, "factor": 1.0},
                "bound": {"calibration_rel": 0.05, "batch_extrapolation_rel": 0.02, "input_interpolation_rel": 0.15}}
    data: dict[str, Any] = json.loads(file.read_text())
    return data


@cache
def _aliases(path: str = str(TABLE_PATH)) -> dict[str, str]:
    """Lower-case spellings -> table name: the name itself and, for HF, the hub path of its source."""
    models = load_table(path)["models"]
    out = {name.lower(): name for name in models}
    if HF_TABLE_PATH.is_file():
        for entry in json.loads(HF_TABLE_PATH.read_text())["models"]:
            name = f"hf/{entry['name']}"
            if name in models:
                out[f"hf/{entry['source']}".lower()] = name
    return out


def resolve(name: str, path: str = str(TABLE_PATH)) -> str:
    """The table's name for `name` (case-insensitive; HF hub paths accepted); SpecError otherwise."""
    text = str(name).strip()
    found = _aliases(path).get(text.lower())
    if found is not None:
        return found
    known = sorted(load_table(path)["models"])
    if "/" not in text or text.split("/", 1)[0] not in SOURCES:
        raise SpecError("model", name, "timm/<name>, torchvision/<name> or hf/<config name> "
                        f"({len(known)} architectures in the table, e.g. timm/resnet50)")
    close = difflib.get_close_matches(text, known, n=3, cutoff=0.6)
    if not close:  # a model name without its source prefix, or a typo in the prefix
        close = difflib.get_close_matches(text.split("/", 1)[1], [k.split("/", 1)[1] for k in known], n=3)
        close = [k for k in known if k.split("/", 1)[1] in close][:3]
    hint = f"; closest: {', '.join(close)}" if close else ""
    raise SpecError("model", name, f"an architecture of the traced table{hint} "
                    "(custom code: trace it with `deepres profile` and give deepres.io/traced-peak-mib)")


def entry(name: str, path: str = str(TABLE_PATH)) -> dict[str, Any]:
    """The table entry of a (resolved) name."""
    result: dict[str, Any] = load_table(path)["models"][resolve(name, path)]
    return result


def names(path: str = str(TABLE_PATH)) -> list[str]:
    return sorted(load_table(path)["models"])


@cache
def load_tasks(path: str = str(TASKS_PATH)) -> dict[str, Any]:
    """The traced heads other than each model's default (`predictor.dataset.heads`), by table name;
    empty when the file is absent."""
    file = Path(path)
    if not file.is_file():
        return {}
    models: dict[str, Any] = json.loads(file.read_text())["models"]
    return models
