"""A Hypothesis state machine: a real shardetcd process, over gRPC, against the
pure model of etcd's KV in ``tests/kv_model.py``, checked after every step.

Rules: Put, DeleteRange (one key, prefix, range, everything; prev_kv), Txn
(VALUE/VERSION/CREATE/MOD compares with every result, put/delete/range ops in
both branches, on keys of five shards, including the requests etcd rejects as
duplicate keys), kube-apiserver's mod_revision-guarded update across shards,
"delete from a key on and put some back" in one txn, Range at the latest and
at past revisions (limit, sort, keys_only, count_only, revision filters),
Compact (physical or not), watch replay from a past revision (and from below
the compacted one), and, a few times per example, a graceful restart and a
kill -9, each followed by a read of the whole key space at every live
revision.  Every response (header revisions included, nested ones too) must
be the model's; reads below the compacted revision and above the head must
fail as etcd's do.

One server serves every example.  An example begins by deleting every key and
compacting at the head, and its model begins there, knowing nothing before.
The server runs with tiny journal segments and checkpoints, so restarts
replay from checkpoints, rolled-over segments and journal tails.

``SHARDETCD_LONG_TESTS=1`` runs ten times as many examples with twice the
steps (several minutes).
"""
from __future__ import annotations

import os

import grpc
import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from proto import kv_pb2, rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.kv_model import (
    CREATE,
    DELETE,
    EQUAL,
    GREATER,
    KEY,
    KV,
    LESS,
    MOD,
    NOT_EQUAL,
    PUT,
    VALUE,
    VERSION,
    Cmp,
    Compacted,
    DeleteOp,
    DeleteResult,
    DuplicateKey,
    Event,
    FutureRevision,
    KVModel,
    ModelError,
    PutOp,
    PutResult,
    RangeOp,
    RangeResult,
    TxnOp,
    TxnResult,
    sort_field,
)
from tests.shardetcd_fixture import ShardetcdProcess, start_shardetcd
from tests.watch_client import WatchClient

LONG = os.environ.get("SHARDETCD_LONG_TESTS", "") not in ("", "0")
EXAMPLES = 25 * (10 if LONG else 1)
STEPS = 50 * (2 if LONG else 1)
RESTARTS_PER_EXAMPLE = 3 if LONG else 2  # each costs ~0.4 s: most of the run time
RPC_TIMEOUT_S = 10
WATCH_TIMEOUT_S = 3  # a replay of a few dozen events takes milliseconds
# segments roll over and shards checkpoint every few dozen writes
SMALL_JOURNAL = ("--journal-segment-bytes", "2048", "--checkpoint-journal-bytes", "4096")

KEYS = [
    b"/registry/pods/a",  # pods shard
    b"/registry/pods/b",
    b"/registry/leases/l",  # leases shard
    b"/registry/events/e",  # events shard
    b"/registry/minions/n",  # nodes shard
    b"/registry/pods",  # default shard, sorts just before the pods shard's keys
    b"/registry/configmaps/c",  # default shard
    b"k",  # default shard, outside /registry/
]
ALL = (b"\x00", b"\x00")
keys = st.sampled_from(KEYS)
values = st.one_of(st.sampled_from([b"", b"v", b"w"]), st.binary(max_size=3))
key_ranges = st.one_of(
    st.tuples(keys, st.just(b"")),  # one key
    st.tuples(keys, st.just(b"\x00")),  # from a key on
    st.sampled_from([ALL, (b"/registry/pods/", b"/registry/pods0"), (b"/registry/", b"/registry0")]),
    st.tuples(keys, keys),  # [a, b), empty when b <= a
)

STATUS = {
    Compacted: grpc.StatusCode.OUT_OF_RANGE,
    FutureRevision: grpc.StatusCode.OUT_OF_RANGE,
    DuplicateKey: grpc.StatusCode.INVALID_ARGUMENT,
}


