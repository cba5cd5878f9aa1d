"""v3lockpb.Lock and v3electionpb.Election over gRPC, differential against etcd 3.5.1:
the same script (contended locks, waiters, a waiter giving up, lease revocation;
campaigns, proclamations, resignations, Observe) must give the same transcript on
both servers, with lease IDs (which each server picks) replaced by names."""
from __future__ import annotations

import threading
import time

import grpc
import pytest

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg, v3election_pb2 as epb, v3election_pb2_grpc as eg
from proto import v3lock_pb2 as lpb, v3lock_pb2_grpc as lg
from tests.integration.authkit import enable_with_user

pytestmark = pytest.mark.timeout(120)


class Transcript:
    def __init__(self) -> None:
        self.lines: list[tuple] = []
        self.leases: dict[int, str] = {}

    def lease(self, lease_id: int) -> str:
        return self.leases.setdefault(lease_id, f"L{len(self.leases) + 1}")

    def name(self, text) -> str:
        """Keys and values with every known lease id (decimal or hex) replaced by its name."""
        s = text.decode() if isinstance(text, bytes) else str(text)
        for lease_id, label in self.leases.items():
            s = s.replace(f"{lease_id:x}", label).replace(str(lease_id), label)
        return s

    def add(self, label: str, outcome) -> None:
        self.lines.append((label, outcome))


def call(t: Transcript, fn, req, timeout: float = 10.0):
    """("ok", response) or ("error", code, details)."""
    try:
        return ("ok", fn(req, timeout=timeout))
    except grpc.RpcError as exc:
        return ("error", exc.code().name, exc.details())


def shape(t: Transcript, out) -> tuple:
    if out[0] == "error":
        return out
    resp = out[1]
    fields = {"rev": resp.header.revision}
    if isinstance(resp, lpb.LockResponse):
        fields["key"] = t.name(resp.key)
    if isinstance(resp, epb.CampaignResponse):
        l = resp.leader
        t.lease(l.lease)
        fields["leader"] = (l.name.decode(), t.name(l.key), l.rev, t.lease(l.lease))
    if isinstance(resp, epb.LeaderResponse):
        fields["kv"] = (t.name(resp.kv.key), resp.kv.value.decode(), resp.kv.create_revision, resp.kv.mod_revision,
                        resp.kv.version, t.lease(resp.kv.lease))
    return ("ok", fields)


def gave_up(out) -> tuple:
    """A call that ran into its own deadline. The server sees the same deadline (gRPC sends
    it along): etcd answers a waiter whose context ended with UNKNOWN "context deadline
    exceeded", and whichever of that answer and the client's own timer comes first is what
    the client reports. Both mean the same to a client; the transcript records one of them."""
    if out[:2] == ("error", "UNKNOWN") and out[2] == "context deadline exceeded":
        return ("error", "DEADLINE_EXCEEDED", "Deadline Exceeded")
    return out


class Background:
    """A blocking call run in a thread, to see whether (and when) it returns."""

    def __init__(self, fn, req, timeout: float = 30.0) -> None:
        self.result = None
        self.thread = threading.Thread(target=self._run, args=(fn, req, timeout), daemon=True)
        self.thread.start()

    def _run(self, fn, req, timeout) -> None:
        try:
            self.result = ("ok", fn(req, timeout=timeout))
        except grpc.RpcError as exc:
            self.result = ("error", exc.code().name, exc.details())

    def pending(self) -> bool:
        time.sleep(0.5)
        return self.thread.is_alive()

    def join(self):
        self.thread.join(30)
        assert not self.thread.is_alive()
        return self.result


