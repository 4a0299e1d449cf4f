"""QuorumCore: one voter's KIP-595 Raft rules, sans-I/O (docs/design.md §6.1).

Pure: no sockets, asyncio, clock, disk or randomness of its own. Time comes in as `now_ms`,
randomness as a `random.Random`, the log as a read-only `RaftLogView`; decisions go out as a list
of effects (`messages.py`) that the shell applies in order. The shell (or the simulation) calls
one method at a time.

API (every method returns the effects to apply, in order; request handlers also return the
answer to send back, which the shell sends only after applying the effects):

    QuorumCore(settings, state, log, rng, now_ms)           state: the loaded quorum-state
    tick(now_ms) -> list[Effect]                            timers: election, fetch, check-quorum
    handle_vote(req, now_ms) -> (VoteResponse, effects)
    handle_vote_response(resp, now_ms) -> effects
    handle_begin_epoch(req, now_ms) -> (EpochReply, effects)
    handle_end_epoch(req, now_ms) -> (EpochReply, effects)
    handle_fetch(req, now_ms) -> (FetchDecision, effects)   leader side
    handle_fetch_response(resp, now_ms) -> (FetchResponseDecision, effects)   follower side
    follower_appended(leader_high_watermark, now_ms) -> effects
    leader_appended(now_ms) -> effects                      the leader's log end moved (durable)
    snapshot_loaded(now_ms) -> effects                      follower installed the leader's snapshot
    truncated(now_ms) -> effects                            follower truncated as told
    shutdown(now_ms) -> effects                             graceful stop: EndQuorumEpoch
    properties: role, epoch, leader_id, voted_for, high_watermark, state (QuorumState),
                is_leader, fetch_target (leader id to fetch from, or None), progress() -> list
"""
