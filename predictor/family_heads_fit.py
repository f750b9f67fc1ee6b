"""Fitting the family path's task-head ratios (predictor/family_heads.py) on the traced heads, and their
held-out figure: `python -m predictor.family_heads_fit` (apart from the serving module, which it would
otherwise import the runtime into)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from predictor.family_heads import HEADS_PATH, ratios
from predictor.spec import JobSpec

REPORT = Path(__file__).resolve().parents[1] / "reports" / "predictor.json"
BATCHES = (8, 32)
PRECISIONS = ("fp32", "amp")




def traced_rows() -> list[dict[str, Any]]:
    """Per traced (model, task, input, batch, precision): the family fields and the traced Demands
    with the task's head and with the default head."""
    from predictor import exact
    from predictor.table import load_tasks

    table = exact.load_table()["models"]
    out: list[dict[str, Any]] = []
    for name, traced in load_tasks().items():
        entry = table.get(name)
        if entry is None:
            continue
        for task, by_task in traced.get("tasks", {}).items():
            if "@" in task:  # seq2seq target lengths: no family default to compare with
                continue
            for inp, curve in by_task["inputs"].items():
                for batch in BATCHES:
                    for precision in PRECISIONS:
                        try:
                            with_task = exact.estimate(name, batch, int(inp), precision, "adamw", task=task)
                            default = exact.estimate(name, batch, int(inp), precision, "adamw")
                        except ValueError:
                            continue
                        out.append({"name": name, "family": entry["family"], "task": task, "input_dim": int(inp),
                                    "batch_size": batch, "precision": precision,
                                    "params_millions": float(curve["params_millions"]),
                                    "num_layers": int(curve["num_layers"]),
                                    "task_mib": with_task.memory_mib, "default_mib": default.memory_mib})
    return out


def fit(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    import numpy as np

    families: dict[str, dict[str, dict[str, float]]] = {}
    for family, task in sorted({(r["family"], r["task"]) for r in rows}):
        r = np.asarray([x["task_mib"] / x["default_mib"] for x in rows if (x["family"], x["task"]) == (family, task)])
        families.setdefault(family, {})[task] = {"point": round(float(np.median(r)), 4),
                                                 "bound": round(float(np.max(r)), 4), "n": int(r.size)}
    return families


def held_out(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The family path on each model's rows, the ratios fitted on the other models."""
    import numpy as np

    from predictor.runtime import Predictor

    predictor = Predictor.load()
    result: dict[str, Any] = {}
    for family, task in sorted({(r["family"], r["task"]) for r in rows}):
        sel = [r for r in rows if (r["family"], r["task"]) == (family, task)]
        errs_with, errs_without, under_with, under_without = [], [], 0, 0
        for name in sorted({r["name"] for r in sel}):
            ratio = fit([r for r in sel if r["name"] != name]).get(family, {}).get(task)
            for r in (x for x in sel if x["name"] == name):
                spec = JobSpec(model_type=family, params_millions=r["params_millions"], num_layers=r["num_layers"],
                               batch_size=r["batch_size"], input_dim=r["input_dim"], precision=r["precision"],
                               optimizer="adamw")
                plain = predictor.predict(spec)
                truth = r["task_mib"]
                errs_without.append(abs(plain.memory_mib / truth - 1.0))
                under_without += plain.memory_mib_upper < truth
                if ratio is None:
                    continue
                errs_with.append(abs(plain.memory_mib * ratio["point"] / truth - 1.0))
                under_with += max(plain.memory_mib_upper * ratio["bound"], plain.memory_mib * ratio["point"]) < truth
        result[f"{family}/{task}"] = {
            "n": len(sel), "models": len({r["name"] for r in sel}),
            "median_abs_rel_err": round(float(np.median(errs_with)), 4) if errs_with else None,
            "under_rate": round(under_with / len(errs_with), 4) if errs_with else None,
            "without": {"median_abs_rel_err": round(float(np.median(errs_without)), 4),
                        "under_rate": round(under_without / len(sel), 4)}}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m predictor.family_heads_fit",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--report", type=Path, default=REPORT)
    args = parser.parse_args(argv)
    rows = traced_rows()
    HEADS_PATH.write_text(json.dumps({"about": "task-head ratios of the family path: written by `python -m "
                                               "predictor.family_heads_fit`", "families": fit(rows)}, indent=1) + "\n")
    ratios.cache_clear()
    figures = {"by_family_task": held_out(rows), "labels": "traced peaks (predictor/data/exact_tasks.json, through "
               "the A100 calibration), not measured: the repository has no measured text jobs with a task head",
               "method": "family annotations of every Hugging Face model traced with a non-default head; the "
                         "ratio (median: point, largest: bound) fitted on the other models (leave one model out); "
                         "`without`: the family path as before (the default head)"}
    report = json.loads(args.report.read_text()) if args.report.exists() else {}
    report["family_heads"] = figures
    args.report.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(figures["by_family_task"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
