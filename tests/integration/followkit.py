"""Checks every kind of follower must pass, whichever journal it follows
(test_follower.py: JetStream; test_follower_local.py: a writer's local
journal on the same machine)."""
from __future__ import annotations

import os
import queue
import re
import signal
import threading
import time

import grpc
import pytest

from proto import auth_pb2, rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.watch_client import WatchClient


def put(kv, key: bytes, value: bytes) -> int:
    return kv.Put(pb.PutRequest(key=key, value=value), timeout=10).header.revision


def writes_and_a_watch_across_a_takeover(ch, kill, logs, before_kill=lambda kv, acked: None) -> list[int]:
    """On one client channel: a watch, 30 writes, ``before_kill(kv, acked)``, ``kill()``
    of the writer, a write retried until the new writer takes it, 10 more. The writes
    get increasing revisions, the watch delivers every acknowledged one once, in order,
    across the takeover, and a read shows them all. The acknowledged revisions."""
    kv = pbg.KVStub(ch)
    watch = WatchClient(ch)
    watch.create(b"/registry/pods/t/", b"/registry/pods/t0")
    watch.wait_for(lambda rs: any(r.created for r in rs))
    acked = [put(kv, b"/registry/pods/t/k%d" % (i % 5), b"%d" % i) for i in range(30)]
    before_kill(kv, acked)
    kill()
    deadline = time.monotonic() + 60
    while True:  # the same channel, until the new writer takes the write
        try:
            acked.append(kv.Put(pb.PutRequest(key=b"/registry/pods/t/after", value=b"x"), timeout=5).header.revision)
            break
        except grpc.RpcError as exc:
            assert exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), exc
            assert time.monotonic() < deadline, [log() for log in logs]
            time.sleep(0.2)
    acked += [put(kv, b"/registry/pods/t/k%d" % i, b"after") for i in range(10)]
    assert acked == sorted(acked) and len(set(acked)) == len(acked)
    watch.wait_for(lambda rs: len([e for r in rs for e in r.events]) >= len(acked), timeout=30)
    time.sleep(0.5)  # a bound for anything extra to arrive, not a claim about speed
    assert [e.kv.mod_revision for e in watch.events()] == acked
    assert watch.error is None
    watch.close()
    r = kv.Range(pb.RangeRequest(key=b"/registry/pods/t/", range_end=b"/registry/pods/t0"), timeout=10)
    assert r.header.revision == acked[-1] and len(r.kvs) == 11  # k0..k9 and "after"
    return acked