def script(endpoint: str) -> list[tuple]:
    t = Transcript()
    with grpc.insecure_channel(endpoint) as ch:
        lock, elect, kv, lease = lg.LockStub(ch), eg.ElectionStub(ch), pbg.KVStub(ch), pbg.LeaseStub(ch)
        grant = lambda: t.lease(lease.LeaseGrant(pb.LeaseGrantRequest(TTL=30), timeout=10).ID)  # noqa: E731
        ids = {}
        for label in ("A", "B", "C"):
            name = grant()
            ids[label] = next(i for i, n in t.leases.items() if n == name)
        A, B, C = ids["A"], ids["B"], ids["C"]
        keys = lambda pfx: [(t.name(k.key), k.create_revision, t.lease(k.lease)) for k in kv.Range(  # noqa: E731
            pb.RangeRequest(key=pfx, range_end=pfx[:-1] + bytes([pfx[-1] + 1])), timeout=10).kvs]

        def wait_keys(pfx: bytes, n: int) -> None:
            """Until a waiter started in the background has put its key (the server is slow under load)."""
            deadline = time.monotonic() + 10
            while len(keys(pfx)) < n and time.monotonic() < deadline:
                time.sleep(0.05)

        # -- locks
        t.add("lock, unknown lease", shape(t, call(t, lock.Lock, lpb.LockRequest(name=b"l", lease=777))))
        t.add("lock A", shape(t, call(t, lock.Lock, lpb.LockRequest(name=b"l", lease=A))))
        t.add("lock A again", shape(t, call(t, lock.Lock, lpb.LockRequest(name=b"l", lease=A))))
        waiter = Background(lock.Lock, lpb.LockRequest(name=b"l", lease=B))
        wait_keys(b"l/", 2)
        t.add("B waits", waiter.pending())
        t.add("keys while B waits", keys(b"l/"))
        t.add("unlock A", shape(t, call(t, lock.Unlock, lpb.UnlockRequest(key=b"l/" + f"{A:x}".encode()))))
        t.add("B gets the lock", shape(t, waiter.join()))
        t.add("C gives up", gave_up(shape(t, call(t, lock.Lock, lpb.LockRequest(name=b"l", lease=C), timeout=1.0))))
        deadline = time.monotonic() + 10  # the server removes the waiter's key once it sees the call end
        while len(keys(b"l/")) > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        t.add("keys after C gave up", keys(b"l/"))
        waiter = Background(lock.Lock, lpb.LockRequest(name=b"l", lease=C))
        wait_keys(b"l/", 2)
        t.add("C waits again", waiter.pending())
        lease.LeaseRevoke(pb.LeaseRevokeRequest(ID=B), timeout=10)
        t.add("C gets it when B's lease is revoked", shape(t, waiter.join()))
        t.add("unlock unknown key", shape(t, call(t, lock.Unlock, lpb.UnlockRequest(key=b"l/nope"))))
        t.add("unlock no key", shape(t, call(t, lock.Unlock, lpb.UnlockRequest())))
        t.add("lock C elsewhere, empty name", shape(t, call(t, lock.Lock, lpb.LockRequest(lease=C))))

        # -- election
        e = b"e"
        t.add("no leader", shape(t, call(t, elect.Leader, epb.LeaderRequest(name=e))))
        a = call(t, elect.Campaign, epb.CampaignRequest(name=e, lease=A, value=b"a"))
        t.add("A campaigns", shape(t, a))
        lead_a = a[1].leader
        seen: list = []
        observe = elect.Observe(epb.LeaderRequest(name=e), timeout=60)
        reader = threading.Thread(target=lambda: [seen.append(r) for r in _quiet(observe)], daemon=True)
        reader.start()
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:  # the observer has the current leader: it is watching
            time.sleep(0.05)
        b = Background(elect.Campaign, epb.CampaignRequest(name=e, lease=C, value=b"c"))
        wait_keys(e + b"/", 2)
        t.add("C waits to lead", b.pending())
        t.add("A proclaims", shape(t, call(t, elect.Proclaim, epb.ProclaimRequest(leader=lead_a, value=b"a2"))))
        t.add("leader is A", shape(t, call(t, elect.Leader, epb.LeaderRequest(name=e))))
        t.add("A campaigns again, new value", shape(t, call(t, elect.Campaign, epb.CampaignRequest(
            name=e, lease=A, value=b"a3"))))
        t.add("A resigns", shape(t, call(t, elect.Resign, epb.ResignRequest(leader=lead_a))))
        c = b.join()
        t.add("C leads", shape(t, c))
        t.add("leader is C", shape(t, call(t, elect.Leader, epb.LeaderRequest(name=e))))
        t.add("stale A proclaims", shape(t, call(t, elect.Proclaim, epb.ProclaimRequest(leader=lead_a, value=b"x"))))
        t.add("stale A resigns", shape(t, call(t, elect.Resign, epb.ResignRequest(leader=lead_a))))
        t.add("resign without leader", shape(t, call(t, elect.Resign, epb.ResignRequest())))
        t.add("proclaim without leader", shape(t, call(t, elect.Proclaim, epb.ProclaimRequest(value=b"v"))))
        t.add("campaign, unknown lease", shape(t, call(t, elect.Campaign, epb.CampaignRequest(name=e, lease=777))))
        lease.LeaseRevoke(pb.LeaseRevokeRequest(ID=C), timeout=10)  # C's leadership ends with its lease
        t.add("no leader again", shape(t, call(t, elect.Leader, epb.LeaderRequest(name=e))))
        t.add("A campaigns after C", shape(t, call(t, elect.Campaign, epb.CampaignRequest(name=e, lease=A, value=b"a4"))))
        deadline = time.monotonic() + 10
        while len(seen) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        observe.cancel()
        reader.join(10)
        # header revisions of watched events depend on when each was sent (later writes may already
        # be committed), so only the key-values are compared
        t.add("observed", [shape(t, ("ok", r))[1]["kv"] for r in seen])
    return t.lines


