"""The ledger's cost per reservation and release, two source trees side by side.

Each reserve or release rebuilds the node's view (`Ledger._rebuild`). This times 2,000 reserve +
release pairs on 50 nodes of 8 GPUs (3 reservations each already), the fastest of 7 rounds, for each
tree in turn (each in its own process, importing that tree), alternating `--pairs` times, and prints
microseconds per operation:

    git worktree add /tmp/deepres-old <rev>
    .venv/bin/python scripts/bench-ledger-rebuild.py /tmp/deepres-old . --pairs 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROUND = r"""
import json, time
from extender.ledger import Ledger, Reserved
from extender.policy import PodRequest, PolicyParams, PriorityInputs, Reservation
from extender.telemetry import GpuReport, NodeReport

NOW = 5_000.0
state = Ledger(PolicyParams(usage_warmup_s=60.0, sharing=False))


def reserve(uid, mib, node):
    req = PodRequest(uid, "ns", uid, 1, mib, mib, 10.0)
    template = Reservation(uid, "ns", uid, node, (), mib, mib, mib, PriorityInputs(), NOW, signature="sig")
    out = state.reserve_on(req, template, NOW)
    assert isinstance(out, Reserved), out
    return out.reservation


for n in range(50):
    gpus = tuple(GpuReport(f"n{n}-u{i}", i, "A100", 40_000.0, 0.0) for i in range(8))
    state.apply_report(NodeReport(f"n{n}", 1, NOW, "0.1", "simulated", gpus, (), boot_id="b"), NOW)
    for k in range(3):
        reserve(f"bg-{n}-{k}", 10_000.0, f"n{n}")
best = float("inf")
for r in range(7):
    t = time.perf_counter()
    for i in range(2000):
        state.release(reserve(f"p{r}-{i}", 5_000.0, f"n{i % 50}").pod_uid)
    best = min(best, (time.perf_counter() - t) / 4000 * 1e6)
print(json.dumps(best))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs=2, type=Path, help="two source trees (A, then B)")
    parser.add_argument("--pairs", type=int, default=2)
    args = parser.parse_args()
    results: dict[str, list[float]] = {"A": [], "B": []}
    for _ in range(args.pairs):
        for label, tree in zip("AB", args.trees, strict=True):
            out = subprocess.run([sys.executable, "-c", ROUND], cwd="/", env={"PYTHONPATH": str(tree.resolve())},
                                 check=True, capture_output=True, text=True)
            results[label].append(round(float(json.loads(out.stdout)), 1))
    for label, tree in zip("AB", args.trees, strict=True):
        print(f"{label} {tree}: us per reserve or release, fastest of 7 rounds: {results[label]}")


if __name__ == "__main__":
    main()
