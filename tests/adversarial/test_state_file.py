"""The local-mode state file under attack (issue 26): a damaged file is never silently replaced, and a
bind whose write fails is never reported done. Each test runs a real `deepres serve --no-kube
--state-file` process; the full disk is a real 12 KiB tmpfs (skipped where this process may not mount)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.localserver import LocalServer
from tests.adversarial.ledger_support import gpu, report
from tests.fixtures.kube.payloads import binding_args, extender_args, pod
from tests.fixtures.kube.server import TOKEN, get, post

# the tiny pods declare a tiny GPU share; this namespace's declarations count (policy.default_gpu_share_floor 0)
DOUBLE = {"DEEPRES_PREDICTOR_FACTORY": "tests.fixtures.kube.doubles:make_predictor", "DEEPRES_TELEMETRY_GRACE_S": "1",
          "DEEPRES_DEFAULT_GPU_SHARE_FLOOR": "0"}
GPU_MIB = 81_920.0


def serve(tmp: Path, state: Path, *extra: str) -> LocalServer:
    """A server on `state`, started once /healthz answers (it may stay not ready on purpose)."""
    return LocalServer(tmp, token=TOKEN, env=DOUBLE, probe="/healthz",
                       args=["--state-file", str(state), *extra]).start()


def bind(url: str, name: str, node: str = "n1") -> str:
    """Filter then bind a 1 GiB pod on `node`; the bind's Error ("" when bound). The pods declare a tiny GPU
    share: they are many on one GPU, which the sharing rule allows only to jobs that leave it mostly idle."""
    body = pod(name, {"deepres.io/gpu-memory": "1Gi", "deepres.io/gpu-share": "0.01"})
    post(url + "/filter", extender_args(body, names=[node]))
    status, answer = post(url + "/bind", binding_args(body, node))
    assert status == 200, answer
    error: str = answer["Error"]
    return error


def report_node(url: str, node: str = "n1", sequence: int = 1) -> None:
    assert post(url + "/v1/telemetry", report(node, sequence, [gpu(f"{node}-gpu0", GPU_MIB)]),
                token=TOKEN)[0] == 200


def readyz(url: str) -> tuple[int, dict[str, Any]]:
    status, text = get(url + "/readyz")
    return status, json.loads(text)


def bound_in(state: Path) -> list[str]:
    """The pods a restart would read: the file and its journal (extender/kube/journal.py)."""
    from extender.kube import journal, statefile

    pods, _ = journal.replay(state, statefile.read(state) or [])
    return sorted(p["metadata"]["name"] for p in pods)


@pytest.fixture
def bound_file(tmp_path: Path) -> Iterator[Path]:
    """A state file written by a real server after 4 binds."""
    state = tmp_path / "bound.json"
    server = serve(tmp_path, state)
    try:
        report_node(server.url)
        assert [bind(server.url, f"p{i}") for i in range(4)] == [""] * 4
    finally:
        server.stop()
    assert bound_in(state) == ["p0", "p1", "p2", "p3"]
    from extender.kube import journal

    journal.fold(state)  # the binds are in the journal: the attacks below are on the file itself
    assert [p["metadata"]["name"] for p in json.loads(state.read_text())["pods"]] == ["p0", "p1", "p2", "p3"]
    yield state


def assert_refuses(tmp: Path, state: Path, why: str) -> None:
    """The restarted server is alive, not ready with `why` and the recovery command, binds nothing, and
    leaves the damaged file exactly as it was."""
    before = state.read_bytes() if state.is_file() else None
    server = serve(tmp, state)
    try:
        status, body = readyz(server.url)
        assert status == 503, body
        reason = " ".join(body["waiting_for"])
        assert why in reason and "--state-file-reset" in reason, reason
        report_node(server.url)
        error = bind(server.url, "new-pod")
        assert "damaged" in error, error
        assert get(server.url + "/healthz")[0] == 200  # alive: the worker did not crash
        assert server.proc is not None and server.proc.poll() is None
    finally:
        server.stop()
    if before is not None:
        assert state.read_bytes() == before  # never overwritten
        kept = list(tmp.glob("bound.json.damaged-*"))
        assert len(kept) == 1 and kept[0].read_bytes() == before
    assert "Traceback" not in server.log_tail(20_000)


def test_a_truncated_state_file_keeps_the_extender_not_ready(tmp_path: Path, bound_file: Path) -> None:
    data = bound_file.read_bytes()
    bound_file.write_bytes(data[: len(data) // 2])  # truncate -s 50%
    assert_refuses(tmp_path, bound_file, "not valid JSON")


def test_a_malformed_state_file_keeps_the_extender_not_ready(tmp_path: Path, bound_file: Path) -> None:
    pods = json.loads(bound_file.read_text())["pods"]
    pods[1]["metadata"] = "p1"  # metadata a string: the worker crashed over and over
    bound_file.write_text(json.dumps({"pods": pods}))  # the format before the checksum (version 1)
    assert_refuses(tmp_path, bound_file, "pods[1]: metadata must be an object")


def test_a_malformed_pod_under_a_valid_checksum_is_refused(tmp_path: Path, bound_file: Path) -> None:
    saved = json.loads(bound_file.read_text())
    saved["pods"][2]["spec"]["nodeName"] = ["n1"]
    saved["sha256"] = hashlib.sha256(json.dumps(saved["pods"], sort_keys=True, separators=(",", ":"))
                                     .encode()).hexdigest()  # a hand edit that fixed the checksum up
    bound_file.write_text(json.dumps(saved))
    assert_refuses(tmp_path, bound_file, "pods[2]: spec.nodeName must be a non-empty string")


def test_an_altered_state_file_fails_its_checksum(tmp_path: Path, bound_file: Path) -> None:
    saved = json.loads(bound_file.read_text())
    del saved["pods"][0]  # still well-formed: only the checksum tells a pod is missing
    bound_file.write_text(json.dumps(saved))
    assert_refuses(tmp_path, bound_file, "checksum mismatch")


def test_a_directory_as_state_file_keeps_the_extender_not_ready(tmp_path: Path) -> None:
    state = tmp_path / "bound.json"
    state.mkdir()
    assert_refuses(tmp_path, state, "is a directory")
    assert state.is_dir()


def test_state_file_reset_moves_the_damaged_file_aside_and_starts_empty(tmp_path: Path, bound_file: Path) -> None:
    data = bound_file.read_bytes()[:100]
    bound_file.write_bytes(data)
    server = serve(tmp_path, bound_file, "--state-file-reset")
    try:
        assert readyz(server.url)[0] == 200
        report_node(server.url)
        assert bind(server.url, "fresh") == ""
    finally:
        server.stop()
    assert bound_in(bound_file) == ["fresh"]
    moved = [p for p in tmp_path.glob("bound.json.damaged-*")]
    assert [p.read_bytes() for p in moved] == [data]


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 12 KiB tmpfs (a full disk after a few binds); skipped where mounting is not allowed."""
    mount = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12k", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_no_bind_is_reported_done_unless_persisted_on_a_full_disk(tmp_path: Path, tiny_disk: Path) -> None:
    state = tiny_disk / "bound.json"
    server = serve(tmp_path, state)
    try:
        report_node(server.url)
        errors = {f"p{i}": bind(server.url, f"p{i}") for i in range(40)}
        done = sorted(name for name, error in errors.items() if error == "")
        failed = [error for error in errors.values() if error]
        assert done and failed, errors  # the disk filled up part way
        assert all("No space left on device" in e for e in failed), failed[:3]
        status, body = readyz(server.url)
        assert status == 503 and any("not written" in w for w in body["waiting_for"]), body
        metrics = get(server.url + "/metrics")[1]
        counted = [line for line in metrics.splitlines()
                   if line.startswith("deepres_extender_state_write_failures_total ")]
        assert counted and float(counted[0].split()[1]) >= len(failed), counted
        # a failed bind left no reservation behind: only the persisted pods' 1 GiB each is reserved
        reserved = [line for line in metrics.splitlines()
                    if line.startswith('deepres_extender_reserved_memory_mib{node="n1"}')]
        assert reserved and float(reserved[0].split()[1]) == 1024.0 * len(done), (reserved, len(done))
    finally:
        server.stop()
    assert not [p for p in os.listdir(tiny_disk) if p.endswith(".tmp")]  # no temporary file left behind
    restarted = serve(tmp_path, state)
    try:
        assert readyz(restarted.url)[0] in (200, 503)
    finally:
        restarted.stop()
    assert bound_in(state) == done  # exactly the binds answered done, nothing else


