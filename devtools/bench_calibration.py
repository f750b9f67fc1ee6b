"""`live_calibration` of reports/predictor.json, measured through a running `deepres serve --no-kube`.

A GPU model the shipped predictor has no line for ("NVIDIA Unseen-GPU 80GB", carrying the real H100
campaign's peaks: predictor/data/measured/h100-*.csv, so no per-GPU line applies) on 8 nodes per
path (16 GPUs each: a pod per GPU, the sharing rule keeps busy GPUs apart). Per
path (exact: `deepres.io/model`; family: the family annotations by docs/data-scientist.md's rules), pods of
seeded-random campaign rows are filtered and bound through the verbs, one at a time over the nodes,
and their measured NVML peaks reported through /v1/telemetry as the agent does; after each pod,
/v1/predict with `gpu` says whether that model is calibrated (`pods_to_calibrate`: pods bound until
it is). Once TRAIN pods per path were observed, /v1/predict with `gpu` is scored on every other row
of the path (held out: never bound): median |point / peak - 1|, share of peaks above the bound,
median bound / peak; `uncalibrated`: the same answers before any pod was observed.

    PYTHONPATH=$PWD python -m devtools.bench_calibration        # about 2 minutes for its 5 seeds here; merges the key

The figures are seed 0's (the seed orders the rows: which are bound, which held out); `by_seed`
has seeds 0-4, each on a fresh server, and `across_seeds_median` their medians: one draw of 20
pods is a noisy sample (on the exact path, one outlier pod among the 20 sets a max-of-20 bound).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from devtools.localserver import LocalServer
from extender.policy.calibration import MIN_PODS, regime
from extender.provenance import stamp

REPORT = Path(__file__).resolve().parents[1] / "reports" / "predictor.json"
GPU = "NVIDIA Unseen-GPU 80GB"
DRIVER, CUDA = "580.159.04", "13.0"
NODES, GPUS_PER_NODE, CAPACITY_MIB = 8, 16, 81559.0
TRAIN = 20
#: Pods per path observed for the second figure (`after_more`): how the bound tightens with pods.
MORE = 100
TOKEN = "bench-calibration"
REGIMES = ("small", "medium", "large")


def _post(url: str, body: Any, token: str = "") -> tuple[int, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {token}"} if token else {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


class Fleet:
    """Nodes of one GPU model that report like agents: pods bound through the verbs, their peaks posted."""

    def __init__(self, url: str, token: str, gpu: str = GPU, nodes: int = NODES, gpus: int = GPUS_PER_NODE,
                 capacity_mib: float = CAPACITY_MIB, driver: str = DRIVER, cuda: str = CUDA,
                 prefix: str = "cal") -> None:
        self.url, self.token, self.gpu = url, token, gpu
        self.capacity_mib, self.gpus, self.driver, self.cuda = capacity_mib, gpus, driver, cuda
        self.names = [f"{prefix}-{i}" for i in range(nodes)]
        self.sequence = {n: 0 for n in self.names}
        self.peaks: dict[str, dict[str, float]] = {n: {} for n in self.names}  # node -> pod uid -> peak
        self.boot = f"{prefix}-boot"

    def report(self, node: str) -> None:
        self.sequence[node] += 1
        pods = [{"pod_uid": uid, "current_memory_mib": peak, "peak_memory_mib": peak}
                for uid, peak in self.peaks[node].items()]
        body = {"node": node, "sequence": self.sequence[node], "timestamp_s": time.time(), "agent_version": "bench",
                "source": "simulated", "interval_s": 5.0, "boot_id": self.boot, "driver_version": self.driver,
                "cuda_version": self.cuda,
                "gpus": [{"uuid": f"{node}-gpu{i}", "index": i, "model": self.gpu,
                          "memory_total_mib": self.capacity_mib, "memory_used_mib": 0.0} for i in range(self.gpus)],
                "pods": pods}
        status, answer = _post(self.url + "/v1/telemetry", body, self.token)
        if status != 200:
            raise RuntimeError(f"telemetry of {node} refused: {status} {answer}")

    def report_all(self) -> None:
        for node in self.names:
            self.report(node)

    def place(self, name: str, annotations: dict[str, str], node: str, namespace: str = "default",
              owner: str = "") -> str:
        """Filter + bind the pod on `node`; its uid, or "" when the node did not take it. `owner`: the uid
        of the controller (a Job) that owns it ("": a bare pod)."""
        uid = f"uid-{name}"
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid, "annotations": annotations}
        if owner:
            meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": owner, "uid": owner,
                                        "controller": True}]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
               "spec": {"schedulerName": "deepres-scheduler", "containers": [{"name": "train", "image": "x"}]}}
        status, answer = _post(self.url + "/filter", {"Pod": pod, "Nodes": None, "NodeNames": [node]})
        if status != 200 or node not in (answer.get("NodeNames") or []):
            return ""
        status, answer = _post(self.url + "/bind", {"PodName": name, "PodNamespace": namespace, "PodUID": uid,
                                                    "Node": node})
        return uid if status == 200 and not answer.get("Error") else ""

    def observe(self, node: str, uid: str, peak_mib: float) -> None:
        self.peaks[node][uid] = peak_mib
        self.report(node)


def predict(url: str, annotations: dict[str, str], gpu: str = GPU) -> dict[str, Any]:
    status, answer = _post(url + "/v1/predict", {"annotations": annotations, "gpu": gpu})
    if status != 200:
        raise RuntimeError(f"/v1/predict answered {status}: {answer}")
    on_gpu: dict[str, Any] = answer["on_gpu"]
    return on_gpu


def annotated_rows(seed: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Per path, (annotations, measured peak MiB) of the campaign's rows, in a seeded order."""
    import csv
    import gzip

    from predictor import features, realjobs, table
    from predictor.dataset import paths

    rows = realjobs.measured()
    out: dict[str, list[tuple[dict[str, str], float]]] = {"exact": [], "family": []}
    for r in rows:
        try:
            table.resolve(r["name"])
        except Exception:  # not in the traced table: no exact path
            continue
        precision = "bf16-true" if r["precision"] == "bf16" else r["precision"]
        out["exact"].append(({"deepres.io/model": r["name"], "deepres.io/batch-size": str(int(float(r["batch_size"]))),
                              "deepres.io/input-dim": str(int(float(r["input_dim"]))),
                              "deepres.io/precision": precision, "deepres.io/optimizer": r["optimizer"]},
                             float(r["nvml_process_peak_mib"])))

    def key(r: dict[str, Any]) -> tuple[str, int, int, str, str]:
        return (r["name"], int(float(r["batch_size"])), int(float(r["input_dim"])), r["precision"], r["optimizer"])

    peaks = {key(r): float(r["nvml_process_peak_mib"]) for r in rows}
    with gzip.open(paths.JOBS_OUT, "rt", newline="") as handle:
        source = [r for r in csv.DictReader(handle) if r.get("status") == "ok" and key(r) in peaks]
    for r, spec in zip(source, features.annotated_specs(source, paths.DATA_DIR), strict=True):
        if spec is not None:
            out["family"].append(({"deepres.io/" + k: v for k, v in spec.to_annotations().items()}, peaks.pop(key(r))))
    for path in out.values():
        random.Random(seed).shuffle(path)
    return out


