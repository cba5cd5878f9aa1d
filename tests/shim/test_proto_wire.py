"""Our generated stubs against a real etcd: requests encode and responses
decode the way a stock etcd server expects and produces them."""

from __future__ import annotations

import queue
from types import SimpleNamespace

import grpc
import pytest

from proto import kv_pb2, rpc_pb2, rpc_pb2_grpc

TIMEOUT = 10  # seconds, per RPC


@pytest.fixture
def etcd(real_etcd):
    channel = grpc.insecure_channel(real_etcd.endpoint, options=[("grpc.enable_http_proxy", 0)])
    grpc.channel_ready_future(channel).result(timeout=TIMEOUT)
    try:
        yield SimpleNamespace(
            server=real_etcd,
            kv=rpc_pb2_grpc.KVStub(channel),
            watch=rpc_pb2_grpc.WatchStub(channel),
            lease=rpc_pb2_grpc.LeaseStub(channel),
            cluster=rpc_pb2_grpc.ClusterStub(channel),
            maintenance=rpc_pb2_grpc.MaintenanceStub(channel),
        )
    finally:
        channel.close()


def put(etcd, key: bytes, value: bytes, **kw) -> rpc_pb2.PutResponse:
    return etcd.kv.Put(rpc_pb2.PutRequest(key=key, value=value, **kw), timeout=TIMEOUT)


def get(etcd, key: bytes, **kw) -> rpc_pb2.RangeResponse:
    return etcd.kv.Range(rpc_pb2.RangeRequest(key=key, **kw), timeout=TIMEOUT)


class Stream:
    """Drive a bidirectional streaming call from the test thread."""

    _END = object()

    def __init__(self, method):
        self._requests: queue.Queue = queue.Queue()
        self._responses = method(iter(self._requests.get, self._END), timeout=3 * TIMEOUT)

    def send(self, request) -> None:
        self._requests.put(request)

    def recv(self):
        return next(self._responses)

    def close(self) -> None:
        self._requests.put(self._END)
        self._responses.cancel()


# ---------------------------------------------------------------------------
# KV
# ---------------------------------------------------------------------------


def test_put_returns_header_and_prev_kv(etcd):
    first = put(etcd, b"foo", b"bar")
    assert first.header.cluster_id != 0
    assert first.header.member_id != 0
    assert first.header.raft_term >= 1
    assert first.header.revision >= 2
    assert not first.HasField("prev_kv")

    second = put(etcd, b"foo", b"baz", prev_kv=True)
    assert second.header.revision == first.header.revision + 1
    prev = second.prev_kv
    assert (prev.key, prev.value) == (b"foo", b"bar")
    assert prev.create_revision == prev.mod_revision == first.header.revision
    assert prev.version == 1

    (kv,) = get(etcd, b"foo").kvs
    assert kv.value == b"baz"
    assert kv.version == 2
    assert kv.create_revision == first.header.revision
    assert kv.mod_revision == second.header.revision
    assert kv.lease == 0


def test_range_prefix_limit_count(etcd):
    for i in range(1, 6):
        put(etcd, f"p/{i}".encode(), f"v{i}".encode())
    put(etcd, b"q", b"outside")

    limited = get(etcd, b"p/", range_end=b"p0", limit=2)
    assert [kv.key for kv in limited.kvs] == [b"p/1", b"p/2"]
    assert [kv.value for kv in limited.kvs] == [b"v1", b"v2"]
    assert limited.more is True
    assert limited.count == 5

    counted = get(etcd, b"p/", range_end=b"p0", count_only=True)
    assert counted.count == 5
    assert len(counted.kvs) == 0

    newest_first = get(
        etcd,
        b"p/",
        range_end=b"p0",
        sort_order=rpc_pb2.RangeRequest.DESCEND,
        sort_target=rpc_pb2.RangeRequest.KEY,
        keys_only=True,
    )
    assert [kv.key for kv in newest_first.kvs] == [b"p/5", b"p/4", b"p/3", b"p/2", b"p/1"]
    assert all(kv.value == b"" for kv in newest_first.kvs)

    everything = get(etcd, b"\0", range_end=b"\0")
    assert everything.count == 6
    assert everything.more is False

    rev_of_p3 = get(etcd, b"p/3").kvs[0].mod_revision
    filtered = get(etcd, b"p/", range_end=b"p0", min_mod_revision=rev_of_p3 + 1)
    assert [kv.key for kv in filtered.kvs] == [b"p/4", b"p/5"]


