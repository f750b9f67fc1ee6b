"""A real one-GPU trial (issue 33, point 6): a backlog of real training jobs run twice on one device,
once one at a time (static FIFO) and once placed by deepres's rule through a running extender.

    python -m devtools.trial --device cuda              # on a lent GPU: reports/trial.json
    python -m devtools.trial --device cpu --backlog tiny  # the same machinery on the CPU (tests)

Static: the jobs run one after the other in backlog order; each one's run time is its time alone
(`solo_s`). DeepRes: a `deepres serve --no-kube` on loopback (devtools/localserver.py, the settings it
ships with unless `--server-env` says otherwise), an agent-like reporter that posts this machine's
telemetry to /v1/telemetry every `--report-every-s` (real NVML through the agent's own sampler,
extender/agent/nvml.py, processes attributed to jobs by pid; on the CPU a stub that reports each
job's RSS as its memory and its CPU share as its duty, flagged as such in the report), and a
kube-scheduler stand-in that, in backlog order, sends each pending job's pod to /filter and, when the
node passes, /bind; a bound job starts at once as its own process beside the others. A job that ends
drops out of the reports; the server releases its reservation when no report has named it for
`kube.local_expiry_s` (set to a few seconds here). Every job is submitted at time 0 in both modes.

Writes reports/trial.json: per mode the makespan, mean and median JCT, OOMs and failures, and per
job its start, end, JCT, run time, slowdown against its static run, peak memory and the duty the
reporter saw.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools.localserver import LocalServer
from devtools.trial_jobs import TrialJob
from extender.agent.cgroups import PodRef
from extender.agent.tracking import PodTracker, attribute_processes
from extender.telemetry import GpuReport, NodeReport, ProcessReport

REPO = Path(__file__).resolve().parents[1]
NODE = "trial-node"
NAMESPACE = "trial"
COMMAND = "python -m devtools.trial --device cuda"
#: The extender forgets a finished job's reservation this long after the last report naming it.
LOCAL_EXPIRY_S = 3.0


def _annotations(model: str, family: str, params_m: float, batch: int, size: int, steps: int,
                 layers: int | None = None, precision: str = "amp") -> dict[str, str]:
    out = {"deepres.io/model-type": family, "deepres.io/params-millions": f"{params_m:g}",
           "deepres.io/batch-size": str(batch), "deepres.io/input-dim": str(size),
           "deepres.io/iterations": str(steps), "deepres.io/precision": precision,
           "deepres.io/optimizer": "momentum"}
    if model:
        out["deepres.io/model"] = model
    if layers is not None:
        out["deepres.io/num-layers"] = str(layers)
    return out


def gpu_backlog(scale: float = 1.0) -> list[TrialJob]:
    """12 jobs sized for ~15 s each alone on an H100/H200 (steps from the co-location measurements'
    rates where the model is there: resnet50 b64 amp ~29 steps/s, resnet18 b128 ~45; the others
    guessed), so both modes fit one 8-minute call: input-bound ones (CPU-heavy loaders, 3 workers
    each) among GPU-bound ones, the three tasks of DeepRes's setting. `--scale` resizes them all."""
    def n(steps: int) -> int:
        return max(int(steps * scale), 1)

    def cls(name: str, model: str, params: float, batch: int, steps: int, loader_ms: float = 0.0) -> TrialJob:
        return TrialJob(name, "classification", model, batch, 224, n(steps), loader_ms, workers=3,
                        annotations=_annotations(f"torchvision/{model}", "cnn", params, batch, 224, n(steps)))

    def det(name: str, batch: int, steps: int, loader_ms: float = 0.0) -> TrialJob:
        return TrialJob(name, "detection", "fasterrcnn_mobilenet", batch, 320, n(steps), loader_ms, workers=3,
                        annotations=_annotations("", "cnn", 19.4, batch, 320, n(steps)))

    def asr(name: str, batch: int, steps: int, loader_ms: float = 0.0) -> TrialJob:
        return TrialJob(name, "speech", "conv_gru", batch, 800, n(steps), loader_ms, workers=3,
                        annotations=_annotations("", "gru", 14.0, batch, 400, n(steps), layers=3))

    return [
        cls("resnet50-b64", "resnet50", 25.6, 64, 450),
        cls("resnet50-b64-input", "resnet50", 25.6, 64, 110, loader_ms=6.0),
        cls("resnet18-b128", "resnet18", 11.7, 128, 650),
        det("fasterrcnn-b8", 8, 220),
        asr("asr-gru-b32", 32, 380),
        cls("mobilenetv3-b128-input", "mobilenet_v3_large", 5.5, 128, 90, loader_ms=3.0),
        cls("resnet18-b128-input", "resnet18", 11.7, 128, 110, loader_ms=3.0),
        det("fasterrcnn-b8-input", 8, 110, loader_ms=25.0),
        asr("asr-gru-b32-input", 32, 150, loader_ms=8.0),
        cls("resnet50-b128", "resnet50", 25.6, 128, 220),
        cls("mobilenetv3-b128", "mobilenet_v3_large", 5.5, 128, 350),
        asr("asr-gru-b64", 64, 220),
    ]


