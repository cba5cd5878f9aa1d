"""Journal records that were acknowledged and are gone: found at start, and nothing is cut.

A restart keeps the longest prefix of revisions whole on every shard and cuts what is above it,
which is right after a crash: above the prefix, nothing was acknowledged. It is wrong when
acknowledged records are missing (a segment deleted, a journal disk replaced or restored from an
older copy): the cut would destroy more acknowledged writes on the other shards, and the server
would serve a past state as the present. The writer's watermark says up to which revision writes
were acknowledged; a start whose journals do not reach it is refused.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import grpc

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.etcd_fixture import free_port
from tests.nats_fixture import shardetcd_on, wait_standing_by
from tests.shardetcd_fixture import ShardetcdStartError, start_shardetcd

REPO = Path(__file__).resolve().parents[2]


def put_both(server, first: int, last: int) -> None:
    """Alternate a pods key (shard pods) and a plain key (shard default): each shard's records
    interleave in the one revision sequence."""
    with grpc.insecure_channel(server.endpoint) as ch:
        kv = pbg.KVStub(ch)
        for i in range(first, last):
            kv.Put(pb.PutRequest(key=b"/registry/pods/ns/p%d" % i, value=b"v"), timeout=10)
            kv.Put(pb.PutRequest(key=b"k%d" % i, value=b"v"), timeout=10)


def keys(server) -> list[bytes]:
    with grpc.insecure_channel(server.endpoint) as ch:
        return [kv.key for kv in pbg.KVStub(ch).Range(pb.RangeRequest(key=b"\0", range_end=b"\0"), timeout=10).kvs]


def journal_bytes(data, shard: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((data / "shards" / shard / "journal").glob("*.wal"))}


def refused_start(server) -> str:
    """The line a start that must be refused ends with."""
    try:
        server.start()
    except ShardetcdStartError:
        return server.log_tail(1)
    server.kill()
    raise AssertionError("started with acknowledged writes missing")


def older_pods_journal(tmp_path, extra_args=()):
    """A server whose pods journal is put back to a copy taken after 5 of 8 rounds of writes
    (and killed with SIGKILL: no checkpoint on the way out covers the lost records)."""
    server = start_shardetcd(tmp_path, extra_args=extra_args)
    journal = server.data_dir / "shards" / "pods" / "journal"
    try:
        put_both(server, 0, 5)
        shutil.copytree(journal, tmp_path / "pods-journal-copy")
        put_both(server, 5, 8)
    finally:
        server.kill()
    shutil.rmtree(journal)
    shutil.copytree(tmp_path / "pods-journal-copy", journal)
    return server


def test_acknowledged_records_missing_stop_the_start_and_nothing_is_cut(tmp_path):
    server = older_pods_journal(tmp_path)
    data = server.data_dir.absolute()
    default_before = journal_bytes(data, "default")
    last = refused_start(server)
    assert last.startswith(f"shardetcd: writes were acknowledged up to revision 17 (the writer's watermark "
                           f"{data}/watermark), but the journals hold every revision only up to 11"), last
    assert "pods 10," in last and "default 17)" in last and f"delete {data}/watermark" in last, last
    assert journal_bytes(data, "default") == default_before, "the other shard's acknowledged records are all kept"
    verify = subprocess.run([sys.executable, "-m", "shim", "journal", "verify", "--data-dir", str(data)], cwd=REPO,
                            capture_output=True, text=True, timeout=60)  # says so too, before any start
    assert verify.returncode == 1 and "acknowledged: writes up to revision 17 (the writer's watermark), but the " \
        "journals hold every revision only up to 11" in verify.stdout, verify.stdout
    assert refused_start(server) == last, "a refused start keeps what it refused on: the next one refuses too"
    # the operator's choice, as the line says: serve what is left
    (data / "watermark").unlink()
    server.start()
    try:
        assert keys(server) == sorted([b"/registry/pods/ns/p%d" % i for i in range(5)] +
                                      [b"k%d" % i for i in range(5)])
    finally:
        server.stop()
    verify = subprocess.run([sys.executable, "-m", "shim", "journal", "verify", "--data-dir", str(data)], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0 and "acknowledged: writes up to revision 11 (the writer's watermark), every one " \
        "in the journals" in verify.stdout, verify.stdout


def test_with_fsync_off_a_shorter_journal_is_what_an_os_crash_may_leave(tmp_path):
    """fsync off loses acknowledged writes in an OS crash by design: the start is not refused."""
    server = older_pods_journal(tmp_path, ("--journal-fsync", "off"))
    server.start()
    try:
        assert len(keys(server)) == 10
    finally:
        server.stop()


def released_past_a_checkpoint(tmp_path):
    """A killed server whose pods journal's oldest segments were deleted by hand, records above its
    checkpoint with them, while another shard holds a checkpoint above them (default, whose journal
    holds a record from before them). Returns (server, pods checkpoint revision, revision of the first
    pods record kept, last acknowledged revision, (the first segment the writer's last release kept,
    the first one left))."""
    from journal.checkpoint import write_checkpoint
    from journal.segment import list_segments, parse_segment_name
    from shards.layout import load_layout
    from shards.shard import checkpoint_meta

    server = start_shardetcd(tmp_path, extra_args=("--journal-segment-bytes", "2048",
                                                   "--checkpoint-journal-bytes", "8192"))
    data = server.data_dir.absolute()
    pods = data / "shards" / "pods"

    def newest_checkpoint() -> int:
        return max((int(p.name[11:27], 16) for p in pods.glob("checkpoint-*.ckpt")), default=0)

    def after(rev: int) -> list[int]:  # segment seqs whose first record is above rev
        return [seq for seq, path in list_segments(pods / "journal") if parse_segment_name(path.name)[1] > rev]

    try:
        with grpc.insecure_channel(server.endpoint) as ch:
            kv = pbg.KVStub(ch)
            kv.Put(pb.PutRequest(key=b"k", value=b"v"), timeout=10)  # default's first record: revision 2
            for i in range(400):  # until the pods journal was released and holds 3 segments past its checkpoint
                last = kv.Put(pb.PutRequest(key=b"/registry/pods/ns/p%d" % (i % 10), value=b"v" * 400),
                              timeout=10).header.revision
                ckpt = newest_checkpoint()
                if ckpt and list_segments(pods / "journal")[0][0] > 0 and len(after(ckpt)) >= 3:
                    break
            else:
                raise AssertionError("the pods journal never held 3 segments past a checkpoint")
    finally:
        server.kill()
    ckpt = newest_checkpoint()
    keep_from = after(ckpt)[1]
    released = int((pods / "journal" / "released").read_text())  # the first segment the writer's release kept
    assert released < keep_from
    kept_first_rev = None
    for seq, path in list_segments(pods / "journal"):
        if seq < keep_from:
            path.unlink()  # (a prefix: no gap in the segment sequence)
        elif kept_first_rev is None:
            kept_first_rev = parse_segment_name(path.name)[1]
    sid = load_layout(None).names.index("default")
    write_checkpoint(data / "shards" / "default", last, checkpoint_meta(last, -1, sid), [])
    return server, ckpt, kept_first_rev, last, (released, keep_from)


def test_verify_names_revisions_released_past_a_shards_checkpoint(tmp_path):
    """The pods journal released past its checkpoint by hand while default's checkpoint is above the
    hole (released_past_a_checkpoint). The journal starts past the first segment its writer's last
    release kept (its `released` marker): verify says so and the start refuses at that journal's
    open, nothing cut. Without the marker (one deleted, or a journal released before markers), the
    start's walk begins at the highest checkpoint and does not see the hole, and the watermark is
    reached; but each revision is a record in some journal, and these are in none and under no
    checkpoint of a journal whose records start past them: verify names them, the start refuses."""
    from journal.checkpoint import checkpoint_name as ckpt_name

    server, ckpt, kept_first_rev, last, (released, first) = released_past_a_checkpoint(tmp_path)
    data = server.data_dir.absolute()
    journal = data / "shards" / "pods" / "journal"
    verify = subprocess.run([sys.executable, "-m", "shim", "journal", "verify", "--data-dir", str(data)], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert verify.returncode == 1, verify.stdout
    head = (f"segments {released}..{first - 1} are missing, but its writer released only the segments before "
            f"{released} ({journal}/released): their records were removed by something else (deleted by hand?)")
    assert f"pods: journal: corrupt, 0 records, empty; {head}: start-up refuses this shard" in \
        verify.stdout.splitlines(), verify.stdout
    assert f"pods: {ckpt_name(ckpt)}: ok" in verify.stdout, verify.stdout
    assert (f"acknowledged: writes up to revision {last} (the writer's watermark), but revisions "
            f"{ckpt + 1}..{kept_first_rev - 1} are in no journal, and no checkpoint of a journal whose records start "
            "past them reaches them: acknowledged records are gone, and a start refuses this data dir") in \
        verify.stdout.splitlines(), verify.stdout
    before = journal_bytes(data, "pods")
    repair = subprocess.run([sys.executable, "-m", "shim", "journal", "repair", "--data-dir", str(data)], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert repair.returncode == 1 and f"pods: cannot repair: journal {journal}: {head}." in repair.stdout, \
        (repair.stdout, repair.stderr)
    refused = refused_start(server)
    assert refused.startswith(f"shardetcd: journal {journal}: {head}. Refusing to open it, and nothing was cut"), refused
    assert f"delete {journal}/released and start again" in refused, refused

    (journal / "released").unlink()  # then the start asks the same as verify's acknowledged line
    refused = refused_start(server)
    assert refused.startswith(f"shardetcd: writes were acknowledged up to revision {last} (the writer's watermark "
                              f"{data}/watermark), but revisions {ckpt + 1}..{kept_first_rev - 1} are in no journal, "
                              "and no checkpoint of a journal whose records start past them reaches them"), refused
    assert f"delete {data}/watermark" in refused and journal_bytes(data, "pods") == before, "nothing is cut"


def test_a_local_follower_refuses_a_journal_released_past_its_checkpoint(tmp_path):
    """A follower of that data dir (--follow-data-dir) loads every record up to the highest checkpoint
    as it finds them: it would serve without the lost revisions, the pods keys they wrote older than
    the writer acknowledged them. It refuses the journal that starts past its writer's release, and
    with that marker gone, reads the writer's watermark before the journals and refuses the same way
    as the writer's start, without advising to delete the watermark a running writer owns."""
    from tests.shardetcd_fixture import ShardetcdProcess

    server, ckpt, kept_first_rev, last, (released, first) = released_past_a_checkpoint(tmp_path)
    data = server.data_dir.absolute()
    journal = data / "shards" / "pods" / "journal"
    follower = ShardetcdProcess(data_dir=tmp_path / "f" / "data", state_dir=tmp_path / "f" / "state",
                                port=free_port(), log_path=tmp_path / "f" / "shardetcd.log",
                                extra_args=("--follow", "--follow-data-dir", str(data)))
    refused = refused_start(follower)
    assert refused.startswith(f"shardetcd: journal {journal}: segments {released}..{first - 1} are missing, but its "
                              f"writer released only the segments before {released}"), refused
    assert refused.endswith("Refusing to follow it: a follower would serve without those records"), refused

    (journal / "released").unlink()
    refused = refused_start(follower)
    assert refused.startswith(f"shardetcd: writes were acknowledged up to revision {last} (the writer's watermark "
                              f"{data}/watermark), but revisions {ckpt + 1}..{kept_first_rev - 1} are in no journal"), \
        refused
    assert "Refusing to follow these journals" in refused and f"delete {data}" not in refused, refused


