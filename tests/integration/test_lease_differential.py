"""Differential lease test: the same lease and KV requests go, in the same order,
to a real etcd 3.5.1 and to shardetcd; every answer must be the same.

Compared field by field with cluster_id, member_id and raft_term cleared
(header revisions are compared); errors as (status code, details). Lease IDs
the servers choose differ: each server's ID is mapped to the name the script
gave the lease before comparing (in grant, time-to-live, keep-alive and leases
responses, and in kv.lease / prev_kv.lease of KV answers). Orders etcd leaves
unspecified (a lease's keys come from a Go map) are sorted; the leases list is
etcd's own order (soonest expiry first) and compared as is.
A remaining TTL may differ by one second.
"""

from __future__ import annotations

import contextlib
import time

import grpc
import pytest
from google.protobuf import text_format

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.integration.diffkit import MVCC_COUNTERS, Outcome, counters, prefix_end, same_counts

pytestmark = pytest.mark.timeout(90)

KEYS = [
    b"/registry/pods/default/a",
    b"/registry/leases/kube-node-lease/n1",
    b"/registry/events/default/e1",
    b"/registry/minions/node1",
    b"/registry/configmaps/default/cm1",
    b"plain",
]
ALL = pb.RangeRequest(key=b"\x00", range_end=b"\x00")

STUBS = {
    pb.LeaseGrantRequest: ("lease", "LeaseGrant"),
    pb.LeaseRevokeRequest: ("lease", "LeaseRevoke"),
    pb.LeaseTimeToLiveRequest: ("lease", "LeaseTimeToLive"),
    pb.LeaseLeasesRequest: ("lease", "LeaseLeases"),
    pb.RangeRequest: ("kv", "Range"),
    pb.PutRequest: ("kv", "Put"),
    pb.DeleteRangeRequest: ("kv", "DeleteRange"),
    pb.TxnRequest: ("kv", "Txn"),
}


class Side:
    def __init__(self, name: str, endpoint: str) -> None:
        self.name = name
        self.ch = grpc.insecure_channel(endpoint)
        self.kv = pbg.KVStub(self.ch)
        self.lease = pbg.LeaseStub(self.ch)
        self.ids: dict[str, int] = {}  # script name -> this server's lease ID

    def call(self, req) -> Outcome:
        stub, method = STUBS[type(req)]
        try:
            return Outcome(response=getattr(getattr(self, stub), method)(req, timeout=10))
        except grpc.RpcError as exc:
            return Outcome(error=(exc.code(), exc.details()))

    def canonical(self, lid: int) -> int:
        """A server-chosen ID as a number both sides agree on (its script name's hash)."""
        for name, i in self.ids.items():
            if i == lid and lid != 0:
                return -(abs(hash(name)) % 10**9) - 1  # negative: never a real client-chosen ID here
        return lid


def _normalise(side: Side, resp):
    """A copy with member identity cleared, lease IDs canonical and unspecified orders sorted."""
    out = type(resp)()
    out.CopyFrom(resp)

    def walk(msg):
        for fd, value in msg.ListFields():
            if fd.name == "header":
                value.cluster_id = value.member_id = value.raft_term = 0
            elif fd.message_type is not None:
                items = value if fd.is_repeated else [value]
                for v in items:
                    walk(v)
            elif fd.name in ("ID", "lease") and fd.type == fd.TYPE_INT64:
                setattr(msg, fd.name, side.canonical(value))

    walk(out)
    if isinstance(out, pb.LeaseTimeToLiveResponse):
        keys = sorted(out.keys)
        del out.keys[:]
        out.keys.extend(keys)
    return out


def _fmt(o: Outcome) -> str:
    if o.error is not None:
        return f"ERROR {o.error[0].name}: {o.error[1]!r}"
    return text_format.MessageToString(o.response, as_one_line=True)


