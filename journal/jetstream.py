"""A journal on NATS JetStream: the same contract as journal.Journal, replicated.

One journal is one JetStream stream (replicas as configured: R3 stores every
message on three servers and acknowledges it once a quorum has it).  A
message is one group-commit batch: the records appended while the previous
batch was in flight, as frames (record.py) back to back, at most
``batch_bytes_max`` (kept under the server's max payload).  Every publish
carries two headers:

    Nats-Msg-Id                   "<journal instance id>-<batch number>": a
                                  publish retried after a timeout is stored once
    Nats-Expected-Last-Sequence   the stream's last sequence as this writer
                                  knows it: if any other process has
                                  written, JetStream refuses the publish and
                                  this journal fails (fail-stop) at once

Every message also carries ``Journal-Epoch``: the writer's epoch (the
revision of its writer lease, which only grows from one writer to the next).

Opening a journal publishes an empty message with the header
``Journal-Fence`` after the last message read: from then on, appends by any
process that opened it earlier are refused.  When it starts writing, a
writer publishes ``Journal-Cut: R`` (R: the revision it recovered to) on
every stream before any new record: records of earlier epochs tagged above
R are void, so every later reader agrees on the cut.  A reader of one
stream drops the records above R that came before the marker; a follower
reading several streams (``follow``) also drops records of earlier epochs
above R that it reads later on another stream.  ``release_through(R)`` purges the stream's
messages whose records all have tags <= R.  Checkpoints are objects in the
JetStream object store bucket ``<stream>-checkpoints`` (the same framed
files as local checkpoints), so a process on another machine can load them.

A follower hands on a message only once its writer has had JetStream's
acknowledgement of it (DESIGN.md invariant 11: a follower never shows a write
above the writer's committed revision, which a linearizable read elsewhere
would not): a writer publishes one message on a stream at a time, so a later
message on the stream says the one before it was acknowledged (or was read by
the next writer before it fenced); for the last one, each writer tells on the
core NATS subject ``journal.acked.<prefix>`` the last sequence acknowledged to
it, ``"<stream> <seq>"`` per line, after each acknowledgement, every
``ACKED_REPEAT_S`` (such a message is not stored, so one lost is told again),
and when a starting follower asks on ``journal.acked.<prefix>.ask``. A
follower's start takes the last message as well when a write in it is at or
below a revision the writer had committed (shards/recovery.py).

The stream's own storage decides what "stored" means (file storage, flushed
to disk on the servers' sync interval): durability comes from the quorum of
replicas, as for etcd's Raft log.
"""
from __future__ import annotations

import asyncio
import base64
import logging
import os
import json
import re
import secrets
import shutil
import tempfile
import time
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Awaitable, Callable, Iterable, Iterator

from journal import failpoints
from journal.appender import Appender
from journal.checkpoint import Checkpoint, load_latest_checkpoint, write_checkpoint
from journal.config import JournalConfig
from journal.errors import (JournalCorrupt, JournalError, JournalFailed, JournalFenced, JournalGap, JournalGone,
                            JournalHeadLost, JournalUnreachable)
from journal.follow import NO_RECORD_AFTER_PURGE, Message  # noqa: F401 - Message: one stream message, as a follower sees it
from journal.fsutil import files_stamp, open_private
from journal.record import HEADER_BYTES, FrameError, Record, decode_frame, frame_header
from journal.tasks import cancel_and_wait

logger = logging.getLogger(__name__)

CUT_HEADER = "Journal-Cut"
FENCE_HEADER = "Journal-Fence"
EPOCH_HEADER = "Journal-Epoch"
TRANSIENT_API_ERRORS = {10005, 10008}  # no suitable peers (a peer offline), JetStream temporarily unavailable
# JetStream's answers for "no room": account resources exceeded (10002), insufficient resources (10023: a
# server's max_file_store reached), insufficient memory (10028) or storage (10047) resources
STORAGE_FULL_API_ERRORS = {10002, 10023, 10028, 10047}
# "duplicate message id is in process": an earlier try of this very publish (sent again after a
# reconnect) is being stored right now; the next try is answered as its duplicate
DUPLICATE_IN_PROCESS = 10158
STREAM_STORE_FAILED = 10077  # a stream limit ("maximum bytes exceeded", ...) or the server's store refused it
_STORAGE_FULL_WORDS = ("maximum bytes", "maximum messages", "resources", "no space", "storage")
_CKPT_NAME = re.compile(r"^checkpoint-([0-9a-f]{16})\.ckpt$")
MIN_MAX_PAYLOAD = 4 * 1024 * 1024
# A follower's consumer acknowledges nothing, so JetStream counts a message delivered once it
# is sent: one sent while the connection was being replaced is lost to this process. A hole
# in the sequence that the stream still holds, or a fetch that times out while the stream
# holds more, is such a loss: the follower reads on from its last message with a new consumer.
FOLLOW_FETCH_S = 2.0
ACKED_REPEAT_S = 0.5  # how often a writer tells again the last sequence acknowledged on each stream it writes
ASK_WAIT_S = 0.6  # a starting follower waits this long at most for a writer's word on the last message it read
HELD_WARN_S = 10.0  # a follower holding a message unacknowledged this long (the writer stored nothing since) says so
STREAM_CHECK_S = 5.0  # how often a writer checks that no one edited its streams to drop messages
GONE_CONFIRM_S = 1.0  # a stream not found while written or followed: asked again after this before stopping
REPLICAS_AGAIN_S = 60.0  # a stream edited to fewer replicas: how soon the writer tries again after a refusal
LEAD_AGAIN_S = 60.0  # a stream whose leader could not be moved to the writer's NATS server: how soon it asks again
LEAD_WAIT_S = 2.0  # a writer's start waits this long at most for its streams' leaders to move (_lead_before_serving)
READ_STALL_S = 10.0  # a read at start or takeover that gets nothing for this long starts again
STALE_PINGS = 3  # unanswered pings that make a connection stale (see JetStreamConfig.stale_after_s)
JETSTREAM_NOT_ENABLED_FOR_ACCOUNT = 10039
WRONG_LAST_SEQUENCE = 10071  # JetStream's error code for a failed Nats-Expected-Last-Sequence
STREAM_NOT_FOUND = 10059  # JetStream's "stream not found" (a message asked of a stream that is gone)


FETCH_CHUNKS = 64  # an object's chunks (128 KiB each) asked for at once by fetch_object
# Chunks (128 KiB each) a restore's store_object has sent and not yet seen acknowledged; also what it
# reads from the file at once. A serving writer's checkpoints go one chunk at a time (see store_object).
STORE_CHUNKS = 32
CHECKPOINT_TRIES = 10  # a checkpoint replaced while it is fetched: the newest one is listed and fetched again


async def fetch_object(js, bucket, bucket_name: str, name: str, into) -> None:
    """Object ``name`` of the object store ``bucket`` (named ``bucket_name``) written into the open
    file ``into``, checked against its size and SHA-256 as nats-py's ``ObjectStore.get`` checks them
    (the same errors: ObjectNotFoundError, DigestMismatchError; a fetch that gets nothing for
    READ_STALL_S is a NATS timeout, for ``retrying`` to start again).

    nats-py's ``get`` reads the chunks through an ordered push consumer and answers its flow
    control from a task that looks every 0.25 s: a 6.6 MB checkpoint took 0.52 s, most of it those
    waits. Pull requests have no flow control: 0.05 s (64 MB: 0.42 s against 1.41; bench.jsread).
    A standby, a follower and a writer that lost its machine fetch every shard's checkpoint at start."""
    import hashlib

    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
    from nats.js.errors import DigestMismatchError
    from nats.js.object_store import OBJ_CHUNKS_PRE_TEMPLATE, OBJ_DIGEST_TYPE, OBJ_STREAM_TEMPLATE

    info = await bucket.get_info(name)
    if info.is_link() or not info.nuid:  # not what a checkpoint is: nats-py's way
        await bucket.get(name, writeinto=into)
        return
    if not info.size:
        return
    digest, size = hashlib.sha256(), 0
    sub = await js.pull_subscribe(
        OBJ_CHUNKS_PRE_TEMPLATE.format(bucket=bucket_name, obj=info.nuid),
        stream=OBJ_STREAM_TEMPLATE.format(bucket=bucket_name),
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE, num_replicas=1,
                              mem_storage=True, inactive_threshold=READ_STALL_S * 3))
    try:
        pending = 1
        # the consumer reads the stream on whichever server NATS placed it, which may still be
        # catching up (a server restarted): its count of chunks left can say none before it has
        # them all (chaos: a 9 MB checkpoint "corrupt" for journal verify, a DigestMismatchError a
        # start would have stopped on). The size is the leader's (get_info): read on until it is.
        while pending or size < info.size:
            for msg in await sub.fetch(batch=FETCH_CHUNKS, timeout=READ_STALL_S):
                into.write(msg.data)
                digest.update(msg.data)
                size += len(msg.data)
                pending = msg.metadata.num_pending
    finally:
        await sub.unsubscribe()
    want = info.digest.replace(OBJ_DIGEST_TYPE, "").replace(OBJ_DIGEST_TYPE.upper(), "")
    if size != info.size or digest.digest() != base64.urlsafe_b64decode(want):
        raise DigestMismatchError


class PullReader:
    """A stream's messages through a pull consumer (acknowledging nothing), asked for in requests
    bounded in bytes as well as in number.

    nats-py's ``fetch`` bounds a request by its number of messages only, and the server sends
    them as fast as it reads them. A reader behind by many large messages (a burst of 1.5 MB
    objects, or a split write's 8 MB parts) was sent more than a connection may have pending
    (the server's max_pending, 64 MB by default): the server closed the connection as a slow
    consumer, and with it every subscription of the process (a follower's), or the read
    (``journal verify``). Each request here also gives JetStream's max_bytes, twice the largest
    message the server takes (so that one always fits), and no more than that is ever in flight."""

    # how a request ends before its number is reached: nothing more there, its time up, its bytes
    ENDS = {"404", "408", "409"}
    TOO_LARGE = "Message Size Exceeds MaxBytes"  # 409: the next message would pass the bytes asked for

    def __init__(self, nc, stream: str, consumer: str) -> None:
        self.nc, self.next_subject = nc, f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self.max_bytes = 2 * nc.max_payload
        self.inbox = nc.new_inbox()
        self.asked = 0
        self.sub = None

    @classmethod
    async def open(cls, js, nc, subject: str, stream: str, config) -> PullReader:
        """A consumer of ``stream``'s ``subject`` made with ``config`` (ack policy none)."""
        info = await js.add_consumer(stream, config=replace(config, filter_subject=subject))
        reader = cls(nc, stream, info.name)
        reader.sub = await nc.subscribe(f"{reader.inbox}.*")
        return reader

    async def fetch(self, batch: int, timeout: float) -> list:
        """Up to ``batch`` messages, in stream order, as soon as one request for them ends; a NATS
        TimeoutError if none came within ``timeout`` (JetStream errors as nats-py raises them)."""
        from nats.errors import TimeoutError as NatsTimeout

        while True:
            msgs, larger = await self._ask(batch, timeout)
            if msgs or not larger:
                break
            # the next message is larger than asked for (stored while NATS took larger ones): ask again
            self.max_bytes *= 2
        if not msgs:
            raise NatsTimeout
        return msgs

    async def _ask(self, batch: int, timeout: float) -> tuple[list, bool]:
        """One request's messages; True if it ended on one larger than the bytes it asked for."""
        from nats.errors import TimeoutError as NatsTimeout
        from nats.js.errors import APIError

        self.asked += 1
        reply = f"{self.inbox}.{self.asked}"
        # no_wait with expires: the request waits up to ``timeout`` for a first message, then ends as
        # soon as none is left to send (404), not when its number is reached or its time is up
        ask = {"batch": batch, "max_bytes": self.max_bytes, "expires": int(timeout * 1e9), "no_wait": True}
        await self.nc.publish(self.next_subject, json.dumps(ask).encode(), reply=reply)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout + 1.0  # the server's 408 at ``expires`` ends it first
        msgs: list = []
        while len(msgs) < batch:
            try:
                msg = await self.sub.next_msg(timeout=max(deadline - loop.time(), 0.001))
            except NatsTimeout:
                break
            status = msg.headers.get("Status") if msg.headers else None
            if status is None:  # a message, of this request or of one that timed out before: in order either way
                msgs.append(msg)
                continue
            if msg.subject != reply or status == "100":  # an earlier request's end; a heartbeat
                continue
            why = msg.headers.get("Description", "")
            if status in self.ENDS and not why.startswith("Consumer"):
                return msgs, why == self.TOO_LARGE
            raise APIError.from_msg(msg)  # "409 Consumer Deleted", "503" (no responders: the stream is gone), ...
        return msgs, False

    async def close(self) -> None:
        """Stops reading (the consumer goes by its inactive threshold, as nats-py's leave theirs)."""
        if self.sub is not None:
            await self.sub.unsubscribe()


class _Acks:
    """JetStream's answers to publishes sent with a reply subject in one inbox of this connection:
    ``publish`` sends and returns a future of the answer (None, or the error ``js.publish`` would
    raise). nats-py's ``publish_async`` is not used: its answer handler raises the error of a
    503-class refusal ("maximum bytes exceeded") instead of setting it, so that wait never ends."""

    NO_RESPONDERS = "503"  # the status NATS answers a request with when no stream takes the subject

    def __init__(self, nc):
        self.nc = nc
        self.inbox = nc.new_inbox()
        self.waiting: dict[str, asyncio.Future] = {}
        self.sent = 0
        self.sub = None

    async def __aenter__(self) -> _Acks:
        self.sub = await self.nc.subscribe(f"{self.inbox}.*", cb=self._answered)
        return self

    async def __aexit__(self, typ, exc, tb) -> None:
        for fut in self.waiting.values():
            if not fut.cancel() and not fut.cancelled():
                fut.exception()  # retrieved: the first failure is the one raised
        try:
            await self.sub.unsubscribe()
        except Exception:  # noqa: BLE001 - the connection closed, say: the error that ended the store is the one to raise
            if exc is None:
                raise

    async def settled(self, timeout_s: float) -> None:
        """Until every publish sent has its answer, or ``timeout_s`` passed."""
        pending = [fut for fut in self.waiting.values() if not fut.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout_s)

    async def publish(self, subject: str, payload: bytes) -> asyncio.Future:
        self.sent += 1
        token = str(self.sent)
        self.waiting[token] = fut = asyncio.get_running_loop().create_future()
        await self.nc.publish(subject, payload, reply=f"{self.inbox}.{token}")
        return fut

    async def _answered(self, msg) -> None:
        from nats.js.api import Header
        from nats.js.errors import APIError, NoStreamResponseError

        fut = self.waiting.pop(msg.subject.rpartition(".")[2], None)
        if fut is None or fut.done():
            return
        if msg.headers and msg.headers.get(Header.STATUS) == self.NO_RESPONDERS:
            fut.set_exception(NoStreamResponseError())
            return
        try:
            answer = json.loads(msg.data)
        except ValueError as exc:
            fut.set_exception(exc)
            return
        if "error" not in answer:
            fut.set_result(None)
            return
        try:  # a class of its own for some codes, raised; APIError returned for the rest
            fut.set_exception(APIError.from_error(answer["error"]))
        except APIError as exc:
            fut.set_exception(exc)


