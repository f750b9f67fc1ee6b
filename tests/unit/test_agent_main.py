"""`deepres agent` wiring: one sampling round end to end (fake NVML behind the real source, a fake
/proc), report cadence and sequence numbers, the node annotation, and the command-line checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from extender.agent.fakenvml import FakeGpu, FakeNvml
from extender.agent.main import Agent, AgentSettings, parse_listen, settings_from_args
from extender.agent.nvml import NvmlSource
from extender.cli import UsageError, build_parser
from extender.telemetry import NodeReport, parse_report
from tests.fakes.procfs import make_proc_root, pod_cgroup

POD_A = "aaaaaaaa-1111-4222-8333-444444444444"
POD_B = "bbbbbbbb-1111-4222-8333-444444444444"


class Sink:
    def __init__(self) -> None:
        self.reports: list[NodeReport] = []

    def submit(self, report: NodeReport) -> None:
        self.reports.append(report)


class Annotations:
    def __init__(self) -> None:
        self.values: list[int] = []

    def publish_free_mib(self, free_mib: int) -> None:
        self.values.append(free_mib)


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture()
def node(tmp_path: Path) -> tuple[Agent, FakeNvml, Sink, Annotations, Clock]:
    proc = make_proc_root(tmp_path / "proc", {
        100: pod_cgroup(POD_A, "c" * 64), 101: pod_cgroup(POD_B, "d" * 64, qos="besteffort"), 102: "0::/init.scope\n"})
    gpus = [
        FakeGpu(uuid="GPU-0", total_mib=40960, used_mib=9000, processes=[(100, 8000), (102, 500)]),
        FakeGpu(uuid="GPU-1", total_mib=40960, used_mib=3000, processes=[(101, 2500)]),
    ]
    nvml = FakeNvml(gpus)
    clock = Clock(1_700_000_000.0)
    settings = AgentSettings(node="n1", interval_s=5, heartbeat_s=15, proc_root=str(proc), free_threshold_mib=1024,
                             annotate_min_interval_s=10)
    sink, notes = Sink(), Annotations()
    agent = Agent(settings, NvmlSource.open(nvml), sink, annotator=notes, clock=clock, monotonic=clock)
    return agent, nvml, sink, notes, clock


def test_one_round_end_to_end(node: tuple[Agent, FakeNvml, Sink, Annotations, Clock]) -> None:
    agent, _nvml, sink, notes, clock = node
    agent.step()
    (sent,) = sink.reports
    report = parse_report(sent.to_dict())  # what goes on the wire is valid for the extender
    assert report.node == "n1" and report.source == "nvml" and report.interval_s == 5
    assert report.sequence == int(clock.t * 1000)  # keeps increasing across agent restarts
    owners = {p.pid: (p.pod_uid, p.container_id) for g in report.gpus for p in g.processes}
    assert owners == {100: (POD_A, "c" * 64), 101: (POD_B, "d" * 64), 102: ("", "")}
    assert {(p.pod_uid, p.peak_memory_mib) for p in report.pods} == {(POD_A, 8000), (POD_B, 2500)}
    assert notes.values == [(40960 - 9000) + (40960 - 3000)]  # published once at start


def test_reports_on_change_or_heartbeat_only(node: tuple[Agent, FakeNvml, Sink, Annotations, Clock]) -> None:
    agent, nvml, sink, _notes, clock = node
    agent.step()
    clock.t += 5
    agent.step()  # nothing changed, heartbeat not due
    assert len(sink.reports) == 1
    nvml.gpus[0].used_mib += 300
    clock.t += 5
    agent.step()  # 300 MiB >= 256 MiB threshold
    clock.t += 15
    agent.step()  # heartbeat
    assert len(sink.reports) == 3
    sequences = [r.sequence for r in sink.reports]
    assert sequences == sorted(set(sequences)) and sequences[2] - sequences[0] == 2


def test_annotation_when_a_job_frees_memory(node: tuple[Agent, FakeNvml, Sink, Annotations, Clock]) -> None:
    agent, nvml, _sink, notes, clock = node
    agent.step()
    nvml.gpus[0].used_mib, nvml.gpus[0].processes = 1000, []  # the 8 GB job on GPU-0 ended
    clock.t += 5
    agent.step()  # freed, but within 10 s of the first annotation
    clock.t += 5
    agent.step()
    assert notes.values[1:] == [(40960 - 1000) + (40960 - 3000)]


def test_unresponsive_source_is_unhealthy_and_does_not_annotate(
    node: tuple[Agent, FakeNvml, Sink, Annotations, Clock],
) -> None:
    agent, nvml, sink, notes, clock = node
    agent.step()
    nvml.count_error = "TIMEOUT"
    clock.t += 30
    agent.step()
    assert agent.health.check(clock.t)[0] is False
    assert notes.values[1:] == []
    assert [g.healthy for g in sink.reports[-1].gpus] == [False, False]  # the extender hears about it


def _args(*argv: str) -> AgentSettings:
    return settings_from_args(build_parser("agent").parse_args(["agent", *argv]))


def test_command_line_defaults_follow_the_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "gpu-node-7")
    settings = _args()
    assert (settings.node, settings.source, settings.interval_s, settings.heartbeat_s, settings.listen) == (
        "gpu-node-7", "nvml", 5.0, 15.0, "0.0.0.0:9400")
    assert settings.extender_url == "http://127.0.0.1:8888"
    assert settings.token_file == "/var/run/secrets/deepres/token"


def test_command_line_errors_are_gathered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    with pytest.raises(UsageError) as caught:
        _args("--source", "simulated", "--simulated-gpus", "lots", "--interval-s", "0", "--listen", "nope",
              "--token-file", "/nonexistent/token", "--extender-url", "ftp://x")
    message = str(caught.value)
    for needle in ("--node-name", "--simulated-gpus", "--interval-s", "--listen", "--token-file", "--extender-url"):
        assert needle in message


def test_no_kube_defaults_the_node_to_the_host_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert _args("--no-kube").node


@pytest.mark.parametrize(("text", "expected"), [("0.0.0.0:9400", ("0.0.0.0", 9400)), ("[::]:1", ("::", 1)),
                                                (":9400", ("0.0.0.0", 9400))])
def test_parse_listen(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize("source", ["fake", "fakenvml", "auto"])
def test_the_fake_nvml_is_not_a_source(source: str) -> None:
    with pytest.raises(SystemExit) as caught:
        build_parser("agent").parse_args(["agent", "--source", source])
    assert caught.value.code == 2


def test_a_failing_round_does_not_end_the_loop() -> None:
    import threading

    from extender.agent.sources import Sample
    from extender.telemetry import GpuReport

    stop = threading.Event()

    class Flaky:
        name = "simulated"
        calls = 0

        def sample(self) -> Sample:
            self.calls += 1
            if self.calls == 4:
                stop.set()
            if self.calls == 2:
                raise RuntimeError("a bug in one round")
            used = 1000.0 * self.calls  # every round differs enough to be reported
            gpu = GpuReport(uuid="GPU-0", index=0, model="m", memory_total_mib=9e4, memory_used_mib=used)
            return Sample(gpus=(gpu,))

        def close(self) -> None:
            pass

    source, sink = Flaky(), Sink()
    agent = Agent(AgentSettings(node="n1", interval_s=0.1, heartbeat_s=60), source, sink)
    agent.run(stop)
    assert source.calls == 4
    assert len(sink.reports) == 3  # rounds 1, 3 and 4 reported; round 2 was logged and skipped


def test_the_free_memory_nudge_waits_for_the_report_that_shows_it(tmp_path: Path) -> None:
    """The Node patch is kube-scheduler's cue to retry the pods it set aside: it must not overtake the
    report that shows the freed memory (the extender would refuse the retried pod on the old telemetry,
    and no event would be left to wake it). Through the agent's real Reporter; only the HTTP post is
    stood in for, held until the test lets the extender answer."""
    import threading

    from extender.agent.reporter import Delivery, Reporter, TokenFile

    let_through = threading.Event()
    posted: list[bytes] = []

    def post(body: bytes, token: str | None) -> Delivery:
        posted.append(body)
        let_through.wait(30)
        return Delivery("ok", 200, "")

    published = threading.Event()

    class Notes(Annotations):
        def publish_free_mib(self, free_mib: int) -> None:
            super().publish_free_mib(free_mib)
            published.set()

    nvml = FakeNvml([FakeGpu(uuid="GPU-0", total_mib=40960, used_mib=9000, processes=[])])
    clock = Clock(1_700_000_000.0)
    settings = AgentSettings(node="n1", interval_s=5, heartbeat_s=15, proc_root=str(make_proc_root(tmp_path / "p", {})),
                             free_threshold_mib=1024, annotate_min_interval_s=10)
    reporter = Reporter(post, TokenFile(None)).start()
    notes = Notes()
    agent = Agent(settings, NvmlSource.open(nvml), reporter, annotator=notes, clock=clock, monotonic=clock)
    try:
        agent.step()  # the first report, and the first annotation: after that report only
        assert not published.is_set() and notes.values == []  # the extender has not answered yet
        let_through.set()
        assert published.wait(30), "the nudge never followed the report's delivery"
        assert notes.values == [40960 - 9000] and reporter.delivered_sequence == agent.last_sent.sequence  # type: ignore[union-attr]
        published.clear()
        let_through.clear()
        nvml.gpus[0].used_mib = 1000  # a job ended: 8 GB freed
        clock.t += 15
        agent.step()
        assert not published.is_set() and notes.values == [40960 - 9000]
        let_through.set()
        assert published.wait(30) and notes.values == [40960 - 9000, 40960 - 1000]
    finally:
        let_through.set()
        reporter.stop()