# -- model ops <-> protobuf ---------------------------------------------


def range_pb(op: RangeOp) -> pb.RangeRequest:
    return pb.RangeRequest(**op.__dict__)  # the same field names


def put_pb(op: PutOp) -> pb.PutRequest:
    return pb.PutRequest(key=op.key, value=op.value, prev_kv=op.prev_kv)


def delete_pb(op: DeleteOp) -> pb.DeleteRangeRequest:
    return pb.DeleteRangeRequest(key=op.key, range_end=op.range_end, prev_kv=op.prev_kv)


_CMP_FIELD = {VERSION: "version", CREATE: "create_revision", MOD: "mod_revision", VALUE: "value"}


def txn_pb(op: TxnOp) -> pb.TxnRequest:
    def request_op(o):
        if isinstance(o, PutOp):
            return pb.RequestOp(request_put=put_pb(o))
        if isinstance(o, DeleteOp):
            return pb.RequestOp(request_delete_range=delete_pb(o))
        return pb.RequestOp(request_range=range_pb(o))

    compares = [pb.Compare(key=c.key, range_end=c.range_end, target=c.target, result=c.result,
                           **{_CMP_FIELD[c.target]: c.operand}) for c in op.compare]
    return pb.TxnRequest(compare=compares, success=[request_op(o) for o in op.success],
                         failure=[request_op(o) for o in op.failure])


def kv_of(m: kv_pb2.KeyValue) -> KV:
    assert m.lease == 0, m
    return KV(m.key, m.value, m.create_revision, m.mod_revision, m.version)


def range_result(r: pb.RangeResponse) -> RangeResult:
    return RangeResult(r.header.revision, tuple(kv_of(kv) for kv in r.kvs), r.more, r.count)


def put_result(r: pb.PutResponse) -> PutResult:
    return PutResult(r.header.revision, kv_of(r.prev_kv) if r.HasField("prev_kv") else None)


def delete_result(r: pb.DeleteRangeResponse) -> DeleteResult:
    return DeleteResult(r.header.revision, r.deleted, tuple(kv_of(kv) for kv in r.prev_kvs))


def txn_result(r: pb.TxnResponse) -> TxnResult:
    def op_result(o: pb.ResponseOp):
        which = o.WhichOneof("response")
        if which == "response_range":
            return range_result(o.response_range)
        if which == "response_put":
            return put_result(o.response_put)
        assert which == "response_delete_range", o
        return delete_result(o.response_delete_range)

    return TxnResult(r.header.revision, r.succeeded, tuple(op_result(o) for o in r.responses))


def event_of(e) -> Event:
    return Event(e.type, kv_of(e.kv), kv_of(e.prev_kv) if e.HasField("prev_kv") else None)


# -- comparing ----------------------------------------------------------


def assert_range(got: RangeResult, want: RangeResult, op: RangeOp) -> None:
    """Equal, except that etcd's order among equal sort targets is unspecified
    (Go's unstable sort.Sort), and so is which of them a limit keeps."""
    if op.sort_target == KEY or op.count_only:
        assert got == want
        return
    assert (got.revision, got.more, got.count, len(got.kvs)) == (want.revision, want.more, want.count, len(want.kvs))
    shown = {kv.key: (KV(kv.key, b"", *_revs(kv)) if op.keys_only else kv) for kv in want.pool}
    target = {kv.key: getattr(kv, sort_field(op.sort_target)) for kv in want.pool}
    assert len({kv.key for kv in got.kvs}) == len(got.kvs), got
    assert all(shown.get(kv.key) == kv for kv in got.kvs), (got, want)
    assert [target[kv.key] for kv in got.kvs] == [target[kv.key] for kv in want.kvs], (got, want)


def _revs(kv: KV) -> tuple[int, int, int]:
    return kv.create_revision, kv.mod_revision, kv.version