async def list_objects(js, bucket_name: str) -> list:
    """The objects of the object store ``bucket_name`` as nats-py's ``ObjectStore.list`` gives them
    (ObjectInfo, deleted ones included) but [] for an empty bucket; NotFoundError when the bucket is
    gone. Its meta subjects and then each one's newest message, as the stream's leader answers them
    (``kv_keys``' way), so the listing agrees with ``get_info`` and ``fetch_object``, which the leader
    answers too.

    nats-py's ``list`` reads the meta messages through an ordered push consumer and waits for them
    without a bound: a bucket deleted while it listed (by hand, or lost by NATS) left it waiting for
    good (7 of 40 tries in a probe), and with it a writer's checkpoints and its shutdown. A consumer
    of our own did not wait, but it reads the stream on whichever server it is placed: on a NATS
    server catching up after a restart it listed a checkpoint the writer had replaced and deleted,
    and not the newer one (chaos, kill-nats: ``journal verify`` called the stream purged past its
    checkpoint, which a start would have believed too)."""
    from nats.js.errors import NotFoundError
    from nats.js.api import ObjectInfo
    from nats.js.object_store import OBJ_ALL_META_PRE_TEMPLATE, OBJ_STREAM_TEMPLATE

    stream = OBJ_STREAM_TEMPLATE.format(bucket=bucket_name)
    held = (await js.stream_info(stream, subjects_filter=OBJ_ALL_META_PRE_TEMPLATE.format(bucket=bucket_name))
            ).state.subjects or {}
    found = []
    for subject in sorted(held):
        try:
            msg = await js.get_last_msg(stream, subject)
        except NotFoundError as exc:
            if exc.err_code == STREAM_NOT_FOUND:  # the bucket gone since
                raise
            continue  # purged since it was listed: an object deleted meanwhile
        found.append(ObjectInfo.from_response(json.loads(msg.data)))
    return found


async def delete_object(js, bucket_name: str, name: str) -> None:
    """Object ``name`` of the object store ``bucket_name`` deleted with nothing left of it: its chunks,
    then its meta message. nats-py's ``delete`` leaves a meta message marking the object deleted, which
    every later listing reads: a writer deleting its older checkpoint at each new one piled them up
    (one per checkpoint ever written), and each checkpoint listed them all. Chunks first, so a try cut
    short leaves the object listed, to be deleted again; an object gone already is left be."""
    from nats.js.api import ObjectInfo
    from nats.js.errors import NotFoundError
    from nats.js.object_store import OBJ_CHUNKS_PRE_TEMPLATE, OBJ_META_PRE_TEMPLATE, OBJ_STREAM_TEMPLATE

    stream = OBJ_STREAM_TEMPLATE.format(bucket=bucket_name)
    meta = OBJ_META_PRE_TEMPLATE.format(bucket=bucket_name, obj=base64.urlsafe_b64encode(name.encode()).decode())
    try:
        info = ObjectInfo.from_response(json.loads((await js.get_last_msg(stream, meta)).data))
    except NotFoundError:
        return  # gone already (an earlier try deleted it), or the bucket with it
    if info.nuid:
        await js.purge_stream(stream, subject=OBJ_CHUNKS_PRE_TEMPLATE.format(bucket=bucket_name, obj=info.nuid))
    await js.purge_stream(stream, subject=meta)


async def store_object(nc, js, bucket, bucket_name: str, name: str, data, ack_timeout_s: float,
                       in_flight: int = 1, sent: Callable[[int], None] | None = None) -> None:
    """The open file ``data`` stored as object ``name`` of the object store ``bucket`` (named
    ``bucket_name``; ``js``: the JetStream context of the connection ``nc``), as nats-py's
    ``ObjectStore.put`` stores it: 128 KiB chunks on a subject of a
    new NUID, then the object's meta message (nats-py's ObjectInfo, rolled up), then the chunks of
    the object it replaces purged. What nats-py, the ``nats`` CLI and ``fetch_object`` read.

    Up to ``in_flight`` chunks are sent and not yet acknowledged, in order on the one connection and
    so stored in order; the meta message is sent only once every chunk is acknowledged, so no
    reader sees a part of the object. nats-py's ``put`` sends one chunk at a time: 64 MB took
    1.6 s at R3; with 32 in flight 0.9 s (bench.jsread --checkpoint-mb). But chunks in flight fill
    the NATS servers' replication, and a serving writer's journal publishes wait behind them: its
    writes' p99 went from 7 ms to 37–68 ms while such a store ran, and a connection of its own did
    not help. So only a restore, which serves nothing, stores with STORE_CHUNKS. A chunk not
    acknowledged within ``ack_timeout_s`` is a NATS timeout; ``sent`` is told the bytes sent so far
    after every STORE_CHUNKS chunks (a restore's progress lines); on any failure the chunks sent are purged
    and the error raised (the errors of ``js.publish``), for ``retrying`` to store it again; a bucket
    deleted meanwhile raises the NotFoundError of that purge, as nats-py's put does."""
    import hashlib
    from datetime import datetime, timezone

    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.api import Header, ObjectInfo, ObjectMetaOptions
    from nats.js.errors import NotFoundError
    from nats.js.kv import MSG_ROLLUP_SUBJECT
    from nats.js.object_store import (OBJ_CHUNKS_PRE_TEMPLATE, OBJ_DEFAULT_CHUNK_SIZE, OBJ_DIGEST_TEMPLATE,
                                      OBJ_META_PRE_TEMPLATE, OBJ_STREAM_TEMPLATE)
    from nats.nuid import NUID

    try:
        replaced = await bucket.get_info(name)
    except NotFoundError:
        replaced = None
    stream = OBJ_STREAM_TEMPLATE.format(bucket=bucket_name)
    nuid = NUID().next().decode()
    subject = OBJ_CHUNKS_PRE_TEMPLATE.format(bucket=bucket_name, obj=nuid)
    chunk = OBJ_DEFAULT_CHUNK_SIZE
    digest, size, chunks = hashlib.sha256(), 0, 0

    async def acked(ack: asyncio.Future) -> None:
        try:
            async with asyncio.timeout(ack_timeout_s):
                await ack
        except TimeoutError:
            raise NatsTimeout from None

    try:
        async with _Acks(nc) as acks:
            waiting: deque[asyncio.Future] = deque()
            try:
                while block := await asyncio.to_thread(data.read, chunk * STORE_CHUNKS):
                    digest.update(block)
                    for at in range(0, len(block), chunk):
                        waiting.append(await acks.publish(subject, block[at:at + chunk]))
                        chunks += 1
                        if len(waiting) >= in_flight:
                            await acked(waiting.popleft())
                    size += len(block)
                    if sent is not None:
                        sent(size)
                while waiting:
                    await acked(waiting.popleft())
            except Exception:
                # the chunks still in flight are stored or refused before the purge below: one the
                # servers stored after it (its room freed by the purge) would be left in the bucket
                # for good, under a NUID no object names (seen once, in a full bucket)
                await acks.settled(ack_timeout_s)
                for fut in waiting:  # their refusals are this one's echo: retrieved, not logged as lost
                    if fut.done() and not fut.cancelled():
                        fut.exception()
                raise
        info = ObjectInfo(name=name, bucket=bucket_name, nuid=nuid, size=size, chunks=chunks,
                          mtime=datetime.now(timezone.utc).isoformat(),
                          options=ObjectMetaOptions(max_chunk_size=chunk),
                          digest=OBJ_DIGEST_TEMPLATE.format(digest=base64.urlsafe_b64encode(digest.digest()).decode()))
        meta = OBJ_META_PRE_TEMPLATE.format(bucket=bucket_name, obj=base64.urlsafe_b64encode(name.encode()).decode())
        await js.publish(meta, json.dumps(info.as_dict()).encode(), timeout=ack_timeout_s,
                         headers={Header.ROLLUP: MSG_ROLLUP_SUBJECT})
    except Exception:  # not when cancelled: nats-py's put leaves its chunks then too
        try:
            await js.purge_stream(stream, subject=subject)
        except NotFoundError:
            raise  # the bucket is gone
        except Exception:  # noqa: BLE001 - the store's own error is the one to report
            pass
        raise
    if replaced is not None and not replaced.deleted and replaced.nuid:
        await js.purge_stream(stream, subject=OBJ_CHUNKS_PRE_TEMPLATE.format(bucket=bucket_name, obj=replaced.nuid))


class DeliveryLost(Exception):
    """Messages JetStream sent a follower's consumer that never reached this process."""


@dataclass(frozen=True)
class JetStreamConfig:
    """Where the journals live: NATS URLs, stream name prefix, replicas, timeouts."""

    urls: tuple[str, ...]
    prefix: str = "shardetcd"
    replicas: int = 3
    publish_timeout_s: float = 2.0
    connect_timeout_s: float = 5.0
    # A server that stops answering without closing the connection (frozen, its machine
    # lost, packets dropped) is left after this many seconds without a PONG: nats-py pings
    # every stale_after_s / 3 and reconnects to another server at the third unanswered ping.
    # Its default is minutes, during which every publish and lease renewal waits.
    stale_after_s: float = 1.5
    # the writer lease's TTL (the server's --journal-lease-ttl), for a process that is not the
    # server but holds the lease a while (a restore uploading checkpoints)
    lease_ttl_s: float = 3.0
    access: NatsAccess | None = None  # --journal-trusted-ca-file, --journal-cert-file, --journal-key-file,
    # --journal-creds-file, --journal-nkey-file


