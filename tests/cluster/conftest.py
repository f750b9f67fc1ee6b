"""The local control plane the cluster suite runs against, with the chart installed for real.

Why: the real kube-scheduler must call deepres and the extender must speak to a real API server.
Once per test run: devtools.localcluster starts etcd, kube-apiserver, kube-controller-manager, the
default kube-scheduler and kwok on loopback; kwok nodes named like the kind suite's workers get the
simulated GPUs of tests/e2e/values-kind.yaml; `helm install` puts the chart in (every object admitted
by the API server); then the chart's own pods (the deepres-scheduler pod: kube-scheduler + the
extender sidecar; one agent pod per GPU node) are run as local processes from their pod objects
(devtools.localpods: their args, env, ConfigMaps and tokens bound to them), so the chart's
KubeSchedulerConfiguration, settings and RBAC are what is tested.

DEEPRES_CLUSTER_KEEP=DIR keeps the control plane's folder (logs, certificates) in DIR afterwards;
DEEPRES_CLUSTER_HELM_SET="key=value ..." adds chart values (e.g. to see a scenario fail with an old default).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.localchart import (
    CPU_NODE,
    GPU_LABEL,
    VALUES,
    agent_container,
    node_body,
    scheduler_pod_containers,
)
from devtools.localcluster import ControlPlane, free_port, start_process, stop_pid
from devtools.realnode import RealNode
from extender.agent.simulated import parse_gpu_spec
from tests.e2e.scenarios import (  # noqa: F401  (clean, priority_classes: the scenarios' fixtures, used here)
    JOBS_NAMESPACE,
    NAMESPACE,
    RELEASE,
    REPO,
    PodReads,
    clean,
    priority_classes,
    wait_for,
)

SCHEDULER_SELECTOR = "app.kubernetes.io/component=scheduler"
AGENT_SELECTOR = "app.kubernetes.io/component=agent"


def helm() -> str:
    found = shutil.which("helm") or str(REPO / ".venv" / "bin" / "helm")
    if not Path(found).exists():
        pytest.fail("helm not found: `make tools` installs it into .venv/bin")
    return found


@dataclass
class LocalPod:
    """The local processes running one pod's containers. Like the kubelet (restartPolicy Always), the
    cluster restarts a container whose process exited unless the pod was stopped or `supervised` is off
    (kube-scheduler exits when it loses its lease, e.g. while the API server is down)."""

    name: str
    logs: Path
    pids: dict[str, int] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    commands: dict[str, tuple[list[str], dict[str, str]]] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    supervised: bool = True

    def run(self, container: str, argv: list[str], env: dict[str, str]) -> None:
        self.commands[container] = (argv, env)
        self.pids[container] = start_process(f"{self.name}-{container}", argv, self.logs, env, cwd=REPO).pid

    def restart_exited(self) -> None:
        for container, pid in list(self.pids.items()):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done and self.supervised:
                self.restarts[container] = self.restarts.get(container, 0) + 1
                self.run(container, *self.commands[container])

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.supervised = False
        for pid in self.pids.values():
            stop_pid(pid, sig=sig)


@dataclass
class LocalCluster(PodReads):
    """The control plane, the API clients, and the chart's pods running locally."""

    plane: ControlPlane
    core: Any
    scheduling: Any
    simulated_gpus: dict[str, str]
    extender_port: int
    #: the chart's MutatingAdmissionPolicy adds schedulerName and the GPU request: pods carry annotations only
    mutating_admission: bool = True
    scheduler: LocalPod | None = None
    #: kube-scheduler's extender entry (urlPrefix, tlsConfig with local paths), read at its start
    scheduler_extender: dict[str, Any] = field(default_factory=dict)
    agents: dict[str, LocalPod] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopped: threading.Event = field(default_factory=threading.Event)

    def supervise(self) -> None:
        """The kubelet's restart loop for every local pod, until stop_all()."""
        while not self.stopped.wait(1.0):
            with self.lock:
                for local in [self.scheduler, *self.agents.values()]:
                    if local is not None:
                        local.restart_exited()

    # ---- the scenario interface ----
    def http(self, url: str, timeout_s: float = 5.0) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as resp:
                return int(resp.status), resp.read().decode()
        except urllib.error.HTTPError as err:
            return int(err.code), err.read().decode(errors="replace")
        except OSError:
            return 0, ""

    def verb(self, verb: str, body: dict[str, Any], timeout_s: float = 30.0) -> tuple[int, Any]:
        """POST an extender verb as kube-scheduler does: to the extender's own scheduler port, with the
        scheduler's client certificate where the chart's per-pod mTLS is on (the main port refuses verbs)."""
        ext = self.scheduler_extender
        assert ext, "the scheduler pod has not started"
        tls = ext.get("tlsConfig") or {}
        context = None
        if ext.get("enableHTTPS"):
            context = ssl.create_default_context(cafile=tls.get("caFile"))
            if tls.get("certFile"):
                context.load_cert_chain(tls["certFile"], tls["keyFile"])
        request = urllib.request.Request(f"{str(ext['urlPrefix']).rstrip('/')}/{verb}", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s, context=context) as resp:
                return int(resp.status), json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            return int(err.code), json.loads(err.read() or b"null")

    def extender_metrics(self) -> str:
        status, text = self.http(f"http://127.0.0.1:{self.extender_port}/metrics")
        assert status == 200, f"extender /metrics answered {status}"
        return text

    def agent_metrics(self, node: str) -> str:
        status, text = self.http(f"http://127.0.0.1:{self.agents[node].ports['metrics']}/metrics")
        assert status == 200, f"agent of {node}: /metrics answered {status}"
        return text

    def extender_ready(self) -> bool:
        return self.http(f"http://127.0.0.1:{self.extender_port}/readyz", 2.0)[0] == 200

    # ---- the chart's pods as processes ----
    def _running_pod(self, selector: str, node: str | None = None, timeout_s: float = 120) -> dict[str, Any]:
        def find() -> dict[str, Any] | None:
            for pod in self.core.list_namespaced_pod(NAMESPACE, label_selector=selector).items:
                if pod.metadata.deletion_timestamp is None and pod.status.phase == "Running" and (
                        node is None or pod.spec.node_name == node):
                    result: dict[str, Any] = self.core.api_client.sanitize_for_serialization(pod)
                    return result
            return None

        found: dict[str, Any] = wait_for(f"a running pod {selector} {node or ''}", find, timeout_s, 0.5)
        return found

    def start_scheduler_pod(self) -> LocalPod:
        """kube-scheduler and its extender sidecar from the chart's scheduler pod; returns when ready."""
        pod = self._running_pod(SCHEDULER_SELECTOR)
        local = LocalPod(pod["metadata"]["name"], self.plane.logs)
        local.ports["scheduler"] = free_port()
        commands, config = scheduler_pod_containers(self.core, self.plane, pod, local.ports["scheduler"])
        for container, argv, env in commands:
            local.run(container, argv, env)
        self.scheduler_extender = yaml.safe_load(config.read_text())["extenders"][0]
        with self.lock:
            self.scheduler = local
        wait_for("the extender to be ready", self.extender_ready, 120, 0.5)
        wait_for("kube-scheduler to lead", lambda: self.scheduler_leads(local), 60, 0.5)
        return local

    def scheduler_leads(self, local: LocalPod) -> bool:
        log = (self.plane.logs / f"{local.name}-kube-scheduler.log").read_text(errors="replace")
        return "Successfully acquired lease" in log

    def stop_scheduler_pod(self, *, hard: bool = False, delete_pod: bool = True) -> None:
        """Stop the pod's processes (SIGKILL to the whole process tree when `hard`, else SIGTERM) and
        delete the pod, as a node loss or `kubectl delete pod` would; the Deployment makes a new one."""
        with self.lock:
            local, self.scheduler = self.scheduler, None
        if local is None:
            return
        local.stop(signal.SIGKILL if hard else signal.SIGTERM)
        if delete_pod:
            self.core.delete_namespaced_pod(local.name, NAMESPACE, grace_period_seconds=0)

    def start_agent(self, node: str) -> LocalPod:
        pod = self._running_pod(AGENT_SELECTOR, node)
        local = LocalPod(pod["metadata"]["name"], self.plane.logs)
        local.ports["metrics"] = free_port()
        argv, env = agent_container(self.core, self.plane, pod, local.ports["metrics"])
        local.run("agent", argv, env)
        with self.lock:
            self.agents[node] = local
        wait_for(f"agent of {node} serving", lambda: self.http(
            f"http://127.0.0.1:{local.ports['metrics']}/healthz", 2.0)[0] == 200, 60, 0.5)
        return local

    def stop_agent(self, node: str, *, delete_pod: bool = True) -> None:
        with self.lock:
            local = self.agents.pop(node, None)
        if local is None:
            return
        local.stop()
        if delete_pod:
            self.core.delete_namespaced_pod(local.name, NAMESPACE, grace_period_seconds=0)

    def restart_scheduler_pod(self, while_down: Callable[[], None] = lambda: None, *, hard: bool = False) -> float:
        """Down, `while_down()`, back up from the new pod the Deployment made; returns when the extender
        turned ready (time.monotonic())."""
        self.stop_scheduler_pod(hard=hard)
        while_down()
        self.start_scheduler_pod()
        return time.monotonic()

    def stop_all(self) -> None:
        self.stopped.set()
        self.stop_scheduler_pod(delete_pod=False)
        for node in list(self.agents):
            self.stop_agent(node, delete_pod=False)


