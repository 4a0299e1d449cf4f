"""client/common/tls.py: TLS settings from node configs, client kwargs and client properties."""

from __future__ import annotations

import pathlib

import pytest

from minibroker.broker.config import build_config as broker_config
from minibroker.client.common.config import ConfigError
from minibroker.client.common.tls import (
    client_tls,
    client_tls_from_properties,
    looks_like_tls_mismatch,
)
from minibroker.controller.config import build_config as controller_config
from minibroker.deploy import tls as certs


@pytest.fixture(scope="module")
def pems(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("pems")
    ca = certs.make_ca(d)
    node = certs.make_node_cert(ca, d, "broker", 1)
    user = certs.make_client_cert(ca, d, "alice")
    return {
        "ca": str(ca.cert),
        "cert": str(node.cert),
        "key": str(node.key),
        "user_cert": str(user.cert),
        "user_key": str(user.key),
    }


def _ssl(pems: dict[str, str], **extra: str) -> dict[str, str]:
    return {
        "listeners": "SSL://127.0.0.1:0",
        "ssl.ca.location": pems["ca"],
        "ssl.certificate.location": pems["cert"],
        "ssl.key.location": pems["key"],
        **extra,
    }


BROKER = {"node.id": "1", "log.dirs": "/data"}


def test_plaintext_nodes_have_no_tls() -> None:
    assert broker_config(BROKER).tls is None
    assert controller_config({}).tls is None


@pytest.mark.parametrize("auth", ["none", "requested", "required"])
def test_ssl_listener_reads_its_pem_files(pems: dict[str, str], auth: str) -> None:
    for config in (
        broker_config(BROKER, _ssl(pems, **{"ssl.client.auth": auth})),
        controller_config(_ssl(pems, **{"ssl.client.auth": auth})),
    ):
        tls = config.tls
        assert tls is not None and tls.client_auth == auth
        assert tls.ca == pathlib.Path(pems["ca"]).read_bytes()
        assert tls.cert is not None and b"BEGIN CERTIFICATE" in tls.cert
        assert "PRIVATE" not in repr(tls)


@pytest.mark.parametrize(
    ("drop", "extra", "error"),
    [
        ("ssl.ca.location", {}, "SSL listener needs ssl.ca.location"),
        ("ssl.key.location", {}, "SSL listener needs ssl.key.location"),
        ("", {"ssl.client.auth": "sometimes"}, "ssl.client.auth.*none, requested, required"),
        ("", {"ssl.certificate.location": "/nonexistent.pem"}, "cannot read '/nonexistent.pem'"),
        ("", {"listener.security.protocol.map": "SSL:PLAINTEXT", "ssl.ca.location": ""}, None),
    ],
)
def test_ssl_listener_settings_are_checked(
    pems: dict[str, str], drop: str, extra: dict[str, str], error: str | None
) -> None:
    layer = {k: v for k, v in _ssl(pems, **extra).items() if k != drop}
    for build in (lambda: broker_config(BROKER, layer), lambda: controller_config(layer)):
        if error is None:
            assert build().tls is None  # an SSL-named listener mapped to PLAINTEXT
        else:
            with pytest.raises(ConfigError, match=error):
                build()


def test_a_key_file_that_is_not_pem_is_refused(pems: dict[str, str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    junk = tmp_path / "junk.key"
    junk.write_text("not a key")
    with pytest.raises(ConfigError, match="not a PEM file"):
        broker_config(BROKER, _ssl(pems, **{"ssl.key.location": str(junk)}))


def test_client_kwargs(pems: dict[str, str]) -> None:
    assert client_tls() is None
    assert client_tls("plaintext") is None
    only_ca = client_tls("ssl", pems["ca"])
    assert only_ca is not None and only_ca.cert is None and only_ca.key is None
    mutual = client_tls("SSL", pems["ca"], pems["user_cert"], pems["user_key"])
    assert mutual is not None and mutual.cert is not None and mutual.key is not None
    system_roots = client_tls("SSL")
    assert system_roots is not None and system_roots.ca is None


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("SASL_PLAINTEXT",), "SASL_PLAINTEXT is not supported: PLAIN goes over TLS only"),
        (("SASL_SSL",), "SASL_SSL needs sasl_username and sasl_password"),
        (("SSL", None, None, None, None, "alice"), "sasl_username set but the security protocol "),
        (("PLAINTEXT", None, None, None, None, None, "pw"), "sasl_password set but the security"),
        (("SASL_SSL", None, None, None, "SCRAM-SHA-256", "a", "p"), "'SCRAM-SHA-256' is not "),
        (("PLAINTEXT", "ca.pem"), "ssl_ca_location set but security_protocol is PLAINTEXT"),
        (("SSL", None, "c.pem"), "ssl_certificate_location and ssl_key_location go together"),
        (("SSL", "/nope/ca.pem"), "ssl_ca_location: cannot read"),
    ],
)
def test_client_kwargs_refused(args: tuple[str | None, ...], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        client_tls(*args)  # type: ignore[arg-type]


def test_client_properties(pems: dict[str, str]) -> None:
    assert client_tls_from_properties({}) is None
    assert client_tls_from_properties({"security.protocol": "PLAINTEXT"}) is None
    tls = client_tls_from_properties(
        {
            "security.protocol": "SSL",
            "ssl.ca.location": pems["ca"],
            "ssl.certificate.location": pems["user_cert"],
            "ssl.key.location": pems["user_key"],
        }
    )
    assert tls is not None and tls.cert is not None
    with pytest.raises(ConfigError, match=r"unknown client property ssl\.keystore\.location"):
        client_tls_from_properties({"ssl.keystore.location": "x"})
    with pytest.raises(ConfigError, match=r"ssl\.certificate\.location and ssl\.key\.location"):
        client_tls_from_properties(
            {"security.protocol": "SSL", "ssl.certificate.location": pems["user_cert"]}
        )


@pytest.mark.parametrize(
    ("details", "mismatch"),
    [
        (
            "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:1:2: Socket closed",
            True,
        ),
        ("Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: WRONG_VERSION_NUMBER", True),
        ("failed to connect to all addresses; Connection refused", False),
    ],
)
def test_mismatch_signs(details: str, mismatch: bool) -> None:
    assert looks_like_tls_mismatch(details) is mismatch


def test_sasl_client_settings(pems: dict[str, str]) -> None:
    tls = client_tls("sasl_ssl", pems["ca"], None, None, None, "alice", "s3cret")
    assert tls is not None and tls.sasl is not None and tls.sasl.username == "alice"
    assert tls.sasl.password == "s3cret" and "s3cret" not in repr(tls)
    assert "sasl_username='alice'" in repr(tls)
    props = client_tls_from_properties(
        {
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": pems["ca"],
            "ssl.certificate.location": pems["user_cert"],
            "ssl.key.location": pems["user_key"],
            "sasl.mechanism": "PLAIN",
            "sasl.username": "bob",
            "sasl.password": "pw",
        }
    )
    assert props is not None and props.sasl is not None and props.cert is not None
    assert props.sasl.username == "bob"
    with pytest.raises(ConfigError, match=r"sasl\.username set but the security protocol is SSL"):
        client_tls_from_properties({"security.protocol": "SSL", "sasl.username": "x"})
    with pytest.raises(ConfigError, match="PLAIN goes over TLS only"):
        client_tls_from_properties({"security.protocol": "SASL_PLAINTEXT"})


@pytest.mark.parametrize("auth", ["none", "requested"])
def test_sasl_ssl_listener_needs_client_certificates(pems: dict[str, str], auth: str) -> None:
    layer = _ssl(pems, **{"listeners": "SASL_SSL://127.0.0.1:0", "ssl.client.auth": auth})
    for build in (lambda: broker_config(BROKER, layer), lambda: controller_config(layer)):
        with pytest.raises(ConfigError, match=r"SASL_SSL listener needs ssl\.client\.auth=req"):
            build()
    ok = _ssl(pems, **{"listeners": "SASL_SSL://127.0.0.1:0", "ssl.client.auth": "required"})
    tls = broker_config(BROKER, ok).tls
    assert tls is not None and tls.client_auth == "required" and tls.sasl is None
    with pytest.raises(ConfigError, match="PLAIN goes over TLS only"):
        controller_config(
            {
                "listeners": "SASL_PLAINTEXT://127.0.0.1:0",
                "listener.security.protocol.map": "SASL_PLAINTEXT:SASL_PLAINTEXT",
            }
        )
