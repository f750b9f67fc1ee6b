"""PID -> pod attribution from real /proc/<pid>/cgroup shapes of each runtime and driver."""

from __future__ import annotations

from pathlib import Path

import pytest

from extender.agent.cgroups import CgroupReader, PodRef, normalize_uid, parse_cgroup, parse_cgroup_path
from tests.fakes.procfs import FIXTURES, fixture_text, make_proc_root

C1 = "4b8c6a7e2f0d1a3b5c7d9e1f2a4b6c8d0e2f4a6b8c0d2e4f6a8b0c2d4e6f8a0b"
C2 = "9f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0"
C3 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

# fixture file -> what it must resolve to (the UIDs written in the files, dashed)
CASES: dict[str, PodRef | None] = {
    "v1-cgroupfs-docker-burstable.txt": PodRef("0c3f1b2e-7d4a-4e5f-9a8b-1c2d3e4f5a6b", C1),
    "v1-systemd-docker-besteffort-hybrid.txt": PodRef("5e6f7a8b-9c0d-4e1f-8a2b-3c4d5e6f7a8b", C2),
    "v1-systemd-containerd-guaranteed.txt": PodRef("7a8b9c0d-1e2f-4a3b-8c4d-5e6f7a8b9c0d", C3),
    "v1-cgroupfs-crio-besteffort.txt": PodRef("5e6f7a8b-9c0d-4e1f-8a2b-4c5d6e7f8a9b", C1),
    "v2-systemd-containerd-burstable.txt": PodRef("1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d", C1),
    "v2-systemd-crio-besteffort.txt": PodRef("2b3c4d5e-6f7a-4b8c-9d0e-1f2a3b4c5d6e", C2),
    "v2-systemd-crio-conmon.txt": PodRef("3c4d5e6f-7a8b-4c9d-8e0f-2a3b4c5d6e7f", ""),
    "v2-cgroupfs-containerd-guaranteed.txt": PodRef("4d5e6f7a-8b9c-4d0e-9f1a-3b4c5d6e7f8a", C3),
    "v2-kind-nested.txt": PodRef("6f7a8b9c-0d1e-4f2a-9b3c-5d6e7f8a9b0c", C2),
    "v2-cgroupns-relative.txt": PodRef("7a8b9c0d-1e2f-4a3b-8c4d-6e7f8a9b0c1d", C3),
    "v2-systemd-static-pod.txt": PodRef("8d2c6b4f0e1a3c5d7e9f1b3d5a7c9e1f", C1),
    "v2-host-process.txt": None,
    "v1-plain-docker.txt": None,
    "v2-user-session.txt": None,
    # recorded on the real H100 (tests/fixtures/nvml-h100-580.json): a sandbox's cgroup v2, no kubelet;
    # the last component is 32 hex digits like a static pod's UID, but without `pod` it is no pod
    "v2-process-api-sandbox.txt": None,
    "empty.txt": None,
}


def test_every_fixture_has_an_expectation() -> None:
    assert {p.name for p in FIXTURES.glob("*.txt")} == set(CASES)


@pytest.mark.parametrize(("name", "expected"), sorted(CASES.items()), ids=sorted(CASES))
def test_fixture_resolves_to_its_pod(name: str, expected: PodRef | None) -> None:
    text = fixture_text(name)
    assert parse_cgroup(text) == expected
    if expected is not None:  # the UID in the file, as written, normalises to the expected one
        assert expected.pod_uid.replace("-", "") in text.replace("_", "").replace("-", "")


@pytest.mark.parametrize(
    "path",
    [
        "/kubepods/burstable/podnot-a-uid/abc",  # not UID-shaped
        "/kubepods.slice/kubepods.slice",  # QoS slices only
        "/kubepods/besteffort",
        "/system.slice/containerd.service",
        "",
    ],
)
def test_paths_without_a_pod(path: str) -> None:
    assert parse_cgroup_path(path) is None


def test_uid_normalisation() -> None:
    assert normalize_uid("5E6F7A8B_9C0D_4E1F_8A2B_3C4D5E6F7A8B") == "5e6f7a8b-9c0d-4e1f-8a2b-3c4d5e6f7a8b"
    assert normalize_uid("5e6f7a8b-9c0d") is None


def test_garbage_lines_are_skipped() -> None:
    text = "garbage\n\n:\n" + fixture_text("v2-systemd-containerd-burstable.txt")
    ref = parse_cgroup(text)
    assert ref is not None and ref.container_id == C1


def test_reader_uses_the_proc_root(tmp_path: Path) -> None:
    root = make_proc_root(tmp_path, {4242: fixture_text("v2-kind-nested.txt"), 7: fixture_text("v2-host-process.txt")})
    reader = CgroupReader(root)
    assert reader.pod_of(4242) == CASES["v2-kind-nested.txt"]
    assert reader.pod_of(7) is None
    assert reader.pod_of(999_999) is None  # ended (or invisible without hostPID)
    assert reader.pod_of(0) is None


def test_cached_lookup_reads_each_pid_once_while_it_stays() -> None:
    from extender.agent.cgroups import CachedPodLookup

    reads: list[int] = []

    def pod_of(pid: int) -> PodRef | None:
        reads.append(pid)
        return PodRef(f"{pid:08d}-0000-4000-8000-000000000000") if pid != 3 else None

    lookup = CachedPodLookup(pod_of, refresh_rounds=3)
    for _ in range(2):
        lookup.next_round()
        assert lookup(1) == PodRef("00000001-0000-4000-8000-000000000000")
        assert lookup(3) is None
    assert reads == [1, 3]  # the second round came from the cache, host processes included
    lookup.next_round()
    lookup(1)  # pid 3 is gone this round...
    lookup.next_round()
    lookup(1)
    lookup(3)  # ...so when it shows up again it may be a new process: read again
    assert reads == [1, 3, 1, 3]  # and pid 1 was re-read after 3 rounds
