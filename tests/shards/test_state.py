"""ShardState: the key index over RocksDB rows (see the worked example in state.py)."""
import random

import pytest

from proto.kv_pb2 import KeyValue
from shards.revision import row_key
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
    assert len(state.entries(b"a")) == 3
    assert state.get_row(state.entry_at(b"a", 4)) == b"v3"
    assert state.compact_slice(5, float("inf"))
    assert state.index[b"a"] == state.latest_entry(b"a")  # one entry: held as the int itself


def test_a_long_history_is_compacted_a_chunk_at_a_time(state):
    """One key's history is no longer one unit of work (a hot key written 10,000
    times between two compactions held the event loop for seconds): a slice past
    its deadline drops at most COMPACT_CHUNK rows, the oldest first, and the next
    slices carry on with the same key; reads at the compaction revision never change."""
    from shards.revision import entry
    from shards.state import COMPACT_CHUNK

    for rev in range(2, 602):  # key a: 600 versions
        state.put(b"a", rev, 0, b"v%d" % rev)
    state.put(b"b", 602, 0, b"b")
    state.delete(b"b", 603, 0, b"t")  # b: gone at the compaction revision, so wholly dropped
    before, calls = 0, 0
    while True:
        calls += 1
        done = state.compact_slice(603, 0.0)  # every slice's deadline already past
        assert state.rows_compacted - before <= COMPACT_CHUNK
        if calls == 1:
            assert not done and state.rows_compacted == COMPACT_CHUNK
            assert state.entries(b"a")[0] == entry(2 + COMPACT_CHUNK, 0, False)  # the oldest went first
        before = state.rows_compacted
        assert state.get_row(state.entry_at(b"a", 603)) == b"v601"
        assert state.entry_at(b"b", 603) is None and keys_at(state, 603) == [b"a"]
        if done:
            break
    assert state.rows_compacted == 599 + 2
    assert state.index == {b"a": entry(601, 0, False)}
    assert list(state.db.keys()) == [row_key(entry(601, 0, False))]


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


def _rows(state):
    return list(state.db.items())


@pytest.mark.parametrize("order", [[10, 11, 12, 13], [10, 12, 11, 13], [12, 10, 11, 13]])
def test_bulk_load_into_an_sst_file_and_on_in_write_batches_when_rows_do_not_ascend(tmp_path, order):
    """Bulk rows of an empty state go into an SST file that RocksDB takes whole at the end;
    a row whose key does not ascend ends the file, the rest goes in write batches: the same
    rows, index and key lists as put/delete one at a time, whatever the order."""
    from shards.record import DELETE, PUT, Change, encode_write
    from shards.state import BULK_SST

    def row(key, rev, lease=0):
        return KeyValue(key=key, mod_revision=rev, value=b"v%d" % rev, lease=lease).SerializeToString()

    def changes(rev):
        out = [Change(PUT, 0, b"k%d" % rev, row(b"k%d" % rev, rev, lease=rev)),
               Change(PUT, 1, b"shared", row(b"shared", rev))]
        if rev == 13:
            out.append(Change(DELETE, 2, b"k10", KeyValue(key=b"k10", mod_revision=13).SerializeToString()))
        return out

    plain = ShardState(tmp_path / "plain")
    for rev in order:
        for c in changes(rev):
            if c.kind == DELETE:
                plain.delete(c.key, rev, c.sub, c.row)
            else:
                plain.put(c.key, rev, c.sub, c.row)
    bulk = ShardState(tmp_path / "bulk")
    bulk.begin_bulk()
    assert bulk._sst is not None
    key_lease = {}
    for rev in order:
        assert bulk.load_write(rev, encode_write((0,), changes(rev)), key_lease) == len(changes(rev))
    assert (bulk._sst is None) == (order != sorted(order))
    bulk.end_bulk()
    assert bulk._sst is None and not (tmp_path / "bulk" / BULK_SST).exists()
    assert _rows(bulk) == _rows(plain) and len(_rows(bulk)) == 9
    assert bulk.index == plain.index
    assert key_lease == {b"k11": 11, b"k12": 12, b"k13": 13}
    assert (list(bulk.keys), list(bulk.live)) == (list(plain.keys), list(plain.live))
    assert (bulk._log_revs, bulk._log_keys) == (plain._log_revs, plain._log_keys)
    bulk.put(b"after", 20, 0, b"x")  # writes after the bulk load go on as usual
    assert bulk.get_row(bulk.latest_entry(b"after")) == b"x"
    for s in (plain, bulk):
        s.close()


