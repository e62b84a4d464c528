"""A throwaway certificate authority for TLS set-ups on one machine: the tests, the
benchmarks' TLS row and trying TLS out (docs/operations.md). Not for production: use your
organisation's CA there.

:func:`make_test_pki` writes a self-signed CA, a server certificate for ``127.0.0.1`` and
``localhost`` (bookies and etcd), and a client certificate, all signed by the CA, as PEM files.
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path
from typing import NamedTuple

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


class TestPki(NamedTuple):
    """Paths of the PEM files :func:`make_test_pki` wrote."""

    ca_file: str
    server_cert_file: str
    server_key_file: str
    client_cert_file: str
    client_key_file: str


def make_test_pki(directory: str | Path, days: int = 2) -> TestPki:
    """Write ``ca.pem``, ``server.pem``/``server.key`` and ``client.pem``/``client.key``."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bookkeeper-aio test CA")])
    now = datetime.datetime.now(datetime.UTC)
    ca = (
        _builder(ca_name, ca_name, ca_key, now, days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), True
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write(out / "ca.pem", ca.public_bytes(serialization.Encoding.PEM))
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    server = _leaf(out, "server", ca, ca_key, now, days, ExtendedKeyUsageOID.SERVER_AUTH, names)
    client = _leaf(out, "client", ca, ca_key, now, days, ExtendedKeyUsageOID.CLIENT_AUTH, [])
    return TestPki(str(out / "ca.pem"), *server, *client)


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    now: datetime.datetime,
    days: int,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def _leaf(
    out: Path,
    name: str,
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    now: datetime.datetime,
    days: int,
    usage: x509.ObjectIdentifier,
    names: list[x509.GeneralName],
) -> tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    builder = _builder(subject, ca.subject, key, now, days).add_extension(
        x509.ExtendedKeyUsage([usage]), critical=False
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    cert_path, key_path = out / f"{name}.pem", out / f"{name}.key"
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    _write(key_path, pem)
    return str(cert_path), str(key_path)


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)
