"""Following a writer's local journal on the same machine: its segment files,
read up to the position the writer publishes (journal/watermark.py).

``LocalFollowLog(writer_data_dir, shard_names)`` stands where a follower
would use ``JetStreamLog``: ``open_journal(name, scratch, follow=True)`` gives
a ``SegmentTail`` on ``<writer_data_dir>/shards/<name>`` with the follow
interface of journal/follow.py.  Nothing under the writer's data dir is ever
written, created or removed.

What a tail hands on is final: frames below its shard's published durable
position, tagged at or below the published committed revision.  Such a
record is never cut by a later writer (its recovery keeps every revision up to
committed and every durable record tagged at or below it), so a local
follower needs no epochs or cut markers: every Message has epoch 0.  A frame
tagged above committed is held (read again next time) until committed passes
it; a writer restart may have replaced it meanwhile.

Segments released by the writer's checkpoints before a tail read them are a
gap: ``on_gap`` decides, as for JetStream.  The tails wake up when a thread
polling the watermark's update counter (one per log, every ``poll_s`` while
it moves, ``idle_poll_s`` once idle) sees it change; inotify cannot see
stores into a shared mapping.
"""
from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Awaitable, Callable, Iterator

from journal.checkpoint import Checkpoint, _list_checkpoints, _load
from journal.config import CheckpointConfig, JournalConfig
from journal.errors import JournalCorrupt, JournalGap, JournalHeadLost, JournalUnreachable
from journal.follow import Message
from journal.fsutil import write_private
from journal.reader import iter_frames
from journal.record import FrameError, Record
from journal.segment import head_lost, list_segments
from journal.watermark import FILE_NAME, Mark, WatermarkReader

logger = logging.getLogger(__name__)

POLL_S = 0.001  # how often the watermark is looked at while it moves
IDLE_POLL_S = 0.005  # and once it has not for IDLE_AFTER_S
IDLE_AFTER_S = 0.5
WRITER_FILE = "writer.json"  # where the writer serves clients (shim/follower.writer_record)
READ_ROUND_BYTES = 4 * 1024 * 1024  # at most this much segment data per read, so the loop keeps turning
WAIT_LOG_S = 10.0
WRITER_WAIT_S = 30.0  # how long a follower waits for the writer's data dir to be made
STALE_TTLS = 10  # a member entry (or directory of them) not written for this many TTLs is tidied away


class LocalMembers:
    """Who serves a writer's local journal: the ``announce``/``announced`` of a members bucket
    (shim/members.Registry), as files in a directory of the machine's tmpfs named after the
    writer's data dir (the followers write there, never into that data dir); an entry lapses
    ``ttl_s`` after its file was last written."""

    def __init__(self, writer_data_dir: Path) -> None:
        root = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
        tag = hashlib.sha256(str(Path(writer_data_dir).absolute()).encode()).hexdigest()[:12]
        self.prefix = f"shardetcd-{os.getuid()}-members-"  # every writer's directory, this one ends in its tag
        self.directory = root / f"{self.prefix}{tag}"
        self._swept = False

    async def announce(self, key: str, value: str, ttl_s: float) -> None:
        if not self._swept:
            self._swept = True
            sweep_members(self.directory.parent, self.prefix, STALE_TTLS * ttl_s)
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".{key}.tmp"
        write_private(tmp, value.encode())
        os.replace(tmp, self.directory / key)

    async def announced(self, prefix: str, ttl_s: float) -> list[str]:
        out = []
        now = time.time()
        for path in self.directory.glob(f"{prefix}*") if self.directory.is_dir() else ():
            try:
                if now - path.stat().st_mtime <= ttl_s:
                    out.append(path.read_text())
                elif now - path.stat().st_mtime > STALE_TTLS * ttl_s:
                    path.unlink()  # long gone: tidy up
            except FileNotFoundError:
                pass
        return out

    def withdraw(self, key: str) -> None:
        """A clean stop: this member's entry goes at once, and the directory with the last one."""
        (self.directory / key).unlink(missing_ok=True)
        try:
            self.directory.rmdir()
        except OSError:  # others still announce there (or it is gone already)
            pass