def test_txn_with_compares_and_nested_ops(etcd):
    base = put(etcd, b"k", b"v1").header.revision

    compares = [
        rpc_pb2.Compare(
            key=b"k", target=rpc_pb2.Compare.VALUE, result=rpc_pb2.Compare.EQUAL, value=b"v1"
        ),
        rpc_pb2.Compare(
            key=b"k", target=rpc_pb2.Compare.MOD, result=rpc_pb2.Compare.EQUAL, mod_revision=base
        ),
        # range_end (tag 64): every key in [k, l) was created after revision 0
        rpc_pb2.Compare(
            key=b"k",
            range_end=b"l",
            target=rpc_pb2.Compare.CREATE,
            result=rpc_pb2.Compare.GREATER,
            create_revision=0,
        ),
    ]
    nested = rpc_pb2.TxnRequest(
        compare=[
            rpc_pb2.Compare(
                key=b"other",
                target=rpc_pb2.Compare.VERSION,
                result=rpc_pb2.Compare.EQUAL,
                version=0,
            )
        ],
        success=[rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=b"other", value=b"o"))],
    )
    txn = rpc_pb2.TxnRequest(
        compare=compares,
        success=[
            rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=b"k", value=b"v2", prev_kv=True)),
            rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=b"k")),
            rpc_pb2.RequestOp(request_txn=nested),
        ],
        failure=[rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=b"k"))],
    )
    resp = etcd.kv.Txn(txn, timeout=TIMEOUT)
    assert resp.succeeded is True
    assert resp.header.revision == base + 1  # one revision for the whole txn
    assert [r.WhichOneof("response") for r in resp.responses] == [
        "response_put",
        "response_range",
        "response_txn",
    ]
    assert resp.responses[0].response_put.prev_kv.value == b"v1"
    assert [kv.value for kv in resp.responses[1].response_range.kvs] == [b"v2"]
    inner = resp.responses[2].response_txn
    assert inner.succeeded is True
    assert inner.responses[0].WhichOneof("response") == "response_put"
    assert get(etcd, b"other").kvs[0].value == b"o"

    # The same guards now fail: the failure branch runs and nothing is written.
    failed = etcd.kv.Txn(txn, timeout=TIMEOUT)
    assert failed.succeeded is False
    assert failed.header.revision == base + 1
    assert [r.WhichOneof("response") for r in failed.responses] == ["response_range"]
    assert failed.responses[0].response_range.kvs[0].value == b"v2"

    not_equal = rpc_pb2.TxnRequest(
        compare=[
            rpc_pb2.Compare(
                key=b"k",
                target=rpc_pb2.Compare.VALUE,
                result=rpc_pb2.Compare.NOT_EQUAL,
                value=b"v1",
            )
        ],
        success=[
            rpc_pb2.RequestOp(
                request_delete_range=rpc_pb2.DeleteRangeRequest(key=b"other", prev_kv=True)
            )
        ],
    )
    deleted = etcd.kv.Txn(not_equal, timeout=TIMEOUT)
    assert deleted.succeeded is True
    dr = deleted.responses[0].response_delete_range
    assert dr.deleted == 1
    assert [kv.key for kv in dr.prev_kvs] == [b"other"]


