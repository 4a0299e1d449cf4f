"""`minibroker verify`'s replica comparison (deploy/verify.py): bytes for delete topics, and for
a compacted log the latest value of every key below the HW (issue 21: each replica cleans its
own log, so replicas agree on key -> latest value, not on bytes; docs/design.md)."""

from __future__ import annotations

import pathlib

from gapped_batches import cleaned_batch

from minibroker.client.log_format import LOG_SUFFIX, segment_file_name
from minibroker.deploy.verify import latest_values_digest, replica_digest, replica_latest_values

PARTITION = "changes-0"
HW = 5


def replica(root: pathlib.Path, segments: dict[int, list[bytes]]) -> str:
    folder = root / PARTITION
    folder.mkdir(parents=True)
    for base, batches in segments.items():
        (folder / segment_file_name(base, LOG_SUFFIX)).write_bytes(b"".join(batches))
    return str(root)


def test_a_cleaned_and_an_uncleaned_replica_agree_on_latest_values(tmp_path: pathlib.Path) -> None:
    uncleaned = replica(
        tmp_path / "a",
        {
            0: [
                cleaned_batch(0, [(0, b"k1", b"a"), (1, b"k2", b"b")], 1),
                cleaned_batch(2, [(2, b"k1", b"c"), (3, b"k3", b"x")], 3),
                cleaned_batch(4, [(4, b"k3", None)], 4),
                cleaned_batch(5, [(5, b"k1", b"above the HW")], 5),
            ]
        },
    )
    cleaned = replica(
        tmp_path / "b",
        {
            # k3's value and its tombstone cleaned away, the tombstone's batch too.
            0: [cleaned_batch(1, [(1, b"k2", b"b")], 1), cleaned_batch(2, [(2, b"k1", b"c")], 3)],
            5: [],  # the active segment, empty: the log reaches 5 (its last batch ends at 4)
        },
    )
    differing = replica(
        tmp_path / "c",
        {0: [cleaned_batch(1, [(1, b"k2", b"b")], 1), cleaned_batch(2, [(2, b"k1", b"z")], 4)]},
    )
    values, reached = replica_latest_values(uncleaned, PARTITION, HW)
    assert values == {b"k1": b"c", b"k2": b"b"}  # k3's tombstone: absent; 5 is above the HW
    assert reached == 6
    assert replica_latest_values(cleaned, PARTITION, HW) == (values, 5)
    a = replica_digest(uncleaned, PARTITION, HW, compacted=True)
    b = replica_digest(cleaned, PARTITION, HW, compacted=True)
    c = replica_digest(differing, PARTITION, HW, compacted=True)
    assert a == (latest_values_digest(values), 6)
    assert b[0] == a[0] and b[1] >= HW
    assert c[0] != a[0]
    # Byte-wise (a delete topic's rule) the two agreeing replicas differ.
    assert replica_digest(uncleaned, PARTITION, HW)[0] != replica_digest(cleaned, PARTITION, HW)[0]


def test_the_values_digest_does_not_depend_on_order_and_separates_fields() -> None:
    assert latest_values_digest({b"a": b"1", b"b": b"2"}) == latest_values_digest(
        {b"b": b"2", b"a": b"1"}
    )
    assert latest_values_digest({b"ab": b"c"}) != latest_values_digest({b"a": b"bc"})


def test_records_of_a_batch_the_hw_cuts_count_below_it_only(tmp_path: pathlib.Path) -> None:
    folder = replica(
        tmp_path,
        {0: [cleaned_batch(3, [(3, b"k4", b"y"), (5, b"k4", b"above the HW")], 6)]},
    )
    assert replica_latest_values(folder, PARTITION, HW) == ({b"k4": b"y"}, 7)
