"""`deepres pod-certs` and the scheduler's listener together (issue 34, row 13): the certificates made
in the pod let kube-scheduler's client certificate through the TLS handshake on 127.0.0.1, and nothing
else: no certificate, or one from another pod's CA, fails the handshake before any verb is read."""

from __future__ import annotations

import http.client
import ssl
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from devtools.localserver import free_port
from extender.cli import main
from extender.server.scheduler_listener import SchedulerListener, server_context


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    assert environ["deepres.caller_admitted"] is True
    start_response("200 OK", [("Content-Type", "application/json")])
    return [b'{"NodeNames": ["n1"]}']


def call(port: int, ctx: ssl.SSLContext) -> int:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=5)
    try:
        conn.request("POST", "/filter", b"{}", {"Content-Type": "application/json"})
        return conn.getresponse().status
    finally:
        conn.close()


def test_pod_certificates_admit_the_scheduler_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("cryptography")
    server, scheduler, other = tmp_path / "server", tmp_path / "client", tmp_path / "other"
    assert main(["pod-certs", "--server-dir", str(server), "--client-dir", str(scheduler)]) == 0
    assert main(["pod-certs", "--server-dir", str(tmp_path / "s2"), "--client-dir", str(other)]) == 0
    first = (server / "tls.key").read_bytes()
    assert main(["pod-certs", "--server-dir", str(server), "--client-dir", str(scheduler)]) == 0
    assert (server / "tls.key").read_bytes() == first and "kept" in capsys.readouterr().out  # a restart keeps them
    assert not (server / "client.key").exists() and not (scheduler / "tls.key").exists()  # each half apart
    port = free_port()
    listener = SchedulerListener(app, bind=f"127.0.0.1:{port}", access="mtls",
                                 ssl_context=server_context(str(server / "tls.crt"), str(server / "tls.key"),
                                                            str(server / "ca.crt")),
                                 max_connections=8, header_timeout_s=2.0, body_timeout_s=2.0, max_body_bytes=1024)
    listener.start()
    try:
        def client(d: Path, with_cert: bool) -> ssl.SSLContext:
            ctx = ssl.create_default_context(cafile=str(scheduler / "ca.crt"))  # checks 127.0.0.1 in the SAN
            if with_cert:
                ctx.load_cert_chain(str(d / "client.crt"), str(d / "client.key"))
            return ctx

        assert call(port, client(scheduler, True)) == 200
        for ctx in (client(scheduler, False), client(other, True)):
            with pytest.raises((ssl.SSLError, ConnectionError, http.client.RemoteDisconnected, OSError)):
                call(port, ctx)
    finally:
        listener.stop()
