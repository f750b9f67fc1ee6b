"""`deepres bench agent`: what the agent costs a GPU node.

A busy node is staged with the pynvml-shaped fake (`fakenvml.fleet`: 8 GPUs, 64 compute processes,
each in its own pod's cgroup under a temporary /proc) behind the real `NvmlSource`; the rest is the
production path: attribution, peak tracking, the report, a POST per round to a loopback sink (the
worst case: a report every interval), and a /metrics rendering every third round (a 15 s scrape at
the 5 s interval). The measured process is a fresh interpreter that imports only the agent (never
torch), so its RSS is the agent's own.

Figures (reports/bench-agent.json): `rss_mib` peak resident memory of that process;
`cpu_fraction_of_core` CPU seconds per round (sampling, reporting thread, scrape) divided by the
default 5 s interval; `sample_ms_p50`/`sample_ms_p99` wall time of one sampling round;
`report_bytes` the JSON body posted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

DEFAULT_INTERVAL_S = 5.0
KEYS = ("rss_mib", "cpu_fraction_of_core", "sample_ms_p50", "sample_ms_p99", "report_bytes")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=300, help="sampling rounds to time (after 20 warm-up rounds)")
    parser.add_argument("--gpus", type=int, default=8, help="fake GPUs on the node")
    parser.add_argument("--processes", type=int, default=64, help="fake compute processes (one pod each)")


class _Sink(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        body = b'{"accepted": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return None


def run(args: argparse.Namespace) -> int:
    if args.rounds < 10 or args.gpus < 1 or args.processes < 0:
        from extender.cli import UsageError

        raise UsageError("--rounds must be >= 10, --gpus >= 1, --processes >= 0")
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    try:
        spec = json.dumps({"url": f"http://127.0.0.1:{sink.server_address[1]}", "rounds": args.rounds,
                           "gpus": args.gpus, "processes": args.processes})
        done = subprocess.run(
            [sys.executable, "-c", "import sys; from devtools.bench_agent import worker; worker(sys.argv[1])", spec],
            capture_output=True, text=True, check=False, timeout=600,
        )
    finally:
        sink.shutdown()
        sink.server_close()
    if done.returncode != 0:
        print(f"deepres bench agent: the measured process failed:\n{done.stderr.strip()}", file=sys.stderr)
        return 1
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2) + "\n")
    if args.json:
        print(json.dumps(figures))
    else:
        print(f"agent on a fake node with {args.gpus} GPUs and {args.processes} processes, {args.rounds} rounds:")
        print(f"  RSS (peak)              {figures['rss_mib']:.1f} MiB   (target <= 80)")
        print(f"  CPU at a 5 s interval   {100 * figures['cpu_fraction_of_core']:.3f} % of one core   (target < 1 %)")
        print(f"  sampling round          p50 {figures['sample_ms_p50']:.2f} ms, p99 {figures['sample_ms_p99']:.2f} ms")
        print(f"  report body             {figures['report_bytes']} bytes")
        print(f"  written to {out}")
    return 0


def worker(spec_json: str) -> None:
    """The measured process: stage the fake node, run the rounds, print the figures as JSON."""
    from prometheus_client import generate_latest

    from extender.agent.fakenvml import FakeNvml, fleet
    from extender.agent.main import Agent, AgentSettings
    from extender.agent.metrics import AgentMetrics
    from extender.agent.nvml import NvmlSource
    from extender.agent.reporter import HttpPoster, Reporter, TokenFile, encode_report

    spec = json.loads(spec_json)
    gpus = fleet(spec["gpus"], spec["processes"])
    with tempfile.TemporaryDirectory() as tmp:
        proc = Path(tmp)
        for gpu in gpus:
            for pid, _ in gpu.processes:
                uid = f"{pid:08x}-0000-4000-8000-{pid:012x}"
                (proc / str(pid)).mkdir()
                (proc / str(pid) / "cgroup").write_text(
                    f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid.replace('-', '_')}.slice/"
                    f"cri-containerd-{pid:064x}.scope\n"
                )
        token = proc / "token"
        token.write_text("bench-token")
        settings = AgentSettings(node="bench-node", interval_s=DEFAULT_INTERVAL_S, heartbeat_s=DEFAULT_INTERVAL_S,
                                 proc_root=str(proc), change_threshold_mib=0.0)
        metrics = AgentMetrics()
        reporter = Reporter(HttpPoster(spec["url"]), TokenFile(token), on_result=metrics.count_report).start()
        clock = [1_800_000_000.0]
        agent = Agent(settings, NvmlSource.open(FakeNvml(gpus)), reporter, metrics=metrics,
                      clock=lambda: clock[0], monotonic=lambda: clock[0])
        warmup, durations = 20, []
        cpu_start = 0.0
        report = None
        for i in range(warmup + spec["rounds"]):
            if i == warmup:
                cpu_start = time.process_time()
            clock[0] += DEFAULT_INTERVAL_S
            gpus[i % len(gpus)].used_mib += 1  # keep figures moving as on a real node
            started = time.perf_counter()
            report = agent.step()
            elapsed = time.perf_counter() - started
            while reporter.delivered_sequence < report.sequence:  # one POST per round, as at 5 s
                time.sleep(0.0005)
            if i % 3 == 0:
                generate_latest(metrics.registry)
            if i >= warmup:
                durations.append(elapsed)
        cpu_per_round = (time.process_time() - cpu_start) / spec["rounds"]
        reporter.stop()
        assert report is not None
        if "torch" in sys.modules:
            raise RuntimeError("the measured agent process imported torch; the figures would not be the agent's")
        quantiles = statistics.quantiles(durations, n=100)
        figures = {
            "rss_mib": round(_peak_rss_kib() / 1024.0, 1),
            "cpu_fraction_of_core": round(cpu_per_round / DEFAULT_INTERVAL_S, 6),
            "sample_ms_p50": round(1000.0 * statistics.median(durations), 3),
            "sample_ms_p99": round(1000.0 * quantiles[98], 3),
            "report_bytes": len(encode_report(report)),
        }
    print(json.dumps({key: figures[key] for key in KEYS}))


def _peak_rss_kib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return float(line.split()[1])
    import resource

    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
