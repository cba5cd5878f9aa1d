"""``shardetcd journal verify`` on a JetStream journal: what every stream of a prefix holds.

For each journal stream (``<prefix>_<shard>``, subject ``journal.<stream>``): its messages
read from first to last sequence, the records in them (cuts applied), fences, cuts, the
highest revision tag, every message that does not decode (named by its sequence), tags going
backwards, messages missing inside the stream; the checkpoints in its object store bucket
``<stream>-checkpoints`` (the newest downloaded and checked like a local checkpoint); and
whether the stream still reaches back to that checkpoint: a stream purged up to a checkpoint
(first sequence past 1) needs that checkpoint, else the purged records are gone. And on how
many NATS servers each journal, checkpoint bucket, the meta, writer lease and members bucket are
stored, which of those servers are offline or behind; given the replicas the servers run with,
fewer is a finding: a lost server would take what only it holds.

Read-only: it lists, reads through an ephemeral consumer that acknowledges nothing, and
downloads; it never publishes, purges or fences, so it is safe while a server writes (each
stream is read up to the last sequence it had when the streams were listed). What a writer does
meanwhile is not taken for damage: the revision it acknowledged is read before the streams (a
write acknowledged later is in messages past those read), a stream purged while it is read
(a checkpoint stored, its records released) is read on from where it now starts, and a
checkpoint deleted while it is downloaded (a newer one stored first) gives way to the newest.
"""
from __future__ import annotations

import asyncio
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from journal.config import JournalConfig
from journal.errors import JournalFailed, JournalUnreachable
from journal.jetstream import (CHECKPOINT_TRIES, CUT_HEADER, FENCE_HEADER, NatsAccess, checkpoint_bucket,
                               checkpoint_files, checkpoint_stream, connect_failure, connect_options, drops_messages,
                               fetch_object, kv_keys, kv_stream, list_objects, list_streams, meta_bucket,
                               of_prefix, PullReader, refusal, refused, released_key, retrying, shown_urls, stream_head_lost,
                               StreamsWithoutLeader, writer_bucket_streams)
from journal.record import FrameError, decode_frame
from journal.verify import lost_revisions as shared_lost_revisions, runs_text, verify_checkpoints

MAX_ERRORS_SHOWN = 20
NO_LEADER = ("no leader: JetStream did not list it (the NATS servers that hold it are down, or cannot elect "
             "one); not read")
READ_BATCH = 256  # messages a fetch asks for


@dataclass
class CheckpointReport:
    name: str
    rev: int
    size: int
    status: str  # "ok", "corrupt", "older" (listed, not downloaded)
    rows: int = 0
    detail: str = ""


@dataclass
class StreamReport:
    shard: str
    stream: str
    first_seq: int = 0
    last_seq: int = 0
    messages: int = 0
    records: int = 0  # cuts applied
    fences: int = 0
    cuts: int = 0
    first_rev: int | None = None
    last_rev: int | None = None  # the highest revision tag of a record still in force
    errors: list[str] = field(default_factory=list)  # "seq N: ..." (decode errors, tags going back, gaps)
    checkpoints: list[CheckpointReport] = field(default_factory=list)
    purge_problem: str = ""  # set when the stream was purged past what its checkpoints cover
    head_lost: str = ""  # set when it starts past the first message its writer kept (stream_head_lost)
    drops: list[str] = field(default_factory=list)  # settings of it or its bucket that drop messages
    unread: str = ""  # not read for want of a leader (NO_LEADER): "stream", or "checkpoints" (its bucket)
    revisions: list[int] = field(default_factory=list, repr=False)  # the tag of each record in force, in order

    @property
    def bucket(self) -> str:
        return checkpoint_bucket(self.stream)

    @property
    def status(self) -> str:
        if self.errors:
            return "corrupt"
        if self.head_lost:
            return "purged past its writer's release"
        if self.purge_problem:
            return "purged past its checkpoint"
        if self.drops:
            return "would drop records"
        if any(c.status == "corrupt" for c in self.checkpoints):
            return "checkpoint corrupt"
        if self.unread:
            return "unavailable" if self.unread == "stream" else "checkpoints unavailable"
        return "ok"

    @property
    def unavailable(self) -> bool:
        """Found whole as far as it was read, but not all of it was (``unread``)."""
        return self.status in ("unavailable", "checkpoints unavailable")

    @property
    def sound(self) -> bool:
        return self.status == "ok"


