"""A real node for the local control plane: containerd + runc + a kubelet, beside the kwok nodes.

Why: what decides whether a pod really gets its GPUs happens on the node (the kubelet's device
manager calls the device plugin's Allocate, the runtime starts the container); kwok nodes have no
kubelet. Where the machine allows it (Linux, root, writable cgroups, containerd, runc and the CNI
plugins from Debian: scripts/install-node.sh), this joins one real node, `deepres-real-0`, to a running
devtools.localcluster.ControlPlane:

- containerd with its own config, socket and folders (root /var/lib/deepres-node/containerd, kept
  between runs so imported images stay; state /run/deepres-node), CRI on, cgroupfs, sandbox image the
  locally built pause (devtools.nodeimages), a CNI bridge (`deepres-cni0`, 10.244.0.0/24, host-local,
  no masquerade);
- the kubelet built with the control plane (same Kubernetes module), client certificate
  `system:node:deepres-real-0` (group system:nodes: the Node authorizer and NodeRestriction apply),
  a serving certificate the API server checks (`kubectl logs` and `exec` go through it), webhook
  authentication and authorization, root dir the standard /var/lib/kubelet (so a DaemonSet's hostPath
  to /var/lib/kubelet/device-plugins or /var/lib/kubelet/pod-resources is the one a cluster has);
- the node labelled `deepres.io/real-node=true` (kwok manages every node but those) and tainted
  `deepres.io/real-node=true:NoSchedule` (no pod of another suite lands on it unawares); `PLACEMENT` is
  what a pod or DaemonSet adds to run there;
- for hostNetwork pods, the `kubernetes` Service address (10.96.0.1:443, what in-cluster clients read
  from KUBERNETES_SERVICE_HOST/PORT) leads to the API server on loopback (an iptables DNAT rule on the
  host's OUTPUT chain); pods on the bridge have no route to it (no kube-proxy).

One real node per machine (the kubelet's port 10250, /var/lib/kubelet): starting one stops whatever
node an earlier run left (recorded in /run/deepres-node/node.json). `stop()` kills every container,
unmounts what the node mounted, removes the bridge and the DNAT rule, and stops containerd: nothing of
it keeps running. The kubelet sets the sysctls it expects (vm.overcommit_memory=1, kernel.panic=10,
kernel.panic_on_oops=1) on the host, as on any node.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import ipaddress
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools.localcluster import (
    REAL_NODE_LABEL,
    REPO,
    SERVICE_CIDR,
    ClusterError,
    ControlPlane,
    ensure_binaries,
    free_port,
    issue_certificate,
    start_process,
    stop_pid,
    write_kubeconfig,
)
from devtools.nodeimages import BUSYBOX_IMAGE, PAUSE_IMAGE, Containerd, ImageError, import_node_images

NODE_NAME = "deepres-real-0"
#: the kubelet's root dir: device plugins register at KUBELET_ROOT/device-plugins/kubelet.sock,
#: PodResources is served at KUBELET_ROOT/pod-resources/kubelet.sock
KUBELET_ROOT = Path("/var/lib/kubelet")
#: containerd's root (images, snapshots: kept between runs) and the CNI IPAM state
NODE_HOME = Path("/var/lib/deepres-node")
#: containerd's state and socket, and node.json (what runs now); tmpfs: gone after a reboot
NODE_RUN = Path("/run/deepres-node")
KUBELET_PORT = 10250
REAL_NODE_TAINT = {"key": REAL_NODE_LABEL, "value": "true", "effect": "NoSchedule"}
#: what a pod spec (or a DaemonSet's pod template) adds to run on the real node and only there
PLACEMENT: dict[str, Any] = {
    "nodeSelector": {REAL_NODE_LABEL: "true"},
    "tolerations": [{"key": REAL_NODE_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
}
POD_CIDR = "10.244.0.0/24"
BRIDGE = "deepres-cni0"
DUMMY = "deepres-node0"
DUMMY_IP = "10.254.254.1"
CNI_BIN = Path("/usr/lib/cni")
DNAT_COMMENT = "deepres-real-node"
#: the `kubernetes` Service's ClusterIP (the first address of the service range)
KUBERNETES_SERVICE_IP = str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))


class NodeUnavailable(ClusterError):
    """This machine cannot run a real node; the message is the one-line reason."""


def _say_nothing(message: str) -> None:
    del message


# ----------------------------------------------------------------------------------------------
# can this machine run one?


def unavailable_reason() -> str | None:
    """None when this machine can run a real node, else one line saying why not."""
    if platform.system() != "Linux":
        return f"a real node needs Linux (this is {platform.system()})"
    if os.geteuid() != 0:
        return "a real node needs root (containerd, runc and the kubelet mount, create cgroups and network namespaces)"
    for tool in ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "ip", "mount", "umount"):
        if shutil.which(tool) is None:
            return (f"{tool} not found: `make node-deps` (scripts/install-node.sh) installs containerd, runc, "
                    "the CNI plugins")
    for plugin in ("bridge", "host-local", "loopback"):
        if not (CNI_BIN / plugin).is_file():
            return f"CNI plugin {CNI_BIN / plugin} not found: apt-get install containernetworking-plugins"
    cgroup = Path("/sys/fs/cgroup")
    writable = [p for p in (cgroup / "memory", cgroup / "cgroup.subtree_control") if p.exists()]
    if not writable or not os.access(writable[0], os.W_OK):
        return "cgroups are not writable here (/sys/fs/cgroup): containers cannot run"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "the kernel has no overlay filesystem (containerd's overlayfs snapshotter)"
    recorded = _recorded()
    with socket.socket() as sock:
        try:
            sock.bind(("0.0.0.0", KUBELET_PORT))
        except OSError:
            if not recorded:
                return f"port {KUBELET_PORT} is taken (another kubelet runs here?): one real node per machine"
    return None


def _recorded() -> dict[str, Any]:
    try:
        state: dict[str, Any] = json.loads((NODE_RUN / "node.json").read_text())
        return state
    except (OSError, ValueError):
        return {}


def _process_start(pid: int) -> str:
    """The start time of process `pid` (clock ticks since boot; "" when it is gone): with the pid, it
    names one process, never a later one given the same pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _alive(pid: int, comm: str) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == comm
    except OSError:
        return False


