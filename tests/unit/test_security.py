"""client/common/security.py and the per-RPC decisions (broker/authz.py, controller/authz.py):
who a call is from, and what each RPC needs (SPEC-16b's table), as tables."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from minibroker.broker import authz as broker_authz
from minibroker.client.common.config import ConfigError
from minibroker.client.common.security import (
    SASL_HEADER,
    Access,
    AuthenticationFailed,
    CallIdentity,
    ServerSecurity,
    authenticate,
    authenticated,
    caller,
    node_refusal,
    peer_host,
    server_security,
)
from minibroker.controller import authz as controller_authz
from minibroker.metadata.acl import (
    ANONYMOUS,
    AclIndex,
    AclOperation,
    AllowAll,
    Authorizer,
    Principal,
    ResourceType,
    node_of,
)
from minibroker.metadata.authorizer import make_authorizer as _make_authorizer
from minibroker.metadata.authorizer import parse_super_users
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

ADMIN = Principal("User", "admin")
MALLORY = Principal("User", "mallory")


class Ctx:
    """What authenticate reads from a grpc.aio ServicerContext."""

    def __init__(
        self,
        cn: str | None = None,
        metadata: tuple[tuple[str, str], ...] = (),
        tls: bool = True,
        uri: str | None = None,
    ) -> None:
        self.cn, self.metadata, self.tls, self.uri = cn, metadata, tls, uri

    def peer(self) -> str:
        return "ipv4:10.1.2.3:5000"

    def time_remaining(self) -> float | None:
        return self.remaining

    remaining: float | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    def auth_context(self) -> dict[str, list[bytes]]:
        if not self.tls:
            return {"transport_security_type": [b"insecure"]}
        auth = {"transport_security_type": [b"ssl"]}
        if self.cn is not None:
            auth["x509_common_name"] = [self.cn.encode()]
        if self.uri is not None:
            auth["peer_uri"] = [self.uri.encode()]
        return auth


NODE_2 = "minibroker:node:broker-2"


SASL = ((SASL_HEADER, "PLAIN AGFsaWNlAHNlY3JldA=="),)


def make_authorizer(settings: dict[str, Any]) -> Authorizer:
    """The configured authorizer over no ACLs (the rules here are super users and nodes)."""
    return _make_authorizer(settings, AclIndex())


def sasl_hook(metadata: Any) -> Principal | None:
    for key, value in metadata:
        if key == SASL_HEADER:
            if value.endswith("AHNlY3JldA=="):
                return Principal("User", "alice")
            raise ValueError("SASL authentication failed: invalid username or password")
    return None


def bad_sasl(metadata: Any) -> Principal | None:
    raise ValueError("SASL authentication failed: invalid username or password")


@pytest.mark.parametrize(
    ("ctx", "protocol", "sasl", "want"),
    [
        (Ctx(tls=False), "PLAINTEXT", None, ("User:ANONYMOUS", "none")),
        (Ctx(), "SSL", None, ("User:ANONYMOUS", "none")),
        (Ctx("alice"), "SSL", None, ("User:alice", "tls")),
        (Ctx("broker-2", uri=NODE_2), "SSL", None, ("User:broker-2", "node")),
        (Ctx("broker-2", uri=NODE_2), "SASL_SSL", sasl_hook, ("User:broker-2", "node")),
        (Ctx("broker-2", SASL, uri=NODE_2), "SASL_SSL", sasl_hook, ("User:alice", "sasl")),
        # a user certificate whose CN reads like a node's is not one: no node SAN URI, or
        # another node's, or a user's
        (Ctx("broker-2"), "SSL", None, ("User:broker-2", "tls")),
        (Ctx("broker-2", uri="minibroker:node:broker-3"), "SSL", None, ("User:broker-2", "tls")),
        (Ctx("broker-2", uri="minibroker:user:broker-2"), "SSL", None, ("User:broker-2", "tls")),
        (Ctx(None, SASL), "SASL_SSL", sasl_hook, ("User:alice", "sasl")),
        # a certificate's CN on a plaintext connection cannot exist; an auth context saying
        # "insecure" is never read for one
        (Ctx("alice", tls=False), "PLAINTEXT", None, ("User:ANONYMOUS", "none")),
    ],
)
def test_authenticate_who_a_call_is_from(ctx: Ctx, protocol: str, sasl: Any, want: Any) -> None:
    who = authenticate(ctx, protocol, sasl)
    assert (str(who.principal), who.via) == want
    assert who.host == "10.1.2.3"


@pytest.mark.parametrize(
    ("ctx", "protocol", "sasl", "message"),
    [
        (Ctx("alice", SASL), "SSL", None, "listener is SSL; SASL needs a SASL_SSL listener"),
        (Ctx(None, SASL, tls=False), "PLAINTEXT", sasl_hook, "listener is PLAINTEXT"),
        (Ctx(None, SASL), "SASL_SSL", None, "this listener does not take SASL"),
        (Ctx("alice", SASL), "SASL_SSL", bad_sasl, "invalid username or password"),
        (Ctx(None), "SASL_SSL", sasl_hook, "authenticate with sasl.username/sasl.password"),
    ],
)
def test_authenticate_refusals_say_why(ctx: Ctx, protocol: str, sasl: Any, message: str) -> None:
    with pytest.raises(AuthenticationFailed, match=message):
        authenticate(ctx, protocol, sasl)


def test_peer_host() -> None:
    assert peer_host("ipv4:127.0.0.1:5000") == "127.0.0.1"
    assert peer_host("ipv6:[::1]:5000") == "::1"
    assert peer_host("ipv6:%5B::1%5D:36042") == "::1"  # what grpc 1.85 gives
    assert peer_host("ipv6:%5Bfe80::1%5D:5000") == "fe80::1"
    assert peer_host("unix:/tmp/x") == ""


def test_only_a_node_certificate_makes_a_node() -> None:
    assert CallIdentity(Principal("User", "broker-1"), "h", "node").node == ("broker", 1)
    assert CallIdentity(Principal("User", "broker-1"), "h", "tls").node is None
    assert CallIdentity(Principal("User", "broker-1"), "h", "sasl").node is None
    assert CallIdentity(Principal("User", "alice"), "h", "node").node is None


def test_authorizer_configs() -> None:
    assert isinstance(make_authorizer({"authorizer.class.name": ""}), AllowAll)
    assert server_security({}, "PLAINTEXT").access.authorizer is None  # none: no checks
    std = make_authorizer(
        {"authorizer.class.name": "StandardAuthorizer", "super.users": "User:admin;User:ops"}
    )
    assert std.authorize(ADMIN, "h", AclOperation.ALTER, ResourceType.CLUSTER, "kafka-cluster")
    assert not std.authorize(MALLORY, "h", AclOperation.READ, ResourceType.TOPIC, "t")
    secured = server_security({"authorizer.class.name": "StandardAuthorizer"}, "SSL")
    assert secured.access.enabled and secured.protocol == "SSL"
    everyone = make_authorizer(
        {"authorizer.class.name": "StandardAuthorizer", "allow.everyone.if.no.acl.found": True}
    )
    assert everyone.authorize(MALLORY, "h", AclOperation.READ, ResourceType.TOPIC, "t")
    with pytest.raises(ConfigError, match=r"authorizer\.class\.name"):
        make_authorizer({"authorizer.class.name": "AclAuthorizer"})
    assert set(parse_super_users("User:a; User:b;")) == {
        Principal("User", "a"),
        Principal("User", "b"),
    }


def ident(name: str, via: str | None = None) -> CallIdentity:
    """A caller: a node certificate for node names, a user certificate otherwise."""
    principal = Principal.parse(name)
    return CallIdentity(principal, "127.0.0.1", via or ("node" if node_of(principal) else "tls"))


OPEN = Access(None)
SECURED = Access(
    make_authorizer({"authorizer.class.name": "StandardAuthorizer", "super.users": "User:admin"})
)


@pytest.mark.parametrize(
    ("access", "who", "role", "node_id", "refused"),
    [
        # the identity rule holds with no authorizer too
        (OPEN, ident("User:broker-2"), "broker", 2, None),
        (OPEN, ident("User:broker-2"), "broker", 3, "cannot act for broker 3"),
        (OPEN, ident("User:controller-1"), "broker", 1, "cannot act for broker 1"),
        (OPEN, ident("User:mallory"), "broker", 3, None),
        (OPEN, ident("User:broker-2", "sasl"), "broker", 3, None),
        (SECURED, ident("User:broker-2"), "broker", 2, None),
        (SECURED, ident("User:broker-2"), "broker", 3, "cannot act for broker 3"),
        (SECURED, ident("User:controller-3"), "controller", 3, None),
        (SECURED, ident("User:broker-1"), "controller", 1, "cannot act for controller 1"),
        (SECURED, ident("User:admin"), "broker", 3, None),
        (SECURED, ident("User:mallory"), "broker", 3, "not authorized to CLUSTER_ACTION"),
        # a SASL user named like a node is no node
        (SECURED, ident("User:broker-3", "sasl"), "broker", 3, "not authorized to CLUSTER_ACTION"),
        (SECURED, ident("User:ANONYMOUS", "none"), "broker", 3, "not authorized"),
    ],
)
def test_node_rpcs(
    access: Access, who: CallIdentity, role: str, node_id: int, refused: Any
) -> None:
    why = node_refusal(access, who, role, node_id)
    if refused is None:
        assert why is None
    else:
        assert why is not None and refused in why


def test_a_node_gets_cluster_action_and_nothing_else() -> None:
    broker = ident("User:broker-1")
    assert SECURED.on_cluster(broker, AclOperation.CLUSTER_ACTION)
    assert not SECURED.on_cluster(broker, AclOperation.ALTER)
    assert not SECURED.on_topic(broker, AclOperation.READ, "t")


def produce_request(*topics: str) -> pb.ProduceRequest:
    request = pb.ProduceRequest(acks=-1, timeout_ms=100, correlation_id=7)
    for t in topics:
        request.topics.add(topic=t).partitions.add(partition=0, records=b"x")
    return request


def test_produce_refuses_per_topic() -> None:
    request = produce_request("a", "b")
    same, refused = broker_authz.produce(OPEN, ident("User:mallory"), request)
    assert same is request and refused == []
    allowed, refused = broker_authz.produce(SECURED, ident("User:mallory"), request)
    assert list(allowed.topics) == [] and allowed.correlation_id == 7
    assert [(t.topic, t.partitions[0].error_code) for t in refused] == [
        ("a", pb.TOPIC_AUTHORIZATION_FAILED),
        ("b", pb.TOPIC_AUTHORIZATION_FAILED),
    ]
    assert (
        refused[0].partitions[0].error_message == "not authorized to WRITE topic a as User:mallory"
    )
    assert refused[0].partitions[0].base_offset == -1
    allowed, refused = broker_authz.produce(SECURED, ident("User:admin"), request)
    assert allowed is request and not refused


def fetch_request(replica_id: int, *topics: str) -> pb.FetchRequest:
    request = pb.FetchRequest(replica_id=replica_id, replica_epoch=5)
    for t in topics:
        request.topics.add(topic=t).partitions.add(partition=0)
    return request


@pytest.mark.parametrize(
    ("access", "who", "replica_id", "proceeds"),
    [
        (OPEN, "User:mallory", -1, True),
        (OPEN, "User:mallory", 3, True),  # no authorizer: as before (epoch checks still hold)
        (OPEN, "User:broker-2", 3, False),
        (SECURED, "User:broker-3", 3, True),
        (SECURED, "User:broker-2", 3, False),
        (SECURED, "User:mallory", 3, False),
        (SECURED, "User:mallory", -1, False),
        (SECURED, "User:admin", -1, True),
    ],
)
def test_fetch(access: Access, who: str, replica_id: int, proceeds: bool) -> None:
    request = fetch_request(replica_id, "t")
    allowed, refusals = broker_authz.fetch(access, ident(who), request)
    assert (allowed is not None) == proceeds
    if not proceeds:
        codes = {p.error_code for t in refusals.topics for p in t.partitions}
        want = pb.CLUSTER_AUTHORIZATION_FAILED if replica_id >= 0 else pb.TOPIC_AUTHORIZATION_FAILED
        assert codes == {want}
        if replica_id >= 0:
            assert refusals.error_code == pb.CLUSTER_AUTHORIZATION_FAILED


def test_metadata_hides_what_the_caller_may_not_describe() -> None:
    response = pb.MetadataResponse(
        topics=[pb.TopicMetadata(name="a", topic_id="x"), pb.TopicMetadata(name="b")]
    )
    listed = pb.MetadataResponse()
    listed.CopyFrom(response)
    broker_authz.filter_metadata(SECURED, ident("User:mallory"), pb.MetadataRequest(), listed)
    assert list(listed.topics) == []
    named = pb.MetadataResponse()
    named.CopyFrom(response)
    broker_authz.filter_metadata(
        SECURED, ident("User:mallory"), pb.MetadataRequest(topics=["a", "b"]), named
    )
    assert [(t.name, t.error_code, t.topic_id) for t in named.topics] == [
        ("a", pb.TOPIC_AUTHORIZATION_FAILED, ""),
        ("b", pb.TOPIC_AUTHORIZATION_FAILED, ""),
    ]
    kept = pb.MetadataResponse()
    kept.CopyFrom(response)
    broker_authz.filter_metadata(SECURED, ident("User:admin"), pb.MetadataRequest(), kept)
    assert kept == response


def test_init_producer_id_needs_idempotent_write_or_write_on_a_topic() -> None:
    assert broker_authz.init_producer_id_refusal(OPEN, ident("User:mallory"), ["t"]) is None
    assert broker_authz.init_producer_id_refusal(SECURED, ident("User:admin"), []) is None
    refused = broker_authz.init_producer_id_refusal(SECURED, ident("User:mallory"), ["t"])
    assert refused is not None and refused.error_code == pb.CLUSTER_AUTHORIZATION_FAILED


def test_offset_for_leader_epoch_from_a_replica_is_a_node_rpc() -> None:
    request = pb.OffsetForLeaderEpochRequest(replica_id=3)
    request.topics.add(topic="t").partitions.add(partition=0, leader_epoch=1)
    allowed, refused = broker_authz.offset_for_leader_epoch(OPEN, ident("User:broker-2"), request)
    assert list(allowed.topics) == []
    assert refused[0].partitions[0].error_code == pb.CLUSTER_AUTHORIZATION_FAILED
    allowed, refused = broker_authz.offset_for_leader_epoch(
        SECURED, ident("User:broker-3"), request
    )
    assert allowed is request and not refused


def test_controller_topic_operations() -> None:
    mallory, admin = ident("User:mallory"), ident("User:admin")
    create = pb.CreateTopicsRequest(topics=[pb.CreatableTopic(name="t")])
    allowed, refused = controller_authz.create_topics(SECURED, mallory, create)
    assert not allowed.topics and refused[0].error_code == pb.TOPIC_AUTHORIZATION_FAILED
    assert controller_authz.create_topics(SECURED, admin, create) == (create, [])
    names, refused = controller_authz.delete_topics(
        SECURED, mallory, pb.DeleteTopicsRequest(topic_names=["t"])
    )
    assert names == [] and refused[0].error_message == (
        "not authorized to DELETE topic t as User:mallory"
    )
    ok, refused_configs = controller_authz.config_resources(
        SECURED,
        mallory,
        [
            pb.AlterConfigsResource(resource_type=2, resource_name="t"),
            pb.AlterConfigsResource(resource_type=4, resource_name="1"),
        ],
        AclOperation.ALTER_CONFIGS,
    )
    assert ok == [] and [c for _, c, _ in refused_configs] == [
        pb.TOPIC_AUTHORIZATION_FAILED,
        pb.CLUSTER_AUTHORIZATION_FAILED,
    ]
    assert controller_authz.cluster_call(SECURED, mallory, AclOperation.ALTER) is not None
    assert controller_authz.cluster_call(SECURED, admin, AclOperation.ALTER) is None
    assert controller_authz.cluster_call(SECURED, ident("User:broker-1"), AclOperation.ALTER)
    assert (
        controller_authz.cluster_call(SECURED, ident("User:broker-1"), AclOperation.CLUSTER_ACTION)
        is None
    )


def test_describe_cluster_and_quorum_blank_what_a_forgery_needs() -> None:
    response = pb.DescribeClusterResponse(brokers=[pb.ClusterBroker(broker_id=1, broker_epoch=9)])
    seen = pb.DescribeClusterResponse()
    seen.CopyFrom(response)
    controller_authz.blank_cluster(SECURED, ident("User:mallory"), seen)
    assert seen.brokers[0].broker_epoch == -1
    seen.CopyFrom(response)
    controller_authz.blank_cluster(SECURED, ident("User:broker-2"), seen)
    assert seen.brokers[0].broker_epoch == 9
    quorum = pb.DescribeQuorumResponse(leader_id=1, leader_address="h:1", high_watermark=5)
    quorum.voters.add()
    controller_authz.blank_quorum(SECURED, ident("User:mallory"), quorum)
    assert (quorum.leader_id, quorum.leader_address, len(quorum.voters)) == (1, "h:1", 0)


@pytest.mark.parametrize(
    ("who", "message", "refused"),
    [
        (
            "User:controller-2",
            pb.VoteRequest(header=pb.QuorumHeader(sender_id=2), candidate_id=2),
            False,
        ),
        (
            "User:controller-1",
            pb.VoteRequest(header=pb.QuorumHeader(sender_id=2), candidate_id=2),
            True,
        ),
        (
            "User:controller-2",
            pb.VoteRequest(header=pb.QuorumHeader(sender_id=2), candidate_id=3),
            True,
        ),
        (
            "User:broker-1",
            pb.QuorumFetchRequest(header=pb.QuorumHeader(sender_id=1), replica_id=1),
            True,
        ),
        (
            "User:mallory",
            pb.QuorumFetchRequest(header=pb.QuorumHeader(sender_id=1), replica_id=1),
            True,
        ),
        (
            "User:controller-1",
            pb.BeginQuorumEpochRequest(header=pb.QuorumHeader(sender_id=1), leader_id=1),
            False,
        ),
        (
            "User:controller-1",
            pb.EndQuorumEpochRequest(header=pb.QuorumHeader(sender_id=1), leader_id=2),
            True,
        ),
        (
            "User:controller-3",
            pb.FetchSnapshotRequest(header=pb.QuorumHeader(sender_id=3), replica_id=3),
            False,
        ),
    ],
)
def test_quorum_rpcs(who: str, message: Any, refused: bool) -> None:
    assert (controller_authz.quorum_call(SECURED, ident(who), message) is not None) == refused


@authenticated
class Echo(pb_grpc.BrokerServiceServicer):
    """A servicer through the decorator: InitProducerId answers with the caller's name."""

    def __init__(self, security: ServerSecurity) -> None:
        self.security = security

    async def InitProducerId(self, request: Any, context: Any) -> pb.InitProducerIdResponse:
        return pb.InitProducerIdResponse(error_message=str(caller()))

    async def ProduceStream(self, request_iterator: Any, context: Any) -> None:
        async for _request in request_iterator:
            await context.write(pb.ProduceResponse(correlation_id=len(str(caller()))))