def _quiet(stream):
    try:
        yield from stream
    except grpc.RpcError:
        return


def test_lock_and_election_transcripts_match_etcd(real_etcd, shardetcd_or_follower):
    got = {"etcd": script(real_etcd.endpoint), "shardetcd": script(shardetcd_or_follower.endpoint)}
    for (label, a), (_, b) in zip(got["etcd"], got["shardetcd"]):
        assert a == b, (label, a, b)
    assert got["shardetcd"] == got["etcd"]
    seen = dict(got["etcd"])
    assert seen["B waits"] is True and seen["B gets the lock"][0] == "ok"
    assert seen["C gives up"][1] == "DEADLINE_EXCEEDED"
    assert [kv[1] for kv in seen["observed"]] == ["a", "a2", "a3", "c", "a4"]


def auth_script(endpoint: str) -> list[tuple]:
    """With auth on, a user with READWRITE on "mine/" (and nothing else) uses Lock and Election."""
    t = Transcript()
    with grpc.insecure_channel(endpoint) as ch:
        auth = pbg.AuthStub(ch)
        enable_with_user(auth, "u", "p", b"mine/", b"mine0")
        token = auth.Authenticate(pb.AuthenticateRequest(name="u", password="p"), timeout=10).token
        md = (("token", token),)
        lease_id = pbg.LeaseStub(ch).LeaseGrant(pb.LeaseGrantRequest(ID=0x77, TTL=60), metadata=md, timeout=10).ID
        t.lease(lease_id)
        lock, elect = lg.LockStub(ch), eg.ElectionStub(ch)

        def c(label, fn, req):
            try:
                out = ("ok", fn(req, metadata=md, timeout=5))
            except grpc.RpcError as exc:
                out = ("error", exc.code().name, exc.details())
            t.add(label, shape(t, out))

        c("lock in my prefix", lock.Lock, lpb.LockRequest(name=b"mine", lease=lease_id))
        c("lock elsewhere", lock.Lock, lpb.LockRequest(name=b"theirs", lease=lease_id))
        c("unlock mine", lock.Unlock, lpb.UnlockRequest(key=b"mine/77"))
        c("unlock elsewhere", lock.Unlock, lpb.UnlockRequest(key=b"theirs/77"))
        c("campaign in my prefix", elect.Campaign, epb.CampaignRequest(name=b"mine", lease=lease_id, value=b"v"))
        c("campaign elsewhere", elect.Campaign, epb.CampaignRequest(name=b"theirs", lease=lease_id, value=b"v"))
        c("leader mine", elect.Leader, epb.LeaderRequest(name=b"mine"))
        c("leader elsewhere", elect.Leader, epb.LeaderRequest(name=b"theirs"))
        c("proclaim elsewhere", elect.Proclaim, epb.ProclaimRequest(
            leader=epb.LeaderKey(name=b"theirs", key=b"theirs/77", rev=1, lease=lease_id), value=b"x"))
        c("resign mine", elect.Resign, epb.ResignRequest(
            leader=epb.LeaderKey(name=b"mine", key=b"mine/77", rev=0, lease=lease_id)))
        for label, name in (("observe mine", b"mine"), ("observe elsewhere", b"theirs")):
            try:
                first = next(iter(elect.Observe(epb.LeaderRequest(name=name), metadata=md, timeout=3)))
                t.add(label, shape(t, ("ok", first)))
            except StopIteration:
                t.add(label, "ended")
            except grpc.RpcError as exc:
                t.add(label, ("error", exc.code().name, exc.details()))
    return t.lines


def test_lock_and_election_under_auth_match_etcd(real_etcd, shardetcd_or_follower):
    got = {"etcd": auth_script(real_etcd.endpoint), "shardetcd": auth_script(shardetcd_or_follower.endpoint)}
    assert got["shardetcd"] == got["etcd"]
    seen = dict(got["etcd"])
    assert seen["lock in my prefix"][0] == "ok"
    assert seen["lock elsewhere"] == ("error", "UNKNOWN", "etcdserver: permission denied")
    assert seen["observe elsewhere"] == "ended"
