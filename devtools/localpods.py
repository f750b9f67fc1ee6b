"""Run a pod's container as a local process, the way the kubelet would start it (local control plane).

Why: without a container runtime the chart's pods (the scheduler with its extender sidecar, the
agent DaemonSet) still exist as API objects, admitted by the API server and "running" under kwok,
but nothing runs their containers. This module runs one container of such a pod on this machine
from the pod object itself: the container's command and args, its env (values and the downward
API), its volumes (ConfigMaps, Secrets, emptyDirs, projected ServiceAccount tokens requested with
TokenRequest bound to the pod, as the kubelet does) mapped to local folders, and API access with a
token of the pod's ServiceAccount. So the chart's configuration and RBAC are what runs.

What differs from a pod, and only this: paths under a volume's mountPath point into a local folder;
the caller may rewrite listen addresses (every pod has its own network namespace, local processes
share one); kube-scheduler gets `--kubeconfig` (in a pod it uses the in-cluster config) and its
own `--secure-port`; an image's entrypoint is the matching local program (IMAGE_PROGRAMS).
"""

from __future__ import annotations

import base64
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools.localcluster import env_for, write_kubeconfig

#: a pod's API token lifetime here (the kubelet asks for about an hour and renews; a test run is shorter)
API_TOKEN_SECONDS = 24 * 3600


@dataclass(frozen=True)
class LocalContainer:
    """What to run for one container: argv, environment, and the folder holding its volumes."""

    pod: str
    container: str
    argv: list[str]
    env: dict[str, str]
    root: Path
    #: mountPath in the pod -> the local folder standing for it
    mounts: dict[str, str] = field(default_factory=dict)

    def localize(self, text: str) -> str:
        """`text` with every path under one of the container's mountPaths pointing into its local folder."""
        for mount in sorted(self.mounts, key=len, reverse=True):
            text = re.sub(r"(?<![\w/.-])" + re.escape(mount) + r"(?=/|$|[\"'\s])", self.mounts[mount], text)
        return text


def image_programs(bin_dir: Path) -> dict[str, list[str]]:
    """Image repository -> the local program its entrypoint is (deepres images: `deepres`)."""
    deepres = [sys.executable, "-m", "extender.cli"]
    return {"deepres/extender": deepres, "deepres/agent": deepres,
            "registry.k8s.io/kube-scheduler": [str(bin_dir / "kube-scheduler")]}


def _repository(image: str) -> str:
    name = image.split("@", 1)[0]
    head, sep, tail = name.rpartition(":")
    return head if sep and "/" not in tail else name


def _token(core: Any, pod: Mapping[str, Any], audience: str | None, seconds: int) -> str:
    """A ServiceAccount token bound to `pod` (what the kubelet writes into a projected volume)."""
    from kubernetes import client

    meta = pod["metadata"]
    spec = client.V1TokenRequestSpec(
        audiences=[audience] if audience else [], expiration_seconds=seconds,
        bound_object_ref=client.V1BoundObjectReference(api_version="v1", kind="Pod", name=meta["name"],
                                                       uid=meta["uid"]))
    result = core.create_namespaced_service_account_token(
        pod["spec"].get("serviceAccountName") or "default", meta["namespace"], client.AuthenticationV1TokenRequest(
            spec=spec))
    token: str = result.status.token
    return token


def _field(pod: Mapping[str, Any], path: str) -> str:
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
    match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    values = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"], "metadata.uid": meta["uid"],
              "spec.nodeName": spec.get("nodeName", ""), "spec.serviceAccountName": spec.get("serviceAccountName", ""),
              "status.podIP": status.get("podIP", ""), "status.hostIP": status.get("hostIP", "")}
    if path not in values:
        raise ValueError(f"fieldRef {path} is not supported by the local runner")
    return str(values[path])


