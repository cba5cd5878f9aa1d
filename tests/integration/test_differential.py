"""Differential test: the same seeded stream of KV requests goes, in the same
order, to a real etcd 3.5.1 and to shardetcd; every answer must be the same.

Compared: the whole response message, field by field, with header.cluster_id,
header.member_id and header.raft_term cleared (also in the headers nested in
txn responses) — the revision is compared; errors as (status code, details).
Sorting by a non-key target can tie; the order of ties is compared too (etcd's
unstable sort.Sort, reproduced by shards/gosort.py).

Failures name the seed and op index; re-run one with
``pytest tests/integration/test_differential.py -k 'seeded and 3'``.
"""

from __future__ import annotations


import pytest

from proto import rpc_pb2 as pb
from tests.integration.diffkit import (
    BAD_KINDS,
    Client,
    Generator,
    describe,
    normalise,
    run_differential,
    same,
)

pytestmark = pytest.mark.timeout(240)

MAIN_SEED = 20250611
MAIN_OPS = 10_000


def test_differential_10k(real_etcd, shardetcd):
    gen = Generator(MAIN_SEED)
    run_differential(real_etcd.endpoint, shardetcd.endpoint, MAIN_SEED, MAIN_OPS, gen=gen)
    # The run must have covered every op kind and every listed bad input.
    for kind in ("range", "put", "delete", "txn", "compact", "bad"):
        assert gen.seen.get(kind, 0) > 0, f"generator produced no {kind!r} requests: {gen.seen}"
    missing = [k for k in BAD_KINDS if gen.seen.get("bad:" + k, 0) == 0]
    assert not missing, f"bad inputs never generated: {missing}"
    assert shardetcd.running() and real_etcd.running()


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_differential_seeded(real_etcd, shardetcd, seed):
    run_differential(real_etcd.endpoint, shardetcd.endpoint, seed, 800)
    assert shardetcd.running() and real_etcd.running()


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_differential_across_restarts(real_etcd, shardetcd, how):
    """The stream goes on after shardetcd restarts on its data dir (gracefully or
    after SIGKILL): recovered revisions, history and compaction point must match."""
    seed = 77 if how == "sigterm" else 78
    gen = Generator(seed)
    gen.weights.update(compact=6)
    for _ in range(3):
        run_differential(real_etcd.endpoint, shardetcd.endpoint, seed, 700, gen=gen)
        if how == "sigkill":
            shardetcd.kill()
            shardetcd.start()
        else:
            shardetcd.restart()
    run_differential(real_etcd.endpoint, shardetcd.endpoint, seed, 300, gen=gen)


# Minimal sequences distilled from differential failures; each is replayed on
# fresh servers and every answer compared (regressions stay caught even if the
# random stream changes).
def _txn(success=(), failure=(), compare=()):
    return pb.TxnRequest(compare=list(compare), success=list(success), failure=list(failure))


def _op(req):
    field = {
        pb.RangeRequest: "request_range",
        pb.PutRequest: "request_put",
        pb.DeleteRangeRequest: "request_delete_range",
        pb.TxnRequest: "request_txn",
    }[type(req)]
    return pb.RequestOp(**{field: req})


def _many(prefix: bytes, n: int, shards: tuple[bytes, ...] = (b"/registry/pods/", b"/registry/configmaps/")) -> list:
    """Txns putting ``n`` keys under ``prefix`` on each of ``shards``, 100 puts a txn."""
    keys = [shard + prefix + b"%05d" % i for i in range(n) for shard in shards]
    return [_txn(success=[_op(pb.PutRequest(key=k, value=b"v" * (len(k) % 7) + k)) for k in keys[i:i + 100]])
            for i in range(0, len(keys), 100)]


# answers of more than wire.PART_ROWS (1,024) rows are encoded a part at a time
_LARGE = [b"/registry/", b"/registry0"]

