"""PID -> pod UID and container id, read from /proc/<pid>/cgroup.

NVML names the processes on a GPU only by PID; the kubelet names each pod's cgroup after the pod UID
and each container's after its id. The shapes differ by cgroup version, cgroup driver and runtime:

- cgroupfs driver (v1 and v2): `/kubepods/burstable/pod<uid>/<container-id>`, guaranteed pods sit
  directly under `/kubepods/pod<uid>/`;
- systemd driver: `/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid>.slice/
  cri-containerd-<id>.scope` with the UID's dashes written as underscores; docker uses
  `docker-<id>.scope`, CRI-O `crio-<id>.scope` (and `crio-conmon-<id>.scope` for its monitor);
- kind and other nested setups add a prefix (`/kubelet.slice/kubelet-kubepods.slice/...`), and a
  reader inside a private cgroup namespace sees paths relative to its own (`/../../kubepods...`).

`parse_cgroup` is pure (text in, `PodRef` out); `CgroupReader` adds the file access with a proc root
parameter so tests read fixtures and the DaemonSet (hostPID) reads the host's /proc.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# pod<uid> as a cgroupfs directory, or ...-pod<uid>.slice as a systemd slice (uid may use _ for -)
_CGROUPFS_POD = re.compile(r"^pod(?P<uid>[0-9a-fA-F_-]{32,36})$")
_SYSTEMD_POD = re.compile(r"^(?:[\w-]*-)?pod(?P<uid>[0-9a-fA-F_-]{32,36})\.slice$")
# container scopes under a systemd pod slice; conmon is CRI-O's monitor, not a container
_SYSTEMD_CONTAINER = re.compile(
    r"^(?P<runtime>docker|cri-containerd|containerd|crio|cri-o)-(?P<conmon>conmon-)?(?P<id>[0-9a-fA-F]{12,128})\.scope$"
)
_BARE_CONTAINER = re.compile(r"^(?:(?:docker|crio|cri-containerd)-)?(?P<id>[0-9a-fA-F]{12,128})$")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_STATIC_POD_UID = re.compile(r"^[0-9a-f]{32}$")  # static (mirror) pods: a hash of the manifest


@dataclass(frozen=True)
class PodRef:
    """Where a process lives: the pod UID (dashed, lowercase) and its container id (may be empty)."""

    pod_uid: str
    container_id: str = ""


def normalize_uid(raw: str) -> str | None:
    """The pod UID as the API shows it, or None when `raw` is not UID-shaped."""
    uid = raw.replace("_", "-").lower()
    if _UUID.match(uid) or _STATIC_POD_UID.match(uid):
        return uid
    return None


def parse_cgroup(text: str) -> PodRef | None:
    """The pod a process belongs to, from the content of /proc/<pid>/cgroup (v1 or v2)."""
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        ref = parse_cgroup_path(parts[2])
        if ref is not None:
            return ref
    return None


def parse_cgroup_path(path: str) -> PodRef | None:
    """The pod of one cgroup path; None for host processes, plain docker containers and junk."""
    components = [c for c in path.split("/") if c and c not in (".", "..")]
    for i, component in enumerate(components):
        match = _SYSTEMD_POD.match(component) or _CGROUPFS_POD.match(component)
        if match is None:
            continue
        uid = normalize_uid(match.group("uid"))
        if uid is None:
            continue
        following = components[i + 1] if i + 1 < len(components) else ""
        return PodRef(pod_uid=uid, container_id=_container_id(following))
    return None


def _container_id(component: str) -> str:
    scope = _SYSTEMD_CONTAINER.match(component)
    if scope is not None:
        return "" if scope.group("conmon") else scope.group("id").lower()
    bare = _BARE_CONTAINER.match(component)
    return bare.group("id").lower() if bare is not None else ""


class CgroupReader:
    """Reads /proc/<pid>/cgroup under `proc_root`; a vanished or unreadable process yields None."""

    def __init__(self, proc_root: Path | str = "/proc") -> None:
        self.proc_root = str(proc_root)

    def pod_of(self, pid: int) -> PodRef | None:
        if pid <= 0:
            return None
        try:
            with open(f"{self.proc_root}/{pid}/cgroup", encoding="utf-8", errors="replace") as file:
                text = file.read()
        except OSError:  # the process ended, or no hostPID / no permission: not attributable
            return None
        return parse_cgroup(text)


class CachedPodLookup:
    """Remembers each PID's pod while the PID stays on a GPU, so a busy node does not re-read every
    process's cgroup file every round (those reads were most of a round's cost).

    A process never changes pod, so the only risk is PID reuse; an entry is therefore dropped as
    soon as its PID is missing from one round, and re-read anyway after `refresh_rounds` rounds.
    """

    def __init__(self, pod_of: Callable[[int], PodRef | None], refresh_rounds: int = 12) -> None:
        self._pod_of = pod_of
        self.refresh_rounds = refresh_rounds
        self._round = 0
        self._entries: dict[int, tuple[int, PodRef | None]] = {}  # pid -> (round read, pod)
        self._seen: set[int] = set()

    def next_round(self) -> None:
        """Call once per sampling round, before the lookups of that round."""
        self._entries = {pid: entry for pid, entry in self._entries.items() if pid in self._seen}
        self._seen = set()
        self._round += 1

    def __call__(self, pid: int) -> PodRef | None:
        self._seen.add(pid)
        entry = self._entries.get(pid)
        if entry is not None and self._round - entry[0] < self.refresh_rounds:
            return entry[1]
        ref = self._pod_of(pid)
        self._entries[pid] = (self._round, ref)
        return ref
