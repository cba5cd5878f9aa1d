"""Followers (issue 17, first part): processes that serve reads and watches from
the writer's JetStream journals and hand everything else to the writer.

On three real NATS servers: etcd 3.5.1's answers through a follower (the KV
differential), a linearizable history from clients spread over the writer and
two followers while a follower is killed and restarted, and watches on
followers that see every write once, in order, under 32 writers.
"""
from __future__ import annotations

import math
import threading
import time

import grpc
import pytest

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.etcd_fixture import free_port
from tests.integration.diffkit import run_differential
from tests.integration.followkit import (cluster_followers_serve_their_partition,
                                         falls_behind_then_restarts_from_the_newest_checkpoint,
                                         member_list_names_the_writer_and_its_followers,
                                         watches_see_every_write_once_in_order)
from tests.integration.test_linearizability import check_linearizable, client
from tests.lincheck import Op
from tests.nats_fixture import shardetcd_on as server_on, wait_standing_by
from tests.watch_client import WatchClient




@pytest.fixture
def writer_and_followers(nats, tmp_path):
    writer = server_on(nats, tmp_path / "w").start()
    followers = [server_on(nats, tmp_path / f"f{i}", "--follow").start() for i in range(2)]
    yield writer, followers
    for s in (*followers, writer):
        s.stop()


@pytest.mark.parametrize("seed", [11, 12])
def test_a_follower_answers_as_etcd(real_etcd, writer_and_followers, seed):
    """The seeded KV differential (ranges serializable and not, puts, deletes,
    txns, compactions, bad input) through a follower gives etcd 3.5.1's answers:
    writes go to the writer, and a client reads what it wrote through the same
    member, as on an etcd member."""
    writer, followers = writer_and_followers
    run_differential(real_etcd.endpoint, followers[seed % 2].endpoint, seed, 600)
    with grpc.insecure_channel(followers[0].endpoint) as ch:
        status = pbg.MaintenanceStub(ch).Status(pb.StatusRequest(), timeout=10)
    with grpc.insecure_channel(writer.endpoint) as ch:
        writer_id = pbg.MaintenanceStub(ch).Status(pb.StatusRequest(), timeout=10).header.member_id
    assert status.leader == writer_id != status.header.member_id  # the writer is the leader


def test_history_over_writer_and_followers_is_linearizable(writer_and_followers, tmp_path):
    """Six clients: two on the writer, two on each follower; linearizable reads
    on a follower go through the writer's committed revision, writes through
    the writer. Follower 1 is killed and restarted mid-run. Every key's history
    is linearizable against a register."""
    writer, followers = writer_and_followers
    endpoints = [writer.endpoint] * 2 + [followers[0].endpoint] * 2 + [followers[1].endpoint] * 2
    history: list[tuple[bytes, Op]] = []
    stop = threading.Event()
    threads = [threading.Thread(target=client, args=(ep, c, stop, history, 5)) for c, ep in enumerate(endpoints)]
    for t in threads:
        t.start()
    time.sleep(2.5)
    followers[1].kill()
    followers[1].restart()
    time.sleep(2.5)
    stop.set()
    for t in threads:
        t.join(30)
    done = [op for _, op in history if not math.isinf(op.ret)]
    assert len(done) > 150, "too little traffic to say anything"
    assert {op.client for op in done} == set(range(6))
    check_linearizable(history, tmp_path, "follower-history")


def test_watches_on_followers_see_every_write_once_in_order(writer_and_followers):
    """32 writers on the writer; 1,000 watchers over 8 streams on the two
    followers, each on one writer's keys; every watcher sees exactly that
    writer's acknowledged puts, in revision order, nothing twice."""
    writer, followers = writer_and_followers
    watches_see_every_write_once_in_order(followers, [writer.endpoint], watchers=1000, streams=8, writers=32)


def test_a_follower_serves_through_a_writer_takeover(nats, tmp_path):
    """Writer, standby and a follower; a watch on the follower and writes through
    it. kill -9 of the writer: the standby takes over, the follower finds the new
    writer (writes through it succeed again, with the next revisions), and its
    watch delivers every acknowledged write once, in order, across the takeover."""
    writer = server_on(nats, tmp_path / "w").start()
    follower = server_on(nats, tmp_path / "f", "--follow").start()
    standby = server_on(nats, tmp_path / "s", "--standby").start(wait=False)
    try:
        wait_standing_by(standby)
        with grpc.insecure_channel(follower.endpoint) as ch:
            kv = pbg.KVStub(ch)
            watch = WatchClient(ch)
            watch.create(b"/registry/pods/t/", b"/registry/pods/t0")
            watch.wait_for(lambda rs: any(r.created for r in rs))
            acked = [kv.Put(pb.PutRequest(key=b"/registry/pods/t/k%d" % (i % 5), value=b"%d" % i), timeout=10).header.revision
                     for i in range(30)]
            writer.kill()
            deadline = time.monotonic() + 60
            while True:  # writes through the follower, until the new writer takes them
                try:
                    acked.append(kv.Put(pb.PutRequest(key=b"/registry/pods/t/after", value=b"x"), timeout=5).header.revision)
                    break
                except grpc.RpcError as exc:
                    assert exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), exc
                    assert time.monotonic() < deadline, (follower.log_tail(), standby.log_tail())
                    time.sleep(0.2)
            acked += [kv.Put(pb.PutRequest(key=b"/registry/pods/t/k%d" % i, value=b"after"), timeout=10).header.revision
                      for i in range(10)]
            assert acked == sorted(acked) and len(set(acked)) == len(acked)
            watch.wait_for(lambda rs: len([e for r in rs for e in r.events]) >= len(acked), timeout=30)
            time.sleep(0.5)  # a bound for anything extra to arrive, not a claim about speed
            assert [e.kv.mod_revision for e in watch.events()] == acked
            assert watch.error is None
            watch.close()
            r = kv.Range(pb.RangeRequest(key=b"/registry/pods/t/", range_end=b"/registry/pods/t0"), timeout=10)
            assert r.header.revision == acked[-1] and len(r.kvs) == 11  # k0..k9 and "after"
        assert "took over as the writer" in standby.log_tail(200)
    finally:
        for s in (follower, standby, writer):
            s.kill()