@dataclass(frozen=True)
class NatsAccess:
    """How this process reaches the NATS servers: TLS (the CA that signed their certificates, else
    the system's; a client certificate for servers that verify clients, ``tls { verify: true }``)
    and a NATS user's credentials (a creds file: the user's JWT and NKey seed, as an operator-mode
    NATS account issues them; or an NKey seed file, for ``nkey:`` users). A user and password or a
    token go in the URL instead."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    creds_file: str | None = None
    nkey_file: str | None = None

    def context(self):
        """An ssl.SSLContext; JournalUnreachable (one line) when a file cannot be read."""
        import ssl

        try:
            ctx = ssl.create_default_context(cafile=self.ca_file)
            if self.cert_file:
                ctx.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            files = ", ".join(filter(None, (self.ca_file, self.cert_file, self.key_file)))
            raise JournalUnreachable(f"NATS TLS files ({files}) cannot be used: {exc}") from None
        return ctx

    def credentials(self) -> dict:
        """nats.connect's arguments for the creds or NKey seed file, checked now (a file that cannot
        be read or holds no seed is one line here, not a failed handshake later)."""
        path = self.creds_file or self.nkey_file
        if path is None:
            return {}
        try:
            import nkeys
        except ImportError:
            raise JournalUnreachable("NATS credentials files need the nkeys package: "
                                     "pip install 'shardetcd[jetstream]'") from None
        what = "creds file" if self.creds_file else "NKey seed file"
        try:
            text = Path(path).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise JournalUnreachable(f"NATS {what} {path} cannot be read: {exc}") from None
        seeds = _SEED.findall(text)
        if self.creds_file and not _CREDS_JWT.search(text):
            raise JournalUnreachable(f"NATS creds file {path} holds no user JWT (a creds file has a "
                                     "-----BEGIN NATS USER JWT----- block and the user's NKey seed)")
        try:
            nkeys.from_seed(bytearray(seeds[0].encode()))
        except Exception:  # noqa: BLE001 - nkeys' several errors all mean "no usable seed"
            raise JournalUnreachable(f"NATS {what} {path} holds no user NKey seed (SU...)") from None
        return {"user_credentials": path} if self.creds_file else {"nkeys_seed": path}


_SEED = re.compile(r"\bSU[A-Z2-7]{56}\b")
_CREDS_JWT = re.compile(r"-+BEGIN NATS USER JWT-+\s*\S+\s*-+END NATS USER JWT-+")


class ClientCertificateRenewal:
    """nats-py makes every reconnect with the SSL context it was given once: the client
    certificate in it is loaded again from its files when they changed (looked at on a disconnect
    and on each failed reconnect attempt), so a certificate renewed on disk is presented at the
    next reconnect instead of the one loaded at start, which may have expired by then (NATS
    refuses the handshake, and the writer could journal nothing until restarted). A pair that
    cannot be loaded (the key moved into place, the certificate not yet) leaves the one loaded
    before, and is tried again at its next change."""

    def __init__(self, context, cert_file: str, key_file: str) -> None:
        self.context, self.paths = context, (cert_file, key_file)
        self.stamp = self._stamp()

    def _stamp(self) -> tuple | None:
        try:
            return files_stamp(*self.paths)
        except OSError:
            return None

    def check(self) -> None:
        import ssl

        stamp = self._stamp()
        if stamp is None or stamp == self.stamp:
            return
        self.stamp = stamp
        try:
            self.context.load_cert_chain(*self.paths)
        except (OSError, ssl.SSLError) as exc:
            logger.warning("cannot load the renewed NATS client certificate cert_file=%s key_file=%s error=%s",
                           *self.paths, exc)
            return
        logger.info("loaded the renewed NATS client certificate cert_file=%s", self.paths[0])


def nats_tls(urls: tuple[str, ...], access: NatsAccess | None):
    """The ssl context of a NATS connection, or None for plain connections (tls:// URLs and servers
    that require TLS take the system's CAs when no file is given)."""
    if (access is None or not (access.ca_file or access.cert_file)) and not any(u.startswith("tls://") for u in urls):
        return None
    return (access or NatsAccess()).context()


CLOSE_GRACE_S = 2.0  # how long closing a NATS connection waits for the server's goodbye


def nats_client():
    """nats-py's client, except that a connection it gives up on (stale: its pings went unanswered;
    or broken) is aborted before it tries another server, not closed gracefully. Over TLS a
    graceful close waits for the server's close_notify (the SSL shutdown, up to 30 s), which a
    frozen server or a partition that holds packets never sends: the reconnect waited that long,
    past the writer lease's TTL. The connection is left either way; what was written to it and
    not answered is published again (journal publishes carry their message id). Closing the
    client waits CLOSE_GRACE_S for the goodbye, then aborts likewise."""
    import nats

    class Client(nats.NATS):
        def _abort(self) -> None:
            writer = getattr(self._transport, "_io_writer", None)  # nats-py's TCP transport (TLS or not)
            if writer is not None:
                writer.transport.abort()

        async def _attempt_reconnect(self) -> None:
            self._abort()
            await super()._attempt_reconnect()

        async def _close(self, status: int, do_cbs: bool = True) -> None:
            # A close (the process stopping, a connect given up) says goodbye for CLOSE_GRACE_S,
            # then leaves: the same wait for close_notify would hold a shutdown up to 30 s.
            closing = asyncio.ensure_future(super()._close(status, do_cbs))
            try:
                await asyncio.wait_for(asyncio.shield(closing), CLOSE_GRACE_S)
            except asyncio.TimeoutError:
                self._abort()
                await closing

    return Client()


def connect_options(urls: tuple[str, ...], access: NatsAccess | None) -> dict:
    """nats.connect's TLS and credentials arguments (JournalUnreachable when a file cannot be used)."""
    return {"tls": nats_tls(urls, access), **(access.credentials() if access is not None else {})}


class ClientCertificateRequired(Exception):
    """A connect without a client certificate to a NATS server that verifies them."""


def connect_failure(exc: BaseException, nc, access: NatsAccess | None) -> BaseException:
    """What a failed connect attempt of ``nc`` means: ``exc``, or ClientCertificateRequired when the
    server it reached verifies client certificates (its INFO, read before TLS starts, says so)
    and this process has none (such a server closes the connection after the handshake)."""
    server = getattr(nc, "_server_info", None) or {}
    if server.get("tls_verify") and not (access and access.cert_file) and not refused(exc):
        return ClientCertificateRequired(f"{exc!r} from a server that verifies client certificates")
    return exc


def refused(exc: BaseException) -> bool:
    """A connect that NATS refused for this process's credentials or that failed TLS verification:
    trying again will not help, unlike a server that is not up yet."""
    import ssl

    if isinstance(exc, (ssl.SSLCertVerificationError, ClientCertificateRequired)):
        return True
    return any(said in str(exc) for said in _REFUSED_USER)


# what NATS says to a user it will not let in (not its 'Authentication Timeout': a client too slow
# to send its credentials, which a later try may not be)
_REFUSED_USER = ("Authorization Violation", "User Authentication Expired", "User Authentication Revoked",
                 "Account Authentication Expired")


def shown_urls(urls: Iterable[str]) -> str:
    """The URLs for a message or a log line: a password or a token in one is not shown."""
    return ",".join(_USERINFO.sub(_hide_secret, u) for u in urls)


_USERINFO = re.compile(r"^([a-z]+://)([^/]*)@")  # up to the last @ of the authority


def refusal(urls: tuple[str, ...], exc: BaseException, access: NatsAccess | None) -> JournalUnreachable:
    """The one line for a connect that ``refused``: what NATS said, and what to give."""
    return JournalUnreachable(f"NATS at {shown_urls(urls)} refused this process: {exc!r}{_hint(exc, urls, access)}")


def _hint(exc: BaseException, urls: tuple[str, ...], access: NatsAccess | None) -> str:
    import ssl

    given = access or NatsAccess()
    if isinstance(exc, ClientCertificateRequired):
        return " (give this process a certificate the servers trust: --journal-cert-file, --journal-key-file)"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return ("" if given.ca_file else
                " (their certificates are not signed by a CA this machine trusts: --journal-trusted-ca-file)")
    if given.creds_file or given.nkey_file:
        return " (the NATS servers do not know the user of the credentials file given)"
    if any(_USERINFO.match(u) for u in urls):
        return " (the NATS servers do not accept the user and password, or the token, in --journal-url)"
    return (" (the NATS servers require a user: --journal-creds-file, --journal-nkey-file, or "
            "nats://USER:PASSWORD@HOST:PORT or nats://TOKEN@HOST:PORT in --journal-url)")


def _hide_secret(m: re.Match) -> str:
    user, sep, _ = m.group(2).partition(":")
    return f"{m.group(1)}{user}:***@" if sep else f"{m.group(1)}***@"  # user:password, or a token alone


class JetStreamLog:
    """One NATS connection shared by every journal of a process."""

    def __init__(self, config: JetStreamConfig) -> None:
        self.config = config
        self.nc = None
        self.js = None
        self.writer_id = secrets.token_hex(6)
        self.events = ConnectionEvents(self.writer_id)
        self.closing = False
        self.batch_bytes_max = MIN_MAX_PAYLOAD
        self.epoch = 0  # the writer lease's revision once held: stamped on every message
        self.lease = None  # the WriterLease (journal/leadership.py) this process writes under, once held
        self._replicas_tasks: list[asyncio.Future] = []  # keep_replicas_soon's
        self._lead_again_at: dict[str, float] = {}  # lead_here: per stream, when to ask again after a move that did not take
        self._leading: asyncio.Future | None = None  # _lead_buckets, once writing
        self._opening: dict[str, asyncio.Lock] = {}  # open_or_create's, per bucket or stream
        self._connect_error: Exception | None = None  # the last error of the first connect
        self.denied: Exception | None = None  # the last permissions violation NATS reported, and when
        self.denied_at = 0.0
        self._connecting = None  # the connection being made, before it is
        self._renewal: ClientCertificateRenewal | None = None  # the client certificate, loaded again when renewed
        self._acked_out: dict[str, int] = {}  # stream -> its last sequence acknowledged to this writer (told to followers)
        self._acked_repeat: asyncio.Task | None = None  # _repeat_acked, once this process writes
        self._acked_in: dict[str, JetStreamJournal] = {}  # stream -> the journal following it here
        self._acked_sub = None  # the subscription to acked_subject, once a journal is followed here

    async def connect(self) -> JetStreamLog:
        urls = shown_urls(self.config.urls)
        options = connect_options(self.config.urls, self.config.access)
        access = self.config.access
        if options["tls"] is not None and access is not None and access.cert_file:
            self._renewal = ClientCertificateRenewal(options["tls"], access.cert_file, access.key_file)
        nc = self._connecting = nats_client()
        # NATS not up yet is waited for (up to 3 connect timeouts); a refusal of this process's
        # credentials or of the servers' certificates by every server is final at once
        self._refusals, self._refusal, self._refused = 0, None, asyncio.Event()
        connecting = asyncio.ensure_future(nc.connect(
            servers=list(self.config.urls), name=f"shardetcd-{self.writer_id}",
            # a frozen server accepts TCP but never greets: a reconnect gives up on it as soon as a ping would
            connect_timeout=min(self.config.connect_timeout_s, self.config.stale_after_s),
            max_reconnect_attempts=-1, reconnect_time_wait=0.25,
            ping_interval=self.config.stale_after_s / STALE_PINGS, max_outstanding_pings=STALE_PINGS - 1,
            allow_reconnect=True, error_cb=self._on_error, disconnected_cb=self._on_disconnect,
            reconnected_cb=self._on_reconnect, **options))
        refusing = asyncio.ensure_future(self._refused.wait())
        try:
            await asyncio.wait((connecting, refusing), timeout=3 * self.config.connect_timeout_s,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            await cancel_and_wait(refusing)
            if not connecting.done():
                await cancel_and_wait(connecting)
        failure = None if connecting.cancelled() else connecting.exception()
        if connecting.cancelled() or failure is not None:
            self.closing = True
            await nc.close()
            if self._refused.is_set():
                raise refusal(self.config.urls, self._refusal, self.config.access)
            reason = "no answer" if failure is None else repr(failure)
            if self._connect_error is not None:  # why there was no answer
                reason += f" (last error: {self._connect_error!r})"
            raise JournalUnreachable(f"cannot reach NATS at {urls}: {reason}")
        self.nc = nc
        try:
            if self.nc.max_payload < MIN_MAX_PAYLOAD:
                raise JournalUnreachable(
                    f"NATS at {urls} takes messages of at most {self.nc.max_payload} bytes; a journal needs "
                    f"{MIN_MAX_PAYLOAD} (etcd's 1.5 MiB requests plus room): set max_payload: 8MB on the NATS servers")
            self.batch_bytes_max = self.nc.max_payload - 64 * 1024  # room for headers
            self.js = self.nc.jetstream(timeout=self.config.publish_timeout_s)
            await self._jetstream_answers(urls)
        except BaseException:
            self.closing = True
            await self.nc.close()
            raise
        return self

    async def _jetstream_answers(self, urls: str) -> None:
        """JournalUnreachable, in one line, if JetStream is not there for this process: not enabled
        on the servers or for the user's account, or the user not permitted its API. A JetStream
        that answers only later (a cluster electing its leader) is left to each request's retries."""
        from nats.js.errors import APIError, ServiceUnavailableError

        deadline = time.monotonic() + self.config.connect_timeout_s
        while True:
            try:
                await self.js.account_info()
                return
            except ServiceUnavailableError as exc:  # 503: JetStream is not there for this user
                if exc.err_code == JETSTREAM_NOT_ENABLED_FOR_ACCOUNT:
                    raise JournalUnreachable(f"NATS at {urls}: JetStream is not enabled for this user's account "
                                             f"({exc.description}): enable it for the account") from None
                if exc.err_code is not None:
                    return  # it answered (e.g. 10008, temporarily unavailable: a cluster electing its leader)
                if time.monotonic() > deadline:  # nobody answers JetStream's API (or not yet: a server starting)
                    raise JournalUnreachable(
                        f"NATS at {urls} answers no JetStream requests of this user: is JetStream enabled on the "
                        "NATS servers (-js, or jetstream {} in their configuration) and for the user's account?"
                    ) from None
                await asyncio.sleep(0.25)
            except APIError:
                return  # it answered: JetStream is there
            except transient_errors():
                if self.denied is not None:
                    raise JournalUnreachable(f"NATS at {urls} does not permit this user JetStream's API: "
                                             f"{self.denied} (see the permissions a journal's user needs in the "
                                             "README)") from None
                return

    async def keep_replicas(self, *streams: str) -> None:
        """Give each of ``streams`` that exists (a journal's, or a bucket's ``KV_``/``OBJ_`` stream) this
        process's --journal-replicas. A writer calls it for what it writes: a stream made with another
        count (an earlier start with --journal-replicas 1 on a NATS cluster since grown) would otherwise
        store what is acknowledged on fewer servers than the flag says."""
        from nats.js.errors import APIError, NotFoundError

        want = self.config.replicas
        for stream in streams:
            try:
                info = await self.retrying(f"stream {stream}", lambda: self.js.stream_info(stream))
            except NotFoundError:
                continue  # made later, with ``want``
            have = info.config.num_replicas or 1
            if have == want:
                continue
            info.config.num_replicas = want
            try:
                await self.retrying(f"stream {stream} replicas", lambda: self.js.update_stream(info.config))
            except (APIError, JournalFailed) as exc:  # refused, or "no suitable peers" until retrying gave up
                said = exc.description if isinstance(exc, APIError) else str(exc)
                raise JournalUnreachable(f"JetStream did not change stream {stream} from {have} to {want} "
                                         f"replicas ({said}): --journal-replicas must be what the NATS cluster "
                                         "can hold") from None
            logger.warning("jetstream replicas changed to --journal-replicas stream=%s from=%d to=%d", stream, have, want)

    def keep_replicas_soon(self, *streams: str) -> None:
        """``keep_replicas`` in a task of its own, for a standby that has just taken over (the takeover
        is not held up by it) or a writer whose stream was edited to fewer replicas: a refusal is a
        warning (the journals are served as they are)."""
        async def keep() -> None:
            try:
                await self.keep_replicas(*streams)
            except JournalError as exc:
                logger.warning("jetstream replicas left as they are streams=%s error=%s", ",".join(streams), exc)

        self._replicas_tasks = [t for t in self._replicas_tasks if not t.done()]
        self._replicas_tasks.append(asyncio.ensure_future(keep()))

    @property
    def meta_bucket(self) -> str:
        return meta_bucket(self.config.prefix)

    async def _meta(self):
        from nats.js.api import KeyValueConfig
        from nats.js.errors import BucketNotFoundError

        name = self.meta_bucket
        return await self.open_or_create(f"meta bucket {name}", lambda: self.js.key_value(name),
                                         lambda: self.js.create_key_value(KeyValueConfig(
                                             bucket=name, history=1, replicas=self.config.replicas)),
                                         BucketNotFoundError)

    async def agree(self, key: str, proposal: str) -> str:
        """The value of ``key`` in the bucket ``<prefix>-meta``: ``proposal`` if
        this process is the first to set it, else what the first one set (kept
        forever, for every process on any machine that uses these journals)."""
        from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

        kv = await self._meta()
        for _ in range(100):
            try:
                await self.retrying(f"create {key}", lambda: kv.create(key, proposal.encode()))
                return proposal
            except KeyWrongLastSequenceError:  # another process set it first: read what it set
                try:
                    return (await self.retrying(f"get {key}", lambda: kv.get(key))).value.decode()
                except KeyNotFoundError:
                    pass
            except KeyNotFoundError:
                pass
            # "not found" although the slot is taken: nats-py's create re-reads a key it found set,
            # and a replica that has not stored another process's create yet (two processes
            # starting at once) answers "not found"; or the key was deleted by hand. Ask again.
            await asyncio.sleep(0.05)
        raise JournalUnreachable(f"meta key {key}: NATS keeps answering that it is both set and not found")

    async def raise_meta(self, key: str, value: int) -> None:
        """Set ``key`` to ``value`` unless it holds a number at least as large already. A writer's
        release records how far it released so; a writer replaced while releasing (frozen between
        its checkpoint and its release, resumed after the new writer's own release) set it back, and
        every later start took the new writer's release for messages purged by hand and refused to
        open the stream."""
        await self.update_meta(key, str(value),
                               lambda current: (held := _as_number(current)) is not None and held >= value)

    async def update_meta(self, key: str, value: str, keep: Callable[[bytes], bool]) -> bool:
        """Set ``key`` to ``value`` unless ``keep(what it holds)``, compared and set on the key's
        revision (another process's put in between is looked at again); whether it was set."""
        from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

        kv = await self._meta()
        for attempt in range(100):
            try:  # (a replica's direct get may lag: the set below is refused then, and this asked again)
                entry = await self.retrying(f"get {key}", lambda: kv.get(key))
            except KeyNotFoundError:
                entry = None
            try:
                if entry is None:
                    await self.retrying(f"create {key}", lambda: kv.create(key, value.encode()))
                elif keep(entry.value or b""):
                    return False
                else:
                    await self.retrying(f"update {key}", lambda: kv.update(key, value.encode(), last=entry.revision))
                return True
            except (KeyWrongLastSequenceError, KeyNotFoundError):  # set meanwhile (or our own earlier try): again
                await asyncio.sleep(min(0.01 * (attempt + 1), 0.1))
        raise JournalUnreachable(f"meta key {key}: it keeps changing while this process sets it")

    async def put_meta(self, key: str, value: str) -> None:
        """Set ``key`` in ``<prefix>-meta`` (e.g. where the writer serves clients)."""
        kv = await self._meta()
        await self.retrying(f"put {key}", lambda: kv.put(key, value.encode()))

    async def get_meta(self, key: str) -> str | None:
        from nats.js.errors import KeyNotFoundError

        kv = await self._meta()
        try:
            return (await self.retrying(f"get {key}", lambda: kv.get(key))).value.decode()
        except KeyNotFoundError:
            return None

    async def _members(self, ttl_s: float):
        from nats.js.api import KeyValueConfig
        from nats.js.errors import BucketNotFoundError

        name = members_bucket(self.config.prefix)
        return await self.open_or_create(f"members bucket {name}", lambda: self.js.key_value(name),
                                         lambda: self.js.create_key_value(KeyValueConfig(
                                             bucket=name, history=1, ttl=ttl_s, replicas=self.config.replicas)),
                                         BucketNotFoundError)

    async def announce(self, key: str, value: str, ttl_s: float) -> None:
        """Keep ``key`` in the bucket ``members_bucket`` (entries expire after
        ``ttl_s`` unless announced again): who serves these journals now."""
        kv = await self._members(ttl_s)
        await self.retrying(f"announce {key}", lambda: kv.put(key, value.encode()))

    async def announced(self, prefix: str, ttl_s: float) -> list[str]:
        """The values of the live entries of ``members_bucket`` whose key starts with ``prefix``."""
        from nats.js.errors import KeyNotFoundError

        kv = await self._members(ttl_s)
        keys = await self.retrying("list members", lambda: kv_keys(self.js, members_bucket(self.config.prefix)))
        out = []
        for key in keys:
            if key.startswith(prefix):
                try:
                    out.append((await kv.get(key)).value.decode())
                except KeyNotFoundError:  # expired meanwhile
                    pass
        return out

    def stream_name(self, name: str) -> str:
        return f"{self.config.prefix}_{name}".replace(".", "_")

    # -- acknowledgements told to followers -----------------------------------

    @property
    def acked_subject(self) -> str:
        return f"journal.acked.{self.config.prefix}".replace("*", "_").replace(">", "_")

    @property
    def ask_subject(self) -> str:
        return f"{self.acked_subject}.ask"

    async def tell_acked(self, stream: str, seq: int) -> None:
        """A writer's journal had JetStream's acknowledgement of everything up to ``seq``: tell the
        followers now, again every ACKED_REPEAT_S (``_repeat_acked``), and whenever a starting
        follower asks (``ask_acked``)."""
        self._acked_out[stream] = seq
        if self._acked_repeat is None:
            self._acked_repeat = asyncio.ensure_future(self._repeat_acked())
            try:
                await self.nc.subscribe(self.ask_subject, cb=self._tell_all)
            except Exception as exc:  # noqa: BLE001 - followers then wait for the next repeat
                logger.debug("followers' asks not heard error=%r", exc)
        await self._publish_acked(f"{stream} {seq}")

    async def _tell_all(self, asked=None) -> None:
        """Tell again what every stream this process writes had acknowledged (``asked``: a follower's ask)."""
        await self._publish_acked("\n".join(f"{stream} {seq}" for stream, seq in self._acked_out.items()))

    async def ask_acked(self) -> None:
        """A follower: ask the writer to tell again now what it had acknowledged."""
        await self._quietly(self.ask_subject, b"")

    async def _publish_acked(self, lines: str) -> None:
        await self._quietly(self.acked_subject, lines.encode())

    async def _quietly(self, subject: str, data: bytes) -> None:
        """Publish on core NATS; a failure is not an error: the writer tells again soon anyway, and a
        follower holds the message until then."""
        try:
            await self.nc.publish(subject, data)
        except Exception as exc:  # noqa: BLE001 - see above
            logger.debug("not published subject=%s error=%r", subject, exc)

    async def _repeat_acked(self) -> None:
        while not self.closing:
            await asyncio.sleep(ACKED_REPEAT_S)
            await self._tell_all()

    async def hear_acked(self, journal: JetStreamJournal) -> None:
        """From now on ``journal`` (opened to follow) is told what its writer had acknowledged. The
        first subscribes, and hears a message of its own on the subject: NATS refuses a subscription
        it does not permit in an error that comes when it comes, so only hearing tells it was taken."""
        self._acked_in[journal.stream] = journal
        if self._acked_sub is not None:
            return
        probe = f"probe {secrets.token_hex(8)}".encode()
        heard = asyncio.Event()

        async def on_acked(msg) -> None:
            if msg.data == probe:
                heard.set()
            else:
                await self._on_acked(msg)

        asked = time.monotonic()
        self._acked_sub = await self.nc.subscribe(self.acked_subject, cb=on_acked)
        for _ in range(round(self.config.connect_timeout_s / 0.5)):
            await self._publish_acked(probe.decode())
            try:
                async with asyncio.timeout(0.5):
                    await heard.wait()
                return
            except TimeoutError:
                if self.denied is not None and self.denied_at >= asked and \
                        self.acked_subject.lower() in str(self.denied).lower():
                    raise JournalUnreachable(
                        f"NATS does not permit this user to subscribe to {self.acked_subject} (where writers tell "
                        f"what JetStream acknowledged to them, which a follower waits for): {self.denied} (see the "
                        "permissions a journal's user needs in the README)") from None
        logger.warning("subscription to writers' acknowledgements not confirmed, going on subject=%s",
                       self.acked_subject)  # NATS away now: nats-py subscribes again when it is back

    async def _on_acked(self, msg) -> None:
        for line in msg.data.decode(errors="replace").splitlines():
            stream, _, seq = line.partition(" ")
            journal = self._acked_in.get(stream)
            if journal is not None and seq.isdigit():
                journal.acknowledged(int(seq))

    async def open_journal(self, name: str, scratch: Path, config: JournalConfig = JournalConfig(),
                           follow: bool = False) -> JetStreamJournal:
        """The journal ``name`` (a stream, created if missing), read to its end and
        fenced; with ``follow``, neither: ``catch_up``, ``follow`` and ``take_over`` do."""
        config = replace(config, batch_bytes_max=min(config.batch_bytes_max, self.batch_bytes_max),
                         record_bytes_max=min(config.record_bytes_max, self.batch_bytes_max - HEADER_BYTES))
        journal = JetStreamJournal(self, self.stream_name(name), scratch, config)
        await journal._open(follow)
        return journal

    async def close(self) -> None:
        self.closing = True
        await cancel_and_wait(self._leading, self._acked_repeat, *self._replicas_tasks)
        if self.nc is not None:
            await self.nc.close()

    def write_under(self, lease, took_over: bool = False) -> None:
        """From now on this process writes under ``lease`` (held): its revision is stamped on every
        message published, its buckets are led from its NATS server (``_lead_buckets``: at once at a
        start, as its journals are before it serves, so no election comes later while others use them;
        a stream check later after a takeover, whose first writes are not to wait on one), and a
        stream's leadership is moved here only while the lease is sure."""
        from journal.leadership import KEY

        self.lease, self.epoch = lease, lease.revision
        if self._leading is None and lease.key == KEY:  # not a partition's: those buckets are all partitions'
            self._leading = asyncio.ensure_future(self._lead_buckets(
                writer_bucket_streams(self.config.prefix), STREAM_CHECK_S if took_over else 0.0))

    async def _lead_buckets(self, streams: tuple[str, ...], first_s: float) -> None:
        """While this process writes the whole prefix: every ``STREAM_CHECK_S``, the leadership of the
        buckets a writer keeps (``writer_bucket_streams``) moved to its NATS server (``lead_here``), as
        each journal's stream check does for its stream. Above all the writer lease's: its renewals
        then wait on no other server, so losing one that is not the writer's leaves linearizable reads
        alone (with the lease bucket led from the lost server they waited 2.2 s for its election and
        the lease lapsed). Not a partition's writer (``shardetcd cluster``): the partitions share these
        buckets, each perhaps on another NATS server, and would hand them back and forth."""
        wait = first_s
        while not self.closing:
            await asyncio.sleep(wait)
            wait = STREAM_CHECK_S
            for stream in streams:
                try:
                    await self.lead_here(await self.js.stream_info(stream))
                except Exception as exc:  # noqa: BLE001 - not answered now (or not made yet): the next round asks again
                    logger.debug("bucket leader check skipped stream=%s error=%r", stream, exc)

    @property
    def leading_server(self) -> str | None:
        """The name of the NATS server this process is connected to now (from its INFO), if it can be
        handed a stream's leadership (``hand_leadership``: NATS 2.11 and later); None otherwise (an
        older server would take the request as a plain stepdown and elect a leader at random)."""
        try:
            version = self.nc.connected_server_version
            if (version.major, version.minor) < (2, 11):
                return None
        except (AttributeError, ValueError):  # not connected, or a version that does not parse
            return None
        return (getattr(self.nc, "_server_info", None) or {}).get("server_name") or None

    async def lead_here(self, info) -> bool:
        """Move the stream of ``info`` (a journal's, or a bucket's) to the NATS server this writer is
        connected to, when that server holds a current replica of it and another leads it: every publish
        then goes to its leader directly instead of through a route to another server and back (a
        network round trip fewer per batch: 0.2-0.4 ms of a 1.1-1.5 ms lone write on loopback,
        bench/README.md), and losing another server never leaves this writer waiting on an election. A
        move that did not take (refused, unanswered, or undone before the next check) is asked again
        only after ``LEAD_AGAIN_S``; once a check sees it taken, a later move away (a server restarted,
        this process reconnected elsewhere) is undone at the next check. Nothing is moved while the
        writer lease is not sure (perhaps deposed: not to pull leaders from the new writer). True if it
        asked and NATS agreed."""
        stream, here, cluster = info.config.name, self.leading_server, info.cluster
        if here is None or cluster is None or not cluster.leader or cluster.leader == here:
            self._lead_again_at.pop(stream, None)
            return False
        if not any(p.name == here and p.current and not p.offline for p in cluster.replicas or ()):
            return False  # not one of its replicas (R1, or a larger NATS cluster), or behind
        if time.monotonic() < self._lead_again_at.get(stream, 0.0):
            return False
        if self.lease is not None and not self.lease.sure():
            return False
        self._lead_again_at[stream] = time.monotonic() + LEAD_AGAIN_S
        said = await self.hand_leadership(stream, here)
        if said is None:
            logger.info("journal stream leader moved to this writer's NATS server stream=%s from=%s to=%s",
                        stream, cluster.leader, here)
        else:
            logger.info("journal stream leader not moved stream=%s leader=%s here=%s answer=%s",
                        stream, cluster.leader, here, said)
        return said is None

    async def hand_leadership(self, stream: str, server: str) -> str | None:
        """Ask JetStream to hand ``stream``'s leadership to ``server`` (one of its replicas: a Raft
        leadership transfer, the preferred stepdown of NATS 2.11); None if it agreed, else what it said."""
        try:
            answer = await self.nc.request(f"{self.js._prefix}.STREAM.LEADER.STEPDOWN.{stream}",  # noqa: SLF001 - a domain's
                                           json.dumps({"placement": {"preferred": server}}).encode(),
                                           timeout=self.config.publish_timeout_s)
            said = json.loads(answer.data)
        except Exception as exc:  # noqa: BLE001 - no answer, or not JSON: the next check asks again
            return repr(exc)
        return None if said.get("success") else str(said.get("error") or said)

    @property
    def connected(self) -> bool:
        """Whether the NATS connection is up now (not while it reconnects)."""
        return self.nc is not None and self.nc.is_connected

    @property
    def reconnects(self) -> int:
        return self.nc.stats["reconnects"] if self.nc is not None else 0

    def retrying(self, what: str, op, deadline_s: float = 30.0):
        """``retrying`` on this connection."""
        return retrying(what, op, deadline_s, log=self)

    async def open_or_create(self, what: str, get, create, missing: type[Exception]):
        """``open_or_create`` on this connection, one at a time per ``what``: JetStream answers a
        second create of a stream being created at once, before the stream has a leader, and a request
        to it then goes unanswered for a whole timeout (the five journals opening the meta bucket of a
        new prefix together waited 2 s each so). The first creates it; the others find it made."""
        async with self._opening.setdefault(what, asyncio.Lock()):
            return await open_or_create(what, get, create, missing, log=self)

    async def _on_error(self, exc: Exception) -> None:
        if self.nc is not None and not self.closing:  # not while the first connect is being tried
            self.events.error(exc)
            if self._renewal is not None:  # a reconnect attempt failed: the next one with a renewed certificate
                self._renewal.check()
            if "permissions violation" in str(exc).lower():
                self.denied, self.denied_at = exc, time.monotonic()
        elif self.nc is None:
            self._connect_error = exc  # named if the first connect gives up
            exc = connect_failure(exc, self._connecting, self.config.access)
            if refused(exc):
                self._refusals, self._refusal = self._refusals + 1, exc
                if self._refusals >= len(self.config.urls):
                    self._refused.set()

    async def _on_disconnect(self) -> None:
        if self.nc is not None and not self.closing:
            self.events.disconnected()
            if self._renewal is not None:
                self._renewal.check()

    async def _on_reconnect(self) -> None:
        url = self.nc.connected_url
        self.events.reconnected(f"{url.hostname}:{url.port}" if url else "?")


class ConnectionEvents:
    """The log of one NATS connection's troubles: the disconnect, the first error after it and
    every ``LOG_EVERY``th (a reconnect loop fails every 0.25 s per server while NATS is away), and
    the reconnect with how long it took and how many tries failed."""

    LOG_EVERY = 100

    def __init__(self, client: str) -> None:
        self.client = client
        self.errors = 0  # since the last disconnect (for the log's cadence)
        self.errors_total = 0  # since the start (/metrics)
        self.disconnects = 0
        self.down_since: float | None = None

    def error(self, exc: BaseException) -> None:
        self.errors += 1
        self.errors_total += 1
        if self.errors == 1 or self.errors % self.LOG_EVERY == 0:
            logger.warning("nats connection error client=%s count=%d error=%r", self.client, self.errors, exc)

    def disconnected(self) -> None:
        self.errors, self.down_since = 0, time.monotonic()
        self.disconnects += 1
        logger.warning("nats disconnected; publishes wait for the reconnect client=%s", self.client)

    def reconnected(self, url: str) -> None:
        down = time.monotonic() - self.down_since if self.down_since is not None else 0.0
        logger.warning("nats reconnected url=%s client=%s down_s=%.1f failed_connects=%d",
                       url, self.client, down, self.errors)
        self.errors, self.down_since = 0, None


def transient_errors() -> tuple[type[BaseException], ...]:
    """What NATS raises while it cannot answer right now (a reconnect, a leader
    election, a lost quorum): worth trying again, never a reason to fail."""
    from nats.errors import (ConnectionReconnectingError, FlushTimeoutError, NoRespondersError,
                             OutboundBufferLimitError, StaleConnectionError, TimeoutError as NatsTimeout)
    from nats.js.errors import NoStreamResponseError, ServiceUnavailableError

    return (ServiceUnavailableError, NoStreamResponseError, NoRespondersError, NatsTimeout, asyncio.TimeoutError,
            ConnectionReconnectingError, FlushTimeoutError, OutboundBufferLimitError, StaleConnectionError,
            DeliveryLost)


def publish_error_kind(exc: BaseException) -> str | None:
    """What a failed publish means: "transient" (no answer right now: retry), "storage" (JetStream is
    out of room: retry, and say so), "fenced" (another writer appended), "refused" (any other
    JetStream API error: never stored, and retrying cannot change that), or None (not a NATS error)."""
    from nats.js.errors import APIError, ServiceUnavailableError

    if isinstance(exc, APIError):
        code = getattr(exc, "err_code", None)
        if code == WRONG_LAST_SEQUENCE:
            return "fenced"
        if code in STORAGE_FULL_API_ERRORS or (
                code == STREAM_STORE_FAILED and any(w in (exc.description or "").lower() for w in _STORAGE_FULL_WORDS)):
            return "storage"
        if code in TRANSIENT_API_ERRORS or code == DUPLICATE_IN_PROCESS or (
                code is None and isinstance(exc, ServiceUnavailableError)):
            return "transient"
        return "refused"
    if isinstance(exc, transient_errors()):
        return "transient"
    return None


def transient_cause(exc: BaseException) -> str:
    """A word for the log: why a publish got no answer."""
    from nats.errors import NoRespondersError
    from nats.js.errors import APIError, NoStreamResponseError

    if isinstance(exc, (NoStreamResponseError, NoRespondersError)):
        return "no-responders"  # no stream leader right now (an election, a lost quorum, a full store)
    if isinstance(exc, APIError):
        return "in-flight" if getattr(exc, "err_code", None) == DUPLICATE_IN_PROCESS else "jetstream-unavailable"
    if isinstance(exc, _timeouts()):
        return "timeout"  # no answer within the publish timeout (servers stopped, overloaded, partitioned)
    return "disconnected"  # the connection is down or being re-established


def _timeouts() -> tuple[type[BaseException], ...]:
    from nats.errors import TimeoutError as NatsTimeout

    return (NatsTimeout, asyncio.TimeoutError)


def describe_api_error(exc: BaseException) -> str:
    """``code=503 err_code=10023 description='insufficient resources'`` (or the exception's repr)."""
    if getattr(exc, "err_code", None) is None and getattr(exc, "code", None) is None:
        return repr(exc)
    return f"code={exc.code} err_code={exc.err_code} description={exc.description!r}"


def unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says only that JetStream cannot answer right now (no responders, a
    timeout: a leader election, a reconnect), not that it refused."""
    from nats.js.errors import APIError

    if isinstance(exc, transient_errors()):
        return True
    return isinstance(exc, APIError) and getattr(exc, "err_code", None) in TRANSIENT_API_ERRORS


async def retrying(what: str, op, deadline_s: float = 30.0, log: JetStreamLog | None = None):
    """Run ``op()`` (a coroutine factory) again while JetStream answers that it
    is not available right now (``unavailable``), for up to ``deadline_s``; ``log``: the
    connection's, whose permissions violations since the first try end the retries (NATS
    does not answer a request it does not permit: it would look unavailable)."""
    from nats.js.errors import APIError

    transient = transient_errors()
    started = time.monotonic()
    deadline = started + deadline_s
    attempt = 0
    while True:
        try:
            return await op()
        except (*transient, APIError) as exc:
            if not unavailable(exc):
                raise
            if log is not None and log.denied is not None and log.denied_at >= started:
                raise JournalUnreachable(f"NATS does not permit this user the {what}: {log.denied} (see the "
                                         "permissions a journal's user needs in the README)") from None
            attempt += 1
            if time.monotonic() > deadline:
                raise JournalFailed(f"JetStream did not answer {what} for {deadline_s:.0f} s: {exc!r}") from exc
            if attempt == 1 or attempt % 20 == 0:
                logger.warning("jetstream unavailable, retrying op=%s attempt=%d error=%r", what, attempt, exc)
            await asyncio.sleep(min(0.05 * attempt, 1.0))


async def list_streams(js, deadline_s: float = 15.0, wanted=None) -> list:
    """Every stream of the account, with its config and state. JetStream's list leaves out a
    stream whose leader did not give its state in time — one electing a leader, after a server
    restarted or a leadership moved — and names it under "missing" (nats-py's ``streams_info``
    drops that, and reads only the first page of 256), so a check over the list would pass over
    that stream in silence. Every page is read, and the whole list asked again while a stream
    ``wanted`` (a test of its name; None: any) is missing or JetStream is ``unavailable``, for up
    to ``deadline_s``; then StreamsWithoutLeader (those still missing), or JournalFailed (JetStream
    unavailable). A missing stream not wanted (another deployment's, or one whose only servers are
    lost) is not waited for."""
    from nats.js import api

    started = time.monotonic()
    while True:
        listed, missing, offset = {}, set(), 0
        while True:  # pages; the total counts the missing, so a page after one missing some repeats others
            page = await retrying("list streams", lambda: js._api_request(  # noqa: SLF001 - its prefix and errors
                f"{js._prefix}.STREAM.LIST", json.dumps({"offset": offset}).encode(), timeout=js._timeout),
                deadline_s=max(1.0, deadline_s - (time.monotonic() - started)))
            missing |= {name for name in page.get("missing") or [] if wanted is None or wanted(name)}
            for info in map(api.StreamInfo.from_response, page.get("streams") or []):
                listed[info.config.name] = info
            offset += len(page.get("streams") or [])
            if not page.get("streams") or offset >= (page.get("total") or 0):
                break
        streams = list(listed.values())
        missing -= listed.keys()  # (missing from one page, listed by a later one)
        if not missing:
            return streams
        if time.monotonic() - started > deadline_s:
            raise StreamsWithoutLeader(
                f"JetStream did not list streams {sorted(missing)} for {deadline_s:.0f} s: no leader answered "
                "for them (the NATS servers that hold them are down, or cannot elect one)", streams, missing)
        await asyncio.sleep(0.1)


class StreamsWithoutLeader(JournalFailed):
    """``list_streams`` gave up on the streams it names: JetStream kept listing them as missing (no
    leader answered for them). ``streams``: the others, as listed; ``missing``: their names."""

    def __init__(self, message: str, streams: list, missing: set[str]) -> None:
        super().__init__(message)
        self.streams, self.missing = streams, sorted(missing)


def of_prefix(prefix: str):
    """A test of a stream's name: one that shardetcd keeps under ``prefix`` (its journals, their
    checkpoint buckets, its meta, writer lease and members buckets)."""
    from nats.js.object_store import OBJ_STREAM_TEMPLATE

    starts = (f"{prefix}_", OBJ_STREAM_TEMPLATE.format(bucket=f"{prefix}_"), kv_stream(f"{prefix}-"))
    return lambda name: name.startswith(starts)


REPLICAS_NEED_A_CLUSTER = 10074  # JetStream's "replicas > 1 not supported in non-clustered mode"


def drops_messages(config, journal: bool = True) -> list[str]:
    """What in a stream's configuration would remove messages before the writer releases them:
    a journal (``journal``) or a checkpoint bucket made by someone else, or edited since (``nats
    stream edit``). Such a stream loses acknowledged writes in silence, on a NATS restart or as
    time or size limits bite."""
    from nats.js.api import RetentionPolicy, StorageType

    found = []
    if config.storage == StorageType.MEMORY:
        found.append("memory storage (a NATS restart empties it)")
    if config.retention not in (None, RetentionPolicy.LIMITS):
        found.append(f"retention {config.retention.value} (messages removed once consumed or without interest)")
    limits = [("max_age", " s", config.max_age), ("max_msgs", "", config.max_msgs), ("max_bytes", "", config.max_bytes)]
    if journal:  # (an object store keeps one message per subject for each object's metadata by design)
        limits.append(("max_msgs_per_subject", "", config.max_msgs_per_subject))
    found += [f"{name} {value:g}{unit}" for name, unit, value in limits if value is not None and value > 0]
    return found


def check_keeps_messages(info, journal: bool = True) -> None:
    """JournalUnreachable, one line, if the stream of ``info`` would drop messages a journal needs."""
    if dropped := drops_messages(info.config, journal):
        name = info.config.name
        raise JournalUnreachable(f"JetStream stream {name} would drop acknowledged records: {'; '.join(dropped)}. A "
                                 "journal keeps every message until its writer releases it after a checkpoint: remove "
                                 f"the limits (`nats stream edit {name}`), or, for memory storage or another "
                                 "retention, restore a snapshot under a new --journal-prefix")


def meta_bucket(prefix: str) -> str:
    """The key-value bucket of a prefix's writers' word: acknowledged revisions, restores."""
    return f"{prefix}-meta"


def members_bucket(prefix: str) -> str:
    """The key-value bucket where each process serving a prefix's journals announces itself."""
    return f"{prefix}-members"


