"""Start-up: rebuild shard state from checkpoints + journals, keeping only
the longest prefix of revisions that is whole on every shard (DESIGN.md
invariants 5 and 6).  Anything above it was never acknowledged: it is cut
from the journals, with a log line saying how much.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from journal import failpoints
from journal.config import JournalConfig
from journal.errors import JournalGap
from journal.follow import NO_RECORD_AFTER_PURGE
from journal.reader import iter_frames
from journal.record import FrameError
from journal.segment import list_segments
from journal.tasks import together
from journal.verify import lost_revisions, runs_text

from . import collector
from .errors import DataDirError
from .follow import Follower
from .lease import GRANT, decode_lease_record
from .progress import Progress
from .shard import YIELD_EVERY, checkpoint_revision
from .record import AUTH, TOKEN, WRITE, WRITE_LAST, WRITE_PART, decode_compact, decode_extra_meta, decode_write, write_participants

if TYPE_CHECKING:
    from .shard import Recovered
    from .store import Store

logger = logging.getLogger(__name__)


def recovered_revision(found: list[Recovered]) -> int:
    """Highest R such that every revision <= R is present on all its shards."""
    rev = max([1, *(f.checkpoint_rev for f in found)])
    parts: dict[int, tuple[tuple[int, ...], set[int]]] = {}
    for sid, f in enumerate(found):
        for r, participants, _, _ in f.writes:
            parts.setdefault(r, (participants, set()))[1].add(sid)
    while (nxt := parts.get(rev + 1)) is not None:
        participants, have = nxt
        if not all(p in have or found[p].checkpoint_rev > rev for p in participants):
            break
        rev += 1
    return rev


def writes_on_disk(data_dir: Path, names: list[str],
                   config: JournalConfig = JournalConfig()) -> list[list[tuple[int, tuple[int, ...]]]]:
    """For ``journal verify`` (reads, changes nothing): per shard of ``names``, the (revision,
    participants) of every write record its local journal holds, in order; frames from a bad one
    on are left out (verify reports those)."""
    found = []
    for name in names:
        directory = data_dir / "shards" / name / "journal"
        writes = []
        for _, path in list_segments(directory) if directory.is_dir() else []:
            with open(path, "rb") as f:
                try:
                    for frame in iter_frames(f, 0, os.fstat(f.fileno()).st_size, config.record_bytes_max,
                                             config.read_chunk_bytes):
                        if frame.rtype == WRITE or frame.rtype == WRITE_LAST:  # (a WRITE_LAST's head is a WRITE's)
                            writes.append((frame.rev, write_participants(frame.payload)))
                except FrameError:
                    pass
        found.append(writes)
    return found


def whole_on_disk(on_disk: list[list[tuple[int, tuple[int, ...]]]], checkpoint_revs: list[int]) -> int:
    """The revision up to which the journals read by ``writes_on_disk`` hold every revision above
    their checkpoints whole, as a start would find it."""
    from .shard import Recovered

    return recovered_revision([Recovered(ckpt_rev, -1, [(r, p, b"", 0) for r, p in writes if r > ckpt_rev], [], [], b"")
                               for writes, ckpt_rev in zip(on_disk, checkpoint_revs)])


def _check_complete(store: Store, found: list[Recovered]) -> None:
    """A restored data dir holds a checkpoint at or above the restored revision
    on every shard, forever after (checkpoints only move up): without one, a
    shard's keys (and, on the default shard, the leases and the auth state)
    would silently be missing."""
    floor = store.datadir.meta.get("floor_revision", 0)
    missing = [shard.name for shard, f in zip(store.shards, found) if f.checkpoint_rev < floor]
    if missing:
        raise DataDirError(
            f"data dir {store.datadir.path} was restored at revision {floor}, but shard(s) {', '.join(missing)} "
            "have no checkpoint at or above it: the dir is incomplete (restore the snapshot again)"
        )
    # records are released only once a checkpoint covers them: none means it was lost
    lost = [shard.name for shard, f in zip(store.shards, found) if shard.journal.released_before and not f.checkpoint_rev]
    if lost:
        raise DataDirError(
            f"data dir {store.datadir.path}: the journal of shard(s) {', '.join(lost)} was released up to a "
            "checkpoint that is missing: refusing to serve without those keys (restore from a snapshot)"
        )


def check_kept(store: Store, found: list[Recovered], following: bool = False,
               unacknowledged: list[list[int]] | None = None) -> None:
    """Every revision the last writer acknowledged is in some journal or under a checkpoint that can
    hold it (``journal.verify.lost_revisions``, which `journal verify` asks too). A journal released
    past its checkpoint (its oldest segments deleted by hand, messages purged or dropped by NATS)
    loses the records between; the walk of ``recovered_revision`` begins at the highest checkpoint
    of any shard, so a hole below that is not seen there, and a following start loads every record
    up to it as it comes. Nothing is cut. ``following``: the start of a follower or standby, which
    read ``store.acknowledged`` before any journal; the writer may hold those writes in its state.
    ``unacknowledged``: per shard, the revisions of the writes its journal holds but hands on only once
    its writer tells it had them acknowledged (journal.follow: ``held_records``): stored all the same."""
    if not store.acknowledged:
        return
    held = [(f.below + [w[0] for w in f.writes] + (unacknowledged[sid] if unacknowledged else []), f.checkpoint_rev)
            for sid, f in enumerate(found)]  # what collect() read
    lost = lost_revisions(held, store.acknowledged)
    if not lost:
        return
    where, drop = store.acknowledged_where
    if following:
        way_out = ("Refusing to follow these journals: a follower would serve without those writes. Put the missing "
                   "records back; a writer still serving holds them in its state: save a snapshot from it (`etcdctl "
                   "snapshot save`) and restore it into new journals (`shardetcd snapshot restore`)")
    else:
        way_out = (f"Refusing to start, and nothing was cut. Put the missing records back; or, to serve what is left "
                   f"and lose them, {drop} and start again")
    shards = ", ".join(f"{shard.name} checkpoint {ckpt or 'none'}, writes " + (
        f"{min(revs)}..{max(revs)} ({len(revs)})" if revs else "none") for shard, (revs, ckpt) in zip(store.shards, held))
    raise DataDirError(
        f"writes were acknowledged up to revision {store.acknowledged} ({where}), but revisions {runs_text(lost)} "
        "are in no journal, and no checkpoint of a journal whose records start past them reaches them: acknowledged "
        "journal records are gone (a journal released past its checkpoint: segments deleted, messages purged?). "
        f"{way_out}. Per shard: {shards}")


def check_acknowledged(store: Store, rev: int, found: list[Recovered] | None = None) -> None:
    """Every revision the last writer acknowledged must be whole again: if not, journal records it
    made durable are gone (a segment deleted, a disk replaced or restored from an older copy), and
    cutting what is above the hole would destroy more acknowledged writes. Nothing is cut."""
    if rev >= store.acknowledged:
        return
    ends = "" if found is None else " (newest revision per shard: " + ", ".join(
        f"{shard.name} {max([f.checkpoint_rev, *(w[0] for w in f.writes)]) or 'none'}"
        for shard, f in zip(store.shards, found)) + ")"
    where, drop = store.acknowledged_where
    raise DataDirError(
        f"writes were acknowledged up to revision {store.acknowledged} ({where}), but the journals hold every "
        f"revision only up to {rev}{ends}: acknowledged journal records are gone "
        "(a segment or stream deleted, a disk replaced or restored from an older copy?). Refusing to start, and "
        f"nothing was cut. Put the missing records back; or, to serve what is left and lose the rest, {drop} and "
        "start again")


async def _fetch_checkpoints(shards: list) -> list:
    """Every shard's newest checkpoint, asked for at once: from NATS each is a download (a local one
    is a file opened in place); their rows are then loaded one shard after another."""
    return await together(*(shard.journal.load_checkpoint() for shard in shards))


async def recover(store: Store) -> None:
    """The writer's start: the longest whole prefix is kept, the rest is cut."""
    started = time.monotonic()
    with collector.paused():
        _track_lease_keys(store)
        ckpts = await _fetch_checkpoints(store.shards)
        found = [await shard.read_disk(ckpt) for shard, ckpt in zip(store.shards, ckpts)]
        _check_complete(store, found)
        rev = recovered_revision(found)
        check_acknowledged(store, rev, found)
        check_kept(store, found)
        for shard in store.shards:
            cut = shard.journal.truncate_after(rev)
            if cut:
                logger.warning("discarded unacknowledged journal records shard=%s records=%d above_rev=%d",
                               shard.name, cut, rev)
        await _rebuild(store, found, rev)
    logger.info("recovered rev=%d compact_rev=%d shards=%d seconds=%.3f",
                rev, store.compact_rev, len(found), time.monotonic() - started)


