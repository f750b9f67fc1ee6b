"""A real Kubernetes control plane as local processes on loopback (`make cluster`, the cluster suite).

Why: deepres is a kube-scheduler extender, so it must be checked against the real kube-apiserver
and kube-scheduler, not against fakes of them. Containers are not available everywhere (CI has no
container engine), so the control plane runs as plain processes: etcd, kube-apiserver (RBAC,
ServiceAccount tokens, TokenReview), kube-controller-manager, the default kube-scheduler, and kwok
for the nodes and the pods' lifecycle. The binaries are built once from the Go module in cluster/
(pinned Kubernetes release) with the machine's Go 1.26, or where it has none the pinned Go that
devtools/gotoolchain.py fetches from the Go module proxy, and cached by the pins; certificates are made
fresh per run.

kube-controller-manager runs with only the controllers a workload here needs: serviceaccount (the
`default` ServiceAccounts pods are admitted against), daemonset and deployment/replicaset (the
chart's agent and scheduler pods exist as real API objects, so their bound tokens carry the node
the extender checks), root-ca-cert-publisher (the kube-root-ca.crt every pod's API volume holds),
namespace and garbagecollector (namespaces and `helm uninstall` finish), and job (the Job examples of
deploy/examples/, tests/cluster/test_examples.py).

kwok manages every node but a real one: where the machine can run containers, `up` also joins a real
node (devtools/realnode.py: containerd + runc + the kubelet built here), which is why the API server
runs the Node authorizer and NodeRestriction and reaches kubelets with a client certificate of its own.

`python -m devtools.localcluster up|down|build [--dir DIR] [--no-real-node]`; the processes are stopped
by pid.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import fcntl
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools import gotoolchain

REPO = Path(__file__).resolve().parents[1]
GO_MODULE = REPO / "cluster"
KUBERNETES_VERSION = "v1.36.3"  # also in cluster/go.mod: change both together
KWOK_VERSION = "v0.8.0"
ETCD_PACKAGE = "go.etcd.io/etcd/server/v3"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kubelet")
#: bumped when the build recipe below changes, so cached binaries are rebuilt
RECIPE = "2"
SERVICE_CIDR = "10.96.0.0/16"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
#: the label of a real node (devtools/realnode.py): kwok leaves such nodes to their kubelet
REAL_NODE_LABEL = "deepres.io/real-node"
CONTROLLERS = "serviceaccount,root-ca-cert-publisher,namespace,garbagecollector,daemonset,deployment,replicaset,job"


class ClusterError(RuntimeError):
    """The control plane could not be built or started; the message says which part and why."""


def cache_dir() -> Path:
    return Path(os.environ.get("DEEPRES_CLUSTER_CACHE", Path.home() / ".cache" / "deepres-cluster"))


# ----------------------------------------------------------------------------------------------
# binaries


def _go_env(cache: Path, go: Path | None = None) -> dict[str, str]:
    """The build's environment; with `go` (the fetched toolchain's bin/go) its folder first on PATH and
    its GOROOT (a GOROOT of the machine's would otherwise win)."""
    env = dict(os.environ)
    env.update(GOCACHE=str(cache / "gocache"), GOMODCACHE=str(cache / "gomodcache"), GOTOOLCHAIN="local",
               GOFLAGS="-mod=mod", CGO_ENABLED="0")
    if go is not None and go.resolve().parents[1] == gotoolchain.toolchain_root(cache).resolve():
        env["GOROOT"] = str(go.resolve().parents[1])
        env["PATH"] = os.pathsep.join([str(go.parent), env.get("PATH", "")])
    return env


def go_version() -> str:
    """`go1.26.8`: the version the control plane is built with: the machine's Go when it is 1.26 (1.27's
    default jsonv2 experiment makes kube-apiserver's /openapi/v2 malformed, which breaks kubectl and
    helm), else the pinned gotoolchain.GO_VERSION, fetched into the cache when a build needs it."""
    return gotoolchain.choose(cache_dir())[1]


def binaries_key(version: str) -> str:
    """What the binaries depend on: the module pins, kwok's version, the Go version, the recipe."""
    digest = hashlib.sha256()
    for part in ((GO_MODULE / "go.mod").read_bytes(), (GO_MODULE / "go.sum").read_bytes(),
                 KWOK_VERSION.encode(), version.encode(), RECIPE.encode()):
        digest.update(hashlib.sha256(part).digest())
    return f"{KUBERNETES_VERSION}-{digest.hexdigest()[:12]}"


def ensure_binaries(log: Any = None) -> Path:
    """The folder holding BINARIES, built now unless a build for the same pins is cached."""
    cache = cache_dir()
    version = go_version()  # no download here: cached binaries need no Go at all
    target = cache / "bin" / binaries_key(version)
    if all((target / name).is_file() for name in BINARIES):
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; a second caller reuses the first's
        if all((target / name).is_file() for name in BINARIES):
            return target
        try:
            go, built_with = gotoolchain.ensure(cache, log)
        except gotoolchain.ToolchainError as err:
            raise ClusterError(f"no Go to build the control plane with: {err}") from err
        if built_with != version:  # the machine's Go changed between the two looks
            raise ClusterError(f"Go {built_with} found, {version} expected: run the build again")
        work = Path(tempfile.mkdtemp(prefix="build-", dir=cache))
        env = _go_env(cache, go)
        kube_ld = " ".join([
            "-s -w",
            f"-X k8s.io/component-base/version.gitVersion={KUBERNETES_VERSION}",
            "-X k8s.io/component-base/version.gitMajor=1",
            f"-X k8s.io/component-base/version.gitMinor={KUBERNETES_VERSION.split('.')[1]}",
            "-X k8s.io/component-base/version.gitTreeState=clean",
        ])
        steps = [
            [str(go), "build", "-trimpath", "-ldflags", kube_ld, "-o", f"{work}/",
             "k8s.io/kubernetes/cmd/kube-apiserver", "k8s.io/kubernetes/cmd/kube-scheduler"],
            [str(go), "build", "-trimpath", "-ldflags", "-s -w", "-o", f"{work}/etcd", ETCD_PACKAGE],
            [str(go), "install", "-trimpath", "-ldflags", "-s -w", f"sigs.k8s.io/kwok/cmd/kwok@{KWOK_VERSION}"],
            [str(go), "build", "-trimpath", "-ldflags", kube_ld, "-o", f"{work}/",
             "k8s.io/kubernetes/cmd/kube-controller-manager"],
            # the real node's (devtools/realnode.py); built without cgo, as upstream's release builds it
            [str(go), "build", "-trimpath", "-ldflags", kube_ld, "-o", f"{work}/", "k8s.io/kubernetes/cmd/kubelet"],
        ]
        started = time.monotonic()
        for step in steps:
            if log:
                log(f"building with {go}: {' '.join(step[-2:])}")
            result = subprocess.run(step, cwd=GO_MODULE, env={**env, "GOBIN": str(work)}, capture_output=True,
                                    text=True)
            if result.returncode != 0:
                raise ClusterError(f"{' '.join(step)} failed:\n{result.stderr[-4000:]}")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(target, ignore_errors=True)
        work.rename(target)
        if log:
            log(f"built {', '.join(BINARIES)} in {time.monotonic() - started:.0f}s into {target}")
    return target


# ----------------------------------------------------------------------------------------------
# certificates


def _key_pem(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()))