def _primary_ip() -> str:
    """The IPv4 address the host's default route leaves from ("" when it has none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("203.0.113.1", 9))  # no packet is sent: a route lookup
            address: str = sock.getsockname()[0]
        except OSError:
            return ""
    return "" if address.startswith("127.") else address


def _run(argv: list[str], check: bool = False, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    if check and done.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} failed: {done.stderr.strip()[-800:]}")
    return done


def _mounts_under(*prefixes: Path) -> list[str]:
    """Mount points at or under any of `prefixes`, deepest first."""
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].encode().decode("unicode_escape")
            if any(point == str(p) or point.startswith(f"{p}/") for p in prefixes):
                found.append(point)
    return sorted(set(found), key=lambda p: p.count("/"), reverse=True)


def _unmount_all(*prefixes: Path) -> None:
    for _ in range(3):  # a lazy unmount can uncover a mount below it
        points = _mounts_under(*prefixes)
        if not points:
            return
        for point in points:
            _run(["umount", "-l", point])


def _remove_cgroups() -> None:
    """The kubelet's pod cgroups (cgroupfs driver: /kubepods/... in every v1 hierarchy, or in the v2
    tree), emptied ones only, deepest first."""
    root = Path("/sys/fs/cgroup")
    tops = [root / "kubepods"] + [p / "kubepods" for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
    for top in tops:
        if not top.is_dir():
            continue
        for path in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                path.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


# ----------------------------------------------------------------------------------------------
# the node


@dataclass
class RealNode:
    """One real node joined to `plane` (its processes recorded in /run/deepres-node/node.json)."""

    plane: ControlPlane
    name: str = NODE_NAME
    pids: dict[str, int] = field(default_factory=dict)
    node_ip: str = ""
    healthz_port: int = 0
    dummy: bool = False
    dnat: list[str] = field(default_factory=list)
    #: the process that started the node (pid, start time): while it runs, no other run takes the node over
    owner: tuple[int, str] = (0, "")
    log: Callable[[str], None] = _say_nothing
    kubelet_bin: Path = field(default_factory=Path)

    # ---- where things are ----
    @property
    def dir(self) -> Path:
        """Certificates, configuration (in the control plane's folder); logs go to plane.logs."""
        return self.plane.root / "node"

    @property
    def kubelet_root(self) -> Path:
        return KUBELET_ROOT

    @property
    def device_plugin_dir(self) -> Path:
        """Where the kubelet's Registration socket is (kubelet.sock) and plugins put theirs."""
        return KUBELET_ROOT / "device-plugins"

    @property
    def kubelet_socket(self) -> Path:
        return self.device_plugin_dir / "kubelet.sock"

    @property
    def pod_resources_socket(self) -> Path:
        return KUBELET_ROOT / "pod-resources" / "kubelet.sock"

    @property
    def containerd_socket(self) -> Path:
        return NODE_RUN / "containerd.sock"

    @property
    def containerd(self) -> Containerd:
        return Containerd(self.containerd_socket)

    @property
    def kubelet_log(self) -> Path:
        return self.plane.logs / "kubelet.log"

    def api_env(self) -> list[dict[str, str]]:
        """Container env that points in-cluster clients straight at the API server on loopback (for a
        hostNetwork pod; overrides the Service variables the kubelet sets, so no DNAT is needed)."""
        return [{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                {"name": "KUBERNETES_SERVICE_PORT", "value": str(self.plane.ports["apiserver"])}]

    # ---- state ----
    def save(self) -> None:
        NODE_RUN.mkdir(parents=True, exist_ok=True)
        state = {"cluster": str(self.plane.root), "name": self.name, "pids": self.pids, "node_ip": self.node_ip,
                 "healthz_port": self.healthz_port, "dummy": self.dummy, "dnat": self.dnat, "owner": list(self.owner)}
        (NODE_RUN / "node.json").write_text(json.dumps(state, indent=1))

    @classmethod
    def recorded(cls) -> RealNode | None:
        """The node an earlier `start()` left running on this machine (whichever control plane), or None."""
        state = _recorded()
        if not state:
            return None
        root = Path(state["cluster"])
        try:
            plane = ControlPlane.load(root)
        except (OSError, ValueError, KeyError):
            plane = ControlPlane(root)
        owner = state.get("owner") or [0, ""]
        return cls(plane, state["name"], dict(state["pids"]), state["node_ip"], state["healthz_port"],
                   bool(state["dummy"]), list(state["dnat"]), (int(owner[0]), str(owner[1])))

    def owner_running(self) -> bool:
        """The process that started this node still runs (a test session using it)."""
        pid, started = self.owner
        return bool(pid) and pid != os.getpid() and _process_start(pid) == started

    # ---- start ----
    def start(self, *, timeout_s: float = 180.0, log: Callable[[str], None] | None = None) -> RealNode:
        """Start containerd and the kubelet and wait until the node is Ready. NodeUnavailable (one-line
        reason) where the machine cannot; ClusterError when something failed (nothing left running)."""
        if log:
            self.log = log
        reason = unavailable_reason()
        if reason:
            raise NodeUnavailable(reason)
        earlier = RealNode.recorded()
        if earlier is not None:
            if earlier.owner_running():
                raise NodeUnavailable(f"the real node of another running session (pid {earlier.owner[0]}, "
                                      f"{earlier.plane.root}) holds this machine: one real node per machine")
            self.log(f"real node: stopping the one an earlier run left ({earlier.plane.root})")
            earlier.stop(delete_node=False)
        self.owner = (os.getpid(), _process_start(os.getpid()))
        deadline = time.monotonic() + timeout_s
        try:
            self._prepare()
            self._start_containerd(deadline)
            self._clear_containers()
            self._clear_host()
            try:
                import_node_images(self.containerd, self.log)
            except ImageError as err:
                raise NodeUnavailable(str(err)) from err
            self._add_dnat()
            self.start_kubelet()
            self.wait_ready(deadline)
        except BaseException:
            self.stop(delete_node=False)
            raise
        self.log(f"real node {self.name} Ready ({self.node_ip}; kubelet root {KUBELET_ROOT})")
        return self

    def _prepare(self) -> None:
        bin_dir = self.plane.bin_dir if (self.plane.bin_dir / "kubelet").is_file() else ensure_binaries(self.log)
        self.kubelet_bin = bin_dir / "kubelet"
        if not self.kubelet_bin.is_file():
            raise ClusterError(f"no kubelet in {bin_dir}: `make cluster-bins` builds it")
        self.node_ip = _primary_ip()
        if not self.node_ip:  # no default route: an address of our own on a dummy link
            _run(["ip", "link", "add", DUMMY, "type", "dummy"])
            _run(["ip", "addr", "add", f"{DUMMY_IP}/32", "dev", DUMMY])
            _run(["ip", "link", "set", DUMMY, "up"], check=True)
            self.node_ip, self.dummy = DUMMY_IP, True
        self.healthz_port = free_port()
        self.dir.mkdir(parents=True, exist_ok=True)
        for folder in (NODE_HOME, NODE_RUN, KUBELET_ROOT):
            folder.mkdir(parents=True, exist_ok=True)
        pki = self.plane.pki
        issue_certificate(pki, "kubelet-client", f"system:node:{self.name}", "system:nodes")
        issue_certificate(pki, "kubelet-serving", f"system:node:{self.name}", server=True,
                          dns_names=(self.name, "localhost"), ip_addresses=(self.node_ip, "127.0.0.1"))
        write_kubeconfig(self.dir / "kubelet.kubeconfig", self.plane.server, pki / "ca.crt",
                         cert=pki / "kubelet-client.crt", key=pki / "kubelet-client.key",
                         user=f"system:node:{self.name}")
        (self.dir / "cni").mkdir(exist_ok=True)
        (self.dir / "cni" / "10-deepres.conflist").write_text(json.dumps(self._cni_config(), indent=1))
        (self.dir / "containerd.toml").write_text(self._containerd_config())
        (self.dir / "kubelet-config.json").write_text(json.dumps(self._kubelet_config(), indent=1))
        self.save()

    def _cni_config(self) -> dict[str, Any]:
        return {"cniVersion": "0.4.0", "name": "deepres", "plugins": [{
            "type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]], "routes": [{"dst": "0.0.0.0/0"}],
                     "dataDir": str(NODE_HOME / "cni-ipam")}}]}

    def _containerd_config(self) -> str:
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        return "\n".join([
            "version = 2",
            f'root = "{NODE_HOME / "containerd"}"',
            f'state = "{NODE_RUN / "containerd"}"',
            'disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", '
            '"io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]',
            "[grpc]", f'  address = "{self.containerd_socket}"',
            "[ttrpc]", f'  address = "{NODE_RUN / "containerd.ttrpc.sock"}"',
            "[debug]", '  level = "warn"',
            '[plugins."io.containerd.internal.v1.opt"]', f'  path = "{NODE_HOME / "opt"}"',
            f"[{cri}]", f'  sandbox_image = "{PAUSE_IMAGE}"', "  netns_mounts_under_state_dir = true",
            "  enable_selinux = false",
            # the kubelet asks for negative OOM scores (sandboxes -998, Guaranteed pods -997), which needs
            # CAP_SYS_RESOURCE; where root lacks it (some VMs) runc would fail every sandbox: never below
            # containerd's own score instead
            "  restrict_oom_score_adj = true",
            f"[{cri}.containerd]", '  snapshotter = "overlayfs"', '  default_runtime_name = "runc"',
            f"[{cri}.containerd.runtimes.runc]", '  runtime_type = "io.containerd.runc.v2"',
            f"[{cri}.containerd.runtimes.runc.options]", "  SystemdCgroup = false",
            f"[{cri}.cni]", f'  bin_dir = "{CNI_BIN}"', f'  conf_dir = "{self.dir / "cni"}"', "  max_conf_num = 1",
            "",
        ])

    def _kubelet_config(self) -> dict[str, Any]:
        pki = self.plane.pki
        endpoint = f"unix://{self.containerd_socket}"
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": self.node_ip, "port": KUBELET_PORT, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": self.healthz_port,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True, "cacheTTL": "10s"},
                               "x509": {"clientCAFile": str(pki / "ca.crt")}},
            "authorization": {"mode": "Webhook", "webhook": {"cacheAuthorizedTTL": "10s",
                                                             "cacheUnauthorizedTTL": "5s"}},
            "tlsCertFile": str(pki / "kubelet-serving.crt"), "tlsPrivateKeyFile": str(pki / "kubelet-serving.key"),
            "rotateCertificates": False, "serverTLSBootstrap": False,
            "containerRuntimeEndpoint": endpoint, "imageServiceEndpoint": endpoint,
            "cgroupDriver": "cgroupfs", "failCgroupV1": False, "failSwapOn": False,
            "registerNode": True, "registerWithTaints": [REAL_NODE_TAINT],
            "clusterDomain": "cluster.local", "clusterDNS": [], "resolvConf": "/etc/resolv.conf",
            "staticPodPath": "", "volumePluginDir": str(KUBELET_ROOT / "volume-plugins"),
            # imported images cannot be pulled again: image GC never, eviction only near a full disk
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "maxPods": 110, "podPidsLimit": -1, "serializeImagePulls": False, "shutdownGracePeriod": "0s",
            "oomScoreAdj": 0,  # its own: -999 needs CAP_SYS_RESOURCE (see restrict_oom_score_adj)
        }

    def _start_containerd(self, deadline: float) -> None:
        self.pids["containerd"] = start_process(
            "containerd", ["containerd", "--config", str(self.dir / "containerd.toml")], self.plane.logs).pid
        self.save()
        while self.containerd.ctr("version", check=False, timeout_s=10).returncode != 0:
            self._check_alive("containerd")
            if time.monotonic() > deadline:
                raise ClusterError(f"containerd did not answer on {self.containerd_socket}; see "
                                   f"{self.plane.logs / 'containerd.log'}")
            time.sleep(0.2)

    def _check_alive(self, name: str) -> None:
        pid = self.pids.get(name)
        if pid is None:
            return
        with contextlib.suppress(ChildProcessError):
            finished, status = os.waitpid(pid, os.WNOHANG)
            if finished:
                tail = (self.plane.logs / f"{name}.log").read_text(errors="replace")[-3000:]
                raise ClusterError(f"{name} exited ({status}); the end of its log:\n{tail}")

    def _clear_containers(self) -> None:
        """Kill and remove every container of the k8s.io namespace (an earlier run's leftovers)."""
        ctr = self.containerd
        deadline = time.monotonic() + 30
        # until no task is left: killed ones are deleted by the CRI plugin on their exit, or here
        while tasks := ctr.ctr("tasks", "list", "--quiet", check=False).stdout.split():
            for task in tasks:
                ctr.ctr("tasks", "kill", "--signal", "SIGKILL", task, check=False)
                ctr.ctr("tasks", "delete", "--force", task, check=False)
            if time.monotonic() > deadline:
                self.log(f"real node: tasks left after SIGKILL: {tasks}")
                break
            time.sleep(0.2)
        for container in ctr.ctr("containers", "list", "--quiet", check=False).stdout.split():
            ctr.ctr("containers", "delete", container, check=False)
        _unmount_all(NODE_RUN / "containerd" / "io.containerd.grpc.v1.cri")

    def _clear_host(self) -> None:
        """What a kubelet of an earlier cluster left: its pods' folders and mounts, logs, IPs."""
        _unmount_all(KUBELET_ROOT)
        for child in KUBELET_ROOT.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
        for folder in (Path("/var/log/pods"), Path("/var/log/containers")):
            shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(NODE_HOME / "cni-ipam", ignore_errors=True)
        _run(["ip", "link", "delete", BRIDGE])

    def _add_dnat(self) -> None:
        if shutil.which("iptables") is None:
            self.log("real node: no iptables, so no DNAT for the kubernetes Service; hostNetwork pods need api_env()")
            return
        self._remove_dnat()
        rule = ["OUTPUT", "-d", f"{KUBERNETES_SERVICE_IP}/32", "-p", "tcp", "--dport", "443", "-m", "comment",
                "--comment", DNAT_COMMENT, "-j", "DNAT", "--to-destination",
                f"127.0.0.1:{self.plane.ports['apiserver']}"]
        if _run(["iptables", "-t", "nat", "-A", *rule]).returncode == 0:
            self.dnat = rule
            self.save()
        else:
            self.log("real node: no iptables DNAT for the kubernetes Service; hostNetwork pods need api_env()")

    def _remove_dnat(self) -> None:
        if shutil.which("iptables") is None:
            return
        listed = _run(["iptables", "-t", "nat", "-S", "OUTPUT"]).stdout.splitlines()
        for line in listed:
            if DNAT_COMMENT in line and line.startswith("-A "):
                _run(["iptables", "-t", "nat", "-D", *line.split()[1:]])
        self.dnat = []

    # ---- the kubelet ----
    def kubelet_argv(self) -> list[str]:
        if not self.kubelet_bin.is_file():
            self.kubelet_bin = ensure_binaries(self.log) / "kubelet"
        return [str(self.kubelet_bin), f"--config={self.dir / 'kubelet-config.json'}",
                f"--kubeconfig={self.dir / 'kubelet.kubeconfig'}", f"--root-dir={KUBELET_ROOT}",
                f"--hostname-override={self.name}", f"--node-ip={self.node_ip}",
                f"--node-labels={REAL_NODE_LABEL}=true", "--v=1"]

    def start_kubelet(self) -> None:
        """Start the kubelet (after stop_kubelet(); start() does it the first time). Returns at once:
        wait_ready(since=...) waits for it."""
        if "kubelet" in self.pids:
            raise ClusterError("the kubelet runs already")
        self.pids["kubelet"] = start_process("kubelet", self.kubelet_argv(), self.plane.logs).pid
        self.save()

    def stop_kubelet(self, sig: int = signal.SIGTERM) -> None:
        """Stop the kubelet only: containers keep running (as when a node's kubelet restarts)."""
        pid = self.pids.pop("kubelet", None)
        if pid is not None and _alive(pid, "kubelet"):
            stop_pid(pid, sig=sig)
        self.save()

    def restart_kubelet(self, *, timeout_s: float = 120.0, sig: int = signal.SIGTERM) -> float:
        """Stop the kubelet, start it again, wait until it has posted the node Ready since; returns
        when it did (time.monotonic()). The kubelet's Registration socket is made anew: device plugins
        must register again."""
        self.stop_kubelet(sig)
        since = dt.datetime.now(dt.UTC).replace(microsecond=0)
        self.start_kubelet()
        self.wait_ready(time.monotonic() + timeout_s, since=since)
        return time.monotonic()

    def kubelet_healthy(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.healthz_port), timeout=2) as sock:
                sock.sendall(b"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
                return sock.recv(64).split(b" ")[1:2] == [b"200"]
        except (OSError, IndexError):
            return False

    def node_object(self) -> dict[str, Any] | None:
        status, body = self.plane.get(f"/api/v1/nodes/{self.name}")
        if status != 200:
            return None
        node: dict[str, Any] = json.loads(body)
        return node

    def is_ready(self, since: dt.datetime | None = None) -> bool:
        """The Node's Ready condition is True (and, with `since`, was posted at or after it)."""
        node = self.node_object()
        if node is None:
            return False
        for condition in node.get("status", {}).get("conditions", []):
            if condition["type"] == "Ready":
                beat = dt.datetime.fromisoformat(condition["lastHeartbeatTime"].replace("Z", "+00:00"))
                return bool(condition["status"] == "True" and (since is None or beat >= since))
        return False

    def wait_ready(self, deadline: float, since: dt.datetime | None = None) -> None:
        while not (self.kubelet_healthy() and self.is_ready(since)):
            self._check_alive("kubelet")
            self._check_alive("containerd")
            if time.monotonic() > deadline:
                tail = self.kubelet_log.read_text(errors="replace")[-2000:] if self.kubelet_log.exists() else ""
                raise ClusterError(f"node {self.name} not Ready in time; the end of {self.kubelet_log}:\n{tail}")
            time.sleep(0.5)

    # ---- images ----
    def import_project_images(self, *, build: bool = True) -> dict[str, str]:
        """The chart's deepres/agent and deepres/extender images into this node's containerd (built
        with deploy/build-images.sh when their sources changed: minutes; else about a second).
        Returns kind -> reference (docker.io/deepres/agent:<version>), what the chart's pods name."""
        from devtools.nodeimages import import_project_images

        return import_project_images(self.containerd, self.log, build=build)

    # ---- stop ----
    def stop(self, *, delete_node: bool = True) -> None:
        """Stop the kubelet, kill every container, stop containerd, unmount, remove the bridge, the
        DNAT rule and the dummy link; with `delete_node`, delete the Node object (best effort)."""
        self.stop_kubelet()
        pid = self.pids.get("containerd")
        if pid is not None and _alive(pid, "containerd"):
            with contextlib.suppress(ClusterError, subprocess.SubprocessError, OSError):
                self._clear_containers()
        pid = self.pids.pop("containerd", None)
        if pid is not None and _alive(pid, "containerd"):
            stop_pid(pid)
        _unmount_all(KUBELET_ROOT, NODE_RUN)
        _run(["ip", "link", "delete", BRIDGE])
        if self.dummy:
            _run(["ip", "link", "delete", DUMMY])
            self.dummy = False
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            self._remove_dnat()
        shutil.rmtree(NODE_HOME / "cni-ipam", ignore_errors=True)
        for socket_file in (self.containerd_socket, NODE_RUN / "containerd.ttrpc.sock"):
            socket_file.unlink(missing_ok=True)
        _remove_cgroups()
        if delete_node and "apiserver" in self.plane.ports:
            with contextlib.suppress(Exception):
                self._delete_node_object()
        (NODE_RUN / "node.json").unlink(missing_ok=True)

    def _delete_node_object(self) -> None:
        import urllib.request

        request = urllib.request.Request(f"{self.plane.server}/api/v1/nodes/{self.name}", method="DELETE")
        with urllib.request.urlopen(request, context=self.plane.ssl_context(), timeout=5):
            pass


def pod_on_node(name: str, command: list[str], *, image: str = BUSYBOX_IMAGE, host_network: bool = False,
                restart_policy: str = "Never", namespace: str = "default") -> dict[str, Any]:
    """A pod that runs `command` in `image` on the real node (PLACEMENT), nothing pulled."""
    spec: dict[str, Any] = {
        "restartPolicy": restart_policy, "terminationGracePeriodSeconds": 1, "hostNetwork": host_network,
        "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never", "command": command}],
        **json.loads(json.dumps(PLACEMENT)),
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def stop_recorded(root: Path | None = None) -> bool:
    """Stop the node an earlier start() left on this machine (only if it belongs to the control plane
    in `root`, when given). True when one was stopped."""
    node = RealNode.recorded()
    if node is None or (root is not None and node.plane.root.resolve() != root.resolve()):
        return False
    node.stop()
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.realnode", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("start", "stop", "restart-kubelet", "import-project-images"))
    parser.add_argument("--dir", default=str(REPO / ".cluster"),
                        help="the folder of the running control plane (devtools.localcluster; default .cluster)")
    args = parser.parse_args(argv)
    # absolute: client-go reads a kubeconfig's relative paths from the kubeconfig's own folder
    root = Path(args.dir).resolve()

    def say(message: str) -> None:
        print(f"cluster: {message}", file=sys.stderr, flush=True)

    try:
        if args.action == "start":
            reason = unavailable_reason()
            if reason:
                say(f"no real node: {reason}")
                return 0
            node = RealNode(ControlPlane.load(root)).start(log=say)
            say(f"real node {node.name}: pods run there with devtools.realnode.PLACEMENT (nodeSelector "
                f"{REAL_NODE_LABEL}=true and its NoSchedule toleration); kubelet root {KUBELET_ROOT}, "
                f"logs {node.plane.logs}/kubelet.log and containerd.log")
        elif args.action == "stop":
            if stop_recorded(root):
                say("real node stopped")
        else:
            recorded = RealNode.recorded()
            if recorded is None or recorded.plane.root.resolve() != root.resolve():
                say(f"no real node runs for {root}")
                return 1
            recorded.log = say
            if args.action == "restart-kubelet":
                recorded.restart_kubelet()
                say("kubelet restarted, node Ready")
            else:
                say(str(recorded.import_project_images()))
    except NodeUnavailable as why:
        say(f"no real node: {why}")
    except (ClusterError, ImageError) as err:
        say(str(err))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
