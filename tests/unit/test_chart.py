"""The Helm chart, checked the way a cluster would check it, without a cluster.

Why: an admin's first contact with deepres is `helm install`; a typo in a template, an object the
API server rejects, a scheduler configuration that calls the wrong path or port, or RBAC wider than
needed must fail here, not on a cluster. Rendering goes through the real `helm` (from .venv/bin,
installed by `make tools`); objects are validated with kubernetes-validate's strict schemas for every
Kubernetes minor the chart supports; the KubeSchedulerConfiguration is compared with what the
extender serves and the rendered command lines are parsed by the real `deepres` argument parsers.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "deepres"
MANIFEST = REPO / "deploy" / "manifests" / "deepres.yaml"
RENDER_SCRIPT = REPO / "deploy" / "manifests" / "render.sh"
RELEASE, NAMESPACE = "deepres", "deepres"
KUBE_VERSIONS = ("1.32.0", "1.33.0", "1.34.0", "1.35.0")
SERVICEMONITOR_API = "monitoring.coreos.com/v1/ServiceMonitor"
VERBS = ("filter", "prioritize", "preempt", "bind")

HELM = shutil.which("helm") or next((str(p) for p in [REPO / ".venv" / "bin" / "helm"] if p.exists()), None)
pytestmark = pytest.mark.skipif(HELM is None, reason="helm not on PATH: run `make tools` (installs it into .venv/bin)")

Obj = dict[str, Any]

# Named value sets: every one must render, lint and validate.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "separate-extender": {"extender": {"mode": "deployment", "tls": {
        "enabled": True, "secretName": "deepres-tls", "clientSecretName": "deepres-scheduler-client"}},
        "scheduler": {"replicas": 2}},
    "servicemonitor": {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}},
    "simulated": {
        "agent": {
            "source": "simulated",
            "nodeSelector": {"deepres.io/simulated-gpus": "true", "nvidia.com/gpu.present": None},
            "simulated": {"default": "1xT4-16GB", "nodes": {"worker-1": "2xA100-40GB", "worker-2": "1xV100-16GB"}},
        },
        # as on kwok nodes: something else advertises the device plugin's resource (validation-images.yaml)
        "devicePlugin": {"advertisedElsewhere": True},
    },
    "tls": {
        "extender": {"mode": "deployment", "tls": {"enabled": True, "secretName": "deepres-tls",
                                                   "clientSecretName": "deepres-scheduler-client"}},
        "metrics": {"serviceMonitor": {"enabled": True}},
    },
    "privileged-agent": {"agent": {"privileged": True}, "pdb": {"enabled": False}},
    "default-scheduler": {
        "scheduler": {"enabled": False, "name": "default-scheduler"},
        "extender": {"mode": "deployment", "tls": {"enabled": True, "secretName": "deepres-tls",
                                                   "clientSecretName": "deepres-scheduler-client"}},
    },
}


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    assert HELM is not None
    return subprocess.run([HELM, *args], capture_output=True, text=True, check=check, timeout=120)


def write_values(tmp: Path, values: dict[str, Any]) -> Path:
    path = tmp / f"values-{hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:12]}.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def template_args(values_file: Path, kube_version: str) -> list[str]:
    return [
        "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", kube_version,
        "--api-versions", SERVICEMONITOR_API, "-f", str(values_file),
    ]


def render(tmp: Path, values: dict[str, Any], kube_version: str = "1.35.0") -> list[Obj]:
    out = helm(*template_args(write_values(tmp, values), kube_version))
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def render_error(tmp: Path, values: dict[str, Any], *extra: str) -> str:
    """Render expecting failure; returns helm's error text."""
    result = helm(*template_args(write_values(tmp, values), "1.35.0"), *extra, check=False)
    assert result.returncode != 0, f"expected the chart to refuse {values}, it rendered"
    return result.stderr


def find(objs: list[Obj], kind: str, name: str | None = None) -> Obj:
    hits = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(hits) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in hits]}"
    return hits[0]


def containers(obj: Obj) -> list[Obj]:
    result: list[Obj] = obj["spec"]["template"]["spec"]["containers"]
    return result


def container(obj: Obj, name: str) -> Obj:
    return next(c for c in containers(obj) if c["name"] == name)


def scheduler_config(objs: list[Obj]) -> Obj:
    config: Obj = yaml.safe_load(find(objs, "ConfigMap", "deepres-scheduler")["data"]["scheduler-config.yaml"])
    return config


@pytest.fixture(autouse=True, scope="module")
def cached_kubernetes_schemas() -> Iterator[None]:
    """kubernetes-validate re-reads its 1.5 MB definitions file for every object: read each file once."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kubernetes_validate.utils, "schema_contents",
                      functools.lru_cache(maxsize=None)(kubernetes_validate.utils.schema_contents))
        yield


# ServiceMonitor is a CRD kubernetes-validate has no schema for: we check the fields the chart sets
# against this small schema (the shape the Prometheus Operator documents), strictly.
SERVICEMONITOR_SCHEMA: Obj = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "required": ["name", "namespace"],
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                "namespace": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}},
                },
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"matchNames": {"type": "array", "items": {"type": "string"}}},
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["port"],
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string", "pattern": "^/"},
                            "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                            "scheme": {"enum": ["http", "https"]},
                            "tlsConfig": {
                                "type": "object",
                                "additionalProperties": False,
                                "properties": {
                                    "serverName": {"type": "string"},
                                    "ca": {
                                        "type": "object",
                                        "properties": {
                                            "secret": {
                                                "type": "object",
                                                "required": ["name", "key"],
                                                "properties": {"name": {"type": "string"}, "key": {"type": "string"}},
                                            }
                                        },
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def validate_object(obj: Obj, kube_version: str) -> None:
    """Strict schema of the object's own Kubernetes version; CRDs against our own small schema."""
    where = f"{obj['kind']}/{obj['metadata']['name']} (Kubernetes {kube_version})"
    if obj["apiVersion"].startswith("monitoring.coreos.com/"):
        try:
            jsonschema.validate(obj, SERVICEMONITOR_SCHEMA)
        except jsonschema.ValidationError as err:
            pytest.fail(f"{where}: {'.'.join(map(str, err.path))}: {err.message}")
        return
    try:
        kubernetes_validate.validate(obj, kube_version, strict=True)
    except kubernetes_validate.ValidationError as err:
        pytest.fail(f"{where}: {'.'.join(map(str, err.path))}: {err.message}")
    except kubernetes_validate.utils.SchemaNotFoundError as err:
        pytest.fail(f"{where}: no schema for this kind ({err.message}); the chart should only emit core kinds")


# --------------------------------------------------------------------------------------------------
# lint, render, validate


