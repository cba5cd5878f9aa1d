"""Maintenance and Cluster against shardetcd: etcdctl, quota/NOSPACE, HashKV vs etcd, health."""
from __future__ import annotations

import json
import subprocess

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.shardetcd_fixture import start_shardetcd


def etcdctl(endpoint: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["/usr/bin/etcdctl", f"--endpoints={endpoint}", *args],
                       capture_output=True, text=True, timeout=30, env={"ETCDCTL_API": "3"})
    if check:
        assert r.returncode == 0, r.stderr
    return r


def test_etcdctl_status_health_members_alarms_defrag(shardetcd):
    ep = shardetcd.endpoint
    etcdctl(ep, "put", "/registry/pods/a", "x")
    status = json.loads(etcdctl(ep, "endpoint", "status", "-w", "json").stdout)[0]["Status"]
    major, minor, patch = (int(x) for x in status["version"].split("."))
    assert (major, minor) == (3, 5) and patch >= 13
    assert status["leader"] == status["header"]["member_id"] and status["raftIndex"] >= 2
    assert status["dbSize"] >= status["dbSizeInUse"] > 0
    assert "is healthy" in etcdctl(ep, "endpoint", "health").stderr + etcdctl(ep, "endpoint", "health").stdout
    members = json.loads(etcdctl(ep, "member", "list", "-w", "json").stdout)["members"]
    assert [m["clientURLs"] for m in members] == [[shardetcd.client_url]]
    assert etcdctl(ep, "alarm", "list").stdout == ""
    assert "Finished defragmenting" in etcdctl(ep, "defrag").stdout
    r = etcdctl(ep, "member", "add", "other", "--peer-urls=http://127.0.0.1:1", check=False)
    assert r.returncode != 0 and "etcdserver: not capable" in r.stderr


def test_quota_nospace_then_compact_defrag_disarm(tmp_path):
    server = start_shardetcd(tmp_path, extra_args=("--quota-backend-bytes", "200000"))
    try:
        with grpc.insecure_channel(server.endpoint) as ch:
            kv, lease, mt = pbg.KVStub(ch), pbg.LeaseStub(ch), pbg.MaintenanceStub(ch)
            rev = 0
            with pytest.raises(grpc.RpcError) as err:
                for i in range(400):
                    rev = kv.Put(pb.PutRequest(key=b"/registry/events/e%d" % (i % 10), value=b"x" * 2000)).header.revision
            assert (err.value.code(), err.value.details()) == (
                grpc.StatusCode.RESOURCE_EXHAUSTED, "etcdserver: mvcc: database space exceeded")
            alarms = mt.Alarm(pb.AlarmRequest(action=pb.AlarmRequest.GET)).alarms
            assert [(a.alarm) for a in alarms] == [pb.NOSPACE]
            assert mt.Status(pb.StatusRequest()).errors == [f"memberID:{alarms[0].memberID} alarm:NOSPACE "]
            for bad in (lambda: lease.LeaseGrant(pb.LeaseGrantRequest(TTL=60)),
                        lambda: kv.Txn(pb.TxnRequest(success=[pb.RequestOp(request_put=pb.PutRequest(key=b"t"))]))):
                with pytest.raises(grpc.RpcError) as err:
                    bad()
                assert err.value.details() == "etcdserver: mvcc: database space exceeded"
            kv.DeleteRange(pb.DeleteRangeRequest(key=b"/registry/events/", range_end=b"/registry/events0"))  # deletes still work
            size_before = mt.Status(pb.StatusRequest()).dbSize
            kv.Compact(pb.CompactionRequest(revision=rev + 1, physical=True))
            mt.Defragment(pb.DefragmentRequest())
            assert mt.Status(pb.StatusRequest()).dbSize < size_before / 4
            with pytest.raises(grpc.RpcError):  # still alarmed until disarmed
                kv.Put(pb.PutRequest(key=b"k", value=b"v"))
            gone = mt.Alarm(pb.AlarmRequest(action=pb.AlarmRequest.DEACTIVATE, memberID=alarms[0].memberID, alarm=pb.NOSPACE))
            assert len(gone.alarms) == 1
            kv.Put(pb.PutRequest(key=b"k", value=b"v"))
        # alarms survive a restart
        with grpc.insecure_channel(server.endpoint) as ch:
            mt = pbg.MaintenanceStub(ch)
            mt.Alarm(pb.AlarmRequest(action=pb.AlarmRequest.ACTIVATE, memberID=7, alarm=pb.NOSPACE))
        server.restart()
        with grpc.insecure_channel(server.endpoint) as ch:
            got = pbg.MaintenanceStub(ch).Alarm(pb.AlarmRequest(action=pb.AlarmRequest.GET)).alarms
            assert [(a.memberID, a.alarm) for a in got] == [(7, pb.NOSPACE)]
    finally:
        server.stop()


def drive(kv):
    """The same small history on any server: puts, a txn, deletes, compaction."""
    for i in range(30):
        kv.Put(pb.PutRequest(key=b"/registry/pods/p%d" % (i % 7), value=b"v%d" % i))
        kv.Put(pb.PutRequest(key=b"/registry/leases/l%d" % (i % 3), value=b"w%d" % i))
    kv.Txn(pb.TxnRequest(success=[pb.RequestOp(request_put=pb.PutRequest(key=b"a", value=b"1")),
                                  pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=b"/registry/pods/p1"))]))
    kv.DeleteRange(pb.DeleteRangeRequest(key=b"/registry/leases/", range_end=b"/registry/leases0"))
    kv.Compact(pb.CompactionRequest(revision=40, physical=True))
    kv.Put(pb.PutRequest(key=b"z", value=b"last"))