@dataclass
class ReplicaReport:
    """Where one stream of the prefix is stored: its replica count and its servers' state."""
    stream: str
    replicas: int | None  # None: not known (JetStream did not list the stream: no leader)
    leader: str | None = None
    lagging: list[str] = field(default_factory=list)  # "n2 offline", "n3 not current, 12 operations behind"

    def fewer_than(self, want: int | None) -> bool:
        return want is not None and self.replicas is not None and self.replicas < want

    def line(self, want: int | None) -> str:
        line = f"replicas: {self.stream}: {'unknown' if self.replicas is None else self.replicas}"
        if self.fewer_than(want):
            line += f", fewer than the {want} asked"
        where = [f"leader {self.leader}"] if self.leader else ["no leader"]
        return f"{line} ({'; '.join(where + self.lagging)})"


@dataclass
class Verified:
    """What ``verify_jetstream`` found."""
    streams: list[StreamReport]
    acknowledged: dict[str, int] | None  # by role: the revision the writer said it acknowledged writes up to
    # (None: not known, the meta bucket did not answer)
    replicas: list[ReplicaReport]
    spans: dict[str, list[str]] = field(default_factory=dict)  # by role: its shards (where its layout is recorded)


async def connect(urls: tuple[str, ...], access: NatsAccess | None = None, timeout_s: float = 5.0):
    """A plain NATS connection that gives up at once (a tool, not a server): JournalUnreachable."""
    import nats

    options = connect_options(urls, access)
    seen: list[BaseException] = []
    nc = nats.NATS()

    async def quiet(exc: Exception) -> None:  # kept for the one line below, not logged
        seen.append(connect_failure(exc, nc, access))

    try:  # each URL tried twice, then NoServersError
        await asyncio.wait_for(nc.connect(servers=list(urls), connect_timeout=timeout_s, allow_reconnect=False,
                                          max_reconnect_attempts=1, reconnect_time_wait=0.2, error_cb=quiet,
                                          name="shardetcd-journal-verify", **options),
                               timeout=3 * timeout_s)
        return nc
    except Exception as exc:  # noqa: BLE001 - nats-py raises several kinds; all mean "not reachable"
        last = seen[-1] if seen else exc
        if refused(last):
            raise refusal(urls, last, access) from None
        reason = "no answer" if isinstance(exc, asyncio.TimeoutError) else repr(last)
        raise JournalUnreachable(f"cannot reach NATS at {shown_urls(urls)}: {reason}") from None


async def verify_jetstream(urls: tuple[str, ...], prefix: str, config: JournalConfig = JournalConfig(),
                           access: NatsAccess | None = None) -> Verified:
    """One report per journal stream of ``prefix``, in name order; the revision each writer
    (by role: its default shard's or partition's name) said it acknowledged writes up to; and
    where each stream a writer keeps is stored. A stream of the prefix that has no leader (its
    NATS servers lost, or electing for longer than ``list_streams`` waits) is reported as
    unavailable, and the rest are read: an operator who lost servers learns what is still whole."""
    from nats.errors import Error as NatsError

    nc = await connect(urls, access)
    try:
        js = nc.jetstream(timeout=10.0)
        try:
            # first: what a writer acknowledged before the streams are listed is in what is read of them
            try:
                acknowledged, spans = await _acknowledged(js, prefix)
            except JournalFailed:  # its bucket has no leader (or NATS none at all: then the listing fails too)
                acknowledged, spans = None, {}
            try:
                infos, leaderless = await list_streams(js, wanted=of_prefix(prefix)), []
            except StreamsWithoutLeader as exc:
                infos, leaderless = exc.streams, exc.missing
        except (NatsError, asyncio.TimeoutError, JournalFailed) as exc:
            raise JournalUnreachable(f"NATS at {shown_urls(urls)} does not answer JetStream requests: {exc}") from None
        journals = _journals(infos, prefix)
        by_name = {i.config.name: i for i in infos}
        unreadable = set(leaderless) | (set() if acknowledged is not None else {kv_stream(meta_bucket(prefix))})
        reports = [StreamReport(name[len(prefix) + 1:], name, unread="stream")
                   for name in leaderless if name.startswith(f"{prefix}_")]
        for info in journals:
            try:
                reports.append(await _verify_stream(nc, js, info, prefix, config, by_name, unreadable))
            except (NatsError, asyncio.TimeoutError, JournalFailed) as exc:
                raise JournalUnreachable(f"NATS at {shown_urls(urls)} stopped answering while stream "
                                         f"{info.config.name} was read: {exc!r}") from None
        reports.sort(key=lambda r: r.stream)
        return Verified(reports, acknowledged, _replicas(by_name, [r.stream for r in reports], prefix, leaderless),
                        spans)
    finally:
        await nc.close()