def test_keepalives_through_a_follower_are_coalesced(nats, tmp_path):
    """A client keeps a 3 s lease alive through a follower with a keep-alive every
    50 ms for 5 s: every answer carries the TTL, the lease outlives its TTL at the
    writer, and the writer handled about one renewal per 0.5 s batch, not one per
    client keep-alive."""
    import urllib.request

    metrics = free_port()
    writer = server_on(nats, tmp_path / "w", "--listen-metrics-urls", f"http://127.0.0.1:{metrics}").start()
    follower = server_on(nats, tmp_path / "f", "--follow").start()

    def renewed() -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as r:
            line = next(l for l in r.read().decode().splitlines() if l.startswith("etcd_debugging_lease_renewed_total "))
        return float(line.split()[1])

    try:
        with grpc.insecure_channel(follower.endpoint) as ch:
            lease = pbg.LeaseStub(ch)
            lease_id = lease.LeaseGrant(pb.LeaseGrantRequest(TTL=3), timeout=10).ID
            before = renewed()

            def requests():
                end = time.monotonic() + 5
                while time.monotonic() < end:
                    yield pb.LeaseKeepAliveRequest(ID=lease_id)
                    time.sleep(0.05)

            answers = list(lease.LeaseKeepAlive(requests(), timeout=30))
        at_writer = renewed() - before
        assert len(answers) >= 50 and all(a.ID == lease_id and a.TTL == 3 for a in answers)
        with grpc.insecure_channel(writer.endpoint) as ch:
            ttl = pbg.LeaseStub(ch).LeaseTimeToLive(pb.LeaseTimeToLiveRequest(ID=lease_id), timeout=10)
        assert ttl.TTL > 0 and ttl.grantedTTL == 3  # 5 s after a 3 s grant: renewed at the writer
        assert 3 <= at_writer <= 5 / 0.5 + 4, (at_writer, len(answers))
    finally:
        follower.stop()
        writer.stop()


def test_member_list_names_the_writer_and_its_followers(writer_and_followers):
    """Every serving process is an etcd member: MemberList on any of them lists the
    writer and both followers with their client URLs (sorted by id, as etcd), and
    Status on each names the writer as the leader; a stopped follower drops out."""
    writer, followers = writer_and_followers
    member_list_names_the_writer_and_its_followers(writer, followers)

def test_cluster_starts_followers_per_partition_and_lists_them_for_kube_apiserver(nats, tmp_path):
    """`shardetcd cluster --journal-url ... --followers 1`: each partition gets a
    follower on a port of its own; the kube-apiserver flags list the writer and
    its follower for every partition; a follower reads and writes its own
    partition, and hands a write to another partition's resource to its writer,
    which refuses it as a writer does."""
    from tests.integration.test_cluster import Cluster

    cluster = Cluster(tmp_path)
    cluster.argv += ["--journal-url", nats.urls, "--followers", "1"]
    cluster_followers_serve_their_partition(cluster)


def test_a_follower_that_falls_behind_the_checkpoints_stops_and_restarts_from_the_newest(nats, tmp_path):
    """A follower paused (SIGSTOP) while the writer writes past several checkpoints,
    each purging the journal it covers: when it runs again it finds messages
    missing that its checkpoint does not cover, and stops (exit 1, one line)
    rather than serve a state with holes; started again, it loads the newest
    checkpoint and serves every write."""
    writer = server_on(nats, tmp_path / "w", "--checkpoint-journal-bytes", "65536").start()
    follower = server_on(nats, tmp_path / "f", "--follow").start()
    falls_behind_then_restarts_from_the_newest_checkpoint(writer, follower)
    assert "expected message" in follower.log_tail(200)


def test_history_over_followers_is_linearizable_across_a_writer_takeover(nats, tmp_path):
    """Clients on two followers (and two on the writer until it dies); kill -9 of
    the writer mid-run, a standby takes over, the followers find it: every key's
    history is linearizable, writes whose answers were lost included."""
    writer = server_on(nats, tmp_path / "w").start()
    followers = [server_on(nats, tmp_path / f"f{i}", "--follow").start() for i in range(2)]
    standby = server_on(nats, tmp_path / "s", "--standby").start(wait=False)
    try:
        wait_standing_by(standby)
        endpoints = [writer.endpoint] * 2 + [followers[0].endpoint] * 2 + [followers[1].endpoint] * 2
        history: list = []
        stop = threading.Event()
        threads = [threading.Thread(target=client, args=(ep, c, stop, history, 10)) for c, ep in enumerate(endpoints)]
        for t in threads:
            t.start()
        time.sleep(2.5)
        writer.kill()
        killed = time.monotonic()
        time.sleep(7.5)  # the lease lapses (~3 s), the standby takes over, the followers find it
        stop.set()
        for t in threads:
            t.join(60)
        after_kill = [op for _, op in history if op.client >= 2 and op.kind != "get" and not math.isinf(op.ret)
                      and op.call > killed]
        assert after_kill, "no write through a follower succeeded after the takeover"
        check_linearizable(history, tmp_path, "takeover-history")
        assert "took over as the writer" in standby.log_tail(200)
    finally:
        for s in (*followers, standby, writer):
            s.kill()
