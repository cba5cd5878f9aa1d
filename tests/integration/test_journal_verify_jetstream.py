"""`shardetcd journal verify --journal-url` on real NATS JetStream journals: a healthy
journal after writes and checkpoints (checked while the server runs, changing nothing),
a message of garbage named by stream and sequence, a stream purged past a checkpoint that
is gone, and the one-line answers (NATS unreachable, no such prefix, repair, wrong flags);
and what a writer does while verify reads (a checkpoint stored, the stream purged, a write
acknowledged) not taken for damage, at chosen moments and under a server writing."""
from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

from journal.jetstream import list_streams, retrying
from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from shards.layout import load_layout
from tests.etcd_fixture import free_port
from tests.nats_fixture import shardetcd_on as server_on

REPO = Path(__file__).resolve().parents[2]
SHARDS = ",".join(load_layout(None).names)  # the default layout's, as a writer records them



def journal(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shim", "journal", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def one_line(r: subprocess.CompletedProcess) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    return lines[0]


def on_nats(urls: str, fn):
    import nats as nats_py

    async def go():
        nc = await nats_py.connect(servers=urls.split(","), connect_timeout=10)
        try:
            return await fn(nc.jetstream(timeout=10))
        finally:
            await nc.close()

    return asyncio.run(go())


async def acknowledged(js) -> int:
    from nats.js.errors import BucketNotFoundError, KeyNotFoundError

    try:
        return int((await (await js.key_value("shardetcd-meta")).get("acknowledged.default")).value)
    except (BucketNotFoundError, KeyNotFoundError):
        return 0


async def stream_states(js) -> dict[str, tuple[int, int, int]]:
    """The journal streams' states and their checkpoint buckets' (a checkpoint being stored moves them)."""
    return {i.config.name: (i.state.first_seq, i.state.last_seq, i.state.messages)
            for i in await list_streams(js) if i.config.name.startswith(("shardetcd_", "OBJ_shardetcd_"))}


def settled(urls: str, timeout: float = 60.0) -> dict[str, tuple[int, int, int]]:
    """The streams' states once two reads 2 s apart agree (a checkpoint may still be stored or purging)."""
    deadline = time.monotonic() + timeout
    last = on_nats(urls, stream_states)
    while True:
        time.sleep(2)
        now = on_nats(urls, stream_states)
        if now == last:
            return now
        assert time.monotonic() < deadline, "the streams never settled"
        last = now


def line_of(out: str, prefix: str) -> str:
    found = [line for line in out.splitlines() if line.startswith(prefix)]
    assert len(found) == 1, (prefix, out)
    return found[0]


def test_verify_a_jetstream_journal(nats, tmp_path):
    server = server_on(nats, tmp_path / "a", "--checkpoint-journal-bytes", "65536").start()
    try:
        with grpc.insecure_channel(server.endpoint) as ch:
            kv = pbg.KVStub(ch)
            for i in range(300):  # ~300 KiB into the pods stream: several checkpoints, each purging the stream
                kv.Put(pb.PutRequest(key=b"/registry/pods/ns/p%d" % (i % 40), value=b"v" * 1000), timeout=10)
            kv.Put(pb.PutRequest(key=b"/registry/leases/ns/l", value=b"l"), timeout=10)
            before = settled(nats.urls)  # the server's last checkpoint and purge done
            deadline = time.monotonic() + 30
            while on_nats(nats.urls, acknowledged) < 302:  # the writer publishes it about once a second
                assert time.monotonic() < deadline, "the writer never published its acknowledged revision"
                time.sleep(0.2)
            assert before["shardetcd_pods"][0] > 1, "the pods stream was never purged up to a checkpoint"

            healthy = journal("verify", "--journal-url", nats.urls)  # while the server runs
            out = healthy.stdout
            # quiet, but for JetStream's own retries when a loaded machine keeps it from answering in time
            noise = [l for l in healthy.stderr.splitlines() if "msg=jetstream unavailable, retrying" not in l]
            if healthy.returncode != 0 or noise:  # the whole report (an assertion's message gets cut short)
                pytest.fail(f"journal verify while the server ran: exit {healthy.returncode}\n"
                            f"{healthy.stdout}\n{healthy.stderr}\nstreams settled as {before}")
            first, last, messages = before["shardetcd_pods"]
            pods = line_of(out, "pods: stream shardetcd_pods: ")
            assert pods.startswith("pods: stream shardetcd_pods: ok, ")
            assert f"{messages} messages (seq {first}..{last})" in pods  # the writer's cut marker purged with the rest
            assert re.search(r"revs \d+\.\.301$", pods), pods  # the 300 puts were revisions 2..301
            ckpt = line_of(out, "pods: shardetcd_pods-checkpoints/checkpoint-")
            assert re.search(r": ok, \d+ rows, rev \d+, \d+ bytes$", ckpt), ckpt
            for shard in ("leases", "events", "nodes", "default"):
                assert line_of(out, f"{shard}: stream shardetcd_{shard}: ").split(": ")[2].startswith("ok,")
            # the writer's fence, its cut marker (every writer publishes one per stream), one record
            assert "leases: stream shardetcd_leases: ok, 3 messages (seq 1..3), 1 records, 1 fences, 1 cuts, " \
                   "revs 302..302" in out, out
            assert out.strip().splitlines()[-1] == (f"summary: 5 streams, prefix shardetcd at {nats.urls}: all sound")
            assert line_of(out, "acknowledged: ") == (
                "acknowledged: default: writes up to revision 302 (key acknowledged.default of shardetcd-meta); the "
                f"streams of its shards ({SHARDS}) reach 302")

            assert on_nats(nats.urls, stream_states) == before, "verify must change nothing"
            after = kv.Put(pb.PutRequest(key=b"/registry/pods/ns/after", value=b"v"), timeout=10)
            assert after.header.revision == 303, "the server was not fenced by verify"
    finally:
        server.stop()

    async def damage(js):
        ack = await js.publish("journal.shardetcd_nodes", b"this is not a journal frame, only garbage")  # garbage into a stream
        bucket = await js.object_store("shardetcd_pods-checkpoints")
        names = [o.name for o in await bucket.list() if not o.deleted]
        for name in names:  # the checkpoints the purged pods messages relied on
            await bucket.delete(name)
        return ack.seq, names

    garbage_seq, deleted = on_nats(nats.urls, damage)
    assert deleted
    bad = journal("verify", "--journal-url", nats.urls, "--journal-prefix", "shardetcd")
    out = bad.stdout
    assert bad.returncode == 1, (bad.stdout, bad.stderr)
    assert line_of(out, "nodes: stream shardetcd_nodes: corrupt, ").endswith(", 1 fences, 1 cuts, no records")
    assert f"nodes: stream shardetcd_nodes: seq {garbage_seq}: offset 0: bad magic" in out.splitlines(), out
    pods = line_of(out, "pods: stream shardetcd_pods: purged past its checkpoint, ")
    assert "were purged, but shardetcd_pods-checkpoints holds no checkpoint" in pods
    assert "pods: shardetcd_pods-checkpoints: no checkpoint" in out.splitlines()
    first_pods_rev = int(re.search(r"revs (\d+)\.\.", pods)[1])
    assert line_of(out, "acknowledged: ") == (  # the records released to the checkpoints deleted
        f"acknowledged: default: writes up to revision 303 (key acknowledged.default of shardetcd-meta), but revisions "
        f"2..{first_pods_rev - 1} are in no stream of its shards ({SHARDS}), and no checkpoint of a stream whose "
        "records start past them reaches them: acknowledged records are gone, and a start refuses them")
    assert out.strip().splitlines()[-1] == (f"summary: 5 streams, prefix shardetcd at {nats.urls}: 2 damaged (nodes, "
                                            "pods); acknowledged records are gone")

    async def delete_streams(js):  # the journals lost, the writer's word on what it acknowledged kept
        for name in ("leases", "events", "pods", "nodes", "default"):
            await js.delete_stream(f"shardetcd_{name}")

    on_nats(nats.urls, delete_streams)
    lost = journal("verify", "--journal-url", nats.urls)
    assert lost.returncode == 1, (lost.stdout, lost.stderr)
    lines = lost.stdout.strip().splitlines()
    streams = ", ".join(f"shardetcd_{name}" for name in SHARDS.split(","))
    assert [line for line in lines if not line.startswith("replicas: KV_shardetcd-")] == [
        "acknowledged: default: writes up to revision 303 (key acknowledged.default of shardetcd-meta), but stream "
        f"{streams} is gone: any acknowledged records it held are gone too",
        "acknowledged: default: writes up to revision 303 (key acknowledged.default of shardetcd-meta), but no stream "
        f"or checkpoint of its shards ({SHARDS}) holds a revision past 1: acknowledged records are gone, and a start "
        "refuses them",
        f"summary: 0 streams, prefix shardetcd at {nats.urls}: all sound; acknowledged records are gone"], lines


def replica_lines(out: str) -> dict[str, str]:
    return {line.split(": ")[1]: line.split(": ", 2)[2] for line in out.splitlines() if line.startswith("replicas: ")}


def test_verify_says_where_each_stream_is_stored(nats, tmp_path):
    """An operator checks that what the writers keep is stored on as many NATS servers as the
    deployment runs with (a stream made with fewer keeps its count until a writer given more
    moves it) and, after losing a machine, which servers each stream is missing — also when a
    stream of another deployment in the account was stored only on the lost machine."""
    ours = {f"shardetcd_{s}" for s in ("leases", "events", "pods", "nodes", "default")} | \
        {"OBJ_shardetcd_pods-checkpoints", "KV_shardetcd-meta", "KV_shardetcd-writer", "KV_shardetcd-members"}

    def write(*flags: str) -> None:
        server = server_on(nats, tmp_path / "a", "--checkpoint-journal-bytes", "4000", *flags).start()
        try:
            with grpc.insecure_channel(server.endpoint) as ch:
                for i in range(20):  # past a checkpoint of pods: its bucket is made
                    pbg.KVStub(ch).Put(pb.PutRequest(key=b"/registry/pods/p%d" % i, value=b"v" * 500), timeout=10)
        finally:
            server.stop()

    write("--journal-replicas", "1")
    shown = journal("verify", "--journal-url", nats.urls)  # replicas only shown
    found = replica_lines(shown.stdout)
    assert shown.returncode == 0 and ours <= found.keys(), (shown.stdout, shown.stderr)
    assert all(re.fullmatch(r"1 \(leader n\d\)", found[name]) for name in ours), found
    judged = journal("verify", "--journal-url", nats.urls, "--journal-replicas", "3")
    found = replica_lines(judged.stdout)
    assert judged.returncode == 1, (judged.stdout, judged.stderr)
    assert all(re.fullmatch(r"1, fewer than the 3 asked \(leader n\d\)", found[name]) for name in ours), found
    summary = judged.stdout.strip().splitlines()[-1]
    assert summary.startswith(f"summary: 5 streams, prefix shardetcd at {nats.urls}: all sound; {len(found)} stored "
                              "on fewer than 3 replicas, so a lost NATS server takes what only it holds (a writer "
                              "started with --journal-replicas 3 moves them): "), summary

    write()  # the default, 3: the writer moves them
    deadline = time.monotonic() + 60
    while True:  # the new replicas catch up meanwhile: verify says "n1 not current" until they have
        judged = journal("verify", "--journal-url", nats.urls, "--journal-replicas", "3")
        found = replica_lines(judged.stdout)
        assert judged.returncode == 0 and judged.stdout.strip().endswith(": all sound"), (judged.stdout, judged.stderr)
        if all(re.fullmatch(r"3 \(leader n\d\)", found[name]) for name in ours):
            break
        assert time.monotonic() < deadline and all(re.fullmatch(r"3 \(leader n\d(; n\d not current)*\)", found[name])
                                                   for name in ours), found
        time.sleep(1)

    async def placed(js) -> str:
        info = await retrying("add stream", lambda: js.add_stream(name="elsewhere", subjects=["elsewhere.>"],
                                                                   num_replicas=1), deadline_s=60)
        return info.cluster.leader

    lost_server = on_nats(nats.urls, placed)  # another deployment's stream, on one server only
    nats.kill(int(lost_server[1:]))  # its machine lost: verify still answers, and says which server each stream misses
    kept = "".join(s.name[1:] for s in nats.servers if s.name != lost_server)
    deadline = time.monotonic() + 180  # one verify may wait 15 s on the listing and 30 s on a read while NATS elects
    while True:
        lost = journal("verify", "--journal-url", nats.servers[int(kept[0])].url, "--journal-replicas", "3")
        found = replica_lines(lost.stdout)
        if lost.returncode == 0 and ours <= found.keys() and all(re.fullmatch(
                rf"3 \(leader n[{kept}]; {lost_server} (offline|not current.*)\)", found[name]) for name in ours):
            break
        assert time.monotonic() < deadline, (lost.returncode, lost.stdout, lost.stderr)
        time.sleep(1)
    assert "elsewhere" not in lost.stdout + lost.stderr  # not the prefix's: neither reported nor waited for


def test_verify_reads_what_is_left_when_a_stream_has_no_leader(nats, tmp_path):
    """After losing a NATS server an operator asks what is still whole. A stream of the prefix stored
    only on the lost server has no leader: verify waited 15 s for it, then gave up on everything
    ("does not answer JetStream requests", exit 2). It now reports such a stream as unavailable,
    reads and checks the rest, and exits 1. Here the pods journal was cut to one replica (on the
    server the writer led it from) before that server was lost; the others keep three."""
    from types import SimpleNamespace

    shards = load_layout(None).names
    writer = server_on(SimpleNamespace(urls=nats.servers[0].url), tmp_path / "a").start()
    try:
        with grpc.insecure_channel(writer.endpoint) as ch:
            for key in (b"/registry/leases/ns/l", b"/registry/events/ns/e", b"/registry/pods/ns/p",
                        b"/registry/minions/n", b"/registry/configmaps/ns/c"):
                pbg.KVStub(ch).Put(pb.PutRequest(key=key, value=b"v"), timeout=10)
    finally:
        writer.stop()

    async def to_one_replica(js) -> None:
        info = await js.stream_info("shardetcd_pods")
        info.config.num_replicas = 1
        await js.update_stream(info.config)

    async def stored_on(js) -> str | None:  # its one server, once the others are dropped
        cluster = (await js.stream_info("shardetcd_pods")).cluster
        return cluster.leader if cluster is not None and not cluster.replicas else None

    on_nats(nats.urls, to_one_replica)
    deadline = time.monotonic() + 30
    while (lost := on_nats(nats.urls, stored_on)) is None:
        assert time.monotonic() < deadline, "the stream is still stored on more than one server"
        time.sleep(0.2)
    nats.kill(int(lost[1:]))
    kept = [s.url for s in nats.servers if s.name != lost]
    asking = next(i for i, s in enumerate(nats.servers) if s.name != lost)
    others = [f"shardetcd_{s}" for s in shards if s != "pods"]
    deadline = time.monotonic() + 60  # the three-replica streams led from the lost server elect anew, in NATS's time
    while not all(nats.stream_leader(name, asking=asking) not in (None, lost) for name in others):
        assert time.monotonic() < deadline, "the three-replica streams elected no new leaders"
        time.sleep(0.2)
    r = journal("verify", "--journal-url", ",".join(kept))
    out = r.stdout
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert line_of(out, "pods: stream shardetcd_pods: ").startswith(
        "pods: stream shardetcd_pods: unavailable: no leader: JetStream did not list it"), out
    assert replica_lines(out)["shardetcd_pods"] == "unknown (no leader)", out
    for shard in shards:
        if shard != "pods":  # read and checked: its one record
            assert re.match(rf"{shard}: stream shardetcd_{shard}: ok, \d+ messages .*, 1 records", line_of(
                out, f"{shard}: stream shardetcd_{shard}: ")), out
            assert re.fullmatch(rf"3 \(leader n\d; {lost} (offline|not current.*)\)",
                                replica_lines(out)[f"shardetcd_{shard}"]), out
    assert line_of(out, "acknowledged: default: ").endswith("; not checked: shardetcd_pods unavailable"), out
    assert out.strip().splitlines()[-1].endswith(": 1 unavailable, not read (pods)"), out


def test_verify_and_repair_answer_in_one_line(nats, tmp_path):
    nowhere = f"nats://127.0.0.1:{free_port()}"
    assert one_line(journal("verify", "--journal-url", nowhere)).startswith(f"shardetcd: cannot reach NATS at {nowhere}: ")
    said = one_line(journal("verify", "--journal-url", nats.urls, "--journal-prefix", "nothing-here"))
    assert said == f"shardetcd: no journal streams with prefix nothing-here at {nats.urls}"
    said = one_line(journal("repair", "--journal-url", nats.urls))
    assert said.startswith("shardetcd: journal repair is for local segment files only") and "no torn tail" in said
    assert "not both" in one_line(journal("verify", "--journal-url", nats.urls, "--data-dir", str(tmp_path)))
    assert "not a nats:// URL" in one_line(journal("verify", "--journal-url", "http://127.0.0.1:1"))
    assert "goes with --journal-url" in one_line(journal("verify", "--data-dir", str(tmp_path), "--journal-prefix", "p"))
    assert "is required" in one_line(journal("verify"))


def test_verify_holds_each_partition_to_its_own_streams(nats, tmp_path):
    """Under `shardetcd cluster` each partition is an etcd of its own, with its own revisions.
    A partition's stream lost while another partition's streams reach past the revision it
    acknowledged: verify held every writer against the newest revision of any stream, so this
    passed as sound. The journals of each role now record the layout (the shards) they are written with."""
    from tests.integration.test_cluster import Cluster

    cluster = Cluster(tmp_path)
    cluster.argv += ["--journal-url", nats.urls]
    cluster.start()
    try:
        with grpc.insecure_channel(cluster.endpoint("events")) as ch:
            pbg.KVStub(ch).Put(pb.PutRequest(key=b"/registry/events/ns/e", value=b"v"), timeout=10)
        with grpc.insecure_channel(cluster.endpoint("main")) as ch:
            for i in range(10):
                pbg.KVStub(ch).Put(pb.PutRequest(key=b"/registry/pods/ns/p%d" % i, value=b"v"), timeout=10)

        async def published(js) -> set[str]:
            from nats.js.errors import NoKeysError

            kv = await js.key_value("shardetcd-meta")
            try:
                keys = await kv.keys()
            except NoKeysError:  # a replica that has not stored the keys yet: asked again below
                return set()
            return {k for k in keys if k.startswith(("acknowledged.", "layout."))}

        deadline = time.monotonic() + 30
        want = {f"{kind}.{name}" for kind in ("acknowledged", "layout") for name in ("events", "main")}
        while not want <= on_nats(nats.urls, published):  # each writer publishes about once a second
            assert time.monotonic() < deadline, on_nats(nats.urls, published)
            time.sleep(0.2)
    finally:
        cluster.stop()
    sound = journal("verify", "--journal-url", nats.urls)
    assert sound.returncode == 0, (sound.stdout, sound.stderr)
    assert line_of(sound.stdout, "acknowledged: leases: ") == (  # it took no write: a new etcd's revision 1
        "acknowledged: leases: writes up to revision 1 (key acknowledged.leases of shardetcd-meta); the streams of "
        "its shards (leases) reach 1")
    assert line_of(sound.stdout, "acknowledged: events: ") == (
        "acknowledged: events: writes up to revision 2 (key acknowledged.events of shardetcd-meta); the streams of "
        "its shards (events) reach 2")
    assert line_of(sound.stdout, "acknowledged: main: ").endswith("the streams of its shards (main) reach 11")

    async def lose_events(js):
        await js.delete_stream("shardetcd_events")

    on_nats(nats.urls, lose_events)
    lost = journal("verify", "--journal-url", nats.urls)
    assert lost.returncode == 1, (lost.stdout, lost.stderr)
    assert [line for line in lost.stdout.splitlines() if line.startswith("acknowledged: events: ")] == [
        "acknowledged: events: writes up to revision 2 (key acknowledged.events of shardetcd-meta), but stream "
        "shardetcd_events is gone: any acknowledged records it held are gone too",
        "acknowledged: events: writes up to revision 2 (key acknowledged.events of shardetcd-meta), but no stream or "
        "checkpoint of its shards (events) holds a revision past 1: acknowledged records are gone, and a start "
        "refuses them"], lost.stdout
    assert lost.stdout.strip().splitlines()[-1].endswith(": all sound; acknowledged records are gone")


# -- verify while a writer writes: what it does meanwhile is not damage ---------------------------
# Each test holds a real writer's journal (JetStreamLog, as a server opens it) and does at one chosen
# moment of the verify what a server does at any moment: store a checkpoint and release the stream
# below it, append and acknowledge a write.

@contextlib.asynccontextmanager
async def a_writer(urls: str, tmp_path: Path, prefix: str = "t", replicas: int = 3):
    """(log, journal): the pods journal of ``prefix``, opened and started as a server does; closed after.
    With ``replicas`` 1, what a test deletes or purges (by hand or by a release) while verify reads is
    gone from every read at once (an R3 stream's consumer may be placed on a replica that has yet to
    apply it)."""
    from journal.jetstream import JetStreamConfig, JetStreamLog

    log = await JetStreamLog(JetStreamConfig(urls=tuple(urls.split(",")), prefix=prefix, replicas=replicas)).connect()
    try:
        journal = await log.open_journal("pods", tmp_path / "pods")
        await journal.start()
        try:
            yield log, journal
        finally:
            await journal.close()
    finally:
        await log.close()


async def write(journal, revs) -> None:
    for rev in revs:  # one message each
        journal.append(1, rev, b"w" * 20)
        await journal.sync()


async def checkpoint(journal, rev: int) -> None:
    """What a shard does at a checkpoint: store it (older ones deleted), then release the stream below."""
    await journal.save_checkpoint(rev, b"meta", iter([b"row"]))
    await journal.release(rev - 1)


def run_after(monkeypatch, name: str, when) -> list:
    """Have ``when()`` awaited right after verify's first listing of the streams (``name`` "list
    streams") or its first call of ``retrying(name, ...)``; the list returned is not empty once it was."""
    from journal import verify_jetstream as vj

    attr, done = "list_streams" if name == "list streams" else "retrying", []
    real = getattr(vj, attr)

    async def hooked(*args, **kw):
        got = await real(*args, **kw)
        if (attr == "list_streams" or args[0] == name) and not done:
            done.append(name)
            await when()
        return got

    monkeypatch.setattr(vj, attr, hooked)
    return done


def verify_with(monkeypatch, urls: str, name: str, when):
    """verify_jetstream, with ``when()`` run as ``run_after`` says."""
    from journal import verify_jetstream as vj

    run_after(monkeypatch, name, when)
    return vj.verify_jetstream(tuple(urls.split(",")), "t")


def test_verify_reads_on_past_a_purge_made_while_it_reads(nats, tmp_path, monkeypatch):
    """A checkpoint stored and the stream released below it while verify reads the stream: the
    messages it had yet to read before the new first are released, not "missing inside"."""
    from journal import verify_jetstream as vj

    monkeypatch.setattr(vj, "READ_BATCH", 5)  # the purge lands between two fetches

    async def go():
        async with a_writer(nats.urls, tmp_path, replicas=1) as (log, journal):
            await write(journal, range(2, 42))
            await checkpoint(journal, 10)
            found = await verify_with(monkeypatch, nats.urls, "read stream", lambda: checkpoint(journal, 30))
            return found, await log.js.stream_info("t_pods")

    found, info = asyncio.run(go())
    (pods,) = found.streams
    assert pods.sound and not pods.errors, vj.report_lines([pods])
    assert (pods.first_seq, pods.last_seq, pods.messages) == (info.state.first_seq, info.state.last_seq,
                                                              info.state.messages)
    assert (pods.first_rev, pods.last_rev, pods.records) == (30, 41, 12)
    assert [(c.rev, c.status) for c in pods.checkpoints] == [(30, "ok")]


@pytest.mark.parametrize("then", ["appended", "nothing"])
def test_verify_holds_a_stream_emptied_after_it_was_listed_to_a_checkpoint(nats, tmp_path, monkeypatch, then):
    """Every message listed gone before the first is read: verify took the first message it got,
    appended since, as "not ours to judge", said "0 messages (empty)" and, the stream listed as
    starting at 1, never asked for the checkpoint those records were released to: a stream purged
    with no checkpoint passed as sound. With nothing appended, the read waited for the messages and
    called them "not delivered". Either way the stream now starts past what was listed, and without a
    checkpoint it is purged past one."""
    from journal import verify_jetstream as vj

    real = vj.retrying

    async def retrying(what, fn, **kw):  # (the read of an emptied stream gives up in 1 s, not 30)
        return await real(what, fn, **({**kw, "deadline_s": 1.0} if what == "read stream" else kw))

    async def go():
        async with a_writer(nats.urls, tmp_path, replicas=1) as (log, journal):
            await write(journal, range(2, 12))
            listed = await log.js.stream_info("t_pods")

            async def purge():  # as an operator's `nats stream purge` would (no checkpoint)
                await log.js.purge_stream("t_pods")
                if then == "appended":
                    await write(journal, [12])

            monkeypatch.setattr(vj, "retrying", retrying)
            found = await verify_with(monkeypatch, nats.urls, "list streams", purge)
            return found, listed.state.last_seq

    found, listed_last = asyncio.run(go())
    (pods,) = found.streams
    line = vj.report_lines([pods])[0]
    assert (pods.first_seq, pods.messages, pods.records) == (listed_last + 1, 0, 0), line
    assert not pods.errors and not pods.sound, line
    assert pods.purge_problem == (f"messages before seq {listed_last + 1} were purged, but t_pods-checkpoints "
                                  "holds no checkpoint: the records they held are gone"), line


def test_verify_takes_a_stream_released_to_a_checkpoint_after_it_was_listed_as_sound(nats, tmp_path, monkeypatch):
    """The same with the writer's own release: a checkpoint stored, then every listed message
    released, then a write appended: sound, the checkpoint checked."""
    from journal import verify_jetstream as vj

    async def go():
        async with a_writer(nats.urls, tmp_path, replicas=1) as (log, journal):
            await write(journal, range(2, 12))
            listed = await log.js.stream_info("t_pods")

            async def release():
                await write(journal, [12])
                await checkpoint(journal, 12)

            return await verify_with(monkeypatch, nats.urls, "list streams", release), listed.state.last_seq

    found, listed_last = asyncio.run(go())
    (pods,) = found.streams
    assert pods.sound and pods.first_seq == listed_last + 1 and pods.messages == 0, vj.report_lines([pods])
    assert [(c.rev, c.status) for c in pods.checkpoints] == [(12, "ok")]


def test_every_revision_a_server_makes_is_in_a_stream_or_under_a_checkpoint(nats, tmp_path):
    """What `journal verify`'s lost-revision check rests on, against a real writer: every revision it
    makes (puts, deletes, cross-shard txns, lease revokes that delete keys, with compaction and
    checkpoints purging the streams between) is a record in some shard's stream, or under the
    checkpoint of a stream released past it. Writes that make no revision (a txn whose compare
    fails, a delete of nothing, a lease revoked with no keys) leave no hole."""
    from journal import verify_jetstream as vj

    server = server_on(nats, tmp_path / "a", "--checkpoint-journal-bytes", "16384").start()
    try:
        with grpc.insecure_channel(server.endpoint) as ch:
            kv, lease = pbg.KVStub(ch), pbg.LeaseStub(ch)
            big = b"v" * 1000
            for i in range(60):
                kv.Put(pb.PutRequest(key=b"/registry/pods/ns/p%d" % (i % 7), value=big), timeout=10)
                if i % 10 == 3:  # one txn on two shards
                    kv.Txn(pb.TxnRequest(success=[
                        pb.RequestOp(request_put=pb.PutRequest(key=b"/registry/pods/ns/t", value=big)),
                        pb.RequestOp(request_put=pb.PutRequest(key=b"/registry/nodes/n%d" % i, value=b"n"))]),
                        timeout=10)
                if i % 10 == 5:  # a failing compare, a delete of nothing, a delete of something
                    kv.Txn(pb.TxnRequest(compare=[pb.Compare(key=b"/registry/pods/ns/p0", target=pb.Compare.VERSION,
                                                             result=pb.Compare.EQUAL, version=10**6)],
                                         success=[pb.RequestOp(request_put=pb.PutRequest(key=b"/registry/x", value=b"x"))]),
                           timeout=10)
                    kv.DeleteRange(pb.DeleteRangeRequest(key=b"/registry/pods/ns/none"), timeout=10)
                    kv.DeleteRange(pb.DeleteRangeRequest(key=b"/registry/nodes/n3"), timeout=10)
                if i % 20 == 7:  # a lease with a key, revoked (a revision); an empty one revoked (none)
                    held, empty = (lease.LeaseGrant(pb.LeaseGrantRequest(TTL=60), timeout=10).ID for _ in range(2))
                    kv.Put(pb.PutRequest(key=b"/registry/events/ns/e%d" % i, value=b"e", lease=held), timeout=10)
                    kv.Put(pb.PutRequest(key=b"/registry/leases/ns/l", value=b"l"), timeout=10)
                    lease.LeaseRevoke(pb.LeaseRevokeRequest(ID=held), timeout=10)
                    lease.LeaseRevoke(pb.LeaseRevokeRequest(ID=empty), timeout=10)
                if i == 40:
                    kv.Compact(pb.CompactionRequest(revision=30), timeout=10)
            last = kv.Put(pb.PutRequest(key=b"/registry/configmaps/ns/c", value=b"c"), timeout=10).header.revision
        deadline = time.monotonic() + 30
        while on_nats(nats.urls, acknowledged) < last:  # the writer publishes it about once a second
            assert time.monotonic() < deadline, "the writer never published its acknowledged revision"
            time.sleep(0.2)
        settled(nats.urls)
        found = asyncio.run(vj.verify_jetstream(tuple(nats.urls.split(",")), "shardetcd"))
    finally:
        server.stop()
    pods = next(r for r in found.streams if r.shard == "pods")
    assert pods.first_seq > 1, "the pods stream was never released to a checkpoint"
    assert all(r.sound for r in found.streams), vj.report_lines(found.streams)
    assert vj.lost_revisions(found.streams, last) == []
    lines, gone = vj.acknowledged_lines(found.streams, found.acknowledged, "shardetcd", found.spans)
    assert not gone and lines[0].endswith(f"reach {last}"), lines


def test_verify_finds_revisions_released_past_the_checkpoint(nats, tmp_path):
    """A stream released further than its newest checkpoint reaches (what a release gone wrong or a
    hand purge would do): the newest checkpoint exists and loads, and yet acknowledged revisions are
    in no stream and under no checkpoint. verify names them; and as the stream starts past the first
    message its writer kept at its release (key released.<stream>), the stream is not sound either."""
    from journal import verify_jetstream as vj
    from shards.store import acknowledged_key

    async def go():
        async with a_writer(nats.urls, tmp_path, replicas=1) as (log, journal):
            await write(journal, range(2, 31))
            await checkpoint(journal, 10)
            await log.put_meta(acknowledged_key(load_layout(None)), "30")
            info = await log.js.stream_info("t_pods")
            kept = int(await log.get_meta("released.t_pods"))  # the writer's release kept from there
            await log.js.purge_stream("t_pods", seq=info.state.last_seq - 10)  # revisions 20..30 left
            return await vj.verify_jetstream(tuple(nats.urls.split(",")), "t"), kept, info.state.last_seq - 10

    found, kept, first = asyncio.run(go())
    (pods,) = found.streams
    assert (pods.first_rev, pods.last_rev) == (20, 30) and not pods.errors, vj.report_lines([pods])
    assert pods.status == "purged past its writer's release" and not pods.sound
    assert pods.head_lost == (f"stream t_pods starts at message {first}, but its writer released only the messages "
                              f"before {kept} (key released.t_pods): messages {kept}..{first - 1} were removed by "
                              "something else (purged by hand?), and their records with them"), pods.head_lost
    assert vj.lost_revisions(found.streams, 30) == list(range(11, 20))
    lines, gone = vj.acknowledged_lines(found.streams, found.acknowledged, "t", found.spans)
    assert gone and lines == [
        "acknowledged: default: writes up to revision 30 (key acknowledged.default of t-meta), but revisions 11..19 "
        "are in no stream, and no checkpoint of a stream whose records start past them reaches them: acknowledged "
        "records are gone, and a start refuses them"], lines


def test_verify_reports_a_message_missing_inside_a_stream(nats, tmp_path):
    """A message deleted inside the stream (not purged from its front) is named by its sequence."""
    from journal import verify_jetstream as vj

    async def go():
        async with a_writer(nats.urls, tmp_path, replicas=1) as (log, journal):
            await write(journal, range(2, 12))
            info = await log.js.stream_info("t_pods")
            await log.js.delete_msg("t_pods", info.state.last_seq - 3)
            return await vj.verify_jetstream(tuple(nats.urls.split(",")), "t"), info.state.last_seq - 3

    found, deleted = asyncio.run(go())
    (pods,) = found.streams
    assert pods.errors == [f"seq {deleted}..{deleted}: missing inside the stream (deleted)"], pods.errors
    assert not pods.sound


def test_verify_takes_the_newer_checkpoint_when_the_one_it_downloads_is_replaced(nats, tmp_path, monkeypatch):
    """A checkpoint stored while verify downloads the newest it listed: the writer deletes the one
    being downloaded; verify checks the new one instead of calling the deleted one corrupt."""
    from journal import jetstream
    from journal import verify_jetstream as vj

    async def go():
        async with a_writer(nats.urls, tmp_path) as (log, journal):
            await write(journal, range(2, 30))
            await checkpoint(journal, 10)
            real, replaced = jetstream.fetch_object, []

            async def fetch_object(js, bucket, bucket_name, name, into):
                if not replaced:  # listed, about to be downloaded: the writer checkpoints
                    replaced.append(name)
                    await checkpoint(journal, 20)
                return await real(js, bucket, bucket_name, name, into)

            monkeypatch.setattr(vj, "fetch_object", fetch_object)
            return await vj.verify_jetstream(tuple(nats.urls.split(",")), "t"), replaced

    found, replaced = asyncio.run(go())
    (pods,) = found.streams
    assert replaced == ["checkpoint-000000000000000a.ckpt"]
    assert pods.sound, vj.report_lines([pods])
    assert [(c.name, c.rev, c.status, c.rows) for c in pods.checkpoints] == [
        ("checkpoint-0000000000000014.ckpt", 20, "ok", 1)]


def test_verify_calls_a_checkpoint_damaged_when_it_stays_the_newest(nats, tmp_path, monkeypatch):
    """A checkpoint whose download fails (its chunks not what was stored) and that is still the
    newest when the bucket is listed again is damaged: the stream purged up to it says so; it is
    downloaded once, not once per try."""
    from nats.js.errors import DigestMismatchError

    from journal import verify_jetstream as vj

    async def go():
        async with a_writer(nats.urls, tmp_path) as (log, journal):
            await write(journal, range(2, 20))
            await checkpoint(journal, 10)
            tried = []

            async def fetch_object(js, bucket, bucket_name, name, into):
                tried.append(name)
                raise DigestMismatchError

            monkeypatch.setattr(vj, "fetch_object", fetch_object)
            return await vj.verify_jetstream(tuple(nats.urls.split(",")), "t"), tried

    found, tried = asyncio.run(go())
    (pods,) = found.streams
    assert tried == ["checkpoint-000000000000000a.ckpt"]
    assert [(c.rev, c.status) for c in pods.checkpoints] == [(10, "corrupt")]
    assert pods.checkpoints[0].detail.startswith("download failed: DigestMismatchError"), pods.checkpoints[0].detail
    assert pods.status == "purged past its checkpoint" and "does not load" in pods.purge_problem, pods.purge_problem


def test_verify_does_not_take_a_write_acknowledged_while_it_reads_for_a_lost_one(nats, tmp_path, monkeypatch):
    """The writer acknowledges a write appended after verify read the stream: the revision it
    published then is not held against what verify read (a write acknowledged before the streams
    were listed is; test_verify_a_jetstream_journal)."""
    from journal import verify_jetstream as vj
    from shards.layout import load_layout
    from shards.store import acknowledged_key

    async def go():
        key = acknowledged_key(load_layout(None))
        async with a_writer(nats.urls, tmp_path) as (log, journal):
            await write(journal, range(2, 12))
            await log.put_meta(key, "11")

            async def acknowledge_another():
                await write(journal, [12])
                await log.put_meta(key, "12")

            return await verify_with(monkeypatch, nats.urls, "read stream", acknowledge_another)

    found = asyncio.run(go())
    lines, gone = vj.acknowledged_lines(found.streams, found.acknowledged, "t", found.spans)
    assert found.acknowledged == {"default": 11} and not gone, lines
    assert lines == ["acknowledged: default: writes up to revision 11 (key acknowledged.default of t-meta); the "
                     "streams reach 11"]


def test_verify_while_a_server_writes_finds_it_sound(nats, tmp_path):
    """`journal verify` run again and again while a server writes, checkpoints every 16 KiB of the
    pods journal and purges its stream: every run exits 0, all sound, nothing taken for lost."""
    server = server_on(nats, tmp_path / "a", "--checkpoint-journal-bytes", "16384").start()
    stop, written, failures = threading.Event(), [], []

    def write_on():
        try:
            with grpc.insecure_channel(server.endpoint) as ch:
                kv = pbg.KVStub(ch)
                while not stop.is_set():
                    kv.Put(pb.PutRequest(key=b"/registry/pods/ns/p%d" % (len(written) % 40), value=b"v" * 1000),
                           timeout=10)
                    written.append(1)
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(repr(exc))

    writer = threading.Thread(target=write_on)
    writer.start()
    runs = []
    try:
        for _ in range(6):
            runs.append((len(written), journal("verify", "--journal-url", nats.urls)))
    finally:
        stop.set()
        writer.join()
        server.stop()
    assert not failures, failures
    assert len(written) > runs[-1][0] > runs[0][0], "the server did not write throughout"
    for _, run in runs:
        summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
        if run.returncode != 0 or not summary.endswith(": all sound"):
            pytest.fail(f"journal verify while the server wrote: exit {run.returncode}\n{run.stdout}\n{run.stderr}")
    checkpoints = [line for _, run in runs for line in run.stdout.splitlines()
                   if line.startswith("pods: shardetcd_pods-checkpoints/checkpoint-")]
    assert len(set(checkpoints)) > 1, "no checkpoint was written between the runs"


def test_a_partition_left_out_is_found_when_it_checkpoints_while_looked_at(nats, tmp_path, monkeypatch):
    """``cluster`` start's check for a partition the layout leaves out, while that partition's writer
    still runs: its stream released up to a new checkpoint after the streams were listed (no record
    left in the stream: a writer never releases its newest message, here the restarted writer's cut
    marker) is still found holding data, in the bucket."""
    from journal import verify_jetstream as vj

    urls, others = tuple(nats.urls.split(",")), set(load_layout(None).names) - {"pods"}

    async def go():
        async with a_writer(nats.urls, tmp_path) as (log, journal):
            await write(journal, range(2, 12))
        async with a_writer(nats.urls, tmp_path) as (log, journal):  # restarted: its fence and cut marker last
            assert await vj.shards_holding_data(urls, "t", others) == ["pods"]  # records, no checkpoint yet
            done = run_after(monkeypatch, "list streams", lambda: checkpoint(journal, 12))  # all released
            found = await vj.shards_holding_data(urls, "t", others)
            return found, await log.js.stream_info("t_pods"), done

    found, info, done = asyncio.run(go())
    assert done and info.state.messages == 1, info.state  # the race happened: only the newest message left
    assert found == ["pods"]