def _say(message: str) -> None:
    print(f"cluster: {message}", flush=True)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # no Go needed: ControlPlane.start builds the binaries with the pinned toolchain (devtools/gotoolchain.py)
    keep = os.environ.get("DEEPRES_CLUSTER_KEEP")
    root = Path(keep) if keep else tmp_path_factory.mktemp("cluster")
    if keep:
        shutil.rmtree(root, ignore_errors=True)
    plane = ControlPlane(root)
    started = time.monotonic()
    plane.start(log=_say)
    local: LocalCluster | None = None
    try:
        from kubernetes import client, config

        api = config.new_client_from_config(str(plane.admin_kubeconfig))  # type: ignore[no-untyped-call]
        core = client.CoreV1Api(api)
        simulated = yaml.safe_load(VALUES[0].read_text())["agent"]["simulated"]["nodes"]
        core.create_node(node_body(CPU_NODE))
        for node, spec in simulated.items():
            core.create_node(node_body(node, GPU_LABEL, gpus=len(parse_gpu_spec(spec))))
        core.create_namespace({"metadata": {"name": JOBS_NAMESPACE}})
        wait_for(f"the default ServiceAccount in {JOBS_NAMESPACE}", lambda: core.list_namespaced_service_account(
            JOBS_NAMESPACE, field_selector="metadata.name=default").items, 60, 0.5)
        port = free_port()
        env = {**os.environ, "KUBECONFIG": str(plane.admin_kubeconfig)}
        values = [arg for path in VALUES for arg in ("-f", str(path))]
        extra_values = [arg for item in os.environ.get("DEEPRES_CLUSTER_HELM_SET", "").split()
                        for arg in ("--set", item)]
        result = subprocess.run(
            [helm(), "install", RELEASE, str(REPO / "helm" / "deepres"), "--namespace", NAMESPACE,
             "--create-namespace", *values, "--set", f"extender.port={port}",
             "--set", f"extender.schedulerPort={free_port()}",
             "--set", f"agent.extenderUrl=http://127.0.0.1:{port}", *extra_values, "--wait", "--timeout", "3m"],
            capture_output=True, text=True, env=env, timeout=300)
        assert result.returncode == 0, f"helm install failed:\n{result.stdout}\n{result.stderr}"
        local = LocalCluster(plane, core, client.SchedulingV1Api(api), dict(simulated), port)
        local.start_scheduler_pod()
        for node in simulated:
            local.start_agent(node)
        threading.Thread(target=local.supervise, name="local-kubelet", daemon=True).start()
        _say(f"control plane + chart up in {time.monotonic() - started:.0f}s ({root})")
        yield local
    finally:
        if local is not None:
            local.stop_all()
        plane.stop()