# -- a replicated journal: a JetStream stream deleted --------------------------------------------

def delete_stream(nats, name: str) -> None:
    import asyncio

    import nats as nats_client

    async def delete() -> None:
        nc = await nats_client.connect(nats.urls.split(","))
        try:
            await nc.jetstream().delete_stream(name)
        finally:
            await nc.close()

    asyncio.run(delete())


def wait_published(nats, revision: int, key: str = "acknowledged.default") -> None:
    """Until the writer's acknowledged revision (published at most once a second) reached the meta bucket."""
    import asyncio

    import nats as nats_client

    async def published() -> int:
        nc = await nats_client.connect(nats.urls.split(","))
        try:
            kv = await nc.jetstream().key_value("shardetcd-meta")
            try:
                return int((await kv.get(key)).value)
            except Exception:  # noqa: BLE001 - not there yet
                return 0
        finally:
            await nc.close()

    deadline = time.monotonic() + 30
    while asyncio.run(published()) < revision:
        assert time.monotonic() < deadline, f"{key} never reached {revision}"
        time.sleep(0.2)


def cuts(nats, stream: str) -> str:
    r = subprocess.run([sys.executable, "-m", "shim", "journal", "verify", "--journal-url", nats.urls], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    line = next(x for x in r.stdout.splitlines() if f": stream {stream}: " in x)
    return line.split(" fences, ")[1].split(",")[0]


def test_a_deleted_stream_stops_the_next_writer_and_nothing_is_cut(nats, tmp_path):
    writer = shardetcd_on(nats, tmp_path / "w").start()
    try:
        put_both(writer, 0, 5)
        wait_published(nats, 11)
    finally:
        writer.kill()
    before = cuts(nats, "shardetcd_default")
    delete_stream(nats, "shardetcd_pods")
    last = refused_start(shardetcd_on(nats, tmp_path / "w2"))
    assert last.startswith("shardetcd: writes were acknowledged up to revision 11 (key acknowledged.default of the "
                           "JetStream bucket shardetcd-meta), but the journals hold every revision only up to 1 "), last
    assert "`nats kv del shardetcd-meta acknowledged.default`" in last, last
    standby = shardetcd_on(nats, tmp_path / "s", "--standby").start(wait=False)  # the takeover path checks it too
    try:
        assert standby.proc.wait(60) == 2
    finally:
        standby.kill()
    assert standby.log_tail(1).startswith("shardetcd: writes were acknowledged up to revision 11 (key "
                                          "acknowledged.default"), standby.log_tail(20)
    assert cuts(nats, "shardetcd_default") == before, "the other streams' acknowledged records are all kept"


def test_a_standby_does_not_take_over_a_journal_that_lost_acknowledged_writes(nats, tmp_path):
    writer = shardetcd_on(nats, tmp_path / "w").start()
    standby = shardetcd_on(nats, tmp_path / "s", "--standby").start(wait=False)
    try:
        wait_standing_by(standby)
        put_both(writer, 0, 5)
        wait_published(nats, 11)
        before = cuts(nats, "shardetcd_default")
        delete_stream(nats, "shardetcd_pods")  # while the writer holds the lease: the standby cannot have taken over
        writer.kill()
        assert standby.proc.wait(60) == 2
        assert standby.log_tail(1) == ("shardetcd: journal stream shardetcd_pods is gone (deleted, or lost by NATS) "
                                       "since it was opened, with every record it held"), standby.log_tail(20)
    finally:
        writer.kill()
        standby.kill()
    assert cuts(nats, "shardetcd_default") == before


def test_a_writer_and_follower_whose_stream_is_deleted_stop_and_what_waited_is_not_acknowledged(nats, tmp_path):
    writer = shardetcd_on(nats, tmp_path / "w").start()
    follower = shardetcd_on(nats, tmp_path / "f", "--follow").start()
    try:
        put_both(writer, 0, 5)
        delete_stream(nats, "shardetcd_pods")
        with grpc.insecure_channel(writer.endpoint) as ch:  # waits for a stream that is gone: never acknowledged
            try:
                pbg.KVStub(ch).Put(pb.PutRequest(key=b"/registry/pods/ns/late", value=b"v"), timeout=30)
                raise AssertionError("a write into a deleted stream was acknowledged")
            except grpc.RpcError as exc:
                assert exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN), exc
        assert writer.proc.wait(30) == 1, writer.log_tail(20)  # by itself, not at the next write's timeout
        assert writer.log_tail(1) == ("shardetcd: stopped after a journal failure: journal stream shardetcd_pods is "
                                      "gone (deleted, or lost by NATS) since it was opened, with every record it "
                                      "held"), writer.log_tail(20)
        assert "journal stream gone, stopping writes stream=shardetcd_pods" in writer.log_tail(20)
        assert follower.proc.wait(30) == 1, follower.log_tail(20)  # it would serve a past state as the present
        assert follower.log_tail(1) == writer.log_tail(1), follower.log_tail(20)
    finally:
        writer.kill()
        follower.kill()