def figures(answers: list[tuple[float, float, float]]) -> dict[str, float]:
    """The figures of (point, bound, measured peak) triples: median |point / peak - 1|, share of
    peaks above the bound, median bound / peak."""
    return {"median_abs_rel_err": round(statistics.median(abs(p / peak - 1.0) for p, _, peak in answers), 4),
            "under_rate": round(sum(upper < peak for _, upper, peak in answers) / len(answers), 4),
            "median_bound_ratio": round(statistics.median(upper / peak for _, upper, peak in answers), 4)}


def batch_regime(job: dict[str, str]) -> str:
    """The batch regime of a row (extender.policy.calibration.regime of its per-GPU batch)."""
    return regime(int(job.get("deepres.io/batch-size", "0") or 0))


def score(url: str, rows: list[tuple[dict[str, str], float]]) -> dict[str, Any]:
    """The figures over `rows`, and per batch regime (`by_regime`: small <= 16, medium <= 64, large)."""
    answers, calibrated = [], 0
    by: dict[str, list[tuple[float, float, float]]] = {}
    for job, peak in rows:
        answer = predict(url, job)
        answers.append((answer["memory_mib"], answer["memory_mib_upper"], peak))
        by.setdefault(batch_regime(job), []).append(answers[-1])
        calibrated += bool(answer["calibrated"])
    return {"n": len(rows), **figures(answers), "calibrated_answers": calibrated,
            "by_regime": {r: {"n": len(by[r]), **figures(by[r])} for r in REGIMES if r in by}}


