"""The online calibration through the live path: pods filtered and bound over HTTP, their peaks reported
through /v1/telemetry as the agent does, the learned demand read back from /v1/predict with `gpu`,
/metrics and the filter's answers; a poisoning node; a restart on the same state file."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from werkzeug.serving import make_server

from devtools.bench_calibration import Fleet, predict
from extender.kube.local import InMemoryCluster
from extender.server.app import create_app, extender_of
from extender.settings import Settings
from tests.fixtures.kube.doubles import FormulaPredictor
from tests.fixtures.kube.server import post

TOKEN = "calibration-token"
GPU = "Test GPU 80GB"  # no per-GPU line: the offline demand is the Demand's own


def truth(point_mib: float) -> float:
    """What the test GPU really shows for a pod the offline predictor puts at `point_mib`."""
    return 600.0 + 1.3 * point_mib


@contextmanager
def serving(state_file: Path | None, cluster: InMemoryCluster | None = None) -> Iterator[str]:
    """The extender in-process on a loopback port; `state_file` None: nothing kept in a file (as with
    an API server), `cluster` the cluster that outlives it."""
    settings = Settings()
    settings.kube.no_kube = True
    settings.kube.state_file = str(state_file or "")
    settings.telemetry.telemetry_token = TOKEN
    settings.server.predict_rate_per_s = 0.0
    settings.policy.calibration_settle_s = 0.0  # one report per pod counts at once (test_calibration_safety)
    cluster = cluster or InMemoryCluster(state_file=str(state_file or ""))
    app = create_app(settings, predictor=FormulaPredictor(), cluster=cluster)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join()
        store = extender_of(app).ledger.calibration
        store.flush()  # as the server's exit does (a clean shutdown)
        store.stop()


def job(i: int) -> dict[str, str]:
    return {"deepres.io/model-type": "cnn", "deepres.io/params-millions": str(20 + 37 * (i % 11)),
            "deepres.io/batch-size": str(16 * (1 + i % 4)), "deepres.io/input-dim": "224"}


def offline_point(url: str, annotations: dict[str, str]) -> float:
    return float(predict(url, annotations, GPU)["offline_mib"])


def learn_honest(url: str, fleet: Fleet, pods: int, start: int = 0, reading: Callable[[float], float] = truth,
                 nodes: list[str] | None = None) -> None:
    names = nodes or fleet.names
    for i in range(start, start + pods):
        node = names[i % len(names)]
        annotations = job(i)
        uid = fleet.place(f"pod-{node}-{i}", annotations, node)
        assert uid, f"pod {i} was not bound on {node}"
        fleet.observe(node, uid, reading(offline_point(url, annotations)))


def metric(url: str, name: str, **labels: str) -> float | None:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_for(check: Callable[[], Any], timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def test_calibration_learns_answers_admits_and_survives_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    probe = job(3)
    with serving(state) as url:
        fleet = Fleet(url, TOKEN, GPU, nodes=4, gpus=8, capacity_mib=81920.0)
        fleet.report_all()
        before = predict(url, probe, GPU)
        assert before["calibrated"] is False and before["pods"] == 0
        assert before["memory_mib_upper"] == before["offline_upper_mib"]  # nothing learned: the offline bound
        learn_honest(url, fleet, 16)
        after = wait_for(lambda: (a := predict(url, probe, GPU))["calibrated"] and a)
        assert after and after["pods"] == 16 and after["software"] == "580.159.04/13.0"
        expected = truth(after["offline_mib"])
        # 16 pods shrink the truth's slope 1.3 toward 1 (calibration.SLOPE_PRIOR_PODS): the line is
        # exact at no pod, and the intercept fits the pods' relative errors (the probe is a mid-size pod)
        assert after["memory_mib"] == pytest.approx(expected, rel=0.03)
        assert after["memory_mib_upper"] >= after["memory_mib"]
        # the offline bound failed on every observed pod: the calibrated one covers the truth
        assert after["memory_mib_upper"] >= expected * 0.999 and after["admission_mib"] == after["memory_mib_upper"]
        assert predict(url, probe, "Another GPU")["calibrated"] is False  # learned per GPU model
        for bad in ({"gpu": 7}, {"gpu": ""}, {"gpu": GPU, "software": ["x"]}):
            status, answer = post(url + "/v1/predict", {"annotations": probe, **bad})
            assert status == 400 and next(iter(bad.keys() - {"gpu"}), "gpu") in answer["error"], answer
        assert metric(url, "deepres_calibration_pods_seen", gpu_model=GPU, path="family") == 16.0
        assert metric(url, "deepres_calibration_shift", gpu_model=GPU, path="family") > 1.2
        assert metric(url, "deepres_calibration_under_rate", gpu_model=GPU, path="family") == 0.0

        # admission per GPU model: one node of each model with the same free memory, between the
        # offline bound and the calibrated one: only the uncalibrated model's node admits the pod
        free = (before["offline_upper_mib"] + after["memory_mib_upper"]) / 2
        for model, name in ((GPU, "same-model"), ("Another GPU", "other-model")):
            small = Fleet(url, TOKEN, model, nodes=1, gpus=1, capacity_mib=free, prefix=name)
            small.report_all()
        pod = {"metadata": {"name": "admit", "namespace": "default", "uid": "uid-admit", "annotations": probe},
               "spec": {"schedulerName": "deepres-scheduler", "containers": [{"name": "c", "image": "x"}]}}
        status, answer = post(url + "/filter", {"Pod": pod, "Nodes": None,
                                                "NodeNames": ["same-model-0", "other-model-0"]})
        assert status == 200 and answer["NodeNames"] == ["other-model-0"], answer
        status, answer = post(url + "/filter", {"Pod": pod, "Nodes": None, "NodeNames": ["same-model-0"]})
        reasons = {**answer["FailedNodes"], **answer["FailedAndUnresolvableNodes"]}
        assert answer["NodeNames"] == [] and f"{after['memory_mib_upper'] / 1024:.1f} GiB" in reasons["same-model-0"]
        status, answer = post(url + "/bind", {"PodName": "admit", "PodNamespace": "default", "PodUID": "uid-admit",
                                              "Node": "same-model-0"})
        assert answer["Error"], "bind must refuse the node the calibrated demand does not fit"

    with serving(state) as url:  # restarted on the same state file: what was learned is kept
        Fleet(url, TOKEN, GPU, nodes=4, gpus=8, capacity_mib=81920.0).report_all()
        again = wait_for(lambda: (a := predict(url, probe, GPU))["calibrated"] and a)  # learned once they report
        assert again and again["calibrated"] is True and again["pods"] == 16
        assert again["memory_mib"] == after["memory_mib"]
        assert again["memory_mib_upper"] == after["memory_mib_upper"]


@pytest.mark.parametrize("factor", [10.0, 0.1, 0.0])
def test_one_node_cannot_steer_the_calibration(tmp_path: Path, factor: float) -> None:
    """A node reporting absurd peaks for its pods (10x, a tenth, 0) moves neither point nor bound."""
    probe = job(5)
    with serving(tmp_path / "state.json") as url:
        fleet = Fleet(url, TOKEN, GPU, nodes=5, gpus=8, capacity_mib=200_000.0)  # room for 10x peaks
        fleet.report_all()
        honest, poisoner = fleet.names[:4], fleet.names[4]
        learn_honest(url, fleet, 16, nodes=honest)
        clean = wait_for(lambda: (a := predict(url, probe, GPU))["calibrated"] and a)
        assert clean
        learn_honest(url, fleet, 6, start=100, nodes=[poisoner], reading=lambda p: truth(p) * factor)
        seen = 16.0 + (6 if factor > 0 else 0)  # a peak of 0 is no reading at all
        assert wait_for(lambda: metric(url, "deepres_calibration_pods_seen", gpu_model=GPU) == seen)
        poisoned = predict(url, probe, GPU)
        assert poisoned["calibrated"] is True
        assert poisoned["memory_mib"] == pytest.approx(clean["memory_mib"], rel=0.01)
        assert poisoned["memory_mib_upper"] == pytest.approx(clean["memory_mib_upper"], rel=0.01)


def test_without_a_file_a_restart_relearns_from_the_pods_still_running() -> None:
    """As with an API server (no calibration file): the restarted extender restores the bound pods
    from their annotations and learns again from the peaks the agents report for them."""
    cluster = InMemoryCluster()  # outlives both extenders, as the API server does
    probe = job(3)
    with serving(None, cluster) as url:
        fleet = Fleet(url, TOKEN, GPU, nodes=4, gpus=8, capacity_mib=81920.0)
        fleet.report_all()
        learn_honest(url, fleet, 16)
        learned = wait_for(lambda: (a := predict(url, probe, GPU))["calibrated"] and a)
        assert learned
    with serving(None, cluster) as url:
        assert predict(url, probe, GPU)["calibrated"] is False  # nothing kept in memory
        fleet.url = url
        fleet.boot = "restarted-agents"

        def relearned() -> Any:
            fleet.report_all()  # the agents keep reporting the running pods' peaks
            answer = predict(url, probe, GPU)
            return answer["calibrated"] and answer["pods"] == 16 and answer  # (the learner's rounds: all 16)
        again = wait_for(relearned)
        assert again and again["pods"] == 16
        assert again["memory_mib"] == pytest.approx(learned["memory_mib"], rel=0.001)


def test_a_node_mixing_gpu_models_admits_a_pod_at_its_largest_demand_among_them() -> None:
    """A node with GPUs of two models, its first GPU of the one the pod needs less on: the pod is
    admitted at its (calibrated, larger) demand on the other model too. Read by its first GPU alone,
    the node took the pod on a GPU of the other model below what it shows there."""
    probe = job(3)
    with serving(None) as url:
        fleet = Fleet(url, TOKEN, GPU, nodes=4, gpus=8, capacity_mib=81920.0)
        fleet.report_all()
        learn_honest(url, fleet, 16)  # GPU learned at 600 MiB + 1.3 x the offline point
        high = wait_for(lambda: (a := predict(url, probe, GPU))["calibrated"] and a)
        low = predict(url, probe, "Another GPU")  # not calibrated: the offline bound
        assert high and high["memory_mib"] > low["admission_mib"], (high, low)
        capacity = (low["admission_mib"] + high["memory_mib"]) / 2  # fits the other model's demand only
        body = {"node": "mixed", "sequence": 1, "timestamp_s": time.time(), "agent_version": "test",
                "source": "simulated", "interval_s": 5.0, "boot_id": "mixed-boot", "driver_version": fleet.driver,
                "cuda_version": fleet.cuda, "pods": [],
                "gpus": [{"uuid": f"mixed-gpu{i}", "index": i, "model": model, "memory_total_mib": capacity,
                          "memory_used_mib": 0.0} for i, model in enumerate(("Another GPU", GPU))]}
        status, answer = post(url + "/v1/telemetry", body, token=TOKEN)
        assert status == 200, answer
        pod = {"metadata": {"name": "mix", "namespace": "default", "uid": "uid-mix", "annotations": probe},
               "spec": {"schedulerName": "deepres-scheduler", "containers": [{"name": "c", "image": "x"}]}}
        status, answer = post(url + "/filter", {"Pod": pod, "Nodes": None, "NodeNames": ["mixed"]})
        reasons = {**answer["FailedNodes"], **answer["FailedAndUnresolvableNodes"]}
        assert status == 200 and answer["NodeNames"] == [], answer
        assert f"{high['admission_mib'] / 1024:.1f} GiB" in reasons["mixed"], reasons
        status, answer = post(url + "/bind", {"PodName": "mix", "PodNamespace": "default", "PodUID": "uid-mix",
                                              "Node": "mixed"})
        assert answer["Error"], "bind must refuse the node as the filter did"


@pytest.mark.parametrize(("outliers", "kept"), [(1, True), (3, False)])
def test_the_offline_bound_outlives_one_outlier_through_the_live_path(outliers: int, kept: bool) -> None:
    """20 pods bound through /filter and /bind, their peaks reported through /v1/telemetry: most at
    the offline point (under its bound, 1.1 x the point), `outliers` of them at 1.4 x it. One pod
    above the bound among 20 is what a bound that holds shows: /v1/predict keeps the offline bound;
    three are not, and the calibrated bound covers them (docs/calibration.md)."""
    with serving(None) as url:
        fleet = Fleet(url, TOKEN, GPU, nodes=4, gpus=8, capacity_mib=81920.0)
        fleet.report_all()
        seen = {"n": 0}

        def reading(point: float) -> float:
            seen["n"] += 1
            return point * (1.4 if seen["n"] <= outliers else 1.0)

        learn_honest(url, fleet, 20, reading=reading)
        probe = job(3)
        answer = wait_for(lambda: (a := predict(url, probe, GPU))["pods"] == 20 and a)
        assert answer and answer["calibrated"]
        if kept:
            assert answer["memory_mib_upper"] == pytest.approx(answer["offline_upper_mib"], rel=1e-3)
        else:
            assert answer["memory_mib_upper"] >= 1.4 * answer["offline_mib"] * 0.999