@pytest.fixture(scope="session")
def real_node(cluster: LocalCluster) -> Iterator[RealNode]:
    """A real node (containerd + runc + the kubelet built with the control plane; devtools/realnode.py)
    joined to the `cluster` fixture's control plane, Ready, once per run. Pods get there with
    devtools.realnode.PLACEMENT (its label and NoSchedule taint keep every other pod off it); its kubelet
    root is /var/lib/kubelet. Skips, with the one-line reason, where this machine cannot run containers."""
    from devtools.realnode import NodeUnavailable, unavailable_reason

    reason = unavailable_reason()
    if reason:
        pytest.skip(f"no real node here: {reason}")
    node = RealNode(cluster.plane)
    started = time.monotonic()
    try:
        node.start(log=_say)
    except NodeUnavailable as why:
        pytest.skip(f"no real node here: {why}")
    _say(f"real node {node.name} Ready in {time.monotonic() - started:.0f}s")
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="session")
def real_node_images(real_node: RealNode) -> dict[str, str]:
    """The chart's deepres/agent and deepres/extender images in the real node's containerd (built with
    deploy/build-images.sh when their sources changed: minutes; cached otherwise). kind -> reference
    (docker.io/deepres/agent:<version>, what the chart's pods name). Skips where buildah cannot build."""
    from devtools.nodeimages import ImagesUnavailable

    # DEEPRES_NODE_IMAGES=prebuilt: import what buildah holds (`make images`) without rebuilding when
    # extender/ or predictor/ changed (minutes): for iterating on tests; CI always builds
    prebuilt = os.environ.get("DEEPRES_NODE_IMAGES") == "prebuilt"
    try:
        return real_node.import_project_images(build=not prebuilt)
    except ImagesUnavailable as why:
        pytest.skip(f"no deepres images for the real node: {why}")