def _x509_name(cn: str, org: str = "") -> Any:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def issue_certificate(pki: Path, stem: str, cn: str, org: str = "", *, server: bool = False,
                      dns_names: tuple[str, ...] = (), ip_addresses: tuple[str, ...] = ()) -> None:
    """PKI/STEM.crt and .key signed by the CA in PKI (ca.crt, ca.key): a client certificate (CN, O),
    or with `server` a serving one for `dns_names` and `ip_addresses`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    ca = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (x509.CertificateBuilder().subject_name(_x509_name(cn, org)).issuer_name(ca.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now).not_valid_after(now + dt.timedelta(days=30))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True))
    if server:
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False).add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    else:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    (pki / f"{stem}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (pki / f"{stem}.key").write_bytes(_key_pem(key))
    (pki / f"{stem}.key").chmod(0o600)


def _write_certs(pki: Path) -> None:
    """A CA, the API server's serving certificate, client certificates, the ServiceAccount key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    pki.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    until = now + dt.timedelta(days=30)
    key_pem, name = _key_pem, _x509_name

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("deepres-local-ca")).issuer_name(name("deepres-local-ca"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now).not_valid_after(until)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    (pki / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (pki / "ca.key").write_bytes(key_pem(ca_key))  # devtools/realnode.py signs the kubelet's with it
    (pki / "ca.key").chmod(0o600)

    issue_certificate(pki, "apiserver", "kube-apiserver", server=True, dns_names=(
        "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local"), ip_addresses=("127.0.0.1", "10.96.0.1"))
    issue_certificate(pki, "admin", "deepres-admin", "system:masters")
    issue_certificate(pki, "kube-scheduler", "system:kube-scheduler")
    issue_certificate(pki, "kube-controller-manager", "system:kube-controller-manager")
    issue_certificate(pki, "kwok", "kwok-controller", "system:masters")
    # the API server's identity towards kubelets (logs, exec, port-forward of a real node's pods)
    issue_certificate(pki, "apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters")
    sa_key = ec.generate_private_key(ec.SECP256R1())
    (pki / "sa.key").write_bytes(key_pem(sa_key))
    (pki / "sa.pub").write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


def write_kubeconfig(path: Path, server: str, ca_file: Path, *, cert: Path | None = None, key: Path | None = None,
                     token: str = "", user: str = "user") -> Path:
    """A kubeconfig for one identity: a client certificate, or a bearer token."""
    credentials: dict[str, str] = {"token": token} if token else {
        "client-certificate": str(cert), "client-key": str(key)}
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "local",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
    }
    path.write_text(json.dumps(config, indent=1))
    path.chmod(0o600)
    return path


# ----------------------------------------------------------------------------------------------
# processes


def free_port() -> int:
    """A port nothing listens on now (the kernel's pick): another process may take it before the one
    it is meant for binds it, so that one's starter retries on "address already in use" (`port_taken`;
    ControlPlane.start does)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


#: how many times ControlPlane.start picks fresh ports when another process took one
PORT_TRIES = 4


def port_taken(text: str) -> bool:
    """Whether a process's output (an error with its log's tail) says a port it wanted was taken."""
    lowered = text.lower()
    return "address already in use" in lowered or "eaddrinuse" in lowered


def start_process(name: str, argv: list[str], logs: Path, env: Mapping[str, str] | None = None,
                  cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """Start `argv` in its own process group (so stopping it stops its children), output to logs/NAME.log."""
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"{name}.log", "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True)


def stop_pid(pid: int, grace_s: float = 10.0, sig: int = signal.SIGTERM) -> None:
    """Signal `pid`'s process group, then SIGKILL whatever is left after `grace_s`."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        try:
            os.killpg(pid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


#: Go template pieces of kwok's statusTemplates (plain strings: their braces are Go's, not Python's)
_NOW = "{{ $now | Quote }}"
_NODE_STATUS = """\
{{ $now := Now }}
conditions:
{{ range NodeConditions }}
- lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $now | Quote }}
  message: {{ .message | Quote }}
  reason: {{ .reason | Quote }}
  status: {{ .status | Quote }}
  type: {{ .type | Quote }}
{{ end }}
addresses:
- {address: 127.0.0.1, type: InternalIP}
- {address: {{ .metadata.name | Quote }}, type: Hostname}
allocatable:
{{ with .status.allocatable }}{{ YAML . 1 }}{{ else }}  {cpu: "32", memory: 256Gi, pods: "110"}{{ end }}
capacity:
{{ with .status.capacity }}{{ YAML . 1 }}{{ else }}  {cpu: "32", memory: 256Gi, pods: "110"}{{ end }}
nodeInfo: {architecture: amd64, kubeletVersion: kwok, operatingSystem: linux, kernelVersion: kwok,
           containerRuntimeVersion: kwok, kubeProxyVersion: kwok, osImage: kwok, bootID: "", machineID: "",
           systemUUID: ""}
phase: Running
"""


def _pod_status(phase: str, conditions: dict[str, str], ready: bool, state: str, extra: str = "") -> str:
    """A pod statusTemplate: its phase, conditions (type -> status), and every container in `state`."""
    flag = "true" if ready else "false"
    lines = ["{{ $now := Now }}", "conditions:"]
    lines += ["- {lastTransitionTime: " + _NOW + f", status: \"{status}\", type: {kind}}}"
              for kind, status in conditions.items()]
    lines += ["containerStatuses:", "{{ range .spec.containers }}", "- image: {{ .image | Quote }}",
              "  name: {{ .name | Quote }}", f"  ready: {flag}", "  restartCount: 0", f"  started: {flag}",
              f"  state: {state}", "{{ end }}", f"phase: {phase}"]
    return "\n".join(lines) + "\n" + extra


def _stage(name: str, kind: str, expressions: list[tuple[str, str, list[str]]], next_: dict[str, Any],
           delay: dict[str, Any] | None = None) -> dict[str, Any]:
    """One kwok Stage: objects of `kind` matching every (key, operator, values) expression get `next_`."""
    spec: dict[str, Any] = {"resourceRef": {"apiGroup": "v1", "kind": kind}, "selector": {"matchExpressions": [
        {"key": key, "operator": op, **({"values": values} if values else {})} for key, op, values in expressions]}}
    if delay:
        spec["delay"] = delay
    spec["next"] = next_
    return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": name}, "spec": spec}


def _kwok_stages() -> str:
    """Nodes turn Ready once; pods run, complete after `deepres-test.io/complete-after` (a Go duration) if they carry it
    (a training job ending), and go when deleted (after their grace period)."""
    import yaml

    alive: tuple[str, str, list[str]] = (".metadata.deletionTimestamp", "DoesNotExist", [])
    not_ready = ('.status.conditions.[] | select( .type == "Ready" ) | .status', "NotIn", ["True"])
    complete_after = '.metadata.annotations["deepres-test.io/complete-after"]'
    now = _NOW
    running = _pod_status("Running", {"Initialized": "True", "Ready": "True", "ContainersReady": "True"}, True,
                          "{running: {startedAt: " + now + "}}",
                          "hostIP: 127.0.0.1\npodIP: 127.0.0.1\nstartTime: " + now + "\n")
    completed = _pod_status("Succeeded", {"Ready": "False"}, False, "{terminated: {exitCode: 0, reason: Completed, "
                            "startedAt: " + now + ", finishedAt: " + now + "}}")
    stages = [
        _stage("node-ready", "Node", [not_ready], {"statusTemplate": _NODE_STATUS}),
        _stage("pod-running", "Pod", [alive, (".status.phase", "In", ["Pending"]), not_ready],
               {"statusTemplate": running}),
        _stage("pod-complete-after", "Pod", [alive, (".status.phase", "In", ["Running"]),
                                             (complete_after, "Exists", [])],
               {"statusTemplate": completed},
               delay={"durationMilliseconds": 1000, "durationFrom": {"expressionFrom": complete_after}}),
        _stage("pod-delete", "Pod", [(".metadata.deletionTimestamp", "Exists", [])],
               {"finalizers": {"empty": True}, "delete": True}),
    ]
    return str(yaml.safe_dump_all(stages, sort_keys=False, width=1000))


@dataclass
class ControlPlane:
    """The running processes of one local control plane, kept in DIR/state.json so another process
    (`make cluster-down`) can stop them by pid."""

    root: Path
    bin_dir: Path = field(default_factory=Path)
    ports: dict[str, int] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    extra_scheduler_args: list[str] = field(default_factory=list)
    extra_apiserver_args: list[str] = field(default_factory=list)

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.root / "admin.kubeconfig"

    def save(self) -> None:
        state = {"bin_dir": str(self.bin_dir), "ports": self.ports, "pids": self.pids}
        (self.root / "state.json").write_text(json.dumps(state, indent=1))

    @classmethod
    def load(cls, root: Path) -> ControlPlane:
        state = json.loads((root / "state.json").read_text())
        return cls(root, Path(state["bin_dir"]), dict(state["ports"]), dict(state["pids"]))

    # ---- start ----
    def start(self, *, timeout_s: float = 180.0, log: Any = None) -> ControlPlane:
        """Build or reuse the binaries, make certificates, start every process, wait until usable.

        The ports are the kernel's picks of free ones, which another process on the machine may take
        before etcd, kube-apiserver, ... bind them: when one exits saying so, everything is stopped and
        started again on fresh ports (PORT_TRIES times)."""
        self.bin_dir = ensure_binaries(log)
        self.root.mkdir(parents=True, exist_ok=True)
        _write_certs(self.pki)
        (self.root / "kwok-stages.yaml").write_text(_kwok_stages())
        for attempt in range(1, PORT_TRIES + 1):
            self._pick_ports()
            try:
                self._start_all(timeout_s, log)
                return self
            except ClusterError as err:
                self.stop()
                if attempt == PORT_TRIES or not port_taken(str(err)):
                    raise
                if log:
                    log(f"a port was taken by another process ({str(err).splitlines()[0]}): starting again")
                shutil.rmtree(self.root / "etcd", ignore_errors=True)
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _pick_ports(self) -> None:
        """Fresh ports for every process, and the kubeconfigs that name the API server's."""
        for name in ("etcd", "etcd-peer", "apiserver", "kcm", "scheduler", "kwok"):
            self.ports[name] = free_port()
        pki = self.pki
        write_kubeconfig(self.admin_kubeconfig, self.server, pki / "ca.crt", cert=pki / "admin.crt",
                         key=pki / "admin.key", user="admin")
        for who in ("kube-scheduler", "kube-controller-manager", "kwok"):
            write_kubeconfig(self.root / f"{who}.kubeconfig", self.server, pki / "ca.crt", cert=pki / f"{who}.crt",
                             key=pki / f"{who}.key", user=who)

    def _spawn(self, name: str, argv: list[str]) -> None:
        proc = start_process(name, argv, self.logs)
        self.pids[name] = proc.pid
        self.save()

    def _start_all(self, timeout_s: float, log: Any) -> None:
        b, pki, p = self.bin_dir, self.pki, self.ports
        deadline = time.monotonic() + timeout_s
        self._spawn("etcd", [
            str(b / "etcd"), "--name=deepres-local", f"--data-dir={self.root / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{p['etcd']}", f"--advertise-client-urls=http://127.0.0.1:{p['etcd']}",
            f"--listen-peer-urls=http://127.0.0.1:{p['etcd-peer']}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{p['etcd-peer']}",
            f"--initial-cluster=deepres-local=http://127.0.0.1:{p['etcd-peer']}",
            "--unsafe-no-fsync", "--quota-backend-bytes=4294967296", "--log-level=warn",
        ])
        self.start_apiserver()
        self.wait_ready(deadline)
        if log:
            log(f"kube-apiserver ready at {self.server}")
        self._spawn("kube-controller-manager", [
            str(b / "kube-controller-manager"), f"--kubeconfig={self.root / 'kube-controller-manager.kubeconfig'}",
            f"--controllers={CONTROLLERS}", "--leader-elect=false", "--bind-address=127.0.0.1",
            f"--secure-port={p['kcm']}", "--use-service-account-credentials=true", f"--root-ca-file={pki / 'ca.crt'}",
            "--concurrent-gc-syncs=5", "--v=1",
        ])
        self._spawn("kube-scheduler", [
            str(b / "kube-scheduler"), f"--kubeconfig={self.root / 'kube-scheduler.kubeconfig'}",
            "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={p['scheduler']}", "--v=1",
            *self.extra_scheduler_args,
        ])
        # every node but a real one (devtools/realnode.py labels its node so; its kubelet runs its pods)
        self._spawn("kwok", [
            str(b / "kwok"), f"--kubeconfig={self.root / 'kwok.kubeconfig'}", "--manage-all-nodes=false",
            f"--manage-nodes-with-label-selector=!{REAL_NODE_LABEL}",
            f"--config={self.root / 'kwok-stages.yaml'}", f"--server-address=127.0.0.1:{p['kwok']}",
            "--node-lease-duration-seconds=0", "--node-ip=127.0.0.1",
        ])
        self.wait_default_service_account(deadline)
        self._check_alive()  # kube-scheduler and kwok too (one whose port was taken exits at once)

    def start_apiserver(self, extra: list[str] | None = None) -> None:
        b, pki, p = self.bin_dir, self.pki, self.ports
        self._spawn("kube-apiserver", [
            str(b / "kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{p['etcd']}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={p['apiserver']}",
            f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            # Node + NodeRestriction: a real node's kubelet (system:node:NAME) gets its own node's objects only
            "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
            f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
            f"--kubelet-certificate-authority={pki / 'ca.crt'}", "--kubelet-preferred-address-types=InternalIP",
            f"--service-account-issuer={SA_ISSUER}", f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}", f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--endpoint-reconciler-type=none", "--profiling=false", "--allow-privileged=true", "--v=1",
            # nodes are born tainted not-ready and the node lifecycle controller (not run: it would need
            # kwok to heartbeat every node) would lift it; kwok nodes are Ready from the start
            "--disable-admission-plugins=TaintNodesByCondition",
            *self.extra_apiserver_args, *(extra or []),
        ])

    # ---- readiness ----
    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        context.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return context

    def get(self, path: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
        """GET `path` on the API server as the admin (status, body); status 0 when unreachable."""
        try:
            with urllib.request.urlopen(self.server + path, context=self.ssl_context(), timeout=timeout_s) as resp:
                return int(resp.status), bytes(resp.read())
        except urllib.error.HTTPError as err:
            return int(err.code), err.read()
        except (OSError, ssl.SSLError):
            return 0, b""

    def _check_alive(self) -> None:
        for name, pid in self.pids.items():
            try:
                finished, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            if finished:
                tail = (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]
                raise ClusterError(f"{name} exited ({status}); the end of its log:\n{tail}")

    def wait_ready(self, deadline: float) -> None:
        while True:
            status, _ = self.get("/readyz")
            if status == 200:
                return
            self._check_alive()
            if time.monotonic() > deadline:
                raise ClusterError(f"kube-apiserver not ready (last /readyz: {status}); see {self.logs}")
            time.sleep(0.5)

    def wait_default_service_account(self, deadline: float) -> None:
        while self.get("/api/v1/namespaces/default/serviceaccounts/default")[0] != 200:
            self._check_alive()
            if time.monotonic() > deadline:
                raise ClusterError("no `default` ServiceAccount: kube-controller-manager is not working; see logs")
            time.sleep(0.5)

    # ---- stop ----
    def stop_one(self, name: str, sig: int = signal.SIGTERM) -> None:
        pid = self.pids.pop(name, None)
        if pid is not None:
            stop_pid(pid, sig=sig)
            self.save()

    def stop(self) -> None:
        """Stop every process, the newest first (etcd last)."""
        for name in reversed(list(self.pids)):
            self.stop_one(name)


def env_for(kubeconfig: Path) -> dict[str, str]:
    """The environment of a process that talks to this control plane: its kubeconfig, no in-cluster hints."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_SERVICE")}
    env["KUBECONFIG"] = str(kubeconfig)
    return env


@contextlib.contextmanager
def running(root: Path, log: Any = None) -> Iterator[ControlPlane]:
    plane = ControlPlane(root).start(log=log)
    try:
        yield plane
    finally:
        plane.stop()


def _real_node(action: str, root: Path) -> None:
    """`python -m devtools.realnode ACTION --dir ROOT`: join a real node to the control plane in ROOT
    (where the machine cannot run one, it says why in one line) or stop the one joined to it. A
    process of its own: devtools.realnode builds on this module."""
    subprocess.run([sys.executable, "-m", "devtools.realnode", action, "--dir", str(root)], cwd=REPO, check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.localcluster", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("build", "up", "down"))
    parser.add_argument("--dir", default=str(REPO / ".cluster"), help="state, certificates, logs (default .cluster)")
    parser.add_argument("--no-real-node", action="store_true",
                        help="up: kwok nodes only (by default a real node joins where the machine can run one)")
    args = parser.parse_args(argv)
    # absolute: client-go reads a kubeconfig's relative paths from the kubeconfig's own folder
    root = Path(args.dir).resolve()

    def say(message: str) -> None:
        print(f"cluster: {message}", file=sys.stderr, flush=True)

    try:
        if args.action == "build":
            print(ensure_binaries(say))
        elif args.action == "up":
            if (root / "state.json").exists():
                _real_node("stop", root)
                ControlPlane.load(root).stop()
            shutil.rmtree(root, ignore_errors=True)
            plane = ControlPlane(root).start(log=say)
            if not args.no_real_node:
                _real_node("start", root)
            say(f"up: KUBECONFIG={plane.admin_kubeconfig} (logs in {plane.logs}; `make cluster-down` stops it)")
        else:
            _real_node("stop", root)
            if (root / "state.json").exists():
                ControlPlane.load(root).stop()
                say("stopped")
    except ClusterError as err:
        say(str(err))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
