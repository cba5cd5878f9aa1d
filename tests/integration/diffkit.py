"""Differential testing kit: a seeded generator of etcd KV requests, a way to
send one request to a server and capture (response | error), and a
normalisation that makes a real etcd's answer comparable with shardetcd's.

Used by test_differential.py and test_errors.py.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import grpc
from google.protobuf import text_format

from proto import rpc_pb2 as pb, rpc_pb2_grpc

# -- key pool ------------------------------------------------------------------
# Spread over every shard of the default layout (leases, events, pods, nodes =
# /registry/minions/, default) and then some: binary keys, keys that sort around
# the shard boundaries, a resource with a group (apps/deployments).

KEYS: list[bytes] = [
    b"/registry/pods/default/a",
    b"/registry/pods/default/b",
    b"/registry/pods/kube-system/c",
    b"/registry/leases/kube-node-lease/n1",
    b"/registry/leases/x",
    b"/registry/events/default/e1",
    b"/registry/events/default/e2",
    b"/registry/minions/node1",
    b"/registry/minions/node2",
    b"/registry/configmaps/default/cm1",
    b"/registry/apps/deployments/default/d1",
    b"/registry/pods",  # no trailing slash: default shard, sorts just before the pods shard
    b"/registry/",
    b"a",
    b"b",
    b"foo",
    b"foo/bar",
    b"\x00" * 8,  # as etcd's benchmark tool writes
    b"\x00",
    b"\xff",
    b"\xff\xff",
    b"zz",
]

PREFIXES: list[bytes] = [
    b"/registry/",
    b"/registry/pods/",
    b"/registry/pods/default/",
    b"/registry/leases/",
    b"/registry/events/",
    b"/registry/minions/",
    b"/registry/configmaps/",
    b"/registry/apps/",
    b"/registry/p",
    b"foo",
    b"\x00",
    b"\xff",
    b"a",
]

VALUES: list[bytes] = [b"", b"v1", b"v2", b"v3", b"\x00\xff", b"x" * 100]

MAX_TXN_OPS = 128
MAX_REQUEST_BYTES = 1536 * 1024


def prefix_end(prefix: bytes) -> bytes:
    b = bytearray(prefix)
    while b and b[-1] == 0xFF:
        b.pop()
    if not b:
        return b"\x00"  # etcd's "whole keyspace" for an all-0xff prefix
    b[-1] += 1
    return bytes(b)


# -- sending --------------------------------------------------------------------


@dataclass
class Outcome:
    """A response message, or an error as (status code, details string)."""

    response: object | None = None
    error: tuple[grpc.StatusCode, str] | None = None

    def __str__(self) -> str:
        if self.error is not None:
            return f"ERROR {self.error[0].name}: {self.error[1]!r}"
        return f"{type(self.response).__name__} {{\n{text_format.MessageToString(self.response)}}}"


METHODS = {
    pb.RangeRequest: "Range",
    pb.PutRequest: "Put",
    pb.DeleteRangeRequest: "DeleteRange",
    pb.TxnRequest: "Txn",
    pb.CompactionRequest: "Compact",
}


class Client:
    """Sync KV stub on one endpoint."""

    def __init__(self, endpoint: str, timeout: float = 30.0) -> None:
        self.channel = grpc.insecure_channel(
            endpoint,
            options=[
                ("grpc.max_send_message_length", 64 * 1024 * 1024),
                ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ],
        )
        self.kv = rpc_pb2_grpc.KVStub(self.channel)
        self.timeout = timeout

    def call(self, req) -> Outcome:
        method = getattr(self.kv, METHODS[type(req)])
        try:
            return Outcome(response=method(req, timeout=self.timeout))
        except grpc.RpcError as exc:
            return Outcome(error=(exc.code(), exc.details()))

    def close(self) -> None:
        self.channel.close()


def describe(req) -> str:
    return f"{type(req).__name__} {{\n{text_format.MessageToString(req)}}}"


# -- normalisation -----------------------------------------------------------------

def _clear_header(h: pb.ResponseHeader) -> None:
    h.cluster_id = 0
    h.member_id = 0
    h.raft_term = 0


def _normalise_txn(req: pb.TxnRequest, resp: pb.TxnResponse) -> None:
    _clear_header(resp.header)
    ops = req.success if resp.succeeded else req.failure
    for op, r in zip(ops, resp.responses):
        which = r.WhichOneof("response")
        if which == "response_range":
            _clear_header(r.response_range.header)
        elif which == "response_put":
            _clear_header(r.response_put.header)
        elif which == "response_delete_range":
            _clear_header(r.response_delete_range.header)
        elif which == "response_txn":
            if op.WhichOneof("request") == "request_txn":
                _normalise_txn(op.request_txn, r.response_txn)
            else:
                _clear_header(r.response_txn.header)


def normalise(req, outcome: Outcome) -> Outcome:
    """A copy of `outcome` with member identity cleared (everything else, the order of keys that
    tie in a sorted range included, must be etcd's own)."""
    if outcome.response is None:
        return outcome
    resp = type(outcome.response)()
    resp.CopyFrom(outcome.response)
    _clear_header(resp.header)
    if isinstance(req, pb.TxnRequest):
        _normalise_txn(req, resp)
    return Outcome(response=resp)


def same(a: Outcome, b: Outcome) -> bool:
    if a.error is not None or b.error is not None:
        return a.error == b.error
    return a.response == b.response


# -- generator ----------------------------------------------------------------------


@dataclass
class GenState:
    """What the generator knows of the servers' revision history (from etcd's answers)."""

    rev: int = 1
    compact_rev: int = 0


@dataclass
class Generator:
    seed: int
    state: GenState = field(default_factory=GenState)
    # relative weights of the top-level op kinds
    weights: dict = field(
        default_factory=lambda: {
            "range": 30,
            "put": 25,
            "delete": 8,
            "txn": 25,
            "compact": 2,
            "bad": 4,
        }
    )
    big_value_rate: float = 0.0005  # values over the request limit are slow; keep rare

    def __post_init__(self) -> None:
        self.r = random.Random(self.seed)
        self.seen: dict[str, int] = {}  # how many requests of each kind were generated

    def _saw(self, kind: str) -> None:
        self.seen[kind] = self.seen.get(kind, 0) + 1

    # ---- pieces

    def key(self) -> bytes:
        return self.r.choice(KEYS)

    def value(self) -> bytes:
        r = self.r.random()
        if r < 0.05:
            return bytes(self.r.getrandbits(8) for _ in range(self.r.randint(1, 16)))
        return self.r.choice(VALUES)

    def key_and_end(self) -> tuple[bytes, bytes]:
        r = self.r.random()
        if r < 0.40:
            return self.key(), b""
        if r < 0.65:
            p = self.r.choice(PREFIXES)
            return p, prefix_end(p)
        if r < 0.75:
            return self.r.choice(KEYS + PREFIXES), b"\x00"
        if r < 0.90:
            a, b = self.key(), self.key()
            if self.r.random() < 0.85 and a > b:
                a, b = b, a
            return a, b  # sometimes end < key: an empty range
        k = self.key()
        return k, k + b"\x00"

    def revision(self) -> int:
        """Mostly latest (0), sometimes old, compacted, future or negative."""
        r = self.r.random()
        s = self.state
        if r < 0.6:
            return 0
        if r < 0.85:
            lo = max(1, s.compact_rev)
            return self.r.randint(lo, max(lo, s.rev))
        if r < 0.92 and s.compact_rev > 1:
            return self.r.randint(1, s.compact_rev - 1)  # compacted
        if r < 0.97:
            return s.rev + self.r.randint(1, 3)  # future
        return -self.r.randint(1, 5)

    def mod_filter(self) -> int:
        return self.r.choice([0, 0, 0, self.r.randint(1, self.state.rev + 1)])

    # ---- requests

    def range_req(self) -> pb.RangeRequest:
        key, end = self.key_and_end()
        r = self.r
        req = pb.RangeRequest(key=key, range_end=end)
        if r.random() < 0.3:
            req.limit = r.choice([1, 1, 2, 3, 5, -1])
        req.revision = self.revision()
        if r.random() < 0.4:
            req.sort_order = r.choice([0, 1, 2])
            req.sort_target = r.choice([0, 1, 2, 3, 4])
        req.keys_only = r.random() < 0.15
        req.count_only = r.random() < 0.1
        if r.random() < 0.2:
            req.min_mod_revision = self.mod_filter()
            req.max_mod_revision = self.mod_filter()
            req.min_create_revision = self.mod_filter()
            req.max_create_revision = self.mod_filter()
        req.serializable = r.random() < 0.1
        return req

    def put_req(self) -> pb.PutRequest:
        r = self.r
        req = pb.PutRequest(key=self.key(), value=self.value(), prev_kv=r.random() < 0.3)
        x = r.random()
        if x < 0.08:
            req.ignore_value = True
            req.value = b""
        elif x < 0.12:
            req.ignore_lease = True
        return req

    def delete_req(self) -> pb.DeleteRangeRequest:
        key, end = self.key_and_end()
        if end == b"" or self.r.random() < 0.3:
            end = b"" if self.r.random() < 0.7 else end
        return pb.DeleteRangeRequest(key=key, range_end=end, prev_kv=self.r.random() < 0.4)

    def compare(self) -> pb.Compare:
        r = self.r
        key, end = (self.key(), b"") if r.random() < 0.8 else self.key_and_end()
        c = pb.Compare(key=key, range_end=end, target=r.choice([0, 1, 2, 3, 4]), result=r.choice([0, 1, 2, 3]))
        union = c.target if r.random() < 0.95 else r.choice([0, 1, 2, 3, 4])  # sometimes a mismatched union
        if union == 0:
            c.version = r.choice([0, 1, 2, 3, r.randint(0, 10)])
        elif union == 1:
            c.create_revision = r.choice([0, r.randint(0, self.state.rev + 1)])
        elif union == 2:
            c.mod_revision = r.choice([0, r.randint(0, self.state.rev + 1)])
        elif union == 3:
            c.value = self.value()
        else:
            c.lease = r.choice([0, 0, 1])
        return c

    def op(self, depth: int, used: set) -> pb.RequestOp:
        r = self.r
        x = r.random()
        if x < 0.3:
            return pb.RequestOp(request_range=self.range_req())
        if x < 0.65:
            p = self.put_req()
            if r.random() < 0.9:  # mostly avoid duplicate puts (their own error)
                for _ in range(5):
                    if p.key not in used:
                        break
                    p.key = self.key()
            used.add(p.key)
            return pb.RequestOp(request_put=p)
        if x < 0.85 or depth >= 2:
            d = self.delete_req()
            if d.range_end and r.random() < 0.7:
                d.range_end = b""
            return pb.RequestOp(request_delete_range=d)
        return pb.RequestOp(request_txn=self.txn_req(depth + 1))

    def txn_req(self, depth: int = 0) -> pb.TxnRequest:
        r = self.r
        req = pb.TxnRequest()
        req.compare.extend(self.compare() for _ in range(r.choice([0, 1, 1, 1, 2, 3])))
        used: set = set()
        req.success.extend(self.op(depth, used) for _ in range(r.choice([0, 1, 1, 2, 3, 4])))
        used = set()
        req.failure.extend(self.op(depth, used) for _ in range(r.choice([0, 1, 1, 2, 3])))
        if depth == 0:
            _defuse(req)
        return req

    def compact_req(self) -> pb.CompactionRequest:
        r = self.r
        s = self.state
        x = r.random()
        if x < 0.75 and s.rev > s.compact_rev:
            # mostly a modest step forward, so history remains to be read
            rev = r.randint(s.compact_rev + 1, max(s.compact_rev + 1, s.rev - r.randint(0, 20)))
        elif x < 0.88:
            rev = r.randint(max(1, s.compact_rev - 3), max(1, s.compact_rev))  # already compacted
        else:
            rev = s.rev + r.randint(0, 2)  # the current one, or the future
        return pb.CompactionRequest(revision=rev, physical=r.random() < 0.3)

    def bad_req(self):
        """A request etcd rejects (or a rare edge) — one of the listed bad inputs."""
        r = self.r
        kind = r.choice(
            [
                "empty_key",
                "empty_key",
                "too_many_ops",
                "duplicate_put",
                "put_in_delete",
                "ignore_value_with_value",
                "ignore_lease_with_lease",
                "no_such_lease",
                "ignore_value_missing_key",
                "future_rev",
                "compacted_rev",
                "bad_sort",
                "empty_op",
                "txn_bad_op",
                "big_value",
            ]
        )
        if kind == "big_value" and r.random() > 0.05:
            kind = "empty_key"  # keep it (slow) rare
        self._saw("bad:" + kind)
        return make_bad(kind, self)

    # ---- stream

    def next(self):
        kinds = list(self.weights)
        kind = self.r.choices(kinds, weights=[self.weights[k] for k in kinds])[0]
        if self.r.random() < self.big_value_rate:
            self._saw("bad:big_value")
            return make_bad("big_value", self)
        self._saw(kind)
        return {
            "range": self.range_req,
            "put": self.put_req,
            "delete": self.delete_req,
            "txn": self.txn_req,
            "compact": self.compact_req,
            "bad": self.bad_req,
        }[kind]()

    def observe(self, req, outcome: Outcome) -> None:
        """Track the revision and compaction point from the reference server's answer."""
        if outcome.response is not None:
            rev = outcome.response.header.revision
            if rev:
                self.state.rev = max(self.state.rev, rev)
            if isinstance(req, pb.CompactionRequest):
                self.state.compact_rev = max(self.state.compact_rev, req.revision)


def _txn_tree(req: pb.TxnRequest):
    for op in (*req.success, *req.failure):
        which = op.WhichOneof("request")
        if which == "request_txn":
            yield from _txn_tree(op.request_txn)
        elif which is not None:
            yield getattr(op, which)


def _defuse(req: pb.TxnRequest) -> None:
    """Keep etcd 3.5.1 alive: it checks a txn's ignore_value/ignore_lease puts
    against the state *before* the txn, so a put with those flags on a key that
    an earlier op of the same txn deleted passes the check and then fails while
    applying, which 3.5.1 answers with a panic ("unexpected error during txn").
    (Its duplicate-key interval check does not see a delete whose range_end is
    "\0", so such a txn is not rejected up front.)  Where a txn deletes anything,
    its puts do not use those flags.
    """
    ops = list(_txn_tree(req))
    if any(isinstance(o, pb.DeleteRangeRequest) for o in ops):
        for o in ops:
            if isinstance(o, pb.PutRequest):
                o.ignore_value = False
                o.ignore_lease = False


def make_bad(kind: str, g: Generator | None = None):
    """One bad request of the named kind (deterministic when `g` is None)."""
    rng = g.r if g is not None else random.Random(0)
    key = (g.key() if g is not None else b"foo")
    state = g.state if g is not None else GenState()
    if kind == "empty_key":
        which = rng.choice(["range", "put", "delete", "txn_compare", "txn_op"])
        if which == "range":
            return pb.RangeRequest(key=b"", range_end=rng.choice([b"", b"\x00", b"z"]))
        if which == "put":
            return pb.PutRequest(key=b"", value=b"v")
        if which == "delete":
            return pb.DeleteRangeRequest(key=b"", range_end=rng.choice([b"", b"\x00"]))
        if which == "txn_compare":
            return pb.TxnRequest(compare=[pb.Compare(key=b"", target=pb.Compare.VERSION)])
        return pb.TxnRequest(success=[pb.RequestOp(request_put=pb.PutRequest(key=b"", value=b"v"))])
    if kind == "too_many_ops":
        n = MAX_TXN_OPS + 1
        which = rng.choice(["compare", "success", "failure"])
        req = pb.TxnRequest()
        if which == "compare":
            req.compare.extend(pb.Compare(key=key, target=pb.Compare.VERSION, version=0) for _ in range(n))
        else:
            ops = [pb.RequestOp(request_range=pb.RangeRequest(key=key)) for _ in range(n)]
            getattr(req, which).extend(ops)
        return req
    if kind == "duplicate_put":
        return pb.TxnRequest(
            success=[
                pb.RequestOp(request_put=pb.PutRequest(key=key, value=b"1")),
                pb.RequestOp(request_put=pb.PutRequest(key=key, value=b"2")),
            ]
        )
    if kind == "put_in_delete":
        return pb.TxnRequest(
            failure=[
                pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=b"/registry/", range_end=b"/registry0")),
                pb.RequestOp(request_put=pb.PutRequest(key=b"/registry/pods/default/a", value=b"1")),
            ]
        )
    if kind == "ignore_value_with_value":
        return pb.PutRequest(key=key, value=b"v", ignore_value=True)
    if kind == "ignore_lease_with_lease":
        return pb.PutRequest(key=key, value=b"v", lease=7, ignore_lease=True)
    if kind == "no_such_lease":
        put = pb.PutRequest(key=key, value=b"v", lease=rng.choice([1, 12345, 0x7FFFFFFFFFFFFFFF, -5]))
        if rng.random() < 0.5:
            return put
        return pb.TxnRequest(success=[pb.RequestOp(request_put=put)])
    if kind == "ignore_value_missing_key":  # with a missing lease too, which a Put checks first
        return pb.PutRequest(key=b"/registry/configmaps/never/written", ignore_value=True,
                             lease=rng.choice([0, 0, 12345]))
    if kind == "future_rev":
        rng_rev = state.rev + rng.randint(1, 100)
        if rng.random() < 0.5:
            return pb.RangeRequest(key=key, revision=rng_rev)
        return pb.TxnRequest(success=[pb.RequestOp(request_range=pb.RangeRequest(key=key, revision=rng_rev))])
    if kind == "compacted_rev":
        rev = rng.randint(1, max(1, state.compact_rev - 1)) if state.compact_rev > 1 else 1
        if rng.random() < 0.5:
            return pb.RangeRequest(key=key, range_end=b"\x00", revision=rev)
        return pb.TxnRequest(
            failure=[pb.RequestOp(request_range=pb.RangeRequest(key=key, revision=rev))],
            compare=[pb.Compare(key=key, target=pb.Compare.VERSION, result=pb.Compare.LESS, version=0)],
        )
    if kind == "bad_sort":
        req = pb.RangeRequest(key=key, range_end=b"\x00")
        if rng.random() < 0.5:
            req.sort_order = rng.choice([3, 4, 100, -1])
        else:
            req.sort_target = rng.choice([5, 6, 100, -1])
            req.sort_order = rng.choice([0, 1, 2])
        if rng.random() < 0.3:
            return pb.TxnRequest(success=[pb.RequestOp(request_range=req)])
        return req
    if kind == "empty_op":
        return pb.TxnRequest(success=[pb.RequestOp()])
    if kind == "txn_bad_op":
        inner = rng.choice(
            [
                pb.RequestOp(request_put=pb.PutRequest(key=key, value=b"v", ignore_value=True)),
                pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=b"")),
                pb.RequestOp(request_txn=pb.TxnRequest(success=[pb.RequestOp()])),
            ]
        )
        return pb.TxnRequest(success=[inner], failure=[inner])
    if kind == "big_value":
        size = rng.choice([MAX_REQUEST_BYTES + 1024, MAX_REQUEST_BYTES + 200 * 1024])
        value = b"B" * size
        if rng.random() < 0.7:
            return pb.PutRequest(key=key, value=value)
        return pb.TxnRequest(success=[pb.RequestOp(request_put=pb.PutRequest(key=key, value=value))])
    raise ValueError(kind)


