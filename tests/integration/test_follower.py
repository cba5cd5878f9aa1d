"""Followers (issue 17, first part): processes that serve reads and watches from
the writer's JetStream journals and hand everything else to the writer.

On three real NATS servers: etcd 3.5.1's answers through a follower (the KV
differential), a linearizable history from clients spread over the writer and
two followers while a follower is killed and restarted, and watches on
followers that see every write once, in order, under 32 writers.
"""
from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
import time

import grpc
import pytest

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.etcd_fixture import free_port
from tests.integration.diffkit import run_differential
from tests.integration.followkit import (a_revoked_lease_is_kept_alive_no_more_through_the_follower,
                                         a_watch_resumes_across_a_follower_restart, put,
                                         auth_changes_decide_the_next_call_on_the_follower, resume_and_stop, wait_until,
                                         serves_every_pod, waited_for_a_lock_and_a_leadership,
                                         write_past_checkpoints,
                                         cluster_followers_serve_their_partition,
                                         member_list_names_the_writer_and_its_followers, resync_line,
                                         watch_differential_through,
                                         watches_see_every_write_once_in_order, writes_and_a_watch_across_a_takeover)
from tests.integration.test_etcdctl import etcdctl_bin  # noqa: F401 - a fixture
from tests.integration.test_linearizability import check_linearizable, client
from tests.lincheck import Op
from tests.integration.test_jetstream_faults import nats_call
from tests.nats_fixture import shardetcd_on as server_on, wait_standing_by
from tests.watch_client import WatchClient




@pytest.fixture
def writer_and_followers(nats, tmp_path):
    started = []
    try:
        for name, flags in (("w", ()), ("f0", ("--follow",)), ("f1", ("--follow",))):
            started.append(server_on(nats, tmp_path / name, *flags))
            started[-1].start()
        yield started[0], started[1:]
    finally:  # also when one of them did not start
        for s in reversed(started):
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


def test_watches_on_a_follower_answer_as_etcd(real_etcd, writer_and_followers):
    """The seeded watch differential (live and historical watches, filters, prev_kv,
    cancels, progress, a compaction) through a JetStream follower gives etcd 3.5.1's
    watch responses; its writes are handed to the writer."""
    writer, followers = writer_and_followers
    watch_differential_through(real_etcd.endpoint, followers[0].endpoint, 14)