def tiny_backlog() -> list[TrialJob]:
    """Four CPU-sized jobs (seconds each): the machinery, not the figures."""
    def ann(family: str, steps: int) -> dict[str, str]:
        return _annotations("", family, 0.01, 4, 32, steps, layers=1 if family == "gru" else None, precision="fp32")

    return [
        TrialJob("tiny-cnn", "classification", "tiny_cnn", 4, 32, 50, amp=False, annotations=ann("cnn", 50)),
        TrialJob("tiny-cnn-input", "classification", "tiny_cnn", 4, 32, 10, loader_ms=5.0, workers=1, amp=False,
                 annotations=ann("cnn", 10)),
        TrialJob("tiny-detector", "detection", "tiny_detector", 4, 32, 50, amp=False, annotations=ann("cnn", 50)),
        TrialJob("tiny-gru", "speech", "tiny_gru", 4, 32, 20, amp=False, annotations=ann("gru", 20)),
    ]


class Zygote:
    """The job starter (devtools/trial_jobs.py `zygote`): torch imported once, a fork per job."""

    def __init__(self, device: str, log_path: Path, torchvision: bool) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "DEEPRES_TRIAL_TORCHVISION": "1" if torchvision else "0"}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
        self.device = device
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "devtools.trial_jobs", "--zygote"], env=env, cwd=REPO,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True)
        self.exits: dict[int, int] = {}
        self._started: queue.Queue[int] = queue.Queue()
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(300):
            raise RuntimeError(f"the job starter did not come up: {log_path.read_text(errors='replace')[-800:]}")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            word, *rest = line.split()
            if word == "ready":
                self._ready.set()
            elif word == "start":
                self._started.put(int(rest[0]))
            elif word == "exit":
                self.exits[int(rest[0])] = int(rest[1])

    def spawn(self, job: TrialJob, result: Path, log: Path) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"job": json.loads(job.to_json()), "result": str(result), "log": str(log),
                                          "device": self.device}) + "\n")
        self.proc.stdin.flush()
        return self._started.get(timeout=60)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