def assert_txn(got: TxnResult, want: TxnResult, op: TxnOp) -> None:
    assert (got.revision, got.succeeded, len(got.responses)) == (want.revision, want.succeeded, len(want.responses))
    for g, w, o in zip(got.responses, want.responses, op.success if want.succeeded else op.failure):
        if isinstance(o, RangeOp):
            assert_range(g, w, o)
        else:
            assert g == w


def _is_progress(r: pb.WatchResponse) -> bool:
    return r.watch_id == -1 and not (r.created or r.canceled or r.events)


# -- the machine --------------------------------------------------------


class GrpcModel(RuleBasedStateMachine):
    def __init__(self, server: ShardetcdProcess) -> None:
        super().__init__()
        self.server = server
        if not server.running():  # an earlier example failed between a stop and a start
            server.start()
        self._connect()
        self.restarts = 0
        # Always wiped, even on a fresh server: an example must draw the same
        # way when Hypothesis replays it, whatever ran before.
        self.model = self._wipe()
        self.compaction_ran = True  # the last compaction has physically run (see KVModel.events)

    def _connect(self) -> None:
        self.channel = grpc.insecure_channel(self.server.endpoint)
        self.kv = pbg.KVStub(self.channel)

    def _wipe(self) -> KVModel:
        """Delete every key and compact at the head (a put first, so there is
        always a new revision to compact at); the model begins there."""
        self.kv.Put(pb.PutRequest(key=KEYS[0], value=b"wipe"), timeout=RPC_TIMEOUT_S)
        rev = self.kv.DeleteRange(pb.DeleteRangeRequest(key=ALL[0], range_end=ALL[1]), timeout=RPC_TIMEOUT_S).header.revision
        self.kv.Compact(pb.CompactionRequest(revision=rev, physical=True), timeout=RPC_TIMEOUT_S)
        return KVModel(rev, compacted=rev)

    def teardown(self) -> None:
        self.channel.close()

    # -- calling both ----------------------------------------------------

    def _both(self, method: str, request, model_call, convert):
        """Call the model and the server; an expected error must be etcd's
        exact status; otherwise return (server's result, model's result)."""
        try:
            want = model_call()
        except ModelError as exc:
            want = exc
        try:
            got = convert(getattr(self.kv, method)(request, timeout=RPC_TIMEOUT_S))
        except grpc.RpcError as exc:
            got = (exc.code(), exc.details())
        if isinstance(want, ModelError):
            event(f"{method}: {type(want).__name__}")
            assert got == (STATUS[type(want)], want.message)
            return None, None
        assert not isinstance(got, tuple), f"server said {got}, the model {want}"
        return got, want

    # -- draws that depend on the model -----------------------------------

    def _revision(self, data) -> int:
        """A read revision: latest, live past, compacted, future or negative.

        Drawn as offsets from the model's bounds, so an example replays the
        same way on a server whose revisions started elsewhere."""
        m = self.model
        kind = data.draw(st.sampled_from(["now", "now", "past", "past", "compacted", "future", "negative"]))
        if kind == "now":
            return 0
        if kind == "past":
            lo = max(m.compacted, m.first)
            return lo + data.draw(st.integers(0, m.rev - lo))
        if kind == "compacted":
            return max(1, m.compacted - 1 - data.draw(st.integers(0, 2)))
        if kind == "future":
            return m.rev + 1 + data.draw(st.integers(0, 1))
        return -1 - data.draw(st.integers(0, 2))

    def _filter_revision(self, data) -> int:
        if data.draw(st.integers(0, 4)):
            return 0
        return self.model.first + data.draw(st.integers(0, self.model.rev - self.model.first))

    def _range_op(self, data) -> RangeOp:
        key, end = data.draw(key_ranges)
        return RangeOp(
            key, end,
            limit=data.draw(st.sampled_from([0, 0, 1, 2, 3, -1])),
            revision=self._revision(data),
            sort_order=data.draw(st.sampled_from([0, 0, 1, 2])),
            sort_target=data.draw(st.sampled_from([0, 0, 1, 2, 3, 4])),
            keys_only=data.draw(st.booleans()),
            count_only=not data.draw(st.integers(0, 5)),
            min_mod_revision=self._filter_revision(data),
            max_mod_revision=self._filter_revision(data),
            min_create_revision=self._filter_revision(data),
            max_create_revision=self._filter_revision(data),
        )

    def _compare(self, data) -> Cmp:
        """Operands near the key's real fields, so compares go both ways."""
        key = data.draw(keys)
        end = data.draw(st.sampled_from([b"", b"", b"", b"\x00", b"/registry0"]))
        target = data.draw(st.sampled_from([VERSION, CREATE, MOD, VALUE]))
        result = data.draw(st.sampled_from([EQUAL, NOT_EQUAL, GREATER, LESS]))
        now = self.model.state().get(key) or KV(key)
        if target == VALUE:
            operand = data.draw(st.one_of(st.just(now.value), values))
        else:
            n = getattr(now, _CMP_FIELD[target])
            operand = data.draw(st.sampled_from([n, n, n - 1, n + 1, 0]))
        return Cmp(key, target, result, operand, end)

    def _txn_op(self, data):
        kind = data.draw(st.sampled_from(["put", "put", "delete", "range"]))
        if kind == "put":
            return PutOp(data.draw(keys), data.draw(values), data.draw(st.booleans()))
        if kind == "delete":
            key, end = data.draw(key_ranges)
            return DeleteOp(key, end, data.draw(st.booleans()))
        return self._range_op(data)

    # -- rules -----------------------------------------------------------

    @rule(key=keys, value=values, prev_kv=st.booleans())
    def put(self, key, value, prev_kv):
        op = PutOp(key, value, prev_kv)
        got, want = self._both("Put", put_pb(op), lambda: self.model.put(op), put_result)
        assert got == want

    @rule(key_range=key_ranges, prev_kv=st.booleans())
    def delete(self, key_range, prev_kv):
        op = DeleteOp(*key_range, prev_kv)
        got, want = self._both("DeleteRange", delete_pb(op), lambda: self.model.delete(op), delete_result)
        assert got == want

    @rule(data=st.data())
    def txn(self, data):
        op = TxnOp(
            tuple(self._compare(data) for _ in range(data.draw(st.integers(0, 2)))),
            tuple(self._txn_op(data) for _ in range(data.draw(st.integers(0, 3)))),
            tuple(self._txn_op(data) for _ in range(data.draw(st.integers(0, 3)))),
        )
        before = self.model.rev
        got, want = self._both("Txn", txn_pb(op), lambda: self.model.txn(op), txn_result)
        if want is not None:
            event(f"Txn: {'succeeded' if want.succeeded else 'failed'}, {'wrote' if self.model.rev > before else 'read only'}")
            assert_txn(got, want, op)

    @rule(keys_=st.lists(keys, min_size=2, max_size=3, unique=True), value=values, stale=st.booleans())
    def update(self, keys_, value, stale):
        """kube-apiserver's update, across shards: if the first key's
        mod_revision is what we read, write all the keys; else read it back."""
        now = self.model.state().get(keys_[0])
        mod = (now.mod_revision if now else 0) - (1 if stale else 0)
        op = TxnOp((Cmp(keys_[0], MOD, EQUAL, mod),),
                   tuple(PutOp(k, value, prev_kv=True) for k in keys_),
                   (RangeOp(keys_[0]),))
        got, want = self._both("Txn", txn_pb(op), lambda: self.model.txn(op), txn_result)
        assert_txn(got, want, op)

    @rule(start=keys, keys_=st.lists(keys, min_size=1, max_size=3, unique=True), value=values, prev_kv=st.booleans())
    def replace_from(self, start, keys_, value, prev_kv):
        """Delete every key from ``start`` on and put some back, in one txn:
        etcd allows it (a delete range ending in "\\0" is checked for
        duplicates literally), so a key is deleted and recreated in one
        revision, on several shards."""
        op = TxnOp(success=(DeleteOp(start, b"\x00", prev_kv), *(PutOp(k, value, prev_kv) for k in keys_)))
        got, want = self._both("Txn", txn_pb(op), lambda: self.model.txn(op), txn_result)
        assert_txn(got, want, op)

    @rule(data=st.data())
    def read(self, data):
        op = self._range_op(data)
        got, want = self._both("Range", range_pb(op), lambda: self.model.range(op), range_result)
        if want is not None:
            assert_range(got, want, op)

    @rule(data=st.data(), physical=st.booleans())
    def compact(self, data, physical):
        m = self.model
        kind = data.draw(st.sampled_from(["forward", "forward", "forward", "compacted", "future"]))
        if kind == "forward" and m.rev > m.compacted:
            rev = m.compacted + 1 + data.draw(st.integers(0, m.rev - m.compacted - 1))
        elif kind == "compacted":
            rev = m.compacted - data.draw(st.integers(0, 1))
        else:
            rev = m.rev + 1
        self._compact(rev, physical)

    def _compact(self, rev: int, physical: bool) -> None:
        got, want = self._both("Compact", pb.CompactionRequest(revision=rev, physical=physical),
                               lambda: self.model.compact(rev), lambda r: r.header.revision)
        if got is not None:
            assert got == self.model.rev
            self.compaction_ran = physical

    @precondition(lambda self: self.restarts < RESTARTS_PER_EXAMPLE)
    @rule()
    def restart(self):
        """Graceful stop (SIGTERM), start on the same data dir."""
        self.restarts += 1
        self.channel.close()
        self.server.restart()
        self._connect()
        self.compaction_ran = True  # recovery finishes compacting before serving
        self._check_everything()

    @precondition(lambda self: self.restarts < RESTARTS_PER_EXAMPLE)
    @rule()
    def crash(self):
        """kill -9, start on the same data dir: every acknowledged write and
        compaction is there (the server's default --journal-fsync always)."""
        self.restarts += 1
        self.channel.close()
        self.server.kill()
        self.server.start()
        self._connect()
        self.compaction_ran = True  # recovery finishes compacting before serving
        self._check_everything()

    def _check_everything(self) -> None:
        """The whole key space at every live revision, and the compaction."""
        m = self.model
        for rev in [0, *range(max(m.compacted, m.first), m.rev + 1)]:
            op = RangeOp(*ALL, revision=rev)
            got, want = self._both("Range", range_pb(op), lambda: m.range(op), range_result)
            assert got == want, f"at revision {rev}"
        if m.compacted > 1:  # reading below it still fails
            op = RangeOp(*ALL, revision=m.compacted - 1)
            self._both("Range", range_pb(op), lambda: m.range(op), range_result)
        self._compact(m.compacted, physical=False)  # compacting there again still fails

    def _watchable_from(self) -> int:
        """The lowest start revision a watch may replay from deterministically:
        the compacted revision's deletes go only when compaction has run."""
        m = self.model
        return max(m.compacted + (0 if self.compaction_ran else 1), m.watchable_from)

    @precondition(lambda self: self.model.rev >= self._watchable_from())
    @rule(data=st.data(), key_range=key_ranges, prev_kv=st.booleans())
    def watch(self, data, key_range, prev_kv):
        """Replay from a past revision: exactly the model's events, in order.

        The replay is over when the stream answers a progress request sent
        after the create: the server answers one only once every watcher on
        the stream has caught up, so every replayed event comes before it."""
        m = self.model
        lo = self._watchable_from()
        start = lo + data.draw(st.integers(0, m.rev - lo))
        responses = self._watch(key_range, start, prev_kv)
        key, end = key_range
        if end not in (b"", b"\x00") and key >= end:  # etcd's watchStream.Watch refuses it
            assert [(r.created, r.canceled, r.cancel_reason, len(r.events)) for r in responses] == [
                (True, True, "mvcc: watcher range is empty", 0)]
            return
        assert responses[0].created and not any(r.canceled for r in responses), responses
        assert responses[-1].header.revision == m.rev
        got = [event_of(e) for r in responses for e in r.events]
        assert got == m.events(start, *key_range, prev_kv=prev_kv)

    @precondition(lambda self: self.model.compacted > 1)
    @rule(data=st.data())
    def watch_compacted(self, data):
        """A watch from below the compacted revision is cancelled, naming it."""
        start = max(1, self.model.compacted - 1 - data.draw(st.integers(0, 2)))
        responses = self._watch(ALL, start, False)
        assert not any(r.events for r in responses), responses
        assert [r.compact_revision for r in responses if r.canceled] == [self.model.compacted]

    def _watch(self, key_range, start: int, prev_kv: bool) -> list[pb.WatchResponse]:
        """Responses up to the progress response (or a cancellation)."""
        w = WatchClient(self.channel)
        try:
            w.create(*key_range, start_revision=start, prev_kv=prev_kv)
            w.progress()
            responses = w.wait_for(lambda rs: any(r.canceled or _is_progress(r) for r in rs), timeout=WATCH_TIMEOUT_S)
        finally:
            w.close()
        end = next(i for i, r in enumerate(responses) if r.canceled or _is_progress(r))
        return responses[: end + 1]  # a progress response may follow a cancellation

    @invariant()
    def head(self):
        r = self.kv.Range(pb.RangeRequest(key=ALL[0], range_end=ALL[1], count_only=True), timeout=RPC_TIMEOUT_S)
        assert (r.header.revision, r.count) == (self.model.rev, len(self.model.state()))


