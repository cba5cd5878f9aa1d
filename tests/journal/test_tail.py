"""Following a local journal from another process on the same machine
(journal/tail.py, journal/watermark.py): a tail hands on only what the writer
made durable and committed, once, in order, across a writer restart, and says
when segments were released before it read them.

The writer here is a real journal.Journal with the watermark wired as the
store wires it (shards/store.py): after every durable batch, the shard's
durable position and the committed revision.
"""
from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from journal import JournalConfig, failpoints
from journal.errors import JournalGap
from journal.journal import Journal
from journal.record import MAGIC
from journal.tail import LocalFollowLog
from journal.tasks import cancel_and_wait
from journal.watermark import FILE_NAME, WatermarkReader, WatermarkWriter


class LocalWriter:
    """One shard ("j") of a data dir, written as a store writes it; committed = what was made durable
    unless a test holds it back (``committed_cap``)."""

    def __init__(self, data: Path, config: JournalConfig = JournalConfig(), starts: int = 1) -> None:
        self.data = data
        self.config = config
        self.starts = starts
        self.committed_cap: int | None = None
        data.mkdir(parents=True, exist_ok=True)
        (data / "meta.json").write_text(json.dumps({"shards": ["j"], "cluster_id": 7, "journal": "local"}))

    async def open(self, truncate_after: int | None = None) -> LocalWriter:
        self.mark = WatermarkWriter(self.data / FILE_NAME, 1, member_id=99)  # before the journal is touched
        self.journal = Journal.open(self.data / "shards" / "j" / "journal", self.config)
        if truncate_after is not None:
            self.journal.truncate_after(truncate_after)
        self.revs: dict[int, int] = {}
        self.committed = self.journal.last_rev
        self.mark.publish_all(self.starts, self.committed, [self.journal.durable_tail])
        self.journal.on_durable = self._durable
        await self.journal.start()
        return self

    def _durable(self, seq: int) -> None:
        rev = self.revs[seq]
        self.committed = rev if self.committed_cap is None else min(rev, self.committed_cap)
        self.mark.durable(self.committed, 0, *self.journal.durable_tail)

    async def write(self, revs, size: int = 40) -> None:
        for rev in revs:
            self.revs[self.journal.append(1, rev, b"%d:" % rev + b"x" * size)] = rev
        await self.journal.sync()

    async def close(self) -> None:
        await self.journal.close()
        self.mark.close()