def test_delete_range(etcd):
    for key in (b"d/1", b"d/2", b"d/3", b"e"):
        put(etcd, key, b"x")
    resp = etcd.kv.DeleteRange(
        rpc_pb2.DeleteRangeRequest(key=b"d/", range_end=b"d0", prev_kv=True), timeout=TIMEOUT
    )
    assert resp.deleted == 3
    assert sorted(kv.key for kv in resp.prev_kvs) == [b"d/1", b"d/2", b"d/3"]
    assert get(etcd, b"d/", range_end=b"d0", count_only=True).count == 0
    assert get(etcd, b"e").count == 1

    missing = etcd.kv.DeleteRange(rpc_pb2.DeleteRangeRequest(key=b"nope"), timeout=TIMEOUT)
    assert missing.deleted == 0


def test_compact(etcd):
    old = put(etcd, b"c", b"1").header.revision
    new = put(etcd, b"c", b"2").header.revision

    assert get(etcd, b"c", revision=old).kvs[0].value == b"1"
    resp = etcd.kv.Compact(rpc_pb2.CompactionRequest(revision=new, physical=True), timeout=TIMEOUT)
    assert resp.header.revision == new

    with pytest.raises(grpc.RpcError) as excinfo:
        get(etcd, b"c", revision=old)
    assert excinfo.value.code() == grpc.StatusCode.OUT_OF_RANGE
    assert "compacted" in excinfo.value.details()
    assert get(etcd, b"c", revision=new).kvs[0].value == b"2"


# ---------------------------------------------------------------------------
# Lease
# ---------------------------------------------------------------------------


def test_lease_grant_attach_revoke(etcd):
    grant = etcd.lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=60), timeout=TIMEOUT)
    assert grant.ID != 0
    assert grant.TTL == 60
    assert grant.error == ""

    put(etcd, b"leased", b"v", lease=grant.ID)
    assert get(etcd, b"leased").kvs[0].lease == grant.ID

    on_lease = rpc_pb2.TxnRequest(
        compare=[
            rpc_pb2.Compare(
                key=b"leased",
                target=rpc_pb2.Compare.LEASE,
                result=rpc_pb2.Compare.EQUAL,
                lease=grant.ID,
            )
        ]
    )
    assert etcd.kv.Txn(on_lease, timeout=TIMEOUT).succeeded is True

    ttl = etcd.lease.LeaseTimeToLive(
        rpc_pb2.LeaseTimeToLiveRequest(ID=grant.ID, keys=True), timeout=TIMEOUT
    )
    assert ttl.ID == grant.ID
    assert ttl.grantedTTL == 60
    assert 0 < ttl.TTL <= 60
    assert list(ttl.keys) == [b"leased"]

    leases = etcd.lease.LeaseLeases(rpc_pb2.LeaseLeasesRequest(), timeout=TIMEOUT)
    assert grant.ID in [status.ID for status in leases.leases]

    keepalive = Stream(etcd.lease.LeaseKeepAlive)
    try:
        keepalive.send(rpc_pb2.LeaseKeepAliveRequest(ID=grant.ID))
        refreshed = keepalive.recv()
        assert refreshed.ID == grant.ID
        assert refreshed.TTL == 60
    finally:
        keepalive.close()

    revoked = etcd.lease.LeaseRevoke(rpc_pb2.LeaseRevokeRequest(ID=grant.ID), timeout=TIMEOUT)
    assert revoked.header.revision > 0
    assert get(etcd, b"leased").count == 0
    gone = etcd.lease.LeaseTimeToLive(rpc_pb2.LeaseTimeToLiveRequest(ID=grant.ID), timeout=TIMEOUT)
    assert gone.TTL == -1


# ---------------------------------------------------------------------------
# Maintenance / Cluster
# ---------------------------------------------------------------------------


