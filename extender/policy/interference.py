"""Interference model: how fast each job on one GPU runs, given the GPU duties of all jobs there.

A job's *duty* d (0..1) is the share of its own step time the GPU is busy with it when it runs
alone: 1 for a GPU-bound job, 0.4 for one whose data loader keeps the GPU idle 60% of the time.
Sharing a GPU by time-slicing (no MPS, no MIG) runs one context at a time, so jobs queue for the GPU
while the others' kernels run, and a job's idle phases (input, host work) let the others in.

The model is the textbook one for that situation, with one measured correction: a closed queueing
network, each job one customer cycling between its own "think" phase (the GPU-idle part of its step,
1 - d of its alone step time: input waits, host-side Python and kernel launches) and one time-shared
server (the GPU, d of its alone step time), solved by approximate mean-value analysis (Schweitzer's
fixed point). With the alone step time as the unit, job i's GPU phase lasts

    R_i = s x d_i x (1 + sum_{j != i} w_ij x Q_j),   Q_j = R_j / (1 - d_j + R_j)   (j's share at the GPU)
    w_ij = (d_i / d_j) ** p          when d_i < d_j  (how much of a heavier j's queue i waits behind)
    w_ij = 2 - (d_j / d_i) ** p      when d_i > d_j  (what the lighter one is spared, i waits instead)

and its step-rate fraction (shared rate / alone rate) is  f_i = 1 / (1 - d_i + R_i).  A lone job
runs at f = 1. Two parameters, fitted on real co-location measurements (`deepres simulate
--experiment interference`, reports/interference.json: H100, time-slicing, duties from NVML's
per-process samples, leave-one-group-out validated):

- `s` (`shared_service`): how much of a job's GPU time a shared GPU takes (1: nothing overlaps and
  switches cost nothing; it also scales the busy share NVML shows while sharing, see below);
- `p` (`precedence`): a light job's short bursts of kernels slip into a heavier job's launch gaps
  instead of waiting a full turn behind it (p = 0 is plain processor sharing). Without it one
  parameter cannot fit both GPU-bound pairs (~0.6 each) and the measured busy share of an
  input-bound job beside a GPU-bound one (it keeps most of its speed: NVML shows it as busy as its
  kernels alone would make it).

Equal duties weigh 1, so groups of alike jobs are the one-parameter model's; precedence moves
waiting from the light job to the heavy one, so the busy shares of a GPU never add up beyond 1. It
also means a light job runs faster beside a GPU-bound job than beside a twin of itself (fitted:
duty 0.5 keeps 0.79 beside 0.5 and 0.87 beside 1.0), as the NVML samples of an input-bound job
beside a GPU-bound one show. Measured on one GPU model with few mixed groups: see the report's limits.

The inverse (`standalone_duties`) turns busy shares observed *while sharing* (NVML's per-process SM
utilisation) into the duties the jobs would have alone: a job slowed to f shows busy s x f x d.

Pure: no I/O, no clock; the live extender's sharing rule and the replay both call these.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

#: Fitted on ../shared/data/colocation/ (h100-2026-11-27.json and its NVML per-process samples;
#: reports/interference.json `fit.shared_service`, `fit.precedence`); the fit's command rewrites the
#: report, and a test holds these equal to it.
SHARED_SERVICE = 0.95
PRECEDENCE = 1.5
#: Duties are rounded to this many decimals for the cache (0.1% of busy time is below NVML's 1%).
_DECIMALS = 3
_ITERATIONS = 500
#: Answers by exact input (the replay asks the same few GPU states again and again); cleared when full.
_MEMO: dict[tuple[tuple[float, ...], float, float], tuple[float, ...]] = {}
_MEMO_SIZE = 200_000
_TOLERANCE = 1e-9


class DutyError(ValueError):
    """A duty outside 0..1 (or not a number)."""


def check_duty(value: float, what: str = "duty") -> float:
    """`value` as a duty in [0, 1]; raises DutyError naming it otherwise."""
    try:
        duty = float(value)
    except (TypeError, ValueError):
        raise DutyError(f"{what} must be a number between 0 and 1, got {value!r}") from None
    if not (0.0 <= duty <= 1.0):  # NaN fails too
        raise DutyError(f"{what} must be between 0 and 1, got {value!r}")
    return duty


def step_rate_fractions(duties: Sequence[float], shared_service: float = SHARED_SERVICE,
                        precedence: float = PRECEDENCE) -> tuple[float, ...]:
    """Each job's predicted step rate on the GPU as a fraction (0..1] of its rate alone, in the
    order of `duties` (the alone duties of every job on the GPU, 0..1). One job: (1.0,)."""
    key = (tuple(duties), shared_service, precedence)
    hit = _MEMO.get(key)
    if hit is not None:
        return hit
    out = _fractions(key[0], shared_service, precedence)
    if len(_MEMO) >= _MEMO_SIZE:
        _MEMO.clear()
    _MEMO[key] = out
    return out


def _fractions(duties: Sequence[float], shared_service: float, precedence: float) -> tuple[float, ...]:
    checked = tuple(round(check_duty(d, f"duties[{i}]"), _DECIMALS) for i, d in enumerate(duties))
    if not shared_service > 0.0 or not math.isfinite(shared_service):
        raise ValueError(f"shared_service must be a positive number, got {shared_service!r}")
    if not precedence >= 0.0 or not math.isfinite(precedence):
        raise ValueError(f"precedence must be a number >= 0, got {precedence!r}")
    if len(checked) <= 1:
        return (1.0,) * len(checked)
    order = sorted(range(len(checked)), key=lambda i: checked[i])
    solved = _solve(tuple(checked[i] for i in order), round(shared_service, 6), round(precedence, 6))
    out = [0.0] * len(checked)
    for rank, i in enumerate(order):
        out[i] = solved[rank]
    return tuple(out)


def slowdowns(duties: Sequence[float], shared_service: float = SHARED_SERVICE,
              precedence: float = PRECEDENCE) -> tuple[float, ...]:
    """Each job's predicted slowdown (alone step rate / shared step rate, >= 1 up to rounding)."""
    return tuple(1.0 / f for f in step_rate_fractions(duties, shared_service, precedence))


