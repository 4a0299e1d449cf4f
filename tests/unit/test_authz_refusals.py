"""controller/authz.py's per-resource refusals, and ControllerService keeping them in its answer
whatever happens to the allowed part (accepted, or refused by the request's own validation)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from minibroker.client.common.security import Access, CallIdentity, ServerSecurity
from minibroker.controller import authz
from minibroker.controller.service import ControllerServicer
from minibroker.metadata.acl import AclOperation, Principal, ResourceType
from minibroker.proto import minibroker_pb2 as pb

TOPIC, BROKER, UNKNOWN = 2, 4, 99
DENIED = pb.TOPIC_AUTHORIZATION_FAILED


class OkTopics:
    """An authorizer allowing everything on topics named ok*, nothing else."""

    def authorize(
        self,
        principal: Principal,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str,
    ) -> bool:
        return resource_type == ResourceType.TOPIC and name.startswith("ok")


ACCESS = Access(OkTopics())
WHO = CallIdentity(Principal("User", "mallory"), "10.0.0.1", "tls")


class Ctx:
    """What the servicer's authentication reads of a call: an SSL client certificate."""

    def peer(self) -> str:
        return "ipv4:10.0.0.1:5000"

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def auth_context(self) -> dict[str, list[bytes]]:
        return {"transport_security_type": [b"ssl"], "x509_common_name": [b"mallory"]}

    async def abort(self, code: Any, details: str) -> None:
        raise AssertionError(f"aborted: {code} {details}")


class NoCore:
    """The app of a call that never reaches the core."""

    async def submit(self, fn: Any) -> Any:
        raise AssertionError("the core was reached")


def call(method: str, request: Any) -> Any:
    servicer = ControllerServicer(NoCore(), ServerSecurity("SSL", access=ACCESS))  # type: ignore[arg-type]
    return asyncio.run(getattr(servicer, method)(request, Ctx()))


def results(response: Any) -> list[tuple[str, int]]:
    return sorted((r.resource_name, r.error_code) for r in response.results)


@pytest.mark.parametrize(
    ("function", "request_type", "resource_type", "result_type", "operation"),
    [
        (
            authz.alter_configs,
            pb.IncrementalAlterConfigsRequest,
            pb.AlterConfigsResource,
            pb.AlterConfigsResourceResult,
            "ALTER_CONFIGS",
        ),
        (
            authz.describe_configs,
            pb.DescribeConfigsRequest,
            pb.DescribeConfigsResource,
            pb.DescribeConfigsResult,
            "DESCRIBE_CONFIGS",
        ),
    ],
)
def test_config_refusals(
    function: Any, request_type: Any, resource_type: Any, result_type: Any, operation: str
) -> None:
    request = request_type(
        resources=[
            resource_type(resource_type=TOPIC, resource_name="ok1"),
            resource_type(resource_type=TOPIC, resource_name="secret"),
            resource_type(resource_type=BROKER, resource_name="1"),
            resource_type(resource_type=UNKNOWN, resource_name="x"),  # for validation to judge
        ]
    )
    allowed, refused = function(ACCESS, WHO, request)
    assert [r.resource_name for r in allowed.resources] == ["ok1", "x"]
    assert all(isinstance(r, result_type) for r in refused)
    assert [(r.resource_type, r.resource_name, r.error_code, r.error_message) for r in refused] == [
        (TOPIC, "secret", DENIED, f"not authorized to {operation} topic secret as User:mallory"),
        (
            BROKER,
            "1",
            pb.CLUSTER_AUTHORIZATION_FAILED,
            f"not authorized to {operation} on the cluster as User:mallory",
        ),
    ]
    everything = request_type(resources=[resource_type(resource_type=TOPIC, resource_name="ok")])
    assert function(ACCESS, WHO, everything) == (everything, [])


@pytest.mark.parametrize(
    ("method", "message", "want"),
    [
        # The allowed part is malformed (an unknown resource type / a topic named twice): its
        # INVALID_REQUEST, and the refusals too.
        (
            "IncrementalAlterConfigs",
            pb.IncrementalAlterConfigsRequest(
                resources=[
                    pb.AlterConfigsResource(resource_type=TOPIC, resource_name="secret"),
                    pb.AlterConfigsResource(resource_type=UNKNOWN, resource_name="x"),
                ]
            ),
            [("secret", DENIED), ("x", pb.INVALID_REQUEST)],
        ),
        (
            "DescribeConfigs",
            pb.DescribeConfigsRequest(
                resources=[
                    pb.DescribeConfigsResource(resource_type=TOPIC, resource_name="secret"),
                    pb.DescribeConfigsResource(resource_type=UNKNOWN, resource_name="x"),
                ]
            ),
            [("secret", DENIED), ("x", pb.INVALID_REQUEST)],
        ),
        (
            "CreatePartitions",
            pb.CreatePartitionsRequest(
                topics=[
                    pb.CreatePartitionsTopic(name="secret", count=2),
                    pb.CreatePartitionsTopic(name="ok", count=2),
                    pb.CreatePartitionsTopic(name="ok", count=3),
                ]
            ),
            [("ok", pb.INVALID_REQUEST), ("ok", pb.INVALID_REQUEST), ("secret", DENIED)],
        ),
        # Everything refused: the refusals alone.
        (
            "DescribeConfigs",
            pb.DescribeConfigsRequest(
                resources=[pb.DescribeConfigsResource(resource_type=TOPIC, resource_name="s")]
            ),
            [("s", DENIED)],
        ),
    ],
)
def test_refusals_survive_a_malformed_allowed_part(method: str, message: Any, want: Any) -> None:
    response = call(method, message)
    got = sorted(
        (getattr(r, "resource_name", None) or getattr(r, "name", ""), r.error_code)
        for r in response.results
    )
    assert got == sorted(want)