@dataclass
class Run:
    """One job's process in one mode."""

    job: TrialJob
    uid: str
    result_path: Path
    pid: int | None = None
    started_s: float | None = None
    ended_s: float | None = None
    rc: int | None = None
    rejected: str = ""
    duties: list[float] = field(default_factory=list)
    peak_seen_mib: float = 0.0

    @property
    def running(self) -> bool:
        return self.pid is not None and self.rc is None

    def start(self, zygote: Zygote, t0: float, log_dir: Path) -> None:
        self.pid = zygote.spawn(self.job, self.result_path, log_dir / f"{self.result_path.stem}.log")
        self.started_s = time.time() - t0

    def poll(self, zygote: Zygote, t0: float) -> bool:
        """True once the process has ended (its end time recorded)."""
        if self.pid is None:
            return False
        if self.rc is None and self.pid in zygote.exits:
            self.rc = zygote.exits[self.pid]
            self.ended_s = time.time() - t0
        return self.rc is not None

    def summary(self, solo_s: float | None) -> dict[str, Any]:
        result: dict[str, Any] = {}
        if self.result_path.is_file():
            result = json.loads(self.result_path.read_text(encoding="utf-8"))
        run_s = None if self.started_s is None or self.ended_s is None else self.ended_s - self.started_s
        ok = self.rc == 0 and not result.get("error")
        return {"job": self.job.name, "task": self.job.task, "input_bound": self.job.input_bound,
                "start_s": _r(self.started_s), "end_s": _r(self.ended_s), "jct_s": _r(self.ended_s),
                "run_s": _r(run_s), "solo_s": _r(solo_s),
                "slowdown": _r(run_s / solo_s if ok and run_s and solo_s else None, 3),
                "oom": bool(result.get("oom")), "failed": not ok, "rc": self.rc,
                "error": result.get("error", "") or self.rejected,
                "steps": result.get("steps", 0), "peak_memory_mib": result.get("peak_memory_mib"),
                "peak_memory_seen_mib": _r(self.peak_seen_mib or None),
                "mean_duty": _r(statistics.fmean(self.duties) if self.duties else None, 3)}


