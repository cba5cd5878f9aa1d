"""Followers of a writer on the same machine that keeps the default local journal
(issue 17.1): ``shardetcd --follow --follow-data-dir <writer's data dir>``.

Real processes on 127.0.0.1, stopped by PID: etcd 3.5.1's answers through a
follower, reads of every kind and read-your-writes, watches that see every
write once in order (writes through followers too), a follower that never
shows a revision the writer has not made durable (its fsync held by a
failpoint), a writer killed with -9 and started again under a follower, and
followers that start, or fall, behind segments the writer released after its
checkpoints.
"""
from __future__ import annotations

import contextlib
import stat
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import pytest

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.etcd_fixture import client_url_flags, free_port
from tests.integration.diffkit import run_differential
from tests.integration.followkit import (a_revoked_lease_is_kept_alive_no_more_through_the_follower,
                                         a_watch_resumes_across_a_follower_restart,
                                         auth_changes_decide_the_next_call_on_the_follower,
                                         cluster_followers_serve_their_partition,
                                         falls_behind_then_resyncs_in_process,
                                         member_list_names_the_writer_and_its_followers, put,
                                         require_leader_watches_end_and_come_back, serves_every_pod,
                                         waited_for_a_lock_and_a_leadership, watch_differential_through,
                                         watches_see_every_write_once_in_order, write_past_checkpoints)
from tests.shardetcd_fixture import ShardetcdProcess
from tests.watch_client import WatchClient


def writer_at(base: Path, *extra: str) -> ShardetcdProcess:
    return ShardetcdProcess(data_dir=base / "data", state_dir=base / "state", port=free_port(),
                            log_path=base / "shardetcd.log", extra_args=extra)


def follower_of(writer: ShardetcdProcess, base: Path, *extra: str) -> ShardetcdProcess:
    return writer_at(base, "--follow", "--follow-data-dir", str(writer.data_dir), *extra)


@pytest.fixture
def writer_and_followers(tmp_path):
    with contextlib.ExitStack() as started:  # a follower that fails to start stops what had started
        writer = started.enter_context(writer_at(tmp_path / "w").start())
        yield writer, [started.enter_context(follower_of(writer, tmp_path / f"f{i}").start()) for i in range(2)]


def test_a_local_follower_answers_as_etcd(real_etcd, writer_and_followers):
    """The seeded KV differential through a follower gives etcd 3.5.1's answers; Status on
    the follower names the writer as the leader, and the cluster id is the writer's."""
    writer, followers = writer_and_followers
    run_differential(real_etcd.endpoint, followers[0].endpoint, 21, 400)
    with grpc.insecure_channel(followers[0].endpoint) as ch:
        status = pbg.MaintenanceStub(ch).Status(pb.StatusRequest(), timeout=10)
    with grpc.insecure_channel(writer.endpoint) as ch:
        mine = pbg.MaintenanceStub(ch).Status(pb.StatusRequest(), timeout=10)
    assert status.leader == mine.header.member_id != status.header.member_id
    assert status.header.cluster_id == mine.header.cluster_id


def test_watches_on_a_local_follower_answer_as_etcd(real_etcd, writer_and_followers):
    """The seeded watch differential through a follower: live and historical watches,
    filters, prev_kv, cancels, progress requests and a compaction, the writes handed to
    the writer, give what etcd 3.5.1's watches report (events, response boundaries of
    live watches, control responses and their header revisions)."""
    writer, followers = writer_and_followers
    watch_differential_through(real_etcd.endpoint, followers[1].endpoint, 13)


def test_a_watch_resumes_across_a_local_follower_restart(writer_and_followers):
    """kill -9 of a follower under a running watch and writes; the watch created again on the
    restarted follower from the next revision misses nothing and repeats nothing."""
    writer, followers = writer_and_followers
    a_watch_resumes_across_a_follower_restart(writer, followers[0])


def test_member_list_names_the_local_writer_and_its_followers(writer_and_followers):
    """As with JetStream: every serving process is a member (announced on this machine's tmpfs,
    never in the writer's data dir), the writer is the leader, a stopped follower drops out."""
    writer, followers = writer_and_followers
    member_list_names_the_writer_and_its_followers(writer, followers)