FOLLOW_FETCH_TRIES = 10


async def recover_to_follow(store: Store) -> Follower:
    """A standby's start: what checkpoints hold plus journal records up to the
    newest checkpoint's revision go into the state now; everything above goes
    to a Follower, which applies what is whole as more is read.

    Every checkpoint is fetched before any journal is read: a revision at or
    below a checkpoint was committed before that checkpoint was written, so
    every cut that concerns it is already in each journal read afterwards.
    The journals are read at once, before the checkpoints' rows are loaded: a writer
    that checkpoints as it writes releases its journals up to each new
    checkpoint, and the longer the time from fetching a checkpoint to reading
    its journal, the likelier the records after it are gone by then. A shard
    whose journal was released past its checkpoint meanwhile has its newer
    checkpoint fetched, and every journal is read again (after every fetch, as
    above), FOLLOW_FETCH_TRIES times at most; then JournalGap (the writer
    checkpoints more often than a start fetches and reads). Every revision the
    writer had acknowledged before the first fetch must then be in a journal
    read or under a checkpoint that can hold it (``check_kept``)."""
    started = time.monotonic()
    with collector.paused():
        return await _recover_to_follow(store, started)


async def _recover_to_follow(store: Store, started: float) -> Follower:
    await store.read_acknowledged()  # before any journal is read: every revision up to it must be found there
    ckpts = await _fetch_and_read(store.shards)
    _track_lease_keys(store)
    await failpoints.pause("recovery.follow_loading_checkpoints")
    loaded = [await shard.load_checkpoint(ckpt) for shard, ckpt in zip(store.shards, ckpts)]
    # a journal's last message, held until its writer tells it was acknowledged, was if it holds a write
    # at or below a revision the writer had committed: one it said it acknowledged, a checkpoint's (of
    # any shard: a revision is committed on all at once); rebuilt below with the rest, as the follower
    # takes no write at or below what it has applied
    committed = max([store.acknowledged, *(ckpt[0] for ckpt in loaded)])
    for shard in store.shards:
        shard.journal.acknowledged_if(lambda records: any(
            r.rtype in (WRITE, WRITE_LAST, WRITE_PART) and r.rev <= committed for r in records))
    found = [await shard.collect(*ckpt) for shard, ckpt in zip(store.shards, loaded)]
    _check_complete(store, found)
    check_kept(store, found, following=True, unacknowledged=[
        [r.rev for r in shard.journal.held_records() if r.rtype in (WRITE, WRITE_LAST)] for shard in store.shards])
    base = max([1, *(f.checkpoint_rev for f in found)])
    await _rebuild(store, found, base, keep_hooks=True)
    follower = Follower(store, base, [f.checkpoint_rev for f in found])
    for shard in store.shards:
        for epoch, cut in shard.journal.cuts_seen:
            follower.cut(epoch, cut)
    for sid, f in enumerate(found):
        for r, participants, payload, epoch in f.writes:
            if r > base and not follower._void(epoch, r):
                follower.parts.setdefault(r, {})[sid] = (epoch, participants, decode_write(payload)[1])
    _learn_tokens(store, base)
    for sid, (shard, f) in enumerate(zip(store.shards, found)):
        whole = {r for r, *_ in f.writes}
        for rec in shard.journal.records(after_rev=base):
            # writes came with collect, parts joined; the parts of one whose last is not stored yet
            # go to the follower, which joins them to it when it comes
            if rec.rtype not in (WRITE, WRITE_PART, WRITE_LAST) or rec.rtype == WRITE_PART and rec.rev not in whole:
                follower.take(sid, rec)
    follower.advance()
    logger.info("standby loaded rev=%d applied=%d pending_records=%d seconds=%.3f",
                base, follower.applied, follower.pending(), time.monotonic() - started)
    return follower


