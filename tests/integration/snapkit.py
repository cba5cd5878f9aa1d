"""What the etcd-snapshot round trips write and compare.

``load`` writes the same data to any etcd v3 endpoint: 2,400 keys over the
built-in layout's shards (pods, leases, events, nodes, default) created in
txns, then history (overwrites), deletes, keys on leases, a compaction,
more writes above it, a revoked lease, and auth (users, roles, permissions,
enabled).  ``view`` reads back everything a snapshot must carry, as plain
data to compare with ``==``: every key at the latest revision and at
historical revisions above the compaction, a read below the compaction,
HashKV, leases, users, roles and permissions.
"""
from __future__ import annotations

import random
import subprocess
from dataclasses import dataclass
from pathlib import Path

import crc32c
import grpc

from proto import auth_pb2, rpc_pb2 as pb, rpc_pb2_grpc as pbg
from shards.bbolt import BoltReader
from tests.etcd_fixture import _distro_etcd
from tests.watch_client import WatchClient

ETCD35_DIR = Path(_distro_etcd() or "/nonexistent").parent
ETCD35, ETCDCTL35, ETCDUTL35 = (str(ETCD35_DIR / n) for n in ("etcd", "etcdctl", "etcdutl"))
ETCD34, ETCDCTL34 = "/usr/bin/etcd", "/usr/bin/etcdctl"

ROOT_PW, ALICE_PW = "rootpw", "alicepw"
LEASE_IDS = [0x5EED0000 + i for i in range(6)]  # the last one holds no keys
RESOURCES = [b"/registry/pods/ns%d/p%d", b"/registry/leases/kube-node-lease/n%d-%d", b"/registry/events/ns%d/e%d",
             b"/registry/minions/m%d-%d", b"/registry/configmaps/ns%d/c%d", b"/other/k%d/%d"]


@dataclass
class Loaded:
    compact: int
    latest: int
    history: list[int]  # revisions above the compaction to read at


def load(ch: grpc.Channel) -> Loaded:
    kv, lease = pbg.KVStub(ch), pbg.LeaseStub(ch)
    rnd = random.Random(15)
    keys = [pat % (i % 7, i) for i in range(400) for pat in RESOURCES]
    for lid in LEASE_IDS:
        lease.LeaseGrant(pb.LeaseGrantRequest(ID=lid, TTL=900 + lid % 100))
    for i in range(0, len(keys), 100):
        ops = [pb.RequestOp(request_put=pb.PutRequest(key=k, value=b"first-" + k)) for k in keys[i : i + 100]]
        kv.Txn(pb.TxnRequest(success=ops))
    for n in range(300):
        kv.Put(pb.PutRequest(key=rnd.choice(keys), value=b"v%d-" % n + bytes(rnd.randrange(200))))
    for n, k in enumerate(rnd.sample(keys, 150)):
        kv.Put(pb.PutRequest(key=k, value=b"leased-%d" % n, lease=LEASE_IDS[n % 5]))
    for k in rnd.sample(keys, 60):
        kv.DeleteRange(pb.DeleteRangeRequest(key=k))
    kv.DeleteRange(pb.DeleteRangeRequest(key=b"/registry/pods/ns3/", range_end=b"/registry/pods/ns30"))
    compact = kv.Range(pb.RangeRequest(key=b"x")).header.revision - 40
    kv.Compact(pb.CompactionRequest(revision=compact, physical=True))
    for n in range(120):
        k = rnd.choice(keys)
        if n % 4 == 3:
            kv.DeleteRange(pb.DeleteRangeRequest(key=k))
        else:
            kv.Put(pb.PutRequest(key=k, value=b"after-%d" % n))
    lease.LeaseRevoke(pb.LeaseRevokeRequest(ID=LEASE_IDS[2]))
    latest = kv.Put(pb.PutRequest(key=b"/registry/pods/ns0/last", value=b"last")).header.revision
    _auth(pbg.AuthStub(ch))
    return Loaded(compact, latest, [compact, compact + 1, compact + 20, latest - 30, latest - 1])


AUTH_REVISION = 14  # a new auth store's 1, + one per change below but AuthEnable


def _auth(auth: pbg.AuthStub) -> None:
    auth.UserAdd(pb.AuthUserAddRequest(name="root", password=ROOT_PW))
    auth.UserAdd(pb.AuthUserAddRequest(name="alice", password=ALICE_PW))
    auth.UserAdd(pb.AuthUserAddRequest(name="svc", options=auth_pb2.UserAddOptions(no_password=True)))
    auth.RoleAdd(pb.AuthRoleAddRequest(name="root"))
    auth.RoleAdd(pb.AuthRoleAddRequest(name="pods-reader"))
    auth.RoleAdd(pb.AuthRoleAddRequest(name="cm-writer"))
    perm = auth_pb2.Permission
    auth.RoleGrantPermission(pb.AuthRoleGrantPermissionRequest(
        name="pods-reader", perm=perm(permType=perm.READ, key=b"/registry/pods/", range_end=b"/registry/pods0")))
    auth.RoleGrantPermission(pb.AuthRoleGrantPermissionRequest(
        name="cm-writer", perm=perm(permType=perm.READWRITE, key=b"/registry/configmaps/ns1/", range_end=b"/registry/configmaps/ns2")))
    auth.RoleGrantPermission(pb.AuthRoleGrantPermissionRequest(
        name="cm-writer", perm=perm(permType=perm.WRITE, key=b"/other/k1/1")))
    auth.UserGrantRole(pb.AuthUserGrantRoleRequest(user="root", role="root"))
    auth.UserGrantRole(pb.AuthUserGrantRoleRequest(user="alice", role="pods-reader"))
    auth.UserGrantRole(pb.AuthUserGrantRoleRequest(user="alice", role="cm-writer"))
    auth.UserGrantRole(pb.AuthUserGrantRoleRequest(user="svc", role="pods-reader"))
    auth.AuthEnable(pb.AuthEnableRequest())