def writer_bucket_streams(prefix: str) -> tuple[str, ...]:
    """The streams of the buckets a prefix's writer keeps besides its journals and their checkpoint
    buckets: meta (acknowledged revision, restores), the writer lease, and the members (each serving
    process announces itself there, and a process does not start while it cannot)."""
    from journal.leadership import bucket_name as lease_bucket

    return tuple(kv_stream(bucket(prefix)) for bucket in (meta_bucket, lease_bucket, members_bucket))


def released_key(stream: str) -> str:
    """The meta bucket's key for the first message a stream's writer kept at its last release."""
    return f"released.{stream}"


def _as_number(value: bytes | str | None) -> int | None:
    """A meta key's value as the number it holds; None for anything else."""
    try:
        return int(value or b"")
    except ValueError:
        return None


def stream_head_lost(stream: str, first_seq: int, released: str | None) -> str | None:
    """Why ``stream``, whose first message is ``first_seq`` (read before ``released``, the value of
    its ``released_key``), starts past the first message its writer kept at its last release; None
    when it does not, or no release was recorded (a stream never released, or before the key)."""
    kept = _as_number(released)
    if kept is None or first_seq <= kept:
        return None
    return (f"stream {stream} starts at message {first_seq}, but its writer released only the messages before "
            f"{kept} (key {released_key(stream)}): messages {kept}..{first_seq - 1} were removed by something else "
            "(purged by hand?), and their records with them")