class Collected:
    def __init__(self) -> None:
        self.revs: list[int] = []
        self.payloads: list[bytes] = []

    def __call__(self, msg) -> None:
        assert msg.epoch == 0 and msg.cut is None and msg.top == msg.records[-1].rev
        self.revs += [r.rev for r in msg.records]
        self.payloads += [r.payload for r in msg.records]

    async def until(self, n: int, timeout: float = 5.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while len(self.revs) < n:
            assert asyncio.get_running_loop().time() < deadline, self.revs
            await asyncio.sleep(0.005)


async def stop(task: asyncio.Task, *closing) -> None:
    """Cancel a follow() task, then close logs and writers."""
    await cancel_and_wait(task)
    for c in closing:
        await c.close()


async def never_covered(expected: int, got: int) -> bool:
    return False


async def follower(data: Path):
    log = LocalFollowLog(data, ["j"])
    tail = await log.open_journal("j", data.parent / "scratch", follow=True)
    return log, tail


def test_a_tail_hands_on_only_what_is_durable_and_committed(tmp_path):
    async def go():
        w = await LocalWriter(tmp_path / "w").open()
        await w.write(range(1, 11))
        log, tail = await follower(w.data)
        # committed 5, durable through record 7: only 1..5 (6 and 7 wait for committed)
        end7 = sum(20 + len(b"%d:" % r) + 40 for r in range(1, 8))
        w.mark.publish_all(1, 5, [(0, end7)])
        await tail.catch_up()
        assert [r.rev for r in tail.records()] == [1, 2, 3, 4, 5]
        got = Collected()
        task = asyncio.ensure_future(tail.follow(got, never_covered))
        w.mark.publish_all(1, 10, [(0, end7)])  # committed passes, the durable position does not
        await got.until(2)
        await asyncio.sleep(0.05)
        assert got.revs == [6, 7]
        w.mark.publish_all(1, 10, [w.journal.durable_tail])
        await got.until(5)
        await w.write(range(11, 21))
        await got.until(15)
        await asyncio.sleep(0.05)
        assert got.revs == list(range(6, 21))
        await stop(task, log, w)

    asyncio.run(go())


def test_a_tail_reaches_the_stored_position_only_once_it_has_handed_on_what_was_stored(tmp_path):
    """The barrier a follower waits on after a forwarded Compact or auth change: stored_tail()
    is the durable position published when it is asked; read_tail reaches it only once every
    frame before it was handed on, and a frame tagged above the committed revision holds it back."""
    async def go():
        w = await LocalWriter(tmp_path / "w").open()
        await w.write(range(1, 6))
        log, tail = await follower(w.data)
        await tail.catch_up()
        assert tail.read_tail == await tail.stored_tail()
        w.committed_cap = 5
        await w.write(range(6, 9))  # durable, not committed
        stored = await tail.stored_tail()
        assert stored == w.journal.durable_tail and tail.read_tail < stored
        got = Collected()
        task = asyncio.ensure_future(tail.follow(got, never_covered))
        await asyncio.sleep(0.05)
        assert got.revs == [] and tail.read_tail < stored
        w.committed_cap = None
        w.mark.publish_all(1, 8, [w.journal.durable_tail])
        await got.until(3)
        assert got.revs == [6, 7, 8] and tail.read_tail == stored
        await stop(task, log, w)

    asyncio.run(go())


def test_bytes_written_but_not_yet_fsynced_are_not_handed_on(tmp_path):
    """The writer thread held between write() and fdatasync (a failpoint): the record's bytes
    are in the segment file (the page cache) for a second, and the tail hands on nothing
    until the fsync is done and the writer has published it."""
    async def go():
        w = await LocalWriter(tmp_path / "w").open()
        await w.write(range(1, 4))
        log, tail = await follower(w.data)
        await tail.catch_up()
        got = Collected()
        task = asyncio.ensure_future(tail.follow(got, never_covered))
        segment = w.journal.segments[-1]
        _, size = w.journal.durable_tail
        failpoints.arm("journal.after_write_before_fsync", "sleep:1.0")
        w.revs[w.journal.append(1, 4, b"4:held")] = 4
        synced = asyncio.ensure_future(w.journal.sync())
        while segment.read_bytes()[size:size + 2] != MAGIC:  # written (over the zeros ahead), not yet durable
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)
        assert not synced.done() and got.revs == []
        await synced
        await got.until(1)
        assert got.payloads == [b"4:held"]
        await stop(task, log, w)

    asyncio.run(go())


def test_a_tail_goes_on_across_a_writer_restart_without_gap_or_duplicate(tmp_path):
    """Record 6 is durable but above committed when the writer dies (half of a txn whose other
    part never made it); the restarted writer cuts it and writes a different 6. The tail held
    the first 6 back, so it hands on the new one, once, and everything after it."""
    async def go():
        data = tmp_path / "w"
        w = await LocalWriter(data).open()
        await w.write(range(1, 6))
        w.committed_cap = 5
        await w.write([6])
        log, tail = await follower(data)
        await tail.catch_up()
        assert [r.rev for r in tail.records()] == [1, 2, 3, 4, 5]
        got = Collected()
        task = asyncio.ensure_future(tail.follow(got, never_covered))
        await asyncio.sleep(0.05)
        assert got.revs == []
        await w.close()  # the writer stops (as good as kill -9: what it wrote is on disk)
        w2 = LocalWriter(data, starts=2)
        await w2.open(truncate_after=5)
        await w2.write([6, 7, 8])
        await got.until(3)
        await asyncio.sleep(0.05)
        assert got.revs == [6, 7, 8] and got.payloads[0].startswith(b"6:") and WatermarkReader(
            data / FILE_NAME).read().generation == 2
        with open(w2.journal.segments[-1], "rb") as f:
            assert f.read().count(b"6:") == 1  # the first 6 is gone from the file
        await stop(task, log, w2)

    asyncio.run(go())


def test_a_round_read_while_the_writer_restarts_is_dropped(tmp_path):
    """The generation is checked again after reading: records read with a mark from before a
    restart are not handed on, and the tail reads again from where it was."""
    async def go():
        w = await LocalWriter(tmp_path / "w").open()
        await w.write(range(1, 4))
        log, tail = await follower(w.data)
        mark = await log.mark()
        w.mark.recovering()  # the writer restarts after the mark was read
        assert tail._read(mark) is None
        w.mark.publish_all(2, 3, [w.journal.durable_tail])
        assert [r.rev for r in tail._read(await log.mark())] == [1, 2, 3]
        await log.close()
        await w.close()

    asyncio.run(go())


