"""TLS on the wire: the one place that opens server ports and channels, secure or not.

Reads the PEM files it is given (once, when the settings are built); the rest builds gRPC
credentials. Every server (broker, controller) opens its port with `add_port`, and every
channel (client transport, broker fetcher and controller link, quorum shell, watch, launcher,
healthcheck, benches) is made by `aio_channel` / `sync_channel`: with `tls=None` they are the
plaintext ones of before.

Settings use Kafka's names (librdkafka's PEM-location ones): `ssl.ca.location` (the CA that
signs the peers' certificates), `ssl.certificate.location` + `ssl.key.location` (this side's
certificate and key), and for servers `ssl.client.auth` (none | requested | required). Python
clients take them as keyword arguments (`security_protocol="SSL"`, `ssl_ca_location`, ...).

A node (broker or controller) whose listener is SSL dials the other nodes over TLS too, with
its own certificate (mutual TLS between nodes when they set `ssl.client.auth=required`).

SASL_SSL is TLS plus a user name and password (SASL PLAIN, client/common/sasl.py): clients set
`sasl.mechanism=PLAIN` (the only mechanism; the password is checked against the user's SCRAM
credentials on the server), `sasl.username`, `sasl.password` (Python: `sasl_mechanism`,
`sasl_username`, `sasl_password`), and the login rides on every call as call credentials
composed with the channel's SSL credentials. A node's SASL_SSL listener must require client
certificates (`ssl.client.auth=required`): nodes prove who they are with their certificates, and
gRPC's Python server cannot ask for a certificate without requiring one. SASL_PLAINTEXT is
refused: PLAIN sends the password, so it goes over TLS only.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import grpc

from minibroker.client.common.config import ConfigError, ConfigKey, one_of, parse_problem
from minibroker.client.common.listeners import (
    DEFAULT_PROTOCOL_MAP,
    PLAINTEXT,
    PROTOCOLS,
    SASL_PLAINTEXT,
    SASL_PLAINTEXT_REFUSED,
    SASL_SSL,
    parse_protocol_map,
)
from minibroker.client.common.sasl import SASL_MECHANISMS, SaslPlain, call_credentials

CLIENT_AUTH_MODES = ("none", "requested", "required")

# Keys every TLS side takes (servers, and clients in --command-config files).
SSL_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        "ssl.ca.location",
        str,
        "",
        "PEM file of the CA that signs the peers' certificates (SSL listeners and their links)",
    ),
    ConfigKey("ssl.certificate.location", str, "", "PEM file of this side's certificate"),
    ConfigKey("ssl.key.location", str, "", "PEM file of this side's private key (unencrypted)"),
)
# Clients (librdkafka's names): a SASL PLAIN login on a SASL_SSL connection.
SASL_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey("sasl.mechanism", str, "PLAIN", "SASL_SSL: the SASL mechanism (PLAIN only)"),
    ConfigKey("sasl.username", str, "", "SASL_SSL: the user name (`minibroker users --add`)"),
    ConfigKey("sasl.password", str, "", "SASL_SSL: the user's password"),
)
# Brokers and controllers both: which listener names are SSL.
PROTOCOL_MAP_KEY = ConfigKey(
    "listener.security.protocol.map",
    str,
    DEFAULT_PROTOCOL_MAP,
    "NAME:PROTOCOL,... the security protocol of each listener name (PLAINTEXT, SSL, or "
    "SASL_SSL: TLS plus SASL PLAIN logins, which needs ssl.client.auth=required)",
    lambda v: parse_problem(parse_protocol_map, v),
)

SERVER_SSL_KEYS: tuple[ConfigKey, ...] = (
    *SSL_KEYS,
    ConfigKey(
        "ssl.client.auth",
        str,
        "none",
        "SSL listener: required = callers must present a certificate signed by ssl.ca.location "
        "(mutual TLS); none/requested = they need not (gRPC's Python server cannot ask for an "
        "optional certificate, so requested behaves as none)",
        one_of(*CLIENT_AUTH_MODES),
    ),
)


_SERVER_NAMES = ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location")


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """PEM bytes for one side of TLS connections. `ca` None: the system's trusted roots
    (clients only); `cert`/`key` None: present no certificate (clients only)."""

    ca: bytes | None
    cert: bytes | None
    key: bytes | None
    client_auth: str = "none"
    # A client's SASL PLAIN login (SASL_SSL), sent on every call; None for nodes and SSL.
    sasl: SaslPlain | None = None

    def __repr__(self) -> str:  # never the key's bytes nor a password in a log line
        return (
            f"TlsSettings(ca={self.ca is not None}, cert={self.cert is not None}, "
            f"client_auth={self.client_auth!r}"
            + (f", sasl_username={self.sasl.username!r})" if self.sasl else ")")
        )


def _read(name: str, location: str) -> bytes:
    try:
        data = pathlib.Path(location).read_bytes()
    except OSError as err:
        raise ConfigError(f"{name}: cannot read {location!r}: {err.strerror}") from None
    if b"-----BEGIN" not in data:
        raise ConfigError(f"{name}: {location!r} is not a PEM file")
    return data


def check_protocol(value: str, name: str = "security.protocol") -> str:
    protocol = str(value).strip().upper()
    if protocol == SASL_PLAINTEXT:
        raise ConfigError(f"{name}: {SASL_PLAINTEXT_REFUSED}")
    if protocol not in PROTOCOLS:
        raise ConfigError(f"{name}: {value!r} is not supported; use one of {', '.join(PROTOCOLS)}")
    return protocol


def load_tls(
    *,
    ca_location: str = "",
    certificate_location: str = "",
    key_location: str = "",
    client_auth: str = "none",
    server: bool = False,
    names: tuple[str, str, str] = (
        "ssl.ca.location",
        "ssl.certificate.location",
        "ssl.key.location",
    ),
) -> TlsSettings:
    """Read the PEM files. A server (a node) needs all three; a client needs the CA unless the
    system's roots sign the brokers', and a certificate only with its key. `names`: how the
    caller spells the three settings in its errors (the client's keyword arguments differ)."""
    ca_name, cert_name, key_name = names
    if client_auth not in CLIENT_AUTH_MODES:
        raise ConfigError(
            f"ssl.client.auth: {client_auth!r} is not one of {', '.join(CLIENT_AUTH_MODES)}"
        )
    if server:
        missing = [
            n
            for n, v in zip(names, (ca_location, certificate_location, key_location))
            if not v.strip()
        ]
        if missing:
            raise ConfigError(
                f"an SSL listener needs {', '.join(missing)} (PEM files; `minibroker cluster up "
                "--tls` makes them)"
            )
    if bool(certificate_location.strip()) != bool(key_location.strip()):
        raise ConfigError(f"{cert_name} and {key_name} go together: set both or neither")
    return TlsSettings(
        ca=_read(ca_name, ca_location) if ca_location.strip() else None,
        cert=_read(cert_name, certificate_location) if certificate_location.strip() else None,
        key=_read(key_name, key_location) if key_location.strip() else None,
        client_auth=client_auth,
    )


def node_tls(values: Mapping[str, Any], protocol: str) -> TlsSettings | None:
    """A broker's or controller's settings for its listener and the channels it opens to other
    nodes: None on a PLAINTEXT listener (the ssl.* keys are then unused, as in Kafka). A
    SASL_SSL listener must require client certificates (see the module docstring)."""
    checked = check_protocol(protocol, "listener security protocol")
    if checked == PLAINTEXT:
        return None
    if checked == SASL_SSL and str(values["ssl.client.auth"]) != "required":
        raise ConfigError(
            "a SASL_SSL listener needs ssl.client.auth=required (got "
            f"{str(values['ssl.client.auth'])!r}): brokers and controllers prove who they are "
            "with their certificates, and gRPC's Python server cannot ask for a certificate "
            "without requiring one, so SASL users need a CA-signed client certificate too"
        )
    return load_tls(
        ca_location=str(values["ssl.ca.location"]),
        certificate_location=str(values["ssl.certificate.location"]),
        key_location=str(values["ssl.key.location"]),
        client_auth=str(values["ssl.client.auth"]),
        server=True,
    )


def sasl_login(
    protocol: str,
    mechanism: str | None,
    username: str | None,
    password: str | None,
    names: tuple[str, str, str] = ("sasl_mechanism", "sasl_username", "sasl_password"),
) -> SaslPlain | None:
    """The SASL PLAIN login of a client's settings: required with SASL_SSL, refused (rather
    than silently unused) with any other protocol. Only PLAIN: the password goes over TLS and
    the server checks it against the user's SCRAM credentials (SCRAM-SHA-* as a mechanism name
    is refused, since no SCRAM exchange takes place)."""
    mech_name, user_name, pass_name = names
    given = [n for n, v in zip(names, (mechanism, username, password)) if v]
    if protocol != SASL_SSL:
        if given:
            raise ConfigError(
                f"{', '.join(given)} set but the security protocol is {protocol}; use SASL_SSL"
            )
        return None
    mech = str(mechanism or "PLAIN").strip().upper()
    if mech not in SASL_MECHANISMS:
        raise ConfigError(
            f"{mech_name}: {mechanism!r} is not supported; use PLAIN (the password goes over "
            "TLS and is checked against the user's SCRAM-SHA-256/512 credentials)"
        )
    missing = [n for n, v in ((user_name, username), (pass_name, password)) if not v]
    if missing:
        raise ConfigError(f"SASL_SSL needs {' and '.join(missing)}")
    return SaslPlain(str(username), str(password))


def client_tls(
    security_protocol: str = PLAINTEXT,
    ssl_ca_location: str | None = None,
    ssl_certificate_location: str | None = None,
    ssl_key_location: str | None = None,
    sasl_mechanism: str | None = None,
    sasl_username: str | None = None,
    sasl_password: str | None = None,
) -> TlsSettings | None:
    """The Python client's keyword arguments -> settings (None: plaintext). ssl_* without
    security_protocol="SSL" (or "SASL_SSL"), or sasl_* without "SASL_SSL", is an error rather
    than a silently plaintext connection."""
    protocol = check_protocol(security_protocol or PLAINTEXT, "security_protocol")
    sasl = sasl_login(protocol, sasl_mechanism, sasl_username, sasl_password)
    given = [
        n
        for n, v in (
            ("ssl_ca_location", ssl_ca_location),
            ("ssl_certificate_location", ssl_certificate_location),
            ("ssl_key_location", ssl_key_location),
        )
        if v
    ]
    if protocol == PLAINTEXT:
        if given:
            raise ConfigError(
                f"{', '.join(given)} set but security_protocol is PLAINTEXT; "
                'pass security_protocol="SSL"'
            )
        return None
    tls = load_tls(
        ca_location=ssl_ca_location or "",
        certificate_location=ssl_certificate_location or "",
        key_location=ssl_key_location or "",
        names=("ssl_ca_location", "ssl_certificate_location", "ssl_key_location"),
    )
    return replace(tls, sasl=sasl)


def client_tls_from_properties(values: Mapping[str, str]) -> TlsSettings | None:
    """A `--command-config` file's Kafka client properties -> settings (None: plaintext)."""
    known = {"security.protocol", *(k.name for k in SSL_KEYS), *(k.name for k in SASL_KEYS)}
    unknown = sorted(k for k in values if k not in known)
    if unknown:
        raise ConfigError(
            f"unknown client propert{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; "
            f"known: {', '.join(sorted(known))}"
        )
    protocol = check_protocol(values.get("security.protocol", PLAINTEXT) or PLAINTEXT)
    sasl = sasl_login(
        protocol,
        values.get("sasl.mechanism"),
        values.get("sasl.username"),
        values.get("sasl.password"),
        names=("sasl.mechanism", "sasl.username", "sasl.password"),
    )
    if protocol == PLAINTEXT:
        return None
    tls = load_tls(
        ca_location=values.get("ssl.ca.location", ""),
        certificate_location=values.get("ssl.certificate.location", ""),
        key_location=values.get("ssl.key.location", ""),
    )
    return replace(tls, sasl=sasl)


def server_credentials(tls: TlsSettings) -> grpc.ServerCredentials:
    if tls.cert is None or tls.key is None:
        raise ConfigError("an SSL listener needs ssl.certificate.location and ssl.key.location")
    required = tls.client_auth == "required"
    return grpc.ssl_server_credentials(
        [(tls.key, tls.cert)],
        root_certificates=tls.ca if required else None,
        require_client_auth=required,
    )


def channel_credentials(tls: TlsSettings) -> grpc.ChannelCredentials:
    """SSL credentials, with the SASL login's call credentials composed in (SASL_SSL): gRPC
    sends those only over the secure channel."""
    ssl = grpc.ssl_channel_credentials(
        root_certificates=tls.ca, private_key=tls.key, certificate_chain=tls.cert
    )
    if tls.sasl is None:
        return ssl
    return grpc.composite_channel_credentials(ssl, call_credentials(tls.sasl))


def add_port(server: Any, address: str, tls: TlsSettings | None) -> int:
    """Open `address` on a grpc (aio) server; the bound port, 0 when it could not bind."""
    if tls is None:
        return int(server.add_insecure_port(address))
    return int(server.add_secure_port(address, server_credentials(tls)))


def aio_channel(
    address: str,
    tls: TlsSettings | None,
    *,
    options: Sequence[tuple[str, Any]] = (),
    interceptors: Sequence[Any] | None = None,
) -> grpc.aio.Channel:
    if tls is None:
        return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
    return grpc.aio.secure_channel(
        address, channel_credentials(tls), options=options, interceptors=interceptors
    )


def sync_channel(
    address: str, tls: TlsSettings | None, *, options: Sequence[tuple[str, Any]] = ()
) -> grpc.Channel:
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, channel_credentials(tls), options=options)


# What a client adds to a connection error when it may be a protocol mismatch.
MISMATCH_HINT = (
    "if the cluster's listeners are SSL, connect with TLS (Python: security_protocol='SSL', "
    "ssl_ca_location=...; CLI: --command-config FILE with security.protocol=SSL); if it "
    "requires client certificates, give ssl_certificate_location and ssl_key_location too"
)


# What gRPC reports when the two ends disagree on TLS, or a certificate is refused: a plaintext
# call to an SSL listener sees the socket closed; TLS to a plaintext one or to a server whose
# CA it does not trust fails the handshake.
_MISMATCH_SIGNS = ("socket closed", "handshake", "ssl", "certificate", "wrong_version_number")


def looks_like_tls_mismatch(details: str) -> bool:
    text = details.lower()
    return any(sign in text for sign in _MISMATCH_SIGNS)
