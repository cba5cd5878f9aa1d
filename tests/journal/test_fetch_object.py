"""Checkpoint objects on a real three-server NATS (checkpoint buckets are R3). fetch_object: the
chunks read through a pull consumer come back byte for byte, across fetch batches, and a damaged
object is refused as nats-py's own get refuses it. store_object: what it stores with chunks in
flight is what nats-py's get reads back, an object replaced leaves no chunks of the old one, and a
store JetStream refuses leaves none of its own. list_objects: what nats-py's list lists, and a
listing whose bucket is deleted under it ends. Both through a server catching up after a restart:
what the leader holds. The members bucket's keys, listed as kv_keys lists them."""
from __future__ import annotations

import asyncio
import io
import os

import pytest

from journal.jetstream import FETCH_CHUNKS, STORE_CHUNKS, fetch_object, list_objects, retrying, store_object
from tests.nats_fixture import start_nats_cluster


@pytest.fixture(scope="module")
def nats_cluster(tmp_path_factory):
    cluster = start_nats_cluster(tmp_path_factory.mktemp("nats"), size=3)
    yield cluster
    cluster.stop()


def with_bucket(nats_cluster, body, **config):
    """``body(nc, js, bucket, name)`` on a fresh R3 object store of its own (``config``: more of its
    ObjectStoreConfig)."""
    import nats
    from nats.js.api import ObjectStoreConfig

    async def main():
        nc = await nats.connect(servers=nats_cluster.urls.split(","))
        try:
            js = nc.jetstream()
            name = f"fetch-{os.urandom(4).hex()}"
            bucket = await retrying("create", lambda: js.create_object_store(  # a young cluster may not answer yet
                name, config=ObjectStoreConfig(bucket=name, replicas=3, **config)))
            return await body(nc, js, bucket, name)
        finally:
            await nc.close()

    return asyncio.run(asyncio.wait_for(main(), 60))  # a deadline for a hang, not a timing


@pytest.mark.parametrize("size", [0, 1, 128 * 1024, (FETCH_CHUNKS + 3) * 128 * 1024 + 17])
def test_an_object_comes_back_byte_for_byte(nats_cluster, size):
    data = os.urandom(size)

    async def body(nc, js, bucket, name):
        await retrying("put", lambda: bucket.put("checkpoint-1", data))
        out = io.BytesIO()

        async def fetch():  # as the journal fetches: again while JetStream is unavailable
            out.seek(0)
            out.truncate()
            await fetch_object(js, bucket, name, "checkpoint-1", out)

        await retrying("fetch", fetch)
        return out.getvalue()

    assert with_bucket(nats_cluster, body) == data


def test_a_chunk_added_to_an_object_is_refused_as_nats_py_refuses_it(nats_cluster):
    from nats.js.errors import DigestMismatchError

    async def body(nc, js, bucket, name):
        await retrying("put", lambda: bucket.put("checkpoint-1", os.urandom(300_000)))
        info = await bucket.get_info("checkpoint-1")
        await js.publish(f"$O.{name}.C.{info.nuid}", b"not part of it")
        async def refuses(fetch) -> bool:
            try:
                await fetch(io.BytesIO())
            except DigestMismatchError:
                return True
            return False

        # again while JetStream is unavailable (a young R3 consumer may answer 503), as the journal fetches
        return [await retrying("fetch", lambda: refuses(fetch))
                for fetch in (lambda out: bucket.get("checkpoint-1", writeinto=out),
                              lambda out: fetch_object(js, bucket, name, "checkpoint-1", out))]

    assert with_bucket(nats_cluster, body) == [True, True]


def test_a_missing_object_is_not_found(nats_cluster):
    from nats.js.errors import ObjectNotFoundError

    async def body(nc, js, bucket, name):
        with pytest.raises(ObjectNotFoundError):
            await fetch_object(js, bucket, name, "checkpoint-9", io.BytesIO())

    with_bucket(nats_cluster, body)


