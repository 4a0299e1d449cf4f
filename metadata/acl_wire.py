"""ACLs on the wire: `AclBinding` / `AclBindingFilter` <-> the CreateAcls, DeleteAcls and
DescribeAcls messages (Kafka's shapes), for the controller and the admin client alike.

Pure functions over generated messages: no I/O. Every byte from a peer is untrusted: a request
past the bounds below (too many items, a string too long) is refused whole with
InvalidRequestError before anything is judged; numbers no enum member names decode as UNKNOWN,
which `AclBinding.validate` / `AclBindingFilter.validate` then refuse item by item.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from minibroker.client.common.pbwire import check_count, pb_error_code
from minibroker.client.errors import ErrorCode, InvalidRequestError, MiniBrokerError, error_for
from minibroker.metadata.acl import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    enum_or_unknown,
)
from minibroker.proto import minibroker_pb2 as pb

MAX_ACL_ITEMS = 1_000  # creations or filters of one request
MAX_ACL_STRING_CHARS = 1_000  # a resource name, principal or host


def _check_str(what: str, value: str | None) -> None:
    if value is not None and len(value) > MAX_ACL_STRING_CHARS:
        raise InvalidRequestError(
            f"{what} of {len(value)} characters (at most {MAX_ACL_STRING_CHARS}): {value[:40]!r}..."
        )


def _binding(
    rtype: int, name: str, pattern: int, principal: str, host: str, op: int, perm: int
) -> AclBinding:
    return AclBinding(
        ResourceType(enum_or_unknown(ResourceType, rtype)),
        name,
        PatternType(enum_or_unknown(PatternType, pattern)),
        principal,
        host,
        AclOperation(enum_or_unknown(AclOperation, op)),
        AclPermissionType(enum_or_unknown(AclPermissionType, perm)),
    )


# -- CreateAcls -----------------------------------------------------------------------------------


def create_request(bindings: Iterable[AclBinding]) -> pb.CreateAclsRequest:
    return pb.CreateAclsRequest(
        creations=[
            pb.AclCreation(
                resource_type=int(b.resource_type),
                resource_name=b.resource_name,
                resource_pattern_type=int(b.pattern_type),
                principal=b.principal,
                host=b.host,
                operation=int(b.operation),
                permission_type=int(b.permission_type),
            )
            for b in bindings
        ]
    )


def creations(msg: pb.CreateAclsRequest) -> list[AclBinding]:
    """The ACLs to create, unvalidated (the core judges each). InvalidRequestError past the
    bounds."""
    check_count("ACL creations", len(msg.creations), MAX_ACL_ITEMS)
    out = []
    for c in msg.creations:
        _check_str("resource name", c.resource_name)
        _check_str("principal", c.principal)
        _check_str("host", c.host)
        out.append(
            _binding(
                c.resource_type,
                c.resource_name,
                c.resource_pattern_type,
                c.principal,
                c.host,
                c.operation,
                c.permission_type,
            )
        )
    return out


def create_reply(results: Iterable[tuple[int, str]]) -> pb.CreateAclsResponse:
    return pb.CreateAclsResponse(
        results=[
            pb.AclCreationResult(error_code=pb_error_code(e), error_message=m) for e, m in results
        ]
    )


def create_error(msg: pb.CreateAclsRequest, err: MiniBrokerError) -> pb.CreateAclsResponse:
    """The whole request refused: its error for each creation (at most MAX_ACL_ITEMS)."""
    n = max(1, min(len(msg.creations), MAX_ACL_ITEMS))
    return create_reply([(err.code, str(err))] * n)


def create_results(resp: pb.CreateAclsResponse) -> list[MiniBrokerError | None]:
    return [
        None if r.error_code == ErrorCode.NONE else error_for(r.error_code, r.error_message)
        for r in resp.results
    ]


# -- filters --------------------------------------------------------------------------------------


def filter_to_pb(f: AclBindingFilter) -> pb.AclFilter:
    msg = pb.AclFilter(
        resource_type_filter=int(f.resource_type),
        pattern_type_filter=int(f.pattern_type),
        operation=int(f.operation),
        permission_type=int(f.permission_type),
    )
    if f.resource_name is not None:
        msg.resource_name_filter = f.resource_name
    if f.principal is not None:
        msg.principal_filter = f.principal
    if f.host is not None:
        msg.host_filter = f.host
    return msg


def filter_from_pb(msg: pb.AclFilter) -> AclBindingFilter:
    """A filter, unvalidated; InvalidRequestError for a string past the bound."""
    name = msg.resource_name_filter if msg.HasField("resource_name_filter") else None
    principal = msg.principal_filter if msg.HasField("principal_filter") else None
    host = msg.host_filter if msg.HasField("host_filter") else None
    _check_str("resource name filter", name)
    _check_str("principal filter", principal)
    _check_str("host filter", host)
    return AclBindingFilter(
        ResourceType(enum_or_unknown(ResourceType, msg.resource_type_filter)),
        name,
        PatternType(enum_or_unknown(PatternType, msg.pattern_type_filter)),
        principal,
        host,
        AclOperation(enum_or_unknown(AclOperation, msg.operation)),
        AclPermissionType(enum_or_unknown(AclPermissionType, msg.permission_type)),
    )


# -- DeleteAcls -----------------------------------------------------------------------------------


def delete_request(filters: Iterable[AclBindingFilter]) -> pb.DeleteAclsRequest:
    return pb.DeleteAclsRequest(filters=[filter_to_pb(f) for f in filters])


def delete_filters(msg: pb.DeleteAclsRequest) -> list[AclBindingFilter]:
    check_count("ACL filters", len(msg.filters), MAX_ACL_ITEMS)
    return [filter_from_pb(f) for f in msg.filters]


def delete_reply(
    results: Iterable[tuple[int, str, Sequence[AclBinding]]],
) -> pb.DeleteAclsResponse:
    return pb.DeleteAclsResponse(
        filter_results=[
            pb.DeleteAclsFilterResult(
                error_code=pb_error_code(error),
                error_message=message,
                matching_acls=[
                    pb.DeleteAclsMatchingAcl(
                        error_code=pb_error_code(ErrorCode.NONE),
                        resource_type=int(b.resource_type),
                        resource_name=b.resource_name,
                        pattern_type=int(b.pattern_type),
                        principal=b.principal,
                        host=b.host,
                        operation=int(b.operation),
                        permission_type=int(b.permission_type),
                    )
                    for b in matching
                ],
            )
            for error, message, matching in results
        ]
    )


def delete_error(msg: pb.DeleteAclsRequest, err: MiniBrokerError) -> pb.DeleteAclsResponse:
    n = max(1, min(len(msg.filters), MAX_ACL_ITEMS))
    return delete_reply([(err.code, str(err), ())] * n)


def delete_results(
    resp: pb.DeleteAclsResponse,
) -> list[tuple[MiniBrokerError | None, list[AclBinding]]]:
    out: list[tuple[MiniBrokerError | None, list[AclBinding]]] = []
    for r in resp.filter_results:
        error = None if r.error_code == ErrorCode.NONE else error_for(r.error_code, r.error_message)
        matching = [
            _binding(
                m.resource_type,
                m.resource_name,
                m.pattern_type,
                m.principal,
                m.host,
                m.operation,
                m.permission_type,
            )
            for m in r.matching_acls
        ]
        out.append((error, matching))
    return out


# -- DescribeAcls ---------------------------------------------------------------------------------


def describe_request(f: AclBindingFilter) -> pb.DescribeAclsRequest:
    return pb.DescribeAclsRequest(filter=filter_to_pb(f))


def describe_filter(msg: pb.DescribeAclsRequest) -> AclBindingFilter:
    return filter_from_pb(msg.filter)


def describe_reply(bindings: Iterable[AclBinding]) -> pb.DescribeAclsResponse:
    """The ACLs grouped by resource pattern, in order of first appearance (Kafka's shape)."""
    groups: dict[tuple[int, str, int], list[AclBinding]] = {}
    for b in bindings:
        key = (int(b.resource_type), b.resource_name, int(b.pattern_type))
        groups.setdefault(key, []).append(b)
    return pb.DescribeAclsResponse(
        error_code=pb_error_code(ErrorCode.NONE),
        resources=[
            pb.DescribeAclsResource(
                resource_type=rtype,
                resource_name=name,
                pattern_type=pattern,
                acls=[
                    pb.AclDescription(
                        principal=b.principal,
                        host=b.host,
                        operation=int(b.operation),
                        permission_type=int(b.permission_type),
                    )
                    for b in members
                ],
            )
            for (rtype, name, pattern), members in groups.items()
        ],
    )


def describe_error(err: MiniBrokerError | tuple[int, str]) -> pb.DescribeAclsResponse:
    code, message = (err.code, str(err)) if isinstance(err, MiniBrokerError) else err
    return pb.DescribeAclsResponse(error_code=pb_error_code(code), error_message=message)


def described(resp: pb.DescribeAclsResponse) -> list[AclBinding]:
    """The ACLs of a DescribeAcls answer; raises its error."""
    if resp.error_code != ErrorCode.NONE:
        raise error_for(resp.error_code, resp.error_message)
    return [
        _binding(
            r.resource_type,
            r.resource_name,
            r.pattern_type,
            a.principal,
            a.host,
            a.operation,
            a.permission_type,
        )
        for r in resp.resources
        for a in r.acls
    ]


__all__ = [
    "MAX_ACL_ITEMS",
    "MAX_ACL_STRING_CHARS",
    "create_error",
    "create_reply",
    "create_request",
    "create_results",
    "creations",
    "delete_error",
    "delete_filters",
    "delete_reply",
    "delete_request",
    "delete_results",
    "describe_error",
    "describe_filter",
    "describe_reply",
    "describe_request",
    "described",
    "filter_from_pb",
    "filter_to_pb",
]
