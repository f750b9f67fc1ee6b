"""devtools.replay_probe: the diagnoses docs/capacity.md cites as one-off runs take only real policy
parameters and name only real policies (a misspelt knob must not run the default silently)."""

from __future__ import annotations

import pytest

from devtools import replay_probe
from extender.simulate import compute


def test_set_changes_a_real_parameter_and_refuses_an_unknown_one() -> None:
    params = replay_probe._params(compute.COMPUTE_PARAMS, ["max_slowdown_high=1.25", "drain=true"])
    assert params.max_slowdown_high == 1.25 and params.drain is True
    assert params.max_slowdown == compute.COMPUTE_PARAMS.max_slowdown  # the rest as it was
    with pytest.raises(SystemExit, match="no parameter 'max_slowdwn'"):
        replay_probe._params(compute.COMPUTE_PARAMS, ["max_slowdwn=2"])


def test_the_probes_name_only_policies_they_can_run() -> None:
    probes = replay_probe.parsers()
    args = probes[""].parse_args(["slice", "--policies", "deepres", "deepres-point", "deepres-sized"])
    assert args.policies == ["deepres", "deepres-point", "deepres-sized"] and args.seed == 44
    with pytest.raises(SystemExit):
        probes[""].parse_args(["capacity", "--policies", "deepres-point"])  # a diagnosis of the slice only