def _r(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def _mode_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    done = [r for r in rows if r["end_s"] is not None]
    jct = [r["jct_s"] for r in done]
    slow = [r["slowdown"] for r in done if r["slowdown"] is not None]
    return {"makespan_s": _r(max(jct) if jct else None), "mean_jct_s": _r(statistics.fmean(jct) if jct else None),
            "median_jct_s": _r(statistics.median(jct) if jct else None),
            "mean_slowdown": _r(statistics.fmean(slow) if slow else None, 3),
            "max_slowdown": _r(max(slow) if slow else None, 3),
            "ooms": sum(r["oom"] for r in rows), "failed": sum(r["failed"] for r in rows), "jobs": rows}


# ---- telemetry: what an agent on this machine would report ----

class CpuStub:
    """Stands in for NVML on a machine without a GPU: one pretend GPU whose memory is the jobs' RSS
    and whose per-process busy share is each job's CPU share over the last interval."""

    name = "cpu-stub"

    def __init__(self, memory_total_mib: float) -> None:
        self.memory_total_mib = memory_total_mib
        self._cpu: dict[int, tuple[float, float]] = {}  # pid -> (cpu seconds, wall time)

    def gpus(self, pids: list[int]) -> tuple[GpuReport, ...]:
        ticks = os.sysconf("SC_CLK_TCK")
        processes, total = [], 0.0
        for pid in pids:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                cpu_s = (int(stat[11]) + int(stat[12])) / ticks
                rss_mib = int(stat[21]) * os.sysconf("SC_PAGE_SIZE") / 2**20
            except (OSError, IndexError, ValueError):
                continue
            now = time.monotonic()
            before = self._cpu.get(pid)
            self._cpu[pid] = (cpu_s, now)
            share = None if before is None or now <= before[1] else min((cpu_s - before[0]) / (now - before[1]), 1.0)
            processes.append(ProcessReport(pid, round(rss_mib, 1), sm_util=share))
            total += rss_mib
        util = min(sum(p.sm_util or 0.0 for p in processes), 1.0)
        used = round(min(total, self.memory_total_mib), 1)
        return (GpuReport("CPU-STUB-0", 0, "cpu-stub", self.memory_total_mib, used, utilization_gpu=util,
                          processes=tuple(processes), process_samples=True),)


class Reporter:
    """Posts a NodeReport every `every_s` until stopped; remembers each running job's duty and memory."""

    def __init__(self, url: str, token: str, source: Any, runs: list[Run], every_s: float) -> None:
        self.url, self.token, self.source, self.runs, self.every_s = url, token, source, runs, every_s
        self.tracker = PodTracker(forget_after_s=every_s * 0.5, duty_window_s=30.0)
        self.sequence = 0
        self.accepted = 0
        self.errors: list[str] = []
        self.attributed = self.unattributed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.boot_id = secrets.token_hex(8)

    def start(self) -> Reporter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def report_once(self) -> None:
        running = {r.pid: r for r in self.runs if r.running and r.pid is not None}
        raw = self.source.gpus(sorted(running)) if isinstance(self.source, CpuStub) else self.source.sample().gpus

        def pod_of(pid: int) -> PodRef | None:
            run = running.get(pid)
            return PodRef(run.uid) if run is not None else None

        gpus = attribute_processes(raw, pod_of)
        for gpu in gpus:
            for p in gpu.processes:
                if p.pod_uid:
                    self.attributed += 1
                else:
                    self.unattributed += 1
        pods = self.tracker.update(gpus, time.time())
        by_uid = {r.uid: r for r in self.runs}
        for usage in pods:
            run = by_uid.get(usage.pod_uid)
            if run is not None and usage.current_memory_mib > 0:
                run.peak_seen_mib = max(run.peak_seen_mib, usage.peak_memory_mib)
        for gpu in gpus:
            for p in gpu.processes:
                if p.pod_uid in by_uid and p.sm_util is not None:
                    by_uid[p.pod_uid].duties.append(p.sm_util)
        self.sequence += 1
        report = NodeReport(NODE, self.sequence, time.time(), "trial", "simulated" if isinstance(
            self.source, CpuStub) else "nvml", gpus, pods, interval_s=self.every_s, boot_id=self.boot_id)
        try:
            _post(self.url + "/v1/telemetry", report.to_dict(), self.token)
            self.accepted += 1
        except RuntimeError as err:
            self.errors.append(str(err)[:300])

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.report_once()
            self._stop.wait(self.every_s)


def _post(url: str, body: Any, token: str | None = None, timeout: float = 30.0) -> Any:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as err:
        raise RuntimeError(f"POST {url} -> HTTP {err.code}: {err.read()[:300]!r}") from None
    except (urllib.error.URLError, OSError) as err:
        raise RuntimeError(f"POST {url}: {err}") from None


def pod_body(run: Run) -> dict[str, Any]:
    """The job's pod as kube-scheduler would send it to the extender."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": run.job.name, "namespace": NAMESPACE, "uid": run.uid,
                         "annotations": dict(run.job.annotations),
                         "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
            "spec": {"schedulerName": "deepres-scheduler", "containers": [
                {"name": "train", "image": "train", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]},
            "status": {"phase": "Pending"}}


# ---- the two modes ----

def run_static(jobs: list[TrialJob], zygote: Zygote, work: Path, progress: Any) -> list[Run]:
    t0 = time.time()
    runs = [Run(job, f"static-{k}", work / f"static-{k}.json") for k, job in enumerate(jobs)]
    for run in runs:
        run.start(zygote, t0, work)
        while not run.poll(zygote, t0):
            time.sleep(0.05)
        progress(f"static: {run.job.name} done in {(run.ended_s or 0) - (run.started_s or 0):.1f} s (rc {run.rc})")
    return runs


def run_deepres(jobs: list[TrialJob], zygote: Zygote, work: Path, progress: Any, source: Any, every_s: float,
                server_env: dict[str, str], timeout_s: float) -> tuple[list[Run], dict[str, Any]]:
    token = secrets.token_hex(16)
    env = {"DEEPRES_LOCAL_EXPIRY_S": str(LOCAL_EXPIRY_S), **server_env}
    runs = [Run(job, f"deepres-{k}-{secrets.token_hex(4)}", work / f"deepres-{k}.json") for k, job in enumerate(jobs)]
    filters = binds = 0
    reasons: dict[str, str] = {}
    with LocalServer(work, token=token, env=env, log_level="info") as server:
        reporter = Reporter(server.url, token, source, runs, every_s)
        reporter.report_once()  # the node is known before the first filter
        if not reporter.accepted:
            raise RuntimeError(f"the extender refused the telemetry: {reporter.errors[-1:]}")
        reporter.start()
        t0 = time.time()
        pending = list(runs)
        try:
            while pending or any(r.pid is not None and not r.poll(zygote, t0) for r in runs):
                if time.time() - t0 > timeout_s:
                    progress(f"deepres: stopping after {timeout_s:.0f} s with {len(pending)} jobs pending")
                    break
                for run in list(pending):
                    filters += 1
                    answer = _post(server.url + "/filter", {"Pod": pod_body(run), "Nodes": None, "NodeNames": [NODE]})
                    if answer.get("Error"):
                        run.rejected = f"filter error: {answer['Error']}"
                        reasons[run.job.name] = run.rejected
                        pending.remove(run)
                        continue
                    if NODE not in (answer.get("NodeNames") or []):
                        reasons[run.job.name] = str((answer.get("FailedNodes") or {}).get(NODE, ""))
                        continue
                    bound = _post(server.url + "/bind", {"PodName": run.job.name, "PodNamespace": NAMESPACE,
                                                         "PodUID": run.uid, "Node": NODE})
                    binds += 1
                    if bound.get("Error"):
                        reasons[run.job.name] = f"bind: {bound['Error']}"
                        continue
                    run.start(zygote, t0, work)
                    pending.remove(run)
                    progress(f"deepres: {run.job.name} bound and started at {run.started_s:.1f} s "
                             f"({sum(r.running for r in runs)} running)")
                for run in runs:
                    if run.running and run.poll(zygote, t0):
                        progress(f"deepres: {run.job.name} ended at {run.ended_s:.1f} s (rc {run.rc})")
                time.sleep(0.5)
        finally:
            reporter.stop()
            for run in runs:
                if run.running and run.pid is not None:
                    os.kill(run.pid, signal.SIGKILL)
                    deadline = time.time() + 10
                    while not run.poll(zygote, t0) and time.time() < deadline:
                        time.sleep(0.05)
    return runs, {"filters": filters, "binds": binds, "reports_accepted": reporter.accepted,
                  "report_errors": reporter.errors[-3:], "processes_attributed": reporter.attributed,
                  "processes_unattributed": reporter.unattributed, "last_refusals": reasons,
                  "server_env": env}


def _commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, check=False)
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"


def _open_source(device: str, memory_mib: float) -> tuple[Any, str, str]:
    """(sampler, what it is, the GPU's name)."""
    if device == "cpu":
        return (CpuStub(memory_mib), "stub: each job's RSS as its GPU memory and its CPU share as its duty "
                "(no NVML on this machine)", "cpu-stub")
    from extender.agent.nvml import NvmlSource

    source = NvmlSource.open()
    gpus = source.sample().gpus
    return source, "nvml: the agent's sampler (memory and per-process SM samples), processes attributed by pid", \
        (gpus[0].model if gpus else "unknown")


def _modes(jobs: list[TrialJob], modes: list[str], zygote: Zygote, work: Path, progress: Any, source: Any,
           args: argparse.Namespace, server_env: dict[str, str], out: dict[str, Any]) -> dict[str, Any]:
    """Run the modes into `out` (the report), written after each one: a run cut short keeps what it did."""
    solo: dict[str, float | None] = {}
    if "static" in modes:
        static = run_static(jobs, zygote, work, progress)
        for run_ in static:
            solo[run_.job.name] = (None if run_.ended_s is None or run_.started_s is None
                                   else run_.ended_s - run_.started_s)
        out["static"] = _mode_summary([r.summary(solo.get(r.job.name)) for r in static])
        _write(args.out, out)
    if "deepres" in modes:
        placed, extra = run_deepres(jobs, zygote, work, progress, source, args.report_every_s, server_env,
                                    args.timeout_s)
        out["deepres"] = {**_mode_summary([r.summary(solo.get(r.job.name)) for r in placed]), **extra}
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--backlog", choices=("gpu", "tiny"), default=None,
                        help="gpu: 12 real jobs (default with --device cuda); tiny: 4 CPU-sized ones")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every job's steps (gpu backlog)")
    parser.add_argument("--modes", default="static,deepres", help="static, deepres or both (default)")
    parser.add_argument("--report-every-s", type=float, default=1.0, help="telemetry interval (default 1 s)")
    parser.add_argument("--cpu-memory-mib", type=float, default=16384.0,
                        help="--device cpu: the stub GPU's memory (default 16384)")
    parser.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE",
                        help="extra DEEPRES_* settings for the extender (repeatable)")
    parser.add_argument("--timeout-s", type=float, default=240.0,
                        help="stop the deepres mode after this long (default 240 s; jobs still running are killed "
                             "and counted as failed)")
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "trial.json")