def test_a_follower_whose_consumer_is_deleted_reads_on(nats, tmp_path):
    """The follower's consumers deleted (by hand, or forgotten by NATS; its pulls are then answered 503)
    are not its streams: it subscribes again and goes on, and no one stops."""
    import asyncio

    import nats as nats_client

    async def delete_consumers() -> int:
        nc = await nats_client.connect(nats.urls.split(","))
        try:
            js = nc.jetstream()
            deleted = 0
            for stream in ("shardetcd_pods", "shardetcd_default"):
                for info in await js.consumers_info(stream):
                    await js.delete_consumer(stream, info.name)
                    deleted += 1
            return deleted
        finally:
            await nc.close()

    writer = shardetcd_on(nats, tmp_path / "w").start()
    follower = shardetcd_on(nats, tmp_path / "f", "--follow").start()
    try:
        put_both(writer, 0, 2)
        assert asyncio.run(delete_consumers()) >= 2  # the follower's, one a stream at least
        put_both(writer, 2, 4)
        with grpc.insecure_channel(follower.endpoint) as ch:  # linearizable: waits until it read them
            got = pbg.KVStub(ch).Range(pb.RangeRequest(key=b"\0", range_end=b"\0", keys_only=True), timeout=30)
        assert sorted(kv.key for kv in got.kvs) == sorted([b"/registry/pods/ns/p%d" % i for i in range(4)] +
                                                          [b"k%d" % i for i in range(4)])
        time.sleep(2)  # past the writer's and the follower's second look at the stream
        assert follower.running() and writer.running(), follower.log_tail(20)
    finally:
        writer.kill()
        follower.kill()