def test_a_watch_resumes_across_a_follower_restart(writer_and_followers):
    """kill -9 of a JetStream follower under a running watch and writes; the watch created
    again on the restarted follower from the next revision misses nothing, repeats nothing."""
    writer, followers = writer_and_followers
    a_watch_resumes_across_a_follower_restart(writer, followers[1])


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
    watch delivers every acknowledged write once, in order, across the takeover. The
    follower reports the writer's raft term, before and after (etcd's members report
    one term)."""
    writer = server_on(nats, tmp_path / "w").start()
    follower = server_on(nats, tmp_path / "f", "--follow").start()
    standby = server_on(nats, tmp_path / "s", "--standby").start(wait=False)

    def term(endpoint: str) -> tuple[int, int]:
        with grpc.insecure_channel(endpoint) as ch:
            status = pbg.MaintenanceStub(ch).Status(pb.StatusRequest(), timeout=10)
            header = pbg.KVStub(ch).Range(pb.RangeRequest(key=b"t", serializable=True), timeout=10).header
        return status.raftTerm, header.raft_term

    try:
        wait_standing_by(standby)
        with grpc.insecure_channel(follower.endpoint) as ch:
            def before_kill(kv, acked) -> None:
                assert term(follower.endpoint) == term(writer.endpoint)

            writes_and_a_watch_across_a_takeover(ch, writer.kill, (follower.log_tail, standby.log_tail), before_kill)
        assert "took over as the writer" in standby.log_tail(200)
        new_term = term(standby.endpoint)
        assert term(follower.endpoint) == new_term and new_term[0] > 1
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


def test_only_the_writer_answers_the_read_index_and_forwarded_calls(nats, writer_and_followers):
    """After a takeover the writer record in NATS names the old writer's address until the new
    writer rewrites it; the old writer, restarted there as a follower, may serve meanwhile. A
    follower asked for the read index, or handed a call another follower forwarded, refuses
    ("not the writer"), and the asking follower looks the writer up again until the record
    names it. Before, the follower there answered the read index with its own revision (a
    stale linearizable read in tests/chaos.py) and handed a forwarded write on again."""
    import asyncio
    import json

    from journal.jetstream import JetStreamConfig, JetStreamLog
    from shim.access import FORWARDED_METADATA_MARK
    from shim.context import READ_INDEX_METADATA
    from shim.errors import NOT_THE_WRITER
    from shim.follower import writer_key

    writer, (f0, f1) = writer_and_followers
    for md, call in (((READ_INDEX_METADATA,), lambda ch, md: pbg.MaintenanceStub(ch).Status(
                         pb.StatusRequest(), metadata=md, timeout=10)),
                     ((FORWARDED_METADATA_MARK,), lambda ch, md: pbg.KVStub(ch).Put(
                         pb.PutRequest(key=b"/registry/pods/ns/fwd", value=b"v"), metadata=md, timeout=10))):
        with grpc.insecure_channel(f1.endpoint) as ch, pytest.raises(grpc.RpcError) as refused:
            call(ch, md)
        assert (refused.value.code(), refused.value.details()) == (grpc.StatusCode.UNAVAILABLE, NOT_THE_WRITER)
        with grpc.insecure_channel(writer.endpoint) as ch:
            assert call(ch, md).header.revision > 0
    with grpc.insecure_channel(f1.endpoint) as ch, pytest.raises(grpc.RpcError) as refused:
        list(pbg.LeaseStub(ch).LeaseKeepAlive(iter([pb.LeaseKeepAliveRequest(ID=1)]),
                                              metadata=(FORWARDED_METADATA_MARK,), timeout=10))
    assert (refused.value.code(), refused.value.details()) == (grpc.StatusCode.UNAVAILABLE, NOT_THE_WRITER)

    async def meta(key, value=None):
        log = await JetStreamLog(JetStreamConfig(urls=tuple(nats.urls.split(",")), replicas=3)).connect()
        try:
            return await log.get_meta(key) if value is None else await log.put_meta(key, value)
        finally:
            await log.close()

    key = writer_key("writer")
    record = asyncio.run(meta(key))
    asyncio.run(meta(key, json.dumps(json.loads(record) | {"urls": [f"http://{f1.endpoint}"]})))
    f0.stop()
    f0.start(wait=False)  # its link reads the record afresh: it names f1 (no linearizable probe answers yet)
    deadline = time.monotonic() + 30
    while "shardetcd serving the etcd v3 API" not in f0.log_tail(20).split("=== start")[-1]:
        assert f0.running() and time.monotonic() < deadline, f0.log_tail()
        time.sleep(0.1)
    restored = threading.Event()

    def restore() -> None:
        time.sleep(1.5)
        asyncio.run(meta(key, record))
        restored.set()

    with grpc.insecure_channel(writer.endpoint) as ch:
        rev = put(pbg.KVStub(ch), b"/registry/pods/ns/k", b"latest")
    fixer = threading.Thread(target=restore)
    fixer.start()
    try:
        with grpc.insecure_channel(f0.endpoint) as ch:
            got = pbg.KVStub(ch).Range(pb.RangeRequest(key=b"/registry/pods/ns/k"), timeout=20)
            assert restored.is_set()  # f1 did not answer the read index in the writer's place
            assert got.kvs[0].value == b"latest" and got.header.revision >= rev
            assert put(pbg.KVStub(ch), b"/registry/pods/ns/k", b"after") > rev
    finally:
        fixer.join()


def test_a_revoked_lease_is_kept_alive_no_more_through_a_follower(writer_and_followers):
    """Keep-alives through a JetStream follower answer TTL 0 once the lease is revoked, through it or the writer."""
    writer, followers = writer_and_followers
    a_revoked_lease_is_kept_alive_no_more_through_the_follower(writer, followers[0])


def test_auth_changes_through_a_follower_decide_the_next_call_on_it(writer_and_followers):
    """Auth enabled, and a read permission granted and revoked ten times, through a JetStream
    follower: the very next read there is allowed or refused accordingly."""
    auth_changes_decide_the_next_call_on_the_follower(writer_and_followers[1][0])


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


def _metric(url: str, name: str) -> float:
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


def test_a_follower_that_falls_behind_the_checkpoints_resyncs_in_process(nats, tmp_path):
    """A follower paused (SIGSTOP) while the writer writes past several checkpoints,
    each purging the journal it covers: when it runs again it finds messages
    missing, rebuilds its state from the newest checkpoint without exiting (one
    WARNING line with both revisions, a resync counted in /metrics), serves
    every write at the writer's revision, and a watch opened before the pause
    delivers every write once, in order (the checkpoint keeps the history).
    Paused again while the writer compacts past that watch's next revision:
    the watch is cancelled with etcd's compact_revision; a new one works."""
    import signal

    metrics = free_port()
    url = f"http://127.0.0.1:{metrics}"
    writer = server_on(nats, tmp_path / "w", "--checkpoint-journal-bytes", "65536").start()
    follower = server_on(nats, tmp_path / "f", "--follow", "--listen-metrics-urls", url).start()
    prefix, end = b"/registry/pods/ns/", b"/registry/pods/ns0"
    try:
        with grpc.insecure_channel(writer.endpoint) as wch, grpc.insecure_channel(follower.endpoint) as fch:
            kv, fkv = pbg.KVStub(wch), pbg.KVStub(fch)
            acked = [kv.Put(pb.PutRequest(key=prefix + b"first", value=b"v"), timeout=10).header.revision]
            watch = WatchClient(fch)
            watch.create(prefix, end)
            created = watch.wait_for(lambda rs: any(r.created for r in rs))
            # the watch starts after the follower's revision then, which may not hold the first put
            # yet (the follower applies what the writer journals a little later, as an etcd member)
            start = next(r for r in created if r.created).header.revision
            assert start in (acked[0] - 1, acked[0])

            def writes(n: int) -> None:
                for i in range(n):  # ~1 KiB each into the pods journal: several checkpoints and purges
                    acked.append(kv.Put(pb.PutRequest(key=prefix + b"p%d" % (i % 40), value=b"v" * 1000),
                                        timeout=10).header.revision)

            os.kill(follower.pid, signal.SIGSTOP)
            writes(300)
            os.kill(follower.pid, signal.SIGCONT)
            line, old_rev, new_rev = resync_line(follower)
            # paused right after the watch's creation, the follower may not hold the first put either
            assert start <= old_rev < new_rev <= acked[-1], line
            r = fkv.Range(pb.RangeRequest(key=prefix, range_end=end), timeout=10)
            assert r.header.revision == acked[-1] and len(r.kvs) == 41
            expected = [rev for rev in acked if rev > start]
            watch.wait_for(lambda rs: len([e for x in rs for e in x.events]) >= len(expected), timeout=30)
            time.sleep(0.5)  # a bound for anything extra to arrive, not a claim about speed
            assert [e.kv.mod_revision for e in watch.events()] == expected
            assert _metric(url, "shardetcd_follower_resyncs_total") == 1

            os.kill(follower.pid, signal.SIGSTOP)
            writes(300)
            compact = acked[-1]
            kv.Compact(pb.CompactionRequest(revision=compact), timeout=10)
            writes(100)
            os.kill(follower.pid, signal.SIGCONT)
            watch.wait_for(lambda rs: any(x.canceled for x in rs), timeout=60)
            cancel = next(x for x in watch.responses if x.canceled)
            assert cancel.compact_revision == compact and cancel.watch_id == 0
            assert acked[-401] < compact  # the watch had been sent up to before the pause, below the compaction
            r = fkv.Range(pb.RangeRequest(key=prefix, range_end=end), timeout=10)
            assert r.header.revision == acked[-1] and len(r.kvs) == 41 and follower.running()
            assert _metric(url, "shardetcd_follower_resyncs_total") == 2
            again = WatchClient(fch)
            again.create(prefix, end, start_revision=compact)
            again.wait_for(lambda rs: len([e for x in rs for e in x.events]) >= 100, timeout=30)
            assert [e.kv.mod_revision for e in again.events()][-100:] == acked[-100:]
            watch.close()
            again.close()
    finally:
        resume_and_stop(follower, writer)