def test_kubernetes_validate_knows_every_supported_version() -> None:
    known = {kubernetes_validate.utils.major_minor(v) for v in kubernetes_validate.utils.all_versions()}
    missing = [v for v in KUBE_VERSIONS if kubernetes_validate.utils.major_minor(v) not in known]
    assert not missing, f"kubernetes-validate {kubernetes_validate.__version__} lacks schemas for {missing}"


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_helm_lint_strict(name: str, tmp_path: Path) -> None:
    result = helm("lint", "--strict", str(CHART), "-f", str(write_values(tmp_path, VALUE_SETS[name])), check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_every_rendered_object_validates(name: str, kube_version: str, tmp_path: Path) -> None:
    objs = render(tmp_path, VALUE_SETS[name], kube_version)
    assert objs, "the chart rendered nothing"
    for obj in objs:
        validate_object(obj, kube_version)
    if VALUE_SETS[name].get("scheduler", {}).get("enabled", True):
        scheduler = find(objs, "Deployment", "deepres-scheduler")
        minor = ".".join(kube_version.split(".")[:2])
        image = container(scheduler, "kube-scheduler")["image"]
        assert image == f"registry.k8s.io/kube-scheduler:v{minor}.0", "kube-scheduler must match the cluster's version"


def test_object_names_are_unique_and_namespaced(tmp_path: Path) -> None:
    for name, values in VALUE_SETS.items():
        objs = render(tmp_path, values)
        keys = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objs]
        assert len(keys) == len(set(keys)), f"{name}: duplicate objects {keys}"
        cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                          "ValidatingAdmissionPolicyBinding", "MutatingAdmissionPolicy",
                          "MutatingAdmissionPolicyBinding", "MutatingWebhookConfiguration"}
        for kind, namespace, obj_name in keys:
            assert (namespace is None) == (kind in cluster_scoped), f"{name}: {kind}/{obj_name} namespace {namespace}"


# --------------------------------------------------------------------------------------------------
# the scheduler configuration against the extender


def served_extender_paths() -> tuple[set[str], str]:
    """(POST paths the extender serves, where that was read from): the contract's POST paths and the
    verbs that its app answers (not 404 or 405), when the extender is there."""
    contract = (REPO / "docs" / "CONTRACTS.md").read_text()
    line = next(ln for ln in contract.splitlines() if "HTTP paths" in ln)
    promised = set(re.findall(r"(/[a-z0-9/]+)", line.split("POST", 1)[1].split("GET", 1)[0]))
    try:
        from extender.server.app import create_app
        from extender.settings import KubeSettings, Settings
    except ImportError:
        return promised, "docs/CONTRACTS.md"  # the extender has not landed: the contract says what it will serve
    # local mode and a stand-in predictor: only the routes matter here, not the cluster or the model
    client = create_app(Settings(kube=KubeSettings(no_kube=True)), predictor=object()).test_client()  # type: ignore[arg-type]
    answered = {path for path in promised | {f"/{verb}" for verb in VERBS}
                if client.post(path, data=b"{}", content_type="application/json").status_code not in (404, 405)}
    return answered, "extender/server/app.py"


def default_extender_port() -> int:
    contract = (REPO / "docs" / "CONTRACTS.md").read_text()
    match = re.search(r"--bind HOST:PORT` \(default `0\.0\.0\.0:(\d+)`\)", contract)
    assert match, "docs/CONTRACTS.md no longer states the extender's default --bind"
    return int(match.group(1))


def test_scheduler_configuration_matches_the_extender(tmp_path: Path) -> None:
    objs = render(tmp_path, {})
    config = scheduler_config(objs)
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert [p["schedulerName"] for p in config["profiles"]] == ["deepres-scheduler"]
    assert config["leaderElection"]["leaderElect"] is True
    assert config["leaderElection"]["resourceName"] == "deepres-scheduler"
    (ext,) = config["extenders"]
    assert {ext["filterVerb"], ext["prioritizeVerb"], ext["preemptVerb"], ext["bindVerb"]} == set(VERBS)
    assert ext["nodeCacheCapable"] is True and ext["ignorable"] is False and ext["enableHTTPS"] is True
    assert isinstance(ext["weight"], int) and ext["weight"] > 0
    assert re.fullmatch(r"[0-9]+(ms|s)", ext["httpTimeout"])

    url = re.fullmatch(r"(https?)://([^:/]+):(\d+)", ext["urlPrefix"])
    assert url, f"urlPrefix {ext['urlPrefix']!r} is not scheme://host:port (the extender serves at its root)"
    scheme, host, port = url.group(1), url.group(2), int(url.group(3))
    # sidecar mode calls the extender's own listener for the scheduler over loopback, with mTLS (issue 34)
    assert scheme == "https" and host == "127.0.0.1"
    main_port = default_extender_port()
    assert port != main_port

    served, source = served_extender_paths()
    for verb in VERBS:
        assert f"/{verb}" in served, f"kube-scheduler will POST /{verb}; {source} serves {sorted(served)}"

    extender = container(find(objs, "Deployment", "deepres-scheduler"), "extender")
    assert f"--bind=0.0.0.0:{main_port}" in extender["args"]
    assert {"name": "DEEPRES_SCHEDULER_BIND", "value": f"127.0.0.1:{port}"} in extender["env"]
    # the scheduler's port: loopback only (the admission webhook's port, on Kubernetes < 1.36, is the API server's)
    assert [p["containerPort"] for p in extender["ports"] if p["name"] != "webhook"] == [main_port]
    service = find(objs, "Service", "deepres-extender")
    assert [p["port"] for p in service["spec"]["ports"] if p["name"] != "webhook"] == [main_port]


# Field names of kubescheduler.config.k8s.io/v1 (k8s.io/kube-scheduler/config/v1/types.go). kube-scheduler
# decodes its --config strictly: an unknown or misspelt key stops it at start-up.
SCHEDULER_CONFIG_FIELDS = {
    "": {"apiVersion", "kind", "parallelism", "leaderElection", "clientConnection", "enableProfiling",
         "enableContentionProfiling", "percentageOfNodesToScore", "podInitialBackoffSeconds",
         "podMaxBackoffSeconds", "profiles", "extenders", "delayCacheUntilActive"},
    "leaderElection": {"leaderElect", "leaseDuration", "renewDeadline", "retryPeriod", "resourceLock",
                       "resourceName", "resourceNamespace"},
    "profiles": {"schedulerName", "percentageOfNodesToScore", "plugins", "pluginConfig"},
    "extenders": {"urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb", "enableHTTPS",
                  "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources", "ignorable"},
    "tlsConfig": {"insecure", "serverName", "certFile", "keyFile", "caFile", "certData", "keyData", "caData"},
    "managedResources": {"name", "ignoredByScheduler"},
}


def test_scheduler_configuration_has_only_upstream_fields(tmp_path: Path) -> None:
    values = {
        "extender": {"mode": "deployment", "tls": {"enabled": True, "secretName": "tls", "clientSecretName": "client"},
                     "managedResources": [{"name": "deepres.io/gpu-job", "ignoredByScheduler": True}]},
        "scheduler": {"percentageOfNodesToScore": 30},
    }
    config = scheduler_config(render(tmp_path, values))
    assert set(config) <= SCHEDULER_CONFIG_FIELDS[""], set(config) - SCHEDULER_CONFIG_FIELDS[""]
    assert set(config["leaderElection"]) <= SCHEDULER_CONFIG_FIELDS["leaderElection"]
    for profile in config["profiles"]:
        assert set(profile) <= SCHEDULER_CONFIG_FIELDS["profiles"]
    for ext in config["extenders"]:
        assert set(ext) <= SCHEDULER_CONFIG_FIELDS["extenders"], set(ext) - SCHEDULER_CONFIG_FIELDS["extenders"]
        assert set(ext["tlsConfig"]) <= SCHEDULER_CONFIG_FIELDS["tlsConfig"]
        for resource in ext["managedResources"]:
            assert set(resource) <= SCHEDULER_CONFIG_FIELDS["managedResources"]
    assert config["percentageOfNodesToScore"] == 30


