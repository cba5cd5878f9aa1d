"""A writer deposed without knowing it must not answer from its state (JetStream).

The journals' fence stops a deposed writer's *writes*: JetStream refuses its
appends.  Nothing stops its *reads*: a writer cut off from NATS, or paused past
its writer lease's TTL, still holds its state while a standby takes the lease,
fences the journals and acknowledges newer writes.  A linearizable read, a
read-only Txn, a lease keep-alive or a follower's read index answered from that
state would be stale: the newer writes are acknowledged, yet not there.  etcd
answers none of these on a member cut off from its quorum; neither may we.

Each test here failed before the writer checked its lease (journal/leadership.py,
Member.unsure_writer): the deposed writer answered the old value.
"""
from __future__ import annotations

import concurrent.futures
import os
import signal
import time
from types import SimpleNamespace

import grpc
import pytest

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from shim.context import READ_INDEX_METADATA
from tests.integration.followkit import (NO_LEADER, REQUIRE_LEADER, require_leader_watches_end_and_come_back,
                                         wait_until)
from tests.nats_fixture import shardetcd_on as server_on, start_nats_cluster, wait_standing_by
from tests.tcp_proxy import TcpProxy
from tests.watch_client import WatchClient

KEY = b"/registry/configmaps/default/owner"
TIMED_OUT = (grpc.StatusCode.UNAVAILABLE, "etcdserver: request timed out")
LEADER_CHANGED = (grpc.StatusCode.UNAVAILABLE, "etcdserver: leader changed")
TTL_S = 3.0  # --journal-lease-ttl's default