def test_the_files_a_writer_and_its_followers_write_are_their_users_alone(writer_and_followers):
    """As etcd's (0600): the writer's record of where it serves (with its secret) and watermark
    beside its journals, and what each process writes in its own data dir."""
    writer, followers = writer_and_followers
    files = [p for proc in (writer, *followers) for p in proc.data_dir.rglob("*") if p.is_file()]
    assert {"writer.json", "watermark", "meta.json"} <= {p.name for p in files}
    assert {str(p): stat.S_IMODE(p.stat().st_mode) for p in files} == {str(p): 0o600 for p in files}


def test_reads_of_every_kind_and_read_your_writes_through_a_follower(writer_and_followers):
    """A put through a follower is answered by the writer, and a read right after it on the same
    follower sees it (serializable too); a put on the writer is seen by a linearizable read on
    a follower at once (read index), and by a serializable one once applied; history reads and
    a compaction forwarded through a follower behave as on the writer."""
    writer, followers = writer_and_followers
    with grpc.insecure_channel(writer.endpoint) as wch, grpc.insecure_channel(followers[0].endpoint) as fch:
        wkv, fkv = pbg.KVStub(wch), pbg.KVStub(fch)
        for i in range(20):
            rev = put(fkv, b"/registry/pods/ryw/k", b"%d" % i)
            got = fkv.Range(pb.RangeRequest(key=b"/registry/pods/ryw/k", serializable=True), timeout=10)
            assert [(x.value, x.mod_revision) for x in got.kvs] == [(b"%d" % i, rev)]
            rev = put(wkv, b"/registry/pods/lin/k", b"%d" % i)
            got = fkv.Range(pb.RangeRequest(key=b"/registry/pods/lin/k"), timeout=10)
            assert [(x.value, x.mod_revision) for x in got.kvs] == [(b"%d" % i, rev)] and got.header.revision >= rev
        old = fkv.Range(pb.RangeRequest(key=b"/registry/pods/lin/k", revision=rev - 2), timeout=10)
        assert [x.value for x in old.kvs] == [b"18"]
        fkv.Compact(pb.CompactionRequest(revision=rev - 1), timeout=10)
        with pytest.raises(grpc.RpcError) as err:
            fkv.Range(pb.RangeRequest(key=b"/registry/pods/lin/k", revision=rev - 2, serializable=True), timeout=10)
        assert "compacted" in err.value.details()
        with grpc.insecure_channel(followers[1].endpoint) as ch:
            got = pbg.KVStub(ch).Range(pb.RangeRequest(key=b"/registry/pods/", range_end=b"/registry/pods0"), timeout=10)
        assert got.header.revision == rev and len(got.kvs) == 2
        # a forwarded answer's header names the member the client called, as etcd's does
        mine = pbg.MaintenanceStub(fch).Status(pb.StatusRequest(), timeout=10).header.member_id
        theirs = pbg.MaintenanceStub(wch).Status(pb.StatusRequest(), timeout=10).header.member_id
        answered = fkv.Put(pb.PutRequest(key=b"/registry/pods/m", value=b"x"), timeout=10).header
        assert answered.member_id == mine != theirs and answered.revision == rev + 1


def test_a_revoked_lease_is_kept_alive_no_more_through_a_follower(writer_and_followers):
    """Keep-alives through a local follower answer TTL 0 once the lease is revoked, through it or the writer."""
    writer, followers = writer_and_followers
    a_revoked_lease_is_kept_alive_no_more_through_the_follower(writer, followers[0])


def test_auth_changes_through_a_follower_decide_the_next_call_on_it(writer_and_followers):
    """Auth enabled, and a read permission granted and revoked ten times, through a local
    follower: the very next read there is allowed or refused accordingly."""
    auth_changes_decide_the_next_call_on_the_follower(writer_and_followers[1][0])


def test_watches_on_local_followers_see_every_write_once_in_order(writer_and_followers):
    """200 watchers over 4 streams on two followers, each on one of 16 writers' keys; two thirds of
    the writers write through the followers. Every watcher sees exactly its writer's acknowledged
    puts, in revision order, nothing twice."""
    writer, followers = writer_and_followers
    watches_see_every_write_once_in_order(followers, [writer.endpoint, *(f.endpoint for f in followers)],
                                          watchers=200, streams=4, writers=16)