def test_a_checkpoint_replaced_while_it_is_fetched_is_listed_again(nats_cluster, tmp_path):
    """A standby lists the bucket, and before it fetches the newest checkpoint the writer has
    stored a newer one and deleted it: the fetch finds no such object and lists again."""
    from journal.jetstream import JetStreamConfig, JetStreamLog

    async def main():
        log = await JetStreamLog(JetStreamConfig(urls=tuple(nats_cluster.urls.split(",")), prefix="replaced")).connect()
        try:
            journal = await log.open_journal("j", tmp_path / "j")
            await journal.start()
            await journal.save_checkpoint(5, b"meta-5", iter([b"a", b"b"]))
            listed = journal._checkpoint_objects
            listings = []

            async def stale_first():
                listings.append(await listed())
                if len(listings) == 1:  # as listed before the writer replaced and deleted it
                    return [("checkpoint-0000000000000003", 3)]
                return listings[-1]

            journal._checkpoint_objects = stale_first
            ckpt = await journal.load_checkpoint()
            await journal.close()
            return ckpt.rev, list(ckpt.rows()), len(listings)
        finally:
            await log.close()

    assert asyncio.run(asyncio.wait_for(main(), 60)) == (5, [b"a", b"b"], 2)


CHUNK = 128 * 1024


def stored(nc, js, bucket, name, object_name, data: bytes, in_flight: int = 1):
    """store_object of ``data``, retried as the journal retries it."""
    return retrying("store", lambda: store_object(nc, js, bucket, name, object_name, io.BytesIO(data), 10.0, in_flight))


async def messages_on(js, name: str, kind: str) -> int:
    """Messages on the bucket's chunk (``kind`` "C") or meta ("M": one per object, deleted ones'
    markers included) subjects."""
    info = await js.stream_info(f"OBJ_{name}", subjects_filter=f"$O.{name}.{kind}.>")
    return sum((info.state.subjects or {}).values())


@pytest.mark.parametrize("size, in_flight", [(0, 1), (1, 1), (CHUNK, STORE_CHUNKS), (3 * CHUNK + 17, 1),
                                             ((2 * STORE_CHUNKS + 3) * CHUNK + 17, STORE_CHUNKS)])