BAD_KINDS = [
    "empty_key",
    "too_many_ops",
    "duplicate_put",
    "put_in_delete",
    "ignore_value_with_value",
    "ignore_lease_with_lease",
    "no_such_lease",
    "ignore_value_missing_key",
    "future_rev",
    "compacted_rev",
    "bad_sort",
    "empty_op",
    "txn_bad_op",
    "big_value",
]


# -- the differential run ---------------------------------------------------------------


class Mismatch(AssertionError):
    pass


INVALID_SORT = (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: invalid sort option")


def has_bad_sort(req) -> bool:
    """Does the request (or any range nested in its txn) carry an out-of-range sort option?

    Such requests are not sent to the reference etcd 3.5.1: an unknown sort
    target makes 3.5.1 dereference a nil sorter and crash (etcd issue #13554),
    and an unknown sort order is silently treated as "no sort". Later etcd
    (the fix for #13554, and 3.6's checkRangeRequest) rejects both with
    INVALID_ARGUMENT "etcdserver: invalid sort option", which is what
    shardetcd is held to.
    """
    if isinstance(req, pb.RangeRequest):
        return not (0 <= req.sort_order <= 2 and 0 <= req.sort_target <= 4)
    if isinstance(req, pb.TxnRequest):
        for op in (*req.success, *req.failure):
            which = op.WhichOneof("request")
            if which == "request_range" and has_bad_sort(op.request_range):
                return True
            if which == "request_txn" and has_bad_sort(op.request_txn):
                return True
    return False


def run_differential(
    etcd_endpoint: str,
    shard_endpoint: str,
    seed: int,
    n_ops: int,
    gen: Generator | None = None,
    skip=None,
) -> int:
    """Send `n_ops` generated requests to both servers in order; raise Mismatch on the first difference.

    Returns the number of requests sent.
    """
    gen = gen or Generator(seed)
    ref, sut = Client(etcd_endpoint), Client(shard_endpoint)
    try:
        for i in range(n_ops):
            req = gen.next()
            if skip is not None and skip(req):
                continue
            if has_bad_sort(req):
                want = Outcome(error=INVALID_SORT)  # see has_bad_sort: etcd 3.5.1 cannot be asked
            else:
                want = ref.call(req)
            got = sut.call(req)
            gen.observe(req, want)
            nw, ng = normalise(req, want), normalise(req, got)
            if not same(nw, ng):
                raise Mismatch(
                    f"seed={seed} op #{i}: shardetcd differs from etcd\n"
                    f"request: {_short(describe(req))}\n"
                    f"etcd:      {_short(str(nw))}\n"
                    f"shardetcd: {_short(str(ng))}"
                )
        return n_ops
    finally:
        ref.close()
        sut.close()


def _short(text: str, limit: int = 6000) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"... [{len(text) - limit} more chars]"


# -- etcd's counters, compared ------------------------------------------------------------

MVCC_COUNTERS = ("etcd_mvcc_range_total", "etcd_mvcc_put_total", "etcd_mvcc_delete_total", "etcd_mvcc_txn_total",
                 "etcd_debugging_mvcc_total_put_size_in_bytes", "etcd_debugging_mvcc_db_compaction_keys_total")


def counters(url: str, names: tuple[str, ...] = MVCC_COUNTERS) -> dict[str, float]:
    """These unlabelled metrics of the server whose /metrics is at ``url``."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    got = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}
    return {n: got[n] for n in names}


def same_counts(urls: tuple[str, str], before: list[dict[str, float]], wait_s: float = 10.0) -> list[dict]:
    """Both servers' changes since ``before`` (read with ``counters``), once they agree or ``wait_s``
    has passed (a compaction may still be dropping rows, an expiry still running)."""
    import time

    names = tuple(before[0])
    deadline = time.monotonic() + wait_s
    while True:
        deltas = [{k: v - b[k] for k, v in counters(u, names).items()} for u, b in zip(urls, before)]
        if deltas[0] == deltas[1] or time.monotonic() > deadline:
            return deltas
        time.sleep(0.2)