def test_a_follower_never_shows_what_the_writer_has_not_made_durable(tmp_path, monkeypatch):
    """The writer's 6th journal batch is held 3 s between write() and fdatasync (a failpoint):
    its bytes are in the segment file, but the follower (and the writer) keep answering at the
    revision before it, until the fsync is done; then the follower shows it."""
    monkeypatch.setenv("SHARDETCD_FAILPOINTS", "journal.after_write_before_fsync=sleep:3@6")
    writer = writer_at(tmp_path / "w", "--journal-fsync", "always").start()
    monkeypatch.delenv("SHARDETCD_FAILPOINTS")
    follower = follower_of(writer, tmp_path / "f").start()
    try:
        with grpc.insecure_channel(writer.endpoint) as wch, grpc.insecure_channel(follower.endpoint) as fch:
            wkv, fkv = pbg.KVStub(wch), pbg.KVStub(fch)
            revs = [put(wkv, b"/registry/pods/d/k%d" % i, b"v") for i in range(5)]
            segment = next((writer.data_dir / "shards" / "pods" / "journal").glob("*.wal"))
            held: list[int] = []
            t = threading.Thread(target=lambda: held.append(put(wkv, b"/registry/pods/d/held", b"not yet")))
            t.start()
            deadline = time.monotonic() + 5
            while b"not yet" not in segment.read_bytes():  # in the page cache, not durable
                assert time.monotonic() < deadline, "the held write never reached the file"
                time.sleep(0.005)
            written = time.monotonic()  # its fdatasync comes 3 s after this, not before
            seen = set()
            while time.monotonic() < written + 2:
                for kv in (fkv, wkv):
                    got = kv.Range(pb.RangeRequest(key=b"/registry/pods/d/", range_end=b"/registry/pods/d0",
                                                   serializable=True), timeout=10)
                    assert got.header.revision == revs[-1] and len(got.kvs) == 5, kv is fkv
                    seen.add(got.header.revision)
                time.sleep(0.05)
            assert not held
            t.join(10)
            assert held == [revs[-1] + 1] and seen == {revs[-1]}
            got = fkv.Range(pb.RangeRequest(key=b"/registry/pods/d/held", serializable=True), timeout=10)
            deadline = time.monotonic() + 5
            while not got.kvs:
                assert time.monotonic() < deadline
                time.sleep(0.01)
                got = fkv.Range(pb.RangeRequest(key=b"/registry/pods/d/held", serializable=True), timeout=10)
            assert got.kvs[0].mod_revision == held[0]
    finally:
        follower.stop()
        writer.stop()


def test_a_follower_goes_on_across_a_writer_kill_and_restart(tmp_path):
    """One client writes through the follower while the writer is killed with -9 and started again
    on the same data dir and URL: the follower's watch delivers one event per revision, every
    revision from its start to the last, each once (none lost, none twice, the writes whose
    answers were lost included), every acknowledged write among them; reads on the follower end
    at the writer's revision."""
    writer = writer_at(tmp_path / "w").start()
    follower = follower_of(writer, tmp_path / "f").start()
    try:
        with grpc.insecure_channel(follower.endpoint) as fch:
            kv = pbg.KVStub(fch)
            watch = WatchClient(fch)
            watch.create(b"/registry/pods/r/", b"/registry/pods/r0")
            watch.wait_for(lambda rs: any(r.created for r in rs))
            first = put(kv, b"/registry/pods/r/k0", b"first")
            acked = [first]
            stop = threading.Event()

            def write() -> None:
                i = 0
                while not stop.is_set():
                    i += 1
                    try:
                        acked.append(put(kv, b"/registry/pods/r/k%d" % (i % 5), b"%d" % i))
                    except grpc.RpcError as exc:
                        assert exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), exc
                        time.sleep(0.1)

            t = threading.Thread(target=write)
            t.start()
            time.sleep(1.5)
            writer.kill()
            killed_at = len(acked)
            time.sleep(0.5)
            writer.start()
            deadline = time.monotonic() + 30
            while len(acked) < killed_at + 30:
                assert time.monotonic() < deadline, (follower.log_tail(), writer.log_tail())
                time.sleep(0.1)
            stop.set()
            t.join(30)
            with grpc.insecure_channel(writer.endpoint) as wch:
                last = pbg.KVStub(wch).Range(pb.RangeRequest(key=b"/registry/pods/r/", range_end=b"/registry/pods/r0"),
                                             timeout=10).header.revision
            watch.wait_for(lambda rs: sum(len(r.events) for r in rs) >= last - first + 1, timeout=30)
            time.sleep(0.5)  # a bound for anything extra to arrive, not a claim about speed
            events = [e.kv.mod_revision for e in watch.events()]
            assert events == list(range(first, last + 1))
            assert set(acked) <= set(events) and acked == sorted(acked)
            assert watch.error is None
            watch.close()
            got = kv.Range(pb.RangeRequest(key=b"/registry/pods/r/", range_end=b"/registry/pods/r0", serializable=True),
                           timeout=10)
            assert got.header.revision == last and len(got.kvs) == 5
        assert follower.running()
    finally:
        follower.stop()
        writer.stop()