def test_a_stored_object_is_what_nats_py_and_fetch_object_read_back(nats_cluster, size, in_flight):
    data = os.urandom(size)

    async def body(nc, js, bucket, name):
        await stored(nc, js, bucket, name, "checkpoint-1", data, in_flight)
        info = await bucket.get_info("checkpoint-1")
        theirs = (await retrying("get", lambda: bucket.get("checkpoint-1"))).data
        ours = io.BytesIO()
        await retrying("fetch", lambda: fetch_object(js, bucket, name, "checkpoint-1", ours))
        return info.size, info.chunks, await messages_on(js, name, "C"), theirs, ours.getvalue()

    chunks = -(-size // CHUNK)
    assert with_bucket(nats_cluster, body) == (size, chunks, chunks, data, data)


def test_an_object_stored_again_leaves_no_chunk_of_the_one_it_replaced(nats_cluster):
    first, second = os.urandom(3 * CHUNK), os.urandom(CHUNK + 5)

    async def body(nc, js, bucket, name):
        await stored(nc, js, bucket, name, "checkpoint-1", first)
        await stored(nc, js, bucket, name, "checkpoint-1", second)
        return (await bucket.get("checkpoint-1")).data, await messages_on(js, name, "C")

    assert with_bucket(nats_cluster, body) == (second, 2)


def test_a_store_jetstream_refuses_leaves_no_chunk_and_no_object(nats_cluster):
    """A bucket with room for 3 chunks (its stream discards new messages): the 4th chunk is refused
    by JetStream, while later ones are in flight; the store raises that refusal and purges the
    chunks it had stored."""
    from nats.js.errors import APIError, ObjectNotFoundError

    async def body(nc, js, bucket, name):
        with pytest.raises(APIError) as refused:
            await store_object(nc, js, bucket, name, "checkpoint-1", io.BytesIO(os.urandom(10 * CHUNK)), 10.0, STORE_CHUNKS)
        with pytest.raises(ObjectNotFoundError):
            await bucket.get_info("checkpoint-1")
        return refused.value.err_code, await messages_on(js, name, "C")

    code, left = with_bucket(nats_cluster, body, max_bytes=3 * CHUNK + 4096)
    assert (code, left) == (10077, 0)  # JetStream's "maximum bytes exceeded" (a storage error: publish_error_kind)


def test_a_chunk_whose_answer_never_comes_is_a_nats_timeout_and_leaves_nothing(nats_cluster, monkeypatch):
    """The third chunk's answer is lost (stored, but its acknowledgement never arrives): after
    ``ack_timeout_s`` the store raises nats-py's timeout, what ``retrying`` waits out, and purges
    the chunks it stored."""
    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.errors import ObjectNotFoundError

    from journal.jetstream import _Acks

    real_publish = _Acks.publish

    async def third_answer_lost(self, subject, payload):
        answer = await real_publish(self, subject, payload)
        return asyncio.get_running_loop().create_future() if self.sent == 3 else answer

    monkeypatch.setattr(_Acks, "publish", third_answer_lost)

    async def body(nc, js, bucket, name):
        with pytest.raises(NatsTimeout):
            await store_object(nc, js, bucket, name, "checkpoint-1", io.BytesIO(os.urandom(5 * CHUNK)), 0.5)
        with pytest.raises(ObjectNotFoundError):
            await bucket.get_info("checkpoint-1")
        return await messages_on(js, name, "C")

    assert with_bucket(nats_cluster, body) == 0


def test_a_store_into_a_deleted_bucket_is_not_found(nats_cluster):
    """What tells the journal to make its checkpoint bucket again (JetStreamJournal.store_checkpoint)."""
    from nats.js.errors import NotFoundError

    async def body(nc, js, bucket, name):
        await js.delete_stream(f"OBJ_{name}")
        with pytest.raises(NotFoundError):
            await store_object(nc, js, bucket, name, "checkpoint-1", io.BytesIO(b"x" * 100), 2.0)

    with_bucket(nats_cluster, body)


def test_a_chunk_no_stream_takes_is_no_stream_response_as_js_publish_raises_it(nats_cluster):
    """NATS answers a publish no stream takes (as during a stream leader election) with a 503
    status: the transient error ``retrying`` waits out, as ``js.publish`` raises it."""
    from nats.js.errors import NoStreamResponseError

    from journal.jetstream import _Acks

    async def acked_once(nc, subject, payload):
        async with _Acks(nc) as acks:
            await asyncio.wait_for(await acks.publish(subject, payload), 5)

    async def body(nc, js, bucket, name):
        raised = []
        for publish in (lambda: js.publish(f"no-stream.{name}", b"x", timeout=5),
                        lambda: acked_once(nc, f"no-stream.{name}", b"x")):
            with pytest.raises(NoStreamResponseError):
                await publish()
            raised.append(True)
        return raised

    assert with_bucket(nats_cluster, body) == [True, True]


def test_a_store_ended_by_a_closed_connection_raises_what_ended_it(nats_cluster):
    """Leaving the acknowledgements' inbox cannot be done on a closed connection: the error that
    ended the store is raised, not that one."""
    import nats

    from journal.jetstream import _Acks

    async def main():
        nc = await nats.connect(servers=nats_cluster.urls.split(","))
        with pytest.raises(ZeroDivisionError):
            async with _Acks(nc):
                await nc.close()
                1 / 0

    asyncio.run(asyncio.wait_for(main(), 60))


def test_an_older_checkpoint_whose_delete_gets_no_answer_is_deleted_on_a_retry(nats_cluster, tmp_path):
    """A NATS server lost just after a checkpoint is stored: purging the older one's chunks times
    out. The delete is tried again (the checkpoint, stored, does not count as failed) and the older
    one goes, with nothing left of it."""
    from nats.errors import TimeoutError as NatsTimeout

    from journal.jetstream import JetStreamConfig, JetStreamLog

    async def main():
        log = await JetStreamLog(JetStreamConfig(urls=tuple(nats_cluster.urls.split(",")), prefix="deletes")).connect()
        try:
            journal = await log.open_journal("j", tmp_path / "j")
            await journal.start()
            await journal.save_checkpoint(5, b"meta-5", iter([b"a"]))
            real, tries = log.js.purge_stream, []

            async def no_answer_first(stream, **kwargs):
                tries.append(kwargs["subject"].split(".")[2])  # C: chunks, M: meta
                if len(tries) == 1:
                    raise NatsTimeout
                return await real(stream, **kwargs)

            log.js.purge_stream = no_answer_first
            await journal.save_checkpoint(9, b"meta-9", iter([b"b"]))
            log.js.purge_stream = real
            left = sorted(rev for _, rev in await journal._checkpoint_objects(deleted=True))
            await journal.close()
            return tries, left, await messages_on(log.js, journal.checkpoint_bucket, "M")
        finally:
            await log.close()

    tries, left, metas = asyncio.run(asyncio.wait_for(main(), 60))
    assert tries == ["C", "C", "M"] and left == [9] and metas == 1


def test_checkpoints_replaced_leave_nothing_behind(nats_cluster, tmp_path):
    """Each checkpoint stored deletes the older ones whole, meta message included (nats-py's delete
    leaves one marking the object deleted, which every later listing would read), and the markers
    an older version left that way go at the next checkpoint."""
    from nats.js.errors import ObjectNotFoundError

    from journal.jetstream import JetStreamConfig, JetStreamLog

    async def main():
        log = await JetStreamLog(JetStreamConfig(urls=tuple(nats_cluster.urls.split(",")), prefix="leftovers")).connect()
        try:
            journal = await log.open_journal("j", tmp_path / "j")
            await journal.start()
            name = journal.checkpoint_bucket
            bucket = await journal._bucket_store()
            for rev in (3, 4, 5):  # as an older version left them: deleted by nats-py
                await bucket.put(f"checkpoint-{rev:016x}.ckpt", b"old")
                await bucket.delete(f"checkpoint-{rev:016x}.ckpt")
            before = await messages_on(log.js, name, "M"), await messages_on(log.js, name, "C")
            for rev in (6, 7, 8, 9):
                await journal.save_checkpoint(rev, b"meta-%d" % rev, iter([b"x" * 1000]))
            after = await messages_on(log.js, name, "M"), await messages_on(log.js, name, "C")
            listed = await journal._checkpoint_objects(deleted=True)
            with pytest.raises(ObjectNotFoundError):
                await bucket.get_info("checkpoint-0000000000000008.ckpt", show_deleted=True)
            newest = await journal.load_checkpoint()
            await journal.close()
            return before, after, listed, newest.rev
        finally:
            await log.close()

    before, after, listed, newest = asyncio.run(asyncio.wait_for(main(), 60))
    assert before == (3, 0)
    assert after == (1, 1) and listed == [("checkpoint-0000000000000009.ckpt", 9)] and newest == 9


def described(infos) -> list[tuple]:
    return sorted((i.name, i.size, i.chunks, i.nuid, i.digest, bool(i.deleted)) for i in infos)


def test_objects_are_listed_as_nats_py_lists_them(nats_cluster):
    """Across fetch batches, with objects replaced and deleted (a deleted one is listed as deleted,
    as nats-py lists it); an empty bucket is an empty list, where nats-py's list raises."""
    from nats.js.errors import NotFoundError

    async def body(nc, js, bucket, name):
        empty = await retrying("list", lambda: list_objects(js, name))
        with pytest.raises(NotFoundError):
            await bucket.list()
        for i in range(FETCH_CHUNKS + 5):
            await retrying("put", lambda i=i: bucket.put(f"checkpoint-{i}", os.urandom(i)))
        await retrying("put", lambda: bucket.put("checkpoint-3", b"again"))
        await retrying("delete", lambda: bucket.delete("checkpoint-4"))
        ours = await retrying("list", lambda: list_objects(js, name))
        return empty, described(ours), described(await bucket.list())

    empty, ours, theirs = with_bucket(nats_cluster, body)
    assert empty == [] and ours == theirs and len(ours) == FETCH_CHUNKS + 5
    assert [o[5] for o in ours if o[0] == "checkpoint-4"] == [True]


def test_a_server_catching_up_lists_and_fetches_what_the_leader_holds(tmp_path):
    """A NATS server restarted after a checkpoint was replaced (stored while it was down, the older
    one deleted) catches up for a while; asked through it meanwhile, a listing names the newer
    checkpoint only and a fetch gets its bytes. A consumer of the listing's own, placed on that
    server, listed nothing in turns for ~1.3 s (a start would have found no checkpoint; chaos saw
    `journal verify` list the deleted one and call the stream purged past its checkpoint)."""
    import time

    import nats
    from nats.js.api import ObjectStoreConfig

    cluster = start_nats_cluster(tmp_path, size=3)
    data = os.urandom(40 << 20)

    async def main():
        nc = await nats.connect(servers=cluster.urls.split(","))
        near = None
        try:
            js = nc.jetstream()
            bucket = await retrying("create", lambda: js.create_object_store(
                "ck", config=ObjectStoreConfig(bucket="ck", replicas=3)))
            await retrying("put", lambda: bucket.put("checkpoint-1", b"older"))
            cluster.kill(2)
            await retrying("put", lambda: bucket.put("checkpoint-2", data))
            await retrying("delete", lambda: bucket.delete("checkpoint-1"))
            cluster.start(2, wait=False)
            near = await nats.connect(servers=[cluster.servers[2].url], max_reconnect_attempts=-1,
                                      reconnect_time_wait=0.05)
            js2 = near.jetstream()
            into = io.BytesIO()
            there = await retrying("open", lambda: js2.object_store("ck"))

            async def fetch():
                into.seek(0)
                into.truncate()
                await fetch_object(js2, there, "ck", "checkpoint-2", into)

            await retrying("fetch", fetch)
            listed, ends = [], time.monotonic() + 3
            while time.monotonic() < ends:
                objects = await retrying("list", lambda: list_objects(js2, "ck"))
                listed.append(sorted(o.name for o in objects if not o.deleted))
                await asyncio.sleep(0.02)
            return into.getvalue() == data, listed
        finally:
            if near is not None:
                await near.close()
            await nc.close()

    try:
        same, listed = asyncio.run(asyncio.wait_for(main(), 120))
    finally:
        cluster.stop()
    assert same
    assert len(listed) > 20 and all(names == ["checkpoint-2"] for names in listed), listed


def test_a_consumer_that_counts_nothing_left_too_soon_is_read_on_to_the_objects_size():
    """fetch_object's consumer sits on whichever NATS server it was placed, maybe one still catching
    up after a restart: its count of chunks left can say none before it has them all. The object's
    size is the leader's (get_info), so the fetch reads on until it has that many bytes. It stopped
    at the count: chaos (kill-nats) saw a 9 MB checkpoint come up short, a DigestMismatchError
    that journal verify called corrupt and a start would have stopped on."""
    import base64
    import hashlib
    from types import SimpleNamespace

    from nats.js.api import ObjectInfo

    data = os.urandom(5 * 1000)
    chunks = [data[i:i + 1000] for i in range(0, len(data), 1000)]
    # what the lagging server delivers: two chunks, "none left"; then, caught up, the other three
    deliveries = [[(chunks[0], 1), (chunks[1], 0)], [(chunks[2], 2), (chunks[3], 1), (chunks[4], 0)]]

    class Sub:
        async def fetch(self, batch, timeout):
            if not deliveries:
                raise asyncio.TimeoutError
            return [SimpleNamespace(data=d, metadata=SimpleNamespace(num_pending=n)) for d, n in deliveries.pop(0)]

        async def unsubscribe(self):
            pass

    class JS:
        async def pull_subscribe(self, subject, stream, config):
            return Sub()

    class Bucket:
        async def get_info(self, name):
            digest = "SHA-256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode()
            return ObjectInfo(name=name, bucket="b", nuid="n1", size=len(data), chunks=len(chunks), digest=digest)

    into = io.BytesIO()
    asyncio.run(fetch_object(JS(), Bucket(), "b", "checkpoint-1", into))
    assert into.getvalue() == data and not deliveries


def test_a_bucket_deleted_at_any_step_of_a_listing_ends_it(nats_cluster):
    """The bucket deleted just before and just after each of the JetStream API calls a listing
    makes in turn (the stream's meta subjects, then the newest message of the one object): the
    listing ends, with the bucket not found or with an error ``retrying`` tries again after (whose
    next listing finds no bucket), or with the object if it was got before the bucket went. nats-py's
    own list waited for good when the bucket went after its consumer was made."""
    import nats
    from nats.js.errors import NotFoundError

    from journal.jetstream import transient_errors

    async def listing_deleted_at(call: int, after: bool):
        nc = await nats.connect(servers=nats_cluster.urls.split(","))
        other = await nats.connect(servers=nats_cluster.urls.split(","))
        try:
            js = nc.jetstream()
            name = f"list-{os.urandom(4).hex()}"
            bucket = await retrying("create", lambda: js.create_object_store(name))
            await retrying("put", lambda: bucket.put("checkpoint-1", b"x"))
            real, calls = nc.publish, []

            async def publish(subject, *args, **kwargs):
                if not subject.startswith("$JS.API."):
                    return await real(subject, *args, **kwargs)
                calls.append(subject)
                if len(calls) == call + 1 and not after:
                    await other.jetstream().delete_stream(f"OBJ_{name}")
                await real(subject, *args, **kwargs)
                if len(calls) == call + 1 and after:
                    await nc.flush()  # the call reaches NATS before the deletion does
                    await other.jetstream().delete_stream(f"OBJ_{name}")

            async def listing():
                try:
                    return [i.name for i in await list_objects(js, name)]
                except (NotFoundError, *transient_errors()) as exc:
                    return type(exc).__name__

            nc.publish = publish
            return await asyncio.wait_for(listing(), 30), len(calls)  # a listing that hangs fails the test here
        finally:
            await other.close()
            await nc.close()

    outcomes = []
    for after in (False, True):
        call = 0
        while True:
            outcome, calls = asyncio.run(listing_deleted_at(call, after))
            if calls <= call:  # made fewer calls than that: the bucket was never deleted
                assert outcome == ["checkpoint-1"]
                break
            outcomes.append((call, after, outcome))
            call += 1
    assert len(outcomes) == 4 and outcomes[0][2] == "NotFoundError" and all(
        isinstance(o, str) or o == ["checkpoint-1"] for _, _, o in outcomes), outcomes


def test_members_announced_are_listed_by_prefix_and_a_deleted_one_is_not(nats_cluster):
    """JetStreamLog.announced lists the members bucket's keys from its stream's subjects (kv_keys),
    not through nats-py's kv.keys() consumer: the live entries whose key has the prefix, none of a
    key deleted (its marker message is a subject too), and nothing for a prefix no one announced."""
    from journal.jetstream import JetStreamConfig, JetStreamLog, kv_keys

    async def main():
        log = await JetStreamLog(JetStreamConfig(urls=tuple(nats_cluster.urls.split(",")), prefix="announce")).connect()
        try:
            for key, value in (("p1.a", "A"), ("p1.b", "B"), ("p2.c", "C"), ("p1.d", "D")):
                await log.announce(key, value, 60.0)
            kv = await log._members(60.0)
            await kv.delete("p1.d")
            keys = await kv_keys(log.js, "announce-members")
            return keys, sorted(await log.announced("p1.", 60.0)), await log.announced("p3.", 60.0)
        finally:
            await log.close()

    keys, p1, p3 = asyncio.run(asyncio.wait_for(main(), 60))
    assert keys == ["p1.a", "p1.b", "p1.d", "p2.c"] and p1 == ["A", "B"] and p3 == []