def test_a_followers_metrics_show_how_far_behind_it_applies(nats, tmp_path):
    """/metrics on a real follower: not the leader; applied revision, the writer's
    committed revision as learned (a linearizable read asks it), lag 0 once caught
    up; paused 1 s while the writer writes, the messages stored meanwhile are
    applied about 1 s after they were stored (the apply-lag histogram), and the
    writer's own /metrics carry etcd's committed/applied pair."""
    import signal

    url, wurl = (f"http://127.0.0.1:{p}" for p in (free_port(), free_port()))
    writer = server_on(nats, tmp_path / "w", "--listen-metrics-urls", wurl).start()
    follower = server_on(nats, tmp_path / "f", "--follow", "--listen-metrics-urls", url).start()
    try:
        with grpc.insecure_channel(writer.endpoint) as wch, grpc.insecure_channel(follower.endpoint) as fch:
            kv = pbg.KVStub(wch)
            for i in range(20):
                rev = kv.Put(pb.PutRequest(key=b"/m/k%d" % i, value=b"v"), timeout=10).header.revision
            assert pbg.KVStub(fch).Range(pb.RangeRequest(key=b"/m/k0"), timeout=10).header.revision == rev
            assert _metric(url, "etcd_server_is_leader") == 0 and _metric(wurl, "etcd_server_is_leader") == 1
            assert _metric(url, "shardetcd_follower_applied_revision") == rev
            assert _metric(url, "shardetcd_follower_writer_revision") == rev
            assert _metric(url, "etcd_server_proposals_committed_total") == rev
            assert _metric(url, "etcd_server_proposals_applied_total") == rev
            assert _metric(url, "shardetcd_follower_lag_revisions") == 0
            assert _metric(url, "shardetcd_follower_resyncs_total") == 0
            assert _metric(wurl, "etcd_server_proposals_applied_total") == rev
            assert _metric(url, "shardetcd_journal_nats_connected") == 1  # its own connection to the journals
            assert _metric(url, "shardetcd_journal_nats_disconnects_total") == 0
            applied_before = _metric(url, "shardetcd_follower_apply_lag_seconds_count")
            assert applied_before >= 1
            slow_before = applied_before - _metric_bucket(url, "shardetcd_follower_apply_lag_seconds", "0.5")
            os.kill(follower.pid, signal.SIGSTOP)
            try:
                for i in range(10):
                    rev = kv.Put(pb.PutRequest(key=b"/m/p%d" % i, value=b"v"), timeout=10).header.revision
                time.sleep(1.0)
            finally:
                os.kill(follower.pid, signal.SIGCONT)
            assert pbg.KVStub(fch).Range(pb.RangeRequest(key=b"/m/p9"), timeout=10).header.revision == rev
            count = _metric(url, "shardetcd_follower_apply_lag_seconds_count")
            slow = count - _metric_bucket(url, "shardetcd_follower_apply_lag_seconds", "0.5")
            assert count - applied_before >= 1 and slow - slow_before >= 1  # stored during the pause: > 0.5 s late
            assert _metric(url, "shardetcd_follower_last_apply_lag_seconds") > 0.5
            assert _metric(url, "shardetcd_follower_applied_revision") == rev
            assert _metric(url, "shardetcd_follower_lag_revisions") == 0
            assert _metric(url, "shardetcd_follower_lag_seconds") == 0  # nothing read is waiting
    finally:
        for s in (follower, writer):
            if s.running():
                os.kill(s.pid, signal.SIGCONT)
            s.stop()


def _metric_bucket(url: str, name: str, le: str) -> float:
    return _metric(url, f'{name}_bucket{{le="{le}"}}')