async def shards_holding_data(urls: tuple[str, ...], prefix: str, besides: set[str],
                              access: NatsAccess | None = None) -> list[str]:
    """The shards (a partition under ``cluster``: its name) of ``prefix``'s journal streams, other than
    ``besides``, whose stream holds a record or whose checkpoint bucket holds an object. A stream
    with nothing but writers' fences and cut markers (a start that took no write) holds no data.
    Reads a stream's messages from its first only until a record: a few messages.

    The stream is read before its bucket is asked: a writer still running may store a checkpoint and
    release the records below it meanwhile, and it stores the checkpoint first (and deletes an older
    one only after storing a newer), so records gone from the read are in the bucket asked after."""
    from nats.errors import Error as NatsError
    from nats.js.errors import NotFoundError

    nc = await connect(urls, access)
    try:
        js = nc.jetstream(timeout=10.0)
        try:
            infos = await list_streams(js, wanted=of_prefix(prefix))
            found = []
            for info in _journals(infos, prefix):
                shard = info.config.name[len(prefix) + 1:]
                if shard in besides:
                    continue
                if await _holds_a_record(js, info):
                    found.append(shard)
                    continue
                try:  # asked now, after the read (not the listing's state)
                    bucket = await retrying("bucket info", lambda: js.stream_info(checkpoint_stream(info.config.name)))
                except NotFoundError:
                    continue  # no checkpoint ever stored
                if bucket.state.messages:
                    found.append(shard)
            return found
        except (NatsError, asyncio.TimeoutError, JournalFailed) as exc:
            raise JournalUnreachable(f"NATS at {shown_urls(urls)} does not answer JetStream requests: "
                                     f"{exc!r}") from None
    finally:
        await nc.close()


async def _holds_a_record(js, info) -> bool:
    from nats.js.errors import NotFoundError

    seq, stream = info.state.first_seq, info.config.name
    while info.state.messages and seq <= info.state.last_seq:
        try:  # this sequence or the next one stored (one may be deleted)
            msg = await retrying("read stream", lambda: js.get_msg(stream, seq=seq, next=True, direct=True))
        except NotFoundError:
            return False
        headers = msg.headers or {}
        if msg.data and FENCE_HEADER not in headers and CUT_HEADER not in headers:
            return True
        seq = msg.seq + 1
    return False


async def _acknowledged(js, prefix: str, deadline_s: float = 15.0) -> tuple[dict[str, int], dict[str, list[str]]]:
    """``acknowledged.<role>`` and the shards of ``layout.<role>`` in the meta bucket (shards/store.py),
    its keys listed by kv_keys (nats-py's kv.keys() has answered "no keys" on a NATS cluster for a
    bucket that held them, so that a lost stream passed as sound). JournalFailed if the bucket does
    not answer for ``deadline_s`` (no leader)."""
    from nats.js.errors import BucketNotFoundError, NotFoundError

    bucket = meta_bucket(prefix)
    try:  # (each again while JetStream answers that it is unavailable, as the streams' reads)
        kv = await retrying(f"open {bucket}", lambda: js.key_value(bucket), deadline_s=deadline_s)
        keys = await retrying(f"list {bucket}", lambda: kv_keys(js, bucket), deadline_s=deadline_s)
    except (BucketNotFoundError, NotFoundError):
        return {}, {}
    found, spans = {}, {}
    for key in keys:
        kind, _, role = key.partition(".")
        if kind not in ("acknowledged", "layout"):
            continue
        try:
            value = (await retrying(f"get {key}", lambda key=key: kv.get(key))).value.decode()
            if kind == "acknowledged":
                found[role] = int(value)
            else:
                spans[role] = [shard for shard, _ in json.loads(value)]
        except (NotFoundError, ValueError, TypeError):
            continue
    return found, spans