def test_rows_put_one_at_a_time_while_bulk_loading_also_go_to_the_sst_file(tmp_path):
    """put/delete while bulk loading (a follower's replay): into the SST file while keys
    ascend, then into write batches."""
    from shards.state import BULK_SST

    s = ShardState(tmp_path / "s")
    s.begin_bulk()
    s.put(b"a", 2, 0, b"a2")
    s.put(b"b", 3, 0, b"b3")
    assert s._sst is not None and s._sst_rows == 2
    s.put(b"c", 1, 0, b"c1")  # does not ascend
    assert s._sst is None
    s.delete(b"a", 4, 0, b"t4")
    s.end_bulk()
    assert not (tmp_path / "s" / BULK_SST).exists()
    assert [k for k, _ in _rows(s)] == [b"\x00" * 7 + b"\x01" + b"\x00" * 8, b"\x00" * 7 + b"\x02" + b"\x00" * 8,
                                      b"\x00" * 7 + b"\x03" + b"\x00" * 8, b"\x00" * 7 + b"\x04" + b"\x00" * 8 + b"t"]
    assert list(s.live) == [b"b", b"c"]
    s.close()


def test_an_empty_bulk_load_leaves_no_file(tmp_path):
    from shards.state import BULK_SST

    s = ShardState(tmp_path / "s")
    s.begin_bulk()
    s.end_bulk()
    assert not (tmp_path / "s" / BULK_SST).exists() and _rows(s) == []
    s.put(b"a", 2, 0, b"x")
    assert _rows(s) == [(b"\x00" * 7 + b"\x02" + b"\x00" * 8, b"x")]
    s.close()


@pytest.mark.parametrize("n", [0, 1, 999, 1000, 1001, 2500, 5000])
def test_sorted_list_of_sorted_values_is_the_sorted_list(n):
    """end_bulk builds its key lists from sorted keys without sorting them again."""
    from sortedcontainers import SortedList

    from shards.state import sorted_list

    rng = random.Random(n)
    values = sorted({rng.randbytes(8) for _ in range(n)})
    assert len(values) == n
    got = sorted_list(values)
    got._check()
    assert list(got) == list(SortedList(values)) == values and len(got) == n
    want = sorted(set(values) | {b"\x00" * 9})
    got.add(b"\x00" * 9)
    if values:
        got.discard(values[n // 2])
        want.remove(values[n // 2])
    got._check()
    assert list(got) == want


def test_reads_agree_with_a_list_model_through_writes_and_compactions(state):
    """The index holds a key's one entry as an int, up to TUPLE_MAX as a tuple, more as a
    list (state.py): every read (entry_at, latest_entry, prev_entry_of_put, scan, count,
    entries) answers as a plain ascending list of entries per key would, through random
    puts, deletes and compactions (one key hot enough to outgrow its tuple), and each
    value has the form its number of entries calls for."""
    from shards.revision import entry, entry_bound, entry_main
    from shards.state import TUPLE_MAX

    rng = random.Random(11)
    keys = [bytes([97 + i]) for i in range(10)]
    model: dict[bytes, list[int]] = {}  # key -> ascending entries
    compacted = 0
    forms = {type(None)}

    def model_at(k, rev):
        older = [e for e in model.get(k, []) if e < entry_bound(rev)]
        return older[-1] if older and not older[-1] & 1 else None

    for rev in range(2, 600):
        k = b"z" if 150 <= rev < 300 else rng.choice(keys)  # a hot key: past TUPLE_MAX before a compaction
        if model.get(k) and not model[k][-1] & 1 and rng.random() < 0.35:
            state.delete(k, rev, 0, b"t")
            model[k].append(entry(rev, 0, True))
        else:
            state.put(k, rev, 0, b"v%d" % rev)
            model.setdefault(k, []).append(entry(rev, 0, False))
        if rng.random() < 0.05 and not 150 <= rev < 300:  # compact at a revision a little behind
            upto = rng.randrange(compacted, rev)
            assert state.compact_slice(upto, float("inf"))
            compacted = upto
            for key, es in list(model.items()):
                i = max((j for j, e in enumerate(es) if entry_main(e) <= upto), default=-1)
                if i < 0:
                    continue
                drop = i + 1 if es[i] & 1 else i
                if drop == len(es):
                    del model[key]
                else:
                    del es[:drop]
        for key in [*keys, b"z"]:
            value = state.index.get(key)
            n = len(model.get(key, []))
            assert type(value) is {0: type(None), 1: int}.get(n, tuple if n <= TUPLE_MAX else list), (key, n, value)
            forms.add(type(value))
            assert list(state.entries(key)) == model.get(key, [])
            latest = model_at(key, rev)
            assert state.latest_entry(key) == latest
            if latest is not None and entry_main(latest) == rev:  # the put just made: what it replaced
                before = [e for e in model[key] if entry_main(e) < rev]
                assert state.prev_entry_of_put(key, rev) == (before[-1] if before and not before[-1] & 1 else None)
        for at in range(max(compacted, 1), rev + 1, 7):
            want = [k for k in sorted(model) if model_at(k, at) is not None]
            assert keys_at(state, at) == want
            assert state.count(b"a", b"", at) == len(want)
            assert all(state.entry_at(k, at) == model_at(k, at) for k in [*keys, b"z"])
    assert forms == {type(None), int, tuple, list}  # every form was held (the hot key's list included)