class Pair:
    def __init__(self, etcd_endpoint: str, shard_endpoint: str) -> None:
        self.sides = [Side("etcd", etcd_endpoint), Side("shardetcd", shard_endpoint)]
        self.mismatches: list[str] = []
        self.step = 0

    def id(self, name: str | int, i: int) -> int:
        return name if isinstance(name, int) else self.sides[i].ids[name]

    def do(self, make, note: str = "", ttl_slack: bool = False, name: str | None = None) -> list[Outcome]:
        """Send make(side index) to each server; compare the normalised answers.
        `name`: the answers are grants; remember each server's ID under that name."""
        self.step += 1
        outs = [s.call(make(i)) for i, s in enumerate(self.sides)]
        if name is not None:
            for s, o in zip(self.sides, outs):
                if o.response is not None:
                    s.ids[name] = o.response.ID
        norm = [o if o.response is None else Outcome(response=_normalise(s, o.response)) for s, o in zip(self.sides, outs)]
        a, b = norm
        if ttl_slack and a.response is not None and b.response is not None and abs(a.response.TTL - b.response.TTL) <= 1:
            b.response.TTL = a.response.TTL
        if (a.error, a.response) != (b.error, b.response):
            self.mismatches.append(
                f"step {self.step} {note}\n  request:   {text_format.MessageToString(make(0), as_one_line=True)}\n"
                f"  etcd:      {_fmt(a)}\n  shardetcd: {_fmt(b)}"
            )
        return outs

    def grant(self, name: str | None, ttl: int, lease_id: int = 0, note: str = "") -> list[Outcome]:
        return self.do(lambda i: pb.LeaseGrantRequest(TTL=ttl, ID=lease_id), note or f"grant {name} TTL={ttl} ID={lease_id}", name=name)

    def put(self, key: bytes, value: bytes = b"v", lease=0, note: str = "", **kw):
        return self.do(lambda i: pb.PutRequest(key=key, value=value, lease=self.id(lease, i), **kw), note or f"put {key!r} lease={lease}")

    def ttl(self, lease, keys: bool = True, note: str = ""):
        return self.do(lambda i: pb.LeaseTimeToLiveRequest(ID=self.id(lease, i), keys=keys), note or f"timetolive {lease}", ttl_slack=True)

    def revoke(self, lease, note: str = ""):
        return self.do(lambda i: pb.LeaseRevokeRequest(ID=self.id(lease, i)), note or f"revoke {lease}")

    def range_all(self, note: str = "range all"):
        return self.do(lambda i: ALL, note)

    def leases(self, note: str = "leases"):
        return self.do(lambda i: pb.LeaseLeasesRequest(), note)

    def keepalive(self, leases: list, note: str = "keep-alive"):
        """One keep-alive stream per server; compare (ID, TTL) and the header of every response."""
        self.step += 1
        got = []
        for i, s in enumerate(self.sides):
            reqs = [pb.LeaseKeepAliveRequest(ID=self.id(lid, i)) for lid in leases]
            rs = list(s.lease.LeaseKeepAlive(iter(reqs), timeout=10))
            got.append([text_format.MessageToString(_normalise(s, r), as_one_line=True) for r in rs])
        if got[0] != got[1]:
            self.mismatches.append(f"step {self.step} {note} {leases}\n  etcd:      {got[0]}\n  shardetcd: {got[1]}")

    def check(self) -> None:
        assert not self.mismatches, f"{len(self.mismatches)} differences:\n\n" + "\n\n".join(self.mismatches)

    def close(self) -> None:
        for s in self.sides:
            s.ch.close()


@pytest.fixture
def pair(real_etcd, shardetcd_or_follower):
    p = Pair(real_etcd.endpoint, shardetcd_or_follower.endpoint)
    try:
        yield p
    finally:
        p.close()


def _txn(compare=(), success=(), failure=()):
    def op(r):
        f = {pb.PutRequest: "request_put", pb.DeleteRangeRequest: "request_delete_range", pb.RangeRequest: "request_range"}[type(r)]
        return pb.RequestOp(**{f: r})

    return pb.TxnRequest(compare=list(compare), success=[op(o) for o in success], failure=[op(o) for o in failure])


LEASE_COUNTERS = (*MVCC_COUNTERS, "etcd_debugging_lease_granted_total", "etcd_debugging_lease_revoked_total",
                  "etcd_debugging_lease_renewed_total", "etcd_debugging_lease_ttl_total_count",
                  "etcd_debugging_lease_ttl_total_sum", "etcd_debugging_server_lease_expired_total")


@contextlib.contextmanager
def counted_as_etcd(real_etcd, server, names: tuple[str, ...] = LEASE_COUNTERS):
    """etcd's lease and mvcc counters change alike on both (the writer's: a follower counts the
    reads it serves, the writer what it is handed)."""
    urls = (real_etcd.client_url, f"http://{server.endpoint}")
    before = [counters(u, names) for u in urls]
    yield
    if "--follow" not in server.extra_args:
        deltas = same_counts(urls, before)
        assert deltas[0] == deltas[1], deltas


def test_grant_attach_compare_timetolive_list_keepalive_revoke(pair, real_etcd, shardetcd_or_follower):
    with counted_as_etcd(real_etcd, shardetcd_or_follower):
        _grant_attach_compare_timetolive_list_keepalive_revoke(pair)


