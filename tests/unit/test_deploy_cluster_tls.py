"""deploy/cluster.py with `tls`: what a --tls cluster's processes and clients are given."""

from __future__ import annotations

import pathlib

import pytest

from minibroker.client.common.tls import client_tls_from_properties
from minibroker.deploy import cluster as launcher
from minibroker.deploy import tls as certs
from minibroker.metadata.authorizer import STANDARD_AUTHORIZER


def _state(tmp_path: pathlib.Path, tls: bool) -> launcher.ClusterState:
    state = launcher.plan_cluster(str(tmp_path / "c"), 2, 0, 0, {}, controllers=3)
    state.tls = tls
    return state


def test_plaintext_cluster_is_unchanged(tmp_path: pathlib.Path) -> None:
    state = _state(tmp_path, tls=False)
    for spec in state.all():
        command = launcher.command_for(spec, state)
        assert spec.address in command and not any("ssl." in part for part in command)
        assert not any("authorizer" in part or "super.users" in part for part in command)
    assert launcher.client_properties(state) == {}
    assert launcher.client_kwargs(state) == {}
    assert launcher.client_tls(state) is None
    assert state.to_json()["client_config"] == ""
    assert not (tmp_path / "c" / "tls").exists()


def test_tls_cluster_commands_and_client_settings(tmp_path: pathlib.Path) -> None:
    state = _state(tmp_path, tls=True)
    tls_dir = launcher.tls_dir(state.dir)
    for spec in state.all():
        command = launcher.command_for(spec, state)
        assert command[command.index("--listen") + 1] == f"SSL://{spec.address}"
        name = certs.node_name(spec.role, spec.node_id)
        assert f"ssl.certificate.location={tls_dir / name}.pem" in command
        assert f"ssl.key.location={tls_dir / name}.key" in command
        # The authorizer is on, with the launcher's/CLI's certificate as the super user.
        assert f"authorizer.class.name={STANDARD_AUTHORIZER}" in command
        assert "super.users=User:admin" in command
        assert f"ssl.ca.location={tls_dir / 'ca.pem'}" in command
        assert "ssl.client.auth=required" in command
        assert certs.identity((tls_dir / f"{name}.pem").read_bytes()) == f"node:{name}"
    kwargs = launcher.client_kwargs(state)
    assert kwargs["security_protocol"] == "SSL"
    assert kwargs["ssl_certificate_location"] == str(tls_dir / "admin.pem")
    tls = launcher.client_tls(state)
    assert tls is not None and tls.cert is not None
    path = launcher.write_client_config(state)
    assert client_tls_from_properties(
        dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    )
    data = state.to_json()
    assert data["tls"] is True and data["client_config"] == str(path)
    again = launcher.ClusterState.from_json(state.dir, data)
    assert again.tls
    # The CA is made once: a later node certificate is signed by the same one.
    ca = (tls_dir / "ca.pem").read_bytes()
    launcher.command_for(state.brokers[0], state)
    assert (tls_dir / "ca.pem").read_bytes() == ca


def test_tls_cannot_be_added_to_a_plaintext_cluster(tmp_path: pathlib.Path) -> None:
    state = _state(tmp_path, tls=False)
    pathlib.Path(state.dir).mkdir(parents=True)
    launcher.save_state(state)
    with pytest.raises(launcher.LauncherError, match="made without --tls"):
        launcher.up(state.dir, tls=True)


def test_sasl_cluster_listeners_and_sasl_client_settings(tmp_path: pathlib.Path) -> None:
    state = _state(tmp_path, tls=True)
    state.sasl = True
    for spec in state.all():
        command = launcher.command_for(spec, state)
        assert command[command.index("--listen") + 1] == f"SASL_SSL://{spec.address}"
        assert "ssl.client.auth=required" in command
    # The CLI keeps its certificate (an SSL connection to a SASL_SSL listener).
    assert launcher.client_kwargs(state)["security_protocol"] == "SSL"
    props = launcher.sasl_client_properties(state, "alice", "pw")
    tls = client_tls_from_properties(props)
    assert tls is not None and tls.sasl is not None and tls.sasl.username == "alice"
    pem = pathlib.Path(props["ssl.certificate.location"])
    assert pem.name == "client.pem" and certs.identity(pem.read_bytes()) == "user:client"
    again = launcher.ClusterState.from_json(state.dir, state.to_json())
    assert again.sasl and again.tls
    with pytest.raises(launcher.LauncherError, match="--sasl goes with --tls"):
        launcher.up(str(tmp_path / "other"), sasl=True)
