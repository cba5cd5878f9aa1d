"""Faults of a JetStream journal under 32 concurrent writers, on three real NATS
servers (issue 14.6): the NATS connections cut and restored, the NATS servers
stopped (SIGSTOP) so that publishes time out, JetStream storage full, and a
publish JetStream refuses for good.

Each recoverable fault must end the same way: no acknowledged write lost (also
on a fresh data dir, from NATS alone), no record stored twice (read back from
the streams: every message id and every WRITE revision once), writes either
acknowledged or answered etcd's "request timed out", reads served during the
fault (serializable ones all along; linearizable ones while the writer lease can be
confirmed, else etcd's "request timed out"), writes going on afterwards, and a log line
naming the cause.
"""
from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest

from journal.jetstream import CUT_HEADER, FENCE_HEADER, STREAM_CHECK_S, list_streams, retrying, writer_bucket_streams
from journal.record import decode_frame
from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from shards.record import WRITE
from tests.integration.test_jetstream import TIMED_OUT, Writers, check_everything_acknowledged, everything
from tests.nats_fixture import connected_to, shardetcd_on as server_on, start_nats_cluster
from tests.tcp_proxy import TcpProxy

PREFIX = "shardetcd"


def wait_for(what: str, check, timeout: float = 60.0, every: float = 0.2, server=None):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if server is not None:
            assert server.running(), f"shardetcd exited while waiting for {what}:\n{server.log_tail(20)}"
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(every)


def nats_call(urls: str, fn):
    """Run ``await fn(js)`` on a fresh NATS connection (the test's own, not shardetcd's)."""
    import nats

    async def go():
        nc = await nats.connect(servers=urls.split(","), connect_timeout=10, max_reconnect_attempts=60,
                                reconnect_time_wait=0.5)
        try:
            return await fn(nc.jetstream(timeout=10))  # (callers retry what a just-healed cluster may refuse)
        finally:
            await nc.close()

    return asyncio.run(go())