def test_hashkv_equals_etcd_and_is_stable_across_restart(shardetcd, real_etcd):
    hashes = {}
    for name, ep in (("etcd", real_etcd.endpoint), ("shardetcd", shardetcd.endpoint)):
        with grpc.insecure_channel(ep) as ch:
            drive(pbg.KVStub(ch))
            mt = pbg.MaintenanceStub(ch)
            hashes[name] = [(r.hash, r.compact_revision) for r in
                            (mt.HashKV(pb.HashKVRequest(revision=rev)) for rev in (0, 41, 45, 62, 64))]
            with pytest.raises(grpc.RpcError) as err:
                mt.HashKV(pb.HashKVRequest(revision=40))
            hashes[name].append((err.value.code(), err.value.details()))
    assert hashes["shardetcd"] == hashes["etcd"]
    shardetcd.kill()
    shardetcd.restart()
    with grpc.insecure_channel(shardetcd.endpoint) as ch:
        again = pbg.MaintenanceStub(ch).HashKV(pb.HashKVRequest(revision=0))
    assert (again.hash, again.compact_revision) == hashes["etcd"][0]


def test_grpc_health_service_answers_as_etcds(shardetcd, real_etcd):
    """grpc.health.v1.Health as etcd serves it (grpc-go's health server): the overall status is
    SERVING; a service name it does not know is NOT_FOUND "unknown service" on Check and
    SERVICE_UNKNOWN on a Watch, which stays open."""
    answers = []
    for endpoint in (shardetcd.endpoint, real_etcd.endpoint):
        got = []
        with grpc.insecure_channel(endpoint) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            for service in ("", "etcdserverpb.KV", "nope"):
                try:
                    got.append(stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status)
                except grpc.RpcError as exc:
                    got.append((exc.code(), exc.details()))
                watch = stub.Watch(health_pb2.HealthCheckRequest(service=service), timeout=10)
                got.append(next(watch).status)
                watch.cancel()
        answers.append(got)
    assert answers[0] == answers[1]
    assert answers[0][:3] == [health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.SERVING,
                              (grpc.StatusCode.NOT_FOUND, "unknown service")]


def leader_and_downgrade_answers(endpoint: str) -> list:
    """MoveLeader and Downgrade as a client would try them; a Downgrade ENABLE
    of a valid target is left out (etcd would start downgrading)."""
    V, E, C = pb.DowngradeRequest.VALIDATE, pb.DowngradeRequest.ENABLE, pb.DowngradeRequest.CANCEL
    with grpc.insecure_channel(endpoint) as ch:
        mt = pbg.MaintenanceStub(ch)
        me = mt.Status(pb.StatusRequest()).header.member_id
        calls = [(mt.MoveLeader, pb.MoveLeaderRequest(targetID=t)) for t in (0, me, me + 1)]
        calls += [(mt.Downgrade, pb.DowngradeRequest(action=V, version=v))
                  for v in ("", "3.4", "3.4.0", "3.4.9", "3.4.0-rc.1+b", "3.3", "3.5", "4.4", "x", "3.4.x", " 3.4")]
        calls += [(mt.Downgrade, pb.DowngradeRequest(action=a, version=v))
                  for a, v in ((E, "3.3"), (E, "x"), (C, ""), (C, "3.4"), (7, "3.4"))]
        out = []
        for method, req in calls:
            try:
                resp = method(req, timeout=10)
                header = resp.header
                resp.ClearField("header")
                out.append(("ok", resp, header.revision, header.member_id == me))
            except grpc.RpcError as exc:
                out.append((exc.code(), exc.details()))
        return out


def test_move_leader_and_downgrade_answer_as_etcd(shardetcd, real_etcd):
    got = {name: leader_and_downgrade_answers(ep)
           for name, ep in (("etcd", real_etcd.endpoint), ("shardetcd", shardetcd.endpoint))}
    assert got["shardetcd"] == got["etcd"]
    assert ("ok", pb.DowngradeResponse(version="3.5.0"), 1, True) in got["etcd"]


def test_an_empty_store_reports_the_backend_size_of_a_fresh_etcd(real_etcd, shardetcd):
    """Status's dbSize and dbSizeInUse before any write are a fresh etcd's (not 0: tools divide by
    them), give or take the page or two by which a fresh etcd's own vary (20,480 and 16,384 bytes
    mostly, 24,576 at times: how its first commits batch)."""
    sizes = []
    for endpoint in (real_etcd.endpoint, shardetcd.endpoint):
        with grpc.insecure_channel(endpoint) as ch:
            s = pbg.MaintenanceStub(ch).Status(pb.StatusRequest(), timeout=10)
        sizes.append((s.dbSize, s.dbSizeInUse))
    (etcd_size, etcd_in_use), (size, in_use) = sizes
    assert size >= in_use > 0
    assert abs(size - etcd_size) <= 8192 and abs(in_use - etcd_in_use) <= 8192, sizes
