"""`deepres agent`: sample this node's GPUs every interval, report to the extender, serve /metrics.

Wiring only: the sampling round (`Agent.step`) calls the source, attributes processes to pods,
tracks peaks and decides whether to report or to nudge the scheduler (pure helpers in `tracking`);
delivery, pod listing and the node annotation run on their own threads so sampling never waits on
the network.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from extender.agent import AGENT_VERSION
from extender.agent.cgroups import CachedPodLookup, CgroupReader, PodRef
from extender.agent.deviceplugin import KUBELET_PLUGIN_DIR, POD_RESOURCES_SOCKET, RESOURCE_NAME, TOOLKIT_CONFIG
from extender.agent.deviceplugin.allocation import DEFAULT_CDI_KIND, STRATEGIES
from extender.agent.deviceplugin.settings import PluginSettings
from extender.agent.kube import (
    FilePods,
    KubeNodeAnnotator,
    KubePods,
    NodeAnnotator,
    NoPods,
    NullAnnotator,
    PodLister,
    core_api,
)
from extender.agent.metrics import AgentMetrics, Health, make_app, serve
from extender.agent.nvml import NvmlSource
from extender.agent.reporter import HttpPoster, Reporter, ReportSink, TokenFile
from extender.agent.simulated import SPEC_EXAMPLE, SimulatedSource, parse_gpu_spec
from extender.agent.sources import SOURCE_NAMES, GpuSource, SourceUnavailable
from extender.agent.tracking import (
    FreeMemoryTrigger,
    PodTracker,
    attribute_processes,
    free_memory_mib,
    significant_change,
)
from extender.cli import EXIT_FAILURE, EXIT_OK, UsageError
from extender.telemetry import GpuReport, NodeReport
from predictor.parsing import ascii_digits

log = logging.getLogger(__name__)

DEFAULT_TOKEN_FILE = "/var/run/secrets/deepres/token"
DEFAULT_SIMULATED_GPUS = "2xA100-40GB"


@dataclass(frozen=True)
class AgentSettings:
    """Everything `deepres agent` is told; see `add_arguments` for the why of each default."""

    node: str
    extender_url: str = "http://127.0.0.1:8888"
    source: str = "nvml"
    simulated_gpus: str = DEFAULT_SIMULATED_GPUS
    simulated_pods_file: str = ""  # --no-kube: pods for the simulated source, re-read on change
    interval_s: float = 5.0
    heartbeat_s: float = 15.0
    token_file: str = ""
    listen: str = "0.0.0.0:9400"
    no_kube: bool = False
    proc_root: str = "/proc"
    change_threshold_mib: float = 256.0
    free_threshold_mib: float = 1024.0
    annotate_min_interval_s: float = 10.0
    forget_pods_after_s: float = 600.0
    request_timeout_s: float = 5.0
    ca_file: str = ""
    seed: int = 0
    report_failure_grace_s: float = 60.0  # /healthz turns 503 when reports have failed this long
    device_plugin: bool = False
    device_plugin_dir: str = KUBELET_PLUGIN_DIR
    device_plugin_resource: str = RESOURCE_NAME
    device_plugin_slots: int = 16
    device_list_strategy: str = "volume-mounts"
    pod_resources_socket: str = POD_RESOURCES_SOCKET
    cdi_kind: str = DEFAULT_CDI_KIND
    toolkit_config: str = TOOLKIT_CONFIG
    cdi_dirs: str = "/etc/cdi,/var/run/cdi"

    def plugin_settings(self) -> PluginSettings:
        return PluginSettings(node=self.node, plugin_dir=self.device_plugin_dir, resource=self.device_plugin_resource,
                              slots_per_gpu=self.device_plugin_slots, strategy=self.device_list_strategy,
                              cdi_kind=self.cdi_kind)

    def problems(self) -> list[str]:
        """Every invalid setting, each with the flag, the value and what is accepted."""
        found = []
        if self.source not in SOURCE_NAMES:
            found.append(f"--source must be one of {', '.join(SOURCE_NAMES)}, got {self.source!r}")
        if not self.node:
            found.append("--node-name is empty: set it or NODE_NAME (downward API: spec.nodeName)")
        if not self.extender_url.startswith(("http://", "https://")):
            found.append(f"--extender-url must start with http:// or https://, got {self.extender_url!r}")
        if not 0.1 <= self.interval_s <= 3600:
            found.append(f"--interval-s must be in [0.1, 3600], got {self.interval_s:g}")
        if self.heartbeat_s < self.interval_s:
            found.append(f"--heartbeat-s must be >= --interval-s ({self.interval_s:g}), got {self.heartbeat_s:g}")
        if self.source == "simulated":
            try:
                parse_gpu_spec(self.simulated_gpus)
            except ValueError as err:
                found.append(f"--simulated-gpus: {err}")
        try:
            parse_listen(self.listen)
        except ValueError as err:
            found.append(f"--listen: {err}")
        for flag, value in (("--change-threshold-mib", self.change_threshold_mib),
                            ("--free-threshold-mib", self.free_threshold_mib),
                            ("--annotate-min-interval-s", self.annotate_min_interval_s),
                            ("--forget-pods-after-s", self.forget_pods_after_s),
                            ("--request-timeout-s", self.request_timeout_s),
                            ("--report-failure-grace-s", self.report_failure_grace_s)):
            if not value >= 0:
                found.append(f"{flag} must be >= 0, got {value:g}")
        if self.device_plugin:
            found.extend(self.plugin_settings().problems())
            if self.no_kube:
                found.append("--device-plugin needs the API server (Allocate reads the pods bound to this node)")
        return found


def on_preflight(api: Any, node: str, problems: list[str], metrics: AgentMetrics) -> None:
    """The device plugin's preflight changed its verdict: the metric, and a Warning Event on the Node
    while the plugin does not advertise (kubectl describe node shows why)."""
    metrics.device_plugin_advertising.set(0 if problems else 1)
    if not problems:
        return
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    event = {"metadata": {"generateName": f"{node}.deepres-"}, "type": "Warning",
             "reason": "DeepresDevicePluginNotAdvertised", "message": "; ".join(problems)[:1000],
             "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node},
             "source": {"component": "deepres-agent", "host": node}, "firstTimestamp": now, "lastTimestamp": now,
             "count": 1}
    try:
        api.create_namespaced_event("default", event)
    except Exception as err:  # the log line and the metric say it too
        log.warning("cannot record the preflight's Event on node %s: %s", node, err)


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 as `[::]:9400`) -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not ascii_digits(port) or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


class GpuSink(Protocol):
    def update_gpus(self, gpus: Sequence[GpuReport]) -> None:
        """A sampling round's GPUs (the device plugin's device list and health)."""
        ...


class Agent:
    """One node's sampling loop. Collaborators are injected so tests drive `step()` directly."""

    def __init__(
        self,
        settings: AgentSettings,
        source: GpuSource,
        reporter: ReportSink,
        *,
        pods: PodLister | None = None,
        annotator: NodeAnnotator | None = None,
        metrics: AgentMetrics | None = None,
        health: Health | None = None,
        pod_of: Callable[[int], PodRef | None] | None = None,
        devices: GpuSink | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.source = source
        self.devices = devices
        self.reporter = reporter
        self.pods = pods or NoPods()
        self.annotator = annotator or NullAnnotator()
        self.metrics = metrics or AgentMetrics()
        self.health = health or Health(max_age_s=max(3 * settings.interval_s, 15.0))
        self.pod_lookup = CachedPodLookup(pod_of or CgroupReader(settings.proc_root).pod_of)
        self.clock, self.monotonic = clock, monotonic
        self.tracker = PodTracker(settings.forget_pods_after_s)
        self.trigger = FreeMemoryTrigger(settings.free_threshold_mib, settings.annotate_min_interval_s)
        # sequence numbers start from the wall clock in ms so they keep increasing across restarts
        self.next_sequence = int(clock() * 1000)
        self.boot_id = uuid.uuid4().hex  # a new epoch per start: the extender orders reports within it
        # a free-memory nudge waiting for the report that shows that memory: (MiB, that report's sequence)
        self._nudge: tuple[int, int] | None = None
        self._nudge_lock = threading.Lock()
        on_delivered = getattr(reporter, "on_delivered", None)
        if callable(on_delivered):
            on_delivered(self._delivered)
        self.last_sent: NodeReport | None = None
        self._last_sent_s = float("-inf")

    def step(self) -> NodeReport:
        """One round: sample, attribute, track, publish metrics, report if due, nudge if memory freed."""
        started = self.monotonic()
        sample = self.source.sample()
        if self.devices is not None:  # the device plugin streams the GPUs' health to the kubelet
            self.devices.update_gpus(sample.gpus)
        self.pod_lookup.next_round()
        gpus = attribute_processes(sample.gpus, self.pod_lookup)
        now_s = self.clock()
        report = NodeReport(
            node=self.settings.node,
            sequence=self.next_sequence,
            timestamp_s=now_s,
            agent_version=AGENT_VERSION,
            source=self.source.name,
            gpus=gpus,
            pods=self.tracker.update(gpus, now_s),
            interval_s=self.settings.interval_s,
            boot_id=self.boot_id,
            driver_version=str(getattr(self.source, "driver_version", "")),
            cuda_version=str(getattr(self.source, "cuda_version", "")),
        )
        done = self.monotonic()
        self.metrics.sample_seconds.observe(done - started)
        self.health.record(sample.responsive, sample.error, done)
        pods = self.pods.pods()
        self.metrics.update(report, {p.uid: (p.namespace, p.name) for p in pods})
        due = done - self._last_sent_s >= self.settings.heartbeat_s
        if due or significant_change(self.last_sent, report, self.settings.change_threshold_mib):
            self.reporter.submit(report)
            self.next_sequence += 1
            self.last_sent, self._last_sent_s = report, done
        if sample.responsive:
            value = self.trigger.observe(free_memory_mib(gpus), done)
            if value is not None:
                self._nudge_after_delivery(value)
        return report

    def _nudge_after_delivery(self, free_mib: int) -> None:
        """Publish `free_mib` on the Node (kube-scheduler's cue to retry the pods it set aside) once the
        extender has the report that shows it: the last one submitted. The two go out on threads of
        their own, and a Node patch that overtakes its report can have kube-scheduler retry against the
        old telemetry: the pod is refused again, with no event left to wake it for up to
        kube-scheduler's 5 minutes. A sink that says nothing of deliveries (tests, no extender)
        publishes at once."""
        delivered = getattr(self.reporter, "delivered_sequence", None)
        if not isinstance(delivered, int):
            self.annotator.publish_free_mib(free_mib)
            return
        with self._nudge_lock:  # the newest value wins, as on the Node
            self._nudge = (free_mib, self.last_sent.sequence if self.last_sent is not None else -1)
        self._delivered(getattr(self.reporter, "delivered_sequence", -1))  # delivered already, or meanwhile

    def _delivered(self, sequence: int) -> None:
        """The extender accepted the report `sequence` (the reporter's thread): a nudge waiting for it goes."""
        with self._nudge_lock:
            nudge = self._nudge
            if nudge is None or sequence < nudge[1]:
                return
            self._nudge = None
        self.annotator.publish_free_mib(nudge[0])

    def run(self, stop: threading.Event) -> None:
        """Step every interval on a fixed schedule (a slow round does not shift the next ones)."""
        next_s = self.monotonic()
        while not stop.is_set():
            try:
                self.step()
            except Exception:  # a bug in one round must not end the agent: log it, try the next
                log.exception("sampling round failed")
            next_s += self.settings.interval_s
            now = self.monotonic()
            if next_s < now:  # fell behind (e.g. a hung NVML call): skip, do not burst
                next_s = now
            stop.wait(next_s - now)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--extender-url", default="http://127.0.0.1:8888", help="extender base URL")
    parser.add_argument("--node-name", default=None,
                        help="this node's name (default: env NODE_NAME; with --no-kube, the host name)")
    parser.add_argument("--source", default="nvml", choices=SOURCE_NAMES,
                        help="nvml (default, the only production source) or simulated (kind/local runs)")
    parser.add_argument("--simulated-gpus", default=DEFAULT_SIMULATED_GPUS,
                        help=f"GPUs of the simulated source, e.g. {SPEC_EXAMPLE}")
    parser.add_argument("--simulated-pods", default="", metavar="FILE",
                        help="--no-kube only: pods (PodList YAML/JSON) whose predicted memory the simulated GPUs hold")
    parser.add_argument("--interval-s", type=float, default=5.0, help="sampling period (s)")
    parser.add_argument("--heartbeat-s", type=float, default=15.0,
                        help="report at least this often even without change (s)")
    parser.add_argument("--token-file", default=None,
                        help=f"bearer token for the extender (default {DEFAULT_TOKEN_FILE}, the projected "
                        "ServiceAccount token, audience deepres-extender); re-read when it changes")
    parser.add_argument("--listen", default="0.0.0.0:9400", help="HOST:PORT for /metrics and /healthz")
    parser.add_argument("--no-kube", action="store_true",
                        help="no API server: no pod names, no node annotation, simulated pods from --simulated-pods")
    parser.add_argument("--proc-root", default="/proc", help="where /proc/<pid>/cgroup is read (hostPID)")
    parser.add_argument("--change-threshold-mib", type=float, default=256.0,
                        help="report before the heartbeat when a GPU's used memory moves this much")
    parser.add_argument("--free-threshold-mib", type=float, default=1024.0,
                        help="annotate the node when its free GPU memory grows by more than this")
    parser.add_argument("--annotate-min-interval-s", type=float, default=10.0,
                        help="at most one node annotation per this many seconds")
    parser.add_argument("--forget-pods-after-s", type=float, default=600.0,
                        help="keep reporting a gone pod's peak this long")
    parser.add_argument("--request-timeout-s", type=float, default=5.0, help="timeout of one report POST")
    parser.add_argument("--extender-ca-file", default="", help="CA bundle for an https:// extender")
    parser.add_argument("--seed", type=int, default=0, help="noise seed of the simulated source")
    parser.add_argument("--report-failure-grace-s", type=float, default=60.0,
                        help="/healthz answers 503 once reports have kept failing this long (/livez does not)")
    parser.add_argument("--device-plugin", action="store_true",
                        help="serve the kubelet device plugin: advertise the GPUs as --device-plugin-resource and "
                        "hand each container exactly its pod's deepres.io/assigned-gpus")
    parser.add_argument("--device-plugin-dir", default=KUBELET_PLUGIN_DIR,
                        help="the kubelet's device plugin folder (kubelet.sock; our socket goes there)")
    parser.add_argument("--device-plugin-resource", default=RESOURCE_NAME, help="the extended resource advertised")
    parser.add_argument("--device-plugin-slots", type=int, default=16,
                        help="devices advertised per GPU: the most deepres containers one GPU may take")
    parser.add_argument("--device-list-strategy", default="volume-mounts", choices=STRATEGIES,
                        help="how Allocate hands the GPUs to the runtime: volume-mounts (default: read by the NVIDIA "
                        "runtime with accept-nvidia-visible-devices-as-volume-mounts, hardened nodes), cdi (CDI "
                        "device names), envvar (NVIDIA_VISIBLE_DEVICES)")
    parser.add_argument("--toolkit-config", default=TOOLKIT_CONFIG,
                        help="the NVIDIA container toolkit's config.toml as the agent sees it: the preflight checks "
                        "that the device-list strategy's setting is on before the plugin advertises")
    parser.add_argument("--cdi-dirs", default="/etc/cdi,/var/run/cdi",
                        help="comma-separated folders of the node's CDI specs (the cdi strategy's preflight)")
    parser.add_argument("--pod-resources-socket", default=POD_RESOURCES_SOCKET,
                        help="the kubelet's PodResources socket: what it has allocated, read at each Allocate "
                        "(hostPath in the agent pod)")
    parser.add_argument("--cdi-kind", default=DEFAULT_CDI_KIND, help="CDI kind of the device names (cdi strategy)")


def settings_from_args(args: argparse.Namespace) -> AgentSettings:
    """Settings from the command line; UsageError lists every problem."""
    node = args.node_name if args.node_name is not None else os.environ.get("NODE_NAME", "")
    if not node and args.no_kube:
        node = socket.gethostname()
    token_file = args.token_file
    problems = []
    if token_file is not None and not Path(token_file).is_file():
        problems.append(f"--token-file {token_file}: no such file")
    if args.simulated_pods and not args.no_kube:
        problems.append("--simulated-pods is for --no-kube runs; in a cluster the pods come from the API")
    settings = AgentSettings(
        node=node,
        extender_url=args.extender_url,
        source=args.source,
        simulated_gpus=args.simulated_gpus,
        simulated_pods_file=args.simulated_pods,
        interval_s=args.interval_s,
        heartbeat_s=args.heartbeat_s,
        token_file=token_file if token_file is not None else DEFAULT_TOKEN_FILE,
        listen=args.listen,
        no_kube=args.no_kube,
        proc_root=args.proc_root,
        change_threshold_mib=args.change_threshold_mib,
        free_threshold_mib=args.free_threshold_mib,
        annotate_min_interval_s=args.annotate_min_interval_s,
        forget_pods_after_s=args.forget_pods_after_s,
        request_timeout_s=args.request_timeout_s,
        ca_file=args.extender_ca_file,
        seed=args.seed,
        report_failure_grace_s=args.report_failure_grace_s,
        device_plugin=args.device_plugin,
        device_plugin_dir=args.device_plugin_dir,
        device_plugin_resource=args.device_plugin_resource,
        device_plugin_slots=args.device_plugin_slots,
        device_list_strategy=args.device_list_strategy,
        pod_resources_socket=args.pod_resources_socket,
        toolkit_config=args.toolkit_config,
        cdi_dirs=args.cdi_dirs,
        cdi_kind=args.cdi_kind,
    )
    problems.extend(settings.problems())
    if problems:
        raise UsageError("; ".join(problems))
    return settings


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    api: Any = None
    pods: PodLister = NoPods()
    annotator: NodeAnnotator = NullAnnotator()
    threads: list[Any] = []
    if settings.no_kube:
        if settings.simulated_pods_file:
            pods = FilePods(settings.simulated_pods_file)
    else:
        try:
            api = core_api()
        except Exception as err:
            log.error("cannot load Kubernetes credentials (%s); outside a cluster use --no-kube", err)
            return EXIT_FAILURE
        kube_pods = KubePods(api, settings.node).start()
        kube_annotator = KubeNodeAnnotator(api, settings.node).start()
        pods, annotator = kube_pods, kube_annotator
        threads += [kube_pods, kube_annotator]
    source: GpuSource
    try:
        if settings.source == "nvml":
            source = NvmlSource.open()
        else:
            source = SimulatedSource(settings.node, parse_gpu_spec(settings.simulated_gpus), pods, seed=settings.seed)
    except SourceUnavailable as err:
        log.error("%s", err)
        return EXIT_FAILURE
    token = TokenFile(settings.token_file)
    if token.get() is None:
        log.warning("no token in %s: reports go without one (the extender will refuse them if it wants one)",
                    settings.token_file)
    metrics = AgentMetrics()
    health = Health(max_age_s=max(3 * settings.interval_s, 15.0), delivery_grace_s=settings.report_failure_grace_s)

    def on_result(result: str) -> None:
        metrics.count_report(result)
        delivery = reporter.last_delivery  # set before the callback (not for "superseded", which is ignored)
        health.record_delivery(result, delivery.detail if delivery is not None else "", time.monotonic())

    reporter = Reporter(
        HttpPoster(settings.extender_url, settings.request_timeout_s, settings.ca_file or None),
        token,
        on_result=on_result,
    ).start()
    plugin_server = None
    if settings.device_plugin:
        from extender.agent.deviceplugin.plugin import (
            DevicePlugin,
            HttpHandshake,
            KubeNodePods,
            PluginServer,
            PodResourcesClient,
            Preflight,
        )

        plugin = DevicePlugin(settings.plugin_settings(), KubeNodePods(api, settings.node),
                              PodResourcesClient(settings.pod_resources_socket),
                              HttpHandshake(settings.extender_url, token, settings.request_timeout_s,
                                            settings.ca_file or None))
        plugin.update_gpus(source.sample().gpus)  # the first list the kubelet sees is the real one
        plugin_server = PluginServer(plugin)
        plugin_server.preflight = Preflight(
            settings.plugin_settings(), simulated=settings.source != "nvml",
            read_allocatable=lambda: dict(api.read_node(settings.node).status.allocatable or {}),
            toolkit_path=settings.toolkit_config, cdi_dirs=[d for d in settings.cdi_dirs.split(",") if d],
            on_change=lambda problems: on_preflight(api, settings.node, problems, metrics))
        plugin_server.start()
        threads.append(plugin_server)
    agent = Agent(settings, source, reporter, pods=pods, annotator=annotator, metrics=metrics, health=health,
                  devices=plugin_server.plugin if plugin_server is not None else None)
    host, port = parse_listen(settings.listen)
    try:
        server, _ = serve(make_app(metrics, agent.health), host, port)
    except OSError as err:
        log.error("cannot listen on %s: %s", settings.listen, err)
        reporter.stop(0.1)
        source.close()
        return EXIT_FAILURE
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info(
        "agent %s on node %s: source=%s interval=%gs heartbeat=%gs extender=%s token_file=%s metrics=http://%s:%d "
        "kube=%s proc_root=%s", AGENT_VERSION, settings.node, source.name, settings.interval_s, settings.heartbeat_s,
        settings.extender_url, settings.token_file, host, server.server_port, not settings.no_kube, settings.proc_root,
    )
    try:
        agent.run(stop)
    finally:
        server.shutdown()
        reporter.stop(settings.request_timeout_s)
        for thread in threads:
            thread.stop()
        source.close()
    return EXIT_OK