async def _fetch_and_read(shards: list) -> list:
    """Every shard's newest checkpoint, then every journal read after it (``recover_to_follow``);
    the checkpoints. A journal released past its checkpoint meanwhile: that shard's newer one is
    fetched and every journal read again."""
    async def read(journal) -> None:
        await journal.catch_up()
        await failpoints.pause("recovery.follow_journal_read")

    ckpts = await _fetch_checkpoints(shards)
    for attempt in range(1, FOLLOW_FETCH_TRIES + 1):
        await failpoints.pause("recovery.follow_after_checkpoints")
        await together(*(read(shard.journal) for shard in shards))  # at once: no read waits for another's
        overtaken = [(sid, gap) for sid, (shard, ckpt) in enumerate(zip(shards, ckpts))
                     if (gap := await _overtaken(shard.journal, ckpt)) is not None]
        if not overtaken:
            return ckpts
        if attempt == FOLLOW_FETCH_TRIES:
            raise overtaken[0][1]
        for _, gap in overtaken:
            logger.warning("journal released past the checkpoint fetched, fetching the newer one attempt=%d error=%s",
                           attempt, gap)
        newer = await _fetch_checkpoints([shards[sid] for sid, _ in overtaken])
        for (sid, _), ckpt in zip(overtaken, newer):
            ckpts[sid] = ckpt
    raise AssertionError("unreachable")