def test_a_lock_and_a_leadership_waited_for_longer_than_a_request_timeout_are_had_through_a_follower(
        real_etcd, writer_and_followers):
    """Lock and Campaign answer once the lock or the leadership is had, however long that takes:
    an etcd member waits for as long as its client does (``etcdctl lock`` and ``elect`` wait with
    no deadline). Held for 9 s, past the 7 s a follower gives other forwarded calls: the waiting
    clients get them once given up, on etcd 3.5.1 and through a follower alike."""
    from concurrent.futures import ThreadPoolExecutor

    follower = writer_and_followers[1][0]
    with ThreadPoolExecutor(2) as pool:
        on_etcd, through = pool.map(lambda endpoint: waited_for_a_lock_and_a_leadership(endpoint, 9.0),
                                    (real_etcd.endpoint, follower.endpoint))
    assert on_etcd[0] == on_etcd[1], on_etcd
    assert through[0] == through[1], through


def test_a_lock_and_a_leadership_waited_for_through_a_follower_are_had_across_a_writer_crash(tmp_path):
    """The writer killed with -9 and started again while a Lock and a Campaign wait through the
    follower: the follower asks them again of the writer that serves next, where the keys they
    queued with are, and the clients get the lock and the leadership once given up (an etcd
    member's Lock goes on waiting when the leader fails too)."""
    writer = writer_at(tmp_path / "w").start()
    follower = follower_of(writer, tmp_path / "f").start()
    try:
        got, wanted = waited_for_a_lock_and_a_leadership(follower.endpoint, 0, lambda: (writer.kill(), writer.start()))
        assert got == wanted, (got, follower.log_tail(30))
    finally:
        follower.stop()
        writer.stop()


def test_forwarded_answers_larger_than_grpcs_default_limit_come_back(writer_and_followers):
    """A Txn whose Range reads 5 MB, and a DeleteRange with prev_kv of the same keys, through a
    follower: the writer's answers (above gRPC's default 4 MiB receive limit) reach the client,
    as they do from etcd, whose clients take up to 2 GiB."""
    writer, (follower, _) = writer_and_followers
    keys = [b"/registry/configmaps/big/c%02d" % i for i in range(25)]
    span = pb.RangeRequest(key=b"/registry/configmaps/big/", range_end=b"/registry/configmaps/big0")
    big = [("grpc.max_receive_message_length", -1)]
    with grpc.insecure_channel(writer.endpoint) as wch, grpc.insecure_channel(follower.endpoint, options=big) as fch:
        for key in keys:
            pbg.KVStub(wch).Put(pb.PutRequest(key=key, value=b"x" * 200_000), timeout=10)
        kv = pbg.KVStub(fch)
        txn = kv.Txn(pb.TxnRequest(success=[pb.RequestOp(request_range=span)]), timeout=30)
        assert txn.ByteSize() > 4 << 20 and [x.key for x in txn.responses[0].response_range.kvs] == keys
        deleted = kv.DeleteRange(pb.DeleteRangeRequest(key=span.key, range_end=span.range_end, prev_kv=True), timeout=30)
        assert deleted.deleted == 25 and [x.value for x in deleted.prev_kvs] == [b"x" * 200_000] * 25