def checkpoint_files(objects, deleted: bool = False) -> list[tuple[object, int]]:
    """(object info, revision named) of the checkpoint files among a bucket's ``objects``; with
    ``deleted``, those marked deleted too."""
    found = []
    for info in objects:
        m = _CKPT_NAME.match(info.name or "")
        if m and (deleted or not info.deleted):
            found.append((info, int(m.group(1), 16)))
    return found


def checkpoint_bucket(stream: str) -> str:
    """The object store bucket of a journal stream's checkpoints."""
    return f"{stream}-checkpoints"


def checkpoint_stream(stream: str) -> str:
    """The stream that holds ``checkpoint_bucket(stream)`` (nats-py's naming)."""
    from nats.js.object_store import OBJ_STREAM_TEMPLATE

    return OBJ_STREAM_TEMPLATE.format(bucket=checkpoint_bucket(stream))


def kv_stream(bucket: str) -> str:
    """The stream that holds the KV bucket ``bucket`` (nats-py's naming)."""
    return f"KV_{bucket}"


async def kv_keys(js, bucket: str) -> list[str]:
    """The keys the KV bucket ``bucket`` holds a message for, sorted: the subjects of its stream, as
    the stream's leader answers in one request (a key deleted or purged keeps a marker message
    until it lapses: ``kv.get`` tells). nats-py's ``kv.keys()`` reads them through an ordered
    consumer, which on a NATS cluster has answered "no keys" for a bucket that held them, and
    waits without a bound for messages that do not come (as ``ObjectStore.list``: list_objects).
    NotFoundError when the bucket is gone."""
    held = (await js.stream_info(kv_stream(bucket), subjects_filter=f"$KV.{bucket}.>")).state.subjects or {}
    return sorted(subject.removeprefix(f"$KV.{bucket}.") for subject in held)


KNOWN_WITHIN_S = 5.0  # how long something just made may be unknown to the NATS server this process talks to