def test_a_following_standby_serves_then_takes_over_on_the_same_connections(nats, tmp_path):
    """`--follow --standby`: a follower until the writer lease is free, then the writer.
    Before the kill it serves reads and a watch and hands writes to the writer (Status names
    the writer as leader); after kill -9 of the writer it takes over, and the same client
    channel, never reconnected, writes again with the next revisions, its watch delivers every
    acknowledged write once, in order, across the takeover, and Status names it the leader
    in a higher term, which every answer's header carries; /metrics says standby, then
    leader. A plain follower finds it as the new writer."""
    metrics = f"http://127.0.0.1:{free_port()}"
    writer = server_on(nats, tmp_path / "w").start()
    standby = server_on(nats, tmp_path / "s", "--follow", "--standby", "--listen-metrics-urls", metrics).start()
    follower = server_on(nats, tmp_path / "f", "--follow").start()
    try:
        with grpc.insecure_channel(writer.endpoint) as ch:
            writer_status = pbg.MaintenanceStub(ch).Status(pb.StatusRequest(), timeout=10)
            writer_id = writer_status.header.member_id
        with grpc.insecure_channel(standby.endpoint) as ch:
            maintenance = pbg.MaintenanceStub(ch)
            status = maintenance.Status(pb.StatusRequest(), timeout=10)
            assert status.leader == writer_id != status.header.member_id
            assert (_metric(metrics, "shardetcd_standby"), _metric(metrics, "etcd_server_is_leader")) == (1, 0)

            def before_kill(kv, acked) -> None:
                r = kv.Range(pb.RangeRequest(key=b"/registry/pods/t/k4"), timeout=10)  # linearizable: the read index
                assert r.kvs[0].mod_revision == acked[-1] and r.kvs[0].value == b"29"
                assert "took over as the writer" not in standby.log_tail(200)

            acked = writes_and_a_watch_across_a_takeover(ch, writer.kill, (standby.log_tail,), before_kill)
            assert "took over as the writer" in standby.log_tail(200)
            status = maintenance.Status(pb.StatusRequest(), timeout=10)
            assert status.leader == status.header.member_id != writer_id
            assert status.raftTerm > writer_status.raftTerm
            put = pbg.KVStub(ch).Put(pb.PutRequest(key=b"/registry/pods/t/term", value=b"z"), timeout=10)
            assert put.header.raft_term == status.header.raft_term == status.raftTerm
            acked.append(put.header.revision)
            assert (_metric(metrics, "shardetcd_standby"), _metric(metrics, "etcd_server_is_leader")) == (0, 1)
        with grpc.insecure_channel(follower.endpoint) as ch:  # the follower hands its writes to the new writer
            rev = pbg.KVStub(ch).Put(pb.PutRequest(key=b"/registry/pods/t/via-follower", value=b"y"), timeout=30).header.revision
            assert rev == acked[-1] + 1
            assert pbg.MaintenanceStub(ch).Status(pb.StatusRequest(), timeout=10).leader == status.header.member_id
    finally:
        for s in (follower, standby, writer):
            s.kill()


@pytest.mark.parametrize("flags", [("--standby",), ("--follow", "--standby")], ids=["standby", "following-standby"])
def test_a_standby_behind_the_checkpoints_takes_over_from_a_rebuilt_state(nats, tmp_path, flags):
    """A standby paused (SIGSTOP) while the writer writes past several checkpoints that release
    what it was to read next, then the writer killed: when the standby runs again the lease is
    already free, and the state it follows has a gap. It rebuilds its state from the newest
    checkpoint before it takes over, and serves every acknowledged write; taking over from the
    state it had would have cut the 300 writes of the gap (found by this test: it did)."""
    writer = server_on(nats, tmp_path / "w", "--checkpoint-journal-bytes", "65536").start()
    standby = server_on(nats, tmp_path / "s", *flags).start(wait="--follow" in flags)
    try:
        if "--follow" not in flags:
            wait_standing_by(standby)
        with grpc.insecure_channel(writer.endpoint) as ch:
            put(pbg.KVStub(ch), b"/registry/pods/ns/before", b"v")
        time.sleep(0.2)
        os.kill(standby.pid, signal.SIGSTOP)
        rev = write_past_checkpoints(writer.endpoint)
        # the checkpoints' releases reach past what the standby read (its next message, 4: fences and
        # the first put before it); they are made after the writes are acknowledged and may lag on a
        # loaded machine, and without them there is no gap (seen in CI: the test then took over at once)
        wait_until("the pods stream released past the standby's next message",
                   lambda: nats_call(nats.urls, lambda js: js.stream_info("shardetcd_pods")).state.first_seq > 4)
        writer.kill()
        time.sleep(4.0)  # the writer lease (TTL 3 s) lapses while the standby is stopped
        os.kill(standby.pid, signal.SIGCONT)
        deadline = time.monotonic() + 60
        while "took over as the writer" not in standby.log_tail(300):
            assert standby.running(), standby.log_tail()
            assert time.monotonic() < deadline, standby.log_tail()
            time.sleep(0.2)
        tail = standby.log_tail(300)
        assert "rebuilding the state first" in tail or "standby rebuilds its state" in tail, tail
        assert "discarded records" not in tail, tail  # the writer was idle when killed: nothing was half-written
        standby.wait_ready(timeout=60)  # a plain standby binds its client URL just after that line
        serves_every_pod(standby.endpoint, rev, 42)
        with grpc.insecure_channel(standby.endpoint) as ch:
            assert put(pbg.KVStub(ch), b"/registry/pods/ns/after", b"v") == rev + 1
        assert standby.running()
    finally:
        resume_and_stop(standby, writer, kill=True)