def observe_ended_on(server: ShardetcdProcess, code: str) -> float:
    """Observe streams the server ended with ``code``, from its /metrics (grpc_server_handled_total)."""
    text = urllib.request.urlopen(f"http://{server.endpoint}/metrics", timeout=10).read().decode()
    mark = f'grpc_server_handled_total{{grpc_code="{code}",grpc_method="Observe",'
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(mark))


def test_an_observe_through_a_follower_waits_for_a_writer_that_is_starting_again(tmp_path):
    """Observe through a follower starts where a linearizable read does, at the writer's committed
    revision: while no writer answers (killed with -9, not started yet) the follower asks again, as
    for a linearizable read, and the client gets the leader once the writer is back, not UNAVAILABLE."""
    from proto import v3election_pb2 as epb, v3election_pb2_grpc as epbg

    writer = writer_at(tmp_path / "w").start()
    follower = follower_of(writer, tmp_path / "f").start()
    try:
        with grpc.insecure_channel(writer.endpoint) as wch:
            lease = pbg.LeaseStub(wch).LeaseGrant(pb.LeaseGrantRequest(TTL=60), timeout=10).ID
            epbg.ElectionStub(wch).Campaign(epb.CampaignRequest(name=b"e1", lease=lease, value=b"leader-1"),
                                            timeout=10)
        writer.kill()
        observed: list = []

        def observe() -> None:
            with grpc.insecure_channel(follower.endpoint) as fch:
                try:
                    stream = epbg.ElectionStub(fch).Observe(epb.LeaderRequest(name=b"e1"), timeout=30)
                    observed.append(next(iter(stream)).kv.value)
                    stream.cancel()
                except grpc.RpcError as exc:
                    observed.append(exc)

        t = threading.Thread(target=observe)
        t.start()
        time.sleep(1.0)  # the Observe is being asked of a writer that is not there
        assert not observed, observed
        writer.start()
        t.join(40)
        assert observed == [b"leader-1"], (observed, follower.log_tail())
        # served by the follower (the client's cancel ends it there), never handed to the writer
        deadline = time.monotonic() + 20
        while observe_ended_on(follower, "Canceled") != 1:
            assert time.monotonic() < deadline, observe_ended_on(follower, "Canceled")
            time.sleep(0.1)
        assert observe_ended_on(writer, "Canceled") == observe_ended_on(writer, "OK") == 0
    finally:
        follower.stop()
        writer.stop()


def test_a_follower_whose_writer_is_down_ends_the_watches_that_require_a_leader(tmp_path):
    """The writer killed with -9: the follower no longer hears from its leader, so, as an etcd
    member that lost its leader, it ends the watches opened WithRequireLeader (kube-apiserver's)
    with "no leader" and refuses new ones, while other watches stay open; once the writer is
    started again it accepts them, and they see new writes."""
    writer = writer_at(tmp_path / "w").start()
    follower = follower_of(writer, tmp_path / "f").start()
    try:
        require_leader_watches_end_and_come_back(follower.endpoint, writer.endpoint, writer.kill, writer.start)
        assert follower.running()
    finally:
        follower.stop()
        writer.stop()


SMALL_JOURNAL = ("--checkpoint-journal-bytes", "65536", "--journal-segment-bytes", "16384")


def test_a_follower_started_after_segments_were_released_starts_from_the_checkpoint(tmp_path):
    writer = writer_at(tmp_path / "w", *SMALL_JOURNAL).start()
    follower = follower_of(writer, tmp_path / "f")
    try:
        rev = write_past_checkpoints(writer.endpoint)
        journal = writer.data_dir / "shards" / "pods" / "journal"
        assert not list(journal.glob("0000000000000000-*.wal")), "no segment was released"
        assert list((writer.data_dir / "shards" / "pods").glob("checkpoint-*.ckpt"))
        follower.start()
        serves_every_pod(follower.endpoint, rev, 41)
        with grpc.insecure_channel(follower.endpoint) as ch:
            after = put(pbg.KVStub(ch), b"/registry/pods/ns/after", b"v")
        serves_every_pod(follower.endpoint, after, 42)
    finally:
        follower.stop()
        writer.stop()


