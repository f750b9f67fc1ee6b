"""Cluster scenario 1 has room for every pod, whatever the order and placement (#34 row 10).

The scenario reads each pod after it is placed. When a pod found no GPU with room at its admission
memory, the extender's own preemption evicted a strictly lower-priority one, and the scenario then read
a pod that was gone (`cnn-small`: 404, on a loaded machine). Checked here with the shipped predictor's
admission bound and the simulated GPUs of tests/e2e/values-kind.yaml: for every feasible placement of
any subset of the pods, each pod not placed yet still fits on some GPU, so no filter ever fails them all.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml

from extender.agent.simulated import parse_gpu_spec
from predictor.spec import JOB_KEYS, JobSpec
from tests.e2e import scenarios as s

REPO = Path(__file__).resolve().parents[2]


def admissions_mib() -> dict[str, float]:
    from predictor.runtime import ArtifactError, Predictor

    try:
        predictor = Predictor.load(None)
    except (ArtifactError, OSError) as err:
        pytest.skip(f"no predictor artifact here: {err}")
    out: dict[str, float] = {}
    for stem in s.FIT_EXAMPLES:
        example = yaml.safe_load((REPO / "deploy" / "examples" / f"{stem}.yaml").read_text())
        notes = {k[len(s.PREFIX):]: v for k, v in example["metadata"]["annotations"].items()}
        demand = predictor.predict(JobSpec.parse({k: v for k, v in notes.items() if k in JOB_KEYS}))
        out[example["metadata"]["name"]] = demand.memory_mib_upper
    for i, gib in enumerate(s.FIT_SIZED_GIB):
        out[f"sized-{i}"] = gib * 1024.0
    return out


def gpu_capacities_mib() -> list[float]:
    values = yaml.safe_load((REPO / "tests" / "e2e" / "values-kind.yaml").read_text())
    return [g.memory_mib for spec in values["agent"]["simulated"]["nodes"].values() for g in parse_gpu_spec(spec)]


def test_every_pod_of_scenario_1_has_room_in_any_order() -> None:
    pods = admissions_mib()
    gpus = gpu_capacities_mib()
    names = list(pods)
    stuck = []
    for placement in itertools.product(range(-1, len(gpus)), repeat=len(names)):  # -1: not placed yet
        used = [0.0] * len(gpus)
        for name, where in zip(names, placement, strict=True):
            if where >= 0:
                used[where] += pods[name]
        if any(u > c for u, c in zip(used, gpus, strict=True)):
            continue  # not a placement the filter allows
        for name, where in zip(names, placement, strict=True):
            if where < 0 and not any(c - u >= pods[name] for u, c in zip(used, gpus, strict=True)):
                stuck.append((name, {n: w for n, w in zip(names, placement, strict=True) if w >= 0}))
    assert not stuck, f"{len(stuck)} placements leave a pod no room, e.g. {stuck[0]} (GPUs {gpus}, MiB {pods})"