def test_scheduler_sends_every_feasible_node_to_the_extender_by_default(tmp_path: Path) -> None:
    """Upstream's adaptive sampling would send the extender a share of the nodes, CPU-only nodes
    included, so GPU pods failed their first attempts on large clusters (issue 14)."""
    assert scheduler_config(render(tmp_path, {}))["percentageOfNodesToScore"] == 100


def test_probe_paths_are_served(tmp_path: Path) -> None:
    """Every httpGet probe of the extender container hits a GET route of the extender's Flask app."""
    from extender.server.app import create_app
    from extender.settings import KubeSettings, Settings

    flask_app = create_app(Settings(kube=KubeSettings(no_kube=True)), predictor=object())  # type: ignore[arg-type]
    gets = {r.rule for r in flask_app.url_map.iter_rules() if "GET" in (r.methods or set())}
    extender = container(find(render(tmp_path, {}), "Deployment", "deepres-scheduler"), "extender")
    probes = {extender[p]["httpGet"]["path"] for p in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes <= gets, f"probes {sorted(probes)} vs served {sorted(gets)}"
    assert "/metrics" in gets, "the ServiceMonitor scrapes /metrics"


def test_agent_probe_and_scrape_paths_are_served(tmp_path: Path) -> None:
    from extender.agent.metrics import AgentMetrics, Health, make_app

    app = make_app(AgentMetrics(), Health(max_age_s=60.0))
    agent = container(find(render(tmp_path, {}), "DaemonSet", "deepres-agent"), "agent")
    paths = {agent[p]["httpGet"]["path"] for p in ("livenessProbe", "readinessProbe")} | {"/metrics"}
    statuses: list[str] = []
    for path in sorted(paths):
        app({"PATH_INFO": path, "REQUEST_METHOD": "GET"}, lambda status, headers, *_: statuses.append(status))
        assert not statuses[-1].startswith("404"), f"the agent does not serve {path}: {statuses[-1]}"


def test_separate_extender_is_called_through_its_service(tmp_path: Path) -> None:
    objs = render(tmp_path, VALUE_SETS["separate-extender"])
    (ext,) = scheduler_config(objs)["extenders"]
    assert ext["urlPrefix"] == f"https://deepres-extender.{NAMESPACE}.svc:8889"
    scheduler = find(objs, "Deployment", "deepres-scheduler")
    assert [c["name"] for c in containers(scheduler)] == ["kube-scheduler"]
    extender = find(objs, "Deployment", "deepres-extender")
    assert extender["spec"]["replicas"] == 1 and extender["spec"]["strategy"]["type"] == "Recreate"
    service = find(objs, "Service", "deepres-extender")
    assert service["spec"]["selector"] == extender["spec"]["selector"]["matchLabels"]


def test_without_the_second_scheduler_only_the_extender_block_remains(tmp_path: Path) -> None:
    objs = render(tmp_path, VALUE_SETS["default-scheduler"])
    assert [o["metadata"]["name"] for o in objs if o["kind"] == "Deployment"] == ["deepres-extender"]
    assert not [o for o in objs if o["metadata"]["name"].startswith("deepres-scheduler") and o["kind"] != "ConfigMap"]
    config = scheduler_config(objs)
    assert config["profiles"][0]["schedulerName"] == "default-scheduler"
    assert config["extenders"][0]["urlPrefix"] == f"https://deepres-extender.{NAMESPACE}.svc:8889"
    extender = container(find(objs, "Deployment", "deepres-extender"), "extender")
    assert {"name": "DEEPRES_SCHEDULER_NAME", "value": "default-scheduler"} in extender["env"]


def test_sidecar_verbs_need_the_per_pod_client_certificate(tmp_path: Path) -> None:
    """Issue 34 row 13 (before, issue 13 item 2: any caller on loopback, which a port-forward and a
    sibling container are too): the verbs answer only kube-scheduler's client certificate, made in
    the pod at its start by an init container into two emptyDirs, each mounted into one container
    (no Secret); the agents' telemetry still arrives over the pod network (the NetworkPolicy admits
    only the agents, on the main port)."""
    objs = render(tmp_path, VALUE_SETS["defaults"])
    scheduler = find(objs, "Deployment", "deepres-scheduler")
    extender = container(scheduler, "extender")
    args = cli_parser("serve").parse_args(extender["args"])
    assert args.verbs_access == "mtls" and args.bind.startswith("0.0.0.0:")
    env = {e["name"]: e.get("value") for e in extender["env"]}
    assert env["DEEPRES_SCHEDULER_BIND"] == "127.0.0.1:8889" and "DEEPRES_ENGINE" not in env  # granian
    (ext,) = scheduler_config(objs)["extenders"]
    assert ext["urlPrefix"] == "https://127.0.0.1:8889" and ext["enableHTTPS"] is True
    (init,) = scheduler["spec"]["template"]["spec"]["initContainers"]
    assert cli_parser("pod-certs").parse_args(init["args"]).command == "pod-certs"
    init_args = dict(a.split("=", 1) for a in init["args"][1:])
    init_dirs = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    mounts = {c["name"]: {m["name"]: m["mountPath"] for m in c["volumeMounts"]} for c in containers(scheduler)}
    # the scheduler's half (client key) only in kube-scheduler, the listener's half only in the extender
    assert init_dirs["pod-tls-scheduler"] == init_args["--client-dir"]
    assert init_dirs["pod-tls-extender"] == init_args["--server-dir"]
    assert "pod-tls-extender" not in mounts["kube-scheduler"] and "pod-tls-scheduler" not in mounts["extender"]
    client_dir = mounts["kube-scheduler"]["pod-tls-scheduler"]
    assert ext["tlsConfig"] == {"caFile": f"{client_dir}/ca.crt", "certFile": f"{client_dir}/client.crt",
                                "keyFile": f"{client_dir}/client.key"}
    server_dir = mounts["extender"]["pod-tls-extender"]
    assert args.tls_client_ca == f"{server_dir}/ca.crt" and env["DEEPRES_SCHEDULER_TLS_KEY"] == f"{server_dir}/tls.key"
    volumes = {v["name"]: v for v in scheduler["spec"]["template"]["spec"]["volumes"]}
    assert "emptyDir" in volumes["pod-tls-extender"] and "emptyDir" in volumes["pod-tls-scheduler"]
    # nothing of the keys leaves the pod (the one Secret is the admission webhook's serving certificate)
    assert [o["metadata"]["name"] for o in objs if o["kind"] == "Secret"] == ["deepres-webhook-tls"]
    # extender.verbsAccess=loopback keeps the old trust in any caller on loopback, on the main port
    loopback = scheduler_config(render(tmp_path, {"extender": {"verbsAccess": "loopback"}}))
    assert loopback["extenders"][0]["urlPrefix"] == "http://127.0.0.1:8888"
    policy = find(objs, "NetworkPolicy", "deepres-extender")
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "scheduler"
    (rule,) = [r for r in policy["spec"]["ingress"] if "from" in r]  # and the webhook's port (any peer)
    assert rule["from"] == [{"podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "deepres", "app.kubernetes.io/instance": RELEASE,
        "app.kubernetes.io/component": "agent"}}}]
    assert rule["ports"] == [{"port": 8888, "protocol": "TCP"}]
    agent_policy = find(objs, "NetworkPolicy", "deepres-agent")
    assert agent_policy["spec"]["ingress"] == []
    daemonset = find(objs, "DaemonSet", "deepres-agent")
    assert agent_policy["spec"]["podSelector"]["matchLabels"] == daemonset["spec"]["selector"]["matchLabels"]
    scheduler = find(objs, "Deployment", "deepres-scheduler")
    assert policy["spec"]["podSelector"]["matchLabels"] == scheduler["spec"]["selector"]["matchLabels"]