# ---- #34 row 8: links, stale temporaries, the version's type ----

def test_a_symlinked_state_file_is_refused_and_its_target_untouched(tmp_path: Path, bound_file: Path) -> None:
    target = tmp_path / "real" / "bound.json"
    target.parent.mkdir()
    os.replace(bound_file, target)
    bound_file.symlink_to(target)  # the admin's (or an attacker's) link: a write would replace it
    before = target.read_bytes()
    assert_refuses(tmp_path, bound_file, "is a symbolic link")
    assert bound_file.is_symlink() and target.read_bytes() == before


def test_a_link_planted_at_the_keep_aside_temporary_is_never_followed(tmp_path: Path) -> None:
    from extender.kube import statefile

    state = tmp_path / "bound.json"
    state.write_bytes(b'{"pods": [')  # damaged: it will be copied aside
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    digest = hashlib.sha256(state.read_bytes()).hexdigest()[:16]
    (tmp_path / f".bound.json.damaged-{digest}.tmp").symlink_to(victim)
    kept = statefile.keep_aside(state)
    assert kept is not None and kept.read_bytes() == state.read_bytes()
    assert victim.read_bytes() == b"precious"


def test_temporaries_a_killed_write_left_are_removed_at_start(tmp_path: Path) -> None:
    from extender.kube import statefile
    from extender.kube.local import InMemoryCluster

    state = tmp_path / "bound.json"
    statefile.write(state, [])
    left = [tmp_path / ".bound.json.k1l9ed.tmp", tmp_path / ".bound.json.damaged-0123456789abcdef.tmp"]
    for tmp in left:
        tmp.write_bytes(b"x" * 100_000)  # a full-size copy a kill -9 mid-bind leaves
    other = tmp_path / ".other.json.k1l9ed.tmp"  # another file's: not ours to remove
    other.write_bytes(b"y")
    InMemoryCluster(state_file=str(state))
    assert [p for p in left if p.exists()] == [] and other.exists()


@pytest.mark.parametrize("version", ["true", '"2"', "2.0", "null"])
def test_only_an_integer_version_is_read(tmp_path: Path, version: str) -> None:
    from extender.kube import statefile

    state = tmp_path / "bound.json"
    statefile.write(state, [])
    saved = state.read_text().replace('"version": 2', f'"version": {version}')
    with pytest.raises(statefile.StateFileDamaged, match="'version' must be an integer"):
        statefile.decode(state, saved.encode())
