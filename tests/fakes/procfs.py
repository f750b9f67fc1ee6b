"""Builds a /proc-shaped directory (only <pid>/cgroup files) for the agent's CgroupReader."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "cgroup"


def fixture_text(name: str) -> str:
    """The content of tests/fixtures/cgroup/<name>."""
    return (FIXTURES / name).read_text(encoding="utf-8")


def make_proc_root(root: Path, cgroups: Mapping[int, str]) -> Path:
    """`root/<pid>/cgroup` for each pid -> content; returns `root` to pass as the proc root."""
    for pid, text in cgroups.items():
        (root / str(pid)).mkdir(parents=True, exist_ok=True)
        (root / str(pid) / "cgroup").write_text(text, encoding="utf-8")
    return root


def pod_cgroup(pod_uid: str, container_id: str, qos: str = "burstable") -> str:
    """A cgroup v2 / systemd / containerd line for a pod's container (dashes become underscores)."""
    slug = pod_uid.replace("-", "_")
    return (
        f"0::/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{slug}.slice/"
        f"cri-containerd-{container_id}.scope\n"
    )
