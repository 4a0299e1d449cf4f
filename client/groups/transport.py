"""The group calls' I/O: FindCoordinator to any broker, then Kafka request frames to the
coordinator's gRPC address over `BrokerService.KafkaGroupCall` (kafka_call.GroupCaller).

FindCoordinator answers with the coordinator's node id and its Kafka listener address; this
client talks gRPC, so the node id is looked up in the client's metadata (refreshed once when the
broker is not known yet).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from minibroker.client.errors import CoordinatorNotAvailableError, ErrorCode, MiniBrokerError
from minibroker.client.groups import kafka_call as api
from minibroker.client.groups.coordinator import group_error
from minibroker.client.transport import ClusterClient
from minibroker.client.wire import CallFailed

GROUP_KEY_TYPE = 0


def coordinator_answer(response: Any) -> tuple[int, int, str]:
    """(error code, node id, message) of a FindCoordinator answer of any version (v4+ carry
    a `coordinators` list, one entry per key asked)."""
    entries = getattr(response, "coordinators", None)
    entry = entries[0] if entries else response
    return (
        api.code_of(entry.error_code),
        int(entry.node_id),
        getattr(entry, "error_message", None) or "",
    )


class ClusterGroupTransport:
    def __init__(self, cluster: ClusterClient, client_id: str | None = "minibroker") -> None:
        self.cluster = cluster
        self.caller = api.GroupCaller(cluster.broker_stub, client_id)

    async def send(
        self, address: str, api_key: int, values: Mapping[str, Any], timeout_s: float
    ) -> Any:
        return await self.caller.call(address, api_key, values, timeout_s)

    async def any_broker(self, api_key: int, values: Mapping[str, Any], timeout_s: float) -> Any:
        """The answer of the first broker that answers (the metadata brokers in turn)."""
        last: MiniBrokerError | None = None
        for address in self.cluster._metadata_addresses():
            try:
                return await self.send(address, api_key, values, timeout_s)
            except CallFailed as failed:
                last = failed.error
        raise CallFailed(last or CoordinatorNotAvailableError("no broker to ask"), True)

    async def find_coordinator(self, group_id: str, timeout_s: float) -> str:
        answer = await self.any_broker(
            api.FIND_COORDINATOR,
            {"key": group_id, "key_type": GROUP_KEY_TYPE, "coordinator_keys": [group_id]},
            timeout_s,
        )
        code, node_id, message = coordinator_answer(answer)
        if code != ErrorCode.NONE:
            raise group_error(code, f"FindCoordinator for group {group_id!r} {message}".strip())
        return await self.address_of(node_id)

    async def address_of(self, node_id: int) -> str:
        broker = self.cluster.metadata.brokers.get(node_id)
        if broker is None:
            try:
                await self.cluster.refresh_metadata()
            except MiniBrokerError:
                pass
            broker = self.cluster.metadata.brokers.get(node_id)
        if broker is None:
            raise CoordinatorNotAvailableError(f"coordinator broker {node_id} is not in metadata")
        return broker.address