def acknowledged_lines(reports: list[StreamReport], acknowledged: dict[str, int] | None, prefix: str,
                       spans: dict[str, list[str]] | None = None) -> tuple[list[str], bool]:
    """What the writers said they acknowledged, against what the streams and checkpoints of their
    shards hold; and whether acknowledged records are certainly gone (none of those reaches that far,
    or a shard's stream is missing). A role whose layout is not recorded (journals of before it
    was) is held against every stream of the prefix. A revision a stream holds is not checked to be
    whole on every shard (a start checks that), nor held against streams or checkpoints that were
    unavailable (``acknowledged`` None: the meta bucket did not answer)."""
    if acknowledged is None:
        return [f"acknowledged: unknown: {meta_bucket(prefix)} did not answer ({NO_LEADER.partition(':')[0]}?)"], False
    by_shard = {r.shard: r for r in reports}
    lines, gone = [], False
    for role, rev in sorted(acknowledged.items()):
        where = f"key acknowledged.{role} of {meta_bucket(prefix)}"
        shards = (spans or {}).get(role)
        if shards is None:
            mine, scope = reports, ""
        else:
            mine, scope = [by_shard[s] for s in shards if s in by_shard], f" of its shards ({','.join(shards)})"
        if unread := [r.stream if r.unread == "stream" else r.bucket for r in mine if r.unread]:
            lines.append(f"acknowledged: {role}: writes up to revision {rev} ({where}); not checked: "
                         f"{', '.join(unread)} unavailable")
            continue
        # no write at all is revision 1, as a new etcd starts (a writer that took none publishes 1)
        held = max([1, *(r.last_rev or 0 for r in mine), *(c.rev for r in mine for c in r.checkpoints)])
        missing = [f"{prefix}_{s}" for s in shards or () if s not in by_shard]
        if missing and rev > 1:  # (1: it took no write)
            gone = True
            lines.append(f"acknowledged: {role}: writes up to revision {rev} ({where}), but stream "
                         f"{', '.join(missing)} is gone: any acknowledged records it held are gone too")
        one_space = shards is not None or len(acknowledged) == 1  # (unrecorded layouts: the streams of several)
        if rev > held:
            gone = True
            lines.append(f"acknowledged: {role}: writes up to revision {rev} ({where}), but no stream or checkpoint"
                         f"{scope} holds a revision past {held}: acknowledged records are gone, and a start refuses them")
        elif one_space and (lost := lost_revisions(mine, rev)):
            gone = True
            lines.append(f"acknowledged: {role}: writes up to revision {rev} ({where}), but revisions "
                         f"{runs_text(lost)} are in no stream{scope}, and no checkpoint of a stream whose records "
                         "start past them reaches them: acknowledged records are gone, and a start refuses them")
        elif not missing:
            lines.append(f"acknowledged: {role}: writes up to revision {rev} ({where}); the streams{scope} reach {held}")
    return lines, gone


def lost_revisions(reports: list[StreamReport], upto: int) -> list[int]:
    """``journal.verify.lost_revisions`` of the streams of one revision space."""
    return shared_lost_revisions(((r.revisions, max((c.rev for c in r.checkpoints), default=0)) for r in reports), upto)


def _replicas(by_name: dict, journals: list[str], prefix: str, leaderless: list[str]) -> list[ReplicaReport]:
    """The ``journals``, their checkpoint buckets, the meta, writer lease and members buckets, in that
    order; one JetStream did not list (``leaderless``) with its replicas unknown."""
    names = [name for j in journals for name in (j, checkpoint_stream(j))] + list(writer_bucket_streams(prefix))
    return [_replica_report(by_name[name]) if name in by_name else ReplicaReport(name, None)
            for name in names if name in by_name or name in leaderless]


