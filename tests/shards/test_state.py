"""ShardState: the key index over RocksDB rows (see the worked example in state.py)."""
import random

import pytest

from shards.state import ShardState


@pytest.fixture
def state(tmp_path):
    s = ShardState(tmp_path / "state")
    yield s
    s.close()


def keys_at(state, rev, lo=b"", hi=b""):
    return [k for k, _ in state.scan(lo, hi, rev)]


def test_worked_example(state):
    # key a: put@2, put@3, delete@5, put@7
    state.put(b"a", 2, 0, b"v2")
    state.put(b"a", 3, 0, b"v3")
    state.delete(b"a", 5, 0, b"t5")
    state.put(b"a", 7, 0, b"v7")
    assert state.entry_at(b"a", 1) is None
    assert state.get_row(state.entry_at(b"a", 4)) == b"v3"
    assert state.entry_at(b"a", 5) is None and state.entry_at(b"a", 6) is None
    assert state.get_row(state.latest_entry(b"a")) == b"v7"
    assert state.compact_slice(4, float("inf"))
    assert len(state.index[b"a"]) == 3
    assert state.get_row(state.entry_at(b"a", 4)) == b"v3"
    assert state.compact_slice(5, float("inf"))
    assert len(state.index[b"a"]) == 1


def test_count_matches_scan_at_every_revision(state):
    """count() uses the live list + change log; it must equal a full scan."""
    rng = random.Random(7)
    keys = [bytes([97 + i]) for i in range(12)]
    live = set()
    for rev in range(2, 300):
        k = rng.choice(keys)
        if k in live and rng.random() < 0.4:
            state.delete(k, rev, 0, b"t")
            live.discard(k)
        else:
            state.put(k, rev, 0, b"v%d" % rev)
            live.add(k)
    for rev in range(1, 300):
        for lo, hi in [(b"a", b"f"), (b"c", b""), (b"a", b"b"), (b"\x00", b""), (b"f", b"a")]:
            assert state.count(lo, hi, rev) == len(keys_at(state, rev, lo, hi)), (rev, lo, hi)


def test_compaction_removes_fully_deleted_keys(state):
    state.put(b"k", 2, 0, b"v")
    state.delete(b"k", 3, 0, b"t")
    assert state.compact_slice(3, float("inf"))
    assert b"k" not in state.index and b"k" not in state.keys
    assert list(state.db.keys()) == []


def test_snapshot_rows_stop_at_revision(state):
    state.put(b"a", 2, 0, b"x")
    state.put(b"b", 3, 0, b"y")
    rows = list(state.snapshot_rows(2))
    state.put(b"c", 4, 0, b"z")
    assert len(rows) == 1