async def caught_up_with_a_first_round(tmp_path: Path, first_round) -> list[int]:
    """Revisions 1..3 written, a tail's catch_up with its first round read by ``first_round(writer,
    read, mark)`` (which calls ``read(mark)`` amid something of its own): the revisions it ends with."""
    w = await LocalWriter(tmp_path / "w").open()
    await w.write(range(1, 4))
    log, tail = await follower(w.data)
    read, rounds = tail._read, []

    def reading(mark):
        rounds.append(mark)
        return first_round(w, read, mark) if len(rounds) == 1 else read(mark)

    tail._read = reading
    await asyncio.wait_for(tail.catch_up(), 5)
    assert rounds  # the first round went through first_round
    revs = [r.rev for r in tail.records()]
    await log.close()
    await w.close()
    return revs


def test_a_catch_up_that_meets_a_writer_restart_reads_on_from_its_new_mark(tmp_path):
    """A follower starting while its writer restarts (`shardetcd cluster` started again: both at
    once) read a round, found the writer restarted meanwhile and dropped it, as it must; catch_up
    then took the empty round for "read up to the mark" and ended short, so the start found the
    acknowledged revisions in no journal and refused to follow (chaos, a cluster on local journals,
    round 28: kill-supervisor). Now it waits for the restarted writer's mark and reads on."""
    def read_as_the_writer_restarts(w, read, mark):
        w.mark.recovering()
        asyncio.get_running_loop().call_later(0.05, w.mark.publish_all, 2, 3, [w.journal.durable_tail])
        return read(mark)

    assert asyncio.run(caught_up_with_a_first_round(tmp_path, read_as_the_writer_restarts)) == [1, 2, 3]


def test_segments_released_before_they_were_read_are_a_gap(tmp_path):
    """Small segments, the tail stopped behind while the writer releases through 150: the next
    segment it wants is gone. on_gap decides: not covered is JournalGap; covered (the checkpoint
    loaded holds them) goes on from the oldest segment left. A tail started afterwards catches up
    from the oldest segment and says the journal was released before."""
    async def go():
        config = JournalConfig(segment_bytes_max=1024)
        w = await LocalWriter(tmp_path / "w", config).open()
        await w.write(range(1, 21))
        log, tail = await follower(w.data)
        await tail.catch_up()
        assert not tail.released_before and len(list(tail.records())) == 20
        await w.write(range(21, 201))
        assert w.journal.release_through(150) > 0
        with pytest.raises(JournalGap):
            await asyncio.wait_for(tail.follow(Collected(), never_covered), 5)
        gaps: list[tuple[int, int]] = []

        async def covered(expected: int, got: int) -> bool:
            gaps.append((expected, got))
            return True

        log2, tail2 = await follower(w.data)
        await tail2.catch_up()
        first = next(iter(tail2.records())).rev
        assert tail2.released_before and tail2.first_top == first and 100 < first <= 151
        tail._seq, tail._offset = 0, 0  # as good as behind again
        tail._close_file()
        got = Collected()
        task = asyncio.ensure_future(tail.follow(got, covered))
        await got.until(201 - first)
        assert gaps and gaps[0][0] == 0 and got.revs == list(range(first, 201))
        await stop(task, log, log2, w)

    asyncio.run(go())


def test_a_catch_up_that_cannot_read_the_watermark_for_a_moment_reads_on(tmp_path):
    """The writer updates its watermark after every durable batch. A reader that finds an update
    half-written through all its tries (its writer preempted in the middle of one, on a loaded
    machine) cannot tell whether the writer restarted, and drops the round it read. catch_up then
    looked at the watermark again, found the update done and the same writer, and took the dropped
    round for "read up to the mark": it ended short, and a start found a shard's journal empty and
    refused to follow (CI: chaos with auth on, "pods checkpoint 6136, writes none"). It reads on."""
    from journal.watermark import COUNTER_AT, _U64

    def read_while_an_update_is_half_written(w, read, mark):
        counter = w.mark._counter
        _U64.pack_into(w.mark._mm, COUNTER_AT, counter + 1)  # odd: an update begun
        try:
            return read(mark)
        finally:
            _U64.pack_into(w.mark._mm, COUNTER_AT, counter)  # and done, nothing changed

    assert asyncio.run(caught_up_with_a_first_round(tmp_path, read_while_an_update_is_half_written)) == [1, 2, 3]