def run(args: argparse.Namespace) -> int:
    jobs = tiny_backlog() if (args.backlog or ("gpu" if args.device == "cuda" else "tiny")) == "tiny" \
        else gpu_backlog(args.scale)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in ("static", "deepres")]
    if bad or not modes:
        raise SystemExit(f"--modes: {bad or modes} not in static, deepres")
    server_env = {}
    for item in args.server_env:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("DEEPRES_"):
            raise SystemExit(f"--server-env {item!r}: KEY=VALUE with a DEEPRES_ key expected")
        server_env[key] = value

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    source, telemetry, gpu_name = _open_source(args.device, args.cpu_memory_mib)
    report: dict[str, Any] = {
        "about": "Real training jobs on one device: one at a time (static FIFO) and placed by deepres's rule "
                 "through a running extender (devtools/trial.py). JCT from submission (all jobs at 0); slowdown = "
                 "run time / the same job's static run time.",
        "command": " ".join(["python -m devtools.trial", *sys.argv[1:]]) if sys.argv[1:] else COMMAND,
        "commit": _commit(), "device": args.device, "gpu": gpu_name, "telemetry": telemetry,
        "backlog": [{"name": j.name, "task": j.task, "model": j.model, "batch": j.batch, "size": j.size,
                     "steps": j.steps, "input_bound": j.input_bound, "loader_ms_per_sample": j.loader_ms}
                    for j in jobs]}
    with tempfile.TemporaryDirectory(prefix="deepres-trial-") as tmp:
        work = Path(tmp)
        vision = ("resnet18", "resnet50", "mobilenet_v3_large", "fasterrcnn_mobilenet")
        zygote = Zygote(args.device, work / "zygote.log", torchvision=any(j.model in vision for j in jobs))
        try:
            _modes(jobs, modes, zygote, work, progress, source, args, server_env, report)
        finally:
            zygote.close()
    if "static" in report and "deepres" in report and report["static"]["makespan_s"] and \
            report["deepres"]["makespan_s"]:
        report["deepres_vs_static"] = {
            "makespan_ratio": _r(report["deepres"]["makespan_s"] / report["static"]["makespan_s"], 3),
            "mean_jct_ratio": _r(report["deepres"]["mean_jct_s"] / report["static"]["mean_jct_s"], 3)}
    _write(args.out, report)
    summary = {m: {k: report[m][k] for k in ("makespan_s", "mean_jct_s", "median_jct_s", "ooms", "failed")}
               for m in modes}
    print(json.dumps(summary, indent=2))
    progress(f"wrote {args.out}")
    return 0


def _write(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.trial", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