def _write_volume(core: Any, pod: Mapping[str, Any], volume: Mapping[str, Any], target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    namespace = pod["metadata"]["namespace"]

    def write_items(data: Mapping[str, str], items: list[dict[str, Any]] | None, decode: bool) -> None:
        wanted = {i["key"]: i["path"] for i in items} if items else {k: k for k in data}
        for key, rel in wanted.items():
            if key in data:
                path = target / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(base64.b64decode(data[key]) if decode else data[key].encode())

    if "emptyDir" in volume:
        return
    if "configMap" in volume:
        cm = core.read_namespaced_config_map(volume["configMap"]["name"], namespace)
        write_items(cm.data or {}, volume["configMap"].get("items"), decode=False)
    elif "secret" in volume:
        secret = core.read_namespaced_secret(volume["secret"]["secretName"], namespace)
        write_items(secret.data or {}, volume["secret"].get("items"), decode=True)
    elif "projected" in volume:
        for source in volume["projected"]["sources"]:
            if "serviceAccountToken" in source:
                sat = source["serviceAccountToken"]
                token = _token(core, pod, sat.get("audience"), int(sat.get("expirationSeconds", 3600)))
                (target / sat["path"]).write_text(token)
            elif "configMap" in source:
                cm = core.read_namespaced_config_map(source["configMap"]["name"], namespace)
                write_items(cm.data or {}, source["configMap"].get("items"), decode=False)
            elif "downwardAPI" in source:
                for item in source["downwardAPI"].get("items") or []:
                    (target / item["path"]).write_text(_field(pod, item["fieldRef"]["fieldPath"]))
            else:
                raise ValueError(f"projected source {sorted(source)} is not supported by the local runner")
    else:
        raise ValueError(f"volume {volume['name']}: kind {sorted(set(volume) - {'name'})} is not supported locally")


def _expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in command and args ($$ escapes)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def prepare(
    core: Any, server: str, ca_file: Path, pod: Mapping[str, Any], container: str, root: Path, bin_dir: Path,
    *, rewrite: Mapping[str, str] | None = None, extra_args: list[str] | None = None,
) -> LocalContainer:
    """Everything needed to start `container` of `pod` locally; volumes and tokens are written now."""
    spec = pod["spec"]
    # an init container too (the kubelet runs those first, to the end: the caller does the same)
    (c,) = [c for c in [*(spec.get("initContainers") or []), *spec["containers"]] if c["name"] == container]
    here = root / f"{pod['metadata']['name']}-{container}"
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    mounts: dict[str, str] = {}
    for mount in c.get("volumeMounts") or []:
        if mount.get("subPath"):
            raise ValueError(f"volumeMount {mount['name']}: subPath is not supported by the local runner")
        # an emptyDir that several containers mount (e.g. one an init container fills) is the pod's, shared
        shared = "emptyDir" in volumes[mount["name"]] and sum(
            any(m["name"] == mount["name"] for m in other.get("volumeMounts") or [])
            for other in [*(spec.get("initContainers") or []), *spec["containers"]]) > 1
        local = (root / f"{pod['metadata']['name']}-emptydir" if shared else here / "volumes") / mount["name"]
        _write_volume(core, pod, volumes[mount["name"]], local)
        mounts[mount["mountPath"].rstrip("/")] = str(local)

    # one pass over all mount paths (longest first), so a local folder is never rewritten again
    pattern = re.compile(r"(?<![\w/.-])(" + "|".join(re.escape(m) for m in sorted(mounts, key=len, reverse=True))
                         + r")(?=/|$|[\"'\s])") if mounts else None

    def localize(text: str) -> str:
        if pattern is not None:
            text = pattern.sub(lambda m: mounts[m.group(1)], text)
        for old, new in (rewrite or {}).items():
            text = text.replace(old, new)
        return text

    env: dict[str, str] = {}
    for item in c.get("env") or []:
        if "value" in item:
            env[item["name"]] = localize(_expand(str(item["value"]), env))
        elif "fieldRef" in (item.get("valueFrom") or {}):
            env[item["name"]] = _field(pod, item["valueFrom"]["fieldRef"]["fieldPath"])
        else:
            raise ValueError(f"env {item['name']}: only values and fieldRefs are supported by the local runner")
    programs = image_programs(bin_dir)
    repository = _repository(c["image"])
    entry = next((argv for repo, argv in programs.items() if repository.endswith(repo)), None)
    # Only what the pod spec says is localized: never the local program (the interpreter or a binary,
    # which may well live under a path the pod mounts, e.g. a checkout under /tmp).
    spec_args = [localize(_expand(a, env)) for a in c.get("args") or []]
    if c.get("command"):
        command = list(c["command"])
        local_program = next((argv for repo, argv in programs.items() if repo.endswith("/" + command[0])), None)
        program = local_program or [localize(_expand(command[0], env))]
        argv = [*program, *(localize(_expand(a, env)) for a in command[1:]), *spec_args]
    elif entry is not None:
        argv = [*entry, *spec_args]
    else:
        raise ValueError(f"image {c['image']}: no local program for it and no command")
    argv += list(extra_args or [])
    api_kubeconfig = here / "kubeconfig"
    if spec.get("automountServiceAccountToken", True):
        write_kubeconfig(api_kubeconfig, server, ca_file, token=_token(core, pod, None, API_TOKEN_SECONDS),
                         user=spec.get("serviceAccountName") or "default")
    shims = here / "bin"
    shims.mkdir(parents=True, exist_ok=True)
    deepres = shims / "deepres"
    deepres.write_text(f"#!/bin/sh\nexec {sys.executable} -m extender.cli \"$@\"\n")
    deepres.chmod(0o755)
    full_env = env_for(api_kubeconfig)
    full_env.update(env)
    full_env["PATH"] = f"{shims}:{full_env.get('PATH', '/usr/bin:/bin')}"
    return LocalContainer(pod["metadata"]["name"], container, argv, full_env, here, mounts)