def test_the_decorator_authenticates_every_call_over_grpc() -> None:
    async def main() -> None:
        server = grpc.aio.server()
        pb_grpc.add_BrokerServiceServicer_to_server(Echo(ServerSecurity("PLAINTEXT")), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = pb_grpc.BrokerServiceStub(channel)
                reply = await stub.InitProducerId(pb.InitProducerIdRequest(), timeout=5)
                assert reply.error_message == str(ANONYMOUS)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.InitProducerId(pb.InitProducerIdRequest(), timeout=5, metadata=SASL)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert "SASL needs a SASL_SSL listener" in (refused.value.details() or "")
                call = stub.ProduceStream()
                await call.write(pb.ProduceRequest())
                answer = await call.read()
                assert answer.correlation_id == len("User:ANONYMOUS")
                await call.done_writing()
        finally:
            await server.stop(None)

    asyncio.run(main())


class _RpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def test_the_client_maps_refusals_to_non_retriable_errors() -> None:
    from minibroker.client.errors import (
        REFUSALS,
        ClusterAuthorizationFailedError,
        SaslAuthenticationFailedError,
        TopicAuthorizationFailedError,
        error_for,
    )
    from minibroker.client.wire import error_from_rpc

    cases = [
        (
            grpc.StatusCode.UNAUTHENTICATED,
            "SASL authentication failed",
            SaslAuthenticationFailedError,
        ),
        (
            grpc.StatusCode.PERMISSION_DENIED,
            "not authorized to CLUSTER_ACTION on the cluster as User:mallory",
            ClusterAuthorizationFailedError,
        ),
        (
            grpc.StatusCode.PERMISSION_DENIED,
            "not authorized to READ topic t as User:mallory",
            TopicAuthorizationFailedError,
        ),
    ]
    for code, details, cls in cases:
        err = error_from_rpc(_RpcError(code, details), "h:1")
        assert isinstance(err, cls) and details in str(err) and not err.retriable
        assert isinstance(err, REFUSALS)
    produced = error_for(pb.TOPIC_AUTHORIZATION_FAILED, "not authorized to WRITE topic t as User:m")
    assert isinstance(produced, TopicAuthorizationFailedError) and not produced.retriable


def test_a_streaming_handler_closes_with_its_call() -> None:
    """Through the decorator, a streaming handler still ends with its call: its finally (the
    Heartbeat stream's fencing when a broker goes away) runs at once when the call is
    cancelled."""

    async def main() -> None:
        closed = asyncio.Event()

        @authenticated
        class Watch(pb_grpc.ControllerServiceServicer):
            def __init__(self) -> None:
                self.security = ServerSecurity()

            async def WatchMetadata(self, request: Any, context: Any) -> Any:
                try:
                    yield pb.MetadataBatch(high_offset=len(str(caller())))
                    await asyncio.Event().wait()
                finally:
                    closed.set()

        server = grpc.aio.server()
        pb_grpc.add_ControllerServiceServicer_to_server(Watch(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = pb_grpc.ControllerServiceStub(channel).WatchMetadata(
                    pb.WatchMetadataRequest(), timeout=10
                )
                first = await call.read()
                assert first.high_offset == len("User:ANONYMOUS")
                call.cancel()
                await asyncio.wait_for(closed.wait(), 5)
        finally:
            await server.stop(None)

    asyncio.run(main())


async def test_calls_wait_for_the_authorizers_initial_load_but_nodes_do_not() -> None:
    """KIP-801: no decision on half-loaded ACLs. A user's call waits until the broker's image
    has caught up (or is refused when its deadline comes first); a node's call does not wait
    (replication and heartbeats need no ACLs)."""
    loaded = asyncio.Event()
    security = ServerSecurity("SSL", None, SECURED, loaded)
    user = asyncio.ensure_future(security.identify(Ctx("alice")))
    node = await asyncio.wait_for(security.identify(Ctx("broker-2", uri=NODE_2)), 5)
    assert node.node == ("broker", 2)
    await asyncio.sleep(0)
    assert not user.done()
    loaded.set()
    assert str((await asyncio.wait_for(user, 5)).principal) == "User:alice"
    hurried = Ctx("alice")
    hurried.remaining = 0.01
    with pytest.raises(AuthenticationFailed, match="still loading"):
        await ServerSecurity("SSL", None, SECURED, asyncio.Event()).identify(hurried)
    # no authorizer: nothing to load, nothing waits
    assert server_security({}, "SSL", loaded=asyncio.Event()).loaded is None