async def _overtaken(journal, ckpt) -> JournalGap | None:
    """A journal read that starts past the checkpoint fetched (or whose messages were purged as it
    read them), released up to a newer one meanwhile. One that read no record at all counts too: a
    release keeps the newest message, which may hold none (a fence, a cut marker), and the records
    it purged before it may be above the checkpoint fetched."""
    ckpt_rev = checkpoint_revision(ckpt)
    first = journal.first_top
    if journal.released_before and (first > ckpt_rev or not first) and await journal.newest_checkpoint_rev() > ckpt_rev:
        read = f"its first record read is rev {first}" if first not in (0, NO_RECORD_AFTER_PURGE) else \
            "no record read" + (" after messages purged as they were read" if first else "")
        return JournalGap(journal.name, ckpt_rev + 1, first,
                          f"released past the checkpoint fetched (rev {ckpt_rev}) to a newer one meanwhile; {read}")
    return None


def _learn_tokens(store: Store, base: int) -> None:
    """The simple tokens the writer assigned in what the journal still holds up
    to ``base`` (the checkpoint holds none: tokens live in memory), each ended
    by the AUTH records after it, in journal order; those above ``base`` go
    through the follower with the rest."""
    auth = store.auth
    for rec in store.lease_shard.journal.records(after_rev=0):
        if rec.rev > base:
            continue
        if rec.rtype == TOKEN:
            auth.learn_token(rec.payload)
        elif rec.rtype == AUTH:
            auth.replay_token_effects(rec.payload)


async def _rebuild(store: Store, found: list[Recovered], rev: int, keep_hooks: bool = False) -> None:
    """Put the checkpoints' tables and every record up to ``rev`` into the state."""
    leases = store.leases
    for shard in store.shards:  # the checkpoints are loaded: from here rows go through on_replay
        shard.replay_key_lease = None
    lease_found = found[store.shards.index(store.lease_shard)]
    lease_table, auth_table = decode_extra_meta(lease_found.extra_meta)
    leases.load_table(lease_table)
    store.auth.load_table(auth_table)
    for rec in lease_found.auths:
        if rec.rev <= rev:
            store.auth.replay(rec.payload)
    for rec in lease_found.leases:
        if rec.rev <= rev:
            op, lease_id, ttl = decode_lease_record(rec.payload)
            if op == GRANT:
                leases.grant(lease_id, ttl)
            else:
                leases.remove(lease_id)
    compact = -1
    key_lease = leases.key_lease
    for shard, f in zip(store.shards, found):
        progress = Progress("journal replay", shard=shard.name, records=len(f.writes))
        budget = YIELD_EVERY
        load_write = shard.state.load_write
        for r, _, payload, _ in f.writes:
            if r <= rev:
                if keep_hooks:  # a follower goes on through on_replay, which keeps each lease's key set
                    changes = decode_write(payload)[1]
                    shard.apply_recovered(r, changes)
                    budget -= len(changes)
                else:  # the key sets are rebuilt from key_lease at the end (settle_leases)
                    budget -= load_write(r, payload, key_lease)
                progress.tick()
                if budget <= 0:
                    budget = YIELD_EVERY
                    await asyncio.sleep(0)
        progress.done()
        compact = max(compact, f.compact_rev, *(decode_compact(rec.payload) for rec in f.compacts if rec.rev <= rev))
    store.rev = store.committed = rev
    for shard in store.shards:
        shard.state.end_bulk()
    if not keep_hooks:
        settle_leases(store)
    if compact >= 0:
        store.compact_rev = compact
        await store._compact_loop()


def _track_lease_keys(store: Store) -> None:
    """While replaying: every row put or deleted updates which lease holds its
    key, and the states load in bulk (nothing reads them until ``_rebuild`` ends)."""
    leases = store.leases
    for shard in store.shards:
        shard.on_replay = lambda key, lease: leases.detach(key) if lease < 0 else leases.attach(key, lease)
        # checkpoints load before the lease table: rows only need to say which lease holds each key
        shard.replay_key_lease = leases.key_lease if not leases.leases else None
        shard.state.begin_bulk()


def settle_leases(store: Store) -> None:
    """After replay: each lease's keys, every lease its full TTL from now (as
    after an etcd leader change); replay no longer tracks lease keys."""
    orphans = store.leases.rebuild_keys()
    if orphans:
        logger.warning("keys attached to leases that no longer exist keys=%d", orphans)
    store.leases.refresh_all()
    for shard in store.shards:
        shard.on_replay = lambda key, lease: None