def test_deployment_mode_verbs_need_the_schedulers_client_certificate(tmp_path: Path) -> None:
    """kube-scheduler's extender client can present a client certificate (tlsConfig certFile/keyFile)
    and nothing else: the chart gives it one and the extender takes the verbs only with it."""
    monitoring = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    objs = render(tmp_path, {**VALUE_SETS["separate-extender"], "networkPolicy": {
        "enabled": True, "metricsFrom": monitoring}})
    (ext,) = scheduler_config(objs)["extenders"]
    assert ext["tlsConfig"]["certFile"] == "/etc/deepres/client/tls.crt"
    assert ext["tlsConfig"]["keyFile"] == "/etc/deepres/client/tls.key"
    scheduler = find(objs, "Deployment", "deepres-scheduler")
    mounts = {m["mountPath"]: m["name"] for m in container(scheduler, "kube-scheduler")["volumeMounts"]}
    volumes = {v["name"]: v for v in scheduler["spec"]["template"]["spec"]["volumes"]}
    volume = volumes[mounts["/etc/deepres/client"]]
    assert volume["secret"]["secretName"] == "deepres-scheduler-client"
    deployment = find(objs, "Deployment", "deepres-extender")
    extender = container(deployment, "extender")
    args = cli_parser("serve").parse_args(extender["args"])
    assert args.verbs_access == "mtls" and args.tls_client_ca == "/etc/deepres/client-ca/ca.crt"
    # granian (issue 34 row 14): the scheduler's own listener checks the certificate in its handshake
    assert not [e for e in extender["env"] if e["name"] == "DEEPRES_ENGINE"]
    assert {"name": "DEEPRES_SCHEDULER_BIND", "value": "0.0.0.0:8889"} in extender["env"]
    assert {"name": "scheduler", "containerPort": 8889, "protocol": "TCP"} in extender["ports"]
    ca_volume = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}["scheduler-client-ca"]
    assert ca_volume["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]  # never the client's key
    policy = find(objs, "NetworkPolicy", "deepres-extender")
    rules = [r for r in policy["spec"]["ingress"] if "from" in r]  # the other: the webhook's port, any peer
    assert [r for r in policy["spec"]["ingress"] if "from" not in r] == [{"ports": [{"port": 9443, "protocol": "TCP"}]}]
    components = [r["from"][0].get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/component")
                  for r in rules]
    assert components == ["agent", "scheduler", None]
    assert rules[1]["ports"] == [{"port": 8889, "protocol": "TCP"}]
    assert rules[2]["from"] == monitoring
    scheduler_policy = find(objs, "NetworkPolicy", "deepres-scheduler")
    assert scheduler_policy["spec"]["ingress"] == [{"from": monitoring, "ports": [{"port": 10259, "protocol": "TCP"}]}]


def test_tls_configures_https_and_the_ca_everywhere(tmp_path: Path) -> None:
    objs = render(tmp_path, VALUE_SETS["tls"])
    (ext,) = scheduler_config(objs)["extenders"]
    assert ext["urlPrefix"].startswith("https://") and ext["enableHTTPS"] is True
    assert ext["tlsConfig"]["caFile"] == "/etc/deepres/tls/ca.crt"
    scheduler = container(find(objs, "Deployment", "deepres-scheduler"), "kube-scheduler")
    assert "/etc/deepres/tls" in {m["mountPath"] for m in scheduler["volumeMounts"]}
    extender = container(find(objs, "Deployment", "deepres-extender"), "extender")
    assert "--tls-cert=/etc/deepres/tls/tls.crt" in extender["args"]
    assert extender["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    agent = container(find(objs, "DaemonSet", "deepres-agent"), "agent")
    assert any(a.startswith("--extender-url=https://") for a in agent["args"])
    assert "--extender-ca-file=/etc/deepres/tls/ca.crt" in agent["args"]


# --------------------------------------------------------------------------------------------------
# rendered command lines parse with the real CLI


def cli_parser(subcommand: str) -> argparse.ArgumentParser:
    from extender import cli

    return cli.build_parser(subcommand)


def test_extender_args_parse_with_deepres_serve(tmp_path: Path) -> None:
    parser = cli_parser("serve")
    for name in ("defaults", "tls"):
        objs = render(tmp_path, VALUE_SETS[name])
        deployment = next(o for o in objs if o["kind"] == "Deployment" and "extender" in
                          [c["name"] for c in containers(o)])
        args = parser.parse_args(container(deployment, "extender")["args"])
        assert args.command == "serve"


def test_extender_environment_and_settings_file_load(tmp_path: Path) -> None:
    """Every DEEPRES_* variable the chart sets is a real Settings leaf, and file + env load cleanly."""
    from extender.settings import leaf_paths, load_settings

    objs = render(tmp_path, {"extender": {"settings": {"usage_margin": 1.2}}, "telemetry": {"ttlSeconds": 40}})
    extender = container(find(objs, "Deployment", "deepres-scheduler"), "extender")
    env = {e["name"]: e["value"] for e in extender["env"] if e["name"].startswith("DEEPRES_")}
    unknown = [name for name in env if name[len("DEEPRES_"):].lower() not in leaf_paths()]
    assert not unknown, f"the extender ignores these variables (no such setting): {unknown}"
    settings_file = tmp_path / "settings.yaml"
    settings_file.write_text(find(objs, "ConfigMap", "deepres-extender")["data"]["settings.yaml"])
    for name, value in env.items():  # files the pod mounts (the per-pod certificates) stand in here
        if value.startswith("/etc/deepres/"):
            env[name] = str(tmp_path / Path(value).name)
            Path(env[name]).write_text("x")
    settings = load_settings(str(settings_file), env=env)
    assert settings.policy.telemetry_ttl_s == 40 and settings.policy.usage_margin == 1.2
    assert settings.kube.scheduler_name == "deepres-scheduler"
    assert settings.kube.token_audience == "deepres-extender"
    assert settings.kube.agent_service_accounts == [f"system:serviceaccount:{NAMESPACE}:deepres-agent"]


def agent_args(daemonset: Obj) -> list[str]:
    """The agent's argv, with the kubelet's $(NODE_NAME) expansion or the simulated shell wrapper undone."""
    agent = container(daemonset, "agent")
    if agent.get("command") == ["/bin/sh", "-c"]:
        script = str(agent["args"][0])
        line = script[script.index("exec deepres ") + len("exec deepres "):].replace("\\\n", " ")
        line = line.replace('"$NODE_NAME"', "node-1").replace('"$(cat "$spec_file")"', "2xA100-40GB")
        return line.split()
    return [str(a).replace("$(NODE_NAME)", "node-1") for a in agent["args"]]


def test_agent_args_parse_with_deepres_agent(tmp_path: Path) -> None:
    parser = cli_parser("agent")
    for name in ("defaults", "simulated", "tls"):
        daemonset = find(render(tmp_path, VALUE_SETS[name]), "DaemonSet", "deepres-agent")
        args = parser.parse_args(agent_args(daemonset))
        assert args.command == "agent"


def test_agent_args_say_what_the_contract_says(tmp_path: Path) -> None:
    daemonset = find(render(tmp_path, {}), "DaemonSet", "deepres-agent")
    args = agent_args(daemonset)
    assert "--source=nvml" in args
    assert f"--extender-url=http://deepres-extender.{NAMESPACE}.svc:8888" in args
    assert "--token-file=/var/run/secrets/deepres/token" in args
    pod = daemonset["spec"]["template"]["spec"]
    (projected,) = [v for v in pod["volumes"] if "projected" in v]
    token = projected["projected"]["sources"][0]["serviceAccountToken"]
    assert token["audience"] == "deepres-extender" and token["expirationSeconds"] <= 3600
    assert pod["hostPID"] is True and pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}


GPU_SPECS = ["2xA100-40GB", "1xT4-16GB", "A100-80GB", "2xA100-40GB,1xT4-16GB", "1xRTX-A6000-48GB", "4xH100-80GiB",
             "two big GPUs", "2xA100", "A100-40", "0xT4-16GB", "2xA100-40GB,", ""]


@pytest.mark.parametrize("spec", GPU_SPECS)
def test_schema_accepts_exactly_the_gpu_specs_the_agent_parses(spec: str) -> None:
    from extender.agent.simulated import parse_gpu_spec

    try:
        parse_gpu_spec(spec)
        agent_accepts = True
    except ValueError:
        agent_accepts = False
    schema = json.loads((CHART / "values.schema.json").read_text())
    node_spec = schema["properties"]["agent"]["properties"]["simulated"]["properties"]["nodes"]["additionalProperties"]
    schema_accepts = jsonschema.Draft7Validator(node_spec).is_valid(spec)
    assert schema_accepts == agent_accepts, f"{spec!r}: schema says {schema_accepts}, the agent {agent_accepts}"


def test_simulated_agents_get_their_node_specs(tmp_path: Path) -> None:
    values = VALUE_SETS["simulated"]
    objs = render(tmp_path, values)
    configmap = find(objs, "ConfigMap", "deepres-agent-simulated")
    expected = {"_default": values["agent"]["simulated"]["default"], **values["agent"]["simulated"]["nodes"]}
    assert configmap["data"] == expected
    pod = find(objs, "DaemonSet", "deepres-agent")["spec"]["template"]["spec"]
    assert "runtimeClassName" not in pod and "hostPID" not in pod, "simulated GPUs need no host access"
    assert pod["nodeSelector"] == {"deepres.io/simulated-gpus": "true"}, "null drops the default GPU label"


# --------------------------------------------------------------------------------------------------
# least privilege and pod hardening

EXPECTED_RULES = {
    "deepres-extender": {
        ("", "pods", "get"), ("", "pods", "list"), ("", "pods", "watch"),
        ("", "pods/binding", "create"), ("", "pods/eviction", "create"),
        ("", "nodes", "get"), ("", "nodes", "list"), ("", "nodes", "watch"), ("", "nodes", "patch"),
        ("", "events", "create"), ("", "events", "patch"), ("events.k8s.io", "events", "create"),
        ("events.k8s.io", "events", "patch"), ("authentication.k8s.io", "tokenreviews", "create"),
    },
    "deepres-agent": {
        ("", "pods", "get"), ("", "pods", "list"), ("", "pods", "watch"), ("", "nodes", "get"), ("", "nodes", "patch"),
        ("", "events", "create"),
    },
}


def flat_rules(role: Obj) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_rbac_is_least_privilege(tmp_path: Path) -> None:
    objs = render(tmp_path, {})
    for name, expected in EXPECTED_RULES.items():
        assert flat_rules(find(objs, "ClusterRole", name)) == expected, \
            f"{name}: rights differ from docs/security.md's list"
    bindings = {b["metadata"]["name"]: b for b in objs if b["kind"] == "ClusterRoleBinding"}
    assert {b["roleRef"]["name"] for b in bindings.values()} == {
        "system:kube-scheduler", "system:volume-scheduler", "deepres-extender", "deepres-agent",
    }
    assert all(r["verbs"] != ["*"] and r["resources"] != ["*"] for o in objs if "rules" in o for r in o["rules"])
    lease = find(objs, "Role", "deepres-scheduler-leader-election")
    assert ("coordination.k8s.io", "leases", "update") in flat_rules(lease)
    assert all(r.get("resourceNames") == ["deepres-scheduler"] for r in lease["rules"] if "update" in r["verbs"])
    # the online calibration's ConfigMap: get/update on that name only, in the release namespace; create
    # (RBAC cannot limit a create to a name); bound to the identity the extender runs as
    calibration = find(objs, "Role", "deepres-extender-calibration")
    assert calibration["metadata"]["namespace"] == "deepres"
    assert flat_rules(calibration) == {("", "configmaps", "get"), ("", "configmaps", "update"),
                                       ("", "configmaps", "create")}
    named = [r for r in calibration["rules"] if {"get", "update"} & set(r["verbs"])]
    assert named and all(r.get("resourceNames") == ["deepres-calibration"] for r in named)
    env = {e["name"]: e.get("value") for o in workloads(objs) for c in o["spec"]["template"]["spec"]["containers"]
           if c["name"] == "extender" for e in c.get("env", [])}
    assert env["DEEPRES_CALIBRATION_CONFIGMAP"] == "deepres-calibration"
    assert find(objs, "RoleBinding", "deepres-extender-calibration")["subjects"][0]["name"] == "deepres-scheduler"
    # Sidecar mode: the extender runs under the scheduler's ServiceAccount; separate mode: its own.
    assert bindings["deepres-extender"]["subjects"][0]["name"] == "deepres-scheduler"
    separate = render(tmp_path, VALUE_SETS["separate-extender"])
    assert find(separate, "ClusterRoleBinding", "deepres-extender")["subjects"][0]["name"] == "deepres-extender"
    assert find(separate, "RoleBinding", "deepres-extender-calibration")["subjects"][0]["name"] == "deepres-extender"


def workloads(objs: list[Obj]) -> Iterator[Obj]:
    return (o for o in objs if o["kind"] in ("Deployment", "DaemonSet"))


def test_containers_are_hardened(tmp_path: Path) -> None:
    for name in ("defaults", "separate-extender", "simulated"):
        for workload in workloads(render(tmp_path, VALUE_SETS[name])):
            pod = workload["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True
            for c in pod["containers"]:
                where = f"{name}: {workload['metadata']['name']}/{c['name']}"
                sc = c["securityContext"]
                assert sc["readOnlyRootFilesystem"] is True, where
                assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"], where
                assert "limits" in c["resources"] and "requests" in c["resources"], where
                assert "livenessProbe" in c and "readinessProbe" in c, where


def test_privileged_agent_is_opt_in_and_mounts_the_driver(tmp_path: Path) -> None:
    objs = render(tmp_path, VALUE_SETS["privileged-agent"])
    pod = find(objs, "DaemonSet", "deepres-agent")["spec"]["template"]["spec"]
    assert pod["containers"][0]["securityContext"]["privileged"] is True
    assert "runtimeClassName" not in pod
    assert {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v} == {
        "/dev", "/usr/lib/x86_64-linux-gnu", "/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources",
        "/etc/nvidia-container-runtime"}
    assert not [o for o in objs if o["kind"] == "PodDisruptionBudget"]


# --------------------------------------------------------------------------------------------------
# device plugin and admission policies (docs/device-plugin.md)

MAP_V1 = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"
MAP_V1BETA1 = "admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy"


def extender_service_account(objs: list[Obj]) -> str:
    """The ServiceAccount of the pod whose containers include the extender (`deepres serve`)."""
    for obj in objs:
        if obj["kind"] == "Deployment" and any("serve" in (c.get("args") or []) for c in containers(obj)):
            return f"system:serviceaccount:{NAMESPACE}:{obj['spec']['template']['spec']['serviceAccountName']}"
    raise AssertionError("no Deployment runs the extender")


@pytest.mark.parametrize("values_name", ["defaults", "separate-extender"])
def test_only_the_extenders_own_identity_may_write_the_assignment(tmp_path: Path, values_name: str) -> None:
    objs = render(tmp_path, VALUE_SETS[values_name])
    policy = find(objs, "ValidatingAdmissionPolicy", "deepres-gpu-guard")
    trusted = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}["trusted"]
    assert trusted == f"request.userInfo.username == '{extender_service_account(objs)}'"
    binding = find(objs, "ValidatingAdmissionPolicyBinding", "deepres-gpu-guard")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    excluded = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"][0]
    assert excluded["operator"] == "NotIn" and NAMESPACE in excluded["values"], "the agent's namespace is left out"
    # every annotation the extender writes at bind is one only it may write (`bound-at` was not: a user
    # could set it, and the restore trusted it for attained service and for who wins a GPU)
    from extender.annotations import PREFIX, WRITTEN_KEYS

    guarded = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}["writtenKeys"]
    for key in WRITTEN_KEYS:
        assert key.startswith("assigned-") or f"'{PREFIX}{key}'" in guarded, f"{PREFIX}{key} is not guarded"


