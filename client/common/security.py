"""Who a call is from, and whether it may do what it asks (issue 16; docs/design.md "Security").

Server side, used by every servicer (BrokerService, ControllerService, QuorumService; Health
is not checked):

- `authenticate(context, protocol, sasl)` -> `CallIdentity(principal, host, via)`, by the rules
  of SPEC-16b: a SASL header (only on a SASL_SSL listener, checked by the `sasl` hook), else a
  CA-verified client certificate (`User:<its CN>`, via "tls"), else `User:ANONYMOUS` (refused on
  SASL_SSL). A refusal is `AuthenticationFailed`, which the call ends with as UNAUTHENTICATED.
- `authenticated` (a class decorator) runs that before every RPC method of a servicer class
  (once per call: a stream authenticates when it starts) and makes the identity available to the
  handler as `caller()`.
- `Access`: the configured authorizer plus the two rules that are not ACLs: a node principal
  (a certificate `node_of` maps) may do CLUSTER_ACTION on the cluster, and a node may only speak
  for itself (`node_refusal`), which applies even with no authorizer configured.
- The per-RPC decisions (pure): `node_refusal`, `split_topics`.

grpc.aio server interceptors cannot see the TLS auth context, hence the decorator. Pure apart
from reading the call's context.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import grpc

from minibroker.client.common.listeners import SASL_SSL
from minibroker.client.common.sasl import SASL_METADATA_KEY
from minibroker.metadata.acl import (
    ANONYMOUS,
    CLUSTER_RESOURCE_NAME,
    AclIndex,
    AclOperation,
    AllowAll,
    Authorizer,
    Principal,
    ResourceType,
    node_of,
)
from minibroker.metadata.authorizer import make_authorizer

SASL_HEADER = SASL_METADATA_KEY  # the gRPC metadata entry a SASL client sends
# A node certificate names its node in a SAN URI too (deploy/tls.py): minibroker:node:broker-2.
NODE_URI_PREFIX = "minibroker:node:"

# SaslVerifier.principal (client/common/sasl.py): the verified user of a call's SASL header,
# None when there is no header; raises (SaslAuthenticationFailedError) with a clear message when
# it is wrong. It may run PBKDF2, so the servers call it off the event loop.
SaslHook = Callable[[Sequence[tuple[str, Any]]], Principal | None]


@dataclass(frozen=True, slots=True)
class CallIdentity:
    """Who a call is from: `via` "node" (a CA-verified node certificate: its CN `broker-N` /
    `controller-N` and the SAN URI `minibroker:node:<CN>` agree), "tls" (any other CA-verified
    client certificate), "sasl", or "none"."""

    principal: Principal
    host: str
    via: str

    @property
    def node(self) -> tuple[str, int] | None:
        """("broker", 3) when the caller is a node: only a node certificate makes one (a user
        certificate whose CN reads `broker-3` does not)."""
        return node_of(self.principal) if self.via == "node" else None

    def __str__(self) -> str:
        return str(self.principal)


class AuthenticationFailed(Exception):
    """The call cannot be attributed to anyone: it ends UNAUTHENTICATED with this message."""


def peer_host(peer: str) -> str:
    """`context.peer()` -> the peer's IP, as ACL hosts name it: "ipv4:127.0.0.1:5000" ->
    "127.0.0.1", "ipv6:%5B::1%5D:5000" (grpc percent-encodes the brackets) -> "::1"; "" when
    it has none (unix sockets)."""
    kind, _, rest = peer.partition(":")
    rest = urllib.parse.unquote(rest)
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        host = rest.rpartition(":")[0]
        return host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return ""


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _has_sasl(metadata: Sequence[tuple[str, Any]]) -> bool:
    return any(key.lower() == SASL_HEADER for key, _ in metadata)


def _sasl_principal(
    metadata: Sequence[tuple[str, Any]], protocol: str, sasl: SaslHook | None
) -> Principal | None:
    """The SASL step (rule 1): the verified user of the call's SASL header, None without one."""
    if not _has_sasl(metadata):
        return None
    if protocol != SASL_SSL:
        raise AuthenticationFailed(f"listener is {protocol}; SASL needs a SASL_SSL listener")
    if sasl is None:
        raise AuthenticationFailed("this listener does not take SASL")
    try:
        return sasl(metadata)
    except Exception as err:  # SaslAuthenticationFailedError, or a malformed header
        raise AuthenticationFailed(
            getattr(err, "message", None) or str(err) or "SASL authentication failed"
        ) from None


