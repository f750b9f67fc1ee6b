"""extender/kube/statefile.py: what it reads back, what it refuses, and what it never overwrites."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from extender.kube import statefile

POD: dict[str, Any] = {"metadata": {"name": "a", "namespace": "ml", "uid": "u1",
                                    "annotations": {"deepres.io/assigned-gpus": "GPU-1"}},
                       "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}


def test_a_written_file_reads_back_the_same_pods(tmp_path: Path) -> None:
    path = tmp_path / "bound.json"
    assert statefile.read(path) is None  # no file: a first start
    statefile.write(path, [POD])
    assert statefile.read(path) == [POD]
    on_disk = json.loads(path.read_text())
    assert on_disk["version"] == 2 and len(on_disk["sha256"]) == 64
    assert [p.name for p in tmp_path.iterdir()] == ["bound.json"]  # no temporary file left


def test_a_version_1_file_is_still_read(tmp_path: Path) -> None:
    path = tmp_path / "bound.json"
    path.write_text(json.dumps({"pods": [POD]}))
    assert statefile.read(path) == [POD]


@pytest.mark.parametrize(("content", "reason"), [
    (b"", "not valid JSON"),
    (b"[]", "must be a JSON object"),
    (b'{"pods": {}}', "'pods' must be a list"),
    (b'{"version": 9, "pods": []}', "format version 9"),
    (json.dumps({"pods": [POD, POD]}).encode(), "listed twice"),
    (json.dumps({"pods": [{**POD, "spec": {}}]}).encode(), "spec.nodeName"),
    (json.dumps({"pods": [{**POD, "metadata": {"name": ""}}]}).encode(), "metadata.name"),
    (json.dumps({"pods": [{**POD, "metadata": {"name": "a", "annotations": {"k": 1}}}]}).encode(), "annotations"),
])
def test_damaged_files_are_refused_with_the_reason(tmp_path: Path, content: bytes, reason: str) -> None:
    path = tmp_path / "bound.json"
    path.write_bytes(content)
    with pytest.raises(statefile.StateFileDamaged) as caught:
        statefile.read(path)
    assert reason in caught.value.reason


def test_a_damaged_file_is_copied_aside_once_and_left_in_place(tmp_path: Path) -> None:
    path = tmp_path / "bound.json"
    path.write_bytes(b'{"pods": [')
    first = statefile.keep_aside(path)
    assert first is not None and statefile.keep_aside(path) == first  # a crash loop makes one copy
    assert first.read_bytes() == path.read_bytes() == b'{"pods": ['
    moved = statefile.move_aside(path)
    assert not path.exists() and moved.read_bytes() == b'{"pods": [' and moved != first


def test_a_failed_write_leaves_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "bound.json"
    statefile.write(path, [POD])
    with pytest.raises(TypeError):  # not JSON-serialisable: fails before anything is replaced
        statefile.write(path, [{**POD, "spec": {"nodeName": object()}}])
    assert statefile.read(path) == [POD]
    with pytest.raises(OSError):
        statefile.write(tmp_path / "missing-dir" / "bound.json", [POD])


def test_unreadable_paths_are_damaged_not_missing(tmp_path: Path) -> None:
    import socket

    dangling = tmp_path / "bound.json"
    dangling.symlink_to(tmp_path / "gone.json")
    with pytest.raises(statefile.StateFileDamaged, match="symbolic link to nothing"):
        statefile.read(dangling)
    unix = tmp_path / "sock.json"  # not a regular file: reading it fails even as root (ENXIO)
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(unix))
        with pytest.raises(statefile.StateFileDamaged, match="cannot be read"):
            statefile.read(unix)
    directory = tmp_path / "dir.json"
    directory.mkdir()
    with pytest.raises(statefile.StateFileDamaged, match="is a directory"):
        statefile.read(directory)


def test_a_pod_the_restart_would_skip_is_damage(tmp_path: Path) -> None:
    path = tmp_path / "bound.json"
    path.write_text(json.dumps({"pods": [{**POD, "spec": {"nodeName": "n1", "priority": "high"}}]}))
    with pytest.raises(statefile.StateFileDamaged, match=r"pods\[0\]"):
        statefile.read(path)