# large_base_example: the long variant's 100-step runs trip it; long runs are the point.
# No shrinking: replaying examples with restarts ran past the test's timeout, which then
# hid the failure; an example is printed as found (its draws replay it).
SETTINGS = settings(max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None,
                    phases=[Phase.explicit, Phase.reuse, Phase.generate],
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example])


@pytest.mark.timeout(3000 if LONG else 300)
def test_server_matches_model_across_restarts(tmp_path):
    proc = start_shardetcd(tmp_path, extra_args=SMALL_JOURNAL)
    try:
        run_state_machine_as_test(lambda: GrpcModel(proc), settings=SETTINGS)
    finally:
        proc.stop()


def test_prev_kv_of_a_key_recreated_in_its_deleting_txn(shardetcd):
    """etcd 3.5.1 (checked against the real binary): no prev_kv on a creation
    event, also when the txn that creates the key deleted it first.  Found by
    the state machine above; it once added the key as it was before the txn."""
    with grpc.insecure_channel(shardetcd.endpoint) as channel:
        kv = pbg.KVStub(channel)
        kv.Put(pb.PutRequest(key=b"k", value=b"1"), timeout=RPC_TIMEOUT_S)  # revision 2
        delete_all_then_put = pb.TxnRequest(success=[
            pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=b"\x00", range_end=b"\x00")),
            pb.RequestOp(request_put=pb.PutRequest(key=b"k", value=b"2")),
        ])
        assert kv.Txn(delete_all_then_put, timeout=RPC_TIMEOUT_S).header.revision == 3
        w = WatchClient(channel)
        try:
            w.create(b"k", start_revision=3, prev_kv=True)
            w.wait_for(lambda rs: sum(len(r.events) for r in rs) >= 2, timeout=WATCH_TIMEOUT_S)
            deleted, created = w.events()
        finally:
            w.close()
    assert (deleted.type, deleted.prev_kv.value) == (DELETE, b"1")
    assert (created.type, created.kv.create_revision, created.kv.version) == (PUT, 3, 1)
    assert not created.HasField("prev_kv"), created.prev_kv
