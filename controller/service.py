"""ControllerService over grpc.aio: a thin servicer (decode -> app/core -> encode).

I/O shell, event-loop thread only. Every command goes through `ControllerApp.submit`, which runs
it on the single command task and answers only after its records are fsynced. The heartbeat
stream is the liveness fast path (docs/design.md §3.4): when it ends for any reason other than a
granted controlled shutdown, the broker is fenced at once.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import grpc

from minibroker.client.common.security import ServerSecurity, authenticated, caller
from minibroker.client.controller_finder import EPOCH_KEY, ERROR_KEY, LEADER_KEY, NOT_CONTROLLER
from minibroker.client.errors import ClusterAuthorizationFailedError, ErrorCode, MiniBrokerError
from minibroker.controller import authz, scram_wire, wire
from minibroker.controller.core.messages import HeartbeatReply, HeartbeatRequest, Outcome
from minibroker.controller.quorum.shell import NotController, QuorumShell
from minibroker.controller.quorum.wire import QuorumWireError
from minibroker.metadata import acl_wire
from minibroker.metadata.acl import AclOperation
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from minibroker.controller.app import ControllerApp
    from minibroker.controller.core.controller import ControllerCore


def _heartbeat(
    req: HeartbeatRequest, stream_id: int, core: ControllerCore, now_ms: int
) -> Outcome[HeartbeatReply]:
    """The command for one heartbeat, with its request bound (a loop's lambda would not be)."""
    return core.heartbeat(req, stream_id, now_ms)


async def abort_not_controller(context: grpc.aio.ServicerContext, err: NotController) -> None:
    """NOT_CONTROLLER on the wire (docs/design.md §6.1): FAILED_PRECONDITION with the leader
    hint in the trailing metadata, for unary calls and streams alike."""
    hint = err.hint
    leader = f"{hint.leader_id}@{hint.address}" if hint.leader_id >= 0 and hint.address else ""
    context.set_trailing_metadata(
        (
            (ERROR_KEY, NOT_CONTROLLER),
            (LEADER_KEY, leader),
            (EPOCH_KEY, str(hint.epoch)),
        )
    )
    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))


