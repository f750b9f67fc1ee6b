"""Deployment mode's guard on the verbs (issue 13, item 2): `deepres serve --verbs-access mtls` under
gunicorn, with certificates made by openssl. The verbs answer only a client certificate signed by the
scheduler's CA (what kube-scheduler's extender `tlsConfig.certFile/keyFile` presents); probes and
agents, which present none, are still served."""

from __future__ import annotations

import http.client
import json
import shutil
import ssl
import subprocess
import time
from pathlib import Path

import pytest

from devtools.localserver import LocalServer
from tests.fixtures.kube.payloads import CNN_ANNOTATIONS, extender_args, pod, report
from tests.fixtures.kube.server import TOKEN

DOUBLE = {"DEEPRES_PREDICTOR_FACTORY": "tests.fixtures.kube.doubles:make_predictor"}
OPENSSL = shutil.which("openssl")
pytestmark = pytest.mark.skipif(OPENSSL is None, reason="needs the openssl command to make certificates")


def openssl(*args: str, cwd: Path) -> None:
    assert OPENSSL is not None
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def ca(name: str, cwd: Path) -> None:
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1",
            "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.crt", cwd=cwd)


def signed(name: str, by: str, cwd: Path, extension: str) -> None:
    (cwd / f"{name}.ext").write_text(extension + "\n")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", f"/CN={name}",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=cwd)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{by}.crt", "-CAkey", f"{by}.key", "-CAcreateserial",
            "-days", "1", "-out", f"{name}.crt", "-extfile", f"{name}.ext", cwd=cwd)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make certificates")
    d = tmp_path_factory.mktemp("pki")
    for name in ("server-ca", "scheduler-ca", "rogue-ca"):
        ca(name, d)
    signed("server", "server-ca", d, "subjectAltName=IP:127.0.0.1,DNS:localhost")
    signed("scheduler", "scheduler-ca", d, "extendedKeyUsage=clientAuth")
    signed("rogue", "rogue-ca", d, "extendedKeyUsage=clientAuth")
    return d


def context(pki: Path, client: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "server-ca.crt"))
    if client:
        ctx.load_cert_chain(str(pki / f"{client}.crt"), str(pki / f"{client}.key"))
    return ctx


def call(server: LocalServer, ctx: ssl.SSLContext, method: str, path: str, body: object = None,
         token: str = "") -> tuple[int, object]:
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=ctx, timeout=10)
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    try:
        conn.request(method, path, None if body is None else json.dumps(body).encode(), headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        conn.close()


def test_the_verbs_answer_only_the_schedulers_certificate(pki: Path, tmp_path: Path) -> None:
    env = {**DOUBLE, "DEEPRES_ENGINE": "gunicorn"}
    args = ["--tls-cert", str(pki / "server.crt"), "--tls-key", str(pki / "server.key"),
            "--tls-client-ca", str(pki / "scheduler-ca.crt"), "--verbs-access", "mtls"]
    with LocalServer(tmp_path, token=TOKEN, env=env, args=args, tls=context(pki, None)) as server:
        anonymous, scheduler = context(pki, None), context(pki, "scheduler")
        # the agents and the probes present no certificate and are served
        assert call(server, anonymous, "GET", "/healthz")[0] == 200
        status, _ = call(server, anonymous, "POST", "/v1/telemetry", report("n1", 1, time.time(), [(40960.0, 0.0)]),
                         token=TOKEN)
        assert status == 200
        body = extender_args(pod("p", CNN_ANNOTATIONS), names=["n1"])
        status, out = call(server, anonymous, "POST", "/filter", body)
        assert status == 403 and "client certificate" in out["error"]  # type: ignore[index]
        status, out = call(server, scheduler, "POST", "/filter", body)
        assert status == 200 and out["NodeNames"] == ["n1"]  # type: ignore[index]
        # a certificate from any other CA does not even complete the handshake
        with pytest.raises((ssl.SSLError, ConnectionError, http.client.RemoteDisconnected)):
            call(server, context(pki, "rogue"), "POST", "/bind", {"PodName": "p", "PodNamespace": "default",
                                                                   "PodUID": "u", "Node": "n1"})


def test_granian_serves_https_through_the_rsgi_bridge(pki: Path, tmp_path: Path) -> None:
    """The sidecar with `extender.tls.enabled`: HTTPS under granian, the verbs on loopback only."""
    args = ["--tls-cert", str(pki / "server.crt"), "--tls-key", str(pki / "server.key")]
    with LocalServer(tmp_path, token=TOKEN, env={**DOUBLE, "DEEPRES_ENGINE": "granian"}, args=args,
                     tls=context(pki, None)) as server:
        anonymous = context(pki, None)
        status, _ = call(server, anonymous, "POST", "/v1/telemetry", report("n1", 1, time.time(), [(40960.0, 0.0)]),
                         token=TOKEN)
        assert status == 200
        status, out = call(server, anonymous, "POST", "/filter", extender_args(pod("p", CNN_ANNOTATIONS), names=["n1"]))
        assert status == 200 and out["NodeNames"] == ["n1"]  # type: ignore[index]
        assert call(server, anonymous, "GET", "/readyz")[0] == 200