def measure(url: str, token: str, seed: int = 0, train: int = TRAIN, more: int = MORE,
            log: Any = sys.stderr) -> dict[str, Any]:
    """The figures at `train` observed pods per path (and at `more`, under `after_more`)."""
    data = annotated_rows(seed)
    result: dict[str, Any] = {}
    to_calibrate: dict[str, int | None] = {}
    for path, rows in data.items():
        # a fleet per path (same GPU model and software): MORE pods fit on one path's 8 x 16 GPUs
        fleet = Fleet(url, token, prefix=f"cal-{path}")
        fleet.report_all()
        candidates = 2 * more  # rows that may be bound; the rest are held out, never bound
        probe, held = rows[0][0], rows[candidates:]
        before = score(url, held)
        bound = 0
        to_calibrate[path] = None
        for i, (job, peak) in enumerate(rows[:candidates]):
            if bound >= more:
                break
            node = fleet.names[bound % len(fleet.names)]
            uid = fleet.place(f"{path}-{seed}-{i}", job, node)
            if not uid:
                continue
            bound += 1
            fleet.observe(node, uid, peak)
            if to_calibrate[path] is None and bound >= MIN_PODS:
                time.sleep(LEARNED_AFTER_S)  # what the learner (off the request path) learned from this pod
                if predict(url, probe)["calibrated"]:
                    to_calibrate[path] = bound
            if bound == train:
                time.sleep(LEARNED_AFTER_S)
                after = score(url, held)
                after["uncalibrated"] = {k: before[k] for k in ("median_abs_rel_err", "under_rate",
                                                                "median_bound_ratio")}
                after["pods_observed"] = bound
                result[path] = after
            print(f"{path}: {bound}/{more} pods bound and observed", file=log, flush=True)
        time.sleep(LEARNED_AFTER_S)
        result[path]["after_more"] = {**score(url, held), "pods_observed": bound}
    counts = [v for v in to_calibrate.values()]
    result["pods_to_calibrate"] = max(counts) if all(v is not None for v in counts) else None  # type: ignore[type-var]
    result["pods_to_calibrate_by_path"] = to_calibrate
    return result


#: The server's settings for the bench: /v1/predict unlimited (it scores thousands of rows); a pod counts
#: for the calibration at its first report (the bench reports each pod's measured peak once, at once).
SERVER_ENV = {"DEEPRES_PREDICT_RATE_PER_S": "0", "DEEPRES_CALIBRATION_SETTLE_S": "0"}


def _run(seed: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="deepres-calibration-") as tmp, \
            LocalServer(Path(tmp), token=TOKEN, args=["--state-file", str(Path(tmp) / "state.json")],
                        env=SERVER_ENV, ready_timeout_s=300.0) as server:
        return measure(server.url, TOKEN, seed)


# ---- --safety: one owner poisoning the line, and the verbs' latency while keys re-learn ----

#: The victim (issue 45): timm/resnet50 at batch 64 on the unseen GPU model.
VICTIM = {"deepres.io/model": "timm/resnet50", "deepres.io/batch-size": "64"}
HONEST_PODS = 24
HONEST_TENANTS = 3
#: Pods the attacking owner may bind at most (null when its victim never moved by SHIFT by then).
ATTACK_MAX = 60
SHIFT = 0.10
#: How long after a pod's report what was learned from it is read (the victim's admission after each
#: attacking pod; the scores after TRAIN and MORE pods; whether the probe is calibrated): the learner
#: learns at most once a second, off the request path, so this reads what it learned from that pod.
LEARNED_AFTER_S = 1.5


def _owned(fleet: Fleet, name: str, job: dict[str, str], node: str, namespace: str, owner: str) -> str:
    return fleet.place(name, job, node, namespace=namespace, owner=owner)