def _identity(host: str, auth: Any, protocol: str, principal: Principal | None) -> CallIdentity:
    """Rules 2 and 3, after the SASL step gave `principal` (or None)."""
    if principal is not None:
        return CallIdentity(principal, host, "sasl")
    # A certificate is only there when the listener required one (ssl.client.auth=required:
    # gRPC's Python server cannot ask for an optional one), so the CA has verified it.
    if [_text(v) for v in auth.get("transport_security_type", ())] == ["ssl"]:
        names = auth.get("x509_common_name") or ()
        if names:
            name = _text(names[0])
            uris = {_text(u) for u in auth.get("peer_uri", ())}
            via = "node" if f"{NODE_URI_PREFIX}{name}" in uris else "tls"
            return CallIdentity(Principal("User", name), host, via)
    if protocol == SASL_SSL:
        raise AuthenticationFailed(
            "SASL_SSL listener: authenticate with sasl.username/sasl.password"
        )
    return CallIdentity(ANONYMOUS, host, "none")


def _read(context: Any) -> tuple[str, tuple[tuple[str, Any], ...], Any]:
    return (
        peer_host(_text(context.peer() or "")),
        tuple(context.invocation_metadata() or ()),
        context.auth_context() or {},
    )


def authenticate(context: Any, protocol: str, sasl: SaslHook | None = None) -> CallIdentity:
    """The identity of the call in `context` on a listener of security protocol `protocol`
    (PLAINTEXT, SSL, SASL_SSL); raises AuthenticationFailed with the reason."""
    host, metadata, auth = _read(context)
    return _identity(host, auth, protocol, _sasl_principal(metadata, protocol, sasl))


async def authenticate_async(
    context: Any, protocol: str, sasl: SaslHook | None = None
) -> CallIdentity:
    """`authenticate`, with a SASL login checked in a worker thread: a password check runs
    PBKDF2 (milliseconds), which must not stall the event loop (Raft timers, heartbeats) when
    a client sends wrong passwords in a loop."""
    host, metadata, auth = _read(context)
    principal = None
    if _has_sasl(metadata):
        principal = await asyncio.to_thread(_sasl_principal, metadata, protocol, sasl)
    return _identity(host, auth, protocol, principal)


# ---- decisions --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Access:
    """What a server decides with: its authorizer (None: none configured, everything allowed
    except a node speaking for another node)."""

    authorizer: Authorizer | None = None

    @property
    def enabled(self) -> bool:
        return self.authorizer is not None

    def allows(
        self,
        who: CallIdentity,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str = CLUSTER_RESOURCE_NAME,
    ) -> bool:
        if (
            operation == AclOperation.CLUSTER_ACTION
            and resource_type == ResourceType.CLUSTER
            and who.node is not None
        ):
            return True  # the CA vouches for a node (and this is all a node gets from it)
        if self.authorizer is None:
            return True
        return self.authorizer.authorize(who.principal, who.host, operation, resource_type, name)

    def on_cluster(self, who: CallIdentity, operation: AclOperation) -> bool:
        return self.allows(who, operation, ResourceType.CLUSTER, CLUSTER_RESOURCE_NAME)

    def on_topic(self, who: CallIdentity, operation: AclOperation, topic: str) -> bool:
        return self.allows(who, operation, ResourceType.TOPIC, topic)


ALLOW_ALL = Access(None)


def node_refusal(access: Access, who: CallIdentity, role: str, node_id: int) -> str | None:
    """The check of a node RPC made for `role`-`node_id` (a broker's RegisterBroker/Heartbeat/
    AlterPartition/AllocateProducerIds or replica Fetch, a controller's quorum RPC): None when
    allowed, else why not. It needs CLUSTER_ACTION on the cluster, and a node principal may only
    speak for itself (this holds with no authorizer configured too)."""
    if not access.on_cluster(who, AclOperation.CLUSTER_ACTION):
        return f"{who.principal} is not authorized to CLUSTER_ACTION on the cluster"
    node = who.node
    if node is not None and node != (role, node_id):
        return (
            f"{who.principal} (the certificate of {node[0]} {node[1]}) cannot act for "
            f"{role} {node_id}"
        )
    return None


def topic_refusal(who: CallIdentity, operation: AclOperation, topic: str) -> str:
    return f"not authorized to {operation.name} topic {topic} as {who.principal}"


def cluster_refusal(who: CallIdentity, operation: AclOperation) -> str:
    return f"not authorized to {operation.name} on the cluster as {who.principal}"


T = TypeVar("T")


def split_topics(
    items: Iterable[T], name: Callable[[T], str], allowed: Callable[[str], bool]
) -> tuple[list[T], list[T]]:
    """(allowed, refused) items of a request, by each one's topic name."""
    ok: list[T] = []
    refused: list[T] = []
    for item in items:
        (ok if allowed(name(item)) else refused).append(item)
    return ok, refused


# ---- the mechanism: every RPC method authenticates first --------------------------------

