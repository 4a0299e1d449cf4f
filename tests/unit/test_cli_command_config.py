"""client/cli/common.py: which client properties file a command uses (--command-config)."""

from __future__ import annotations

import argparse
import json
import pathlib

import pytest

from minibroker.client.cli import common
from minibroker.client.common.config import ConfigError
from minibroker.deploy import tls as certs


def _cluster_dir(cwd: pathlib.Path, client_config: str) -> None:
    folder = cwd / ".minibroker"
    folder.mkdir()
    (folder / "cluster.json").write_text(
        json.dumps({"bootstrap_servers": "127.0.0.1:1", "client_config": client_config})
    )


def test_explicit_file_wins(tmp_path: pathlib.Path) -> None:
    _cluster_dir(tmp_path, "/from/cluster.properties")
    args = argparse.Namespace(command_config="/given.properties", bootstrap_server="h:1")
    assert common.command_config_path(args, tmp_path) == "/given.properties"


def test_cluster_file_applies_only_to_its_own_brokers(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(common.ENV_BOOTSTRAP, raising=False)
    _cluster_dir(tmp_path, "/from/cluster.properties")
    assert common.command_config_path(argparse.Namespace(), tmp_path) == "/from/cluster.properties"
    other = argparse.Namespace(bootstrap_server="elsewhere:9092")
    assert common.command_config_path(other, tmp_path) is None
    monkeypatch.setenv(common.ENV_BOOTSTRAP, "elsewhere:9092")
    assert common.command_config_path(argparse.Namespace(), tmp_path) is None


def test_plaintext_cluster_has_no_file(tmp_path: pathlib.Path) -> None:
    _cluster_dir(tmp_path, "")
    assert common.cluster_client_config(tmp_path / ".minibroker") is None
    assert common.cluster_client_config(tmp_path / "missing") is None


def test_properties_become_client_kwargs(tmp_path: pathlib.Path) -> None:
    ca = certs.make_ca(tmp_path)
    user = certs.make_client_cert(ca, tmp_path, "alice")
    props = tmp_path / "client.properties"
    props.write_text(
        f"security.protocol=SSL\nssl.ca.location={ca.cert}\n"
        f"ssl.certificate.location={user.cert}\nssl.key.location={user.key}\n"
    )
    assert common.security_from_file(str(props)) == {
        "security_protocol": "SSL",
        "ssl_ca_location": str(ca.cert),
        "ssl_certificate_location": str(user.cert),
        "ssl_key_location": str(user.key),
    }
    assert common.security_from_file(None) == {}
    props.write_text("security.protocol=SSL\nssl.ca.location=/nope.pem\n")
    with pytest.raises(ConfigError, match=r"ssl\.ca\.location: cannot read"):
        common.security_from_file(str(props))