def test_three_members_as_etcd_a_writer_and_two_following_standbys_survive_two_kills(nats, tmp_path):
    """A writer and two `--follow --standby` processes, as a three-member etcd: every one
    serves. Kill -9 the writer: one standby takes over, the other goes on following and
    hands its writes to it; kill -9 that one too: the last takes over. A client on the
    last one's channel wrote through all three writers; every acknowledged write is there."""
    writer = server_on(nats, tmp_path / "w").start()
    standbys = [server_on(nats, tmp_path / f"s{i}", "--follow", "--standby").start() for i in range(2)]
    members = [writer, *standbys]
    try:
        channels = {m.endpoint: grpc.insecure_channel(m.endpoint) for m in members}
        acked: dict[bytes, int] = {}

        def write_everywhere(label: bytes, alive) -> None:
            for m in alive:
                kv = pbg.KVStub(channels[m.endpoint])
                deadline = time.monotonic() + 60
                key = b"/registry/pods/three/%s-%d" % (label, members.index(m))
                while True:  # until a writer takes it (one may be taking over)
                    try:
                        acked[key] = kv.Put(pb.PutRequest(key=key, value=label), timeout=5).header.revision
                        break
                    except grpc.RpcError as exc:
                        assert exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), exc
                        assert time.monotonic() < deadline, [x.log_tail() for x in alive]
                        time.sleep(0.2)

        write_everywhere(b"first", members)
        writer.kill()
        write_everywhere(b"second", standbys)
        took = [s for s in standbys if "took over as the writer" in s.log_tail(200)]
        assert len(took) == 1, [s.log_tail() for s in standbys]
        took[0].kill()
        last = next(s for s in standbys if s is not took[0])
        write_everywhere(b"third", [last])
        assert "took over as the writer" in last.log_tail(200)
        r = pbg.KVStub(channels[last.endpoint]).Range(
            pb.RangeRequest(key=b"/registry/pods/three/", range_end=b"/registry/pods/three0"), timeout=10)
        assert {kv.key: kv.mod_revision for kv in r.kvs} == acked
        assert sorted(acked.values()) == [acked[k] for k in acked]  # written in this order, revisions in order
        for ch in channels.values():
            ch.close()
    finally:
        for m in members:
            m.kill()


@pytest.mark.parametrize("following", [False, True], ids=["standby", "following-standby"])
def test_history_over_followers_is_linearizable_across_a_writer_takeover(nats, tmp_path, following):
    """Clients on two followers (and two on the writer until it dies); kill -9 of
    the writer mid-run, a standby takes over, the followers find it: every key's
    history is linearizable, writes whose answers were lost included. With
    --follow --standby, two more clients on the standby itself, which serves as a
    follower, then as the writer, on the same connections."""
    writer = server_on(nats, tmp_path / "w").start()
    followers = [server_on(nats, tmp_path / f"f{i}", "--follow").start() for i in range(2)]
    standby = server_on(nats, tmp_path / "s", *(("--follow",) if following else ()), "--standby").start(wait=following)
    try:
        if not following:
            wait_standing_by(standby)
        endpoints = [writer.endpoint] * 2 + [followers[0].endpoint] * 2 + [followers[1].endpoint] * 2 + \
            [standby.endpoint] * (2 if following else 0)
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


