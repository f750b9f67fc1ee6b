"""The chart installed for real on the local control plane (`make cluster`, and the cluster suite's pieces).

Why: a user trying deepres locally, or an independent check, needs what the cluster suite has: kwok
GPU nodes, `helm install` of helm/deepres (every object admitted by the real API server), the
deepres-scheduler pod (kube-scheduler + the extender sidecar) run as local processes from its pod object
(devtools.localpods), an agent per kwok GPU node the same way, and, where a real node runs
(devtools/realnode.py), the chart's agent DaemonSet as a container on that node with simulated GPUs and
its device plugin registered with the real kubelet. Values: the suite's (tests/e2e/values-kind.yaml
and tests/cluster/values-cluster.yaml: simulated GPUs, the device plugin on).

`python -m devtools.localchart up|down [--dir .cluster]` (`make cluster` runs `up` after the control plane;
`make cluster-down` runs `down` first). The local processes are recorded in DIR/chart.json; they are
not restarted when they exit (the cluster suite supervises its own).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from devtools.localcluster import REPO, ClusterError, ControlPlane, free_port, start_process, stop_pid
from devtools.localpods import prepare
from devtools.nodeimages import ImageError

RELEASE = NAMESPACE = "deepres"  # tests/e2e/scenarios.py names the same
JOBS_NAMESPACE = "deepres-e2e-jobs"
VALUES = [REPO / "tests" / "e2e" / "values-kind.yaml", REPO / "tests" / "cluster" / "values-cluster.yaml"]
CPU_NODE = "deepres-e2e-control-plane"
GPU_LABEL = {"deepres.io/simulated-gpus": "true"}
DEVICE_RESOURCE = "deepres.io/gpu"
SLOTS_PER_GPU = 16
#: the real node's simulated GPUs (an 8-GPU node: the real-node tests' bursts fill it)
REAL_NODE_GPUS = "8xA100-80GB"
REAL_AGENT_DS = f"{RELEASE}-agent-real-node"
STATE = "chart.json"


def helm_binary() -> str:
    import shutil

    found = shutil.which("helm") or str(REPO / ".venv" / "bin" / "helm")
    if not Path(found).exists():
        raise ClusterError("helm not found: `make tools` installs it into .venv/bin")
    return found


def simulated_nodes() -> dict[str, str]:
    """The kwok GPU nodes of the suite's values: node name -> simulated GPU spec."""
    nodes: dict[str, str] = yaml.safe_load(VALUES[0].read_text())["agent"]["simulated"]["nodes"]
    return dict(nodes)


def node_body(name: str, labels: dict[str, str] | None = None, gpus: int = 0) -> dict[str, Any]:
    """A kwok node: no taints, room for any number of sleeping pods; with `gpus`, the device plugin's
    resource as a GPU node's kubelet would advertise it (SLOTS_PER_GPU slots per GPU: no kubelet runs
    there to ask the agent's plugin)."""
    resources = {"cpu": "64", "memory": "512Gi", "pods": "250"}
    if gpus:
        resources[DEVICE_RESOURCE] = str(gpus * SLOTS_PER_GPU)
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "type": "kwok", **(labels or {})},
                         "annotations": {"kwok.x-k8s.io/node": "fake"}},
            "status": {"allocatable": dict(resources), "capacity": dict(resources)}}


