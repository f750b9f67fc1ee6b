"""The local control plane (devtools/localcluster.py) beside other processes on the machine: a port one of
them took between the pick and the bind costs a restart on fresh ports, not a failed suite (issue 49)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from devtools import localcluster
from devtools.localcluster import ClusterError, ControlPlane

TAKEN = ("kube-apiserver exited (256); the end of its log:\nE0101 run.go:72] \"command failed\" "
         "err=\"failed to create listener: listen tcp 127.0.0.1:40123: bind: address already in use\"")


def fake_plane(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failures: list[str]) -> tuple[ControlPlane, list[Any]]:
    """A ControlPlane whose processes 'fail' with `failures` in turn, then start; what each try saw."""
    monkeypatch.setattr(localcluster, "ensure_binaries", lambda log=None: tmp_path / "bin")
    monkeypatch.setattr(localcluster, "_write_certs", lambda pki: pki.mkdir(parents=True, exist_ok=True))
    tries: list[Any] = []

    def start_all(self: ControlPlane, timeout_s: float, log: Any) -> None:
        tries.append((dict(self.ports), self.admin_kubeconfig.read_text()))
        (self.root / "etcd").mkdir(exist_ok=True)  # data of this try's etcd
        if failures:
            raise ClusterError(failures.pop(0))

    monkeypatch.setattr(ControlPlane, "_start_all", start_all)
    return ControlPlane(tmp_path / "plane"), tries


def test_a_taken_port_restarts_everything_on_fresh_ports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plane, tries = fake_plane(tmp_path, monkeypatch, [TAKEN, TAKEN])
    said: list[str] = []
    plane.start(log=said.append)
    assert len(tries) == 3
    first, last = tries[0][0], tries[-1][0]
    assert first.keys() == last.keys() and first != last
    assert f"127.0.0.1:{last['apiserver']}" in tries[-1][1]  # the kubeconfigs name the new API server port
    assert sum("taken by another process" in line for line in said) == 2


def test_other_failures_and_too_many_takes_are_not_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plane, tries = fake_plane(tmp_path, monkeypatch, ["etcd exited (1); the end of its log:\ncorrupt wal"])
    with pytest.raises(ClusterError, match="corrupt wal"):
        plane.start()
    assert len(tries) == 1
    plane, tries = fake_plane(tmp_path, monkeypatch, [TAKEN] * localcluster.PORT_TRIES)
    with pytest.raises(ClusterError, match="address already in use"):
        plane.start()
    assert len(tries) == localcluster.PORT_TRIES


def test_port_taken_reads_each_components_words() -> None:
    assert localcluster.port_taken(TAKEN)
    assert localcluster.port_taken("listen tcp 127.0.0.1:2380: bind: Address already in use")
    assert not localcluster.port_taken("etcd exited (1): permission denied")