async def read_stream(js, stream: str) -> list[tuple[int, dict, bytes]]:
    """Every message of a stream: (sequence, headers, data)."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    info = await retrying("stream info", lambda: js.stream_info(stream), deadline_s=60)
    first, last = info.state.first_seq, info.state.last_seq
    if info.state.messages == 0:
        return []
    sub = await js.pull_subscribe(f"journal.{stream}", stream=stream, config=ConsumerConfig(
        deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE, inactive_threshold=60.0))
    out: list[tuple[int, dict, bytes]] = []
    try:
        seq = first - 1
        while seq < last:
            for msg in await retrying("fetch", lambda: sub.fetch(batch=256, timeout=10.0), deadline_s=60):
                seq = msg.metadata.sequence.stream
                out.append((seq, dict(msg.headers or {}), msg.data))
    finally:
        await sub.unsubscribe()
    return out


def check_stored_once(urls: str) -> dict[str, int]:
    """Every journal stream read back: each message id once, each WRITE revision in exactly
    one record of one message (JetStream's dedup of retried publishes); WRITE records per stream."""

    async def go(js):
        found = {}
        for info in await list_streams(js, deadline_s=60):
            stream = info.config.name
            if not stream.startswith(PREFIX + "_") or info.config.subjects != [f"journal.{stream}"]:
                continue
            ids: Counter[str] = Counter()
            writes: Counter[int] = Counter()
            for seq, headers, data in await read_stream(js, stream):
                ids[headers.get("Nats-Msg-Id")] += 1
                if FENCE_HEADER in headers or CUT_HEADER in headers:
                    continue
                pos = 0
                while pos < len(data):
                    frame = decode_frame(data, pos, len(data))
                    if frame.rtype == WRITE:
                        writes[frame.rev] += 1
                    pos = frame.end
            twice = {i: n for i, n in ids.items() if n > 1}
            assert not twice, f"{stream}: message ids stored more than once: {twice}"
            twice = {rev: n for rev, n in writes.items() if n > 1}
            assert not twice, f"{stream}: WRITE revisions stored more than once: {twice}"
            found[stream] = len(writes)
        return found

    return nats_call(urls, go)


def run_under_fault(nats, tmp_path: Path, begin, end, *, urls: str | None = None, fault_s: float = 10.0,
                    begun=None) -> tuple[str, Writers]:
    """32 writers; ``begin()`` the fault (``begun()``: until it has bitten), hold it ``fault_s``
    (longer than the 7 s request timeout) while reads are checked, ``end()`` it; then writes
    must go on, every acknowledged write be served (and served again from NATS alone by a
    server on a fresh data dir), and nothing be stored twice. ``urls``: where the server
    reaches NATS (default: the servers themselves). Returns (log, writers)."""
    server = server_on(SimpleNamespace(urls=urls or nats.urls), tmp_path / "a").start()
    writers = Writers(server.endpoint, through_timeouts=True)
    try:
        wait_for("200 writes acknowledged before the fault", lambda: writers.acks >= 200, server=server)
        with grpc.insecure_channel(server.endpoint) as ch:
            kv = pbg.KVStub(ch)
            before = kv.Put(pb.PutRequest(key=b"/registry/pods/before", value=b"v"), timeout=10).header.revision
            begin()
            if begun is not None:
                wait_for("the fault to bite", begun, timeout=120, server=server)
            deadline = time.monotonic() + fault_s
            reads = 0
            while time.monotonic() < deadline:  # serializable reads are served all along
                rows, rev = everything(ch, serializable=True)
                assert rev >= before and (b"/registry/pods/before", b"v") in {(r[0], r[1]) for r in rows}
                reads += 1
                time.sleep(0.5)
            try:  # a linearizable one only while the writer lease is sure (NATS must confirm it)
                rows, rev = everything(ch)
                assert rev >= before and (b"/registry/pods/before", b"v") in {(r[0], r[1]) for r in rows}
            except grpc.RpcError as exc:
                assert (exc.code(), exc.details()) == TIMED_OUT
            acks_in_fault = writers.acks
            end()
            wait_for("writes acknowledged again after the fault", lambda: writers.acks > acks_in_fault + 100,
                     timeout=120, server=server)
            after = kv.Put(pb.PutRequest(key=b"/registry/pods/after", value=b"v"), timeout=60).header.revision
        acked = writers.join()
        assert writers.errors == [], f"writes must be acknowledged or time out: {writers.errors[:5]}"
        assert writers.timeouts > 0, "the fault outlasted the request timeout, so some writes timed out"
        assert reads >= 2
        with grpc.insecure_channel(server.endpoint) as ch:
            final = check_everything_acknowledged(ch, acked)
            assert final >= after
        assert server.stop() == 0
        log = server.log_path.read_text(errors="replace")
        stored = check_stored_once(nats.urls)
        assert sum(stored.values()) >= len({r for _, r in acked.values()})
        again = server_on(nats, tmp_path / "b").start()  # nothing of a's disk: the journal is NATS
        try:
            with grpc.insecure_channel(again.endpoint) as ch:
                assert check_everything_acknowledged(ch, acked) == final
        finally:
            again.stop()
        return log, writers
    finally:
        writers.join()
        server.kill()


def test_nats_connections_cut_and_restored(tmp_path):
    """Every TCP connection between shardetcd and the NATS servers dropped, new ones
    refused, for longer than the request timeout; then let through again."""
    nats = start_nats_cluster(tmp_path / "nats", size=3, extra=("--no_advertise",))
    proxies = [TcpProxy(s.client_port).start() for s in nats.servers]
    try:
        def cut():
            for p in proxies:
                p.cut()

        def restore():
            for p in proxies:
                p.restore()

        urls = ",".join(f"nats://127.0.0.1:{p.port}" for p in proxies)
        log, _ = run_under_fault(nats, tmp_path, cut, restore, urls=urls)
        assert "nats disconnected; publishes wait for the reconnect" in log
        assert "nats reconnected" in log
        assert "journal publish acknowledged after retrying" in log
        # the cut outlasted the writer lease: taken again, and trusted after fencing the journals again
        assert "writer lease taken again after it lapsed" in log
    finally:
        for p in proxies:
            p.close()
        nats.stop()


def test_nats_servers_stopped_so_publishes_time_out(tmp_path):
    """SIGSTOP all three NATS servers: connections stay up, nothing answers, publishes
    time out and are retried under the same message id; SIGCONT: the stored copy is the
    only one (JetStream's dedup answers the retries as duplicates)."""
    nats = start_nats_cluster(tmp_path / "nats", size=3)
    try:
        def stop():
            for i in range(3):
                nats.pause(i)

        def cont():
            for i in range(3):
                nats.resume(i)

        log, _ = run_under_fault(nats, tmp_path, stop, cont)
        assert "journal publish not acknowledged, retrying" in log and "cause=timeout" in log
        assert "journal publish acknowledged after retrying" in log
    finally:
        for i in range(3):
            nats.resume(i)
        nats.stop()


def test_a_frozen_nats_server_is_left_for_the_other_two(tmp_path):
    """SIGSTOP the one NATS server (of three) the writer is connected to: its TCP
    connection stays open and nothing on it is ever answered, as when that machine is
    lost without closing its connections (power, a kernel hang, dropped packets). The
    writer must find the connection stale and go on through the other two: writes are
    acknowledged again while the server is still frozen. (nats-py's default ping
    interval, two minutes with two pings outstanding, left every write and lease
    renewal waiting on it for the whole freeze.)"""
    nats = start_nats_cluster(tmp_path / "nats", size=3)
    server = server_on(nats, tmp_path / "a").start()
    writers = Writers(server.endpoint, through_timeouts=True)
    try:
        wait_for("200 writes acknowledged before the fault", lambda: writers.acks >= 200, server=server)
        (frozen,) = connected_to(nats)
        nats.pause(frozen)
        acks_at_freeze = writers.acks
        wait_for(f"writes acknowledged while NATS server {frozen} is frozen",
                 lambda: writers.acks > acks_at_freeze + 200, timeout=60, server=server)
        nats.resume(frozen)
        acked = writers.join()
        assert writers.errors == [], f"writes must be acknowledged or time out: {writers.errors[:5]}"
        log = server.log_tail(200)
        assert "nats reconnected" in log, log
        with grpc.insecure_channel(server.endpoint) as ch:
            check_everything_acknowledged(ch, acked)
        assert server.stop() == 0
    finally:
        writers.join()
        server.kill()
        nats.stop()


FILLER = "filler"


def test_jetstream_storage_full_then_freed(tmp_path):
    """The NATS servers' JetStream store (max_file_store) filled by another stream while
    shardetcd writes: its publishes are refused, logged as storage full, retried under the
    same message id; writes time out, serializable reads go on; the filler deleted, the queued writes
    land once."""
    nats = start_nats_cluster(tmp_path / "nats", size=3, max_store_bytes=24 * 1024 * 1024)
    filled = []

    def fill():
        async def go(js):
            from nats.js.api import StorageType, StreamConfig

            await retrying("add stream", lambda: js.add_stream(StreamConfig(
                name=FILLER, subjects=["filler"], num_replicas=3, storage=StorageType.FILE)), deadline_s=60)
            for i in range(200):
                try:
                    await js.publish("filler", b"f" * (512 * 1024), timeout=10)
                except Exception as exc:  # noqa: BLE001 - what the store says when it is full
                    filled.append(exc)
                    return
            raise AssertionError("the store never filled up")

        nats_call(nats.urls, go)

    def free():
        nats_call(nats.urls, lambda js: js.delete_stream(FILLER))

    server_log = tmp_path / "a" / "shardetcd.log"
    try:
        log, _ = run_under_fault(nats, tmp_path, fill, free, begun=lambda: "JetStream storage is full" in
                                 server_log.read_text(errors="replace"))
        refused = [line for line in log.splitlines() if "journal publish refused: JetStream storage is full" in line]
        assert refused and "err_code=10023" in refused[0] and "stream=shardetcd_" in refused[0], refused[:3]
        retried = [line for line in log.splitlines() if "journal publish acknowledged after retrying" in line]
        # a loaded machine can add timeouts to the causes (causes=timeout,storage-full)
        assert any("storage-full" in line.split("causes=", 1)[1].split()[0].split(",") for line in retried), retried[:3]
        assert getattr(filled[0], "err_code", None) == 10023, filled
    finally:
        nats.stop()


def test_a_publish_jetstream_refuses_for_good_is_fail_stop(tmp_path):
    """A JetStream API error that is neither transient nor "storage full" (here: the
    stream's max message size lowered under it) ends the server: exit 1, one line naming
    the error code and description; what was acknowledged before is still served after."""
    nats = start_nats_cluster(tmp_path / "nats", size=3)
    try:
        server = server_on(nats, tmp_path / "a").start()
        try:
            with grpc.insecure_channel(server.endpoint) as ch:
                kv = pbg.KVStub(ch)
                rev = kv.Put(pb.PutRequest(key=b"/registry/pods/ok", value=b"v"), timeout=10).header.revision

                async def shrink(js):
                    info = await js.stream_info(f"{PREFIX}_pods")
                    info.config.max_msg_size = 256
                    await js.update_stream(info.config)

                nats_call(nats.urls, shrink)
                with pytest.raises(grpc.RpcError):
                    kv.Put(pb.PutRequest(key=b"/registry/pods/big", value=b"x" * 1000), timeout=30)
            assert server.proc.wait(timeout=60) == 1
            log = server.log_path.read_text(errors="replace")
            last = log.strip().splitlines()[-1]
            assert last.startswith("shardetcd: stopped after a journal failure:"), last
            assert "err_code=10054" in last and "message size exceeds maximum allowed" in last, last
            assert "journal publish refused by JetStream, failing" in log
        finally:
            server.kill()

        async def grow(js):
            info = await js.stream_info(f"{PREFIX}_pods")
            info.config.max_msg_size = -1
            await js.update_stream(info.config)

        nats_call(nats.urls, grow)
        again = server_on(nats, tmp_path / "b").start()
        try:
            with grpc.insecure_channel(again.endpoint) as ch:
                got = pbg.KVStub(ch).Range(pb.RangeRequest(key=b"/registry/pods/ok"), timeout=10)
                assert [(kv_.value, kv_.mod_revision) for kv_ in got.kvs] == [(b"v", rev)]
        finally:
            again.stop()
    finally:
        nats.stop()


def test_losing_a_nats_server_other_than_the_writers_leaves_its_lease_alone(tmp_path):
    """The writer lease is renewed through its bucket's stream leader. Led from a NATS server that is
    then lost, the other two elect a new leader in their own time (3.3 s when probed): the lease
    lapsed and linearizable reads waited 2.2 s, although the writer's own server and its journals'
    leaders were fine. A writer leads its buckets' streams (lease, meta, members) and its checkpoint
    buckets' from its own NATS server, as it does its journals': a move away is undone by its next
    check, and losing another server leaves the lease renewed and every request answered."""
    import json

    nats = start_nats_cluster(tmp_path / "nats", size=3)
    writer = server_on(SimpleNamespace(urls=nats.servers[0].url), tmp_path / "w", "--log-level", "info").start()
    streams = [*writer_bucket_streams(PREFIX), f"OBJ_{PREFIX}_pods-checkpoints"]
    lease_stream = writer_bucket_streams(PREFIX)[1]

    def led_from(server: str) -> bool:
        return all(nats.stream_leader(s) == server for s in streams)

    async def move_away(js) -> dict:
        answer = await js._nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{lease_stream}",
                                      json.dumps({"placement": {"preferred": "n1"}}).encode(), timeout=10)
        return json.loads(answer.data)

    try:
        wait_for("the writer's buckets led from its NATS server n0", lambda: led_from("n0"), timeout=30,
                 server=writer)
        time.sleep(STREAM_CHECK_S + 1)  # a check has seen them here since it moved them: a new move is not held back
        assert nats_call(nats.urls, move_away).get("success"), "NATS did not move the lease bucket's leader"
        wait_for("the lease bucket led from n0 again", lambda: led_from("n0"), timeout=30, server=writer)
        with grpc.insecure_channel(writer.endpoint) as ch:
            kv = pbg.KVStub(ch)
            kv.Put(pb.PutRequest(key=b"/registry/pods/ns/a", value=b"0"), timeout=10)
            mark = writer.log_path.stat().st_size
            nats.kill(1)
            deadline = time.monotonic() + 8  # beyond the lease's TTL (3 s) and a new leader's election
            i = 0
            while time.monotonic() < deadline:
                i += 1
                rev = kv.Put(pb.PutRequest(key=b"/registry/pods/ns/a", value=b"%d" % i), timeout=10).header.revision
                got = kv.Range(pb.RangeRequest(key=b"/registry/pods/ns/a"), timeout=10)
                assert (got.kvs[0].value, got.kvs[0].mod_revision) == (b"%d" % i, rev)
                time.sleep(0.05)
        after = writer.log_path.read_bytes()[mark:].decode(errors="replace")
        # one renewal retried on a loaded machine (a CI run: renewed again 0.2 s later) is no lapse; an
        # election waited for is a run of failed renewals (logged with their count), then a lapse past the TTL
        failed_in_a_row = [int(n) for n in re.findall(r"writer lease (?:not renewed, retrying|renewed again) failures=(\d+)",
                                                      after)]
        assert "lapsed" not in after and all(n == 1 for n in failed_in_a_row), after[-3000:]
        assert writer.stop() == 0
    finally:
        writer.kill()
        nats.stop()