def render_real_agent(extender_port: int, simulated: dict[str, str], node: str, image: str) -> list[dict[str, Any]]:
    """The chart's agent DaemonSet and its simulated-GPU ConfigMap as `helm template` renders them with the
    suite's values, the real node given REAL_NODE_GPUS and the device plugin (devicePlugin.simulatedGpus).
    The agent runs in the host's network (agent.hostNetwork): the local extender is a process on the
    host's loopback. Its own DaemonSet name beside the chart's (kwok nodes'), on the real node only."""
    from devtools.realnode import PLACEMENT

    values = [arg for path in VALUES for arg in ("-f", str(path))]
    argv = [helm_binary(), "template", RELEASE, str(REPO / "helm" / "deepres"), "--namespace", NAMESPACE, *values,
            "--set", "devicePlugin.simulatedGpus=true", "--set", f"devicePlugin.slotsPerGpu={SLOTS_PER_GPU}",
            "--set", f"agent.extenderUrl=http://127.0.0.1:{extender_port}", "--set", "agent.hostNetwork=true",
            "--set-json", f"agent.simulated.nodes={json.dumps({**simulated, node: REAL_NODE_GPUS})}",
            "--set-json", f"agent.tolerations={json.dumps(PLACEMENT['tolerations'])}",
            # the image imported into the node's containerd (the suite's values name a tag only kind has)
            "--set", f"agent.image.repository={image.removeprefix('docker.io/').rsplit(':', 1)[0]}",
            "--set", f"agent.image.tag={image.rsplit(':', 1)[1]}", "--set", "agent.image.pullPolicy=IfNotPresent",
            "--show-only", "templates/agent/daemonset.yaml", "--show-only", "templates/agent/configmap.yaml"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise ClusterError(f"helm template of the real node's agent failed: {done.stderr.strip()}")
    objects = [o for o in yaml.safe_load_all(done.stdout) if o]
    for obj in objects:
        if obj["kind"] == "DaemonSet":
            obj["metadata"]["name"] = REAL_AGENT_DS
            obj["spec"]["selector"]["matchLabels"]["deepres.io/agent-for"] = "real-node"
            obj["spec"]["template"]["metadata"]["labels"]["deepres.io/agent-for"] = "real-node"
            # the real node only (helm merges agent.nodeSelector into the suite's GPU-node label)
            obj["spec"]["template"]["spec"]["nodeSelector"] = dict(PLACEMENT["nodeSelector"])
    return objects


def scheduler_pod_containers(core: Any, plane: ControlPlane, pod: dict[str, Any], scheduler_port: int
                             ) -> tuple[list[tuple[str, list[str], dict[str, str]]], Path]:
    """The scheduler pod's containers as local commands, in start order (its init containers are run to
    their end here first, as the kubelet would): [(container, argv, env)], and kube-scheduler's config file.
    kube-scheduler ignores --kubeconfig when it has --config: its configuration gets
    `clientConnection.kubeconfig` (in the pod it uses the in-cluster config), in a copy next to it."""
    root, ca = plane.root / "pods", plane.pki / "ca.crt"
    for init in pod["spec"].get("initContainers") or []:
        first = prepare(core, plane.server, ca, pod, init["name"], root, plane.bin_dir)
        subprocess.run(first.argv, env=first.env, cwd=REPO, check=True, capture_output=True, timeout=120)
    extender = prepare(core, plane.server, ca, pod, "extender", root, plane.bin_dir,
                       rewrite={"--bind=0.0.0.0:": "--bind=127.0.0.1:"})
    scheduler = prepare(core, plane.server, ca, pod, "kube-scheduler", root, plane.bin_dir)
    argv, config = [], Path()
    for arg in scheduler.argv:
        if arg.startswith("--config="):
            original = Path(arg.split("=", 1)[1])
            loaded = yaml.safe_load(scheduler.localize(original.read_text()))
            loaded.setdefault("clientConnection", {})["kubeconfig"] = scheduler.env["KUBECONFIG"]
            config = original.parent.parent / "scheduler-config-local.yaml"
            config.write_text(yaml.safe_dump(loaded))
            arg = f"--config={config}"
        argv.append(arg)
    argv += [f"--secure-port={scheduler_port}", "--bind-address=127.0.0.1"]
    return [("extender", extender.argv, extender.env), ("kube-scheduler", argv, scheduler.env)], config


def agent_container(core: Any, plane: ControlPlane, pod: dict[str, Any], metrics_port: int
                    ) -> tuple[list[str], dict[str, str]]:
    """A kwok node's agent pod as a local command, its metrics on 127.0.0.1:metrics_port."""
    listen = {"--listen=0.0.0.0:9400": f"--listen=127.0.0.1:{metrics_port}"}
    agent = prepare(core, plane.server, plane.pki / "ca.crt", pod, "agent", plane.root / "pods", plane.bin_dir,
                    rewrite=listen)
    return agent.argv, agent.env


def _wait(what: str, check: Callable[[], Any], timeout_s: float, say: Callable[[str], None]) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.5)


def _running(core: Any, selector: str, node: str | None = None) -> dict[str, Any] | None:
    for pod in core.list_namespaced_pod(NAMESPACE, label_selector=selector).items:
        if pod.metadata.deletion_timestamp is None and pod.status.phase == "Running" and (
                node is None or pod.spec.node_name == node):
            found: dict[str, Any] = core.api_client.sanitize_for_serialization(pod)
            return found
    return None


