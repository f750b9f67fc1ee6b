"""py-spy on a process tree, for `deepres bench cluster --profile`: where the extender's CPU goes
(docs/benchmarks.md, "CPU per pod: where it goes"). py-spy comes from PyPI (`pip install py-spy`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path


def record(pid: int, out: str) -> subprocess.Popen[bytes]:
    """py-spy sampling `pid` and its children (granian's worker) into collapsed stacks at `out`: only
    the thread holding the GIL (--gil: where the Python code spends CPU; granian's Rust threads are
    not seen), read without stopping the process (--nonblocking). py-spy's own CPU is counted in no
    process of the report, but on a busy machine it takes CPU from the others: a profiled run's
    figures are not the benchmark's."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    proc = subprocess.Popen([exe, "record", "--pid", str(pid), "--subprocesses", "--nonblocking", "--gil",
                             "--rate", "200", "--format", "raw", "--output", out],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(2.0)  # attached before the first pod
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(2)  # SIGINT: py-spy writes its file and exits
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


#: The rows of docs/benchmarks.md's profile table: a stack goes to the first row naming one of its frames.
ROWS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("pod watch: handlers (parse, restore)", ("on_pod_changed",)),
    ("pod watch: reading and JSON decoding", ("_watch_pods",)),
    ("node watch", ("_watch_nodes",)),
    ("bind: the Binding POST (JSON, TLS, HTTP)", ("_post (extender/kube/cluster.py",)),
    ("bind: the rest (confirm from the watch, plan, reserve)", ("bind (extender/server/binding.py",)),
    ("filter (decode, shortlist, answer)", ("Placer.filter (", "floor_filter (")),  # the second: bench cluster --floor
    ("prioritize", ("prioritize (",)),
    ("token reviews", ("review_token", "auth.py")),
    ("telemetry reports (decode, ledger)", ("telemetry (",)),
    ("metrics, logging", ("prometheus", "logging/")),
    ("HTTP transport: granian's RSGI bridge, the scheduler's listener, their asyncio loops and TLS",
     ("granian", "asyncio", "rsgi", "wsgi_verbs", "scheduler_listener")),
)
OTHER = "other (threads, interpreter)"


def shares(lines: list[str]) -> dict[str, float]:
    """Each row's share of the samples of py-spy's raw (collapsed) stacks, leaving out the release of
    deleted pods (the bench deletes a phase's pods after its CPU window, still under py-spy)."""
    counts = dict.fromkeys([name for name, _ in ROWS] + [OTHER], 0)
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not count.isdigit() or ("Ledger.release" in stack and "on_pod_changed" in stack):
            continue
        row = next((name for name, frames in ROWS if any(f in stack for f in frames)), OTHER)
        counts[row] += int(count)
    total = sum(counts.values()) or 1
    return {name: n / total for name, n in counts.items()}


if __name__ == "__main__":  # python -m devtools.pyspy STACKS.txt EXTENDER_CPU_MS_PER_POD
    ms = float(sys.argv[2])
    for name, share in shares(Path(sys.argv[1]).read_text().splitlines()).items():
        print(f"| {name} | {100 * share:.0f}% / {ms * share:.2f} |")