async def open_or_create(what: str, get, create, missing: type[Exception], log: JetStreamLog | None = None):
    """``get()``, or ``create()`` when it raises ``missing``; both retried while JetStream is unavailable.
    A create JetStream refuses, or never answers, is JournalUnreachable: one line, nothing to retry.

    What was created is then got: on a NATS cluster, the server this process talks to can answer
    "stream not found" for a moment after the creation was acknowledged (the stream reaches each
    server a little later; seen once as a cluster's partition failing at start). Asked again for up
    to ``KNOWN_WITHIN_S``, so that whatever the caller does next with it is not refused."""
    from nats.js.errors import APIError

    try:
        return await retrying(what, get, log=log)
    except missing:
        pass
    try:
        await retrying(f"create {what}", create, log=log)
    except APIError as exc:
        hint = ""
        if getattr(exc, "err_code", None) == REPLICAS_NEED_A_CLUSTER:
            hint = (": --journal-replicas (default 3) needs a NATS cluster of that many JetStream servers; "
                    "with a single NATS server give --journal-replicas 1")
        raise JournalUnreachable(f"JetStream refused to create the {what} ({exc.description}){hint}") from None
    except JournalFailed as exc:  # never answered: e.g. fewer JetStream servers than the replicas asked
        raise JournalUnreachable(f"JetStream did not create the {what}: {exc} (fewer JetStream servers than "
                                 "--journal-replicas?)") from None
    logger.info("jetstream %s created", what)
    deadline = time.monotonic() + KNOWN_WITHIN_S
    while True:
        try:
            return await retrying(what, get, log=log)
        except missing:
            if time.monotonic() > deadline:
                raise JournalUnreachable(f"JetStream created the {what} but did not find it {KNOWN_WITHIN_S:g} s "
                                         "later") from None
            await asyncio.sleep(0.1)


class PublishRetries:
    """The retries of one publish: how long to wait before the next one, and what to log.

    A publish JetStream cannot answer (a reconnect, a timeout, no stream leader) is logged at its first
    retry and every ``LOG_EVERY``th, with its cause; one refused for lack of room is logged as
    ``journal publish refused: JetStream storage is full`` when first seen and every ``LOG_EVERY``th
    attempt after that (later answers are often just "no responders": the stream's leader steps down
    while its store is full), and retried with a back-off of up to ``STORAGE_BACKOFF_MAX_S``."""

    LOG_EVERY = 10
    STORAGE_BACKOFF_MAX_S = 2.0

    def __init__(self, stream: str, msg_id: str) -> None:
        self.stream = stream
        self.msg_id = msg_id
        self.attempt = 0
        self.started = time.monotonic()
        self.storage: BaseException | None = None  # the "no room" answer, once seen: the cause until it lands
        self.storage_attempts = 0
        self.causes: list[str] = []  # every cause seen, in order

    def _saw(self, cause: str) -> str:
        if cause not in self.causes:
            self.causes.append(cause)
        return cause

    def failed(self, kind: str, exc: BaseException) -> float:
        """Count one failed attempt (kind from publish_error_kind); seconds to wait before the next."""
        self.attempt += 1
        if kind == "storage":
            self.storage = exc
        if self.storage is not None:
            self._saw("storage-full")
            self.storage_attempts += 1
            if self.storage_attempts == 1 or self.storage_attempts % self.LOG_EVERY == 0:
                last = "" if exc is self.storage else f" last_error={exc!r}"
                logger.error("journal publish refused: JetStream storage is full stream=%s msg_id=%s attempt=%d "
                             "error=%s%s; retrying under the same message id, writes wait (and time out)",
                             self.stream, self.msg_id, self.attempt, describe_api_error(self.storage), last)
            return min(0.1 * 2 ** min(self.storage_attempts, 5), self.STORAGE_BACKOFF_MAX_S)
        cause = self._saw(transient_cause(exc))
        if self.attempt == 1 or self.attempt % self.LOG_EVERY == 0:
            logger.warning("journal publish not acknowledged, retrying stream=%s msg_id=%s attempt=%d cause=%s error=%r",
                           self.stream, self.msg_id, self.attempt, cause, exc)
        return min(0.05 * self.attempt, 1.0)

    def refused_for_good(self, exc: BaseException) -> None:
        logger.error("journal publish refused by JetStream, failing stream=%s msg_id=%s attempt=%d error=%s",
                     self.stream, self.msg_id, self.attempt + 1, describe_api_error(exc))

    def landed(self, seq: int) -> None:
        if self.attempt:
            logger.warning("journal publish acknowledged after retrying stream=%s msg_id=%s seq=%d attempts=%d "
                           "seconds=%.1f causes=%s", self.stream, self.msg_id, seq, self.attempt + 1,
                           time.monotonic() - self.started, ",".join(self.causes))


