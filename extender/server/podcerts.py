"""`deepres pod-certs`: a per-pod CA, the scheduler listener's certificate and kube-scheduler's client
certificate, made at pod start (the chart's init container in sidecar mode).

In sidecar mode every caller on 127.0.0.1 looked like the scheduler container, and `kubectl
port-forward` and sibling containers arrive from loopback too (issue 34). kube-scheduler's extender
client sends no custom header and its `urlPrefix` is HTTP(S) only (no Unix socket), but it presents a
client certificate (`tlsConfig.certFile/keyFile`) and checks the server's (`caFile`). So the pod
makes its own CA when it starts: the extender's half (`--server-dir`: `ca.crt`, `tls.crt`, `tls.key`,
certificate for 127.0.0.1/localhost) and the scheduler's half (`--client-dir`: `ca.crt`, `client.crt`,
`client.key`) land in two emptyDirs, each mounted into one container only. The keys never leave the
pod (no Secret, nothing in the API server, nothing in a rendered manifest); a port-forward reaches the
port but cannot present the key. Files already there are kept (a container restart reuses them).
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
from pathlib import Path

from extender.cli import UsageError

#: Lifetime of the per-pod certificates: longer than any pod lives (they are made anew with each pod).
VALID_DAYS = 3650


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server-dir", required=True, metavar="DIR",
                        help="where the extender's ca.crt, tls.crt and tls.key go")
    parser.add_argument("--client-dir", required=True, metavar="DIR",
                        help="where kube-scheduler's ca.crt, client.crt and client.key go")


def make(server_dir: Path, client_dir: Path, now: datetime.datetime | None = None) -> bool:
    """Write both halves unless they are all there already; whether anything was written."""
    wanted = [server_dir / "ca.crt", server_dir / "tls.crt", server_dir / "tls.key",
              client_dir / "ca.crt", client_dir / "client.crt", client_dir / "client.key"]
    if all(p.is_file() and p.stat().st_size > 0 for p in wanted):
        return False
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError:
        raise UsageError("deepres pod-certs needs the cryptography package (pip install cryptography)") from None

    start = (now or datetime.datetime.now(datetime.UTC)) - datetime.timedelta(minutes=5)
    end = start + datetime.timedelta(days=VALID_DAYS)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("deepres per-pod CA")).issuer_name(name("deepres per-pod CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))

    def leaf(cn: str, usage: x509.ObjectIdentifier, sans: list[x509.GeneralName]) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(ca.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(start).not_valid_after(end)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM), pem_key(key)

    server_crt, server_key = leaf("deepres-extender", ExtendedKeyUsageOID.SERVER_AUTH, [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.IPAddress(ipaddress.ip_address("::1")),
        x509.DNSName("localhost")])
    client_crt, client_key = leaf("deepres-scheduler", ExtendedKeyUsageOID.CLIENT_AUTH, [])
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    for directory, files in ((server_dir, {"ca.crt": ca_pem, "tls.crt": server_crt, "tls.key": server_key}),
                             (client_dir, {"ca.crt": ca_pem, "client.crt": client_crt, "client.key": client_key})):
        directory.mkdir(parents=True, exist_ok=True)
        for file_name, data in files.items():
            path = directory / file_name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                         0o640 if file_name.endswith(".key") else 0o644)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
    return True


def run(args: argparse.Namespace) -> int:
    made = make(Path(args.server_dir), Path(args.client_dir))
    print("per-pod certificates " + ("written" if made else "already there, kept") +
          f": {args.server_dir} (extender), {args.client_dir} (kube-scheduler)")
    return 0
