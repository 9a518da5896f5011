"""A private CA and the NATS servers' certificate, for compose or any deployment.

``write_certs(folder, hosts)`` writes:

- ``ca.pem`` / ``ca-key.pem``: a self-signed CA. Clients trust ``ca.pem`` (it is
  public); the key signs server certificates and stays 0600 in this folder.
- ``server.pem`` / ``server-key.pem``: one certificate for every NATS node, valid for
  each name or IP in ``hosts`` (subject alternative names). It carries both the
  server and the client extended key usage because nats-server presents the same
  certificate when it dials a route to another node (route TLS is always mutual).

An existing CA is kept unless ``rotate``: regenerating the server certificate (say,
for a new node name) must not break the clients that already trust the CA. The
server certificate is rewritten every time. Keys are ECDSA P-256: quick to make
(tests make them per run) and accepted by nats-server and Python's ssl alike.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from services.common.private_files import write_private

DEFAULT_HOSTS = ("nats-1", "nats-2", "nats-3", "localhost", "127.0.0.1")
"""compose.yaml's node names, plus loopback for a CLI on the host (published 4222)."""

CA_DAYS = 3650
SERVER_DAYS = 825  # the longest validity TLS clients commonly accept for a leaf cert


class TlsError(RuntimeError):
    """A certificate folder cannot be used as it is (names the file and the fix)."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Where :func:`write_certs` put the CA and the servers' certificate."""

    folder: Path
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path


def tls_files(folder: Path) -> TlsFiles:
    """The file names inside a certificate folder (whether or not they exist yet)."""
    return TlsFiles(
        folder,
        folder / "ca.pem",
        folder / "ca-key.pem",
        folder / "server.pem",
        folder / "server-key.pem",
    )


def write_certs(
    folder: Path,
    hosts: Sequence[str] = DEFAULT_HOSTS,
    *,
    rotate: bool = False,
    now: dt.datetime | None = None,
) -> TlsFiles:
    """Make (or keep) the CA and issue the servers' certificate for ``hosts``.

    ``hosts`` are DNS names or IP addresses clients and routes use to reach a node.
    Private keys are written mode 0600, the folder 0700.
    """
    names = [h.strip() for h in hosts if h.strip()]
    if not names:
        raise TlsError("no host names given for the server certificate (--hosts nats-1,...)")
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)
    files = tls_files(folder)
    now = now or dt.datetime.now(dt.UTC)
    if rotate or not (files.ca_cert.exists() and files.ca_key.exists()):
        ca_key, ca_cert = _new_ca(now)
        write_private(files.ca_key, _key_pem(ca_key))
        _write_public(files.ca_cert, ca_cert.public_bytes(serialization.Encoding.PEM).decode())
    else:
        ca_key, ca_cert = _load_ca(files)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _issue_server(ca_key, ca_cert, key, names, now)
    write_private(files.server_key, _key_pem(key))
    _write_public(files.server_cert, cert.public_bytes(serialization.Encoding.PEM).decode())
    return files


def _new_ca(now: dt.datetime) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "trialbus NATS CA")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))  # tolerate small clock skew
        .not_valid_after(now + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _issue_server(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    key: ec.EllipticCurvePrivateKey,
    hosts: Sequence[str],
    now: dt.datetime,
) -> x509.Certificate:
    sans: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=SERVER_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            # Client auth too: a node presents this certificate when it dials a route.
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )


def _load_ca(files: TlsFiles) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    try:
        key = serialization.load_pem_private_key(files.ca_key.read_bytes(), password=None)
        cert = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    except (OSError, ValueError) as exc:
        raise TlsError(
            f"cannot use the CA in {files.folder} ({type(exc).__name__}); fix the files or "
            "make a new CA with --rotate (clients must then get the new ca.pem)"
        ) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise TlsError(f"{files.ca_key} is not an EC key; make a new CA with --rotate")
    return key, cert


def _key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def _write_public(path: Path, text: str) -> None:
    # Certificates are public: written like keys (atomically), then opened to readers.
    write_private(path, text)
    os.chmod(path, 0o644)