def token(ch: grpc.Channel, user: str = "root", password: str = ROOT_PW) -> tuple:
    return (("token", pbg.AuthStub(ch).Authenticate(pb.AuthenticateRequest(name=user, password=password)).token),)


def _kvs(resp) -> list[tuple]:
    return [(k.key, k.value, k.create_revision, k.mod_revision, k.version, k.lease) for k in resp.kvs]


def view(ch: grpc.Channel, loaded: Loaded) -> dict:
    """Everything a snapshot carries, read through the API as root."""
    md = token(ch)
    kv, lease, auth, mt = pbg.KVStub(ch), pbg.LeaseStub(ch), pbg.AuthStub(ch), pbg.MaintenanceStub(ch)
    everything = pb.RangeRequest(key=b"\0", range_end=b"\0")
    latest = kv.Range(everything, metadata=md)
    out: dict = {"revision": latest.header.revision, "latest": _kvs(latest)}
    for rev in loaded.history:
        out[f"at {rev}"] = _kvs(kv.Range(pb.RangeRequest(key=b"\0", range_end=b"\0", revision=rev), metadata=md))
    try:
        kv.Range(pb.RangeRequest(key=b"\0", range_end=b"\0", revision=loaded.compact - 1), metadata=md)
        out["below compaction"] = "served"
    except grpc.RpcError as exc:
        out["below compaction"] = (exc.code(), exc.details())
    h = mt.HashKV(pb.HashKVRequest(revision=loaded.latest), metadata=md)
    out["hashkv"] = (h.hash, h.compact_revision)
    ids = sorted(l.ID for l in lease.LeaseLeases(pb.LeaseLeasesRequest(), metadata=md).leases)
    out["leases"] = []
    for lid in ids:
        t = lease.LeaseTimeToLive(pb.LeaseTimeToLiveRequest(ID=lid, keys=True), metadata=md)
        assert 0 < t.TTL <= t.grantedTTL, (lid, t.TTL, t.grantedTTL)  # full TTL again after a restore
        out["leases"].append((t.ID, t.grantedTTL, sorted(t.keys)))
    try:
        status = auth.AuthStatus(pb.AuthStatusRequest(), metadata=md)
        out["auth"] = (status.enabled, status.authRevision)
    except grpc.RpcError as exc:  # etcd 3.4 has no AuthStatus
        assert exc.code() == grpc.StatusCode.UNIMPLEMENTED, exc
        out["auth"] = None
    out["users"] = {u: list(auth.UserGet(pb.AuthUserGetRequest(name=u), metadata=md).roles)
                    for u in auth.UserList(pb.AuthUserListRequest(), metadata=md).users}
    out["roles"] = {r: [(p.permType, p.key, p.range_end) for p in auth.RoleGet(pb.AuthRoleGetRequest(role=r), metadata=md).perm]
                    for r in auth.RoleList(pb.AuthRoleListRequest(), metadata=md).roles}
    alice = token(ch, "alice", ALICE_PW)  # logging in works, and alice's permissions hold
    out["alice reads pods"] = len(kv.Range(pb.RangeRequest(key=b"/registry/pods/", range_end=b"/registry/pods0"), metadata=alice).kvs)
    try:
        kv.Range(pb.RangeRequest(key=b"/registry/events/", range_end=b"/registry/events0"), metadata=alice)
        out["alice reads events"] = "served"
    except grpc.RpcError as exc:
        out["alice reads events"] = exc.details()
    return out


def watch_events(ch: grpc.Channel, start: int, last: int) -> list[tuple]:
    """Every event from ``start`` up to revision ``last``, over all keys."""
    w = WatchClient(ch, metadata=token(ch))
    try:
        w.create(b"\0", b"\0", start_revision=start)
        w.wait_for(lambda rs: any(e.kv.mod_revision >= last for r in rs for e in r.events), timeout=30)
        return [(e.type, *_kvs(pb.RangeResponse(kvs=[e.kv]))[0]) for e in w.events()]
    finally:
        w.close()


def etcdutl_status(snapshot: Path) -> dict:
    import json

    out = subprocess.run([ETCDUTL35, "snapshot", "status", str(snapshot), "-w", "json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def bolt_summary(snapshot: Path) -> dict:
    """What etcdutl snapshot status reports, computed from the file independently:
    CRC-32C over bucket names, keys and values, the last revision, pair count."""
    data = snapshot.read_bytes()[:-32]
    db = BoltReader(data)
    h, total, revision = 0, 0, 0
    for name, bucket in db.buckets():
        h = crc32c.crc32c(name, h)
        for k, v in bucket.items():
            h = crc32c.crc32c(v, crc32c.crc32c(k, h))
            total += 1
            if name == b"key":
                revision = int.from_bytes(k[:8], "big")
    return {"hash": h, "revision": revision, "totalKey": total, "totalSize": len(data)}


def etcdctl_save(etcdctl: str, endpoint: str, out: Path) -> None:
    r = subprocess.run([etcdctl, f"--endpoints={endpoint}", "--user", f"root:{ROOT_PW}", "snapshot", "save", str(out)],
                       capture_output=True, text=True, env={"ETCDCTL_API": "3"}, timeout=120)
    assert r.returncode == 0 and "Snapshot saved at" in r.stdout, r.stdout + r.stderr