def poisoning(url: str, direction: str, log: Any = sys.stderr) -> dict[str, Any]:
    """HONEST_PODS measured exact-path campaign rows (HONEST_TENANTS namespaces, one Job per pod) learned
    first; then one owner (one Job in its own namespace) binds pods naming the victim's architecture, spread
    over the nodes, and reports a tenth (down) or 3x (up) of their offline point. Pods it needed before the
    victim's admission on that GPU model moved by SHIFT, or None within ATTACK_MAX."""
    rows = annotated_rows(0)["exact"]
    fleet = Fleet(url, TOKEN, prefix=f"poison-{direction}", gpus=32, capacity_mib=250_000.0)
    fleet.report_all()
    for i, (job, peak) in enumerate(rows[:HONEST_PODS]):
        node = fleet.names[i % len(fleet.names)]
        namespace = f"team-{i % HONEST_TENANTS}"
        uid = _owned(fleet, f"honest-{direction}-{i}", job, node, namespace, f"job-honest-{direction}-{i}")
        if not uid:
            raise RuntimeError(f"honest pod {i} not bound on {node}")
        fleet.observe(node, uid, peak)
    time.sleep(LEARNED_AFTER_S)
    clean = predict(url, VICTIM)
    if not clean["calibrated"]:
        raise RuntimeError(f"{HONEST_PODS} honest pods did not calibrate: {clean}")
    factor = 0.1 if direction == "down" else 3.0
    needed = None
    admissions = []
    for k in range(1, ATTACK_MAX + 1):
        node = fleet.names[k % len(fleet.names)]
        uid = _owned(fleet, f"mallory-{direction}-{k}", VICTIM, node, "mallory", "job-mallory")
        if not uid:
            print(f"poisoning {direction}: attacking pod {k} not bound", file=log)
            continue
        fleet.observe(node, uid, factor * float(predict(url, VICTIM)["offline_mib"]))
        time.sleep(LEARNED_AFTER_S)
        now = predict(url, VICTIM)["admission_mib"]
        admissions.append(round(now, 1))
        if abs(now / clean["admission_mib"] - 1.0) >= SHIFT:
            needed = k
            break
    print(f"poisoning {direction}: {needed} pods (admission {clean['admission_mib']:.0f} -> {admissions[-1]:.0f})",
          file=log, flush=True)
    return {"pods_to_shift": needed, "clean_admission_mib": clean["admission_mib"],
            "last_admission_mib": admissions[-1] if admissions else None, "attack_pods": len(admissions)}


KEYS = 10
PODS_PER_KEY = 200
FILTERS = 1500
#: The relearning phase lasts until every key of the learning server was seen learned again this many
#: times (its calibrated point moved: read through /v1/predict with `gpu`), FILTERS calls at least.
RELEARNED = 3
#: A pod's settle time on the server that never learns: its pods never count (no key), all else the same.
NEVER_S = "1e12"
#: The servers measured side by side (each /filter call goes to each in turn: the same machine load):
#: `keys` learns its 10 full keys; `same_pods` has the same nodes, pods and reports and learns nothing
#: (its pods never settle); `empty` has the same nodes and no pod.
SERVERS = ("keys", "same_pods", "empty")


def _filter_pod() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "probe", "namespace": "default", "uid": "uid-probe", "annotations": VICTIM},
            "spec": {"schedulerName": "deepres-scheduler", "containers": [{"name": "train", "image": "x"}]}}


def _p99(times: list[float]) -> float:
    ordered = sorted(times)
    return round(ordered[int(0.99 * (len(ordered) - 1))], 1)


def _fill(url: str, with_pods: bool, log: Any) -> list[Fleet]:
    """KEYS GPU models of 8 nodes each on the server at `url`; with `with_pods`, PODS_PER_KEY measured
    campaign rows bound on each and their peaks reported (a full window per key)."""
    rows = annotated_rows(0)["exact"]
    fleets = [Fleet(url, TOKEN, gpu=f"NVIDIA Unseen-GPU-{k} 80GB", gpus=32, capacity_mib=250_000.0,
                    prefix=f"learn-{k}") for k in range(KEYS)]
    for fleet in fleets:
        fleet.report_all()
    if with_pods:
        for k, fleet in enumerate(fleets):
            for i in range(PODS_PER_KEY):
                job, peak = rows[i % len(rows)]
                node = fleet.names[i % len(fleet.names)]
                uid = fleet.place(f"learn-{k}-{i}", job, node)
                if uid:  # (a pod the filter refused is not placed: the key's window is the others)
                    fleet.peaks[node][uid] = peak
            for node in fleet.names:
                fleet.report(node)
            print(f"learning ({url}): key {k + 1}/{KEYS} placed", file=log, flush=True)
    return fleets


def _points(url: str) -> list[tuple[bool, float]]:
    """(calibrated, calibrated point) of the victim on each key's GPU model."""
    return [(bool(a["calibrated"]), float(a["memory_mib"]))
            for a in (predict(url, VICTIM, f"NVIDIA Unseen-GPU-{k} 80GB") for k in range(KEYS))]