SEQUENCES = {
    # a txn answering ranges of more rows than one part holds (read-only, so run beside writes;
    # then in a write, nested, and a delete's previous rows), and a DeleteRange with prev_kv
    "large_answers_in_parts": [
        *_many(b"a/", 1300),
        _txn(success=[_op(pb.RangeRequest(key=_LARGE[0], range_end=_LARGE[1]))]),
        _txn(compare=[pb.Compare(key=_LARGE[0], range_end=_LARGE[1], target=pb.Compare.VERSION, result=pb.Compare.EQUAL,
                                 version=1)],
             success=[_op(pb.RangeRequest(key=_LARGE[0], range_end=_LARGE[1], limit=2000)),
                      _op(pb.RangeRequest(key=b"/registry/pods/", range_end=b"/registry/pods0", keys_only=True))],
             failure=[_op(pb.RangeRequest(key=b"/registry/pods/a/00001"))]),
        _txn(success=[_op(pb.PutRequest(key=b"/registry/pods/a/00001", value=b"w")),
                      _op(_txn(success=[_op(pb.RangeRequest(key=_LARGE[0], range_end=_LARGE[1], count_only=False))])),
                      _op(pb.DeleteRangeRequest(key=b"/registry/configmaps/", range_end=b"/registry/configmaps0",
                                                prev_kv=True))]),
        pb.DeleteRangeRequest(key=b"/registry/pods/", range_end=b"/registry/pods0", prev_kv=True),
        pb.RangeRequest(key=b"\x00", range_end=b"\x00", count_only=True),
    ],
    # count_only over a range whose end sorts before its key: etcd counts 0
    "count_only_inverted_range": [
        pb.PutRequest(key=b"a", value=b"1"),
        pb.PutRequest(key=b"c", value=b"1"),
        pb.RangeRequest(key=b"b", range_end=b"a", count_only=True),
        pb.RangeRequest(key=b"z", range_end=b"a", count_only=True),
        pb.RangeRequest(key=b"/registry/pods/x", range_end=b"/registry/leases/", count_only=True),
    ],
    # a write txn: etcd checks every put (lease, ignore_*) before any range revision
    "txn_put_checks_before_range_checks": [
        pb.PutRequest(key=b"a", value=b"1"),
        pb.PutRequest(key=b"a", value=b"2"),
        pb.CompactionRequest(revision=2),
        _txn(success=[_op(pb.RangeRequest(key=b"a", revision=1)), _op(pb.PutRequest(key=b"missing", ignore_value=True))]),
        _txn(success=[_op(pb.RangeRequest(key=b"a", revision=99)), _op(pb.PutRequest(key=b"b", value=b"x", lease=5))]),
    ],
    # a range at an explicit old revision inside a write txn: its count must not
    # include the txn's own writes (kvs are right; count is not)
    "txn_historical_range_count": [
        pb.PutRequest(key=b"a", value=b"1"),
        pb.PutRequest(key=b"b", value=b"1"),
        _txn(success=[
            _op(pb.DeleteRangeRequest(key=b"a")),
            _op(pb.RangeRequest(key=b"a", range_end=b"c", revision=3, limit=1)),
            _op(pb.RangeRequest(key=b"a", range_end=b"c", revision=3, count_only=True)),
        ]),
        pb.PutRequest(key=b"a", value=b"1"),
        _txn(success=[
            _op(pb.PutRequest(key=b"a0", value=b"x")),
            _op(pb.RangeRequest(key=b"a", range_end=b"c", revision=5, limit=1)),
            _op(pb.RangeRequest(key=b"a", range_end=b"c", revision=5, count_only=True)),
        ]),
    ],
    # header revisions inside nested txns, ranges at old revisions, compaction edges
    "nested_txn_and_compaction": [
        pb.PutRequest(key=b"/registry/pods/default/a", value=b"1"),
        pb.PutRequest(key=b"/registry/leases/x", value=b"1"),
        _txn(
            compare=[pb.Compare(key=b"/registry/", range_end=b"/registry0", target=pb.Compare.VERSION, result=pb.Compare.GREATER, version=0)],
            success=[
                _op(_txn(success=[_op(pb.PutRequest(key=b"/registry/events/e", value=b"2"))],
                         failure=[_op(pb.RangeRequest(key=b"/registry/", range_end=b"/registry0"))])),
                _op(pb.RangeRequest(key=b"/registry/", range_end=b"/registry0", revision=2)),
            ],
        ),
        pb.CompactionRequest(revision=3),
        pb.CompactionRequest(revision=3),
        pb.CompactionRequest(revision=99),
        pb.RangeRequest(key=b"/registry/", range_end=b"/registry0", revision=2),
        pb.RangeRequest(key=b"/registry/", range_end=b"/registry0", revision=3),
        pb.CompactionRequest(revision=4, physical=True),
        pb.RangeRequest(key=b"\x00", range_end=b"\x00"),
    ],
}


@pytest.mark.parametrize("name", sorted(SEQUENCES))
def test_differential_sequence(real_etcd, shardetcd, name):
    ref, sut = Client(real_etcd.endpoint), Client(shardetcd.endpoint)
    try:
        for i, req in enumerate(SEQUENCES[name]):
            want, got = normalise(req, ref.call(req)), normalise(req, sut.call(req))
            assert same(want, got), (
                f"{name} op #{i}: shardetcd differs from etcd\nrequest: {describe(req)}\n"
                f"etcd:      {want}\nshardetcd: {got}"
            )
    finally:
        ref.close()
        sut.close()
