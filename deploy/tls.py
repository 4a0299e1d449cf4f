"""A local certificate authority and the PEM files a TLS cluster needs (the `cryptography` package).

Writes files (and reads the CA back); no network. `cluster up --tls` calls `make_ca` once, then
`make_node_cert` per broker and controller and `make_client_cert` for the CLI's user. Each
certificate is signed by the CA and names who holds it:

- a node certificate: subject CN `broker-N` / `controller-N`, SAN URI `minibroker:node:broker-N`
  (a call is a node's only when both say the same node: client/common/security.py), plus SAN
  DNS/IP entries for the addresses it serves on (a client checks the address it dialled against
  these), and both serverAuth and clientAuth (nodes present it on their own connections to other
  nodes: mutual TLS);
- a client certificate: subject CN = the user name, SAN URI `minibroker:user:NAME`, clientAuth;
  never for a name that reads like a node's (`broker-2`), which would only confuse.

Keys are EC P-256, unencrypted PEM files readable by their owner only (0600). The layout under a
directory `d`: `d/ca.pem` + `d/ca.key`, `d/NAME.pem` + `d/NAME.key` per holder.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import pathlib
from collections.abc import Iterable
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from minibroker.metadata.acl import Principal, node_of

CA_NAME = "minibroker local CA"
URI_PREFIX = "minibroker:"
# A local CA's certificates live as long as a development cluster plausibly does.
VALID_DAYS = 3650
# Names every node certificate carries besides the ones given: the loopback a local cluster uses.
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True, slots=True)
class PemPair:
    """A certificate and its private key, as files."""

    cert: pathlib.Path
    key: pathlib.Path


def node_name(role: str, node_id: int) -> str:
    """`broker-1`, `controller-3000`: the CN of a node certificate."""
    if role not in ("broker", "controller"):
        raise ValueError(f"role must be broker or controller, got {role!r}")
    if node_id < 0:
        raise ValueError(f"node id must be >= 0, got {node_id}")
    return f"{role}-{node_id}"


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_private(path: pathlib.Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _write_pair(
    directory: pathlib.Path, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> PemPair:
    pair = PemPair(directory / f"{name}.pem", directory / f"{name}.key")
    directory.mkdir(parents=True, exist_ok=True)
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_private(
        pair.key,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    return pair


def _validity(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    # A little slack before now: clocks of processes on one machine agree, of containers may not.
    return builder.not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(
        now + datetime.timedelta(days=VALID_DAYS)
    )


def make_ca(directory: str | pathlib.Path) -> PemPair:
    """A self-signed CA (`ca.pem`, `ca.key`) in `directory`."""
    d = pathlib.Path(directory)
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME)])
    cert = (
        _validity(x509.CertificateBuilder())
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
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
    return _write_pair(d, "ca", cert, key)


def _load_ca(ca: PemPair) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{ca.key}: not an EC private key")
    return cert, key


def _host_names(hosts: Iterable[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    seen: set[str] = set()
    for host in (*LOCAL_HOSTS, *hosts):
        host = host.strip().strip("[]")
        if not host or host in seen or host in ("0.0.0.0", "::"):
            continue
        seen.add(host)
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            out.append(x509.DNSName(host))
    return out


def _issue(
    ca: PemPair,
    directory: pathlib.Path,
    common_name: str,
    uri: str,
    hosts: Iterable[str] | None,
    usages: list[x509.ObjectIdentifier],
) -> PemPair:
    ca_cert, ca_key = _load_ca(ca)
    key = _key()
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(uri)]
    if hosts is not None:
        names += _host_names(hosts)
    cert = (
        _validity(x509.CertificateBuilder())
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return _write_pair(directory, common_name, cert, key)


def make_node_cert(
    ca: PemPair,
    directory: str | pathlib.Path,
    role: str,
    node_id: int,
    hosts: Iterable[str] = (),
) -> PemPair:
    """`ROLE-ID.pem`/`.key` for a broker or controller: serves and dials (server+client auth)."""
    name = node_name(role, node_id)
    return _issue(
        ca,
        pathlib.Path(directory),
        name,
        f"{URI_PREFIX}node:{name}",
        hosts,
        [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
    )


def make_client_cert(ca: PemPair, directory: str | pathlib.Path, user: str) -> PemPair:
    """`USER.pem`/`.key`: a client certificate whose CN is the user name."""
    if not user or any(c in user for c in "/\\\0") or user.startswith("."):
        raise ValueError(f"user name {user!r} cannot name a certificate file")
    if node_of(Principal("User", user)) is not None:
        raise ValueError(f"user name {user!r} is a node's name (broker-N / controller-N)")
    return _issue(
        ca,
        pathlib.Path(directory),
        user,
        f"{URI_PREFIX}user:{user}",
        None,
        [ExtendedKeyUsageOID.CLIENT_AUTH],
    )


def identity(cert_pem: bytes) -> str:
    """The holder a certificate names: its SAN URI without the prefix (`node:broker-1`,
    `user:alice`), else its CN."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        san = None
    if san is not None:
        for uri in san.get_values_for_type(x509.UniformResourceIdentifier):
            if uri.startswith(URI_PREFIX):
                return uri.removeprefix(URI_PREFIX)
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(cns[0].value) if cns else ""