def test_a_follower_that_falls_behind_released_segments_resyncs_from_the_checkpoint(tmp_path):
    """Paused (SIGSTOP) while the writer writes past several checkpoints that release the segments
    it was to read next: it rebuilds its state from the newest checkpoint in-process (as a
    JetStream follower does, shards/resync.py) and serves every write."""
    writer = writer_at(tmp_path / "w", *SMALL_JOURNAL).start()
    follower = follower_of(writer, tmp_path / "f").start()
    falls_behind_then_resyncs_in_process(writer, follower)


def test_follow_flags_are_checked(tmp_path):
    """--follow-data-dir needs --follow, names a shardetcd data dir other than the follower's own,
    and goes without --journal-url: each mistake is one line and exit 2."""
    import subprocess
    import sys

    from tests.shardetcd_fixture import REPO_ROOT

    writer = writer_at(tmp_path / "w").start()
    try:
        cases = [
            (["--follow-data-dir", str(writer.data_dir)], "goes with --follow"),
            (["--follow", "--follow-data-dir", str(tmp_path / "l.toml")], "is not a directory"),
            (["--follow", "--follow-data-dir", "OWN"], "needs a --data-dir of its own"),
            (["--follow", "--follow-data-dir", str(writer.data_dir), "--journal-url", "nats://127.0.0.1:1"],
             "not both"),
            (["--follow", "--follow-data-dir", str(writer.data_dir), "--shard-layout", str(tmp_path / "l.toml")],
             "--shard-layout"),
        ]
        (tmp_path / "l.toml").write_text('[[shard]]\nname = "x"\nresources = ["pods"]\n')
        for i, (args, says) in enumerate(cases):
            own = str(tmp_path / f"f{i}")
            out = subprocess.run([sys.executable, "-m", "shim", "--data-dir", own,
                                  *client_url_flags(f"http://127.0.0.1:{free_port()}"),
                                  *(own if a == "OWN" else a for a in args)],
                                 capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
            assert out.returncode == 2 and says in out.stderr, (args, out.stderr)
    finally:
        writer.stop()


def test_cluster_starts_local_followers_per_partition(tmp_path):
    """`shardetcd cluster --followers 1` on the local journal: each partition gets a follower of its
    writer's data dir on a port of its own, listed after the writer in the kube-apiserver flags;
    a follower reads and writes its own partition, and hands a write to another partition's
    resource to its writer, which refuses it. The writers keep their journals in a --wal-dir: the
    followers read them through the data dirs' links."""
    from tests.integration.test_cluster import Cluster

    cluster = Cluster(tmp_path).with_wal_dir(tmp_path / "wal")
    cluster.argv += ["--followers", "1"]
    cluster_followers_serve_their_partition(cluster)
    assert list((tmp_path / "wal" / "main" / "main").glob("*.wal"))


def test_read_index_failures_and_slow_ones_are_counted_as_etcd_names_them(tmp_path):
    """etcd_server_read_indexes_failed_total and etcd_server_slow_read_indexes_total on a follower:
    its linearizable reads ask the writer's committed revision (etcd's ReadIndex). One answered
    after the writer was held 1 s (SIGSTOP) is slow (etcd's 500 ms); with the writer gone, asking
    fails, and each failed request is counted. The writer itself asks nobody: 0 and 0."""
    import os
    import signal
    import urllib.request

    def metric(url: str, name: str) -> float:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            return next(float(line.split()[1]) for line in r.read().decode().splitlines()
                        if line.startswith(name + " "))

    url, wurl = (f"http://127.0.0.1:{free_port()}" for _ in range(2))
    writer = writer_at(tmp_path / "w", "--listen-metrics-urls", wurl).start()
    follower = follower_of(writer, tmp_path / "f", "--listen-metrics-urls", url)
    try:
        follower.start()
        with grpc.insecure_channel(follower.endpoint) as ch:
            kv = pbg.KVStub(ch)
            kv.Range(pb.RangeRequest(key=b"k"), timeout=10)
            assert metric(url, "etcd_server_read_indexes_failed_total") == 0
            assert metric(url, "etcd_server_slow_read_indexes_total") == 0
            os.kill(writer.pid, signal.SIGSTOP)
            try:
                threading.Timer(1.0, os.kill, (writer.pid, signal.SIGCONT)).start()
                kv.Range(pb.RangeRequest(key=b"k"), timeout=20)  # answered once the writer goes on
            finally:
                os.kill(writer.pid, signal.SIGCONT)
            assert metric(url, "etcd_server_slow_read_indexes_total") == 1
            assert metric(url, "etcd_server_read_indexes_failed_total") == 0
            assert metric(wurl, "etcd_server_slow_read_indexes_total") == 0
            assert metric(wurl, "etcd_server_read_indexes_failed_total") == 0
            writer.stop()
            with pytest.raises(grpc.RpcError):
                kv.Range(pb.RangeRequest(key=b"k"), timeout=20)
            assert metric(url, "etcd_server_read_indexes_failed_total") >= 1
    finally:
        follower.stop()
        writer.stop()


def test_calls_a_follower_hands_to_the_writer_count_in_the_followers_grpc_metrics(writer_and_followers):
    """etcd's members each count the calls their clients make (grpc_server_*, client requests): a
    follower counts the writes it hands to the writer too, whatever the writer answers, so that a
    write failing through it (the writer refusing it, or gone) shows in its failed-call rate, as the
    dashboards and the failed-RPC alert read it per member."""
    from tests.integration.test_metrics import scrape

    writer, (follower, _) = writer_and_followers
    base = f"http://{follower.endpoint}"

    def put_counts() -> tuple[float, dict[str, float]]:
        m = scrape(base)
        labels = (("grpc_method", "Put"), ("grpc_service", "etcdserverpb.KV"), ("grpc_type", "unary"))
        return m[("grpc_server_started_total", labels)], {
            code: m[("grpc_server_handled_total", (("grpc_code", code), *labels))]
            for code in ("OK", "NotFound", "Unavailable")}

    def client_requests() -> tuple[float, float]:
        m = scrape(base)
        return tuple(m.get(("etcd_server_client_requests_total", (("client_api_version", "unknown"), ("type", kind))), 0)
                     for kind in ("unary", "stream"))

    before = client_requests()
    with grpc.insecure_channel(follower.endpoint) as ch:
        kv = pbg.KVStub(ch)
        for i in range(3):
            kv.Put(pb.PutRequest(key=b"/registry/pods/m%d" % i, value=b"v"), timeout=10)
        with pytest.raises(grpc.RpcError) as refused:  # the writer refuses it: a lease that does not exist
            kv.Put(pb.PutRequest(key=b"/registry/pods/m", value=b"v", lease=12345), timeout=10)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        lease = pbg.LeaseStub(ch).LeaseGrant(pb.LeaseGrantRequest(TTL=60), timeout=10).ID
        answers = pbg.LeaseStub(ch).LeaseKeepAlive(iter([pb.LeaseKeepAliveRequest(ID=lease)]), timeout=10)
        assert [a.TTL for a in answers] == [60]
        after = client_requests()
        assert (after[0] - before[0], after[1] - before[1]) == (5, 1)  # 4 puts and a grant; a keep-alive stream
        m = scrape(base)
        keepalive = (("grpc_method", "LeaseKeepAlive"), ("grpc_service", "etcdserverpb.Lease"), ("grpc_type", "bidi_stream"))
        assert (m[("grpc_server_started_total", keepalive)], m[("grpc_server_msg_received_total", keepalive)],
                m[("grpc_server_msg_sent_total", keepalive)]) == (1, 1, 1)
        writer.kill()
        with pytest.raises(grpc.RpcError) as gone:  # no writer to hand it to
            kv.Put(pb.PutRequest(key=b"/registry/pods/gone", value=b"v"), timeout=20)
        assert gone.value.code() == grpc.StatusCode.UNAVAILABLE, gone.value
    started, handled = put_counts()
    assert (started, handled) == (5, {"OK": 3, "NotFound": 1, "Unavailable": 1}), (started, handled)