def test_simple_tokens_work_on_every_member(nats, tmp_path, etcdctl_bin):
    """Auth enabled (root) with etcd's default simple tokens: etcdctl --user through
    a follower puts, gets and watches; a token from Authenticate on a follower works
    on the writer and on the other follower at once, and one from the writer on a
    follower (the writer journals every token it assigns, as etcd sends it through
    Raft); an unknown token is etcd's "invalid auth token" everywhere; after
    `user passwd` the old token is refused on every member, the new one works."""
    import subprocess

    from tests.integration.test_etcdctl import ctl

    writer = server_on(nats, tmp_path / "w").start()
    followers = [server_on(nats, tmp_path / f"f{i}", "--follow").start() for i in range(2)]
    etcdctl = etcdctl_bin
    f0, f1 = followers
    try:
        ctl(etcdctl, f0.endpoint, "user", "add", "root", "--new-user-password=pw")
        ctl(etcdctl, f0.endpoint, "user", "grant-role", "root", "root")
        ctl(etcdctl, f0.endpoint, "auth", "enable")
        watch = subprocess.Popen([etcdctl, f"--endpoints={f0.endpoint}", "--user=root:pw", "watch", "/t/w"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env={"ETCDCTL_API": "3", "PATH": os.environ.get("PATH", "")})
        time.sleep(1.0)  # the watch is created
        ctl(etcdctl, f0.endpoint, "--user=root:pw", "put", "/t/w", "v1")
        assert ctl(etcdctl, f0.endpoint, "--user=root:pw", "get", "/t/w", "--print-value-only").stdout == "v1\n"
        assert ctl(etcdctl, f1.endpoint, "--user=root:pw", "get", "/t/w", "--print-value-only",
                   "--consistency=s").stdout in ("v1\n", "\n")
        watch.terminate()
        out, err = watch.communicate(10)
        assert out.split() == ["PUT", "/t/w", "v1"], (out, err)

        def authenticate(endpoint: str, password: str = "pw") -> str:
            with grpc.insecure_channel(endpoint) as ch:
                return pbg.AuthStub(ch).Authenticate(pb.AuthenticateRequest(name="root", password=password),
                                                     timeout=10).token

        def get(endpoint: str, token: str, serializable: bool = True):
            with grpc.insecure_channel(endpoint) as ch:
                return pbg.KVStub(ch).Range(pb.RangeRequest(key=b"/t/w", serializable=serializable),
                                            metadata=(("token", token),), timeout=10)

        def refused(endpoint: str, token: str) -> bool:
            try:
                get(endpoint, token)
            except grpc.RpcError as exc:
                assert (exc.code(), exc.details()) == (grpc.StatusCode.UNAUTHENTICATED, "etcdserver: invalid auth token")
                return True
            return False

        on_follower = authenticate(f0.endpoint)
        prefix, _, index = on_follower.partition(".")
        assert len(prefix) == 16 and prefix.isalpha() and index.isdigit()
        for ep in (writer.endpoint, f0.endpoint, f1.endpoint):  # immediately, no waiting
            assert get(ep, on_follower).kvs[0].value == b"v1"
        on_writer = authenticate(writer.endpoint)
        assert int(on_writer.rpartition(".")[2]) > int(index)  # the index keeps growing, as etcd's raft index
        for ep in (f1.endpoint, f0.endpoint, writer.endpoint):
            assert get(ep, on_writer, serializable=False).kvs[0].value == b"v1"
        for ep in (writer.endpoint, f0.endpoint, f1.endpoint):
            assert refused(ep, "bogusbogusbogusx.1") and refused(ep, "bogusbogusbogusx.99999") and refused(ep, "junk")

        ctl(etcdctl, f1.endpoint, "--user=root:pw", "user", "passwd", "root", "--interactive=false", stdin="pw2\n")
        assert refused(writer.endpoint, on_follower) and refused(writer.endpoint, on_writer)
        deadline = time.monotonic() + 10
        for ep in (f0.endpoint, f1.endpoint):  # each follower ends them once it applies the change
            while not (refused(ep, on_follower) and refused(ep, on_writer)):
                assert time.monotonic() < deadline
                time.sleep(0.05)
        fresh = authenticate(f1.endpoint, "pw2")
        for ep in (writer.endpoint, f0.endpoint, f1.endpoint):
            assert get(ep, fresh).kvs[0].value == b"v1" and refused(ep, on_follower)
        assert ctl(etcdctl, f0.endpoint, "--user=root:pw2", "get", "/t/w", "--print-value-only").stdout == "v1\n"
    finally:
        for s in (*followers, writer):
            s.stop()


@contextlib.contextmanager
def writer_follower_standby(nats, tmp_path):
    """A writer, a follower and a standby following the writer's journals; all killed after."""
    writer = server_on(nats, tmp_path / "w").start()
    follower = server_on(nats, tmp_path / "f", "--follow").start()
    standby = server_on(nats, tmp_path / "s", "--standby").start(wait=False)
    try:
        wait_standing_by(standby)
        yield writer, follower, standby
    finally:
        for s in (follower, standby, writer):
            s.kill()


def frozen_until_taken_over(writer, standby, timeout: float = 60.0) -> float:
    """SIGSTOP the writer (its connections stay open, nothing answers: a machine cut off without
    resets) and wait until the standby has taken over; a deadline for what follows."""
    os.kill(writer.proc.pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while "took over as the writer" not in standby.log_tail(200):
        assert time.monotonic() < deadline, standby.log_tail(50)
        time.sleep(0.1)
    return deadline


def test_a_follower_finds_the_new_writer_while_the_old_one_is_frozen(nats, tmp_path):
    """The writer frozen until the standby takes over: writes through the follower reach the new
    writer while the old one is still frozen. The follower's calls to the old one only time out,
    so it must look the writer record up on a timeout too, not only on a refused connection; the
    call that timed out is answered as an etcd member answers one it waited for in vain."""
    with writer_follower_standby(nats, tmp_path) as (writer, follower, standby), \
            grpc.insecure_channel(follower.endpoint) as ch:
        kv = pbg.KVStub(ch)
        kv.Put(pb.PutRequest(key=b"/registry/pods/a", value=b"1"), timeout=10)
        deadline = frozen_until_taken_over(writer, standby)
        errors = []
        while True:
            try:
                put = kv.Put(pb.PutRequest(key=b"/registry/pods/a", value=b"2"), timeout=30)
                break
            except grpc.RpcError as exc:
                errors.append((exc.code(), exc.details()))
                assert time.monotonic() < deadline, (errors, follower.log_tail(30))
        # the call the frozen writer never answered timed out as on an etcd member without a leader
        assert errors[:1] == [(grpc.StatusCode.UNAVAILABLE, "etcdserver: request timed out")], errors
        with grpc.insecure_channel(standby.endpoint) as sch:
            got = pbg.KVStub(sch).Range(pb.RangeRequest(key=b"/registry/pods/a"), timeout=10)
        assert [(x.value, x.mod_revision) for x in got.kvs] == [(b"2", put.header.revision)]


def test_lease_keepalives_through_a_follower_reach_the_new_writer_while_the_old_one_is_frozen(nats, tmp_path):
    """The follower keeps leases alive over one stream to the writer. The writer frozen until the
    standby takes over: that stream times nothing out. A client keeping a 6 s lease alive through
    the follower every second for 15 s after the takeover still has it at the new writer: its
    keep-alives got there."""
    with writer_follower_standby(nats, tmp_path) as (writer, follower, standby), \
            grpc.insecure_channel(follower.endpoint) as ch:
        lease = pbg.LeaseStub(ch)
        lease_id = lease.LeaseGrant(pb.LeaseGrantRequest(TTL=6), timeout=10).ID
        frozen_until_taken_over(writer, standby)
        errors = []
        end = time.monotonic() + 15
        while time.monotonic() < end:
            try:
                next(iter(lease.LeaseKeepAlive(iter([pb.LeaseKeepAliveRequest(ID=lease_id)]), timeout=5)))
            except grpc.RpcError as exc:
                errors.append((exc.code(), exc.details()))
            time.sleep(1)
        with grpc.insecure_channel(standby.endpoint) as sch:
            ttl = pbg.LeaseStub(sch).LeaseTimeToLive(pb.LeaseTimeToLiveRequest(ID=lease_id), timeout=10).TTL
        assert ttl > 0, (ttl, errors, follower.log_tail(30))


def test_an_observe_through_a_follower_goes_on_through_a_takeover(nats, tmp_path):
    """An election's Observe through the follower is served by the follower, as on an etcd member
    (it was a stream to the writer, which the writer's death ended): the writer frozen and replaced
    by the standby, the stream goes on, and tells what is proclaimed at the new writer."""
    from proto import v3election_pb2 as epb, v3election_pb2_grpc as epbg

    with writer_follower_standby(nats, tmp_path) as (writer, follower, standby):
        with grpc.insecure_channel(writer.endpoint) as wch:
            lease = pbg.LeaseStub(wch).LeaseGrant(pb.LeaseGrantRequest(TTL=120), timeout=10).ID
            leader = epbg.ElectionStub(wch).Campaign(epb.CampaignRequest(name=b"e1", lease=lease, value=b"leader-1"),
                                                     timeout=10).leader
        with grpc.insecure_channel(follower.endpoint) as ch:
            stream = epbg.ElectionStub(ch).Observe(epb.LeaderRequest(name=b"e1"), timeout=90)
            assert next(stream).kv.value == b"leader-1"
            deadline = frozen_until_taken_over(writer, standby)
            with grpc.insecure_channel(standby.endpoint) as sch:  # serving as the writer a moment after it says so
                wait_until("a Proclaim at the new writer", lambda: not_refused(lambda: epbg.ElectionStub(sch).Proclaim(
                    epb.ProclaimRequest(leader=leader, value=b"leader-1 again"), timeout=30)),
                    timeout=deadline - time.monotonic())
            said = next(stream)
            assert (said.kv.key, said.kv.value) == (leader.key, b"leader-1 again"), follower.log_tail(30)
            stream.cancel()


def test_a_lock_and_a_leadership_waited_for_through_a_follower_are_had_from_the_writer_that_replaced_a_frozen_one(
        nats, tmp_path):
    """Lock and Campaign through the follower wait at the writer for as long as their clients do.
    The writer frozen while they wait, and the standby taken over: the follower asks them of the
    new writer (the same lease asks for the same key, so nothing is had twice), and once the
    holders give the lock and the leadership up there, the waiting clients get them."""
    with writer_follower_standby(nats, tmp_path) as (writer, follower, standby):
        def takeover() -> None:
            deadline = frozen_until_taken_over(writer, standby)
            with grpc.insecure_channel(follower.endpoint) as ch:
                wait_until("a write through the follower at the new writer", lambda: not_refused(
                    lambda: put(pbg.KVStub(ch), b"/registry/pods/after", b"x")), timeout=deadline - time.monotonic())

        got, wanted = waited_for_a_lock_and_a_leadership(follower.endpoint, 0, takeover)
        assert got == wanted, (got, follower.log_tail(30))


def not_refused(call) -> bool:
    try:
        call()
        return True
    except grpc.RpcError:
        return False


def test_a_follower_names_the_writer_as_leader_without_handing_it_a_call(nats, tmp_path):
    """Status on a follower names the writer the writer record names, as an etcd follower
    names its leader, whether or not the follower has handed the writer a call (it named
    itself until its first forwarded call; `shardetcd cluster` starts followers beside their
    writer, so etcdctl endpoint status called them leaders): none while no writer has served,
    the writer once one serves, none once its writer's lease lapsed with nobody taking over (it
    named the dead writer), and a standby once it took over."""
    follower = server_on(nats, tmp_path / "f", "--follow").start(wait=False)  # its readiness check reads
    writer = standby = None                                                     # through a writer
    wait_until("the follower serves", lambda: "serving the etcd v3 API" in follower.log_tail(50), 30)
    try:
        with grpc.insecure_channel(follower.endpoint) as ch:
            maintenance = pbg.MaintenanceStub(ch)

            def leader() -> int:
                return maintenance.Status(pb.StatusRequest(), timeout=10).leader

            own = maintenance.Status(pb.StatusRequest(), timeout=10).header.member_id
            assert leader() == 0  # no writer yet: etcd's "no leader"
            writer = server_on(nats, tmp_path / "w").start()
            ids = {}
            with grpc.insecure_channel(writer.endpoint) as sch:
                ids["writer"] = pbg.MaintenanceStub(sch).Status(pb.StatusRequest(), timeout=10).header.member_id
            wait_until("the follower names the writer", lambda: leader() == ids["writer"], 10)
            writer.kill()
            wait_until("the follower names no leader once the dead writer's lease lapsed", lambda: leader() == 0, 30)
            standby = server_on(nats, tmp_path / "s", "--follow", "--standby").start()
            with grpc.insecure_channel(standby.endpoint) as sch:
                ids["standby"] = pbg.MaintenanceStub(sch).Status(pb.StatusRequest(), timeout=10).header.member_id
            wait_until("the follower names the standby that took over", lambda: leader() == ids["standby"], 30)
            assert own not in ids.values()
    finally:
        for s in (follower, standby, writer):
            if s is not None:
                s.kill()


def test_a_follower_shows_a_write_only_once_the_writer_has_the_journals_answer(nats, tmp_path, monkeypatch):
    """DESIGN.md invariant 11. A write is stored in the journals before the writer has NATS's
    answer and moves its committed revision (the read index): for the ack's round trip, for
    seconds when a publish is retried under a NATS fault. A follower that applied it then showed,
    in a watch or a serializable read, a write that a linearizable read elsewhere (the writer,
    another follower) did not return. It shows it once the writer has the answer: then a
    linearizable read through the follower and the writer both have it. The writer's first
    journal batch is held 4 s after NATS stored it (failpoint)."""
    monkeypatch.setenv("SHARDETCD_FAILPOINTS", "jetstream.after_store_before_ack=pause:4")
    writer = server_on(nats, tmp_path / "w").start()
    monkeypatch.delenv("SHARDETCD_FAILPOINTS")
    follower = server_on(nats, tmp_path / "f", "--follow").start()
    key = b"/registry/pods/k"
    try:
        with grpc.insecure_channel(writer.endpoint) as wch, grpc.insecure_channel(follower.endpoint) as fch:
            kv, watch = pbg.KVStub(fch), WatchClient(fch)
            watch.create(key)
            watch.wait_for(lambda rs: any(r.created for r in rs))
            acked = []
            put = threading.Thread(target=lambda: acked.append(pbg.KVStub(wch).Put(
                pb.PutRequest(key=key, value=b"1"), timeout=30).header.revision))
            put.start()
            wait_until("the journal stored the write", lambda: "failpoint pausing" in writer.log_tail(50), 10)
            time.sleep(1.0)  # the follower has read it by now (it applied it within this before)
            assert not kv.Range(pb.RangeRequest(key=key, serializable=True), timeout=5).kvs
            assert not watch.events()
            assert not acked, "the failpoint did not hold the writer's answer long enough for the test"
            put.join(30)
            rev = acked[0]
            got = kv.Range(pb.RangeRequest(key=key), timeout=10)  # linearizable: at the writer's committed
            assert [(x.value, x.mod_revision) for x in got.kvs] == [(b"1", rev)]
            got = pbg.KVStub(wch).Range(pb.RangeRequest(key=key), timeout=10)
            assert [(x.value, x.mod_revision) for x in got.kvs] == [(b"1", rev)]
            watch.wait_for(lambda rs: any(r.events for r in rs))
            assert [(e.kv.key, e.kv.mod_revision) for e in watch.events()] == [(key, rev)]
            watch.close()
    finally:
        follower.kill()
        writer.kill()


def test_a_follower_started_with_no_writer_has_a_write_a_checkpoint_vouches_for(nats, tmp_path):
    """A stream's last message waits until its writer tells it was acknowledged; with no writer to
    tell (killed), a starting follower still knows a write at or below a revision a checkpoint was
    taken at (of any shard: a revision is committed on every shard at once) was. Here the default
    shard's one write, at revision 2, is its stream's last message and the pods shard's checkpoints
    are far above it: held, it was left out of the rebuild and then dropped as below the applied
    revision, and the follower served without it (found by tests/chaos.py: a member that had been
    the writer came back as a follower missing one key)."""
    writer = server_on(nats, tmp_path / "w", "--checkpoint-journal-bytes", "65536").start()
    follower = None
    try:
        with grpc.insecure_channel(writer.endpoint) as ch:
            first = put(pbg.KVStub(ch), b"/registry/configmaps/ns/c", b"v")
        rev = write_past_checkpoints(writer.endpoint)

        async def pods_released(js) -> bool:
            return (await js.stream_info("shardetcd_pods")).state.first_seq > 1

        wait_until("a pods checkpoint stored (its journal released)", lambda: nats_call(nats.urls, pods_released), 30)
        writer.kill()
        follower = server_on(nats, tmp_path / "f", "--follow").start(wait=False)
        wait_until("the follower serves", lambda: "serving the etcd v3 API" in follower.log_tail(50), 30)
        with grpc.insecure_channel(follower.endpoint) as ch:
            kv = pbg.KVStub(ch)
            got = kv.Range(pb.RangeRequest(key=b"/registry/configmaps/ns/c", serializable=True), timeout=10)
            assert [(x.value, x.mod_revision) for x in got.kvs] == [(b"v", first)], follower.log_tail(30)
            assert kv.Range(pb.RangeRequest(key=b"/registry/pods/ns/first", serializable=True), timeout=10).kvs
            assert first < rev
    finally:
        for s in (follower, writer):
            if s is not None:
                s.kill()
