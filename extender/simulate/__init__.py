"""Trace-driven evaluation: replay public GPU cluster traces (Alibaba "openb") through the policies.

Two experiments (see docs/evaluation.md, "Trace-driven evaluation"):
- packing (`packing.py`): FGD's ATC'23 method, to compare our placement with the field's best;
- replay (`replay.py`): a time-driven cluster with arrivals, departures, OOM kills and preemption,
  to compare DeepRes with static whole-GPU allocation and request-based sharing.
"""
