"""A follower that can no longer follow the journal resynchronises in-process.

Following stops with JournalGap when messages the follower still needs were
purged (the writer checkpointed and released them while the follower was
paused or slow), and with FollowerDiverged when a newer writer cut below what
it had applied.  Either way its state cannot be brought forward record by
record; instead, while the process keeps serving from the state it has:

1. fresh shard states are built beside the live ones, from the newest
   checkpoint plus what the journals still hold (``recover_to_follow`` on a
   shadow store that shares this store's journals and data dir);
2. once no sliced read is under way, the fresh states, lease table, auth
   state and follower are swapped in with no await in between;
3. every watcher goes back to catching up from the new state's history,
   from the revision it had been sent up to: a checkpoint holds every row
   since the last compaction, so a watcher continues with no gap and no
   duplicate, and one whose next revision was compacted away meanwhile is
   cancelled with ``compact_revision``, as etcd cancels a slow watcher behind
   compaction;
4. following resumes from the journals' new position.

Meanwhile serializable reads are answered from the old state at its applied
revision (a lagging member, as etcd allows), and linearizable reads and
forwarded writes wait for the new applied revision (bounded by the request
timeout).  The rebuild holds a second copy of the state until the swap.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from journal.errors import JournalGap

from .follow import FollowerDiverged
from .shard import Shard
from .tokens import SimpleTokens

if TYPE_CHECKING:
    from .store import Store

logger = logging.getLogger(__name__)

async def keep_following(store: Store) -> None:
    """``store.follow_journals`` until cancelled, resynchronising whenever the
    journal can no longer be followed from where this store is."""
    while True:
        try:
            await store.follow_journals()
        except (JournalGap, FollowerDiverged) as exc:
            await resync(store, exc)


async def resync(store: Store, reason: BaseException) -> int:
    """Replace ``store``'s state with one loaded from the newest checkpoint and
    the journals; the new applied revision."""
    from .recovery import recover_to_follow

    started = time.monotonic()
    before = store.committed
    shadow = _shadow(store)
    try:  # overtaken by the writer's checkpoints, it fetches the newer ones itself (a bounded number of times)
        shadow.follower = await recover_to_follow(shadow)
    except BaseException:
        _close_states(shadow)
        raise
    try:  # cancelled while waiting here (a standby taking over): the shadow's state files go too (tmpfs)
        if store._compaction is not None:  # it walks the old states
            store._compaction.cancel()
            await asyncio.gather(store._compaction, return_exceptions=True)
        while store._reads:  # sliced reads in flight hold rows of the old states
            store._reads_done.clear()
            await store._reads_done.wait()
    except BaseException:
        _close_states(shadow)
        raise
    old_states = _swap(store, shadow)  # no await from here to the end of the swap
    behind = store.hub.resynced(before)
    store._release_waiters(store.committed)
    store.follow_stats.resyncs += 1
    logger.warning("follower resynchronised from a checkpoint old_rev=%d new_rev=%d compact_rev=%d "
                   "watchers_behind_compaction=%d reason=%r seconds=%.3f",
                   before, store.committed, store.compact_rev, behind, reason, time.monotonic() - started)
    for state in old_states:
        await asyncio.to_thread(state.close)
    return store.committed


def _shadow(store: Store) -> Store:
    """A store over the same journals and data dir, with empty states of its own."""
    generation = store.follow_stats.resyncs + 1
    shards = []
    try:
        for old in store.shards:
            path = old.state.path.with_name(f"{old.name}.resync{generation}")
            shards.append(Shard(old.sid, old.name, old.dir, path, old.journal))
    except BaseException:
        for shard in shards:
            shard.state.close()
        raise
    shadow = type(store)(store.config, store.datadir, shards)
    shadow.log, shadow._owns_log = store.log, False
    return shadow


def _close_states(shadow: Store) -> None:
    if shadow._compaction is not None:
        shadow._compaction.cancel()
    for state in shadow.states:
        state.close()


def _swap(store: Store, shadow: Store) -> list:
    """Move the shadow's state into ``store`` (synchronous); the old shard states."""
    old_states = store.states
    store.shards, store.states, store.lease_shard = shadow.shards, shadow.states, shadow.lease_shard
    for state in store.states:
        state.on_failure = store._fail
    if shadow._compaction is not None:  # started by a COMPACT record the shadow applied: go on here
        shadow._compaction.cancel()
    store.leases.adopt(shadow.leases)
    leases = store.leases
    for shard in store.shards:  # the follower's replay keeps tracking which lease holds which key
        shard.on_replay = lambda key, lease: leases.detach(key) if lease < 0 else leases.attach(key, lease)
    tokens = store.auth.tokens
    if isinstance(tokens, SimpleTokens):
        if shadow.auth.state.seq != store.auth.state.seq:
            tokens.clear()  # an auth change in the gap may have ended any of them; the journal says which live
        tokens.merge(shadow.auth.tokens)
    store.auth._swap(shadow.auth.state)
    store.compact_rev, store._compacted_through = shadow.compact_rev, shadow._compacted_through
    store._changes = {}
    store.rev = store.committed = shadow.committed
    store.follower = shadow.follower
    store.follower.store = store
    store.saw_writer_epoch(shadow.writer_epoch)  # the writers the shadow read records of
    if store.compact_rev > store._compacted_through:
        store._start_compaction()
    return old_states