def watches_see_every_write_once_in_order(followers, targets: list[str], watchers: int, streams: int,
                                          writers: int) -> None:
    """``watchers`` watches over ``streams`` streams on the followers, each on one of ``writers``
    writers' keys; writer w puts through ``targets[w % len(targets)]``. Every watcher sees exactly
    its writer's acknowledged puts, in revision order, nothing twice."""
    channels = [grpc.insecure_channel(f.endpoint) for f in followers]
    clients = [WatchClient(channels[i % len(channels)]) for i in range(streams)]
    watching: list[tuple[WatchClient, int, int]] = []  # (client, watch id, writer)
    for n in range(watchers):
        c = clients[n % streams]
        prefix = b"/registry/pods/w%d/" % (n % writers)
        c.create(prefix, prefix[:-1] + b"0")
        watching.append((c, sum(1 for w in watching if w[0] is c), n % writers))
    for c in clients:
        c.wait_for(lambda rs: sum(r.created for r in rs) == watchers // streams, timeout=60)
    acked: dict[int, list[int]] = {w: [] for w in range(writers)}

    def write(w: int) -> None:
        with grpc.insecure_channel(targets[w % len(targets)]) as ch:
            kv = pbg.KVStub(ch)
            for i in range(15):
                acked[w].append(put(kv, b"/registry/pods/w%d/k%d" % (w, i % 3), b"%d" % i))

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for c, wid, w in watching:
        c.wait_for(lambda rs, wid=wid, w=w: len([e for r in rs if r.watch_id == wid for e in r.events]) >= len(acked[w]),
                   timeout=30)
    time.sleep(0.5)  # anything extra would have arrived by now (a bound, not a claim about speed)
    for c, wid, w in watching:
        assert [e.kv.mod_revision for e in c.events(wid)] == acked[w]
    for c in clients:
        assert c.error is None
        c.close()
    for ch in channels:
        ch.close()


def cluster_followers_serve_their_partition(cluster) -> None:
    """``cluster`` (test_cluster.Cluster) with ``--followers 1``: each partition has a follower on
    a port of its own; the kube-apiserver flags list the writer and its follower for every
    partition; a follower reads and writes its own partition, and hands a write to another
    partition's resource to its writer, which refuses it as a writer does."""
    cluster.start(timeout=120)  # six processes start on two cores, beside another test worker
    followers = {m[0]: (m[1], int(m[2])) for m in re.findall(r"^  (\w+)\.f1\s+follower at http://(\S+)\s+pid (\d+)",
                                                             cluster.output(), re.M)}
    try:
        assert set(followers) == {"leases", "events", "main"}
        flags = (cluster.data_dir / "kube-apiserver.flags").read_text()
        for name, (endpoint, _) in followers.items():
            assert f"http://{cluster.endpoint(name)};http://{endpoint}" in flags or \
                f"--etcd-servers=http://{cluster.endpoint(name)},http://{endpoint}" in flags, flags
        with grpc.insecure_channel(followers["main"][0]) as ch:
            kv = pbg.KVStub(ch)
            rev = put(kv, b"/registry/pods/ns/p", b"v")
            got = kv.Range(pb.RangeRequest(key=b"/registry/pods/ns/p", serializable=True), timeout=10)
            assert [(x.value, x.mod_revision) for x in got.kvs] == [(b"v", rev)]
            with pytest.raises(grpc.RpcError) as err:
                kv.Put(pb.PutRequest(key=b"/registry/events/ns/e", value=b"v"), timeout=10)
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "events" in err.value.details()
        with grpc.insecure_channel(cluster.endpoint("main")) as ch:
            got = pbg.KVStub(ch).Range(pb.RangeRequest(key=b"/registry/pods/ns/p"), timeout=10)
            assert [x.mod_revision for x in got.kvs] == [rev]
    finally:
        cluster.stop()
        for _, pid in followers.values():
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


def write_past_checkpoints(endpoint: str) -> int:
    """~300 KiB into the pods journal (with --checkpoint-journal-bytes 65536: several checkpoints,
    each releasing the journal it covers); the last revision."""
    with grpc.insecure_channel(endpoint) as ch:
        kv = pbg.KVStub(ch)
        put(kv, b"/registry/pods/ns/first", b"v")
        for i in range(300):
            rev = put(kv, b"/registry/pods/ns/p%d" % (i % 40), b"v" * 1000)
    return rev


def serves_every_pod(endpoint: str, rev: int, count: int) -> None:
    """A range over the pods written answers at ``rev`` with ``count`` keys."""
    with grpc.insecure_channel(endpoint) as ch:
        r = pbg.KVStub(ch).Range(pb.RangeRequest(key=b"/registry/pods/ns/", range_end=b"/registry/pods/ns0"),
                                 timeout=10)
    assert r.header.revision == rev and len(r.kvs) == count


def resync_line(follower, timeout: float = 60) -> tuple[str, int, int]:
    """Wait (the follower running all along) for its one WARNING line saying it resynchronised
    from a checkpoint; that line and the revisions it names (old, new)."""
    deadline = time.monotonic() + timeout
    while "follower resynchronised from a checkpoint" not in follower.log_tail(50):
        assert follower.running() and time.monotonic() < deadline, follower.log_tail(50)
        time.sleep(0.1)
    line = next(x for x in follower.log_tail(50).splitlines() if "follower resynchronised" in x)
    old_rev, new_rev = map(int, re.search(r"old_rev=(\d+) new_rev=(\d+)", line).groups())
    assert "WARNING" in line, line
    return line, old_rev, new_rev


def falls_behind_then_resyncs_in_process(writer, follower) -> None:
    """Both started (the writer with small checkpoints). The follower paused (SIGSTOP) while the
    writer writes past several checkpoints that release what it was to read next: when it runs
    again it rebuilds its state from the newest checkpoint without exiting (one WARNING line with
    both revisions) rather than serve a state with holes, and serves every write."""
    try:
        with grpc.insecure_channel(writer.endpoint) as ch:
            put(pbg.KVStub(ch), b"/registry/pods/ns/before", b"v")
        time.sleep(0.2)
        os.kill(follower.pid, signal.SIGSTOP)
        rev = write_past_checkpoints(writer.endpoint)
        os.kill(follower.pid, signal.SIGCONT)
        line, old_rev, new_rev = resync_line(follower)
        assert "JournalGap" in line and old_rev < new_rev <= rev, line
        serves_every_pod(follower.endpoint, rev, 42)
        assert follower.running()
    finally:
        resume_and_stop(follower, writer)


def resume_and_stop(*servers, kill: bool = False) -> None:
    """Stop each server (by PID; ``kill``: SIGKILL), resuming it first if a test paused it."""
    for s in servers:
        if s.running():
            os.kill(s.pid, signal.SIGCONT)
        s.kill() if kill else s.stop()


def member_list_names_the_writer_and_its_followers(writer, followers) -> None:
    """MemberList on any serving process lists the writer and the followers with their client URLs
    (sorted by id, as etcd), and Status on each names the writer as the leader; a stopped follower
    drops out."""
    servers = [writer, *followers]

    def members(endpoint: str) -> dict[int, list[str]]:
        with grpc.insecure_channel(endpoint) as ch:
            got = pbg.ClusterStub(ch).MemberList(pb.MemberListRequest(), timeout=10).members
        assert [m.ID for m in got] == sorted(m.ID for m in got)
        return {m.ID: list(m.clientURLs) for m in got}

    ids = {}
    for s in servers:
        with grpc.insecure_channel(s.endpoint) as ch:
            status = pbg.MaintenanceStub(ch).Status(pb.StatusRequest(), timeout=10)
        ids[s.endpoint] = status.header.member_id
        if s is writer:
            leader = status.header.member_id
        assert status.leader == leader
    want = {ids[s.endpoint]: [s.client_url] for s in servers}
    deadline = time.monotonic() + 15
    while any(members(s.endpoint) != want for s in servers):  # each announces itself every 2 s
        assert time.monotonic() < deadline, [members(s.endpoint) for s in servers]
        time.sleep(0.5)
    followers[1].stop()
    del want[ids[followers[1].endpoint]]
    deadline = time.monotonic() + 30
    while members(writer.endpoint) != want:  # its entry lapses 10 s after its last announcement
        assert time.monotonic() < deadline, members(writer.endpoint)
        time.sleep(0.5)


def watch_differential_through(etcd_endpoint: str, follower_endpoint: str, seed: int) -> None:
    """The watch differential's seeded script with shardetcd's side on a follower: its
    watches, control responses and header revisions must be etcd's."""
    from tests.integration.test_watch_differential import Harness, Script, _check

    h = Harness(etcd_endpoint, follower_endpoint)
    try:
        Script(h, seed).run(n_writes=200, n_watches=25)
        _check(h)
        assert sum(len(h.sides[0].events(w, 0)) for w in h.watches) > 200  # the script watched something
    finally:
        h.close()


def a_watch_resumes_across_a_follower_restart(writer, follower) -> None:
    """Puts go on through the writer while a watch on the follower runs; the follower is
    killed with -9 mid-stream and started again, and the watch is created again on it from
    the revision after the last event it delivered (as etcd's clients resume a broken watch).
    Together the two watches deliver exactly the acknowledged puts, in order, once each."""
    prefix, end = b"/registry/pods/resume/", b"/registry/pods/resume0"
    acked: list[int] = []
    stop = threading.Event()

    def write() -> None:
        with grpc.insecure_channel(writer.endpoint) as ch:
            kv = pbg.KVStub(ch)
            i = 0
            while not stop.is_set():
                acked.append(put(kv, prefix + b"k%d" % (i % 7), b"%d" % i))
                i += 1

    with grpc.insecure_channel(follower.endpoint) as ch:
        first = WatchClient(ch)
        first.create(prefix, end, prev_kv=True)
        first.wait_for(lambda rs: any(r.created for r in rs), timeout=30)
        writing = threading.Thread(target=write)
        writing.start()
        try:
            first.wait_for(lambda rs: sum(len(r.events) for r in rs) >= 80, timeout=60)
            follower.kill()
            before = [e.kv.mod_revision for e in first.events()]
            first.close()
        except BaseException:
            stop.set()
            writing.join(30)
            raise
    try:
        follower.start()
        with grpc.insecure_channel(follower.endpoint) as ch:
            second = WatchClient(ch)
            second.create(prefix, end, start_revision=before[-1] + 1, prev_kv=True)
            second.wait_for(lambda rs: sum(len(r.events) for r in rs) >= 80, timeout=60)
            stop.set()
            writing.join(30)
            assert not writing.is_alive()
            second.wait_for(lambda rs: sum(len(r.events) for r in rs) >= len([r for r in acked if r > before[-1]]),
                            timeout=30)
            time.sleep(0.5)  # a bound for anything extra to arrive, not a claim about speed
            after = second.events()
            assert second.error is None
            second.close()
    finally:
        stop.set()
        writing.join(30)
    assert before + [e.kv.mod_revision for e in after] == acked
    assert all(e.prev_kv.mod_revision < e.kv.mod_revision for e in after if e.prev_kv.key)


NO_LEADER = (grpc.StatusCode.UNAVAILABLE, "etcdserver: no leader")
REQUIRE_LEADER = ("hasleader", "true")  # clientv3.WithRequireLeader's metadata (kube-apiserver's watches)


def wait_until(what: str, check, timeout: float = 60.0):
    """Until ``check()`` is true; returns what it returned."""
    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(0.1)
    return got


def require_leader_watches_end_and_come_back(follower: str, writer: str, lose, regain,
                                             key: bytes = b"/registry/configmaps/default/owner") -> None:
    """Once ``lose()`` leaves the follower without a leader, as an etcd member that lost its
    leader it ends its watches opened WithRequireLeader with "no leader" and refuses new
    ones, while other watches stay open; after ``regain()`` it accepts them again, and
    both kinds see a write made then on ``writer``."""
    with grpc.insecure_channel(follower) as ch:
        led, free = WatchClient(ch, metadata=(REQUIRE_LEADER,)), WatchClient(ch)
        for w in (led, free):
            w.create(key)
            w.wait_for(lambda rs: any(r.created for r in rs))
        lose()
        wait_until("the require-leader watch to end", lambda: led.error is not None, timeout=30)
        assert (led.error.code(), led.error.details()) == NO_LEADER
        refused_watch = WatchClient(ch, metadata=(REQUIRE_LEADER,))
        wait_until("a new require-leader watch to be refused", lambda: refused_watch.error is not None, timeout=10)
        assert (refused_watch.error.code(), refused_watch.error.details()) == NO_LEADER
        assert free.error is None and free._thread.is_alive()
        regain()
        deadline = time.monotonic() + 30
        while True:  # until the follower knows a leader again
            again = WatchClient(ch, metadata=(REQUIRE_LEADER,))
            again.create(key)
            try:
                again.wait_for(lambda rs: any(r.created for r in rs), timeout=2)
                break
            except AssertionError:
                assert again.error is not None and (again.error.code(), again.error.details()) == NO_LEADER
                assert time.monotonic() < deadline, "the follower did not accept a require-leader watch again"
                time.sleep(0.5)
        with grpc.insecure_channel(writer) as wch:
            rev = pbg.KVStub(wch).Put(pb.PutRequest(key=key, value=b"after"), timeout=10).header.revision
        for w in (again, free):
            w.wait_for(lambda rs: any(e.kv.mod_revision == rev for r in rs for e in r.events), timeout=30)
        again.close()
        free.close()


def auth_changes_decide_the_next_call_on_the_follower(follower) -> None:
    """Through ``follower``: auth enabled, then a read permission granted and revoked ten times;
    the very next read there (serializable and linearizable in turn) is allowed or refused
    accordingly. An auth change is a journal record with no revision of its own: a follower
    answers it once it has read it, as an etcd member answers once it has applied the entry."""
    with grpc.insecure_channel(follower.endpoint) as ch:
        auth, kv = pbg.AuthStub(ch), pbg.KVStub(ch)
        put(kv, b"/registry/pods/a", b"v")
        auth.RoleAdd(pb.AuthRoleAddRequest(name="root"), timeout=10)
        auth.UserAdd(pb.AuthUserAddRequest(name="root", password="rootpw"), timeout=10)
        auth.UserGrantRole(pb.AuthUserGrantRoleRequest(user="root", role="root"), timeout=10)
        auth.RoleAdd(pb.AuthRoleAddRequest(name="reader"), timeout=10)
        auth.UserAdd(pb.AuthUserAddRequest(name="alice", password="alicepw"), timeout=10)
        auth.UserGrantRole(pb.AuthUserGrantRoleRequest(user="alice", role="reader"), timeout=10)
        auth.AuthEnable(pb.AuthEnableRequest(), timeout=10)
        root = (("token", auth.Authenticate(pb.AuthenticateRequest(name="root", password="rootpw"), timeout=10).token),)
        alice = (("token", auth.Authenticate(pb.AuthenticateRequest(name="alice", password="alicepw"),
                                             timeout=10).token),)
        perm = auth_pb2.Permission(permType=auth_pb2.Permission.READ, key=b"/registry/pods/a")
        for i in range(10):
            auth.RoleGrantPermission(pb.AuthRoleGrantPermissionRequest(name="reader", perm=perm), metadata=root,
                                     timeout=10)
            got = kv.Range(pb.RangeRequest(key=b"/registry/pods/a", serializable=i % 2 == 0), metadata=alice,
                           timeout=10)
            assert [x.value for x in got.kvs] == [b"v"]
            auth.RoleRevokePermission(pb.AuthRoleRevokePermissionRequest(role="reader", key=b"/registry/pods/a"),
                                      metadata=root, timeout=10)
            with pytest.raises(grpc.RpcError) as err:
                kv.Range(pb.RangeRequest(key=b"/registry/pods/a", serializable=i % 2 == 1), metadata=alice,
                         timeout=10)
            assert (err.value.code(), err.value.details()) == (grpc.StatusCode.PERMISSION_DENIED,
                                                               "etcdserver: permission denied")


class KeepAliveStream:
    """One LeaseKeepAlive stream, a keep-alive at a time: ``ttl(lease)`` sends one, returns the TTL answered."""

    def __init__(self, channel) -> None:
        self.requests: queue.Queue = queue.Queue()
        self.answers = pbg.LeaseStub(channel).LeaseKeepAlive(iter(self.requests.get, None), timeout=60)

    def ttl(self, lease_id: int) -> int:
        self.requests.put(pb.LeaseKeepAliveRequest(ID=lease_id))
        answer = next(self.answers)
        assert answer.ID == lease_id
        return answer.TTL

    def close(self) -> None:
        self.requests.put(None)


def a_revoked_lease_is_kept_alive_no_more_through_the_follower(writer, follower) -> None:
    """A 60 s lease kept alive through ``follower`` (which then answers its keep-alives itself):
    revoked through the follower, the next keep-alive there answers TTL 0, as etcd does; revoked
    through the writer, a keep-alive there answers TTL 0 once the follower has read the revoke,
    not the 60 s the follower would otherwise vouch for it."""
    with grpc.insecure_channel(writer.endpoint) as wch, grpc.insecure_channel(follower.endpoint) as fch:
        stream = KeepAliveStream(fch)
        try:
            for revoked_through in (fch, wch):
                lease_id = pbg.LeaseStub(fch).LeaseGrant(pb.LeaseGrantRequest(TTL=60), timeout=10).ID
                for _ in range(3):  # the first waits for the writer's answer; later ones are answered here
                    assert stream.ttl(lease_id) == 60
                    time.sleep(0.6)
                pbg.LeaseStub(revoked_through).LeaseRevoke(pb.LeaseRevokeRequest(ID=lease_id), timeout=10)
                if revoked_through is fch:
                    assert stream.ttl(lease_id) == 0
                else:
                    wait_until("a keep-alive answered TTL 0", lambda: stream.ttl(lease_id) == 0, timeout=10)
        finally:
            stream.close()


def waited_for_a_lock_and_a_leadership(endpoint: str, held_s: float, meanwhile=lambda: None
                                       ) -> tuple[list[str], list[str]]:
    """Through ``endpoint``: a lock and an election's leadership, each held by one client while a
    second asks for it with no deadline (as ``etcdctl lock`` and ``elect`` do); ``meanwhile()``
    runs, and once the holders have held on for ``held_s`` they give them up (the lock unlocked,
    the leader resigned) on the same endpoint. What the waiting clients got (the lock's key and
    the leader's key, or their errors), and what they should have got."""
    from proto import v3election_pb2 as epb, v3election_pb2_grpc as epbg, v3lock_pb2 as lpb, v3lock_pb2_grpc as lpbg

    with grpc.insecure_channel(endpoint) as ch:
        leases = pbg.LeaseStub(ch)
        held, waiting, impatient = (leases.LeaseGrant(pb.LeaseGrantRequest(TTL=120), timeout=10).ID for _ in range(3))
        lock, election = lpbg.LockStub(ch), epbg.ElectionStub(ch)
        mine = lock.Lock(lpb.LockRequest(name=b"the-lock", lease=held), timeout=10).key
        leader = election.Campaign(epb.CampaignRequest(name=b"the-election", lease=held, value=b"first"),
                                   timeout=10).leader
        got: dict[str, str] = {}

        def wait(what: str, call) -> None:
            try:
                got[what] = call()
            except grpc.RpcError as exc:
                got[what] = f"{exc.code().name}: {exc.details()}"

        waiters = [threading.Thread(target=wait, args=("lock", lambda: "key " + lock.Lock(
                       lpb.LockRequest(name=b"the-lock", lease=waiting)).key.decode())),
                   threading.Thread(target=wait, args=("leader", lambda: "leader " + election.Campaign(
                       epb.CampaignRequest(name=b"the-election", lease=waiting, value=b"second")).leader.key.decode()))]
        for t in waiters:
            t.start()
        started = time.monotonic()
        meanwhile()
        time.sleep(max(held_s - (time.monotonic() - started), 0))
        assert not got, got  # neither is had while it is held
        # a client that gives up waiting (cancels: no deadline) takes its place in the queue with it
        gave_up = lock.Lock.future(lpb.LockRequest(name=b"the-lock", lease=impatient))
        time.sleep(1)
        assert gave_up.cancel() and not got, got

        def queue() -> list[bytes] | None:
            r = pbg.KVStub(ch).Range(pb.RangeRequest(key=b"the-lock/", range_end=b"the-lock0"), timeout=10)
            return sorted(kv.key for kv in r.kvs) if len(r.kvs) == 2 else None

        queued = wait_until("the lock's queue without the client that gave up", queue, timeout=30)
        assert queued == sorted(b"the-lock/%x" % lease for lease in (held, waiting)), queued
        lock.Unlock(lpb.UnlockRequest(key=mine), timeout=30)
        election.Resign(epb.ResignRequest(leader=leader), timeout=30)
        for t in waiters:
            t.join(60)
        return ([got.get("lock", "no answer"), got.get("leader", "no answer")],
                [f"key the-lock/{waiting:x}", f"leader the-election/{waiting:x}"])