def max_slowdown(duties: Sequence[float], shared_service: float = SHARED_SERVICE,
                 precedence: float = PRECEDENCE) -> float:
    """The worst slowdown among the jobs of `duties` (1.0 for one job or none)."""
    return max(slowdowns(duties, shared_service, precedence), default=1.0)


def busy_shares(duties: Sequence[float], shared_service: float = SHARED_SERVICE,
                precedence: float = PRECEDENCE) -> tuple[float, ...]:
    """The busy share each job would show (NVML's per-process SM utilisation, 0..1) while sharing:
    s x f_i x d_i (alone: d_i)."""
    fractions = step_rate_fractions(duties, shared_service, precedence)
    scale = shared_service if len(fractions) > 1 else 1.0
    return tuple(min(scale * f * check_duty(d), 1.0) for f, d in zip(fractions, duties, strict=True))


def standalone_duties(observed: Sequence[float], shared_service: float = SHARED_SERVICE,
                      precedence: float = PRECEDENCE) -> tuple[float, ...]:
    """The alone duties that explain busy shares `observed` (0..1, one per job on the GPU, measured
    together): the inverse of `busy_shares`, each result at least its observation and at most 1.
    A job alone is its own observation."""
    seen = tuple(check_duty(u, f"observed[{i}]") for i, u in enumerate(observed))
    if len(seen) <= 1:
        return seen
    duties = list(seen)
    for _ in range(_ITERATIONS):
        fractions = step_rate_fractions(duties, shared_service, precedence)
        new = [min(max(u / (shared_service * f), u), 1.0) for u, f in zip(seen, fractions, strict=True)]
        if max(abs(a - b) for a, b in zip(new, duties, strict=True)) < 1e-6:
            duties = new
            break
        duties = [0.5 * a + 0.5 * b for a, b in zip(new, duties, strict=True)]
    return tuple(round(d, _DECIMALS) for d in duties)


def _weight(mine: float, theirs: float, p: float) -> float:
    """How much of a neighbour's queue a job of duty `mine` waits behind (see the module docstring):
    (mine / theirs) ** p behind a heavier one, and what the lighter one is spared on top of 1 behind a
    lighter one (the GPU's work is conserved: precedence moves waiting, it does not remove it)."""
    if mine == theirs or theirs <= 0.0 or mine <= 0.0:
        return 1.0
    if mine < theirs:
        return math.pow(mine / theirs, p)
    return 2.0 - math.pow(theirs / mine, p)


@lru_cache(maxsize=65_536)
def _solve(duties: tuple[float, ...], s: float, p: float = 0.0) -> tuple[float, ...]:
    """Schweitzer's approximate MVA for the sorted duties (see the module docstring)."""
    n = len(duties)
    think = [1.0 - d for d in duties]
    demand = [s * d for d in duties]
    weight = [[_weight(duties[i], duties[j], p) for j in range(n)] for i in range(n)]
    resid = list(demand)
    for _ in range(_ITERATIONS):
        share = [r / (z + r) if z + r > 0.0 else 1.0 for r, z in zip(resid, think, strict=True)]
        new = [demand[i] * (1.0 + sum(weight[i][j] * share[j] for j in range(n) if j != i)) for i in range(n)]
        if max(abs(a - b) for a, b in zip(new, resid, strict=True)) < _TOLERANCE:
            resid = new
            break
        resid = [0.5 * a + 0.5 * b for a, b in zip(new, resid, strict=True)]
    return tuple(min(1.0, 1.0 / (z + r)) if z + r > 0.0 else 1.0 for z, r in zip(think, resid, strict=True))