def _fenced(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """A unary ControllerService method answered NOT_CONTROLLER off the active controller."""

    @functools.wraps(method)
    async def wrapper(
        self: ControllerServicer, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        try:
            return await method(self, request, context)
        except NotController as err:
            await abort_not_controller(context, err)

    return wrapper


async def _permission_denied(context: grpc.aio.ServicerContext, why: str) -> None:
    """A refused call whose answer has no error code (a stream's): PERMISSION_DENIED."""
    await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)


@authenticated
class ControllerServicer(pb_grpc.ControllerServiceServicer):
    """Every call is authenticated first (client/common/security.py) and authorized per
    SPEC-16b's table (controller/authz.py); a refusal uses the response's error codes and
    never reaches the core."""

    def __init__(self, app: ControllerApp, security: ServerSecurity | None = None) -> None:
        self._app = app
        self._stream_ids = itertools.count(1)
        self.security = security or ServerSecurity()
        self._access = self.security.access

    def _cluster(self, operation: AclOperation) -> str | None:
        return authz.cluster_call(self._access, caller(), operation)

    @_fenced
    async def RegisterBroker(
        self, request: pb.BrokerRegistrationRequest, context: grpc.aio.ServicerContext
    ) -> pb.BrokerRegistrationResponse:
        why = authz.broker_call(self._access, caller(), request.broker_id)
        if why is not None:
            return pb.BrokerRegistrationResponse(
                error_code=authz.CLUSTER_DENIED, error_message=why, broker_epoch=-1
            )
        req = wire.register_request(request)
        reply = await self._app.submit(lambda core, now: core.register_broker(req, now))
        return wire.register_reply(reply)

    async def Heartbeat(
        self,
        request_iterator: AsyncIterator[pb.BrokerHeartbeatRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.BrokerHeartbeatResponse]:
        stream_id = next(self._stream_ids)
        speaker: tuple[int, int] | None = None  # (broker id, epoch) this stream speaks for
        who = caller()
        try:
            async for request in request_iterator:
                why = authz.broker_call(self._access, who, request.broker_id)
                if why is not None:
                    yield pb.BrokerHeartbeatResponse(
                        error_code=authz.CLUSTER_DENIED, error_message=why
                    )
                    continue
                req = wire.heartbeat_request(request)
                reply = await self._app.submit(partial(_heartbeat, req, stream_id))
                if reply.error == ErrorCode.NONE:
                    speaker = (req.broker_id, req.broker_epoch)
                yield wire.heartbeat_reply(reply)
        except NotController as err:
            await abort_not_controller(context, err)
        finally:
            # Runs when the broker closes the stream, when its process dies (the connection
            # resets and grpc cancels this handler) and on our own shutdown (ignored there).
            if speaker is not None:
                broker_id, broker_epoch = speaker
                self._app.submit_nowait(
                    lambda core, now: core.heartbeat_stream_closed(
                        broker_id, broker_epoch, stream_id, now
                    )
                )

    async def WatchMetadata(
        self, request: pb.WatchMetadataRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.MetadataBatch]:
        # The metadata log carries broker epochs, SCRAM credentials and ACLs: nodes and
        # principals with CLUSTER_ACTION only.
        why = self._cluster(AclOperation.CLUSTER_ACTION)
        if why is not None:
            await _permission_denied(context, why)
            return
        try:
            async for batch in self._app.watch(request.from_offset):
                yield batch
        except NotController as err:
            await abort_not_controller(context, err)

    @_fenced
    async def AlterPartition(
        self, request: pb.AlterPartitionRequest, context: grpc.aio.ServicerContext
    ) -> pb.AlterPartitionResponse:
        why = authz.broker_call(self._access, caller(), request.broker_id)
        if why is not None:
            return pb.AlterPartitionResponse(error_code=authz.CLUSTER_DENIED, error_message=why)
        req = wire.alter_partition_request(request)
        reply = await self._app.submit(lambda core, now: core.alter_partition(req, now))
        return wire.alter_partition_reply(reply)

    @_fenced
    async def AllocateProducerIds(
        self, request: pb.AllocateProducerIdsRequest, context: grpc.aio.ServicerContext
    ) -> pb.AllocateProducerIdsResponse:
        why = authz.broker_call(self._access, caller(), request.broker_id)
        if why is not None:
            return pb.AllocateProducerIdsResponse(
                error_code=authz.CLUSTER_DENIED, error_message=why, producer_id_start=-1
            )
        broker_id, broker_epoch = request.broker_id, request.broker_epoch
        block = await self._app.submit(
            lambda core, now: core.allocate_producer_ids(broker_id, broker_epoch, now)
        )
        return wire.producer_ids_reply(block)

    @_fenced
    async def CreateTopics(
        self, request: pb.CreateTopicsRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateTopicsResponse:
        request, refused = authz.create_topics(self._access, caller(), request)
        topics = wire.creatable_topics(request)
        validate_only = request.validate_only
        if not topics:
            return pb.CreateTopicsResponse(topics=refused)
        results = await self._app.submit(
            lambda core, now: core.create_topics(topics, validate_only, now)
        )
        response = wire.create_topics_reply(results)
        response.topics.extend(refused)
        return response

    @_fenced
    async def DeleteTopics(
        self, request: pb.DeleteTopicsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteTopicsResponse:
        names, refused = authz.delete_topics(self._access, caller(), request)
        if not names:
            return pb.DeleteTopicsResponse(results=refused)
        results = await self._app.submit(lambda core, now: core.delete_topics(names, now))
        response = wire.delete_topics_reply(results)
        response.results.extend(refused)
        return response

    @_fenced
    async def DescribeCluster(
        self, request: pb.DescribeClusterRequest, context: grpc.aio.ServicerContext
    ) -> pb.DescribeClusterResponse:
        # Through the command queue, so the answer never shows state that is not yet durable.
        desc = await self._app.submit(lambda core, now: Outcome(core.describe_cluster(now)))
        response = wire.describe_cluster_reply(desc)
        authz.blank_cluster(self._access, caller(), response)
        return response

    @_fenced
    async def ElectLeaders(
        self, request: pb.ElectLeadersRequest, context: grpc.aio.ServicerContext
    ) -> pb.ElectLeadersResponse:
        why = self._cluster(AclOperation.ALTER)
        if why is not None:
            return pb.ElectLeadersResponse(error_code=authz.CLUSTER_DENIED, error_message=why)
        try:
            kind, partitions = wire.election(request)
        except MiniBrokerError as err:
            return wire.elect_leaders_error(request, err)
        results = await self._app.submit(
            lambda core, now: core.elect_leaders(kind, partitions, now)
        )
        return wire.elect_leaders_reply(results)

    @_fenced
    async def UnregisterBroker(
        self, request: pb.UnregisterBrokerRequest, context: grpc.aio.ServicerContext
    ) -> pb.UnregisterBrokerResponse:
        why = self._cluster(AclOperation.ALTER)
        if why is not None:
            return pb.UnregisterBrokerResponse(error_code=authz.CLUSTER_DENIED, error_message=why)
        broker_id = request.broker_id
        reply = await self._app.submit(lambda core, now: core.unregister_broker(broker_id, now))
        return wire.unregister_broker_reply(reply)

    @_fenced
    async def AlterPartitionReassignments(
        self, request: pb.AlterPartitionReassignmentsRequest, context: grpc.aio.ServicerContext
    ) -> pb.AlterPartitionReassignmentsResponse:
        why = self._cluster(AclOperation.ALTER)
        if why is not None:
            return pb.AlterPartitionReassignmentsResponse(
                error_code=authz.CLUSTER_DENIED, error_message=why
            )
        try:
            targets = wire.reassignment_targets(request)
        except MiniBrokerError as err:
            return wire.alter_reassignments_error(request, err)
        results = await self._app.submit(
            lambda core, now: core.alter_partition_reassignments(targets, now)
        )
        return wire.alter_reassignments_reply(results)

    @_fenced
    async def ListPartitionReassignments(
        self, request: pb.ListPartitionReassignmentsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListPartitionReassignmentsResponse:
        why = self._cluster(AclOperation.DESCRIBE)
        if why is not None:
            return pb.ListPartitionReassignmentsResponse(
                error_code=authz.CLUSTER_DENIED, error_message=why
            )
        try:
            partitions = wire.listed_partitions(request)
        except MiniBrokerError as err:
            return wire.list_reassignments_error(err)
        # Read-only, through the command queue like DescribeCluster: never shows state that
        # is not yet durable.
        ongoing = await self._app.submit(
            lambda core, now: Outcome(core.list_partition_reassignments(partitions))
        )
        return wire.list_reassignments_reply(ongoing)

    @_fenced
    async def CreatePartitions(
        self, request: pb.CreatePartitionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreatePartitionsResponse:
        request, refused = authz.create_partitions(self._access, caller(), request)
        if refused and not request.topics:
            return pb.CreatePartitionsResponse(results=refused)
        try:
            topics = wire.create_partitions_topics(request)
        except MiniBrokerError as err:
            response = wire.create_partitions_error(request, err)
        else:
            validate_only = request.validate_only
            results = await self._app.submit(
                lambda core, now: core.create_partitions(topics, validate_only, now)
            )
            response = wire.create_partitions_reply(results)
        response.results.extend(refused)
        return response

    @_fenced
    async def IncrementalAlterConfigs(
        self, request: pb.IncrementalAlterConfigsRequest, context: grpc.aio.ServicerContext
    ) -> pb.IncrementalAlterConfigsResponse:
        request, refused = authz.alter_configs(self._access, caller(), request)
        if refused and not request.resources:
            return pb.IncrementalAlterConfigsResponse(results=refused)
        try:
            resources = wire.alter_configs_resources(request)
        except MiniBrokerError as err:
            response = wire.alter_configs_error(request, err)
        else:
            validate_only = request.validate_only
            results = await self._app.submit(
                lambda core, now: core.incremental_alter_configs(resources, validate_only, now)
            )
            response = wire.alter_configs_reply(results)
        response.results.extend(refused)
        return response

    @_fenced
    async def DescribeConfigs(
        self, request: pb.DescribeConfigsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DescribeConfigsResponse:
        request, refused = authz.describe_configs(self._access, caller(), request)
        if refused and not request.resources:
            return pb.DescribeConfigsResponse(results=refused)
        try:
            resources = wire.describe_configs_resources(request)
        except MiniBrokerError as err:
            response = wire.describe_configs_error(request, err)
        else:
            # Read-only, through the command queue like DescribeCluster.
            results = await self._app.submit(
                lambda core, now: Outcome(core.describe_configs(resources))
            )
            response = wire.describe_configs_reply(results)
        response.results.extend(refused)
        return response

    @_fenced
    async def DecommissionBroker(
        self, request: pb.DecommissionBrokerRequest, context: grpc.aio.ServicerContext
    ) -> pb.DecommissionBrokerResponse:
        why = self._cluster(AclOperation.ALTER)
        if why is not None:
            return pb.DecommissionBrokerResponse(error_code=authz.CLUSTER_DENIED, error_message=why)
        try:
            broker_id, cancel = wire.decommission_request(request)
        except MiniBrokerError as err:
            return wire.decommission_error(err)
        reply = await self._app.submit(
            lambda core, now: core.decommission_broker(broker_id, cancel, now)
        )
        return wire.decommission_reply(reply)

    # ACLs (issue 16): Create/DeleteAcls need ALTER on the CLUSTER, DescribeAcls DESCRIBE.
    @_fenced
    async def CreateAcls(
        self, request: pb.CreateAclsRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateAclsResponse:
        why = self._cluster(AclOperation.ALTER)
        if why is not None:
            return acl_wire.create_error(request, ClusterAuthorizationFailedError(why))
        try:
            bindings = acl_wire.creations(request)
        except MiniBrokerError as err:
            return acl_wire.create_error(request, err)
        results = await self._app.submit(lambda core, now: core.create_acls(bindings, now))
        return acl_wire.create_reply((r.error, r.message) for r in results)

    # -- SCRAM credentials (issue 16): altering needs ALTER on the CLUSTER, describing DESCRIBE.

    @_fenced
    async def AlterUserScramCredentials(
        self, request: pb.AlterUserScramCredentialsRequest, context: grpc.aio.ServicerContext
    ) -> pb.AlterUserScramCredentialsResponse:
        why = self._cluster(AclOperation.ALTER)
        if why is not None:
            return scram_wire.alter_scram_error(request, ClusterAuthorizationFailedError(why))
        try:
            deletions, upsertions = scram_wire.alter_scram_request(request)
        except MiniBrokerError as err:
            return scram_wire.alter_scram_error(request, err)
        results = await self._app.submit(
            lambda core, now: core.alter_user_scram_credentials(deletions, upsertions, now)
        )
        return scram_wire.alter_scram_reply(results)

    @_fenced
    async def DescribeUserScramCredentials(
        self, request: pb.DescribeUserScramCredentialsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DescribeUserScramCredentialsResponse:
        why = self._cluster(AclOperation.DESCRIBE)
        if why is not None:
            return scram_wire.describe_scram_error(ClusterAuthorizationFailedError(why))
        try:
            users = scram_wire.describe_scram_request(request)
        except MiniBrokerError as err:
            return scram_wire.describe_scram_error(err)
        # Read-only, through the command queue like DescribeConfigs.
        results = await self._app.submit(
            lambda core, now: Outcome(core.describe_user_scram_credentials(users))
        )
        return scram_wire.describe_scram_reply(results)

    @_fenced
    async def DeleteAcls(
        self, request: pb.DeleteAclsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteAclsResponse:
        why = self._cluster(AclOperation.ALTER)
        if why is not None:
            return acl_wire.delete_error(request, ClusterAuthorizationFailedError(why))
        try:
            filters = acl_wire.delete_filters(request)
        except MiniBrokerError as err:
            return acl_wire.delete_error(request, err)
        results = await self._app.submit(lambda core, now: core.delete_acls(filters, now))
        return acl_wire.delete_reply((r.error, r.message, r.matching) for r in results)

    @_fenced
    async def DescribeAcls(
        self, request: pb.DescribeAclsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DescribeAclsResponse:
        why = self._cluster(AclOperation.DESCRIBE)
        if why is not None:
            return acl_wire.describe_error(ClusterAuthorizationFailedError(why))
        try:
            flt = acl_wire.describe_filter(request)
        except MiniBrokerError as err:
            return acl_wire.describe_error(err)
        # Read-only, through the command queue like DescribeConfigs.
        result = await self._app.submit(lambda core, now: Outcome(core.describe_acls(flt)))
        if result.error != ErrorCode.NONE:
            return acl_wire.describe_error((result.error, result.message))
        return acl_wire.describe_reply(result.bindings)


@authenticated
class QuorumServicer(pb_grpc.QuorumServiceServicer):
    """QuorumService: the voters' Raft RPCs and DescribeQuorum, handed to the quorum shell
    after the authorization check (controller/authz.py: CLUSTER_ACTION, and a controller's
    certificate speaks only for that controller) and the header check (cluster id, voter set).
    A malformed request is INVALID_REQUEST and changes nothing."""

    def __init__(self, app: ControllerApp, security: ServerSecurity | None = None) -> None:
        self._app = app
        self.security = security or ServerSecurity()
        self._access = self.security.access

    def _shell(self, context: grpc.aio.ServicerContext) -> QuorumShell:
        shell = self._app.quorum
        if shell is None or self._app.stopping:
            raise _Unavailable
        return shell

    async def _handle(
        self,
        request: Any,
        context: grpc.aio.ServicerContext,
        response_type: Any,
        handler: Callable[[QuorumShell, Any], Awaitable[Any]],
    ) -> Any:
        why = authz.quorum_call(self._access, caller(), request)
        if why is not None:
            return response_type(error_code=authz.CLUSTER_DENIED, error_message=why)
        try:
            shell = self._shell(context)
        except _Unavailable:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the controller is not serving")
        refused = shell.check_header(request.header)
        if refused is not None:
            code, message = refused
            return response_type(error_code=code, error_message=message)
        try:
            return await handler(shell, request)
        except QuorumWireError as err:
            return response_type(error_code=pb.INVALID_REQUEST, error_message=str(err))

    async def Vote(
        self, request: pb.VoteRequest, context: grpc.aio.ServicerContext
    ) -> pb.VoteResponse:
        return await self._handle(request, context, pb.VoteResponse, QuorumShell.handle_vote)

    async def BeginQuorumEpoch(
        self, request: pb.BeginQuorumEpochRequest, context: grpc.aio.ServicerContext
    ) -> pb.BeginQuorumEpochResponse:
        return await self._handle(
            request, context, pb.BeginQuorumEpochResponse, QuorumShell.handle_begin_epoch
        )

    async def EndQuorumEpoch(
        self, request: pb.EndQuorumEpochRequest, context: grpc.aio.ServicerContext
    ) -> pb.EndQuorumEpochResponse:
        return await self._handle(
            request, context, pb.EndQuorumEpochResponse, QuorumShell.handle_end_epoch
        )

    async def QuorumFetch(
        self, request: pb.QuorumFetchRequest, context: grpc.aio.ServicerContext
    ) -> pb.QuorumFetchResponse:
        return await self._handle(
            request, context, pb.QuorumFetchResponse, QuorumShell.handle_fetch
        )

    async def FetchSnapshot(
        self, request: pb.FetchSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> pb.FetchSnapshotResponse:
        return await self._handle(
            request, context, pb.FetchSnapshotResponse, QuorumShell.handle_fetch_snapshot
        )

    async def DescribeQuorum(
        self, request: pb.DescribeQuorumRequest, context: grpc.aio.ServicerContext
    ) -> pb.DescribeQuorumResponse:
        try:
            shell = self._shell(context)
        except _Unavailable:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the controller is not serving")
        response = shell.describe()
        authz.blank_quorum(self._access, caller(), response)
        return response


class _Unavailable(Exception):
    pass


__all__ = ["ControllerServicer", "QuorumServicer", "abort_not_controller"]