def side_by_side(urls: dict[str, str], log: Any = sys.stderr) -> dict[str, Any]:
    """The servers of SERVERS filled, then two phases of /filter calls over their 80 nodes, each call
    made on each server in turn while a thread per server keeps reporting its nodes: `steady` (the same
    peaks: nothing to learn) and `relearning` (every report grows its pods' peaks by 0.1%: the keys
    are learned again as often as the learner does, GROWN_EVERY_S; it lasts until every key was seen
    learned again RELEARNED times). p99 and median (ms) per server and phase."""
    fleets = {name: _fill(url, name != "empty", log) for name, url in urls.items()}
    if not all(c for c, _ in wait_points(urls["keys"], True)):
        raise RuntimeError("the learning server did not calibrate its keys")
    if any(c for c, _ in _points(urls["same_pods"])):
        raise RuntimeError("the server whose pods never settle calibrated a key")
    names = [n for fleet in fleets["keys"] for n in fleet.names]
    out: dict[str, Any] = {}
    for phase, growth in (("steady", 1.0), ("relearning", 1.001)):
        out[phase] = _phase(urls, fleets, names, growth)
        print(f"learning, {phase}: {json.dumps(out[phase])}", file=log, flush=True)
    return out


def _phase(urls: dict[str, str], fleets: dict[str, list[Fleet]], names: list[str], growth: float) -> dict[str, Any]:
    """One phase of `side_by_side`: its /filter calls on every server in turn while a thread per server
    reports its nodes (their pods' peaks times `growth` at each report)."""
    stop = threading.Event()
    moves = [0] * KEYS

    def grow(server: str) -> None:
        round_ = 0
        while not stop.is_set():
            for fleet in fleets[server]:
                node = fleet.names[round_ % len(fleet.names)]
                for uid in fleet.peaks[node]:
                    fleet.peaks[node][uid] *= growth
                fleet.report(node)
            round_ += 1

    def watch() -> None:  # the keys seen learned again: their calibrated point moved (every server asked alike)
        last = _points(urls["keys"])
        while not stop.wait(1.0):
            for server, url in urls.items():
                if server != "keys":
                    _points(url)
            now = _points(urls["keys"])
            for k, ((_, before), (_, after)) in enumerate(zip(last, now, strict=True)):
                moves[k] += after != before
            last = now

    threads = [threading.Thread(target=grow, args=(s,), daemon=True) for s in urls]
    threads.append(threading.Thread(target=watch, daemon=True))
    for thread in threads:
        thread.start()
    times: dict[str, list[float]] = {s: [] for s in urls}
    try:
        calls = 0
        while calls < FILTERS or (growth > 1.0 and min(moves) < RELEARNED):
            for server, url in urls.items():
                t0 = time.perf_counter()
                status, _answer = _post(url + "/filter", {"Pod": _filter_pod(), "Nodes": None, "NodeNames": names})
                times[server].append((time.perf_counter() - t0) * 1000.0)
                if status != 200:
                    raise RuntimeError(f"/filter of {server} answered {status}")
            calls += 1
            if calls > 20 * FILTERS:
                raise RuntimeError(f"keys not learned again {RELEARNED} times: {moves}")
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    out: dict[str, Any] = {s: {"p99_ms": _p99(t), "median_ms": round(statistics.median(t), 1), "calls": len(t)}
                           for s, t in times.items()}
    if growth > 1.0:
        out["keys_relearned_min"] = min(moves)
    return out


