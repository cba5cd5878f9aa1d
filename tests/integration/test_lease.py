"""Leases against a shardetcd process: etcdctl, expiry across shards, restart."""
from __future__ import annotations

import re
import subprocess
import time

import grpc
import pytest

from proto import kv_pb2, rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.watch_client import WatchClient

SHARD_KEYS = [b"/registry/events/ns/e1", b"/registry/pods/ns/p1", b"/registry/leases/ns/l1", b"plain-key"]


def etcdctl(server, *args: str, stdin: str | None = None) -> str:
    r = subprocess.run(
        ["/usr/bin/etcdctl", f"--endpoints={server.endpoint}", *args],
        input=stdin, capture_output=True, text=True, timeout=30, env={"ETCDCTL_API": "3"},
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_etcdctl_lease_commands(shardetcd):
    out = etcdctl(shardetcd, "lease", "grant", "600")
    lease = re.match(r"lease ([0-9a-f]+) granted with TTL\(600s\)", out).group(1)
    etcdctl(shardetcd, "put", "/registry/events/ns/e1", "x", f"--lease={lease}")
    etcdctl(shardetcd, "put", "/registry/pods/ns/p1", "y", f"--lease={lease}")
    ttl = etcdctl(shardetcd, "lease", "timetolive", lease, "--keys")
    assert re.match(rf"lease {lease} granted with TTL\(600s\), remaining\((599|600)s\), "
                    r"attached keys\(\[/registry/events/ns/e1 /registry/pods/ns/p1\]\)", ttl), ttl
    assert etcdctl(shardetcd, "lease", "list").split() == ["found", "1", "leases", lease]
    assert etcdctl(shardetcd, "lease", "keep-alive", "--once", lease).strip() == f"lease {lease} keepalived with TTL(600)"
    assert etcdctl(shardetcd, "lease", "revoke", lease).strip() == f"lease {lease} revoked"
    assert etcdctl(shardetcd, "get", "/registry/", "--prefix") == ""
    assert etcdctl(shardetcd, "lease", "timetolive", lease).strip() == f"lease {lease} already expired"
    r = subprocess.run(["/usr/bin/etcdctl", f"--endpoints={shardetcd.endpoint}", "put", "k", "v", "--lease=1234"],
                       capture_output=True, text=True, env={"ETCDCTL_API": "3"})
    assert r.returncode != 0 and "etcdserver: requested lease not found" in r.stderr


def test_expiry_deletes_keys_on_every_shard_in_one_revision(shardetcd):
    with grpc.insecure_channel(shardetcd.endpoint) as ch:
        kv, lease = pbg.KVStub(ch), pbg.LeaseStub(ch)
        lid = lease.LeaseGrant(pb.LeaseGrantRequest(TTL=2)).ID
        for k in SHARD_KEYS:
            kv.Put(pb.PutRequest(key=k, value=b"v", lease=lid))
        kv.Put(pb.PutRequest(key=b"/registry/pods/ns/unleased", value=b"v"))
        w = WatchClient(ch)
        w.create(b"\x00", b"\x00", prev_kv=True)
        w.wait_for(lambda rs: rs and rs[0].created)
        rs = w.wait_for(lambda rs: any(r.events for r in rs), timeout=10)
        deletes = [e for r in rs for e in r.events]
        assert sorted(e.kv.key for e in deletes) == sorted(SHARD_KEYS)
        assert all(e.type == kv_pb2.Event.DELETE for e in deletes)
        assert len({e.kv.mod_revision for e in deletes}) == 1, "expiry must be one revision"
        assert [r for r in rs if r.events][0].events == deletes, "one revision, one response"
        assert all(e.prev_kv.lease == lid for e in deletes)
        left = kv.Range(pb.RangeRequest(key=b"\x00", range_end=b"\x00")).kvs
        assert [k.key for k in left] == [b"/registry/pods/ns/unleased"]
        assert lease.LeaseTimeToLive(pb.LeaseTimeToLiveRequest(ID=lid)).TTL == -1
        w.close()


def test_moving_a_key_to_a_new_lease(shardetcd):
    """kube-apiserver's master leases: rewrite the key with a new lease; the old
    lease's expiry deletes only keys still attached to it."""
    with grpc.insecure_channel(shardetcd.endpoint) as ch:
        kv, lease = pbg.KVStub(ch), pbg.LeaseStub(ch)
        old = lease.LeaseGrant(pb.LeaseGrantRequest(TTL=2)).ID
        new = lease.LeaseGrant(pb.LeaseGrantRequest(TTL=600)).ID
        kv.Put(pb.PutRequest(key=b"/registry/masterleases/10.0.0.1", value=b"a", lease=old))
        kv.Put(pb.PutRequest(key=b"/registry/masterleases/10.0.0.2", value=b"b", lease=old))
        kv.Put(pb.PutRequest(key=b"/registry/masterleases/10.0.0.1", value=b"a2", lease=new))
        ttl = lease.LeaseTimeToLive(pb.LeaseTimeToLiveRequest(ID=old, keys=True))
        assert list(ttl.keys) == [b"/registry/masterleases/10.0.0.2"]
        deadline = time.monotonic() + 10
        while lease.LeaseTimeToLive(pb.LeaseTimeToLiveRequest(ID=old)).TTL != -1 and time.monotonic() < deadline:
            time.sleep(0.2)
        left = kv.Range(pb.RangeRequest(key=b"/registry/masterleases/", range_end=b"/registry/masterleases0")).kvs
        assert [(k.key, k.lease) for k in left] == [(b"/registry/masterleases/10.0.0.1", new)]


def test_leases_and_attachments_survive_kill_9(shardetcd):
    with grpc.insecure_channel(shardetcd.endpoint) as ch:
        kv, lease = pbg.KVStub(ch), pbg.LeaseStub(ch)
        ids = [lease.LeaseGrant(pb.LeaseGrantRequest(TTL=300 + i)).ID for i in range(3)]
        lease.LeaseGrant(pb.LeaseGrantRequest(ID=777, TTL=50))
        for i, k in enumerate(SHARD_KEYS):
            kv.Put(pb.PutRequest(key=k, value=b"v", lease=ids[i % 3]))
        lease.LeaseRevoke(pb.LeaseRevokeRequest(ID=ids[2]))
    shardetcd.kill()
    shardetcd.restart()
    with grpc.insecure_channel(shardetcd.endpoint) as ch:
        kv, lease = pbg.KVStub(ch), pbg.LeaseStub(ch)
        listed = sorted(l.ID for l in lease.LeaseLeases(pb.LeaseLeasesRequest()).leases)
        assert listed == sorted([ids[0], ids[1], 777])
        for i, lid in enumerate(ids[:2]):
            t = lease.LeaseTimeToLive(pb.LeaseTimeToLiveRequest(ID=lid, keys=True))
            assert t.grantedTTL == 300 + i and t.TTL >= 300 + i - 2, "a restart gives leases their full TTL"
            assert list(t.keys) == sorted(k for j, k in enumerate(SHARD_KEYS) if j % 3 == i)
        remaining = [k.key for k in kv.Range(pb.RangeRequest(key=b"\x00", range_end=b"\x00")).kvs]
        assert remaining == sorted(k for j, k in enumerate(SHARD_KEYS) if j % 3 != 2)
        with pytest.raises(grpc.RpcError) as err:
            lease.LeaseGrant(pb.LeaseGrantRequest(ID=777, TTL=5))
        assert err.value.details() == "etcdserver: lease already exists"
        # revoke after restart still finds the keys
        lease.LeaseRevoke(pb.LeaseRevokeRequest(ID=ids[0]))
        remaining = [k.key for k in kv.Range(pb.RangeRequest(key=b"\x00", range_end=b"\x00")).kvs]
        assert remaining == sorted(k for j, k in enumerate(SHARD_KEYS) if j % 3 == 1)


def test_keepalive_stream(shardetcd):
    with grpc.insecure_channel(shardetcd.endpoint) as ch:
        lease = pbg.LeaseStub(ch)
        lid = lease.LeaseGrant(pb.LeaseGrantRequest(TTL=3)).ID
        reqs = [pb.LeaseKeepAliveRequest(ID=lid) for _ in range(5)] + [pb.LeaseKeepAliveRequest(ID=42)]

        def slow():
            for r in reqs:
                time.sleep(0.8)
                yield r

        responses = list(lease.LeaseKeepAlive(slow()))
        assert [(r.ID, r.TTL) for r in responses] == [(lid, 3)] * 5 + [(42, 0)]
        # 4 s of keep-alives outlived a 3 s TTL
        assert lease.LeaseTimeToLive(pb.LeaseTimeToLiveRequest(ID=lid)).grantedTTL == 3