def test_the_whole_nats_cluster_restarted_is_no_stream_gone(nats, tmp_path):
    """Every NATS server killed and started again under a writer and a follower: while JetStream
    recovers, its streams are unreachable, never "not found", so neither stops; writes go on."""
    from journal.jetstream import GONE_CONFIRM_S, STREAM_CHECK_S

    writer = shardetcd_on(nats, tmp_path / "w").start()
    follower = shardetcd_on(nats, tmp_path / "f", "--follow").start()
    try:
        put_both(writer, 0, 2)
        for i in range(3):
            nats.kill(i)
        time.sleep(1)
        for i in range(3):
            nats.start(i, wait=False)
        nats.wait_ready()
        put_both(writer, 2, 4)
        time.sleep(STREAM_CHECK_S + GONE_CONFIRM_S + 1)  # the writer's stream check ran since
        assert writer.running() and follower.running(), (writer.log_tail(20), follower.log_tail(20))
        assert len(keys(follower)) == 8
    finally:
        writer.kill()
        follower.kill()


def test_a_checkpoint_bucket_deleted_under_a_writer_is_made_again_with_the_whole_state(nats, tmp_path):
    """The records a journal released up to its checkpoints live only in the checkpoint bucket. That
    bucket deleted under a running writer (by hand, or lost by NATS): its next checkpoint, which holds
    the shard's whole state, makes the bucket again, and a restart from NATS alone has every write."""
    import asyncio

    import nats as nats_client

    async def delete_bucket() -> None:
        nc = await nats_client.connect(nats.urls.split(","))
        try:
            await nc.jetstream().delete_stream("OBJ_shardetcd_default-checkpoints")
        finally:
            await nc.close()

    def put_many(server, first: int, last: int) -> None:
        with grpc.insecure_channel(server.endpoint) as ch:
            kv = pbg.KVStub(ch)
            for i in range(first, last):
                kv.Put(pb.PutRequest(key=b"k%03d" % i, value=b"v" * 100), timeout=10)

    writer = shardetcd_on(nats, tmp_path / "w", "--checkpoint-journal-bytes", "2000").start()
    try:
        put_many(writer, 0, 100)  # checkpoints made, the stream released up to them
        asyncio.run(delete_bucket())
        put_many(writer, 100, 200)  # the next checkpoints
        written, deadline = 200, time.monotonic() + 60
        while "checkpoint bucket gone, making it again bucket=shardetcd_default-checkpoints" not in writer.log_tail(50):
            assert time.monotonic() < deadline, writer.log_tail(30)
            # more journal bytes: a checkpoint that failed otherwise (one in flight as the bucket went)
            # is tried again after as many bytes, not only 30 s later
            put_many(writer, written, written + 5)
            written += 5
            time.sleep(0.2)
        put_many(writer, written, written + 1)
        written += 1
        wait_published(nats, written + 1)
    finally:
        writer.kill()
    again = shardetcd_on(nats, tmp_path / "w2").start()  # a fresh data dir: NATS alone
    try:
        assert keys(again) == sorted(b"k%03d" % i for i in range(written))
    finally:
        again.stop()


