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

import contextvars
import functools
import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import grpc

from minibroker.metadata.acl import (
    ANONYMOUS,
    CLUSTER_RESOURCE_NAME,
    AclOperation,
    AllowAll,
    Authorizer,
    Principal,
    ResourceType,
    node_of,
)
from minibroker.metadata.authorizer import make_authorizer

SASL_HEADER = "x-minibroker-sasl"  # the gRPC metadata entry a SASL client sends (SPEC-16b)
SASL_SSL = "SASL_SSL"

# H1's SaslVerifier.principal: the verified user of a call's SASL header, None when there is no
# header; raises (SaslAuthenticationFailedError) with a clear message when it is wrong.
SaslHook = Callable[[Sequence[tuple[str, Any]]], Principal | None]


@dataclass(frozen=True, slots=True)
class CallIdentity:
    """Who a call is from: `via` "tls" (a CA-verified client certificate), "sasl", or "none"."""

    principal: Principal
    host: str
    via: str

    @property
    def node(self) -> tuple[str, int] | None:
        """("broker", 3) when the caller is a node: only a certificate makes one."""
        return node_of(self.principal) if self.via == "tls" else None

    def __str__(self) -> str:
        return str(self.principal)


class AuthenticationFailed(Exception):
    """The call cannot be attributed to anyone: it ends UNAUTHENTICATED with this message."""


def peer_host(peer: str) -> str:
    """`context.peer()` -> the peer's IP: "ipv4:127.0.0.1:5000" -> "127.0.0.1",
    "ipv6:[::1]:5000" -> "::1"; "" when it has none (unix sockets)."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        host = rest.rpartition(":")[0]
        return host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return ""


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def authenticate(context: Any, protocol: str, sasl: SaslHook | None = None) -> CallIdentity:
    """The identity of the call in `context` on a listener of security protocol `protocol`
    (PLAINTEXT, SSL, SASL_SSL); raises AuthenticationFailed with the reason."""
    host = peer_host(_text(context.peer() or ""))
    metadata = tuple(context.invocation_metadata() or ())
    if any(key == SASL_HEADER for key, _ in metadata):
        if protocol != SASL_SSL:
            raise AuthenticationFailed(f"listener is {protocol}; SASL needs a SASL_SSL listener")
        if sasl is None:
            raise AuthenticationFailed("this listener does not take SASL")
        try:
            principal = sasl(metadata)
        except Exception as err:  # SaslAuthenticationFailedError, or a malformed header
            raise AuthenticationFailed(
                getattr(err, "message", None) or str(err) or "SASL authentication failed"
            ) from None
        if principal is not None:
            return CallIdentity(principal, host, "sasl")
    auth = context.auth_context() or {}
    # A certificate is only there when the listener required one (ssl.client.auth=required:
    # gRPC's Python server cannot ask for an optional one), so the CA has verified it.
    if [_text(v) for v in auth.get("transport_security_type", ())] == ["ssl"]:
        names = auth.get("x509_common_name") or ()
        if names:
            return CallIdentity(Principal("User", _text(names[0])), host, "tls")
    if protocol == SASL_SSL:
        raise AuthenticationFailed(
            "SASL_SSL listener: authenticate with sasl.username/sasl.password"
        )
    return CallIdentity(ANONYMOUS, host, "none")


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

    def identify(self, context: Any) -> CallIdentity:
        return authenticate(context, self.protocol, self.sasl)


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
                who = self.security.identify(context)
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
            who = self.security.identify(context)
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
    values: Any, protocol: str, *, sasl: SaslHook | None = None, acl_view: Any = None
) -> ServerSecurity:
    """A broker's or controller's listener security from its configs (authorizer.class.name,
    super.users, allow.everyone.if.no.acl.found: metadata/authorizer.py). `sasl`:
    `SaslVerifier(lookup).principal` on a SASL_SSL listener (None: a SASL header is refused);
    `acl_view`: the image's ACLs the authorizer reads."""
    authorizer = make_authorizer(values, acl_view)
    # AllowAll: none configured. Access then skips the per-topic checks altogether.
    return ServerSecurity(
        protocol, sasl, Access(None if isinstance(authorizer, AllowAll) else authorizer)
    )
