"""The classic group protocol's pure core (broker/groups/membership.py: ClassicGroups): Kafka's
join/sync/heartbeat/leave rules as tables, then hypothesis and a seeded simulation of many
members joining, syncing, leaving and timing out, checked against invariants."""

from __future__ import annotations

import itertools
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.broker.groups.membership import (
    ClassicGroups,
    Code,
    GroupConfig,
    JoinRequest,
    JoinResult,
    Reply,
    State,
    Store,
    SyncResult,
)
from minibroker.broker.groups.records import GroupMetadataValue, MemberMetadata

G = "g"
SESSION = 10_000
REBALANCE = 30_000


def core(**kw: Any) -> ClassicGroups:
    counter = itertools.count()
    config = GroupConfig(initial_rebalance_delay_ms=kw.pop("delay", 0), **kw)
    return ClassicGroups(config, new_id=lambda prefix: f"{prefix}-{next(counter)}")


def req(
    member_id: str = "",
    protocols: tuple[tuple[str, bytes], ...] = (("range", b"m"),),
    instance_id: str | None = None,
    session: int = SESSION,
    rebalance: int = REBALANCE,
    ptype: str = "consumer",
    v4: bool = True,
    client: str = "c",
) -> JoinRequest:
    return JoinRequest(
        group_id=G,
        member_id=member_id,
        instance_id=instance_id,
        protocol_type=ptype,
        protocols=protocols,
        session_timeout=session,
        rebalance_timeout=rebalance,
        client_id=client,
        requires_known_member_id=v4,
    )


class Driver:
    """Waiters are strings; replies collected by waiter; stores answered by the test."""

    def __init__(self, c: ClassicGroups) -> None:
        self.c = c
        self.now = 0
        self.replies: dict[Any, JoinResult | SyncResult] = {}
        self.stores: list[Store] = []
        self.stored_generations: set[int] = set()  # generations whose assignment was stored

    def collect(self) -> None:
        for e in self.c.drain():
            if isinstance(e, Reply):
                assert e.waiter not in self.replies, "a waiter answered twice"
                self.replies[e.waiter] = e.result
            else:
                self.stores.append(e)

    def join(self, r: JoinRequest, waiter: str) -> JoinResult | None:
        out = self.c.join(r, self.now, waiter)
        self.collect()
        return out

    def new_member(self, waiter: str, **kw: Any) -> str:
        """KIP-394: the first join gets MEMBER_ID_REQUIRED and the id; the second waits."""
        first = self.join(req(**kw), waiter + "-0")
        assert first is not None and first.error == Code.MEMBER_ID_REQUIRED
        assert self.join(req(member_id=first.member_id, **kw), waiter) is None
        return first.member_id

    def sync(self, member_id: str, gen: int, waiter: str, assign: dict[str, bytes] | None = None):
        out = self.c.sync(G, member_id, gen, None, "consumer", None, assign or {}, self.now, waiter)
        self.collect()
        return out

    def advance(self, ms: int) -> None:
        self.now += ms
        self.c.tick(self.now)
        self.collect()

    def store_ok(self, error: int = Code.NONE) -> Store:
        s = self.stores.pop(0)
        if error == Code.NONE and s.value.members:
            self.stored_generations.add(s.value.generation)
        self.c.stored(s.token, error, self.now)
        self.collect()
        return s

    def state(self) -> str:
        st_ = self.c.state(G)
        assert st_ is not None
        return st_[0]


def stable_group(n: int) -> tuple[Driver, list[str], int]:
    """n members joined and synced; (driver, member ids, generation)."""
    d = Driver(core())
    ids = [d.new_member(f"j{i}") for i in range(n)]
    assert d.state() == "PreparingRebalance"
    d.advance(0)  # the initial delayed join (delay 0)
    gen = d.c.groups[G].generation
    leader = d.c.groups[G].leader_id
    assert leader is not None
    for i, m in enumerate(ids):
        if m != leader:
            assert d.sync(m, gen, f"s{i}") is None
    assert d.sync(leader, gen, "sL", {m: m.encode() for m in ids}) is None
    d.store_ok()
    assert d.state() == "Stable"
    return d, ids, gen


# -- JoinGroup ------------------------------------------------------------------------------