def _replica_report(info) -> ReplicaReport:
    report = ReplicaReport(info.config.name, info.config.num_replicas or 1)
    cluster = info.cluster
    if cluster is None:  # a NATS server that is not clustered: it alone
        report.leader = "the one server"
        return report
    report.leader = cluster.leader
    for peer in cluster.replicas or []:
        if peer.offline:
            report.lagging.append(f"{peer.name} offline")
        elif not peer.current:
            behind = f", {peer.lag} operations behind" if peer.lag else ""
            heard = f", last active {peer.active / 1e9:.1f} s ago" if peer.active else ""
            report.lagging.append(f"{peer.name} not current{behind}{heard}")
    return report


def _journals(infos, prefix: str) -> list:
    """The journal streams of ``prefix`` among ``infos``, in name order."""
    return sorted((i for i in infos if _is_journal(i.config, prefix)), key=lambda i: i.config.name)


def _is_journal(cfg, prefix: str) -> bool:
    return cfg.name.startswith(f"{prefix}_") and list(cfg.subjects or []) == [f"journal.{cfg.name}"]


async def _verify_stream(nc, js, info, prefix: str, config: JournalConfig, by_name: dict,
                         unreadable: set[str]) -> StreamReport:
    """The report of one journal stream; ``unreadable``: streams of the prefix not to be read (no
    leader), its checkpoint bucket's or the meta bucket's perhaps."""
    stream = info.config.name
    report = StreamReport(stream[len(prefix) + 1:], stream, info.state.first_seq, info.state.last_seq)
    report.drops = drops_messages(info.config)
    if (bucket := by_name.get(checkpoint_stream(stream))) is not None:
        report.drops += [f"{report.bucket}: {what}" for what in drops_messages(bucket.config, journal=False)]
    await _read_messages(nc, js, report, info.state.messages, config)
    if checkpoint_stream(stream) in unreadable:
        report.unread = "checkpoints"
    else:
        await _verify_checkpoints(js, report)
    if report.first_seq > 1 and not report.unread:  # purged up to a checkpoint: it must load
        newest = max(report.checkpoints, key=lambda c: c.rev, default=None)
        if newest is None:
            report.purge_problem = (f"messages before seq {report.first_seq} were purged, but {report.bucket} "
                                    "holds no checkpoint: the records they held are gone")
        elif newest.status != "ok":
            report.purge_problem = (f"messages before seq {report.first_seq} were purged, but the newest "
                                    f"checkpoint {newest.name} does not load")
    if kv_stream(meta_bucket(prefix)) not in unreadable:
        released = await _meta_value(js, prefix, released_key(stream))  # after the first message was seen
        report.head_lost = stream_head_lost(stream, report.first_seq, released) or ""
    return report


async def _meta_value(js, prefix: str, key: str) -> str | None:
    """``key`` of the prefix's meta bucket; None when it or the bucket is missing."""
    from nats.js.errors import BucketNotFoundError, NotFoundError

    bucket = meta_bucket(prefix)
    try:
        kv = await retrying(f"open {bucket}", lambda: js.key_value(bucket))
        return (await retrying(f"get {key}", lambda: kv.get(key))).value.decode()
    except (BucketNotFoundError, NotFoundError):
        return None


