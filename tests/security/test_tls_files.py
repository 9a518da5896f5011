"""The certificate generator's files, and credentials that name a CA; no server needed.

test_compose_nats_tls.py proves the same files against real nats-servers.
"""

from __future__ import annotations

import os
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import ExtendedKeyUsageOID
from typer.testing import CliRunner

from infra.nats_auth import CredentialsError, load_credentials, write_auth
from infra.tls import write_certs
from schemas.subjects import Topology
from services.cli import app


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_keys_are_private_and_the_ca_survives_a_reissue(tmp_path: Path) -> None:
    files = write_certs(tmp_path / "tls", ["nats-1", "10.0.0.7"])
    assert stat.S_IMODE(os.stat(files.folder).st_mode) == 0o700
    for key in (files.ca_key, files.server_key):
        assert stat.S_IMODE(os.stat(key).st_mode) == 0o600, key
    server = _cert(files.server_cert)
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["nats-1"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["10.0.0.7"]
    usage = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    # Client usage too: a node presents it when dialling a route (always mutual TLS).
    assert {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH} <= set(usage)
    server.verify_directly_issued_by(_cert(files.ca_cert))
    # A reissue (new hosts) keeps the CA: clients that trust it keep working.
    ca_before = files.ca_cert.read_bytes()
    again = write_certs(tmp_path / "tls", ["nats-1", "nats-4"])
    assert again.ca_cert.read_bytes() == ca_before
    _cert(again.server_cert).verify_directly_issued_by(_cert(again.ca_cert))
    # Control: --rotate makes a new CA, which the old certificate does not chain to.
    rotated = write_certs(tmp_path / "tls", ["nats-1"], rotate=True)
    assert rotated.ca_cert.read_bytes() != ca_before
    with pytest.raises((ValueError, InvalidSignature)):
        server.verify_directly_issued_by(_cert(rotated.ca_cert))


def test_credentials_naming_a_ca_connect_with_tls_and_a_missing_ca_is_named(
    tmp_path: Path,
) -> None:
    auth = tmp_path / "auth"
    auth.mkdir(mode=0o700)
    certs = write_certs(tmp_path / "tls", ["localhost"])
    (auth / "ca.pem").write_bytes(certs.ca_cert.read_bytes())
    files = write_auth(auth, Topology("trialbus"), ca_file="ca.pem")
    cred = load_credentials(files.credentials["runner"], "runner")
    assert cred.ca_file == auth / "ca.pem"
    tls = cred.connect_options()["tls"]
    assert isinstance(tls, ssl.SSLContext) and tls.check_hostname
    assert cred.broker_options()["security"].ssl_context is not None
    # Control: the same role without a CA connects as before (no TLS of its own).
    plain = write_auth(tmp_path / "plain", Topology("trialbus"))
    assert "tls" not in load_credentials(plain.credentials["runner"]).connect_options()
    (auth / "ca.pem").unlink()
    with pytest.raises(CredentialsError, match=r"CA file .*ca\.pem.* missing"):
        load_credentials(files.credentials["runner"], "runner")


def test_certs_command_writes_the_files(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["certs", str(tmp_path / "c"), "--hosts", "a,b"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "c" / "ca.pem").exists() and (tmp_path / "c" / "server-key.pem").exists()
    # Control: no host at all is refused with the fix, exit 2.
    bad = CliRunner().invoke(app, ["certs", str(tmp_path / "d"), "--hosts", ","])
    assert bad.exit_code == 2 and "--hosts" in bad.output