def wait_points(url: str, calibrated: bool, timeout_s: float = 60.0) -> list[tuple[bool, float]]:
    """`_points` once every key is (or is not) calibrated, or at the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        points = _points(url)
        if all(c == calibrated for c, _ in points) or time.monotonic() > deadline:
            return points
        time.sleep(0.5)


def safety(log: Any = sys.stderr, cwd: Path | None = None,
           parts: tuple[str, ...] = ("poisoning", "learning")) -> dict[str, Any]:
    """`poisoning` and `learning` of live_calibration (`parts`), each on fresh servers (`cwd`: the tree
    they run)."""
    out: dict[str, Any] = {part: {} for part in parts}

    def server(tmp: str, env: dict[str, str] | None = None) -> LocalServer:
        kwargs: dict[str, Any] = {"cwd": cwd} if cwd is not None else {}
        return LocalServer(Path(tmp), token=TOKEN, args=["--state-file", str(Path(tmp) / "state.json")],
                           env={**SERVER_ENV, **(env or {})}, ready_timeout_s=300.0, **kwargs)

    for direction in ("down", "up") if "poisoning" in parts else ():
        with tempfile.TemporaryDirectory(prefix="deepres-poison-") as tmp, server(tmp) as running:
            found = poisoning(running.url, direction, log)
        out["poisoning"][f"{direction}_pods_to_shift"] = found["pods_to_shift"]
        out["poisoning"][direction] = found
    if "learning" not in parts:
        return out
    with contextlib.ExitStack() as stack:
        urls = {}
        for name in SERVERS:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"deepres-learning-{name}-"))
            env = {"DEEPRES_CALIBRATION_SETTLE_S": NEVER_S} if name == "same_pods" else {}
            urls[name] = stack.enter_context(server(tmp, env)).url
        found = side_by_side(urls, log)
    relearning, steady = found["relearning"], found["steady"]
    out["learning"]["filter_p99_ms_no_keys"] = relearning["empty"]["p99_ms"]
    out["learning"]["filter_p99_ms_10_keys"] = relearning["keys"]["p99_ms"]
    out["learning"]["filter_p99_ms_10_keys_steady"] = steady["keys"]["p99_ms"]
    out["learning"]["filter_p99_ms_same_pods_no_keys"] = relearning["same_pods"]["p99_ms"]
    out["learning"]["filter_p99_ms_10_keys_over_same_pods_no_keys"] = round(
        relearning["keys"]["p99_ms"] - relearning["same_pods"]["p99_ms"], 1)
    out["learning"]["keys_relearned_min"] = relearning["keys_relearned_min"]
    out["learning"]["phases"] = found
    return out


def _get(run: dict[str, Any], path: str, part: str, key: str) -> float:
    figures = run[path]["after_more"] if part else run[path]
    return float(figures[key])


def _summary(run: dict[str, Any]) -> dict[str, Any]:
    keys = ("median_abs_rel_err", "under_rate", "median_bound_ratio")
    return {path: {**{k: run[path][k] for k in keys}, "by_regime": run[path]["by_regime"], "after_more": {
        k: run[path]["after_more"][k] for k in (*keys, "pods_observed")}} for path in ("exact", "family")}


def _by_regime_medians(runs: dict[int, dict[str, Any]]) -> dict[str, float]:
    """Per path and batch regime, the median across seeds of each figure after TRAIN pods."""
    out = {}
    for path in ("exact", "family"):
        for r in REGIMES:
            seen = [run[path]["by_regime"][r] for run in runs.values() if r in run[path]["by_regime"]]
            for k in ("median_abs_rel_err", "under_rate", "median_bound_ratio"):
                if seen:
                    out[f"{path}.by_regime.{r}.{k}"] = round(statistics.median(f[k] for f in seen), 4)
    return out


def parser() -> argparse.ArgumentParser:
    """The command's arguments (the docs check reads them: docs/calibration.md names --safety)."""
    out = argparse.ArgumentParser(prog="python -m devtools.bench_calibration", description=__doc__.splitlines()[0])
    out.add_argument("--seed", type=int, default=0)
    out.add_argument("--seeds", type=int, default=5,
                     help="seeds measured (each on a fresh server); the figures are --seed's, `by_seed` all")
    out.add_argument("--report", type=Path, default=REPORT)
    out.add_argument("--safety", action="store_true",
                     help="measure only `poisoning` and `learning` (issue 45) and merge them into live_calibration")
    out.add_argument("--learning-only", action="store_true",
                     help="with --safety: measure `learning` alone (three servers side by side; keeps `poisoning`)")
    return out


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.safety:
        parts = ("learning",) if args.learning_only else ("poisoning", "learning")
        found = safety(parts=parts)
        data = json.loads(args.report.read_text()) if args.report.exists() else {}  # read after: others may write
        live = data.setdefault("live_calibration", {})
        command = "python -m devtools.bench_calibration --safety" + (" --learning-only" if args.learning_only else "")
        if "poisoning" in found:
            live["poisoning"] = {**found["poisoning"], "command": command, "method": (
                f"a running `deepres serve --no-kube` per direction: {HONEST_PODS} measured exact-path H100 campaign "
                f"rows ({HONEST_TENANTS} namespaces, one Job per pod) bound through /filter and /bind on 8 nodes of "
                f"{GPU} and their peaks reported through /v1/telemetry; then one owner (one Job, namespace `mallory`) "
                f"binds pods naming {VICTIM['deepres.io/model']} at batch {VICTIM['deepres.io/batch-size']}, round "
                "robin over the nodes, reporting a tenth (down) or 3x (up) of their offline point; pods_to_shift: its "
                f"pods bound when the victim's admission_mib (/v1/predict with `gpu`, read {LEARNED_AFTER_S:g} s after "
                f"each report) first moved by {SHIFT:.0%}; null: not within {ATTACK_MAX} pods"),
                "provenance": stamp(command)}
        live["learning"] = {**found["learning"], "command": command, "method": (
            f"three `deepres serve --no-kube` running side by side, each with {KEYS} GPU models of 8 nodes: `keys` "
            f"with {PODS_PER_KEY} measured campaign rows bound and observed per model (every key a full window, "
            "calibrated), `same_pods` with the same nodes, pods and reports whose pods never settle "
            "(DEEPRES_CALIBRATION_SETTLE_S huge: no key is learned, all else the same), `empty` with the same "
            f"nodes and no pod. At least {FILTERS} /filter calls of a GPU pod over the 80 nodes, each made on the "
            "three servers in turn (the same machine load), while a client thread per server keeps reporting its "
            "nodes: `steady` with the peaks unchanged, `relearning` with its pods' peaks grown by 0.1% at each "
            "report (every key learned again as often as the learner does, GROWN_EVERY_S) until every key was "
            f"seen learned again {RELEARNED} times (its calibrated point on /v1/predict moved, asked once a second, "
            "every server asked alike; keys_relearned_min). "
            "`filter_p99_ms_10_keys`: keys, relearning; `filter_p99_ms_10_keys_steady`: keys, steady; "
            "`filter_p99_ms_same_pods_no_keys`: same_pods, relearning (the like-for-like baseline: a server with "
            "no key); `filter_p99_ms_no_keys`: empty, relearning (no pod at all: the cost of the 2,000 "
            "reservations and their reports is the gap between same_pods and empty); `phases`: every figure"),
            "provenance": stamp(command)}
        args.report.write_text(json.dumps(data, indent=2) + "\n")
        print(json.dumps({k: live[k] for k in ("poisoning", "learning") if k in live}, indent=1))
        return 0
    runs = {seed: _run(seed) for seed in sorted({args.seed, *range(args.seed, args.seed + args.seeds)})}
    result = runs[args.seed]
    result["by_seed"] = {str(seed): _summary(run) for seed, run in runs.items()}
    result["across_seeds_median"] = {
        f"{path}.{part}{k}": round(statistics.median(_get(run, path, part, k) for run in runs.values()), 4)
        for path in ("exact", "family") for part in ("", "after_more.")
        for k in ("median_abs_rel_err", "under_rate", "median_bound_ratio")}
    result["across_seeds_median"].update(_by_regime_medians(runs))
    result["gpu"] = GPU
    result["seed"] = args.seed
    result["method"] = (
        "a running `deepres serve --no-kube` (devtools.bench_calibration): 8 nodes of a GPU model with no per-GPU "
        f"line ({GPU}) carrying the H100 campaign's measured NVML peaks (predictor/data/measured); per path, "
        f"{TRAIN} pods (after_more: {MORE}) of seeded-random rows bound through /filter and /bind and their peaks "
        "reported through /v1/telemetry; then /v1/predict with `gpu` scored on the path's rows never bound; "
        "`uncalibrated`: the "
        "same answers before any pod was observed; pods_to_calibrate: pods observed when /v1/predict first "
        "answered calibrated (the larger of the two paths); by_seed: the same for other row orders, each on a fresh "
        "server; by_regime: the same figures per batch regime of the scored rows (per-GPU batch: small <= 16, "
        "medium <= 64, large above), across_seeds_median `<path>.by_regime.<regime>.<figure>` their medians")
    result["provenance"] = stamp(f"python -m devtools.bench_calibration --seed {args.seed} --seeds {args.seeds}")
    data = json.loads(args.report.read_text()) if args.report.exists() else {}
    kept = {k: v for k, v in data.get("live_calibration", {}).items() if k in ("poisoning", "learning")}
    data["live_calibration"] = {**result, **kept}  # --safety's figures are its own command's
    args.report.write_text(json.dumps(data, indent=2) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