def test_first_top_is_the_last_reads(tmp_path):
    """A start reads a journal again after fetching a newer checkpoint, and judges each read by its
    first record (shards.recovery._overtaken): a read that found none says so (0), not the first
    record of the read before it. Here every segment goes by hand between the two reads."""
    async def go():
        w = await LocalWriter(tmp_path / "w").open()
        await w.write(range(5, 21))
        log, tail = await follower(w.data)
        await tail.catch_up()
        assert tail.first_top == 5
        await w.close()
        for segment in (w.data / "shards" / "j" / "journal").glob("*.wal"):
            segment.unlink()
        await tail.catch_up()
        assert list(tail.records()) == [] and tail.first_top == 0
        await log.close()

    asyncio.run(go())


def test_a_tail_never_writes_into_the_writers_dir(tmp_path):
    """Checkpoints are read in place and held open (the writer deletes older ones once it writes
    a newer one); a checkpoint the writer is still writing (.tmp) is left alone; nothing under
    the writer's data dir changes."""
    from journal.checkpoint import write_checkpoint

    async def go():
        w = await LocalWriter(tmp_path / "w").open()
        await w.write(range(1, 6))
        shard = w.data / "shards" / "j"
        write_checkpoint(shard, 3, b"meta", [b"row%d" % i for i in range(100)])
        (shard / "checkpoint-0000000000000009.ckpt.tmp").write_bytes(b"being written")
        before = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in w.data.rglob("*")}
        log, tail = await follower(w.data)
        ckpt = await tail.load_checkpoint()
        assert await tail.newest_checkpoint_rev() == 3
        write_checkpoint(shard, 5, b"meta5", [])  # deletes checkpoint 3
        assert not (shard / "checkpoint-0000000000000003.ckpt").exists()
        assert ckpt.rev == 3 and len(list(ckpt.rows())) == 100  # still readable: held open
        await tail.catch_up()
        assert (await log.get_meta("writer-urls.x")) is None
        assert await log.agree("cluster-id.j", "1") == "7"
        await log.close()
        after = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in w.data.rglob("*")}
        changed = {p for p in set(before) | set(after) if before.get(p) != after.get(p)}
        assert {p.name for p in changed} <= {"checkpoint-0000000000000003.ckpt", "checkpoint-0000000000000005.ckpt",
                                             "j"}  # the writer's own doing
        assert (shard / "checkpoint-0000000000000009.ckpt.tmp").exists()
        await w.close()

    asyncio.run(go())


def test_watermark_readings_are_consistent_while_the_writer_updates(tmp_path):
    """A reader in another process (here: another thread) never sees a half-written update:
    every reading has committed == the shard's length, as every update writes them."""
    import threading

    writer = WatermarkWriter(tmp_path / FILE_NAME, 3, 5)
    writer.publish_all(1, 0, [(0, 0)] * 3)
    reader = WatermarkReader(tmp_path / FILE_NAME)
    stop = threading.Event()
    bad: list = []

    def read() -> None:
        while not stop.is_set():
            mark = reader.read()
            if mark is not None and mark.tails[1] != (mark.committed, mark.committed):
                bad.append(mark)

    t = threading.Thread(target=read)
    t.start()
    for i in range(1, 200_000):
        writer.durable(i, 1, i, i)
    stop.set()
    t.join()
    assert not bad and reader.read().committed == 199_999
    writer.close()
    writer2 = WatermarkWriter(tmp_path / FILE_NAME, 3, 5)  # a restarted writer: readers wait
    assert reader.read().generation == 0 and reader.read().counter > 199_999 * 2
    writer2.close()
    reader.close()
    assert os.path.getsize(tmp_path / FILE_NAME) == 48 + 3 * 16 + 8


def test_a_watermark_reading_whose_fields_do_not_match_its_crc_is_not_taken(tmp_path):
    """What a reader on a core that sees the writer's stores out of order could read (ARM: the
    counter's final store before a field's): an even, unchanged counter over fields that do not
    belong together. The CRC tells: such a reading is not taken."""
    import mmap
    import struct

    writer = WatermarkWriter(tmp_path / FILE_NAME, 2, 5)
    writer.publish_all(1, 10, [(0, 100), (0, 200)])
    reader = WatermarkReader(tmp_path / FILE_NAME)
    assert reader.read().committed == 10
    with open(tmp_path / FILE_NAME, "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        struct.pack_into("<Q", mm, 32, 11)  # committed moved, its CRC not (yet) visible
        assert reader.read(tries=5) is None
    writer.durable(11, 0, 0, 150)  # the writer's next complete update is taken
    assert reader.read().committed == 11 and reader.read().tails == ((0, 150), (0, 200))
    writer.close()
    reader.close()