def test_the_mutating_policy_is_rendered_where_the_api_server_serves_it(tmp_path: Path) -> None:
    values = write_values(tmp_path, {})
    plain = [d for d in yaml.safe_load_all(helm(*template_args(values, "1.35.0")).stdout) if d]
    assert not [o for o in plain if o["kind"] in ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")]
    assert find(plain, "MutatingWebhookConfiguration")  # the webhook instead (test_webhook_* below)
    for api in (MAP_V1, MAP_V1BETA1):
        version = api.rsplit("/", 1)[0]
        objs = [d for d in yaml.safe_load_all(helm(*template_args(values, "1.36.0"), "--api-versions", api).stdout)
                if d]
        policy = find(objs, "MutatingAdmissionPolicy")
        assert not [o for o in objs if o["kind"] == "MutatingWebhookConfiguration"], "never both"
        assert policy["apiVersion"] == version
        assert find(objs, "MutatingAdmissionPolicyBinding")["spec"]["policyName"] == policy["metadata"]["name"]
        text = json.dumps(policy["spec"]["mutations"])
        assert "deepres-scheduler" in text and "deepres.io/gpu" in text


def test_the_webhook_is_served_where_the_policy_is_not(tmp_path: Path) -> None:
    """Kubernetes 1.34/1.35 without the policy's API: the extender's webhook, wired end to end (the API server
    calls the Service's 443 -> the container's webhook port -> the extender's TLS listener with a certificate
    for the Service's name, signed by the CA the configuration trusts)."""
    import base64

    from cryptography import x509
    from cryptography.x509.oid import ExtensionOID

    objs = render(tmp_path, {})
    hook = find(objs, "MutatingWebhookConfiguration")["webhooks"][0]
    assert hook["admissionReviewVersions"] == ["v1"] and hook["sideEffects"] == "None"
    assert hook["rules"][0]["operations"] == ["CREATE"] and hook["rules"][0]["resources"] == ["pods"]
    assert hook["failurePolicy"] == "Fail" and NAMESPACE in json.dumps(hook["namespaceSelector"])
    ref = hook["clientConfig"]["service"]
    assert ref["path"] == "/v1/mutate" and ref["namespace"] == NAMESPACE
    service = find(objs, "Service", ref["name"])
    port = next(p for p in service["spec"]["ports"] if p["port"] == ref["port"])
    pod = find(objs, "Deployment", "deepres-scheduler")  # sidecar mode: the extender is in the scheduler's pod
    extender = container(pod, "extender")
    target = next(p for p in extender["ports"] if p["name"] == port["targetPort"])
    env = {e["name"]: e.get("value") for e in extender["env"]}
    assert env["DEEPRES_WEBHOOK_BIND"] == f"0.0.0.0:{target['containerPort']}"
    assert env["DEEPRES_MUTATION_WIRING"] == "device-plugin"
    mount = next(m for m in extender["volumeMounts"] if m["name"] == "webhook-tls")
    assert env["DEEPRES_WEBHOOK_TLS_CERT"] == f"{mount['mountPath']}/tls.crt"
    volume = next(v for v in pod["spec"]["template"]["spec"]["volumes"] if v["name"] == "webhook-tls")
    secret = find(objs, "Secret", volume["secret"]["secretName"])
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    authority = x509.load_pem_x509_certificate(base64.b64decode(hook["clientConfig"]["caBundle"]))
    cert.verify_directly_issued_by(authority)  # raises when another CA signed it
    names = cert.extensions.get_extension_for_oid(ExtensionOID.SUBJECT_ALTERNATIVE_NAME).value.get_values_for_type(
        x509.DNSName)
    assert f"{ref['name']}.{NAMESPACE}.svc" in names
    policy = find(objs, "NetworkPolicy", "deepres-extender")
    assert {"ports": [{"port": target["containerPort"], "protocol": "TCP"}]} in policy["spec"]["ingress"]
    # deployment mode: the same wiring in the extender's own Deployment
    objs = render(tmp_path, VALUE_SETS["separate-extender"])
    extender = container(find(objs, "Deployment", "deepres-extender"), "extender")
    assert any(p["name"] == "webhook" for p in extender["ports"])
    # forced off the auto choice, either way; never both
    forced = render(tmp_path, {"admission": {"mutation": {"mode": "policy"}}})
    assert not [o for o in forced if o["kind"] in ("MutatingWebhookConfiguration", "Secret")]
    objs = [d for d in yaml.safe_load_all(helm(*template_args(write_values(tmp_path, {"admission": {"mutation": {
        "mode": "webhook"}}}), "1.36.0"), "--api-versions", MAP_V1).stdout) if d]
    assert find(objs, "MutatingWebhookConfiguration")
    assert not [o for o in objs if o["kind"] == "MutatingAdmissionPolicy"]
    off = render(tmp_path, {"admission": {"mutation": {"enabled": False}}})
    assert not [o for o in off if o["kind"] == "MutatingWebhookConfiguration"]
    assert "DEEPRES_WEBHOOK_BIND" not in json.dumps(off)


def test_the_webhook_with_an_admins_certificate_needs_its_ca(tmp_path: Path) -> None:
    error = render_error(tmp_path, {"admission": {"mutation": {"webhook": {"secretName": "my-webhook-cert"}}}})
    assert "caBundle" in error and "my-webhook-cert" in error
    objs = render(tmp_path, {"admission": {"mutation": {"webhook": {"secretName": "my-webhook-cert",
                                                                     "caBundle": "Q0E="}}}})
    assert not [o for o in objs if o["kind"] == "Secret"]  # the admin's Secret, not one of the chart's
    assert find(objs, "MutatingWebhookConfiguration")["webhooks"][0]["clientConfig"]["caBundle"] == "Q0E="
    volume = next(v for v in find(objs, "Deployment", "deepres-scheduler")["spec"]["template"]["spec"]["volumes"]
                  if v["name"] == "webhook-tls")
    assert volume["secret"]["secretName"] == "my-webhook-cert"


def test_without_the_device_plugin_the_mutation_adds_the_env_wiring(tmp_path: Path) -> None:
    values = write_values(tmp_path, {"devicePlugin": {"enabled": False}})
    rendered = helm(*template_args(values, "1.36.0"), "--api-versions", MAP_V1).stdout
    objs = [d for d in yaml.safe_load_all(rendered) if d]
    text = json.dumps(find(objs, "MutatingAdmissionPolicy")["spec"]["mutations"])
    assert "NVIDIA_VISIBLE_DEVICES" in text and "deepres.io/gpu" not in text
    agent = find(objs, "DaemonSet", "deepres-agent")
    assert not any("--device-plugin" in a for a in container(agent, "agent").get("args") or [])
    assert not [v for v in agent["spec"]["template"]["spec"]["volumes"] if "hostPath" in v]


def test_the_agent_serves_the_device_plugin_in_the_kubelets_folder(tmp_path: Path) -> None:
    objs = render(tmp_path, {"devicePlugin": {"deviceListStrategy": "cdi", "slotsPerGpu": 8}})
    agent = find(objs, "DaemonSet", "deepres-agent")
    args = container(agent, "agent")["args"]
    assert {"--device-plugin", "--device-list-strategy=cdi", "--device-plugin-slots=8"} <= set(args)
    mounts = {m["name"]: m["mountPath"] for m in container(agent, "agent")["volumeMounts"]}
    volumes = {v["name"]: v for v in agent["spec"]["template"]["spec"]["volumes"]}
    kubelet_dir = "/var/lib/kubelet/device-plugins"
    assert volumes["device-plugins"]["hostPath"]["path"] == mounts["device-plugins"] == kubelet_dir
    security = container(agent, "agent")["securityContext"]
    assert security["runAsUser"] == 0 and security["capabilities"]["drop"] == ["ALL"]
    assert security["allowPrivilegeEscalation"] is False
    # simulated agents (kind, kwok) start no plugin
    simulated = find(render(tmp_path, VALUE_SETS["simulated"]), "DaemonSet", "deepres-agent")
    assert "--device-plugin" not in json.dumps(simulated)


def test_bad_device_plugin_values_are_refused(tmp_path: Path) -> None:
    assert "deviceListStrategy" in render_error(tmp_path, {"devicePlugin": {"deviceListStrategy": "magic"}})
    assert "slotsPerGpu" in render_error(tmp_path, {"devicePlugin": {"slotsPerGpu": 0}})
    assert "actions" in render_error(tmp_path, {"admission": {"validation": {"actions": ["Block"]}}})


# --------------------------------------------------------------------------------------------------
# config changes roll the pods


def pod_annotations(objs: list[Obj], kind: str, name: str) -> dict[str, str]:
    annotations: dict[str, str] = find(objs, kind, name)["spec"]["template"]["metadata"]["annotations"]
    return annotations


def test_config_changes_change_the_pod_checksums(tmp_path: Path) -> None:
    base = render(tmp_path, {})
    changed_settings = render(tmp_path, {"extender": {"settings": {"log_json": True}}})
    changed_weight = render(tmp_path, {"extender": {"weight": 3}})
    key = "checksum/extender-config"
    assert pod_annotations(base, "Deployment", "deepres-scheduler")[key] != \
        pod_annotations(changed_settings, "Deployment", "deepres-scheduler")[key]
    key = "checksum/scheduler-config"
    assert pod_annotations(base, "Deployment", "deepres-scheduler")[key] != \
        pod_annotations(changed_weight, "Deployment", "deepres-scheduler")[key]
    sim = VALUE_SETS["simulated"]
    sim2 = json.loads(json.dumps(sim))
    sim2["agent"]["simulated"]["nodes"]["worker-3"] = "4xH100-80GB"
    key = "checksum/agent-simulated"
    assert pod_annotations(render(tmp_path, sim), "DaemonSet", "deepres-agent")[key] != \
        pod_annotations(render(tmp_path, sim2), "DaemonSet", "deepres-agent")[key]


def test_settings_reach_the_extender_config_file(tmp_path: Path) -> None:
    settings = {"usage_margin": 1.3, "threads": 16, "policy": {"fragmentation_weight": 0.3}}
    objs = render(tmp_path, {"extender": {"settings": settings}})
    assert yaml.safe_load(find(objs, "ConfigMap", "deepres-extender")["data"]["settings.yaml"]) == settings


# --------------------------------------------------------------------------------------------------
# bad values fail with a why and a fix

CONFLICTS = [
    ({"scheduler": {"replicas": 2}}, "extender.mode=deployment"),
    ({"extender": {"mode": "deployment"}, "scheduler": {"replicas": 3, "leaderElection": {"enabled": False}}},
     "scheduler.leaderElection.enabled=true"),
    ({"extender": {"tls": {"enabled": True}}}, "extender.tls.secretName"),
    ({"extender": {"mode": "deployment"}, "scheduler": {"replicas": 2}}, "extender.tls.clientSecretName to a"),
    ({"extender": {"mode": "deployment", "verbsAccess": "loopback"}}, "leave extender.verbsAccess empty"),
    ({"extender": {"schedulerPort": 8888}}, "set extender.schedulerPort to another port"),
    ({"extender": {"settings": {"scheduler_bind": "0.0.0.0:9000"}}}, "set extender.schedulerPort instead"),
    ({"extender": {"settings": {"verbs_access": "any"}}}, "set extender.verbsAccess instead"),
    ({"agent": {"source": "simulated", "simulated": {"default": "", "nodes": {}}}}, "agent.simulated.default"),
    ({"agent": {"source": "simulated", "privileged": True}}, "agent.privileged=false"),
    ({"telemetry": {"ttlSeconds": 10}, "agent": {"heartbeatSeconds": 15}}, "telemetry.ttlSeconds"),
    ({"pdb": {"minAvailable": 1}}, "pdb.minAvailable"),
    ({"scheduler": {"enabled": False}}, "extender.mode=deployment (the extender gets its own"),
    ({"extender": {"settings": {"telemetry_ttl_s": 60}}}, "set telemetry.ttlSeconds instead"),
    ({"extender": {"settings": {"kube": {"scheduler_name": "x"}}}}, "set scheduler.name instead"),
]


@pytest.mark.parametrize(("values", "fix"), CONFLICTS, ids=[fix for _, fix in CONFLICTS])
def test_conflicting_values_fail_with_why_and_fix(values: dict[str, Any], fix: str, tmp_path: Path) -> None:
    error = render_error(tmp_path, values)
    assert "Fix:" in error and fix in error, error


def test_servicemonitor_without_the_crd_fails_with_why_and_fix(tmp_path: Path) -> None:
    path = write_values(tmp_path, {"metrics": {"serviceMonitor": {"enabled": True}}})
    result = helm("template", RELEASE, str(CHART), "-f", str(path), check=False)
    assert result.returncode != 0 and "Prometheus Operator" in result.stderr and "Fix:" in result.stderr


BAD_VALUES = [
    ({"extender": {"mode": "daemonset"}}, "/extender/mode"),
    ({"agent": {"tokenExpirationSeconds": 60}}, "/agent/tokenExpirationSeconds"),
    ({"agent": {"source": "dcgm"}}, "/agent/source"),
    ({"agent": {"simulated": {"nodes": {"worker-1": "two big GPUs"}}}}, "/agent/simulated/nodes/worker-1"),
    ({"extender": {"httpTimeout": 5}}, "/extender/httpTimeout"),
    ({"extender": {"weight": 0}}, "/extender/weight"),
    ({"scheduler": {"name": "Deepres_Scheduler"}}, "/scheduler/name"),
    ({"schedulerName": "deepres"}, "schedulerName"),
]


@pytest.mark.parametrize(("values", "path"), BAD_VALUES, ids=[p for _, p in BAD_VALUES])
def test_values_schema_rejects_bad_values(values: dict[str, Any], path: str, tmp_path: Path) -> None:
    error = render_error(tmp_path, values)
    assert "schema" in error and path in error, error


def test_every_values_key_is_documented() -> None:
    """Every leaf key of values.yaml has a `## @param` line and a place in values.schema.json."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    params = set(re.findall(r"## @param (\S+)", (CHART / "values.yaml").read_text()))
    schema = json.loads((CHART / "values.schema.json").read_text())

    def leaves(node: Any, prefix: str) -> Iterator[str]:
        if isinstance(node, dict) and node and prefix not in params:
            for key, value in node.items():
                yield from leaves(value, f"{prefix}.{key}" if prefix else key)
        else:
            yield prefix

    for key in leaves(values, ""):
        assert key in params, f"values.yaml key {key} has no `## @param {key}` comment"
        node = schema
        for part in key.split("."):
            node = node["properties"][part]
        assert node.get("description"), f"values.schema.json has no description for {key}"
    stray = params - set(leaves(values, ""))
    assert not stray, f"@param for keys that do not exist: {stray}"


def test_docs_values_table_lists_every_key() -> None:
    params = re.findall(r"## @param (\S+)", (CHART / "values.yaml").read_text())
    table = (REPO / "docs" / "values.md").read_text()
    missing = [key for key in params if f"| `{key}` |" not in table]
    assert not missing, f"docs/values.md's values table lacks {missing}"


# --------------------------------------------------------------------------------------------------
# NOTES, dashboard, rendered manifest


def test_notes_tell_the_admin_how_to_verify(tmp_path: Path) -> None:
    for name in ("defaults", "simulated"):
        result = helm("install", RELEASE, str(CHART), "--dry-run=client", "--namespace", NAMESPACE,
                      "-f", str(write_values(tmp_path, VALUE_SETS[name])))
        notes = result.stdout.split("NOTES:", 1)[1]
        assert "rollout status deployment/deepres-scheduler" in notes
        assert "/readyz" in notes and "assigned-gpus" in notes and "get events" in notes
        assert ("WARNING: agent.source=simulated" in notes) == (name == "simulated")


def dashboard_metrics() -> set[str]:
    dashboard = json.loads((CHART / "dashboards" / "deepres.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    return {m for expr in exprs for m in re.findall(r"\b(deepres_[a-z0-9_]+)", expr)}


def registered(metric: str, sources: str) -> bool:
    """A queried series name is registered as itself, or as the histogram/counter it is a series of."""
    base = re.sub(r"_(bucket|sum|count)$", "", metric)
    candidates = {metric, base, base.removesuffix("_total")}
    return any(f'"{c}"' in sources for c in candidates)


def test_dashboard_covers_the_four_views_and_renders(tmp_path: Path) -> None:
    dashboard = json.loads((CHART / "dashboards" / "deepres.json").read_text())
    titles = " | ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("latency", "predicted", "gpu memory", "stale"):
        assert topic in titles, f"no dashboard panel about {topic!r}: {titles}"
    configmap = find(render(tmp_path, {}), "ConfigMap", "deepres-dashboard")
    assert json.loads(configmap["data"]["deepres.json"]) == dashboard
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_dashboard_metrics_exist_in_the_code() -> None:
    """Each metric a panel queries is registered somewhere in extender/ (agent or extender)."""
    sources = "\n".join(p.read_text() for p in (REPO / "extender").rglob("*.py"))
    missing = sorted(m for m in dashboard_metrics() if not registered(m, sources))
    assert not missing, f"dashboard queries metrics no code registers: {missing}"


def test_rendered_manifest_is_up_to_date(tmp_path: Path) -> None:
    fresh = tmp_path / "deepres.yaml"
    subprocess.run(["bash", str(RENDER_SCRIPT), str(fresh)], check=True, capture_output=True, timeout=120)
    assert MANIFEST.exists(), "deploy/manifests/deepres.yaml is missing: run `bash deploy/manifests/render.sh`"
    assert fresh.read_text() == MANIFEST.read_text(), (
        "deploy/manifests/deepres.yaml is out of date with helm/deepres: regenerate it with "
        "`bash deploy/manifests/render.sh` and commit the result"
    )
    objs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    assert objs[0]["kind"] == "Namespace", "the manifest creates its namespace first (kubectl apply -f works alone)"
    for obj in objs:
        validate_object(obj, "1.35.0")