def sweep_members(root: Path, prefix: str, stale_s: float) -> int:
    """Remove the member directories under ``root`` named ``prefix*`` in which no entry was
    written for ``stale_s`` (every member rewrites its entry well within its TTL): those of
    members that were killed, whose entries a clean stop would have withdrawn. Returns how
    many went."""
    now, gone = time.time(), 0
    for directory in root.glob(f"{prefix}*"):
        try:
            if now - directory.stat().st_mtime <= stale_s:  # an entry made or replaced there lately
                continue
            entries = list(directory.iterdir())
            if any(now - e.stat().st_mtime <= stale_s for e in entries):
                continue
            for e in entries:
                e.unlink(missing_ok=True)
            directory.rmdir()
            gone += 1
        except OSError:  # a member announcing there meanwhile, or another sweep: leave it
            continue
    return gone


def write_writer_file(data_dir: Path, record: str) -> None:
    """The writer's own: where it serves clients, for followers reading its data dir."""
    tmp = Path(data_dir) / (WRITER_FILE + ".tmp")
    write_private(tmp, record.encode())  # private as the journals beside it (it holds the writer's secret)
    os.replace(tmp, Path(data_dir) / WRITER_FILE)


class LocalFollowLog:
    """The journals of the writer whose data dir is ``data_dir``, read-only."""

    def __init__(self, data_dir: Path, shard_names: list[str], poll_s: float = POLL_S,
                 idle_poll_s: float = IDLE_POLL_S) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.shard_names = list(shard_names)
        self.poll_s = poll_s
        self.idle_poll_s = idle_poll_s
        self.reader: WatermarkReader | None = None
        self.tails: list[SegmentTail] = []
        self._poller: threading.Thread | None = None
        self._polling = False
        self._checked = False
        self.members = LocalMembers(self.data_dir)

    async def _check_writer(self) -> None:
        """The writer's data dir holds the same shards in a local journal; a writer starting now
        (``shardetcd cluster`` starts writers and followers together) is waited for, a while."""
        if self._checked:
            return
        if self.data_dir.exists() and not self.data_dir.is_dir():
            raise JournalUnreachable(f"{self.data_dir} is not a directory: --follow-data-dir names the "
                                     "writer's --data-dir")
        waited = time.monotonic()
        while not (self.data_dir / "meta.json").exists():
            if time.monotonic() - waited > WRITER_WAIT_S:
                raise JournalUnreachable(f"{self.data_dir} is not a shardetcd data dir (no meta.json after "
                                         f"{WRITER_WAIT_S:.0f} s): --follow-data-dir names the writer's --data-dir")
            await asyncio.sleep(0.1)
        meta = self.writer_meta()
        if meta.get("shards") != self.shard_names:
            raise JournalUnreachable(f"the writer's data dir {self.data_dir} has shards {meta.get('shards')}, "
                                     f"this follower's layout {self.shard_names}: start it with the writer's "
                                     "--shard-layout (or --cluster-layout and --partition)")
        if meta.get("journal", "local") != "local":
            raise JournalUnreachable(f"the writer's data dir {self.data_dir} keeps its journal in "
                                     f"{meta['journal']}: follow it with --journal-url")
        self._checked = True

    def writer_meta(self) -> dict:
        try:
            return json.loads((self.data_dir / "meta.json").read_text())
        except (OSError, ValueError) as exc:
            raise JournalUnreachable(f"cannot read {self.data_dir / 'meta.json'}: {exc}") from None

    async def open_journal(self, name: str, scratch: Path, config: JournalConfig = JournalConfig(),
                           follow: bool = True) -> SegmentTail:
        if not follow:
            raise ValueError("a writer's local journal is only followed from another process")
        await self._check_writer()
        tail = SegmentTail(self, self.shard_names.index(name), self.data_dir / "shards" / name, config)
        self.tails.append(tail)
        return tail

    # -- what WriterLink and Store.open ask a log ------------------------------

    async def get_meta(self, key: str) -> str | None:
        """Where the writer serves clients (any ``writer-urls.*`` key: a data dir has one writer)."""
        try:
            return (self.data_dir / WRITER_FILE).read_text()
        except FileNotFoundError:
            return None

    async def announce(self, key: str, value: str, ttl_s: float) -> None:
        await self.members.announce(key, value, ttl_s)

    async def announced(self, prefix: str, ttl_s: float) -> list[str]:
        return await self.members.announced(prefix, ttl_s)

    def withdraw(self, key: str) -> None:
        self.members.withdraw(key)

    async def agree(self, key: str, proposal: str) -> str:
        """The cluster's id is the writer's."""
        await self._check_writer()
        return str(self.writer_meta()["cluster_id"])

    # -- the watermark ---------------------------------------------------------

    async def mark(self) -> Mark:
        """The watermark once the writer has published one (it may be starting)."""
        waited = time.monotonic()
        logged = waited
        while True:
            if self.reader is None:
                try:
                    self.reader = WatermarkReader(self.data_dir / FILE_NAME)
                except (FileNotFoundError, ValueError):
                    pass
            found = self.reader.read() if self.reader is not None else None
            if found is not None and found.generation:
                return found
            if time.monotonic() - logged >= WAIT_LOG_S:
                logged = time.monotonic()
                logger.warning("waiting for the writer of %s to publish its committed revision seconds=%.0f",
                               self.data_dir, logged - waited)
            await asyncio.sleep(self.idle_poll_s)

    def _start_polling(self) -> None:
        if self._poller is None:
            self._polling = True
            self._poller = threading.Thread(target=self._poll, args=(asyncio.get_running_loop(),),
                                            name="watermark-poll", daemon=True)
            self._poller.start()

    def _poll(self, loop: asyncio.AbstractEventLoop) -> None:
        """In a thread of its own (a quarter of the CPU an asyncio timer loop takes at this rate):
        wake every tail when the watermark's counter changes; poll_s while it moves, idle_poll_s
        once it has not for IDLE_AFTER_S."""
        last, moved = -1, time.monotonic()
        while self._polling:
            counter = self.reader.counter()
            now = time.monotonic()
            if counter != last:
                last, moved = counter, now
                try:
                    loop.call_soon_threadsafe(self._wake_all)
                except RuntimeError:  # the loop is closed
                    return
            time.sleep(self.poll_s if now - moved < IDLE_AFTER_S else self.idle_poll_s)

    def _wake_all(self) -> None:
        for tail in self.tails:
            tail.wake.set()

    async def close(self) -> None:
        if self._poller is not None:
            self._polling = False
            await asyncio.to_thread(self._poller.join)
            self._poller = None
        for tail in self.tails:
            await tail.close()
        if self.reader is not None:
            self.reader.close()
            self.reader = None


