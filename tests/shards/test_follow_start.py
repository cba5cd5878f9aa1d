"""A follower's or standby's start fetches every shard's newest checkpoint, then reads every journal.
A writer that checkpoints meanwhile releases a journal past the checkpoint fetched: the start then
fetches that shard's newer checkpoint (only that one: a large state's download is not repeated for
the shards that were not overtaken) and reads every journal again, since every read must come
after every fetch. A writer that keeps overtaking it ends the start with JournalGap, after a bound."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from journal.errors import JournalGap
from shards import recovery
from shards.shard import checkpoint_meta, checkpoint_revision


class Writer:
    """One shard's journal as its writer leaves it: records 1..top, released up to its newest
    checkpoint (or ``released``); ``checkpoints_on_fetch`` makes it checkpoint right after each fetch of its own."""

    def __init__(self, name: str, checkpoint: int, top: int, checkpoints_on_fetch: list[int] = (),
                 released: int | None = None, quiet: bool = False) -> None:
        self.name, self.checkpoint, self.top, self.quiet = name, checkpoint, top, quiet
        self.released = checkpoint if released is None else released
        self.pending = list(checkpoints_on_fetch)
        self.fetches = self.reads = 0
        self.released_before, self.first_top = False, 0

    async def load_checkpoint(self):
        self.fetches += 1
        fetched = SimpleNamespace(meta=checkpoint_meta(self.checkpoint, 0, 0))
        if self.pending:  # the writer checkpoints (and releases) before this start reads the journal
            self.checkpoint = self.released = self.pending.pop(0)
            self.top = max(self.top, self.checkpoint + (0 if self.quiet else 1))
        return fetched

    async def catch_up(self) -> None:
        self.reads += 1
        self.released_before = self.released > 0
        self.first_top = self.released + 1 if self.top > self.released else 0

    async def newest_checkpoint_rev(self) -> int:
        return self.checkpoint


def start(*writers: Writer) -> list:
    return asyncio.run(recovery._fetch_and_read([SimpleNamespace(journal=w) for w in writers]))


def test_only_the_overtaken_shard_fetches_again_and_every_journal_is_read_again(caplog):
    leases = Writer("leases", checkpoint=10, top=30)
    pods = Writer("pods", checkpoint=12, top=30, checkpoints_on_fetch=[25])
    ckpts = start(leases, pods)
    assert [checkpoint_revision(c) for c in ckpts] == [10, 25]
    assert (leases.fetches, pods.fetches) == (1, 2)  # the leases checkpoint is not downloaded again
    assert (leases.reads, pods.reads) == (2, 2)  # the leases journal read again, after the pods fetch
    again = [r.getMessage() for r in caplog.records if "fetching the newer one" in r.getMessage()]
    assert len(again) == 1 and "attempt=1" in again[0] and "(rev 12)" in again[0] and "rev 26" in again[0], again


def test_a_journal_released_to_a_last_message_with_no_record_fetches_the_newer_checkpoint(caplog):
    """A release purges every message a checkpoint covers but the newest, which may hold no
    record (a fence a writer publishes when it takes its lapsed lease again, a cut marker): a read
    then finds no record at all, and the writes between the checkpoint fetched and the newer one
    are in nothing it read. It was not taken as overtaken (no first record to be past the
    checkpoint): a standby refused to start, sure acknowledged records were gone (chaos, seed 9104,
    "revisions 72991..72992, 72996, ... are in no journal"), or would have served without them."""
    pods = Writer("pods", checkpoint=12, top=30, checkpoints_on_fetch=[30], quiet=True)
    assert [checkpoint_revision(c) for c in start(pods)] == [30]
    assert pods.fetches == pods.reads == 2
    again = [r.getMessage() for r in caplog.records if "fetching the newer one" in r.getMessage()]
    assert len(again) == 1 and "(rev 12)" in again[0] and "no record read" in again[0], again


def test_a_journal_released_with_no_newer_checkpoint_is_not_a_reason_to_fetch_again():
    """Released past the checkpoint with no newer one there: records are missing, which loading
    reports (``_check_complete``); fetching again would only find the same checkpoint."""
    pods = Writer("pods", checkpoint=8, top=30, released=12)
    assert [checkpoint_revision(c) for c in start(pods)] == [8]
    assert pods.fetches == pods.reads == 1


def test_a_writer_that_overtakes_every_fetch_ends_the_start_after_the_bound():
    pods = Writer("pods", checkpoint=1, top=2, checkpoints_on_fetch=[10 * i for i in range(1, 50)])
    with pytest.raises(JournalGap, match=r"released past the checkpoint fetched \(rev \d+\) to a newer one"):
        start(pods)
    assert pods.fetches == pods.reads == recovery.FOLLOW_FETCH_TRIES


def test_a_writer_that_settles_before_the_bound_lets_the_start_go_on():
    tries = recovery.FOLLOW_FETCH_TRIES
    pods = Writer("pods", checkpoint=1, top=2, checkpoints_on_fetch=[10 * i for i in range(1, tries)])
    assert checkpoint_revision(start(pods)[0]) == 10 * (tries - 1)
    assert pods.fetches == pods.reads == tries