def _grant_attach_compare_timetolive_list_keepalive_revoke(pair):
    p = pair
    p.put(KEYS[0], b"before")  # revision 2: lease answers carry a non-trivial revision
    # -- grants
    p.grant("a", 60)
    p.grant("b", 120)
    p.grant(None, 30, lease_id=1001, note="client-chosen ID")
    p.grant(None, 45, lease_id=1001, note="duplicate ID")
    p.grant(None, 30, lease_id=-5, note="negative client-chosen ID")
    p.grant("min", 1, note="TTL below the minimum: raised to it")
    p.grant("zero", 0, note="TTL 0")
    p.grant("neg", -7, note="negative TTL")
    p.grant("max", 9_000_000_000, note="TTL at the maximum")
    p.grant(None, 9_000_000_001, note="TTL above the maximum")
    p.grant(None, 9_000_000_001, lease_id=1002, note="TTL above the maximum, client-chosen ID")
    p.leases()
    for name in ("min", "zero", "neg", "max"):
        p.revoke(name)
    p.revoke(-5)
    # -- attach, move, detach
    p.put(KEYS[0], b"1", lease="a", prev_kv=True)
    p.put(KEYS[1], b"1", lease="a")
    p.put(KEYS[2], b"1", lease="a")
    p.put(KEYS[3], b"1", lease="b")
    p.put(KEYS[4], b"1", lease=1001)
    p.put(KEYS[5], b"1", lease=1001)
    p.put(b"/registry/pods/x", b"1", lease=424242, note="unknown lease")
    p.put(KEYS[0], b"2", ignore_lease=True, prev_kv=True, note="ignore_lease keeps lease a")
    p.put(KEYS[0], b"", ignore_lease=True, ignore_value=True, prev_kv=True, note="ignore_lease + ignore_value")
    p.put(KEYS[0], b"3", lease="a", ignore_lease=True, note="ignore_lease with a lease")
    p.put(b"/registry/never", b"3", ignore_lease=True, note="ignore_lease on a missing key")
    p.put(KEYS[1], b"2", lease="b", prev_kv=True, note="move to lease b")
    p.put(KEYS[5], b"2", prev_kv=True, note="plain put detaches")
    p.range_all()
    # -- txn compare on LEASE
    for key, lease, result in [
        (KEYS[0], "a", pb.Compare.EQUAL),
        (KEYS[1], "a", pb.Compare.EQUAL),
        (KEYS[5], 0, pb.Compare.EQUAL),
        (b"/registry/never", 0, pb.Compare.EQUAL),
        (KEYS[3], "b", pb.Compare.NOT_EQUAL),
        (KEYS[4], 1000, pb.Compare.GREATER),
        (KEYS[4], 1000, pb.Compare.LESS),
    ]:
        p.do(
            lambda i, key=key, lease=lease, result=result: _txn(
                compare=[pb.Compare(key=key, target=pb.Compare.LEASE, result=result, lease=p.id(lease, i))],
                success=[pb.PutRequest(key=b"/registry/configmaps/t", value=key, lease=p.id("b", i)), pb.RangeRequest(key=key)],
                failure=[pb.RangeRequest(key=b"/registry/", range_end=prefix_end(b"/registry/"))],
            ),
            f"txn compare LEASE({key!r}) {result} {lease}",
        )
    p.do(
        lambda i: _txn(
            compare=[pb.Compare(key=b"/registry/", range_end=prefix_end(b"/registry/"), target=pb.Compare.LEASE,
                                result=pb.Compare.GREATER, lease=0)],
            success=[pb.RangeRequest(key=b"/registry/", range_end=prefix_end(b"/registry/"))],
        ),
        "txn compare LEASE over a range",
    )
    p.do(lambda i: _txn(success=[pb.PutRequest(key=b"t1", value=b"x", lease=777777)]), "txn put with an unknown lease")
    p.do(lambda i: _txn(success=[pb.PutRequest(key=b"t1", value=b"x", lease=p.id("a", i)),
                                 pb.PutRequest(key=b"/registry/events/t2", value=b"x", lease=p.id(1001, i))]),
         "txn attaching across shards")
    # -- time to live, list, keep-alive
    for lease in ("a", "b", 1001):
        p.ttl(lease, keys=True)
        p.ttl(lease, keys=False)
    p.ttl(31337, note="timetolive of an unknown lease")
    p.leases()
    p.keepalive(["a", "b", 1001, 31337, "a"])
    # -- revoke
    p.revoke("a", note="revoke a: deletes its keys in one revision")
    p.range_all()
    p.revoke("a", note="revoke a again")
    p.revoke(99999, note="revoke an unknown lease")
    p.ttl("a", note="timetolive of a revoked lease")
    p.keepalive(["a"], note="keep-alive of a revoked lease")
    p.revoke(1001)
    p.revoke("b")
    p.leases()
    p.range_all()
    p.check()


def test_expiry_deletes_attached_keys(pair, real_etcd, shardetcd_or_follower):
    """A lease at the 2 s minimum expires with its keys on both (one revision),
    leaving a key moved to another lease and a detached one."""
    polled = "etcd_mvcc_range_total"  # the test polls each side until the expiry shows
    with counted_as_etcd(real_etcd, shardetcd_or_follower, tuple(n for n in LEASE_COUNTERS if n != polled)):
        _expiry_deletes_attached_keys(pair)


def _expiry_deletes_attached_keys(pair):
    p = pair
    p.grant("short", 1)
    p.grant("long", 600)
    for k in KEYS:
        p.put(k, b"1", lease="short")
    p.put(KEYS[0], b"moved", lease="long")
    p.put(KEYS[1], b"detached")
    p.ttl("short", keys=True)
    deadline = time.monotonic() + 10
    for s in p.sides:
        while s.kv.Range(pb.RangeRequest(key=KEYS[2]), timeout=5).kvs and time.monotonic() < deadline:
            time.sleep(0.1)
    p.range_all("range all after expiry")
    p.ttl("short", note="timetolive after expiry")
    p.keepalive(["short", "long"], note="keep-alive after expiry")
    p.leases("leases after expiry")
    p.check()