def test_a_stream_purged_past_its_checkpoint_stops_the_next_writer(nats, tmp_path):
    """The JetStream form of test_verify_names_revisions_released_past_a_shards_checkpoint: the pods
    stream purged by hand past its checkpoint while the default shard holds a higher one. The stream
    starts past the first message its writer's release kept (key released.<stream>): a follower's
    start and the writer's are refused at its open, nothing purged or cut. With that key deleted,
    both are refused for the revisions no stream or checkpoint holds (a follower reads the
    acknowledged revision from the meta bucket before the streams)."""
    import asyncio

    import nats as nats_client

    from journal.jetstream import JetStreamConfig, JetStreamLog
    from shards.layout import load_layout
    from shards.shard import checkpoint_meta

    writer = shardetcd_on(nats, tmp_path / "w", "--checkpoint-journal-bytes", "16384").start()
    try:
        with grpc.insecure_channel(writer.endpoint) as ch:
            kv = pbg.KVStub(ch)
            kv.Put(pb.PutRequest(key=b"k", value=b"v"), timeout=10)  # default's first record: revision 2
            for i in range(30):  # ~31 KB: the pods journal checkpoints once, after ~16 KB
                kv.Put(pb.PutRequest(key=b"/registry/pods/ns/p%d" % (i % 5), value=b"v" * 1000), timeout=10)
            for i in range(5):
                last = kv.Put(pb.PutRequest(key=b"/registry/pods/ns/s%d" % i, value=b"s"), timeout=10).header.revision
        wait_published(nats, last)
    finally:
        writer.kill()

    async def purge_past_checkpoint() -> tuple[int, int, int, int, int]:
        nc = await nats_client.connect(nats.urls.split(","))
        try:
            js = nc.jetstream()
            bucket = await js.object_store("shardetcd_pods-checkpoints")
            ckpt = max(int(o.name[11:27], 16) for o in await bucket.list() if not o.deleted)
            released = int((await (await js.key_value("shardetcd-meta")).get("released.shardetcd_pods")).value)
            await js.purge_stream("shardetcd_pods", keep=2)  # the last two puts left
            first = (await js.stream_info("shardetcd_pods")).state.first_seq
            msg = await js.get_msg("shardetcd_pods", seq=first)
            messages = (await js.stream_info("shardetcd_pods")).state.messages
            return ckpt, messages, decode_first_rev(msg.data), released, first
        finally:
            await nc.close()

    def decode_first_rev(data: bytes) -> int:
        from journal.record import decode_frame

        return decode_frame(data, 0, 1 << 20).rev

    ckpt, messages, first_kept, released, first = asyncio.run(purge_past_checkpoint())
    assert messages == 2 and first_kept == last - 1 and ckpt < last - 2, (ckpt, messages, first_kept, last)

    async def default_checkpoint() -> None:  # the default shard checkpointed past the hole
        log = await JetStreamLog(JetStreamConfig(urls=tuple(nats.urls.split(",")))).connect()
        try:
            journal = await log.open_journal("default", tmp_path / "fake" / "default")
            try:
                sid = load_layout(None).names.index("default")
                await journal.save_checkpoint(last, checkpoint_meta(last, -1, sid), [])
            finally:
                await journal.close()
        finally:
            await log.close()

    asyncio.run(default_checkpoint())
    assert released < first
    why = (f"journal stream shardetcd_pods starts at message {first}, but its writer released only the messages "
           f"before {released} (key released.shardetcd_pods): messages {released}..{first - 1} were removed by "
           "something else (purged by hand?), and their records with them. Refusing to open it, and nothing was cut")
    for name, flags in (("f", ("--follow",)), ("w2", ())):
        refused = refused_start(shardetcd_on(nats, tmp_path / name, *flags))
        assert refused.startswith(f"shardetcd: {why}"), refused
        assert "`nats kv del shardetcd-meta released.shardetcd_pods`" in refused, refused

    async def drop_released_key() -> None:
        nc = await nats_client.connect(nats.urls.split(","))
        try:
            await (await nc.jetstream().key_value("shardetcd-meta")).delete("released.shardetcd_pods")
        finally:
            await nc.close()

    asyncio.run(drop_released_key())
    follower = refused_start(shardetcd_on(nats, tmp_path / "f", "--follow"))  # it would serve without them
    assert follower.startswith(f"shardetcd: writes were acknowledged up to revision {last} (key acknowledged.default "
                               f"of the JetStream bucket shardetcd-meta), but revisions {ckpt + 1}..{last - 2} are in "
                               "no journal"), follower
    assert "Refusing to follow these journals" in follower, follower
    refused = refused_start(shardetcd_on(nats, tmp_path / "w2"))
    assert refused.startswith(f"shardetcd: writes were acknowledged up to revision {last} (key acknowledged.default "
                              f"of the JetStream bucket shardetcd-meta), but revisions {ckpt + 1}..{last - 2} are in no "
                              "journal, and no checkpoint of a journal whose records start past them reaches them"), \
        refused