def test_metrics_show_the_nats_connection_and_the_writer_lease_through_a_cut(tmp_path):
    """What an operator alerts on before writes stall: /metrics of the writer and of a standby say
    whether their NATS connection is up, count its losses, reconnects and errors, and the
    writer's lease renewals NATS did not answer and lapses; a local journal shows none of them."""
    from tests.etcd_fixture import free_port
    from tests.integration.test_metrics import scrape

    nats = start_nats_cluster(tmp_path / "nats", size=1)
    proxy = TcpProxy(nats.servers[0].client_port).start()
    via = SimpleNamespace(urls=f"nats://127.0.0.1:{proxy.port}")
    standby_metrics = f"http://127.0.0.1:{free_port()}"
    # a lease of 15 s (renewed every 5): the cut fails a renewal well before the standby could take
    # the lease, also on a loaded machine (with the default 3 s it once did, and the writer stopped)
    ttl = ("--journal-lease-ttl", "15")
    writer = server_on(via, tmp_path / "w", "--journal-replicas", "1", *ttl).start()
    standby = server_on(nats, tmp_path / "s", "--journal-replicas", "1", "--standby", *ttl,
                        "--listen-metrics-urls", standby_metrics)
    try:
        standby.start(wait=False)
        def standing_by() -> bool:
            try:
                return scrape(standby_metrics).get(("shardetcd_standby", ())) == 1
            except OSError:  # not serving them yet
                return False

        wait_for("the standby's metrics", standing_by, server=standby)
        base = writer.client_url
        m = scrape(base)
        assert m[("shardetcd_journal_nats_connected", ())] == 1
        assert m[("shardetcd_journal_nats_disconnects_total", ())] == 0
        assert m[("shardetcd_journal_nats_reconnects_total", ())] == 0
        assert m[("shardetcd_writer_lease_renewal_failures_total", ())] == 0
        assert m[("shardetcd_writer_lease_lapses_total", ())] == 0
        s = scrape(standby_metrics)
        assert s[("shardetcd_journal_nats_connected", ())] == 1 and ("shardetcd_writer_lease_lapses_total", ()) not in s

        proxy.cut()
        m = wait_for("the writer to see the cut", lambda: (got := scrape(base))[
            ("shardetcd_journal_nats_connected", ())] == 0 and got[
            ("shardetcd_writer_lease_renewal_failures_total", ())] > 0 and got, server=writer)
        assert m[("shardetcd_journal_nats_disconnects_total", ())] == 1
        assert m[("shardetcd_journal_nats_errors_total", ())] > 0  # its reconnects are refused meanwhile
        proxy.restore()
        m = wait_for("the writer to reconnect", lambda: (got := scrape(base))[
            ("shardetcd_journal_nats_connected", ())] == 1 and got, server=writer)
        assert m[("shardetcd_journal_nats_reconnects_total", ())] == 1
        with grpc.insecure_channel(writer.endpoint) as ch:  # and it writes again
            pbg.KVStub(ch).Put(pb.PutRequest(key=b"/registry/pods/after", value=b"v"), timeout=30)
        assert scrape(standby_metrics)[("shardetcd_journal_nats_disconnects_total", ())] == 0  # not through the proxy
    finally:
        writer.kill()
        standby.kill()
        proxy.close()
        nats.stop()