class SegmentTail:
    """One shard's segment files, read as the writer makes them durable."""

    following = True
    cuts_seen: tuple = ()  # a local writer's restart cuts nothing a tail hands on

    def __init__(self, log: LocalFollowLog, sid: int, shard_dir: Path, config: JournalConfig) -> None:
        self.log = log
        self.sid = sid
        self.shard_dir = shard_dir
        self.directory = shard_dir / "journal"
        self.name = str(self.directory)
        self.config = config
        self.wake = asyncio.Event()
        self.released_before = False
        self.first_top = 0  # the tag of the first record read
        self.bytes_total = 0  # segment bytes handed on
        self.on_batch = None  # a writer's; never called here
        self._found: list[Record] = []
        self._seq = 0  # the segment being read
        self._offset = 0  # the next frame in it
        self._file = None
        self._path = self.directory
        self._generation = 0
        self._member_id = 0
        self._messages = 0
        self._checkpoint_fd: int | None = None

    # -- checkpoints (the writer's, read in place) -----------------------------

    async def load_checkpoint(self) -> Checkpoint | None:
        """The newest complete checkpoint in the writer's shard dir, held open until close():
        the writer deletes it once it writes a newer one, and its rows are read later."""
        for _ in range(10):
            found = sorted(_list_checkpoints(self.shard_dir), reverse=True) if self.shard_dir.is_dir() else []
            if not found:
                return None
            rev, path = found[0]
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:  # replaced by a newer one meanwhile
                continue
            held = Path(f"/proc/self/fd/{fd}")
            try:
                ckpt = _load(held if held.exists() else path, rev, CheckpointConfig())
            except JournalCorrupt as exc:
                os.close(fd)
                raise JournalCorrupt(path, exc.offset, exc.reason) from None
            self._close_checkpoint()
            self._checkpoint_fd = fd
            return ckpt
        raise JournalUnreachable(f"the checkpoints in {self.shard_dir} keep changing")

    async def newest_checkpoint_rev(self) -> int:
        if not self.shard_dir.is_dir():
            return 0
        return max((rev for rev, _ in _list_checkpoints(self.shard_dir)), default=0)

    def _close_checkpoint(self) -> None:
        if self._checkpoint_fd is not None:
            os.close(self._checkpoint_fd)
            self._checkpoint_fd = None

    # -- catching up and following ---------------------------------------------

    async def catch_up(self) -> None:
        """Everything durable and committed now, from the oldest segment there is."""
        self._found = []
        while True:
            mark = await self.log.mark()
            listed = list_segments(self.directory) if self.directory.is_dir() else []
            if listed and (why := head_lost(self.directory, listed)) is not None:
                raise JournalHeadLost(f"journal {self.directory}: {why}. Refusing to follow it: a follower would "
                                      "serve without those records")
            self._seq, self._offset = (listed[0][0] if listed else 0), 0
            self.released_before = self._seq > 0
            self._close_file()
            records: list[Record] = []
            try:
                while True:
                    batch = self._read(mark)
                    if batch is None:  # the round was dropped (the writer restarted, or its watermark could
                        mark = await self.log.mark()  # not be read): those before are final; read on from a new mark
                    elif batch:
                        records += batch
                        await asyncio.sleep(0)
                    else:  # read up to the mark
                        break
                break
            except _Vanished:  # released while being read: start over from the oldest left
                continue
        self._found = records
        self.first_top = records[0].rev if records else 0  # of this read (a start may read again)

    def records(self, after_rev: int = 0) -> Iterator[Record]:
        return (r for r in self._found if r.rev > after_rev)

    def held_records(self) -> tuple[Record, ...]:
        return ()  # what is read is acknowledged already: the writer's published position says so

    def acknowledged_if(self, known) -> None:
        pass  # nothing is held

    @property
    def read_tail(self) -> tuple[int, int]:
        """(segment seq, offset) of the next frame to read: everything before it was handed on."""
        return self._seq, self._offset

    async def stored_tail(self) -> tuple[int, int]:
        """This shard's durable position as the writer publishes it now: what a reader must
        reach (``read_tail``) to have handed on everything stored before this call.  A frame
        tagged above the committed revision is held, so the position is reached once the
        writer commits it; a writer restarting meanwhile publishes its position again."""
        mark = await self.log.mark()
        return mark.tails[self.sid]

    async def follow(self, on_message: Callable[[Message], None],
                     on_gap: Callable[[int, int], Awaitable[bool]]) -> None:
        """Hand on every record as it becomes durable and committed, until cancelled."""
        self._found = []
        self.log._start_polling()
        self.wake.set()
        while True:
            await self.wake.wait()
            self.wake.clear()
            mark = self.log.reader.read()
            if mark is None or not mark.generation:
                continue
            while True:
                try:
                    records = self._read(mark)
                except _Vanished as gone:
                    if not await on_gap(gone.expected, gone.got):
                        raise JournalGap(self.name, gone.expected, gone.got) from None
                    logger.info("journal segments released before read, covered by the checkpoint loaded "
                                "dir=%s expected=%d got=%d", self.directory, gone.expected, gone.got)
                    self._seq, self._offset = gone.got, 0
                    self._close_file()
                    continue
                if not records:
                    break
                self._messages += 1
                on_message(Message(self._messages, 0, tuple(records), top=records[-1].rev))
                await asyncio.sleep(0)

    def _read(self, mark: Mark) -> list[Record] | None:
        """The next records that are durable and committed per ``mark`` (at most a round's worth;
        [] once it is reached). None if the round was dropped: the writer restarted while it was
        read, or its watermark could not be read to tell (an update half-written through every try
        of ``WatermarkReader.read``: its writer was preempted in the middle of one, or died there).
        Read again, from a new mark: a dropped round is not the mark reached, which a second look
        at the watermark cannot tell apart."""
        if mark.member_id != self._member_id:
            if self._member_id:
                raise JournalCorrupt(self.directory, 0, f"the data dir followed now belongs to another member "
                                     f"({mark.member_id:x}, was {self._member_id:x}): restart the follower")
            self._member_id = mark.member_id
        if mark.generation != self._generation:
            self._generation = mark.generation
            self._close_file()  # a restarted writer may have replaced a segment file of that name
        start = (self._seq, self._offset)
        records: list[Record] = []
        nbytes = 0
        tail_seq, tail_len = mark.tails[self.sid]
        while self._seq <= tail_seq and nbytes < READ_ROUND_BYTES:
            raw = self._open()
            if raw is None:
                break
            end = tail_len if self._seq == tail_seq else os.fstat(raw.fileno()).st_size
            held = False
            # a buffer of this round only: one kept would hand a later round the zeros the writer had
            # written ahead of its records (journal/writer.py) where records are now
            f = io.BufferedReader(raw)
            try:
                for frame in iter_frames(f, self._offset, end, self.config.record_bytes_max,
                                         self.config.read_chunk_bytes):
                    if frame.rev > mark.committed:
                        held = True
                        break
                    records.append(Record(frame.rtype, frame.rev, bytes(frame.payload), self._path, frame.offset))
                    self._offset = frame.end
                    nbytes += frame.size
                    if nbytes >= READ_ROUND_BYTES:
                        held = True
                        break
            except FrameError as exc:
                if self._restarted(mark):
                    break
                raise JournalCorrupt(self._path, exc.offset, f"{exc.reason} (below the writer's durable "
                                     f"position {end})") from None
            finally:
                f.detach()
            if held or self._seq == tail_seq:
                break
            self._seq, self._offset = self._seq + 1, 0  # the writer went on to the next segment: this one is whole
            self._close_file()
        if self._restarted(mark):
            self._seq, self._offset = start
            self._close_file()
            return None
        self.bytes_total += nbytes
        return records

    def _restarted(self, mark: Mark) -> bool:
        """The writer restarted since ``mark`` was read, or its watermark cannot be read to tell."""
        now = self.log.reader.read()
        return now is None or now.generation != mark.generation

    def _open(self):
        """The segment being read, opened by its seq; None while it does not exist yet;
        _Vanished if the writer released it (a later one exists)."""
        if self._file is not None:
            return self._file
        listed = list_segments(self.directory) if self.directory.is_dir() else []
        for seq, path in listed:
            if seq == self._seq:
                try:
                    self._file = open(path, "rb", buffering=0)  # read through a buffer per round (_read)
                except FileNotFoundError:
                    break
                self._path = path
                return self._file
        later = [seq for seq, _ in listed if seq > self._seq]
        if later:
            raise _Vanished(self._seq, later[0])
        return None

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    async def close(self) -> None:
        self._close_file()
        self._close_checkpoint()


class _Vanished(Exception):
    """The segment to read next is gone (released after a checkpoint); ``got``: the oldest left."""

    def __init__(self, expected: int, got: int) -> None:
        super().__init__(expected, got)
        self.expected = expected
        self.got = got