async def _read_messages(nc, js, report: StreamReport, count: int, config: JournalConfig) -> None:
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    if count == 0:
        return
    sub = await PullReader.open(js, nc, f"journal.{report.stream}", report.stream, ConsumerConfig(
        deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE, inactive_threshold=30.0))
    live: list[int] = []  # tags of the records in force, in order
    top = 0  # the highest tag in force
    prev = None
    try:
        while prev is None or prev < report.last_seq:
            try:  # (a consumer just created may have no leader for a moment)
                batch = await retrying("read stream", lambda: sub.fetch(batch=READ_BATCH, timeout=5.0),
                                       deadline_s=30.0)
            except JournalFailed:
                stream = await retrying("stream info", lambda: js.stream_info(report.stream))
                if stream.state.first_seq <= report.last_seq:
                    report.errors.append(f"seq {(prev or report.first_seq - 1) + 1}..{report.last_seq}: not "
                                         "delivered (the stream read got no answer for 30 s)")
                elif await _skipped(js, report, prev, report.last_seq + 1):  # the rest released, nothing after
                    live.clear()
                break
            for msg in batch:
                seq = msg.metadata.sequence.stream
                if await _skipped(js, report, prev, min(seq, report.last_seq + 1)):
                    # read on from here as a read started now would: the records before were released
                    # to a checkpoint, which the bucket holds by now (stored before the purge)
                    live.clear()
                    top = 0
                prev = seq
                if seq > report.last_seq:  # appended after we started: not ours to judge
                    break
                report.messages += 1
                top = _take(report, seq, msg.data or b"", msg.headers or {}, live, top, config)
    finally:
        await sub.close()
    report.records, report.revisions = len(live), live
    if live:
        report.first_rev, report.last_rev = live[0], live[-1]


async def _skipped(js, report: StreamReport, prev: int | None, upto: int) -> bool:
    """The listed messages after ``prev`` (None: before any was read) and before ``upto`` did not
    come: those before the first read were purged since the stream was listed (it starts later
    now: at ``last_seq`` + 1 if every listed message went, which the purge check then holds to a
    checkpoint), and a gap after one read is ``_purged_before``'s to tell; True: start over there."""
    if prev is None:
        report.first_seq = upto
        return False
    return upto > prev + 1 and await _purged_before(js, report, prev + 1, upto)


async def _purged_before(js, report: StreamReport, expected: int, seq: int) -> bool:
    """Messages expected..seq-1 did not come: purged from the front while the stream was read
    (True: ``report`` starts over at ``seq``, what is below it released) or missing inside it (an
    error in ``report``; the part below where the stream now starts is taken as purged)."""
    first = (await retrying("stream info", lambda: js.stream_info(report.stream))).state.first_seq
    if first <= expected:
        report.errors.append(f"seq {expected}..{seq - 1}: missing inside the stream (deleted)")
        return False
    report.first_seq, report.messages, report.fences, report.cuts = seq, 0, 0, 0
    report.errors.clear()  # all of messages below expected: gone now
    if first < seq:
        report.errors.append(f"seq {first}..{seq - 1}: missing inside the stream (deleted)")
    return True


def _take(report: StreamReport, seq: int, data: bytes, headers: dict, live: list[int], top: int,
          config: JournalConfig) -> int:
    if FENCE_HEADER in headers:
        report.fences += 1
        if data:
            report.errors.append(f"seq {seq}: fence message carries {len(data)} bytes")
        return top
    if CUT_HEADER in headers:
        report.cuts += 1
        try:
            cut = int(headers[CUT_HEADER])
        except ValueError:
            report.errors.append(f"seq {seq}: cut header {headers[CUT_HEADER]!r} is not a revision")
            return top
        while live and live[-1] > cut:
            live.pop()
        return min(top, cut)
    pos = 0
    while pos < len(data):
        try:
            frame = decode_frame(data, pos, config.record_bytes_max)
        except FrameError as exc:
            report.errors.append(f"seq {seq}: offset {exc.offset}: {exc.reason}")
            return top
        if frame.rev < top:
            report.errors.append(f"seq {seq}: offset {frame.offset}: revision tag {frame.rev} after {top}")
        top = max(top, frame.rev)
        live.append(frame.rev)
        pos = frame.end
    return top


