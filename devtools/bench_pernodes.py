"""`deepres bench extender --per-nodes 1000 5000`: the extender's CPU per scheduling cycle against the
cluster's size, with the placement code as it is and as it was at `--baseline-ref`, side by side.

Issue 48 asks that a pod cost what the protocol costs whatever the cluster's size. Per size, a
cluster of N nodes with 8 GPUs each (half 80 GB, half 40 GB A100s, one GPU model and node software
per node, a quarter of each node's GPUs partly used) reports once; then pods go through
kube-scheduler's cycle with `percentageOfNodesToScore: 100` (the chart's) one at a time: a `/filter`
naming every node (nodeCacheCapable: names only, in a new order each time), a `/prioritize` with
what it passed when that is more than one node, a `/bind` to the best. Two kinds of pods:
- gpu_memory: `deepres.io/gpu-memory: 10Gi` (`deepres bench cluster`'s pods): one admission;
- predicted: a model annotated (`model-type: resnet`...), admitted per GPU model (the grouping).
The figure is the process CPU time of the verbs (the WSGI app called in process: no HTTP, no client
in the same process's CPU time), the median over the pods of a round, then the median of the rounds.

The two codes run in processes of their own, in turns (round k: current then baseline, round k+1 the
other way), so that a slower moment of the host weighs on both: the baseline is a copy of the
working tree's `extender/` in which the placement modules (PLACEMENT_FILES) are read from git at
`--baseline-ref` (a module absent there is removed), put first on the child's `sys.path`.
Writes the `per_nodes` section of `reports/bench-extender.json` (its other keys kept as they are).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from extender.cli import UsageError
from extender.provenance import stamp

#: The modules issue 48's item 3 changed (the filter's per-name work): what the baseline reads from git.
PLACEMENT_FILES = ("extender/policy/columnar.py", "extender/policy/reasons.py", "extender/policy/placement.py",
                   "extender/server/gpu_demand.py", "extender/server/placing.py", "extender/server/planner.py")
KINDS = ("gpu_memory", "predicted")
MODELS = (("NVIDIA A100-SXM4-80GB", 81920.0), ("NVIDIA A100-SXM4-40GB", 40960.0))
WARM_PODS = 20
ROOT = Path(__file__).resolve().parent.parent


def run_per_nodes(args: argparse.Namespace) -> int:
    sizes = sorted(set(args.per_nodes))
    if min(sizes) < 10 or args.cycle_pods < 10 or args.repeats < 1:
        raise UsageError("--per-nodes sizes >= 10, --cycle-pods >= 10, --repeats >= 1")
    ref = args.baseline_ref
    rounds: dict[str, dict[str, list[dict[str, float]]]] = {
        f"nodes_{n}": {"current": [], "baseline": []} for n in sizes}
    with tempfile.TemporaryDirectory(prefix="deepres-baseline-") as tmp:
        baseline = _baseline_tree(Path(tmp), ref)
        for k in range(args.repeats):
            for n in sizes:
                order = ("current", "baseline") if k % 2 == 0 else ("baseline", "current")
                for code in order:
                    figures = _child(None if code == "current" else baseline, n, args.cycle_pods, k,
                                     args.predictor_factory)
                    rounds[f"nodes_{n}"][code].append(figures)
                    _progress(f"round {k + 1}/{args.repeats}, {n} nodes, {code}: "
                              + ", ".join(f"{key} {value:.3f} ms" for key, value in figures.items()))
    section: dict[str, Any] = {
        "what": "extender CPU ms per scheduling cycle (filter over every node's name, prioritize when more "
                "than one node passed, bind), in process; median over the pods of a round, then over rounds",
        "baseline_ref": _resolve(ref), "pods_per_round": args.cycle_pods, "rounds": args.repeats,
    }
    for n in sizes:
        entry: dict[str, Any] = {}
        for code in ("current", "baseline"):
            runs = rounds[f"nodes_{n}"][code]
            entry[code] = {f"cpu_ms_per_cycle_{kind}": round(statistics.median(r[kind] for r in runs), 3)
                           for kind in KINDS}
        entry["baseline_over_current"] = {
            kind: round(entry["baseline"][f"cpu_ms_per_cycle_{kind}"] / entry["current"][f"cpu_ms_per_cycle_{kind}"], 2)
            for kind in KINDS}
        section[f"nodes_{n}"] = entry
    if len(sizes) > 1:
        small, large = f"nodes_{sizes[0]}", f"nodes_{sizes[-1]}"
        section[f"growth_{sizes[-1]}_over_{sizes[0]}"] = {
            code: {kind: round(section[large][code][f"cpu_ms_per_cycle_{kind}"]
                               / section[small][code][f"cpu_ms_per_cycle_{kind}"], 2) for kind in KINDS}
            for code in ("current", "baseline")}
    section["load_average_1m"] = round(os.getloadavg()[0], 2)
    section["provenance"] = stamp(f"deepres bench extender --per-nodes {' '.join(map(str, sizes))} "
                                  f"--cycle-pods {args.cycle_pods} --repeats {args.repeats} --baseline-ref {ref}")
    out = Path(args.out)
    results: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    results["per_nodes"] = section
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(section, indent=2) if args.json else _table(section, sizes) + f"\nwritten to {out}")
    return 0


def _table(section: dict[str, Any], sizes: list[int]) -> str:
    lines = [f"{'nodes':>7} {'code':<9}" + "".join(f"{kind:>14}" for kind in KINDS)]
    for n in sizes:
        for code in ("baseline", "current"):
            figures = section[f"nodes_{n}"][code]
            lines.append(f"{n:>7} {code:<9}" + "".join(f"{figures[f'cpu_ms_per_cycle_{kind}']:>14.3f}"
                                                       for kind in KINDS))
    return "\n".join(lines)


def _resolve(ref: str) -> str:
    done = subprocess.run(["git", "rev-parse", ref], cwd=ROOT, capture_output=True, text=True, check=False)
    return done.stdout.strip() or ref


def _baseline_tree(tmp: Path, ref: str) -> Path:
    """A copy of `extender/` with PLACEMENT_FILES as they were at `ref` (read with `git show`)."""
    tree = tmp / "tree"
    shutil.copytree(ROOT / "extender", tree / "extender", ignore=shutil.ignore_patterns("__pycache__"))
    for path in PLACEMENT_FILES:
        shown = subprocess.run(["git", "show", f"{ref}:{path}"], cwd=ROOT, capture_output=True, check=False)
        target = tree / path
        if shown.returncode == 0:
            target.write_bytes(shown.stdout)
        elif b"does not exist" in shown.stderr or b"exists on disk, but not in" in shown.stderr:
            target.unlink(missing_ok=True)
        else:
            raise UsageError(f"git show {ref}:{path} failed: {shown.stderr.decode(errors='replace').strip()}")
    return tree


def _child(tree: Path | None, nodes: int, pods: int, seed: int, predictor_factory: str = "") -> dict[str, float]:
    """One size and round in a process of its own, `tree`'s extender first on its path."""
    prelude = f"import sys; sys.path.insert(0, {str(tree)!r}); " if tree is not None else ""
    code = (prelude + "from devtools.bench_pernodes import measure; import json; "
            f"print(json.dumps(measure({nodes}, {pods}, {seed})))")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DEEPRES_TELEMETRY_TTL_S": "3600"}
    if predictor_factory:
        env["DEEPRES_PREDICTOR_FACTORY"] = predictor_factory
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          check=False, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"the {'baseline' if tree else 'current'} run at {nodes} nodes failed:\n"
                           f"{done.stderr[-3000:]}")
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def measure(nodes: int, pods: int, seed: int) -> dict[str, float]:
    """In this process: the cluster reports, then `pods` pods of each kind; the median CPU ms per cycle."""
    from extender.server.app import create_app, extender_of
    from extender.settings import load_settings

    settings = load_settings()
    settings.kube.no_kube = True
    settings.telemetry.telemetry_token = token = "bench-" + os.urandom(4).hex()
    settings.server.max_body_bytes = max(settings.server.max_body_bytes, 64 * nodes + 100_000)
    app = create_app(settings)
    ext = extender_of(app)
    deadline = time.monotonic() + 300
    while ext.readiness() and time.monotonic() < deadline:
        time.sleep(0.1)
    if ext.readiness():
        raise RuntimeError(f"the extender is not ready: {ext.readiness()}")
    wsgi = app.wsgi_app
    rng = random.Random(seed)
    names = [f"gpu-{i:05d}" for i in range(nodes)]
    for i, name in enumerate(names):
        model, total = MODELS[i % len(MODELS)]
        gpus = [{"uuid": f"GPU-{name}-{k}", "index": k, "model": model, "memory_total_mib": total,
                 "memory_used_mib": rng.choice((0.0, 0.0, 0.0, 0.5)) * total, "utilization_gpu": rng.random()}
                for k in range(8)]
        _call(wsgi, "/v1/telemetry", {"node": name, "sequence": 1, "timestamp_s": time.time(), "agent_version": "bench",
                                      "source": "simulated", "gpus": gpus, "pods": []}, token)
    figures: dict[str, float] = {}
    for kind in KINDS:
        spent = []
        for i in range(WARM_PODS + pods):
            order = names[:]
            rng.shuffle(order)  # kube-scheduler's parallel filters collect the feasible nodes in no fixed order
            cpu = _cycle(wsgi, _pod(kind, f"{kind}-{seed}-{i}"), order)
            if i >= WARM_PODS:
                spent.append(cpu)
        figures[kind] = statistics.median(spent) * 1000.0
    return figures


