"""The task head on the family path: `deepres.io/task` changes a text job's memory there too.

The family network was trained on each family's default head (`gpt`: causal-lm, `transformer`:
masked-lm: a vocabulary's logits per token), so a BERT fine-tuned as a classifier was predicted with
the masked-LM head (traced: the classifier's peak is 0.44-0.96 of the masked-LM one). The exact
path reads the traced head of the named model (predictor/data/exact_tasks.json); the family path
has no model name, so it takes, per (family, task), the ratio of the traced peak with that head to
the peak with the default head over every Hugging Face model traced with both (all inputs, batches
8 and 32, fp32 and amp): the median for the point, the largest for the bound (a bound errs on the
safe side: never below what any traced model's head keeps; at the 90th percentile the bound left
7.2% of BERT-like classifiers above it instead of 6.3%).

`python -m predictor.family_heads_fit` refits predictor/data/family_heads.json and merges
`family_heads` (held out by model: the family path against the traced peak with the task's head,
with and without the ratio) into reports/predictor.json. Serving reads the JSON (no numpy).
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache
from pathlib import Path

from predictor.spec import Demand, JobSpec

HEADS_PATH = Path(__file__).resolve().parent / "data" / "family_heads.json"


@cache
def ratios(path: str = str(HEADS_PATH)) -> dict[str, dict[str, dict[str, float]]]:
    """family -> task -> {"point": median ratio, "bound": largest ratio, "n": rows}."""
    file = Path(path)
    if not file.is_file():
        return {}
    data: dict[str, dict[str, dict[str, float]]] = json.loads(file.read_text())["families"]
    return data


def apply(spec: JobSpec, demand: Demand) -> Demand:
    """The family-path Demand of a job whose task is not its family's default head (unchanged on the
    exact path, for the default head, and where no ratio was traced)."""
    if spec.model or spec.traced_peak_mib > 0 or not spec.task:
        return demand
    ratio = ratios().get(spec.model_type, {}).get(spec.task)
    if ratio is None:
        return demand
    point = demand.memory_mib * float(ratio["point"])
    bound = max(point, demand.memory_mib_upper * float(ratio["bound"]))
    note = (f"task {spec.task} on the {spec.model_type} family: its head keeps {float(ratio['point']):.2f} of the "
            "default head's memory (traced, predictor/family_heads.py)")
    return replace(demand, memory_mib=round(point, 3), memory_mib_upper=round(bound, 3),
                   warnings=(*demand.warnings, note))