_CALLER: contextvars.ContextVar[CallIdentity] = contextvars.ContextVar("minibroker_caller")


def caller() -> CallIdentity:
    """The identity of the call being handled (set by `authenticated` before the handler)."""
    return _CALLER.get()


@dataclass(frozen=True, slots=True)
class ServerSecurity:
    """A listener's security: its protocol, the SASL hook (SASL_SSL), and the access rules."""

    protocol: str = "PLAINTEXT"
    sasl: SaslHook | None = None
    access: Access = ALLOW_ALL
    # Set once the ACLs are loaded (a broker: its metadata caught up with the controller's log
    # as of its first answer). Until then calls other than nodes' wait for it: Kafka's
    # StandardAuthorizer serves no request before its initial load (KIP-801). None: loaded.
    loaded: asyncio.Event | None = None

    async def identify(self, context: Any) -> CallIdentity:
        who = await authenticate_async(context, self.protocol, self.sasl)
        loaded = self.loaded
        if loaded is not None and not loaded.is_set() and who.node is None:
            remaining = context.time_remaining()
            wait_s = (
                AUTHORIZER_LOAD_WAIT_S
                if remaining is None
                else min(remaining, AUTHORIZER_LOAD_WAIT_S)
            )
            try:
                await asyncio.wait_for(loaded.wait(), wait_s)
            except TimeoutError:
                raise AuthenticationFailed(
                    "the broker's authorizer is still loading the ACLs; try again"
                ) from None
        return who


# How long a call waits for the authorizer's initial load before it is refused.
AUTHORIZER_LOAD_WAIT_S = 30.0


class _Secured(Protocol):
    security: ServerSecurity


def _rpc_names(cls: type) -> list[str]:
    """The RPC methods of a servicer class: those its generated base (`*Servicer` in
    minibroker_pb2_grpc) declares."""
    for base in cls.__mro__:
        if base.__module__.endswith("_pb2_grpc"):
            return [n for n, v in vars(base).items() if callable(v) and not n.startswith("_")]
    raise TypeError(f"{cls.__name__} is not a generated gRPC servicer")


def _wrap(method: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def stream(self: _Secured, request: Any, context: Any) -> Any:
            try:
                who = await self.security.identify(context)
            except AuthenticationFailed as err:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(err))
                return
            _CALLER.set(who)
            inner = method(self, request, context)
            try:
                async for item in inner:
                    yield item
            finally:
                # Closed with this one, not when collected: the handler's own finally (the
                # Heartbeat stream's fencing on close) runs at once.
                await inner.aclose()

        return stream

    @functools.wraps(method)
    async def unary(self: _Secured, request: Any, context: Any) -> Any:
        try:
            who = await self.security.identify(context)
        except AuthenticationFailed as err:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(err))
        _CALLER.set(who)
        return await method(self, request, context)

    return unary


C = TypeVar("C", bound=type)


def authenticated(cls: C) -> C:
    """Class decorator: every RPC method of the servicer authenticates its call (through
    `self.security`, a ServerSecurity) before the handler runs, and ends it UNAUTHENTICATED
    when that fails. Methods the class does not define (UNIMPLEMENTED) are left alone; a
    subclass that overrides an RPC method must be decorated too."""
    for name in _rpc_names(cls):
        method = cls.__dict__.get(name)
        if method is not None:
            setattr(cls, name, _wrap(method))
    return cls


__all__ = [
    "ALLOW_ALL",
    "SASL_HEADER",
    "Access",
    "AuthenticationFailed",
    "CallIdentity",
    "ServerSecurity",
    "authenticate",
    "authenticate_async",
    "authenticated",
    "caller",
    "cluster_refusal",
    "node_refusal",
    "peer_host",
    "server_security",
    "split_topics",
    "topic_refusal",
]


def server_security(
    values: Any,
    protocol: str,
    *,
    sasl: SaslHook | None = None,
    acl_view: Any = None,
    loaded: asyncio.Event | None = None,
) -> ServerSecurity:
    """A broker's or controller's listener security from its configs (authorizer.class.name,
    super.users, allow.everyone.if.no.acl.found: metadata/authorizer.py). `sasl`:
    `SaslVerifier(lookup).principal` on a SASL_SSL listener (None: a SASL header is refused);
    `acl_view`: the image's ACLs the authorizer reads."""
    authorizer = make_authorizer(values, AclIndex() if acl_view is None else acl_view)
    # AllowAll: none configured. Access then skips the per-topic checks altogether (and no
    # call waits for ACLs to load).
    enabled = not isinstance(authorizer, AllowAll)
    return ServerSecurity(
        protocol,
        sasl,
        Access(authorizer if enabled else None),
        loaded if enabled else None,
    )