def _pod(kind: str, name: str) -> dict[str, Any]:
    annotations = ({"deepres.io/gpu-memory": "10Gi", "deepres.io/criticality": "normal"} if kind == "gpu_memory" else
                   {"deepres.io/model-type": "resnet", "deepres.io/params-millions": "25",
                    "deepres.io/batch-size": "128", "deepres.io/precision": "fp32"})
    return {"metadata": {"name": name, "namespace": "bench", "uid": f"uid-{name}",
                         "creationTimestamp": "2026-11-24T08:00:00Z", "annotations": annotations},
            "spec": {"schedulerName": "deepres-scheduler", "containers": [{"name": "c", "image": "busybox"}]},
            "status": {"phase": "Pending"}}


def _cycle(wsgi: Any, pod: dict[str, Any], order: list[str]) -> float:
    """kube-scheduler's cycle for one pod: filter, prioritize when more than one node passed, bind.
    The CPU seconds of the app's calls (the client's encoding and decoding left out)."""
    spent: list[float] = []
    passed = _call(wsgi, "/filter", {"Pod": pod, "NodeNames": order}, spent=spent).get("NodeNames") or []
    if not passed:
        raise RuntimeError(f"the filter passed no node for {pod['metadata']['name']}")
    best = passed[0]
    if len(passed) > 1:
        scores = _call(wsgi, "/prioritize", {"Pod": pod, "NodeNames": passed}, spent=spent)
        best = max(scores, key=lambda entry: entry["Score"])["Host"]
    meta = pod["metadata"]
    answer = _call(wsgi, "/bind", {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"],
                                   "Node": best}, spent=spent)
    if answer.get("Error"):
        raise RuntimeError(f"bind failed: {answer['Error']}")
    return sum(spent)


def _call(wsgi: Any, path: str, payload: dict[str, Any], token: str = "", spent: list[float] | None = None) -> Any:
    body = json.dumps(payload).encode()
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": path, "CONTENT_LENGTH": str(len(body)),
               "CONTENT_TYPE": "application/json", "wsgi.input": io.BytesIO(body), "SERVER_NAME": "bench",
               "SERVER_PORT": "80", "wsgi.url_scheme": "http", "REMOTE_ADDR": "127.0.0.1"}
    if token:
        environ["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    status: list[str] = []
    started = time.process_time()
    data = b"".join(wsgi(environ, lambda s, headers, exc=None: status.append(s)))
    if spent is not None:
        spent.append(time.process_time() - started)
    if not status or not status[0].startswith("200"):
        raise RuntimeError(f"{path}: {status[:1]} {data[:300]!r}")
    return json.loads(data)


def _progress(message: str) -> None:
    print(f"[bench extender --per-nodes] {message}", file=sys.stderr, flush=True)
