"""64 simultaneous binds over real HTTP racing for one GPU's memory place exactly as many as fit."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tests.fixtures.kube.payloads import binding_args, extender_args, pod, report
from tests.fixtures.kube.server import TOKEN, get, post, running_server

PODS = 64
POD_MIB = 1024  # gpu-memory: 1Gi each
GPU_MIB = 10 * 1024 + 700  # room for exactly 10 of them


def test_racing_binds_never_overcommit(tmp_path: Path) -> None:
    # memory decides here: the racers declare a tiny GPU share, which this namespace is trusted with
    # the binds race here: no filter reserves its pod's GPU before them (kube.assume_on_prioritize off; a filter
    # answering one node reserves it, so these 64 filters would fill the GPU before any bind)
    env = {"DEEPRES_THREADS": "16", "DEEPRES_DEFAULT_GPU_SHARE_FLOOR": "0", "DEEPRES_ASSUME_ON_PRIORITIZE": "false"}
    with running_server(tmp_path, env=env) as url:
        body = report("racy", 1, time.time(), [(float(GPU_MIB), 0.0)])
        assert post(url + "/v1/telemetry", body, token=TOKEN)[0] == 200
        # tiny declared GPU shares: the sharing rule (compute) lets all of them share; memory decides here
        pods = [pod(f"racer-{i}", {"deepres.io/gpu-memory": "1Gi", "deepres.io/gpu-share": "0.01"})
                for i in range(PODS)]
        for p in pods:  # kube-scheduler filters every pod before binding it
            assert post(url + "/filter", extender_args(p, names=["racy"]))[1]["NodeNames"] == ["racy"]
        barrier = threading.Barrier(PODS)
        errors: list[str] = []
        lock = threading.Lock()

        def bind(i: int) -> None:
            barrier.wait()
            status, out = post(url + "/bind", binding_args(pods[i], "racy"), timeout=30)
            with lock:
                errors.append(out["Error"] if status == 200 else f"HTTP {status}")

        threads = [threading.Thread(target=bind, args=(i,)) for i in range(PODS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        placed = [e for e in errors if e == ""]
        refused = [e for e in errors if e]
        assert len(placed) == GPU_MIB // POD_MIB
        assert all(": gpu-0: needs 1.0 GiB, " in e for e in refused), refused[:3]
        metrics = get(url + "/metrics")[1]
        assert f"deepres_extender_overcommit_refused_total {float(PODS - len(placed))}" in metrics
        after = post(url + "/filter", extender_args(pod("late", {"deepres.io/gpu-memory": "1Gi"}), names=["racy"]))[1]
        assert after["NodeNames"] == [] and after["FailedNodes"]["racy"] == "gpu-0: needs 1.0 GiB, 0.7 GiB free"