def test_kip394_member_id_required_then_join_with_the_given_id() -> None:
    d = Driver(core())
    first = d.join(req(), "w0")
    assert first is not None and first.error == Code.MEMBER_ID_REQUIRED and first.member_id
    assert d.c.groups[G].pending_join
    assert d.join(req(member_id=first.member_id), "w1") is None
    d.advance(0)
    res = d.replies["w1"]
    assert isinstance(res, JoinResult)
    assert res.error == Code.NONE and res.generation == 1 and res.leader == first.member_id
    assert [m.member_id for m in res.members] == [first.member_id]
    assert res.protocol_name == "range" and d.state() == "CompletingRebalance"


def test_join_v3_gets_an_id_at_once() -> None:
    d = Driver(core())
    assert d.join(req(v4=False), "w") is None
    d.advance(0)
    res = d.replies["w"]
    assert isinstance(res, JoinResult) and res.error == Code.NONE and res.member_id


def test_unknown_member_id_on_a_missing_group() -> None:
    d = Driver(core())
    res = d.join(req(member_id="nobody"), "w")
    assert res is not None and res.error == Code.UNKNOWN_MEMBER_ID
    assert d.c.state(G) is None


def test_session_timeout_bounds() -> None:
    d = Driver(core())
    for s in (5999, 1800001):
        res = d.join(req(session=s), "w")
        assert res is not None and res.error == Code.INVALID_SESSION_TIMEOUT
    res = d.join(req(session=6000), "w")
    assert res is not None and res.error == Code.MEMBER_ID_REQUIRED


def test_empty_group_id_is_invalid() -> None:
    d = Driver(core())
    r = JoinRequest("", "", None, "consumer", (("range", b""),), SESSION, REBALANCE)
    res = d.c.join(r, 0, "w")
    assert res is not None and res.error == Code.INVALID_GROUP_ID


def test_inconsistent_protocol_type_and_no_common_protocol() -> None:
    d, _ids, _ = stable_group(1)
    res = d.join(req(ptype="connect"), "w")
    assert res is not None and res.error == Code.INCONSISTENT_GROUP_PROTOCOL
    res = d.join(req(protocols=(("roundrobin", b""),)), "w2")
    assert res is not None and res.error == Code.INCONSISTENT_GROUP_PROTOCOL
    res = d.join(req(protocols=(("roundrobin", b""), ("range", b""))), "w3")
    assert res is not None and res.error == Code.MEMBER_ID_REQUIRED
    d.join(req(member_id=res.member_id, protocols=(("roundrobin", b""), ("range", b""))), "w4")
    # roundrobin is supported by one of the two members only
    res = d.join(req(protocols=(("roundrobin", b""),)), "w5")
    assert res is not None and res.error == Code.INCONSISTENT_GROUP_PROTOCOL
    # a brand-new group needs a protocol type and at least one protocol
    d2 = Driver(core())
    res = d2.join(req(protocols=()), "w")
    assert res is not None and res.error == Code.INCONSISTENT_GROUP_PROTOCOL
    res = d2.join(req(ptype=""), "w")
    assert res is not None and res.error == Code.INCONSISTENT_GROUP_PROTOCOL
    assert d2.c.state(G) is None  # the refused join leaves no group behind


def test_protocol_selection_by_votes_among_protocols_all_support() -> None:
    d = Driver(core())
    a = d.new_member("a", protocols=(("roundrobin", b"A1"), ("range", b"A2")))
    b = d.new_member("b", protocols=(("sticky", b""), ("range", b"B2"), ("roundrobin", b"B1")))
    c = d.new_member("c", protocols=(("range", b"C2"), ("roundrobin", b"C1")))
    d.advance(0)
    res = d.replies["a"]
    assert isinstance(res, JoinResult)
    assert res.protocol_name == "range"  # 2 votes to 1; sticky is not supported by all
    assert res.leader == a
    assert {m.member_id: m.metadata for m in res.members} == {a: b"A2", b: b"B2", c: b"C2"}
    for w in ("b", "c"):
        r = d.replies[w]
        assert isinstance(r, JoinResult) and r.members == () and r.leader == a


