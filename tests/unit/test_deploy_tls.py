"""deploy/tls.py: the local CA and the node and client certificates it signs."""

from __future__ import annotations

import ipaddress
import stat

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from minibroker.deploy import tls


def _cert(path):
    return x509.load_pem_x509_certificate(path.read_bytes())


def _cn(cert):
    return cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value


def _san(cert):
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value


def _usages(cert):
    return set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    return tls.make_ca(tmp_path_factory.mktemp("tls"))


def test_ca_is_self_signed_and_a_ca(ca):
    cert = _cert(ca.cert)
    cert.verify_directly_issued_by(cert)
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert _cn(cert) == tls.CA_NAME
    assert stat.S_IMODE(ca.key.stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("role", "node_id", "name"),
    [("broker", 1, "broker-1"), ("broker", 0, "broker-0"), ("controller", 3000, "controller-3000")],
)
def test_node_cert_names_the_node_and_verifies(ca, tmp_path, role, node_id, name):
    pair = tls.make_node_cert(ca, tmp_path, role, node_id, hosts=["127.0.0.2", "node.example"])
    cert = _cert(pair.cert)
    cert.verify_directly_issued_by(_cert(ca.cert))
    assert pair.cert.name == f"{name}.pem" and pair.key.name == f"{name}.key"
    assert _cn(cert) == name
    san = _san(cert)
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [f"minibroker:node:{name}"]
    ips = san.get_values_for_type(x509.IPAddress)
    assert ipaddress.ip_address("127.0.0.1") in ips and ipaddress.ip_address("127.0.0.2") in ips
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "node.example"}
    assert _usages(cert) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert tls.identity(pair.cert.read_bytes()) == f"node:{name}"
    assert stat.S_IMODE(pair.key.stat().st_mode) == 0o600


def test_wildcard_listen_hosts_are_not_names(ca, tmp_path):
    pair = tls.make_node_cert(ca, tmp_path, "broker", 2, hosts=["0.0.0.0", "::"])
    ips = _san(_cert(pair.cert)).get_values_for_type(x509.IPAddress)
    assert ipaddress.ip_address("0.0.0.0") not in ips and ipaddress.ip_address("::") not in ips


def test_client_cert_cn_is_the_user(ca, tmp_path):
    pair = tls.make_client_cert(ca, tmp_path, "alice")
    cert = _cert(pair.cert)
    cert.verify_directly_issued_by(_cert(ca.cert))
    assert _cn(cert) == "alice"
    assert _usages(cert) == {ExtendedKeyUsageOID.CLIENT_AUTH}
    assert tls.identity(pair.cert.read_bytes()) == "user:alice"
    assert _san(cert).get_values_for_type(x509.IPAddress) == []


def test_another_ca_does_not_verify(ca, tmp_path):
    other = tls.make_ca(tmp_path / "other")
    pair = tls.make_node_cert(ca, tmp_path, "broker", 1)
    with pytest.raises(InvalidSignature):
        _cert(pair.cert).verify_directly_issued_by(_cert(other.cert))


@pytest.mark.parametrize(("role", "node_id"), [("client", 1), ("broker", -1), ("Broker", 1)])
def test_bad_node_names_are_refused(ca, tmp_path, role, node_id):
    with pytest.raises(ValueError):
        tls.make_node_cert(ca, tmp_path, role, node_id)


@pytest.mark.parametrize("user", ["", "../x", "a/b", ".hidden"])
def test_bad_user_names_are_refused(ca, tmp_path, user):
    with pytest.raises(ValueError):
        tls.make_client_cert(ca, tmp_path, user)


@pytest.mark.parametrize("user", ["broker-2", "controller-3000"])
def test_no_user_certificate_for_a_nodes_name(ca, tmp_path, user):
    with pytest.raises(ValueError, match="is a node's name"):
        tls.make_client_cert(ca, tmp_path, user)
    assert list(tmp_path.glob("*.pem")) == []