async def _verify_checkpoints(js, report: StreamReport) -> None:
    """The checkpoints in the stream's bucket, the newest downloaded and checked. One whose download
    fails is damaged only if it is still the newest when the bucket is listed again: a writer stores
    a new checkpoint before it deletes the older ones, so one deleted meanwhile gives way to a newer."""
    from nats.js.errors import BucketNotFoundError, NotFoundError

    try:
        bucket = await retrying(f"open {report.bucket}", lambda: js.object_store(report.bucket))
    except (BucketNotFoundError, NotFoundError):
        return
    failed: dict[str, CheckpointReport] = {}  # by name: a download that failed
    for _ in range(CHECKPOINT_TRIES):
        try:
            objects = await retrying(f"list {report.bucket}", lambda: list_objects(js, report.bucket))
        except NotFoundError:  # the bucket gone since
            return
        found = [CheckpointReport(obj.name, rev, obj.size or 0, "older") for obj, rev in checkpoint_files(objects)]
        found.sort(key=lambda c: c.rev)
        report.checkpoints = found
        if not found:
            return
        newest = found[-1]
        if newest.name in failed:  # its download failed and it is still the newest: damaged
            found[-1] = failed[newest.name]
            return
        if not await _check_newest(js, bucket, report.bucket, newest):
            return
        failed[newest.name] = newest
    found[-1].detail += f" (and a newer checkpoint stored meanwhile each of {CHECKPOINT_TRIES} times)"


async def _check_newest(js, bucket, bucket_name: str, ckpt: CheckpointReport) -> bool:
    """Download the newest checkpoint and read it through like a local one (frames, CRCs, row
    count); True if the download failed (then ``ckpt`` says how)."""
    from nats.errors import Error as NatsError

    with tempfile.TemporaryDirectory(prefix="shardetcd-verify-") as tmp:
        path = Path(tmp) / ckpt.name

        async def fetch():
            with open(path, "wb") as f:
                await fetch_object(js, bucket, bucket_name, ckpt.name, f)

        try:  # again while JetStream answers that it is unavailable (a loaded or electing cluster)
            await retrying(f"download {bucket_name}/{ckpt.name}", fetch)
        except (NatsError, JournalFailed) as exc:  # e.g. DigestMismatchError: the chunks are not what was stored
            ckpt.status, ckpt.detail = "corrupt", f"download failed: {type(exc).__name__}: {exc}"
            return True
        reports = await asyncio.to_thread(verify_checkpoints, Path(tmp))
    if not reports:
        ckpt.status, ckpt.detail = "corrupt", "not a checkpoint file"
        return False
    checked = reports[0]
    ckpt.status, ckpt.rows = checked.status, checked.records
    ckpt.detail = "" if checked.status == "ok" else checked.detail
    return False


def report_lines(reports: list[StreamReport]) -> list[str]:
    """The lines ``journal verify`` prints: one per stream, its errors, one per checkpoint."""
    lines = []
    for r in reports:
        if r.unread == "stream":
            lines.append(f"{r.shard}: stream {r.stream}: unavailable: {NO_LEADER}")
            continue
        revs = f"revs {r.first_rev}..{r.last_rev}" if r.records else "no records"
        seqs = f"seq {r.first_seq}..{r.last_seq}" if r.messages else "empty"
        line = (f"{r.shard}: stream {r.stream}: {r.status}, {r.messages} messages ({seqs}), {r.records} records, "
                f"{r.fences} fences, {r.cuts} cuts, {revs}")
        if r.head_lost:
            line += f"; {r.head_lost}"
        if r.purge_problem:
            line += f"; {r.purge_problem}"
        if r.drops:
            line += f"; it would drop acknowledged records: {', '.join(r.drops)}"
        lines.append(line)
        for error in r.errors[:MAX_ERRORS_SHOWN]:
            lines.append(f"{r.shard}: stream {r.stream}: {error}")
        if len(r.errors) > MAX_ERRORS_SHOWN:
            lines.append(f"{r.shard}: stream {r.stream}: ... and {len(r.errors) - MAX_ERRORS_SHOWN} more errors")
        for c in r.checkpoints:
            what = (f"{c.rows} rows, rev {c.rev}, {c.size} bytes" if c.status != "older"
                    else f"rev {c.rev}, {c.size} bytes (an older one, not checked)")
            lines.append(f"{r.shard}: {r.bucket}/{c.name}: {c.status}, {what}" + (f"; {c.detail}" if c.detail else ""))
        if r.unread == "checkpoints":
            lines.append(f"{r.shard}: {r.bucket}: unavailable: {NO_LEADER}")
        elif not r.checkpoints:
            lines.append(f"{r.shard}: {r.bucket}: no checkpoint")
    return lines
