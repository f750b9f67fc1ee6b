"""A capacity world built from measurements, apart from the policy's model (issue 46, item 1).

`capworld.World` made a job's true rate the policy's own forecast raised to a per-job exponent: the
world was the model, bent. This world has its own physics, fitted on the measured step rates alone,
and every premise it rests on is stated in `PREMISES` (and in reports/simulation.json
`capacity.model.world`), with its source; where a premise is not measured the experiment is run
both ways (`--world measured-kind` and `--world measured-harsh`).

1. Time-slicing without precedence, with a context cost (`slice_fractions`). Each job alternates a
   host phase (1 - d of its alone step time) and a GPU phase (d). With n contexts on a GPU every GPU
   phase costs (1 + TAU x (n - 1)) of what it costs alone (time slices, context switches, caches
   refilled: the *time* an extra context costs), and the GPU serves the contexts that want it in
   turn, so a job's GPU phase also waits for the others' share of the GPU:

       T_i = (1 - d_i) + g_i (1 + sum_{j != i} g_j / T_j),   g_i = d_i (1 + TAU (n - 1)),   f_i = 1 / T_i

   A light job waits a full turn behind a heavy one (the model's precedence, which spares it, is not
   assumed). TAU is fitted by least squares on the measured rows (`fit_tau`: every group of
   ../shared/data/colocation's rate file, the duties the interference report gives its jobs).
2. Light beside heavy, unmeasured as step rates (no rate file holds an input-bound job beside a
   GPU-bound one: reports/interference.json `limits`): `harsh` takes rule 1 for every group;
   `kind` takes the policy's model for a group of unequal duties (the model is right where nothing
   says otherwise) and rule 1 for groups of equal duties (the measured kind: pairs and triples of
   alike jobs).
3. Memory of an extra context: each process holds its own CUDA context, ~1.46 GB
   (predictor/dataset/calibration.json `context_mib`, GPUMemNet's A100 nvidia-smi peaks): it is in
   every job's measured peak (the H100 runs' NVML process peak), so sharing adds none on top; the
   replay's OOM rule sees it there.
4. Duty per job signature (`assign_by_signature`): a signature's base duty is drawn once from the
   regime's distribution; each run of it is that duty x e^N(0, RUN_NOISE) (run-to-run noise; then the
   world's drift as before). The noise is unmeasured here: RUN_NOISE 0.1 (a premise).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from extender.policy.interference import step_rate_fractions
from extender.simulate import capworld
from extender.simulate.world import Job

#: Run-to-run noise of a signature's duty (sd of its log factor): a premise, unmeasured here.
RUN_NOISE = 0.1
#: The memory an extra context costs on top of the job's own measured peak (MiB): none (premise 3).
CONTEXT_EXTRA_MIB = 0.0
CONTEXT_MIB_SOURCE = ("predictor/dataset/calibration.json context_mib (1,462 MiB per process, GPUMemNet A100 "
                      "nvidia-smi peaks): inside every job's measured NVML process peak")
_ITERATIONS = 200
_TOLERANCE = 1e-10
VARIANTS = ("measured-harsh", "measured-kind")


def slice_fractions(duties: Sequence[float], tau: float) -> tuple[float, ...]:
    """Rule 1: each job's step-rate fraction on one time-sliced GPU with `tau` per extra context."""
    n = len(duties)
    if n <= 1:
        return (1.0,) * n
    g = [min(max(d, 0.0), 1.0) * (1.0 + tau * (n - 1)) for d in duties]
    t = [1.0 - min(max(d, 0.0), 1.0) + gi for d, gi in zip(duties, g, strict=True)]
    for _ in range(_ITERATIONS):
        shares = [gi / ti for gi, ti in zip(g, t, strict=True)]
        total = sum(shares)
        new = [1.0 - min(max(d, 0.0), 1.0) + gi * (1.0 + total - si)
               for d, gi, si in zip(duties, g, shares, strict=True)]
        done = max(abs(a - b) for a, b in zip(new, t, strict=True)) < _TOLERANCE
        t = new
        if done:
            break
    return tuple(min(1.0, 1.0 / ti) for ti in t)


def measured_rows(report: Mapping[str, Any]) -> list[tuple[tuple[float, ...], int, float]]:
    """(the group's duties, the member's index, its measured fraction) for every row of an interference
    report's leave-one-group-out (`simulate.interference.build_report`): the step rates measured."""
    rows = []
    for group in report["leave_one_group_out"]["per_group"]:
        duties = tuple(float(m["duty"]) for m in group["members"])
        for i, m in enumerate(group["members"]):
            rows.append((duties, i, float(m["measured_fraction"])))
    return rows


def fit_tau(rows: Sequence[tuple[tuple[float, ...], int, float]]) -> float:
    """TAU minimising the squared relative error of rule 1 over `rows` (a grid of 0.005 steps)."""
    def loss(tau: float) -> float:
        return sum(((slice_fractions(d, tau)[i] - f) / f) ** 2 for d, i, f in rows)

    return min((round(0.005 * k, 3) for k in range(0, 201)), key=loss)


@dataclass
class MeasuredWorld(capworld.World):
    """`capworld.World` (its drift, samples, losses) with rule 1 (and rule 2's variant) for the rates."""

    tau: float = 0.0
    variant: str = "measured-harsh"

    def fractions(self, jobs: Sequence[Job]) -> tuple[float, ...]:
        if len(jobs) <= 1:
            return (1.0,) * len(jobs)
        duties = [j.duty for j in jobs]
        if self.variant == "measured-kind" and max(duties) - min(duties) > 0.05:
            return step_rate_fractions(duties)  # unmeasured mix: the model's answer (premise 2, kind)
        return slice_fractions(duties, self.tau)


def signature_duty(signature: str, draw: Callable[[np.random.Generator], float], seed: int) -> float:
    """A signature's base duty: one draw of the regime's distribution, seeded by the signature and the
    seed (the same script has the same duty in every run of a seed)."""
    digest = hashlib.sha256(f"{seed}:{signature}".encode()).digest()
    return draw(np.random.default_rng(int.from_bytes(digest[:8], "big")))


def assign_by_signature(jobs: Sequence[Job], world: capworld.World, draw: Callable[[np.random.Generator], float],
                        seed: int, noise: float = RUN_NOISE) -> list[float]:
    """Premise 4: each job's duty, its signature's base duty x e^N(0, noise), then `capworld.assign`
    (declarations, checkpoints, its world's exponent) with these duties. Returns the duties."""
    rng = np.random.default_rng(seed + 36_000)
    duties = [min(max(signature_duty(j.spec_key, draw, seed) * math.exp(float(rng.normal(0.0, noise))),
                      capworld.DUTY_FLOOR), 1.0) for j in jobs]
    capworld.assign(jobs, world, duties)
    return duties


PREMISES = {
    "rates": "time-slicing without precedence, each extra context costing TAU of every GPU phase (rule 1 of "
             "extender/simulate/measuredworld.py), TAU fitted on the measured step rates of ../shared/data/colocation "
             "(h100-2026-11-27.json, 12 groups, duties as reports/interference.json gives them)",
    "light_beside_heavy": "unmeasured as step rates: measured-harsh applies rule 1 (a light job waits a full turn "
                          "behind a heavy one), measured-kind the policy's model for groups of unequal duties",
    "context_memory": CONTEXT_MIB_SOURCE + "; nothing added on top when sharing",
    "duty": f"per job signature (one draw of the regime's distribution), each run x e^N(0, {RUN_NOISE}) (run-to-run "
            "noise: unmeasured, a premise), then the drift of capworld",
}
