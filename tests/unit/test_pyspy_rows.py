"""devtools.pyspy.shares: the profile table's rows from py-spy's collapsed stacks."""

from __future__ import annotations

import pytest

from devtools.pyspy import OTHER, shares


def test_each_stack_counts_once_in_its_first_row_and_deletions_are_left_out() -> None:
    lines = [
        "Thread.run (threading.py:982);KubeCluster._watch_pods (extender/kube/cluster.py:250) 6",
        # a bind's POST is the POST's row, not the bind's, nor the transport's that called it
        "RsgiBridge._call (extender/server/rsgi.py:198);Binder.bind (extender/server/binding.py:103);"
        "KubeCluster._post (extender/kube/cluster.py:403) 2",
        "KubeCluster._watch_pods (extender/kube/cluster.py:251);Intake.on_pod_changed (extender/server/intake.py:111);"
        "Ledger.release (extender/ledger.py:386) 40",
        "process 1:\"python\" 2",
        "not a stack line",
    ]
    got = shares(lines)
    assert got["pod watch: reading and JSON decoding"] == pytest.approx(0.6)
    assert got["bind: the Binding POST (JSON, TLS, HTTP)"] == pytest.approx(0.2)
    assert got[OTHER] == pytest.approx(0.2)
    assert got["bind: the rest (confirm from the watch, plan, reserve)"] == 0
    assert sum(got.values()) == pytest.approx(1.0)
