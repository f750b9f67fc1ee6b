"""extender/kube/journal.py: a change costs one line, not the file (#34 rows 8 and 11: ~1 s per bind at
100,000 pods), and a crash anywhere leaves what was answered done."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from extender.kube import journal, statefile
from extender.kube.local import InMemoryCluster


def bound(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ml", "uid": f"u-{name}",
                         "annotations": {"deepres.io/assigned-gpus": "GPU-1"}},
            "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}


def test_a_bind_appends_one_line_whatever_the_number_of_pods(tmp_path: Path) -> None:
    state = tmp_path / "bound.json"
    statefile.write(state, [bound(f"old-{i}") for i in range(5_000)])
    written = state.stat()
    cluster = InMemoryCluster(state_file=str(state))
    sizes = []
    for i in range(3):
        pod = bound(f"new-{i}")
        del pod["spec"]["nodeName"]
        cluster.learn_pod(pod)
        cluster.bind(pod, "n1", {"deepres.io/assigned-gpus": "GPU-2"})
        sizes.append(journal.path_of(state).stat().st_size)
    assert state.stat().st_mtime_ns == written.st_mtime_ns and state.stat().st_ino == written.st_ino  # untouched
    per_bind = [b - a for a, b in zip([0, *sizes], sizes, strict=False)]
    assert max(per_bind) < 2_000 < written.st_size // 100, (per_bind, written.st_size)
    cluster.delete_pod("ml", "old-7")
    restarted = InMemoryCluster(state_file=str(state))
    names = {k[1] for k in restarted.pods}
    assert len(names) == 5_002 and {"new-0", "new-1", "new-2"} <= names and "old-7" not in names


def test_the_journal_is_folded_in_once_it_outgrows_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journal, "COMPACT_MIN_BYTES", 4_000)
    state = tmp_path / "bound.json"
    cluster = InMemoryCluster(state_file=str(state))
    for i in range(20):
        pod = bound(f"p{i}")
        del pod["spec"]["nodeName"]
        cluster.learn_pod(pod)
        cluster.bind(pod, "n1")
        assert journal.path_of(state).stat().st_size <= 4_000 + 1_000
    on_disk = statefile.read(state)
    assert on_disk is not None and len(on_disk) >= 10  # folded in at least once
    names = sorted(p["metadata"]["name"] for p in journal.replay(state, on_disk)[0])
    assert names == sorted(f"p{i}" for i in range(20))


def test_a_torn_last_line_is_ignored_and_a_bad_line_before_others_is_damage(tmp_path: Path) -> None:
    state = tmp_path / "bound.json"
    statefile.write(state, [])
    lines = [journal.record(bound("a"), ("ml", "a")), journal.record(bound("b"), ("ml", "b"))]
    journal.path_of(state).write_bytes(b"".join(lines) + lines[0][:40])  # a crash in the middle of an append
    assert [p["metadata"]["name"] for p in journal.replay(state, [])[0]] == ["a", "b"]
    altered = lines[0].replace(b'"n1"', b'"n2"')
    journal.path_of(state).write_bytes(altered + lines[1])
    with pytest.raises(statefile.StateFileDamaged, match="line 1: checksum mismatch"):
        journal.replay(state, [])


def test_a_crash_between_the_rewrite_and_emptying_the_journal_changes_nothing(tmp_path: Path) -> None:
    state = tmp_path / "bound.json"
    statefile.write(state, [bound("a"), bound("b")])
    changes = [journal.record(None, ("ml", "a")), journal.record(bound("c"), ("ml", "c")),
               journal.record(None, ("ml", "c")), journal.record(bound("a"), ("ml", "a"))]
    journal.path_of(state).write_bytes(b"".join(changes))
    before, _ = journal.replay(state, statefile.read(state) or [])
    statefile.write(state, before)  # the fold's first step; the crash comes before the journal is emptied
    after, _ = journal.replay(state, statefile.read(state) or [])
    assert sorted(map(repr, after)) == sorted(map(repr, before))
    assert sorted(p["metadata"]["name"] for p in after) == ["a", "b"]


def test_a_journal_that_is_a_link_or_without_its_file_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "bound.json"
    statefile.write(state, [])
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    journal.path_of(state).symlink_to(target)
    with pytest.raises(statefile.StateFileDamaged, match="symbolic link"):
        journal.replay(state, [])
    refused = InMemoryCluster(state_file=str(state))
    assert "symbolic link" in refused.state_problem
    other = tmp_path / "other.json"
    journal.path_of(other).write_bytes(journal.record(copy.deepcopy(bound("a")), ("ml", "a")))
    assert "is missing but its journal" in InMemoryCluster(state_file=str(other)).state_problem