def refused(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        got = call()
        print("answered:", got)
    return caught.value.code(), caught.value.details()


def test_a_writer_cut_off_from_nats_answers_no_stale_linearizable_read(tmp_path):
    """The writer reaches NATS through proxies that are then cut; clients still reach it. A
    standby takes over and acknowledges a newer value. On the cut-off writer a serializable
    read may show the old value (as on an etcd member cut off from its quorum), but a
    linearizable Range, a read-only Txn, a lease keep-alive and a read index answer etcd's
    "request timed out", and a watch that requires a leader (kube-apiserver's) ends with "no
    leader". The new writer dies as well and its lease lapses; once NATS is
    reachable again, the old writer finds the lease free and takes it, but fencing the
    journals again shows another process wrote meanwhile: it stops (exit 1) without having
    answered a stale read."""
    nats = start_nats_cluster(tmp_path / "nats", size=3, extra=("--no_advertise",))
    proxies = [TcpProxy(s.client_port).start() for s in nats.servers]
    urls = ",".join(f"nats://127.0.0.1:{p.port}" for p in proxies)
    writer = server_on(SimpleNamespace(urls=urls), tmp_path / "w").start()
    standby = server_on(nats, tmp_path / "s", "--standby").start(wait=False)
    try:
        wait_standing_by(standby)
        with grpc.insecure_channel(writer.endpoint) as ch:
            kv, leases = pbg.KVStub(ch), pbg.LeaseStub(ch)
            kv.Put(pb.PutRequest(key=KEY, value=b"old"), timeout=10)
            lease_id = leases.LeaseGrant(pb.LeaseGrantRequest(TTL=60), timeout=10).ID
            led, free = WatchClient(ch, metadata=(REQUIRE_LEADER,)), WatchClient(ch)  # kube-apiserver's: led
            for w in (led, free):
                w.create(KEY)
                w.wait_for(lambda rs: any(r.created for r in rs))
            for p in proxies:
                p.cut()
            standby.wait_ready(timeout=60)
            with grpc.insecure_channel(standby.endpoint) as sch:
                new_rev = pbg.KVStub(sch).Put(pb.PutRequest(key=KEY, value=b"new"), timeout=30).header.revision

            stale = kv.Range(pb.RangeRequest(key=KEY, serializable=True), timeout=10)
            assert [x.value for x in stale.kvs] == [b"old"] and stale.header.revision < new_rev
            assert refused(lambda: kv.Range(pb.RangeRequest(key=KEY), timeout=30)) == TIMED_OUT
            read_only = pb.TxnRequest(success=[pb.RequestOp(request_range=pb.RangeRequest(key=KEY))])
            assert refused(lambda: kv.Txn(read_only, timeout=30)) == TIMED_OUT
            keepalive = leases.LeaseKeepAlive(iter([pb.LeaseKeepAliveRequest(ID=lease_id)]), timeout=30)
            assert refused(lambda: next(keepalive)) == TIMED_OUT
            # Status answers (etcdctl endpoint status works on a cut-off etcd member), but not as a
            # follower's read index: that is a linearizable read's revision
            maintenance = pbg.MaintenanceStub(ch)
            assert maintenance.Status(pb.StatusRequest(), timeout=10).raftIndex < new_rev
            assert refused(lambda: maintenance.Status(pb.StatusRequest(), timeout=30,
                                                      metadata=(READ_INDEX_METADATA,))) == TIMED_OUT
            # etcd ends a stream opened WithRequireLeader once its member has had no leader for a
            # while, and refuses new ones, so that kube-apiserver watches elsewhere; others stay open
            wait_until("the require-leader watch to end", lambda: led.error is not None, timeout=30)
            assert (led.error.code(), led.error.details()) == NO_LEADER
            assert free.error is None and free._thread.is_alive()
            again = WatchClient(ch, metadata=(REQUIRE_LEADER,))
            wait_until("a new require-leader watch to be refused", lambda: again.error is not None, timeout=10)
            assert (again.error.code(), again.error.details()) == NO_LEADER
            free.close()
            # as etcd's interceptor: any call that requires a leader is refused at once meanwhile (a
            # deadline shorter than the 7 s a lease confirmation may take: not after waiting for one)
            assert refused(lambda: kv.Range(pb.RangeRequest(key=KEY, serializable=True), timeout=5,
                                            metadata=(REQUIRE_LEADER,))) == NO_LEADER
            assert refused(lambda: maintenance.Status(pb.StatusRequest(), timeout=5,
                                                      metadata=(REQUIRE_LEADER,))) == NO_LEADER
            # the new writer dies too, and its lease lapses: when NATS is reachable again the old
            # writer finds the lease free and takes it again, but must not trust it, since another
            # process wrote meanwhile: fencing the journals again after its own last message fails
            standby.kill()
            time.sleep(TTL_S + 2)
            for p in proxies:
                p.restore()
            while writer.running():
                try:
                    got = kv.Range(pb.RangeRequest(key=KEY), timeout=30)
                except grpc.RpcError:
                    time.sleep(0.1)
                    continue
                assert [x.value for x in got.kvs] != [b"old"], "the old writer took its lease again and answered stale"
        assert writer.returncode == 1
        assert "lost the writer lease while it had lapsed" in writer.log_tail(40), writer.log_tail(40)
        again = server_on(nats, tmp_path / "again").start()  # nothing was lost
        try:
            with grpc.insecure_channel(again.endpoint) as ch:
                got = pbg.KVStub(ch).Range(pb.RangeRequest(key=KEY), timeout=10)
                assert [x.value for x in got.kvs] == [b"new"] and got.header.revision >= new_rev
        finally:
            again.stop()
    finally:
        writer.kill()
        standby.kill()
        for p in proxies:
            p.close()
        nats.stop()


def test_a_writer_paused_past_its_lease_answers_no_stale_read_when_it_resumes(nats, tmp_path):
    """SIGSTOP the writer past its lease's TTL (a long GC pause, a stalled VM): a standby
    takes over and acknowledges a newer value. Linearizable reads sent to the paused writer
    wait in its socket; when it resumes, none of them is answered with the old value (each
    fails: "leader changed", or cancelled as the writer stops), and the writer stops (exit 1)."""
    writer = server_on(nats, tmp_path / "w").start()
    standby = server_on(nats, tmp_path / "s", "--standby").start(wait=False)
    pool = concurrent.futures.ThreadPoolExecutor(8)
    try:
        wait_standing_by(standby)
        with grpc.insecure_channel(writer.endpoint) as ch:
            kv = pbg.KVStub(ch)
            kv.Put(pb.PutRequest(key=KEY, value=b"old"), timeout=10)
            assert [x.value for x in kv.Range(pb.RangeRequest(key=KEY), timeout=10).kvs] == [b"old"]
            os.kill(writer.proc.pid, signal.SIGSTOP)
            try:
                standby.wait_ready(timeout=60)
                with grpc.insecure_channel(standby.endpoint) as sch:
                    pbg.KVStub(sch).Put(pb.PutRequest(key=KEY, value=b"new"), timeout=30)
                reads = [pool.submit(kv.Range, pb.RangeRequest(key=KEY), timeout=30) for _ in range(8)]
                time.sleep(0.5)  # sent, waiting in the paused writer's socket
            finally:
                os.kill(writer.proc.pid, signal.SIGCONT)
            answers = []
            for f in reads:
                try:
                    answers.append([x.value for x in f.result().kvs])
                except grpc.RpcError as exc:
                    answers.append((exc.code(), exc.details()))
            assert all(a != [b"old"] for a in answers), f"stale answers from the deposed writer: {answers}"
            # "leader changed"; or, for calls the stopping server had not taken up yet, cancelled
            assert all(a == LEADER_CHANGED or a[0] == grpc.StatusCode.CANCELLED for a in answers), answers
            assert LEADER_CHANGED in answers, answers
        wait_until("the deposed writer to stop", lambda: not writer.running())
        assert writer.returncode == 1
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        writer.kill()
        standby.kill()


def test_a_follower_cut_off_from_nats_ends_the_watches_that_require_a_leader(tmp_path):
    """A follower reaches NATS through proxies that are cut: it can no longer learn what the
    writer commits, so, as an etcd member that lost its leader, it ends the watches opened
    WithRequireLeader with "no leader" and refuses new ones, while other watches stay open.
    Once NATS is reachable again it accepts them, and they see new writes."""
    nats = start_nats_cluster(tmp_path / "nats", size=3, extra=("--no_advertise",))
    proxies = [TcpProxy(s.client_port).start() for s in nats.servers]
    writer = server_on(nats, tmp_path / "w").start()
    follower = server_on(SimpleNamespace(urls=",".join(f"nats://127.0.0.1:{p.port}" for p in proxies)),
                         tmp_path / "f", "--follow").start()
    try:
        def cut() -> None:
            for p in proxies:
                p.cut()

        def restore() -> None:
            for p in proxies:
                p.restore()

        require_leader_watches_end_and_come_back(follower.endpoint, writer.endpoint, cut, restore)
    finally:
        follower.kill()
        writer.kill()
        for p in proxies:
            p.close()
        nats.stop()


def test_a_writer_paused_past_its_lease_does_not_take_the_leaders_back_when_it_resumes(nats, tmp_path):
    """Each writer moves its journal streams' leaders to the NATS server it is connected to. One
    paused past its lease (SIGSTOP) resumes with its stream check overdue; that check must not pull
    the leaders back from the writer that took over (an election each, while the new writer
    writes): a writer not sure of its lease moves none. Writer and standby each on a NATS server
    of its own."""
    from journal.jetstream import STREAM_CHECK_S
    from shards.layout import load_layout

    streams = [f"shardetcd_{name}" for name in load_layout(None).names]
    on = [SimpleNamespace(urls=s.url) for s in nats.servers]
    writer = server_on(on[0], tmp_path / "w", "--log-level", "info").start()
    standby = server_on(on[1], tmp_path / "s", "--standby").start(wait=False)

    def leaders() -> list[str | None]:
        return [nats.stream_leader(s, asking=1) for s in streams]

    def moves(server) -> int:
        return server.log_path.read_text().count("journal stream leader moved to this writer's NATS server")

    try:
        wait_standing_by(standby)
        assert leaders() == ["n0"] * len(streams), writer.log_tail(30)
        time.sleep(STREAM_CHECK_S + 1)  # a check of the writer's has seen them at home: none held back
        before = moves(writer)
        os.kill(writer.proc.pid, signal.SIGSTOP)
        try:
            standby.wait_ready(timeout=60)
            with grpc.insecure_channel(standby.endpoint) as sch:
                pbg.KVStub(sch).Put(pb.PutRequest(key=KEY, value=b"new"), timeout=30)
            wait_until("the new writer's check to move the leaders to n1", lambda: leaders() == ["n1"] * len(streams),
                       timeout=30)
            time.sleep(STREAM_CHECK_S)  # the paused writer's check overdue, whenever it last ran
        finally:
            os.kill(writer.proc.pid, signal.SIGCONT)
        wait_until("the deposed writer to stop", lambda: not writer.running())
        assert writer.returncode == 1
        assert moves(writer) == before, writer.log_tail(30)
        assert leaders() == ["n1"] * len(streams)
    finally:
        writer.kill()
        standby.kill()