class JetStreamJournal(Appender):
    """The contract of journal.Journal on one JetStream stream."""

    def __init__(self, log: JetStreamLog, stream: str, scratch: Path, config: JournalConfig) -> None:
        super().__init__(f"nats:{stream}", 0)
        self.log = log
        self.stream = stream
        self.subject = f"journal.{stream}"
        self.directory = Path(f"nats:{stream}")
        self.scratch = scratch  # local dir for checkpoint files on their way to and from the bucket
        self.config = config
        self._found: list[Record] = []
        self._msgs: deque[tuple[int, int]] = deque()  # (stream seq, highest tag) of messages still in the stream
        self._stored_bytes = 0
        self._tail = 0  # the stream's last sequence, as this writer knows it
        self._batches = 0
        self._cut: int | None = None
        self._queue: deque[tuple[int, bytes, int]] = deque()  # (seq, frame bytes, tag)
        self._fences: list[asyncio.Future] = []  # fence_again() callers, served by the writer task in turn
        self._wakeup = asyncio.Event()
        self._bucket = None
        self._watch: asyncio.Task | None = None  # _watch_streams, while this process writes
        self._instance = secrets.token_hex(8)  # message ids are unique to this open journal
        self.released_before = False
        self._took_over = False  # written by this process since a takeover (not since its open)
        self.following = False  # opened to follow another writer: not fenced, not writable
        self.cuts_seen: list[tuple[int, int]] = []  # (epoch, revision) of the cut markers read
        self.first_top = 0  # the highest tag in the first message with records that was read (after a purge met)
        # following: what the writer had acknowledged, and the last message read if it is not known to be (below)
        self.hold_unacknowledged = True  # False: hand on whatever is stored (a reader of a journal no one writes)
        self._acked = 0  # the highest sequence a writer of the stream told it had JetStream's acknowledgement of
        self._held: Message | None = None  # the last message read: records not known to be acknowledged yet
        self._held_since = 0.0
        self._hand: Callable[[Message], None] | None = None  # follow()'s on_message, while it runs
        self._last_read: Message | None = None  # the last message _take decoded
        self._told: asyncio.Event | None = None  # set when a writer tells, while catch_up waits for its word

    # -- open / replay ----------------------------------------------------

    async def _open(self, follow: bool = False) -> None:
        from nats.js.api import StorageType, StreamConfig
        from nats.js.errors import NotFoundError

        js = self.log.js
        info = await self.log.open_or_create(
            f"stream {self.stream}", lambda: js.stream_info(self.stream),
            lambda: js.add_stream(StreamConfig(
                name=self.stream, subjects=[self.subject], num_replicas=self.log.config.replicas,
                storage=StorageType.FILE, duplicate_window=120.0, allow_direct=True)),
            NotFoundError)
        check_keeps_messages(info)
        await self._check_bucket_keeps_messages()
        await self._bucket_store()  # made now, while the other journals of the process make theirs
        await self._check_head(info.state.first_seq, writer=not follow)
        self.released_before = info.state.first_seq > 1  # purged up to a checkpoint
        if follow:
            self.following = True
            return
        await self.log.keep_replicas(*self._written_streams())  # before this process writes them
        for attempt in range(20):
            self._tail = info.state.last_seq
            await self.log.retrying("read stream", lambda: self._read(info.state.first_seq, info.state.last_seq))
            try:  # from here on, an older writer's appends are refused
                await self._fence()
                return
            except JournalFenced:
                logger.warning("journal changed while being fenced, reading it again stream=%s", self.stream)
                info = await self._info()
        raise JournalUnreachable(f"journal {self.stream} keeps changing: another writer is active on it")

    async def _check_head(self, first_seq: int, writer: bool = False) -> None:
        """JournalHeadLost if the stream, whose first message was ``first_seq`` when its info was read
        (before this), starts past the first message its writer's last release kept. A ``writer``
        opening a stream never released records it as kept from message 1 (only if no key is there:
        a fenced-out writer's first release may be putting one), so a hand purge is refused before
        its first release too."""
        released = await self.log.get_meta(released_key(self.stream))
        if released is None and writer and first_seq <= 1:
            released = await self.log.agree(released_key(self.stream), "1")
        if (why := stream_head_lost(self.stream, first_seq, released)) is not None:
            raise JournalHeadLost(
                f"journal {why}. Refusing to open it, and nothing was cut. Put the messages back; or, to serve without "
                f"them, delete that key (`nats kv del {self.log.meta_bucket} {released_key(self.stream)}`) and start "
                "again (the start then refuses acknowledged revisions it can tell are gone)")

    async def _fence(self) -> None:
        await self._publish(b"", {FENCE_HEADER: self._instance}, 0)

    async def _read(self, first: int, last: int) -> None:
        """Every record in the stream, cuts applied (the stream is bounded by checkpoints)."""
        self._found, self._msgs, self._stored_bytes, self._last_rev = [], deque(), 0, 0  # a retry starts over
        self.cuts_seen, self.first_top = [], 0
        self._held = self._last_read = None
        started = time.monotonic()
        count = await self._read_range(first, last, self._take, self._purged_while_read)
        logger.info("journal stream read stream=%s messages=%d records=%d seconds=%.3f",
                    self.stream, count, len(self._found), time.monotonic() - started)

    async def _read_range(self, first: int, last: int, take: Callable[[int, bytes, dict], None],
                          purged: Callable[[int, int], None]) -> int:
        """Give messages ``first``..``last`` to ``take(seq, data, headers)``; how many there were.
        Messages purged meanwhile are passed over (``purged(expected, got)`` is told: the first
        passed over, the next one read); any lost on the way raise
        DeliveryLost, which ``retrying`` answers by reading again, as it does a read that stalls for
        READ_STALL_S.

        An ordered push consumer (JetStream sends, flow-controlled, without a request per batch;
        nats-py replaces the consumer when its own sequence shows a message missing) reads about
        twice as fast as pull fetches, whose every message costs nats-py a task and a wait_for:
        this read is what a starting standby or a writer recovering after the loss of its machine
        waits for (see bench/README.md, "Reading a journal back")."""
        if last == 0 or first > last:
            return 0
        from nats.errors import TimeoutError as NatsTimeout
        from nats.js.api import ConsumerConfig, DeliverPolicy

        done = asyncio.get_running_loop().create_future()
        count, expected = 0, first

        async def on_message(msg) -> None:
            nonlocal count, expected
            if done.done():
                return
            try:
                seq = msg.metadata.sequence.stream
                if seq > expected:
                    await self._raise_if_lost(expected, seq)
                    purged(expected, seq)
                expected = seq + 1
                if seq <= last:
                    take(seq, msg.data, msg.headers or {})
                    count += 1
                if seq >= last and not done.done():
                    done.set_result(None)
            except Exception as exc:  # noqa: BLE001 - handed to the reader below, not to nats-py's error callback
                if not done.done():
                    done.set_exception(exc)

        sub = await self.log.js.subscribe(
            self.subject, stream=self.stream, ordered_consumer=True, cb=on_message,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=first))
        try:
            while not done.done():
                before = expected  # every message moves it on
                await asyncio.wait({done}, timeout=READ_STALL_S)
                if not done.done() and expected == before:
                    raise NatsTimeout  # nothing came: transient for ``retrying``, which reads again
            done.result()
        finally:
            done.cancel()  # a stalled read: what a callback still running finds makes no difference
            await sub.unsubscribe()
        return count

    def _purged_while_read(self, expected: int, got: int) -> None:
        """Messages purged while this read went on: the writer released its journal up to a newer
        checkpoint, and what was read before them does not join what comes after. The read counts
        as one that began after them (released before; its first record, the next one read, or
        none: past any revision), so a starting follower whose checkpoint they were above fetches
        the newer one and reads again (``shards.recovery._overtaken``). Taken as whole, the
        revisions they held were in nothing it read nor under its checkpoint, and it refused to
        start, sure acknowledged records were lost (a standby under load in CI)."""
        self.released_before = True
        self.first_top = NO_RECORD_AFTER_PURGE  # until a record after them is read

    def _decode(self, seq: int, data: bytes, headers: dict, stored: float = 0.0) -> Message:
        epoch = int(headers.get(EPOCH_HEADER, 0))
        cut = headers.get(CUT_HEADER)
        if cut is not None:
            return Message(seq, epoch, cut=int(cut))
        records, top, pos = [], 0, 0
        while pos < len(data):
            try:
                frame = decode_frame(data, pos, self.config.record_bytes_max)
            except FrameError as exc:
                raise JournalCorrupt(self.directory, seq, f"message {seq}: {exc.reason}") from None
            records.append(Record(frame.rtype, frame.rev, bytes(frame.payload), self.directory, seq, epoch))
            top = max(top, frame.rev)
            pos = frame.end
        return Message(seq, epoch, tuple(records), top=top, stored=stored)

    def _take(self, seq: int, data: bytes, headers: dict) -> None:
        msg = self._last_read = self._decode(seq, data, headers)
        self._msgs.append((seq, msg.top))
        self._tail = max(self._tail, seq)
        if msg.cut is not None:
            self.cuts_seen.append((msg.epoch, msg.cut))
            if self._last_rev > msg.cut:
                self._found = [r for r in self._found if r.rev <= msg.cut]
                self._last_rev = msg.cut
            return
        if msg.records and self.first_top in (0, NO_RECORD_AFTER_PURGE):
            self.first_top = msg.top
        self._found.extend(msg.records)
        self._stored_bytes += len(data)
        self._last_rev = max(self._last_rev, msg.top)

    # -- following (a standby or follower reads what another process writes) --

    async def catch_up(self) -> None:
        """A journal opened to follow: read everything stored so far (``records``,
        ``cuts_seen``), without fencing."""
        if not self.following:
            return
        if self.hold_unacknowledged:
            await self.log.hear_acked(self)  # before the read: an acknowledgement told during it is heard
        info = await self._info()
        await self._check_head(info.state.first_seq)  # (a follower's rebuild reads the stream again here)
        self.released_before = info.state.first_seq > 1
        if info.state.last_seq - info.state.first_seq >= 8:  # (not a journal of markers alone)
            await failpoints.pause("recovery.follow_journal_listed")
        await self.log.retrying("read stream", lambda: self._read(info.state.first_seq, info.state.last_seq))
        self._tail = max(self._tail, info.state.last_seq)
        self._msgs = deque()  # purges after a takeover go by the messages this process sees from then on
        last = self._last_read
        if last is None or not last.records or last.seq != self._tail or not self._unacknowledged(last):
            return
        await self._ask_for(last.seq)
        if self._unacknowledged(last):
            del self._found[len(self._found) - len(last.records):]  # the last message's: handed on by follow()
            self._hold(last)

    async def _ask_for(self, seq: int) -> None:
        """Ask the writer what it had acknowledged, and wait up to ASK_WAIT_S (a repeat's time) for
        its word on message ``seq``: none comes with no writer, or a lapse of NATS's."""
        told = self._told = asyncio.Event()
        await self.log.ask_acked()
        try:
            async with asyncio.timeout(ASK_WAIT_S):
                while self._acked < seq:
                    told.clear()
                    await told.wait()
        except TimeoutError:
            pass
        finally:
            self._told = None

    # -- what a follower hands on: acknowledged messages only --

    def held_records(self) -> tuple[Record, ...]:
        """The records read (stored) that follow() hands on once their writer tells it had them acknowledged."""
        return () if self._held is None else self._held.records

    def acknowledged_if(self, known: Callable[[tuple[Record, ...]], bool]) -> None:
        """Between catch_up() and records(): the message held is acknowledged after all if ``known``
        says so of its records (a write at or below a revision the writer had committed: a
        checkpoint's, say); its records then come from records() with the others."""
        if self._held is not None and known(self._held.records):
            msg, self._held = self._held, None
            self._found.extend(msg.records)

    def _unacknowledged(self, msg: Message) -> bool:
        return self.hold_unacknowledged and msg.seq > self._acked

    def _hold(self, msg: Message) -> None:
        self._held, self._held_since = msg, time.monotonic()

    def acknowledged(self, seq: int) -> None:
        """A writer of the stream told it had JetStream's acknowledgement of messages up to ``seq``."""
        if seq > self._acked:
            self._acked = seq
            if self._told is not None:
                self._told.set()
            if self._held is not None and self._held.seq <= seq and self._hand is not None:
                self._hand_held(self._hand)

    def _hand_held(self, on_message: Callable[[Message], None]) -> None:
        msg, self._held = self._held, None
        on_message(msg)

    def _arrived(self, msg: Message, on_message: Callable[[Message], None]) -> None:
        """A message read by follow(): the one held before it is acknowledged now (its writer
        publishes one at a time, and a next writer fences only after reading it); this one is
        handed on, or held if it has records not known to be acknowledged."""
        if self._held is not None:
            self._hand_held(on_message)
        if msg.records and self._unacknowledged(msg):
            self._hold(msg)
        else:
            on_message(msg)

    def _held_too_long(self) -> None:
        if self._held is not None and time.monotonic() - self._held_since >= HELD_WARN_S:
            self._held_since = float("inf")  # once per message
            logger.warning("journal follower holds a message its writer has not told acknowledged stream=%s seq=%d "
                           "last_told=%d subject=%s (a writer gone without a successor, or this user may not "
                           "subscribe to the subject)", self.stream, self._held.seq, self._acked,
                           self.log.acked_subject)

    async def follow(self, on_message: Callable[[Message], None],
                     on_gap: Callable[[int, int], Awaitable[bool]]) -> None:
        """Give every message stored after those read so far to ``on_message``, as
        they are stored, until cancelled.  When messages were purged before they
        could be read, ``on_gap(expected, got)`` says whether to go on (the
        checkpoint already loaded covers them) or raise JournalGap.  Messages sent
        but lost on the way (see FOLLOW_FETCH_S) are read again, never skipped. A message
        whose records its writer has not told acknowledged is held until it does (or a later
        message is read): see the module's docstring."""
        self._found = []  # what catch_up read has been handed over by now
        self._hand = on_message
        try:
            if self._held is not None and not self._unacknowledged(self._held):
                self._hand_held(on_message)
            await self._follow(on_message, on_gap)
        finally:
            self._hand = None

    async def _follow(self, on_message: Callable[[Message], None],
                      on_gap: Callable[[int, int], Awaitable[bool]]) -> None:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
        from nats.js.errors import NotFoundError
        from nats.errors import TimeoutError as NatsTimeout

        attempt = 0
        while True:
            sub = None
            try:
                sub = await PullReader.open(
                    self.log.js, self.log.nc, self.subject, self.stream,
                    ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self._tail + 1,
                                   ack_policy=AckPolicy.NONE, inactive_threshold=60.0))
                while True:
                    try:
                        msgs = await sub.fetch(batch=256, timeout=FOLLOW_FETCH_S)
                    except (NatsTimeout, asyncio.TimeoutError):
                        if await self.stored_tail() > self._tail:  # stored, yet not delivered: the last were lost
                            raise DeliveryLost(f"nothing delivered after {self._tail} while the stream holds more")
                        self._held_too_long()
                        continue
                    attempt = 0
                    for m in msgs:
                        seq = m.metadata.sequence.stream
                        if seq <= self._tail:
                            continue
                        if seq > self._tail + 1:
                            await self._raise_if_lost(self._tail + 1, seq)
                            if not await on_gap(self._tail + 1, seq):
                                raise JournalGap(self.stream, self._tail + 1, seq)
                        self._tail = seq
                        self._stored_bytes += len(m.data)
                        self._arrived(self._decode(seq, m.data, m.headers or {}, m.metadata.timestamp.timestamp()),
                                      on_message)
            except (asyncio.CancelledError, JournalGap, JournalCorrupt):
                raise
            except Exception as exc:  # noqa: BLE001 - a lost connection or consumer: make a new one
                if isinstance(exc, (JournalGone, NotFoundError)) and await self._gone_for_good():
                    raise self._gone() from None
                attempt += 1
                if attempt == 1 or attempt % 20 == 0:
                    logger.warning("journal follow interrupted, resubscribing stream=%s next=%d attempt=%d error=%r",
                                   self.stream, self._tail + 1, attempt, exc)
                await asyncio.sleep(min(0.05 * attempt, 1.0))
            finally:
                if sub is not None:
                    try:
                        await sub.close()
                    except Exception:  # noqa: BLE001 - the consumer goes away by itself when inactive
                        pass

    @property
    def read_tail(self) -> int:
        """The stream sequence of the last message read and handed on so far (one held is the last read)."""
        return self._tail if self._held is None else self._held.seq - 1

    async def stored_tail(self) -> int:
        """The stream's last sequence now: what a reader must reach to have read
        everything stored before this call."""
        return (await self._stored()).last_seq

    async def _raise_if_lost(self, expected: int, got: int) -> None:
        """Messages ``expected``..``got - 1`` did not come: DeliveryLost unless they were purged."""
        if (await self._stored()).first_seq <= expected:
            raise DeliveryLost(f"messages {expected}..{got - 1} were not delivered")

    async def _stored(self):
        """The stream's state now: its first and last sequence."""
        info = await self._info(deadline_s=5.0)
        return info.state

    async def _info(self, **retry):
        """The stream's info; a stream found at open and gone since (deleted by hand, or lost by NATS)
        is JournalGone: what it held is not for a writer or follower to guess."""
        from nats.js.errors import NotFoundError

        try:
            return await self.log.retrying("stream info", lambda: self.log.js.stream_info(self.stream), **retry)
        except NotFoundError:
            raise self._gone() from None

    def _gone(self) -> JournalGone:
        return JournalGone(f"journal stream {self.stream} is gone (deleted, or lost by NATS) since it was opened, "
                           "with every record it held")

    async def _gone_for_good(self) -> bool:
        """Whether JetStream does not know the stream, asked now and again ``GONE_CONFIRM_S`` later (a
        writer or follower then stops). A "not found" about something else (a follower's consumer) is
        answered at once."""
        if not await self._unknown(self.stream):
            return False
        await asyncio.sleep(GONE_CONFIRM_S)
        return await self._unknown(self.stream)

    async def _unknown(self, stream: str) -> bool:
        """Whether JetStream says it does not know ``stream`` now; NATS not answering is not an answer."""
        from nats.js.errors import NotFoundError

        try:
            await self.log.js.stream_info(stream)
        except NotFoundError:
            return True
        except Exception:  # noqa: BLE001 - unreachable or unavailable now: not known to be gone
            pass
        return False

    async def unread_gap(self) -> tuple[int, int] | None:
        """(the next message to read, the first one stored) when messages after those
        read so far were released before this process read them; None if not."""
        info = await self._info()
        return self._gap(info.state.first_seq, info.state.last_seq)

    def _gap(self, first: int, last: int) -> tuple[int, int] | None:
        return (self._tail + 1, first) if last > self._tail and first > self._tail + 1 else None

    async def take_over(self, on_message: Callable[[Message], None],
                        on_gap: Callable[[int, int], Awaitable[bool]]) -> None:
        """A followed journal becomes this process's: fence it after the last
        message read; messages stored meanwhile go to ``on_message`` first. Messages
        released before they were read (``on_gap(expected, got)`` false: the state
        loaded does not hold them) raise JournalGap before anything is fenced here:
        a takeover from a state with holes would cut acknowledged writes. Released
        before that read or while it goes on alike: the writer being replaced, still
        running, may release its journal up to a checkpoint it just wrote."""
        if self._held is not None:  # read before this process fences: its records are this writer's to keep
            self._hand_held(on_message)
        for _ in range(50):
            try:
                await self._fence()
                self.following = False
                self._took_over = True
                # after it: a takeover is not held up, or stopped, by a setting the last writer had too
                self.log.keep_replicas_soon(*self._written_streams())
                return
            except JournalFenced:
                last = (await self._info()).state.last_seq

                def take(seq: int, data: bytes, headers: dict) -> None:
                    self._tail = seq
                    on_message(self._decode(seq, data, headers))

                purged: list[tuple[int, int]] = []  # (released before the read began: its first message is past them)
                await self.log.retrying("read stream", lambda: self._read_range(
                    self._tail + 1, last, take, lambda expected, got: purged.append((expected, got))))
                for expected, got in purged:
                    if not await on_gap(expected, got):
                        raise JournalGap(self.stream, expected, got)
        raise JournalUnreachable(f"journal {self.stream} keeps changing: another writer is active on it")

    def records(self, after_rev: int = 0) -> Iterator[Record]:
        """Records with tag > after_rev found at open, in append order, cuts applied."""
        return (r for r in self._found if r.rev > after_rev)

    def truncate_after(self, rev: int) -> int:
        """Before start(): cut every record tagged above ``rev`` (made durable by start())."""
        if self._task is not None:
            raise RuntimeError("truncate_after() is only allowed before start()")
        cut = sum(1 for r in self._found if r.rev > rev)
        if cut:
            self._found = [r for r in self._found if r.rev <= rev]
        # also when what is cut was not in _found: a follower hands what it read over (follow())
        self._last_rev = min(self._last_rev, rev)
        self._cut = rev  # published by start() on every stream, cut or not: followers need it
        return cut

    # -- introspection -----------------------------------------------------

    @property
    def bytes_total(self) -> int:
        return self._stored_bytes

    # -- writing ------------------------------------------------------------

    async def start(self) -> None:
        if self._task is not None or self._closing:
            raise RuntimeError("journal already started or closed")
        self._found = []  # replayed by now: records() is for before start()
        if not self._took_over:
            await self._lead_before_serving()
        if self._cut is not None:
            await self._publish(b"", {CUT_HEADER: str(self._cut)}, 0)
            logger.info("journal cut recorded stream=%s above_rev=%d epoch=%d", self.stream, self._cut, self.log.epoch)
            self._cut = None
        self._task = asyncio.create_task(self._run(), name=f"journal-writer:{self.stream}")
        self._watch = asyncio.create_task(self._watch_streams(), name=f"journal-watch:{self.stream}")

    async def _watch_streams(self) -> None:
        """While this process writes the journal: every ``STREAM_CHECK_S``, the stream's and its
        checkpoint bucket's configuration as the open checks it. One edited to drop messages
        (``nats stream edit --max-age``) fails the journal, so no write is acknowledged into a
        stream that would lose it: the writer stops, and the next one refuses to start until the
        edit is undone. A check NATS does not answer is skipped (the publishes wait on it too).

        One edited to fewer replicas than this process's --journal-replicas (``nats stream edit
        --replicas``) is given them back, as the open would (``keep_replicas``), at most every
        ``REPLICAS_AGAIN_S`` while JetStream refuses (a NATS cluster that lost a server for good).

        A stream JetStream no longer knows, asked again and ``GONE_CONFIRM_S`` later (deleted by hand,
        or lost by NATS), fails the journal too: its records are gone, and a publish into it would only
        be retried until each write timed out."""
        from nats.js.errors import NotFoundError

        again_at = 0.0
        while not self._closing and self._failure is None:
            await asyncio.sleep(STREAM_CHECK_S)
            try:
                try:
                    infos = [await self.log.js.stream_info(self.stream)]
                except NotFoundError:
                    if await self._gone_for_good():
                        raise self._gone() from None
                    continue
                check_keeps_messages(infos[0])
                await self.log.lead_here(infos[0])
                infos.append(await self._check_bucket_keeps_messages(retry=False))
                if infos[1] is not None:
                    await self.log.lead_here(infos[1])
                fewer = [i.config.name for i in infos
                         if i is not None and (i.config.num_replicas or 1) < self.log.config.replicas]
                if fewer and time.monotonic() >= again_at:
                    again_at = time.monotonic() + REPLICAS_AGAIN_S
                    logger.warning("journal stream has fewer replicas than --journal-replicas streams=%s",
                                   ",".join(fewer))
                    self.log.keep_replicas_soon(*fewer)
            except (JournalUnreachable, JournalGone) as exc:
                if isinstance(exc, JournalGone):
                    logger.critical("journal stream gone, stopping writes stream=%s error=%s", self.stream, exc)
                else:
                    logger.critical("journal stream edited to drop records, stopping writes stream=%s error=%s",
                                    self.stream, exc)
                self._fail(exc)
                self._wakeup.set()
                return
            except Exception as exc:  # noqa: BLE001 - NATS not answering now: the next round asks again
                logger.debug("journal stream check skipped stream=%s error=%r", self.stream, exc)

    async def _lead_before_serving(self) -> None:
        """At a writer's start, before it serves: the stream's leadership moved here (``JetStreamLog.lead_here``)
        and the new leader waited for, up to ``LEAD_WAIT_S``, so neither the first writes served nor
        the first stream check wait on that election. Not after a takeover (its first
        acknowledgement is not to wait on one: the stream check moves the leader a round later)."""
        from nats.js.errors import NotFoundError

        try:
            if not await self.log.lead_here(await self._info(deadline_s=LEAD_WAIT_S)):
                return
            deadline = time.monotonic() + LEAD_WAIT_S
            while time.monotonic() < deadline:
                await asyncio.sleep(0.02)
                try:  # with no leader the request goes unanswered: asked again soon, not after js's timeout
                    async with asyncio.timeout(0.25):
                        cluster = (await self.log.js.stream_info(self.stream)).cluster
                except NotFoundError:
                    raise
                except Exception:  # noqa: BLE001 - no leader to answer yet
                    continue
                if cluster is not None and cluster.leader == self.log.leading_server:
                    return
            logger.info("journal stream leader not seen here yet, serving stream=%s waited_s=%.1f",
                        self.stream, LEAD_WAIT_S)
        except (JournalGone, NotFoundError):
            raise self._gone() from None
        except Exception as exc:  # noqa: BLE001 - placement is an optimisation; the stream check tries again
            logger.debug("journal stream leader not moved at start stream=%s error=%r", self.stream, exc)

    async def close(self) -> None:
        await cancel_and_wait(self._watch)
        await super().close()

    def append(self, rtype: int, rev: int, payload: bytes) -> int:
        seq = self._next_seq(rtype, rev, len(payload), self.config.record_bytes_max)
        self._queue.append((seq, frame_header(rtype, rev, payload) + payload, rev))
        self._wakeup.set()
        return seq

    async def fence_again(self) -> None:
        """Publish a fence after the last message this writer stored, between two of its
        batches: from then on, appends by any process that opened the journal earlier are
        refused.  JournalFenced (and the journal fails) if anyone else appended since."""
        if self._task is None or self._task.done():
            raise JournalFailed(f"journal {self.stream} is not being written")
        done = asyncio.get_running_loop().create_future()
        self._fences.append(done)
        self._wakeup.set()
        await done

    async def _publish_fences(self) -> None:
        fences, self._fences = self._fences, []
        try:
            await self._fence()
        except BaseException as exc:
            for f in fences:
                f.set_exception(exc)
            raise
        for f in fences:
            f.set_result(None)

    async def _run(self) -> None:
        try:
            while True:
                while not self._queue and not self._fences:
                    if self._closing or self._failure is not None:
                        return
                    self._wakeup.clear()
                    await self._wakeup.wait()
                if self._fences:
                    await self._publish_fences()
                    continue
                seq, body, top = self._take_batch()
                started = time.monotonic()
                await self._publish(body, {}, top)
                await failpoints.pause("jetstream.after_store_before_ack")  # stored: followers hold it
                if self.on_batch is not None:
                    self.on_batch(len(body), time.monotonic() - started)
                self._durable_through(seq)
                await self.log.tell_acked(self.stream, self._tail)
        except asyncio.CancelledError:
            self._fail(JournalFailed("journal writer task cancelled"))
            raise
        except Exception as exc:  # noqa: BLE001 - a refused or failed publish is fatal by design
            self._fail(exc)

    def _take_batch(self) -> tuple[int, bytes, int]:
        seq, frame, top = self._queue.popleft()
        parts, size = [frame], len(frame)
        while self._queue and size + len(self._queue[0][1]) <= self.config.batch_bytes_max:
            seq, frame, top = self._queue.popleft()
            parts.append(frame)
            size += len(frame)
        self._queued_bytes -= size - HEADER_BYTES * len(parts)
        return seq, b"".join(parts), top

    async def _publish(self, body: bytes, headers: dict, top: int) -> None:
        """Store one message after the stream's known tail, retried under the same message id (so it
        is stored once) while JetStream cannot answer or has no room; refused if anyone else wrote
        meanwhile (JournalFenced) or if JetStream refuses it for any other reason (JournalFailed)."""
        self._batches += 1
        msg_id = f"{self._instance}-{self._batches}"
        headers = {**headers, "Nats-Msg-Id": msg_id, "Nats-Expected-Last-Sequence": str(self._tail),
                   EPOCH_HEADER: str(self.log.epoch)}
        retries = PublishRetries(self.stream, msg_id)
        while True:
            try:
                ack = await self.log.js.publish(self.subject, body, stream=self.stream, headers=headers,
                                                timeout=self.log.config.publish_timeout_s)
                seq, duplicate = ack.seq, bool(ack.duplicate)
                break
            except Exception as exc:  # noqa: BLE001 - sorted below; anything that is not NATS's goes on up
                kind = publish_error_kind(exc)
                if kind is None:
                    raise
                if kind == "fenced":
                    seq = await self._stored_by_an_earlier_try(msg_id) if retries.attempt else None
                    if seq is None:
                        raise JournalFenced(f"journal {self.stream}: another writer appended to the stream "
                                            f"(expected last sequence {self._tail}): {exc.description}") from None
                    duplicate = True
                    break
                if kind == "refused":
                    retries.refused_for_good(exc)
                    raise JournalFailed(f"journal {self.stream}: JetStream refused the publish of message "
                                        f"{msg_id}: {describe_api_error(exc)}") from None
                await asyncio.sleep(retries.failed(kind, exc))
                if self._failure is not None:  # meanwhile (its stream found gone): stored or not, never acknowledged
                    raise JournalFailed(f"journal {self.stream}: failed while publishing message {msg_id}: "
                                        f"{self._failure}") from None
        retries.landed(seq)
        if duplicate and not retries.attempt:  # only a retry may find its own message already stored
            raise JournalFailed(f"journal {self.stream}: message id {msg_id} already stored")
        self._tail = seq
        self._msgs.append((seq, top))
        self._stored_bytes += len(body)

    async def _stored_by_an_earlier_try(self, msg_id: str) -> int | None:
        """A retry refused because the tail moved: the sequence of the message right after the known
        tail if it is this very message (an earlier try stored it, its answer was lost, and the retry
        came after JetStream's duplicate window), else None (another writer appended)."""
        from nats.js.errors import NotFoundError

        try:
            msg = await self.log.retrying("read back a retried publish",
                                 lambda: self.log.js.get_msg(self.stream, seq=self._tail + 1))
        except NotFoundError:
            return None
        if (msg.headers or {}).get("Nats-Msg-Id") != msg_id:
            return None
        logger.warning("journal publish found stored by an earlier try stream=%s msg_id=%s seq=%d",
                       self.stream, msg_id, msg.seq)
        return msg.seq

    def _drop_queue(self) -> int:
        dropped = len(self._queue)
        self._queue.clear()
        fences, self._fences = self._fences, []
        for f in fences:
            if not f.done():
                f.set_exception(self._failed_error())
        return dropped

    # -- release and checkpoints ---------------------------------------------

    async def release(self, rev: int) -> int:
        """Purge the messages whose records all have tags <= rev (never the newest). Nothing once
        this journal failed: fenced, it is another writer's, whose readers (a standby taking over,
        a follower) are not to have messages purged under them by a writer that is stopping."""
        if self.failed:
            return 0
        keep_from = None
        released = 0
        while len(self._msgs) > 1 and self._msgs[0][1] <= rev:
            self._msgs.popleft()
            released += 1
        if not released:
            return 0
        keep_from = self._msgs[0][0]
        await self.log.raise_meta(released_key(self.stream), keep_from)  # before any goes: stream_head_lost
        await self.log.retrying("purge", lambda: self.log.js.purge_stream(self.stream, seq=keep_from))
        logger.info("journal messages purged stream=%s through_rev=%d count=%d", self.stream, rev, released)
        return released

    async def _check_bucket_keeps_messages(self, retry: bool = True):
        """``check_keeps_messages`` for the checkpoint bucket's stream, if it exists (its info, else
        None); asked once (``retry`` false: the writer's periodic check) or while JetStream is
        unavailable."""
        from nats.js.errors import NotFoundError

        bucket = checkpoint_stream(self.stream)
        ask = lambda: self.log.js.stream_info(bucket)  # noqa: E731
        try:
            info = await (self.log.retrying(f"stream {bucket}", ask) if retry else ask())
        except NotFoundError:
            return None  # made by this code: by the open, next; if deleted later, by the next checkpoint
        check_keeps_messages(info, journal=False)
        return info

    def _written_streams(self) -> tuple[str, str]:
        """What this process writes for the journal: its stream and its checkpoints' bucket."""
        return self.stream, checkpoint_stream(self.stream)

    @property
    def checkpoint_bucket(self) -> str:
        return checkpoint_bucket(self.stream)

    async def _bucket_store(self):
        if self._bucket is None:
            from nats.js.api import ObjectStoreConfig
            from nats.js.errors import BucketNotFoundError

            name = self.checkpoint_bucket
            self._bucket = await self.log.open_or_create(
                f"checkpoint bucket {name}", lambda: self.log.js.object_store(name),
                lambda: self.log.js.create_object_store(name, config=ObjectStoreConfig(
                    bucket=name, replicas=self.log.config.replicas)),
                BucketNotFoundError)
        return self._bucket

    async def save_checkpoint(self, rev: int, meta: bytes, rows: Iterable[bytes]) -> str:
        """Write the checkpoint file locally (in a thread), then store it in the bucket; older ones go."""
        with tempfile.TemporaryDirectory(dir=self._scratch_dir()) as tmp:
            path = await asyncio.to_thread(write_checkpoint, Path(tmp), rev, meta, rows)
            return await self.store_checkpoint(path, rev)

    async def store_checkpoint(self, path: Path, rev: int, only: bool = False,
                               sent: Callable[[int], None] | None = None) -> str:
        """Store the checkpoint file ``path`` (of revision ``rev``) in the bucket; older ones go, and
        with ``only`` every other one (a restore's: newer ones left by a restore cut short too, and
        stored with STORE_CHUNKS chunks in flight: nothing is served meanwhile). ``sent``: see
        store_object."""
        from nats.js.errors import NotFoundError

        bucket = await self._bucket_store()

        async def store():
            with open(path, "rb") as f:
                await store_object(self.log.nc, self.log.js, bucket, self.checkpoint_bucket, path.name, f,
                                   self.log.config.publish_timeout_s, in_flight=STORE_CHUNKS if only else 1,
                                   sent=sent)

        try:
            await self.log.retrying("store checkpoint", store)
        except NotFoundError:
            if not await self._unknown(checkpoint_stream(self.stream)):
                raise
            # deleted since this process opened it (by hand, or lost by NATS), and with it what the
            # journal released up to its checkpoints: a checkpoint holds the whole state, so made again
            # with this one in it, those acknowledged records are stored again
            logger.warning("checkpoint bucket gone, making it again bucket=%s rev=%d", self.checkpoint_bucket, rev)
            self._bucket = None
            bucket = await self._bucket_store()
            await self.log.retrying("store checkpoint", store)
        for name, other in await self._checkpoint_objects(deleted=True):  # (the markers nats-py's delete left)
            if other < rev or (only and name != path.name):
                # again while NATS does not answer (a server lost): else the checkpoint, stored, would count as failed
                await self.log.retrying(f"delete checkpoint {name}",
                                        lambda name=name: delete_object(self.log.js, self.checkpoint_bucket, name))
        return f"nats:{self.checkpoint_bucket}/{path.name}"

    async def load_checkpoint(self) -> Checkpoint | None:
        """The newest checkpoint in the bucket, fetched into the scratch dir. One that is gone by the
        time it is fetched was replaced by a newer one (the writer deletes the older ones once a
        checkpoint is stored): the bucket is listed again."""
        from nats.js.errors import ObjectNotFoundError

        bucket = await self._bucket_store()
        for _ in range(CHECKPOINT_TRIES):
            found = await self._checkpoint_objects()
            if not found:
                return None
            name, rev = max(found, key=lambda t: t[1])
            into = self._scratch_dir() / "loaded"
            shutil.rmtree(into, ignore_errors=True)
            into.mkdir(parents=True)

            async def fetch():
                with os.fdopen(open_private(into / name), "wb") as f:  # the keyspace: this user's alone
                    await fetch_object(self.log.js, bucket, self.checkpoint_bucket, name, f)

            try:
                await self.log.retrying("fetch checkpoint", fetch)
            except ObjectNotFoundError:
                logger.info("checkpoint replaced while being fetched, listing again bucket=%s rev=%d",
                            self.checkpoint_bucket, rev)
                continue
            return load_latest_checkpoint(into)
        raise JournalUnreachable(f"checkpoint bucket {self.checkpoint_bucket}: its newest checkpoint was gone "
                                 f"each of {CHECKPOINT_TRIES} times it was fetched")

    async def newest_checkpoint_rev(self) -> int:
        """The revision of the newest checkpoint in the bucket (0: none)."""
        await self._bucket_store()
        found = await self._checkpoint_objects()
        return max((rev for _, rev in found), default=0)

    async def _checkpoint_objects(self, deleted: bool = False) -> list[tuple[str, int]]:
        """(name, revision) of the checkpoints in the bucket; with ``deleted``, those marked deleted too
        (by nats-py's delete, which earlier versions used), as revision 0."""
        from nats.js.errors import NotFoundError

        try:
            infos = await self.log.retrying("list checkpoints", lambda: list_objects(self.log.js, self.checkpoint_bucket))
        except NotFoundError:  # the bucket gone
            return []
        return [(info.name, 0 if info.deleted else rev) for info, rev in checkpoint_files(infos, deleted)]

    def _scratch_dir(self) -> Path:
        self.scratch.mkdir(parents=True, exist_ok=True)
        return self.scratch
