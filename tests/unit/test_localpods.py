"""The local pod runner: a pod's container becomes the command the kubelet would run, with its
volumes mapped to local folders, its env resolved, and tokens requested for the pod itself."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from devtools.localpods import prepare


class Core:
    """Only the calls the runner makes: ConfigMaps and TokenRequests (recorded)."""

    def __init__(self) -> None:
        self.token_requests: list[tuple[str, str, Any]] = []

    def read_namespaced_config_map(self, name: str, namespace: str) -> Any:
        data = {"settings": {"settings.yaml": "threads: 4\n"}, "kube-root-ca.crt": {"ca.crt": "CA"},
                "sim": {"node-a": "1xT4-16GB"}}[name]
        return SimpleNamespace(data=data)

    def create_namespaced_service_account_token(self, name: str, namespace: str, body: Any) -> Any:
        self.token_requests.append((name, namespace, body.spec))
        audiences = ",".join(body.spec.audiences) or "api"
        return SimpleNamespace(status=SimpleNamespace(token=f"token-for-{audiences}"))


def pod() -> dict[str, Any]:
    return {
        "metadata": {"name": "p-1", "namespace": "deepres", "uid": "u-1", "annotations": {"a": "x"}},
        "spec": {
            "serviceAccountName": "agent", "nodeName": "node-a",
            "containers": [{
                "name": "agent", "image": "deepres/agent:e2e",
                "command": ["/bin/sh", "-c"],
                "args": ['spec="/etc/sim/$NODE_NAME"; exec deepres agent --token-file=/var/run/tok/token '
                         "--listen=0.0.0.0:9400 --home=$(HOME)"],
                "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                        {"name": "HOME", "value": "/tmp"},
                        {"name": "ANN", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['a']"}}}],
                "volumeMounts": [{"name": "sim", "mountPath": "/etc/sim"}, {"name": "tok", "mountPath": "/var/run/tok"},
                                 {"name": "tmp", "mountPath": "/tmp"}],
            }, {
                "name": "extender", "image": "registry.example/deepres/extender:1.0",
                "args": ["serve", "--config=/etc/c/settings.yaml"],
                "volumeMounts": [{"name": "settings", "mountPath": "/etc/c"}],
            }],
            "volumes": [
                {"name": "sim", "configMap": {"name": "sim"}},
                {"name": "settings", "configMap": {"name": "settings"}},
                {"name": "tmp", "emptyDir": {}},
                {"name": "tok", "projected": {"sources": [{"serviceAccountToken": {
                    "audience": "deepres-extender", "expirationSeconds": 600, "path": "token"}}]}},
            ],
        },
    }


def test_volumes_env_and_paths_are_local_and_tokens_are_bound_to_the_pod(tmp_path: Path) -> None:
    core = Core()
    local = prepare(core, "https://127.0.0.1:1", tmp_path / "ca.crt", pod(), "agent", tmp_path, tmp_path / "bin",
                    rewrite={"--listen=0.0.0.0:9400": "--listen=127.0.0.1:5555"})
    here = tmp_path / "p-1-agent" / "volumes"
    assert local.argv[:2] == ["/bin/sh", "-c"]
    script = local.argv[2]
    assert f'spec="{here}/sim/$NODE_NAME"' in script, script
    assert f"--token-file={here}/tok/token" in script
    assert "--listen=127.0.0.1:5555" in script
    assert f"--home={here}/tmp" in script, "$(HOME) expands to the local emptyDir"
    assert (here / "sim" / "node-a").read_text() == "1xT4-16GB"
    assert (here / "tok" / "token").read_text() == "token-for-deepres-extender"
    assert local.env["NODE_NAME"] == "node-a" and local.env["ANN"] == "x"
    assert local.env["HOME"] == str(here / "tmp")
    assert "KUBERNETES_SERVICE_HOST" not in local.env
    assert Path(local.env["KUBECONFIG"]).read_text().count("token-for-api") == 1
    for name, namespace, spec in core.token_requests:
        assert (name, namespace) == ("agent", "deepres")
        assert (spec.bound_object_ref.kind, spec.bound_object_ref.name, spec.bound_object_ref.uid) == (
            "Pod", "p-1", "u-1")
    assert local.env["PATH"].split(":")[0] == str(tmp_path / "p-1-agent" / "bin"), "`deepres` resolves to this tree"


def test_an_image_entrypoint_becomes_the_local_program(tmp_path: Path) -> None:
    local = prepare(Core(), "https://127.0.0.1:1", tmp_path / "ca.crt", pod(), "extender", tmp_path, tmp_path)
    assert local.argv[:3] == [sys.executable, "-m", "extender.cli"]
    assert local.argv[3:] == ["serve", f"--config={tmp_path}/p-1-extender/volumes/settings/settings.yaml"]


def test_unsupported_volume_kinds_are_refused_by_name(tmp_path: Path) -> None:
    spec = pod()
    spec["spec"]["volumes"][0] = {"name": "sim", "hostPath": {"path": "/dev"}}
    with pytest.raises(ValueError, match=r"sim.*hostPath"):
        prepare(Core(), "https://127.0.0.1:1", tmp_path / "ca.crt", spec, "agent", tmp_path, tmp_path)


def test_the_local_program_is_never_rewritten_even_under_a_mounted_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkout (and its interpreter) under /tmp, a pod mounting an emptyDir at /tmp: only the
    container's own args are mapped (a CI clone under /tmp once broke this)."""
    monkeypatch.setattr("devtools.localpods.sys.executable", "/tmp/trial/.venv/bin/python")
    spec = pod()
    extender = spec["spec"]["containers"][1]
    extender["volumeMounts"].append({"name": "tmp", "mountPath": "/tmp"})
    extender["args"].append("--cache=/tmp/cache")
    local = prepare(Core(), "https://127.0.0.1:1", tmp_path / "ca.crt", spec, "extender", tmp_path, tmp_path)
    assert local.argv[0] == "/tmp/trial/.venv/bin/python"
    # the emptyDir both containers mount is the pod's, one folder for both (as the kubelet has it)
    assert local.argv[-1] == f"--cache={tmp_path}/p-1-emptydir/tmp/cache"
    shim = (tmp_path / "p-1-extender" / "bin" / "deepres").read_text()
    assert "exec /tmp/trial/.venv/bin/python -m extender.cli" in shim