def test_status(etcd):
    put(etcd, b"s", b"1")
    status = etcd.maintenance.Status(rpc_pb2.StatusRequest(), timeout=TIMEOUT)
    assert status.version.startswith("3.")
    assert status.dbSize > 0
    assert 0 < status.dbSizeInUse <= status.dbSize
    assert status.leader == status.header.member_id
    assert status.raftIndex > 0
    assert status.raftAppliedIndex > 0
    assert status.raftTerm >= 1
    assert status.isLearner is False
    assert list(status.errors) == []


def test_member_list(etcd):
    resp = etcd.cluster.MemberList(rpc_pb2.MemberListRequest(), timeout=TIMEOUT)
    (member,) = resp.members
    assert member.ID == resp.header.member_id
    assert member.name == etcd.server.name
    assert list(member.peerURLs) == [etcd.server.peer_url]
    assert list(member.clientURLs) == [etcd.server.client_url]
    assert member.isLearner is False


# ---------------------------------------------------------------------------
# Watch
# ---------------------------------------------------------------------------


def test_watch_receives_put_and_delete_events(etcd):
    stream = Stream(etcd.watch.Watch)
    try:
        stream.send(
            rpc_pb2.WatchRequest(
                create_request=rpc_pb2.WatchCreateRequest(
                    key=b"w/", range_end=b"w0", prev_kv=True, watch_id=7
                )
            )
        )
        created = stream.recv()
        assert created.created is True
        assert created.watch_id == 7
        assert not created.events

        first = put(etcd, b"w/a", b"1")
        put(etcd, b"elsewhere", b"ignored")
        second = put(etcd, b"w/a", b"2")
        etcd.kv.DeleteRange(rpc_pb2.DeleteRangeRequest(key=b"w/a"), timeout=TIMEOUT)

        events = []
        while len(events) < 3:
            resp = stream.recv()
            assert resp.watch_id == 7
            assert not resp.canceled
            events.extend(resp.events)

        assert [e.type for e in events] == [kv_pb2.Event.PUT, kv_pb2.Event.PUT, kv_pb2.Event.DELETE]
        assert [e.kv.key for e in events] == [b"w/a"] * 3
        assert events[0].kv.value == b"1"
        assert events[0].kv.mod_revision == first.header.revision
        assert events[0].kv.version == 1
        assert not events[0].HasField("prev_kv")
        assert events[1].kv.value == b"2"
        assert events[1].kv.mod_revision == second.header.revision
        assert events[1].prev_kv.value == b"1"
        assert events[2].kv.mod_revision == second.header.revision + 1
        assert events[2].prev_kv.value == b"2"

        stream.send(rpc_pb2.WatchRequest(progress_request=rpc_pb2.WatchProgressRequest()))
        progress = stream.recv()
        assert not progress.events
        assert progress.header.revision == second.header.revision + 1

        stream.send(
            rpc_pb2.WatchRequest(cancel_request=rpc_pb2.WatchCancelRequest(watch_id=7))
        )
        canceled = stream.recv()
        assert canceled.canceled is True
        assert canceled.watch_id == 7
    finally:
        stream.close()


def test_watch_from_past_revision_with_filter(etcd):
    start = put(etcd, b"h", b"1").header.revision
    etcd.kv.DeleteRange(rpc_pb2.DeleteRangeRequest(key=b"h"), timeout=TIMEOUT)
    put(etcd, b"h", b"3")

    stream = Stream(etcd.watch.Watch)
    try:
        stream.send(
            rpc_pb2.WatchRequest(
                create_request=rpc_pb2.WatchCreateRequest(
                    key=b"h",
                    start_revision=start,
                    filters=[rpc_pb2.WatchCreateRequest.NODELETE],
                )
            )
        )
        assert stream.recv().created is True
        events = []
        while len(events) < 2:
            events.extend(stream.recv().events)
        assert [(e.type, e.kv.value) for e in events] == [
            (kv_pb2.Event.PUT, b"1"),
            (kv_pb2.Event.PUT, b"3"),
        ]
    finally:
        stream.close()