def test_group_max_size() -> None:
    d = Driver(core(max_size=2))
    ids = [d.new_member(f"j{i}") for i in range(2)]
    d.advance(0)
    assert d.state() == "CompletingRebalance"
    res = d.join(req(), "w")
    assert res is not None and res.error == Code.GROUP_MAX_SIZE_REACHED
    assert len(d.c.groups[G].members) == 2 and ids


def test_initial_delay_extends_on_new_joins_up_to_rebalance_timeout() -> None:
    d = Driver(core(delay=3000))
    d.new_member("a", rebalance=10_000)
    d.advance(2999)
    assert d.state() == "PreparingRebalance"
    d.new_member("b", rebalance=10_000)
    d.advance(1)  # the first delay ends; a new member came: wait again
    assert d.state() == "PreparingRebalance" and "a" not in d.replies
    d.advance(2999)
    assert d.state() == "PreparingRebalance"
    d.advance(1)
    assert d.state() == "CompletingRebalance"
    assert d.now == 6000


def test_initial_delay_never_exceeds_the_rebalance_timeout() -> None:
    d = Driver(core(delay=3000))
    d.new_member("m0", rebalance=7000)
    for i in range(1, 20):
        if d.state() != "PreparingRebalance":
            break
        d.new_member(f"m{i}", rebalance=7000)
        d.advance(1000)
    assert d.state() == "CompletingRebalance"
    assert d.now <= 7000 + 3000


def test_rejoin_completes_when_all_known_members_rejoined() -> None:
    d, ids, gen = stable_group(3)
    leader = d.c.groups[G].leader_id
    follower = next(m for m in ids if m != leader)
    # a follower with new metadata triggers a rebalance
    assert d.join(req(member_id=follower, protocols=(("range", b"new"),)), "r0") is None
    assert d.state() == "PreparingRebalance"
    others = [m for m in ids if m != follower]
    assert d.join(req(member_id=others[0]), "r1") is None
    assert d.state() == "PreparingRebalance"
    assert d.join(req(member_id=others[1]), "r2") is None
    assert d.state() == "CompletingRebalance"
    for w in ("r0", "r1", "r2"):
        r = d.replies[w]
        assert isinstance(r, JoinResult) and r.generation == gen + 1


