"""The worked examples of docs/rules.md are what the policy functions answer for their inputs.

Why: the examples teach the rules; a changed default or formula must not leave them teaching the old one.
"""

from __future__ import annotations

from pathlib import Path

from extender.policy.interference import slowdowns
from extender.policy.preemption import evictable, outranks, progress_lost_s
from extender.policy.priority import priority_of
from extender.policy.types import PriorityInputs, Reservation
from extender.policy.usage import follow_usage
from extender.settings import PolicySettings

PAGE = " ".join((Path(__file__).resolve().parents[2] / "docs" / "rules.md").read_text().split())
PARAMS = PolicySettings().params()
NOW = 1_000_000.0


def says(text: str) -> None:
    assert text in PAGE, f"docs/rules.md does not say {text!r}"


def test_the_priority_example() -> None:
    a = priority_of(PriorityInputs(1, None, 614.0, 1), NOW, PARAMS)
    b = priority_of(PriorityInputs(1, NOW + 1800.0, 3600.0, 1), NOW, PARAMS)
    c = priority_of(PriorityInputs(0, None, 100_000.0, 8), NOW, PARAMS)
    a_high = priority_of(PriorityInputs(2, None, 614.0, 1), NOW, PARAMS)
    says(f"| 614 s | 1 | {a:.1f} = 10 + 0 + {a - 10:.1f} |")
    says(f"| 3,600 s | 1 | {b:.1f} = 10 + 10 + {b - 20:.1f} |")
    says(f"| 100,000 s | 8 | {c:.1f} = 0 + 0 + {c:.1f} |")
    says(f"Were A `high`, it would score {a_high:.1f} and go before B")
    assert c < a < b < a_high


def test_the_usage_example() -> None:
    # cnn-small's admission bound as the shipped predictor gives it (deploy/examples/cnn-small.yaml)
    from predictor.runtime import Predictor
    from predictor.spec import JobSpec

    demand = Predictor.load().predict(JobSpec("cnn", params_millions=15, batch_size=64, input_dim=224, num_layers=5,
                                              iterations=20000, precision="amp", optimizer="sgd"))
    admission = round(demand.memory_mib_upper)
    says(f"is bound with its admission bound, {admission:,} MiB reserved")
    res = Reservation("u", "ml", "cnn-small", "n1", ("GPU-0",), admission, admission, demand.memory_mib,
                      PriorityInputs(), NOW)
    held = []
    for t in (60, 150, 240, 330, 420):  # a report every 90 s, the same peak each time
        res = follow_usage(res, 7900.0, NOW + t, PARAMS)
        held.append(res.memory_mib)
    assert held[:-1] == [admission] * 4, held  # the peak has not shown yet: the admission holds
    after = held[-1]
    grown = follow_usage(res, 9500.0, NOW + 900, PARAMS).memory_mib
    says(f"moves the reservation to {after:,.0f} MiB (the peak x {PARAMS.usage_margin:.2f})")
    says(f"the {(admission - after) / 1024:.1f} GiB given back")
    says(f"the reservation follows it up to {grown:,.0f} MiB")
    says(f"the warm-up is {PARAMS.usage_warmup_s:.0f} s")
    says(f"flat for {PARAMS.usage_plateau_s:.0f} s over {PARAMS.usage_plateau_samples} reports")


def test_the_sharing_example() -> None:
    resident, pod = slowdowns((0.5, 0.3))
    both = slowdowns((1.0, 1.0))
    says(f"the resident slows by {resident:.3f} and the pod by {pod:.3f}, both within {PARAMS.max_slowdown:g}")
    says(f"3,600 x {pod:.3f} = {3600 * pod:,.0f} s, before the 5,400 s")
    assert 3600 * pod < 1800 + 3600 and max(resident, pod) <= PARAMS.max_slowdown
    says(f"would each slow by {both[0]:.3f}")
    assert both[0] > PARAMS.max_slowdown


def test_the_preemption_example() -> None:
    inputs = PriorityInputs(0, None, 1e4, 1)
    old = Reservation("v", "ml", "old", "n1", ("GPU-0",), 8000, 8000, 8000, inputs, NOW - 2700)
    ck = Reservation("w", "ml", "ck", "n1", ("GPU-0",), 8000, 8000, 8000, inputs, NOW - 2700,
                     checkpoint_interval_s=600.0)
    says(f"would throw away {progress_lost_s(old, NOW):,.0f} s of work, more than `preempt_max_loss_s` "
         f"({PARAMS.preempt_max_loss_s:,.0f} s)")
    says(f"would lose {progress_lost_s(ck, NOW):.0f} s")
    assert not evictable(old, NOW, PARAMS) and evictable(ck, NOW, PARAMS)
    a = priority_of(PriorityInputs(1, None, 614.0, 1), NOW, PARAMS)
    b = priority_of(PriorityInputs(1, NOW + 1800.0, 3600.0, 1), NOW, PARAMS)
    assert outranks(b, priority_of(inputs, NOW, PARAMS), PARAMS) and not outranks(a, a, PARAMS)