def _http_ok(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def up(root: Path, say: Callable[[str], None]) -> dict[str, Any]:
    """Nodes, the chart, its pods' processes and (where a real node runs) the agent on it; returns the state."""
    from kubernetes import client, config

    from devtools.realnode import RealNode

    plane = ControlPlane.load(root)
    api = config.new_client_from_config(str(plane.admin_kubeconfig))  # type: ignore[no-untyped-call]
    core: Any = client.CoreV1Api(api)  # bodies are dicts (the API client takes them)
    simulated = simulated_nodes()
    from extender.agent.simulated import parse_gpu_spec

    core.create_node(node_body(CPU_NODE))
    for node, spec in simulated.items():
        core.create_node(node_body(node, GPU_LABEL, gpus=len(parse_gpu_spec(spec))))
    core.create_namespace({"metadata": {"name": JOBS_NAMESPACE}})
    port, scheduler_port = free_port(), free_port()
    values = [arg for path in VALUES for arg in ("-f", str(path))]
    env = {**os.environ, "KUBECONFIG": str(plane.admin_kubeconfig)}
    done = subprocess.run([helm_binary(), "install", RELEASE, str(REPO / "helm" / "deepres"), "--namespace", NAMESPACE,
                           "--create-namespace", *values, "--set", f"extender.port={port}",
                           "--set", f"extender.schedulerPort={scheduler_port}",
                           "--set", f"agent.extenderUrl=http://127.0.0.1:{port}", "--wait", "--timeout", "3m"],
                          capture_output=True, text=True, env=env, timeout=300)
    if done.returncode != 0:
        raise ClusterError(f"helm install failed: {done.stderr.strip() or done.stdout.strip()}")
    state: dict[str, Any] = {"extender_port": port, "pids": {}}
    pod = _wait("the scheduler pod", lambda: _running(core, "app.kubernetes.io/component=scheduler"), 120, say)
    commands, _ = scheduler_pod_containers(core, plane, pod, free_port())
    for container, argv, cenv in commands:
        state["pids"][f"scheduler-{container}"] = start_process(f"{pod['metadata']['name']}-{container}", argv,
                                                                plane.logs, cenv, cwd=REPO).pid
    (root / STATE).write_text(json.dumps(state))
    _wait("the extender to be ready", lambda: _http_ok(f"http://127.0.0.1:{port}/readyz") or _http_ok(
        f"http://127.0.0.1:{port}/healthz"), 180, say)
    for node in simulated:
        agent_pod = _wait(f"the agent pod of {node}", lambda n=node: _running(  # type: ignore[misc]
            core, "app.kubernetes.io/component=agent", n), 120, say)
        argv, aenv = agent_container(core, plane, agent_pod, free_port())
        state["pids"][f"agent-{node}"] = start_process(f"{agent_pod['metadata']['name']}-agent", argv, plane.logs,
                                                       aenv, cwd=REPO).pid
        (root / STATE).write_text(json.dumps(state))
    say(f"chart installed: release {RELEASE} in {NAMESPACE}, extender on 127.0.0.1:{port}, "
        f"{len(simulated)} kwok GPU nodes with their agents")
    real = RealNode.recorded()
    if real is None or real.plane.root.resolve() != root.resolve():
        say("no real node runs: the chart's agent runs on the kwok nodes only")
        return state
    images = real.import_project_images(build=os.environ.get("DEEPRES_NODE_IMAGES") != "prebuilt")
    apps: Any = client.AppsV1Api(api)
    for obj in render_real_agent(port, simulated, real.name, images["agent"]):
        if obj["kind"] == "ConfigMap":
            core.replace_namespaced_config_map(obj["metadata"]["name"], NAMESPACE, obj)
        else:
            apps.create_namespaced_daemon_set(NAMESPACE, obj)

    def advertised() -> bool:
        allocatable = core.read_node(real.name).status.allocatable or {}
        return int(allocatable.get(DEVICE_RESOURCE, "0")) > 0
    _wait(f"{real.name} to advertise {DEVICE_RESOURCE} (the chart's agent's device plugin)", advertised, 300, say)
    state["real_node"] = real.name
    (root / STATE).write_text(json.dumps(state))
    say(f"the chart's agent runs as a container on {real.name} and its device plugin serves {DEVICE_RESOURCE}; "
        f"pods reach that node with devtools.realnode.PLACEMENT")
    return state


def down(root: Path, say: Callable[[str], None]) -> None:
    path = root / STATE
    if not path.exists():
        return
    for name, pid in json.loads(path.read_text()).get("pids", {}).items():
        stop_pid(int(pid))
        say(f"stopped {name}")
    path.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.localchart", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("up", "down"))
    parser.add_argument("--dir", default=str(REPO / ".cluster"), help="the local control plane's folder")
    args = parser.parse_args(argv)
    root = Path(args.dir).resolve()

    def say(message: str) -> None:
        print(f"cluster: {message}", file=sys.stderr, flush=True)

    try:
        if args.action == "up":
            up(root, say)
        else:
            down(root, say)
    except (ClusterError, ImageError, subprocess.CalledProcessError) as err:
        say(str(err))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
