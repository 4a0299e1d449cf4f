"""SASL PLAIN on real gRPC calls: an in-process grpc.aio server on a TLS port (client
certificates required, as a SASL_SSL listener) whose one method answers who the caller is by
`SaslVerifier.principal(context.invocation_metadata())`, and clients whose channels come from
`client_tls(..."SASL_SSL"...)`: the login rides on every call as call credentials composed with
the SSL credentials; a wrong password ends the call UNAUTHENTICATED, which the client reads as
SaslAuthenticationFailedError with the server's message."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from minibroker.client.common.sasl import SaslVerifier
from minibroker.client.common.scram import ScramCredential, ScramMechanism, new_credential
from minibroker.client.common.tls import add_port, aio_channel, client_tls, load_tls
from minibroker.client.errors import SaslAuthenticationFailedError
from minibroker.client.wire import CallFailed, call
from minibroker.deploy import tls as certs

METHOD = "/test.Who/Am"
CREDENTIALS = {
    ("alice", 1): new_credential(ScramMechanism.SCRAM_SHA_256, "wonderland", b"s1", 4096),
}


def lookup(user: str, mechanism: int) -> ScramCredential | None:
    return CREDENTIALS.get((user, mechanism))


@pytest.fixture(scope="module")
def pems(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("pems")
    ca = certs.make_ca(d)
    node = certs.make_node_cert(ca, d, "broker", 1, ["127.0.0.1"])
    user = certs.make_client_cert(ca, d, "client")
    return {
        "ca": str(ca.cert),
        "cert": str(node.cert),
        "key": str(node.key),
        "user_cert": str(user.cert),
        "user_key": str(user.key),
    }


@pytest.fixture
async def address(pems: dict[str, str]) -> AsyncIterator[str]:
    verifier = SaslVerifier(lookup)

    async def who(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            principal = verifier.principal(context.invocation_metadata())
        except SaslAuthenticationFailedError as err:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(err))
        return str(principal).encode()

    handler = grpc.method_handlers_generic_handler(
        "test.Who",
        {"Am": grpc.unary_unary_rpc_method_handler(who)},
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    tls = load_tls(
        ca_location=pems["ca"],
        certificate_location=pems["cert"],
        key_location=pems["key"],
        client_auth="required",
        server=True,
    )
    port = add_port(server, "127.0.0.1:0", tls)
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def _who(address: str, pems: dict[str, str], **login: Any) -> str:
    tls = client_tls(
        "SASL_SSL" if login else "SSL",
        pems["ca"],
        pems["user_cert"],
        pems["user_key"],
        *(login.get(k) for k in ("mechanism", "username", "password")),
    )
    async with aio_channel(address, tls) as channel:
        pending = channel.unary_unary(METHOD)(b"", timeout=10)
        return (await call(pending, address)).decode()


async def test_the_login_rides_on_every_call(address: str, pems: dict[str, str]) -> None:
    assert await _who(address, pems, username="alice", password="wonderland") == "User:alice"
    # Without SASL the call carries no header: the verifier answers None.
    assert await _who(address, pems) == "None"


async def test_a_wrong_password_is_unauthenticated(address: str, pems: dict[str, str]) -> None:
    for user, password in [("alice", "wrong"), ("mallory", "wonderland")]:
        with pytest.raises(CallFailed) as failed:
            await _who(address, pems, username=user, password=password)
        error = failed.value.error
        assert isinstance(error, SaslAuthenticationFailedError)
        assert "SASL authentication failed: invalid username or password" in str(error)
        assert not error.retriable