def test_members_not_rejoined_by_the_rebalance_timeout_are_removed() -> None:
    d, ids, gen = stable_group(3)
    for m in ids[:2]:
        d.join(req(member_id=m, protocols=(("range", b"x"),)), "r" + m)
    for _ in range(REBALANCE // 5000 - 1):  # heartbeats keep the third alive, never rejoining
        d.advance(5000)
        hb = d.c.heartbeat(G, ids[2], gen, None, d.now)
        assert hb == Code.REBALANCE_IN_PROGRESS
    assert d.state() == "PreparingRebalance"
    d.advance(5000)
    assert d.state() == "CompletingRebalance"
    assert set(d.c.groups[G].members) == set(ids[:2])
    assert d.c.groups[G].generation == gen + 1


def test_leader_that_does_not_rejoin_is_replaced_by_a_joined_member() -> None:
    d, ids, gen = stable_group(2)
    leader = d.c.groups[G].leader_id
    follower = next(m for m in ids if m != leader)
    d.join(req(member_id=follower, protocols=(("range", b"x"),)), "rf")
    for _ in range(REBALANCE // 5000):  # the leader heartbeats but does not rejoin
        assert d.c.heartbeat(G, leader, gen, None, d.now) == Code.REBALANCE_IN_PROGRESS
        d.advance(5000)
    res = d.replies["rf"]
    assert isinstance(res, JoinResult) and res.leader == follower and res.members
    assert d.c.groups[G].leader_id == follower


def test_stable_follower_with_same_metadata_gets_current_generation() -> None:
    d, ids, gen = stable_group(2)
    leader = d.c.groups[G].leader_id
    follower = next(m for m in ids if m != leader)
    res = d.join(req(member_id=follower), "r")
    assert res is not None and res.error == Code.NONE and res.generation == gen
    assert d.state() == "Stable"
    # the leader's rejoin forces a rebalance
    assert d.join(req(member_id=leader), "rl") is None
    assert d.state() == "PreparingRebalance"


# -- SyncGroup ------------------------------------------------------------------------------


def test_sync_waits_for_the_leader_and_the_store() -> None:
    d = Driver(core())
    a = d.new_member("a")
    b = d.new_member("b")
    d.advance(0)
    assert d.sync(b, 1, "sb") is None
    assert d.sync(a, 1, "sa", {a: b"A", b: b"B"}) is None
    assert "sa" not in d.replies and "sb" not in d.replies  # the store is not done yet
    store = d.stores[0]
    assert store.value.generation == 1 and store.value.leader == a
    assert {m.member_id: m.assignment for m in store.value.members} == {a: b"A", b: b"B"}
    d.store_ok()
    ra, rb = d.replies["sa"], d.replies["sb"]
    assert isinstance(ra, SyncResult) and isinstance(rb, SyncResult)
    assert (ra.error, ra.assignment, rb.assignment) == (Code.NONE, b"A", b"B")
    assert ra.protocol_name == "range" and ra.protocol_type == "consumer"
    assert d.state() == "Stable"
    # a late follower sync in Stable gets its assignment at once
    res = d.sync(b, 1, "again")
    assert isinstance(res, SyncResult) and res.assignment == b"B"


def test_a_resent_sync_answers_the_replaced_one_rebalance_in_progress() -> None:
    d = Driver(core())
    a = d.new_member("a")
    b = d.new_member("b")
    d.advance(0)
    assert d.sync(b, 1, "sb1") is None
    assert d.sync(b, 1, "sb2") is None  # resent: the first is answered, the second waits
    assert d.replies["sb1"] == SyncResult(Code.REBALANCE_IN_PROGRESS)
    assert d.sync(a, 1, "sa", {a: b"A", b: b"B"}) is None
    d.store_ok()
    rb = d.replies["sb2"]
    assert isinstance(rb, SyncResult) and (rb.error, rb.assignment) == (Code.NONE, b"B")


def test_a_failed_store_answers_its_error_and_rebalances() -> None:
    d = Driver(core())
    a = d.new_member("a")
    b = d.new_member("b")
    d.advance(0)
    d.sync(b, 1, "sb")
    d.sync(a, 1, "sa", {a: b"A", b: b"B"})
    d.store_ok(Code.NOT_COORDINATOR)
    for w in ("sa", "sb"):
        r = d.replies[w]
        assert isinstance(r, SyncResult) and r.error == Code.NOT_COORDINATOR
        assert r.assignment == b""
    assert d.state() == "PreparingRebalance"


def test_sync_errors() -> None:
    d = Driver(core())
    a = d.new_member("a")
    d.advance(0)
    assert d.sync("nobody", 1, "w") == SyncResult(Code.UNKNOWN_MEMBER_ID)
    assert d.sync(a, 2, "w") == SyncResult(Code.ILLEGAL_GENERATION)
    res = d.c.sync(G, a, 1, None, "connect", None, {}, 0, "w")
    assert res == SyncResult(Code.INCONSISTENT_GROUP_PROTOCOL)
    res = d.c.sync(G, a, 1, None, "consumer", "roundrobin", {}, 0, "w")
    assert res == SyncResult(Code.INCONSISTENT_GROUP_PROTOCOL)
    b = d.new_member("b")  # CompletingRebalance -> PreparingRebalance
    assert d.sync(a, 1, "w") == SyncResult(Code.REBALANCE_IN_PROGRESS) and b


def test_a_rebalance_during_completing_answers_waiting_syncs() -> None:
    d = Driver(core())
    a = d.new_member("a")
    b = d.new_member("b")
    d.advance(0)
    d.sync(b, 1, "sb")
    d.new_member("c")
    r = d.replies["sb"]
    assert isinstance(r, SyncResult) and r.error == Code.REBALANCE_IN_PROGRESS and a


def test_members_that_never_sync_are_removed_after_the_rebalance_timeout() -> None:
    d = Driver(core())
    a = d.new_member("a")
    b = d.new_member("b")
    d.advance(0)
    d.sync(a, 1, "sa", {a: b"A", b: b"B"})
    d.store_ok()
    assert d.state() == "Stable"
    for _ in range(REBALANCE // 5000):
        d.advance(5000)
        d.c.heartbeat(G, a, 1, None, d.now)
        d.c.heartbeat(G, b, 1, None, d.now)
    assert b not in d.c.groups[G].members
    assert d.state() in ("PreparingRebalance", "CompletingRebalance")


# -- Heartbeat ------------------------------------------------------------------------------


def test_heartbeat_codes() -> None:
    d, ids, gen = stable_group(2)
    hb = d.c.heartbeat
    assert hb(G, ids[0], gen, None, d.now) == Code.NONE
    assert hb(G, "nobody", gen, None, d.now) == Code.UNKNOWN_MEMBER_ID
    assert hb("other", ids[0], gen, None, d.now) == Code.UNKNOWN_MEMBER_ID
    assert hb(G, ids[0], gen + 1, None, d.now) == Code.ILLEGAL_GENERATION
    d.join(req(member_id=ids[1], protocols=(("range", b"z"),)), "r")
    assert hb(G, ids[0], gen, None, d.now) == Code.REBALANCE_IN_PROGRESS


def test_session_timeout_removes_a_member_and_rebalances() -> None:
    d, ids, gen = stable_group(2)
    d.advance(SESSION - 1)
    assert d.c.heartbeat(G, ids[0], gen, None, d.now) == Code.NONE
    d.advance(1)
    assert ids[1] not in d.c.groups[G].members and ids[0] in d.c.groups[G].members
    assert d.state() == "PreparingRebalance"
    assert d.join(req(member_id=ids[0]), "r") is None
    r = d.replies["r"]
    assert isinstance(r, JoinResult) and r.generation == gen + 1 and r.leader == ids[0]


def test_pending_member_expires_after_the_session_timeout() -> None:
    d = Driver(core())
    first = d.join(req(), "w")
    assert first is not None
    d.advance(SESSION)
    assert not d.c.groups[G].pending_join
    res = d.join(req(member_id=first.member_id), "w2")
    assert res is not None and res.error == Code.UNKNOWN_MEMBER_ID


# -- LeaveGroup, Empty ----------------------------------------------------------------------


def test_leave_batch_and_the_last_leave_persists_an_empty_group() -> None:
    d, ids, gen = stable_group(2)
    top, codes = d.c.leave(G, [(ids[0], None), ("nobody", None)], d.now)
    d.collect()
    assert top == Code.NONE and codes == [Code.NONE, Code.UNKNOWN_MEMBER_ID]
    assert d.state() == "PreparingRebalance"
    _, codes = d.c.leave(G, [(ids[1], None)], d.now)
    d.collect()
    assert codes == [Code.NONE] and d.state() == "Empty"
    s = d.stores[-1]
    assert s.value.members == () and s.value.generation == gen + 1 and s.value.protocol is None
    assert d.c.deletable(G) == Code.NONE


def test_describe_and_deletable() -> None:
    d, ids, _gen = stable_group(2)
    desc = d.c.describe(G)
    assert desc.state == "Stable" and desc.protocol == "range" and len(desc.members) == 2
    assert {m.assignment for m in desc.members} == {i.encode() for i in ids}
    assert d.c.deletable(G) == Code.NON_EMPTY_GROUP
    assert d.c.describe("none").state == "Dead"


# -- static membership ----------------------------------------------------------------------


def test_static_member_rejoin_fences_the_old_id_without_rebalance() -> None:
    d = Driver(core())
    assert d.join(req(instance_id="i1"), "w") is None  # static members skip MEMBER_ID_REQUIRED
    d.advance(0)
    r = d.replies["w"]
    assert isinstance(r, JoinResult)
    old = r.member_id
    d.sync(old, 1, "s", {old: b"A"})
    d.store_ok()
    assert d.join(req(instance_id="i1"), "w2") is None
    assert d.state() == "Stable"
    d.store_ok()
    r2 = d.replies["w2"]
    assert isinstance(r2, JoinResult) and r2.error == Code.NONE and r2.member_id != old
    assert r2.generation == 1 and r2.skip_assignment  # it is the leader
    assert d.c.heartbeat(G, old, 1, "i1", d.now) == Code.FENCED_INSTANCE_ID
    assert d.c.heartbeat(G, r2.member_id, 1, "i1", d.now) == Code.NONE
    assert d.c.heartbeat(G, r2.member_id, 1, "i2", d.now) == Code.UNKNOWN_MEMBER_ID
    res = d.sync(r2.member_id, 1, "s2")
    assert isinstance(res, SyncResult) and res.assignment == b"A"


# -- load / unload / commits ----------------------------------------------------------------


def loaded_value(members: int) -> GroupMetadataValue:
    return GroupMetadataValue(
        protocol_type="consumer",
        generation=5,
        protocol="range",
        leader="m0" if members else None,
        current_state_timestamp=1,
        members=tuple(
            MemberMetadata(f"m{i}", None, "c", "h", REBALANCE, SESSION, b"sub", b"asg")
            for i in range(members)
        ),
    )


def test_loaded_groups_and_validate_commit() -> None:
    c = core()
    c.loaded(G, loaded_value(2), 0)
    assert c.state(G) == ("Stable", "consumer")
    assert c.validate_commit(G, "m0", 5, None) == Code.NONE
    assert c.validate_commit(G, "m0", 4, None) == Code.ILLEGAL_GENERATION
    assert c.validate_commit(G, "zz", 5, None) == Code.UNKNOWN_MEMBER_ID
    assert c.validate_commit(G, "", -1, None) == Code.UNKNOWN_MEMBER_ID
    assert c.heartbeat(G, "m1", 5, None, 0) == Code.NONE
    c.loaded("e", loaded_value(0), 0)
    assert c.state("e") == ("Empty", "consumer")
    assert c.validate_commit("e", "", -1, None) == Code.NONE
    assert c.validate_commit("e", "someone", -1, None) == Code.NONE
    assert c.validate_commit("e", "someone", 0, None) == Code.UNKNOWN_MEMBER_ID
    assert c.validate_commit("unknown", "", -1, None) == Code.NONE
    assert c.validate_commit("unknown", "x", 3, None) == Code.ILLEGAL_GENERATION
    c.unloaded([G, "e"])
    assert c.state(G) is None and list(c.groups) == []


def test_commit_during_completing_rebalance() -> None:
    d = Driver(core())
    a = d.new_member("a")
    d.advance(0)
    assert d.c.validate_commit(G, a, 1, None) == Code.REBALANCE_IN_PROGRESS


def test_loaded_members_expire_without_heartbeats() -> None:
    d = Driver(core())
    d.c.loaded(G, loaded_value(2), 0)
    d.advance(SESSION)
    assert d.state() == "Empty"
    assert d.stores and d.stores[-1].value.members == ()


def test_unload_answers_waiters_not_coordinator() -> None:
    d = Driver(core())
    d.new_member("a", rebalance=REBALANCE)
    d.c.unloaded([G])
    d.collect()
    r = d.replies["a"]
    assert isinstance(r, JoinResult) and r.error == Code.NOT_COORDINATOR


def test_delete_answers_every_waiter_coordinator_not_available() -> None:
    d = Driver(core())
    d.new_member("a")
    b = d.new_member("b")
    d.advance(0)
    assert d.sync(b, 1, "sb") is None  # the follower waits for the leader
    d.c.delete(G)
    d.collect()
    assert d.replies["sb"] == SyncResult(Code.COORDINATOR_NOT_AVAILABLE)
    d2 = Driver(core(delay=3000))
    d2.new_member("x")  # waits for the initial delay
    d2.c.delete(G)
    d2.collect()
    r = d2.replies["x"]
    assert isinstance(r, JoinResult) and r.error == Code.COORDINATOR_NOT_AVAILABLE


def test_unload_answers_a_waiting_sync_not_coordinator() -> None:
    d = Driver(core())
    d.new_member("a")
    b = d.new_member("b")
    d.advance(0)
    assert d.sync(b, 1, "sb") is None
    d.c.unloaded([G])
    d.collect()
    assert d.replies["sb"] == SyncResult(Code.NOT_COORDINATOR)


# -- invariants: hypothesis and a seeded simulation -----------------------------------------


class Sim:
    """Members as small clients: join (with KIP-394), sync (the leader assigns each partition
    to one member), heartbeat, leave, or go silent; the store answers (sometimes failing)."""

    PARTITIONS = 6

    def __init__(self, rng: random.Random, n: int) -> None:
        self.d = Driver(core(delay=rng.choice([0, 100, 3000])))
        self.rng = rng
        self.n = n
        self.ids: dict[int, str] = {}  # client -> member id
        self.gen: dict[int, int] = {}
        self.waiting: dict[int, str] = {}  # client -> waiter
        self.waiter_n = itertools.count()
        self.alive = set(range(n))
        self.last_gen = 0
        self.owner_by_gen: dict[int, dict[int, str]] = {}

    def step(self) -> None:
        d, rng = self.d, self.rng
        client = rng.randrange(self.n)
        action = rng.random()
        if client not in self.alive:
            if action < 0.1:
                self.alive.add(client)
                self.ids.pop(client, None)
            self.advance()
            return
        if action < 0.05:  # silent death
            self.alive.discard(client)
            self.waiting.pop(client, None)
        elif action < 0.1 and client in self.ids:
            d.c.leave(G, [(self.ids.pop(client), None)], d.now)
            d.collect()
            self.waiting.pop(client, None)
        elif client in self.waiting:
            self.poll(client)
        elif client not in self.ids or action < 0.15:
            w = f"j{next(self.waiter_n)}"
            r = d.join(req(member_id=self.ids.get(client, "")), w)
            if r is None:
                self.waiting[client] = w
            elif r.error == Code.MEMBER_ID_REQUIRED:
                self.ids[client] = r.member_id
            else:
                self.ids.pop(client, None)
        else:
            code = d.c.heartbeat(G, self.ids[client], self.gen.get(client, -1), None, d.now)
            if code in (Code.REBALANCE_IN_PROGRESS, Code.ILLEGAL_GENERATION):
                w = f"j{next(self.waiter_n)}"
                if d.join(req(member_id=self.ids[client]), w) is None:
                    self.waiting[client] = w
            elif code == Code.UNKNOWN_MEMBER_ID:
                self.ids.pop(client)
        if d.stores and rng.random() < 0.7:
            d.store_ok(Code.NONE if rng.random() < 0.9 else Code.NOT_COORDINATOR)
        self.advance()

    def poll(self, client: int) -> None:
        d = self.d
        w = self.waiting[client]
        r = d.replies.pop(w, None)
        if r is None:
            return
        del self.waiting[client]
        if isinstance(r, JoinResult):
            if r.error != Code.NONE:
                self.ids.pop(client, None)
                return
            self.gen[client] = r.generation
            assign: dict[str, bytes] = {}
            if r.members:
                names = [m.member_id for m in r.members]
                for p in range(self.PARTITIONS):
                    owner = names[p % len(names)]
                    assign[owner] = assign.get(owner, b"") + bytes([p])
            sw = f"s{next(self.waiter_n)}"
            out = d.sync(r.member_id, r.generation, sw, assign)
            if out is None:
                self.waiting[client] = sw
        elif r.error != Code.NONE:
            self.gen.pop(client, None)

    def advance(self) -> None:
        self.d.advance(self.rng.choice([0, 1, 50, 500, 3000]))
        self.check()

    def check(self) -> None:
        c = self.d.c
        group = c.groups.get(G)
        if group is None:
            return
        # at most one leader, and the leader is a member
        if group.members:
            assert group.leader_id in group.members
        else:
            assert group.leader_id is None
        assert group.generation >= self.last_gen
        self.last_gen = group.generation
        assert set(group.static_members.values()) <= set(group.members)
        if group.state is State.STABLE:
            assert group.generation in self.d.stored_generations, "Stable before the store"
            # Stable only after a leader's sync was stored: the stored assignment is the
            # members' own, each partition owned by exactly one member
            owners: dict[int, str] = {}
            for m in group.members.values():
                for p in m.assignment:
                    assert p not in owners, "a partition owned twice"
                    owners[p] = m.member_id
            prev = self.owner_by_gen.setdefault(group.generation, owners)
            assert prev == owners, "one generation, two assignments"
        if group.state is State.EMPTY:
            assert not group.members and group.protocol_name is None
        if group.state in (State.COMPLETING_REBALANCE, State.STABLE):
            assert group.protocol_name is not None
            for m in group.members.values():
                assert any(n == group.protocol_name for n, _ in m.protocols)


def run_sim(seed: int, steps: int, n: int) -> Sim:
    sim = Sim(random.Random(seed), n)
    for _ in range(steps):
        sim.step()
    return sim


def test_seeded_simulation_keeps_the_invariants() -> None:
    stable_seen = 0
    for seed in range(40):
        sim = run_sim(seed, 400, 5)
        group = sim.d.c.groups.get(G)
        stable_seen += group is not None and group.state is State.STABLE
        assert sim.last_gen > 0
    assert stable_seen > 0


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=2**32), st.integers(min_value=1, max_value=8))
def test_hypothesis_simulation_keeps_the_invariants(seed: int, n: int) -> None:
    run_sim(seed, 150, n)


def test_generation_bumps_once_per_completed_join() -> None:
    d, ids, gen = stable_group(3)
    for round_ in range(3):
        for i, m in enumerate(ids):
            d.join(req(member_id=m, protocols=(("range", bytes([round_])),)), f"r{round_}{i}")
        assert d.c.groups[G].generation == gen + round_ + 1
        assert d.state() == "CompletingRebalance"


def test_a_static_leader_that_does_not_rejoin_stays_but_loses_the_lead() -> None:
    d = Driver(core())
    d.join(req(instance_id="i1"), "a")
    d.join(req(instance_id="i2"), "b")
    d.advance(0)
    ra, rb = d.replies["a"], d.replies["b"]
    assert isinstance(ra, JoinResult) and isinstance(rb, JoinResult)
    assert ra.leader == ra.member_id
    d.sync(ra.member_id, 1, "sa", {ra.member_id: b"A", rb.member_id: b"B"})
    d.store_ok()
    assert (
        d.join(req(member_id=rb.member_id, instance_id="i2", protocols=(("range", b"n"),)), "b2")
        is None
    )
    for _ in range(REBALANCE // 5000):
        d.c.heartbeat(G, ra.member_id, 1, "i1", d.now)
        d.advance(5000)
    r = d.replies["b2"]
    assert isinstance(r, JoinResult) and r.error == Code.NONE and r.generation == 2
    assert r.leader == rb.member_id and len(r.members) == 2  # the static one is kept


def test_stale_deadlines_do_not_pile_up() -> None:
    """Each heartbeat moves a member's deadline; the old heap entries are dropped, the heap
    stays bounded by the live deadlines (the timer heap's lazy deletion)."""
    d, members, generation = stable_group(3)
    for _ in range(20_000):
        d.now += 1
        for m in members:
            assert d.c.heartbeat(G, m, generation, None, d.now) == Code.NONE
    assert len(d.c._deadlines) <= 2 * 1024 + 1


def test_strings_the_group_record_cannot_hold_are_refused_at_join() -> None:
    long = "x" * 32768
    for kw in (
        {"instance_id": long},
        {"member_id": long},
        {"ptype": long},
        {"protocols": ((long, b""),)},
        {"client": long},
    ):
        d = Driver(core())
        r = d.join(req(**kw), "w")  # type: ignore[arg-type]
        assert r is not None and r.error == Code.INVALID_REQUEST, kw
        assert G not in d.c.groups
    d = Driver(core())
    r = d.c.join(
        JoinRequest("é" * 16384, "", None, "consumer", (("range", b""),), SESSION, REBALANCE),
        0,
        "w",
    )
    assert r is not None and r.error == Code.INVALID_REQUEST  # 32768 UTF-8 bytes
    ok = "é" * 16383  # 32766 bytes: fits
    r = d.c.join(JoinRequest(ok, "", None, "consumer", (("range", b""),), SESSION, 1), 0, "w")
    assert r is not None and r.error == Code.MEMBER_ID_REQUIRED


def test_a_member_id_keeps_a_capped_prefix_of_a_long_client_or_instance_id() -> None:
    d = Driver(core())
    first = d.join(req(client="é" * 16000), "w")
    assert first is not None and first.error == Code.MEMBER_ID_REQUIRED
    assert len(first.member_id.encode()) <= 300 and first.member_id.startswith("é")
    d = Driver(core())
    assert d.join(req(instance_id="i" * 32767), "s") is None
    (member,) = d.c.groups[G].members.values()
    assert len(member.member_id.encode()) <= 32767
