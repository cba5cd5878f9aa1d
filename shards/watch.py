"""Watch: committed changes to watchers, in revision order, across shards.

The store hands the hub every committed revision's changes as the committed
watermark advances (``notify``).  A watcher is either

* **synced** — it has been sent everything up to the committed revision and
  receives each new committed batch as it happens; or
* **unsynced** — it is behind (a past ``start_revision``, or its stream's
  outbox was full): its stream's catch-up task reads its history from the
  shards' RocksDB rows, whose keys sort by revision, in bounded batches, and
  marks it synced — with no await between the last history read and the
  switch, so there is no gap and no duplicate.

Each stream has one outbox (a deque of messages) that the gRPC layer drains.
The outbox is bounded by the number of events it holds and by their bytes: a
watcher whose stream is full becomes unsynced rather than buffering without
limit, and catches up from the store once the reader drains it, in batches
bounded the same way (whole revisions, at least one).  A progress request is answered
only when every watcher on the stream is synced, so its revision is never
ahead of an event still to be sent on that stream.
"""
from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from proto.kv_pb2 import KeyValue

from .read import normalize_end
from .record import DELETE, PUT, Change, deleted_kv
from .revision import entry_bound, entry_main, first_row_key

if TYPE_CHECKING:
    from .store import Store

logger = logging.getLogger(__name__)

NOTIFY_STEP = 1024  # changes matched against the watchers between two looks at the clock

FILTER_NOPUT, FILTER_NODELETE = 0, 1
PROGRESS_WATCH_ID = -1  # progress responses for a whole stream carry watch id -1

ERR_DUPLICATE_ID = "mvcc: duplicate watch ID provided on the WatchStream"
ERR_EMPTY_RANGE = "mvcc: watcher range is empty"


@dataclass(slots=True)
class Event:
    kind: int  # PUT / DELETE (mvccpb.Event.EventType)
    kv: bytes
    prev_kv: bytes | None = None
    encoded: bytes | None = None  # the gRPC layer's encoding, shared by every watcher sent this event
    field: bytes | None = None  # the same as a WatchResponse's events field (the gRPC layer's, shared too)
    size: int = 0  # bytes of kv and prev_kv, what an outbox's byte bound counts


@dataclass(slots=True)
class Message:
    """One response on a watch stream (the gRPC layer encodes it)."""

    watch_id: int
    revision: int
    events: list[Event] = field(default_factory=list)
    created: bool = False
    canceled: bool = False
    compact_revision: int = 0
    cancel_reason: str = ""
    fragment: bool = False  # the watcher asked for fragmentation of large responses
    size: int = 0  # its events' bytes (Event.size), set when it is put in an outbox


@dataclass(frozen=True, slots=True)
class WatchSpec:
    key: bytes
    range_end: bytes = b""
    start_revision: int = 0
    watch_id: int = 0
    prev_kv: bool = False
    progress_notify: bool = False
    fragment: bool = False
    filters: tuple[int, ...] = ()


class Watcher:
    __slots__ = ("id", "stream", "key", "end", "prev_kv", "progress_notify", "fragment",
                 "no_put", "no_delete", "min_rev", "next_rev", "synced", "sids", "sent_since_tick", "ended")

    def __init__(self, wid: int, stream: WatchStream, spec: WatchSpec, key: bytes, next_rev: int, sids: list[int]) -> None:
        self.id = wid
        self.stream = stream
        self.key = key
        self.end = normalize_end(spec.range_end)  # None: one key; b"": unbounded
        self.prev_kv = spec.prev_kv
        self.progress_notify = spec.progress_notify
        self.fragment = spec.fragment
        self.no_put = FILTER_NOPUT in spec.filters
        self.no_delete = FILTER_NODELETE in spec.filters
        self.min_rev = next_rev
        self.next_rev = next_rev
        self.synced = False
        self.sids = sids
        self.sent_since_tick = False
        # cancelled by the server (compacted history, or cut on a follower's resync): it gets
        # nothing more, but, as in etcd, keeps its id on the stream until the client cancels it
        # (a create reusing the id is a duplicate; the client's cancel is answered)
        self.ended = False

    def matches(self, key: bytes) -> bool:
        if self.end is None:
            return key == self.key
        return self.key <= key and (not self.end or key < self.end)

    def wants(self, kind: int) -> bool:
        return not (self.no_put if kind == PUT else self.no_delete)


def _first_rev(start_revision: int, committed: int, compact_rev: int) -> int:
    """The first revision a new watcher wants.  As etcd 3.5.1, a negative start
    is a watcher behind all history: below ``compact_rev`` (etcd's
    compactMainRev, -1 before any compaction) it is kept so that catch-up
    cancels it as compacted; otherwise (-1, never compacted) it watches from
    now, as etcd once its next sync finds no rows below 0."""
    if start_revision > 0 or start_revision < min(compact_rev, 0):
        return start_revision
    return committed + 1


class WatchStream:
    """One client stream: its watchers and its outbox."""

    def __init__(self, hub: WatchHub) -> None:
        self.hub = hub
        self.watchers: dict[int, Watcher] = {}
        self.outbox: deque[Message] = deque()
        self.outbox_events = 0
        self.outbox_bytes = 0
        self.unsynced: set[Watcher] = set()
        self.progress_wanted = False
        self.closed = False
        self._next_id = 0
        self._ready = asyncio.Event()  # outbox has messages (or stream closed)
        self._drained = asyncio.Event()  # outbox below the low-water mark
        self._drained.set()
        self._room = asyncio.Event()  # outbox holds few enough messages to take more requests
        self._room.set()
        # _room and _drained cleared (set again once the outbox is down to half): get() looks at
        # these flags, not at the events, for each message it takes
        self._no_room = self._backlog = False
        self._catchup: asyncio.Task | None = None

    # -- requests -------------------------------------------------------

    def create(self, spec: WatchSpec) -> None:
        """etcd's order: key "" means "\\0"; an empty range is refused before an
        id is taken; watch id 0 asks for the next free id; a taken id is refused."""
        hub = self.hub
        rev = hub.store.committed
        key = spec.key or b"\x00"
        end = normalize_end(spec.range_end)
        if end and key >= end:
            self.put(Message(-1, rev, created=True, canceled=True, cancel_reason=ERR_EMPTY_RANGE))
            return
        wid = spec.watch_id
        if wid == 0:
            while self._next_id in self.watchers:
                self._next_id += 1
            wid = self._next_id
            self._next_id += 1
        elif wid in self.watchers:
            self.put(Message(-1, rev, created=True, canceled=True, cancel_reason=ERR_DUPLICATE_ID))
            return
        next_rev = _first_rev(spec.start_revision, rev, hub.store.compact_rev)
        if end is None:
            sids = [hub.store.router.shard_for_key(key)]
        else:
            sids = hub.store.router.shards_for_range(key, end)
        w = Watcher(wid, self, spec, key, next_rev, sids)
        self.watchers[wid] = w
        self.put(Message(wid, rev, created=True))
        if next_rev > rev:
            hub.add_synced(w)
        else:
            self.unsynced.add(w)
            self._start_catchup()

    def cancel(self, wid: int) -> None:
        w = self.watchers.pop(wid, None)
        if w is None:
            return
        self.hub.remove(w)
        self.unsynced.discard(w)
        self.put(Message(wid, self.hub.store.committed, canceled=True))
        self._maybe_progress()

    def request_progress(self) -> None:
        self.progress_wanted = True
        self._maybe_progress()

    def _maybe_progress(self) -> None:
        if self.progress_wanted and not self.unsynced:
            self.progress_wanted = False
            self.put(Message(PROGRESS_WATCH_ID, self.hub.sent_through))

    # -- outbox ---------------------------------------------------------

    def put(self, msg: Message) -> None:
        if self.closed:
            return
        outbox = self.outbox
        outbox.append(msg)
        queued = len(outbox)
        if queued == 1:  # get() waits only on an empty outbox
            self._ready.set()
        elif queued >= self.hub.outbox_messages_max:
            self._room.clear()
            self._no_room = True
        events = msg.events
        if events:
            n = len(events)
            hub = self.hub
            self.outbox_events += n
            hub.events_queued += n
            msg.size = size = events[0].size if n == 1 else sum(e.size for e in events)
            self.outbox_bytes += size
            if self.outbox_events >= hub.outbox_events_max or self.outbox_bytes >= hub.outbox_bytes_max:
                self._drained.clear()
                self._backlog = True

    async def wait_room(self) -> None:
        """Back-pressure for a client that sends requests but does not read the
        answers: wait while its outbox is full (the requests then stay in
        gRPC's flow-controlled buffers, not in this process's memory)."""
        await self._room.wait()

    @property
    def full(self) -> bool:
        return self.outbox_events >= self.hub.outbox_events_max or self.outbox_bytes >= self.hub.outbox_bytes_max

    async def get(self) -> Message | None:
        """Next message to send; None once the stream is closed."""
        while not self.outbox:
            if self.closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        msg = self.outbox.popleft()
        if self._no_room and len(self.outbox) <= self.hub.outbox_messages_max // 2:
            self._no_room = False
            self._room.set()
        if msg.events:
            self.outbox_events -= len(msg.events)
            self.outbox_bytes -= msg.size
            if self._backlog and self.outbox_events <= self.hub.outbox_events_max // 2 \
                    and self.outbox_bytes <= self.hub.outbox_bytes_max // 2:
                self._backlog = False
                self._drained.set()
        return msg

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for w in self.watchers.values():
            self.hub.remove(w)
        self.watchers.clear()
        self.unsynced.clear()
        self.outbox.clear()
        self._ready.set()
        self._drained.set()
        self._room.set()
        if self._catchup is not None:
            self._catchup.cancel()
        self.hub.streams.discard(self)

    # -- falling behind and catching up ---------------------------------

    def fall_behind(self, w: Watcher) -> None:
        """The outbox is full: stop live delivery; catch up from the store later."""
        self.hub.remove(w)
        self.unsynced.add(w)
        self._start_catchup()

    def _start_catchup(self) -> None:
        if self._catchup is None or self._catchup.done():
            self._catchup = asyncio.get_running_loop().create_task(self._catch_up())

    async def _catch_up(self) -> None:
        hub = self.hub
        try:
            while self.unsynced and not self.closed:
                await self._drained.wait()
                for w in list(self.unsynced):
                    if self.closed or self.full:
                        break
                    hub.catch_up(w)
                self._maybe_progress()
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("watch catch-up failed")
            self.close()


class WatchHub:
    def __init__(self, store: Store, outbox_events_max: int = 1000, catchup_revs_max: int = 1000,
                 outbox_messages_max: int = 1000, outbox_bytes_max: int = 64 << 20) -> None:
        self.store = store
        self.outbox_events_max = outbox_events_max
        # a stream not read holds at most this many bytes of events (more than it only when one
        # message is larger): 64 MiB is ~40 of the largest values a request may carry, where
        # etcd's stream holds up to 128 responses unsent before its watchers fall behind
        self.outbox_bytes_max = outbox_bytes_max
        self.outbox_messages_max = outbox_messages_max  # past it, a stream stops reading requests
        self.catchup_revs_max = catchup_revs_max
        self.streams: set[WatchStream] = set()
        self._by_key: dict[bytes, set[Watcher]] = {}
        self._ranges: list[set[Watcher]] = [set() for _ in store.states]
        self._count = 0
        self.events_queued = 0  # events put in outboxes, every watcher's (etcd_debugging_mvcc_events_total)
        # committed changes waiting to be delivered in slices (notify): (changes, last revision)
        self._queue: deque[tuple[list[tuple[int, int, Change]], int]] = deque()
        self._delivering: asyncio.Task | None = None

    def open_stream(self) -> WatchStream:
        s = WatchStream(self)
        self.streams.add(s)
        return s

    @property
    def active(self) -> bool:
        """Is any watcher waiting for live events?"""
        return self._count > 0

    def range_watchers(self, sid: int) -> int:
        return len(self._ranges[sid])

    @property
    def watcher_count(self) -> int:
        return sum(len(s.watchers) for s in self.streams)

    @property
    def unsynced_count(self) -> int:
        """Watchers behind the committed revision (etcd's slow watchers: its unsynced and victims)."""
        return sum(len(s.unsynced) for s in self.streams)

    @property
    def pending_events(self) -> int:
        """Events in outboxes, not yet taken by the gRPC layer to be sent."""
        return sum(s.outbox_events for s in self.streams)

    # -- the synced index -----------------------------------------------

    def add_synced(self, w: Watcher) -> None:
        w.synced = True
        self._count += 1
        if w.end is None:
            self._by_key.setdefault(w.key, set()).add(w)
        else:
            for sid in w.sids:
                self._ranges[sid].add(w)

    def remove(self, w: Watcher) -> None:
        if not w.synced:
            return
        w.synced = False
        self._count -= 1
        if w.end is None:
            group = self._by_key.get(w.key)
            if group is not None:
                group.discard(w)
                if not group:
                    del self._by_key[w.key]
        else:
            for sid in w.sids:
                self._ranges[sid].discard(w)

    # -- live delivery --------------------------------------------------

    def notify(self, changes: list[tuple[int, int, Change]], last: int) -> None:
        """Revisions up to ``last`` were committed; ``changes`` are (rev, sid, change) in order.

        Each change becomes at most two Event objects (with and without
        prev_kv), shared by every watcher it goes to. Many changes at once (a
        DeleteRange or a lease revoke of thousands of keys) are delivered by a
        task, NOTIFY_STEP changes between two looks at the clock, the event loop
        serving others between slices; later revisions queue behind them."""
        if self._queue or len(changes) > NOTIFY_STEP:
            if self._count or self._queue:
                self._enqueue(changes, last)
            return
        if not self._count:
            return
        batches: dict[Watcher, list[Event] | None] = {}  # None: fell behind in this batch
        self._match(batches, changes)
        self._send_batches(batches, last)

    def _send_batches(self, batches: dict[Watcher, list[Event] | None], last: int) -> None:
        for w, events in batches.items():
            if not w.synced:  # cancelled, or its stream closed, while a queued delivery's batch was made
                continue
            if events is None:
                w.stream.fall_behind(w)
            elif events:
                self._send(w, last, events)

    def _match(self, batches: dict[Watcher, list[Event] | None], changes: list[tuple[int, int, Change]]) -> None:
        """Each change's events into the batches of the synced watchers it goes to."""
        by_key, ranges = self._by_key, self._ranges
        for rev, sid, change in changes:
            key = change.key
            shared: list[Event | None] = [None, None]  # [without prev_kv, with prev_kv]
            for w in ranges[sid]:
                if w.matches(key):
                    self._deliver(batches, w, rev, change, shared)
            targets = by_key.get(key)
            if targets:
                for w in targets:
                    self._deliver(batches, w, rev, change, shared)

    @property
    def sent_through(self) -> int:
        """Every synced watcher has been handed the events of every revision up to this one:
        the committed revision, or the last before those still queued for delivery."""
        return self._queue[0][0][0][0] - 1 if self._queue else self.store.committed

    def _enqueue(self, changes: list[tuple[int, int, Change]], last: int) -> None:
        store = self.store
        if not changes:  # nothing to deliver of these revisions, but after the queue's
            changes = [(last, -1, None)]
        self._queue.append((changes, last))
        # the previous rows of the changes (prev_kv) are read as they are delivered: compaction
        # must not pass the revision before the first of them meanwhile (as a sliced read's hold)
        store.hold_compaction(changes[0][0] - 1)
        if self._delivering is None:
            self._delivering = asyncio.get_running_loop().create_task(self._deliver_queued())

    async def _deliver_queued(self) -> None:
        store = self.store
        queue = self._queue
        try:
            while queue:
                changes, last = queue[0]
                batches: dict[Watcher, list[Event] | None] = {}
                if changes[0][2] is not None:
                    deadline = time.perf_counter() + store.config.slice_ms / 1000
                    for i in range(0, len(changes), NOTIFY_STEP):
                        self._match(batches, changes[i:i + NOTIFY_STEP])
                        if time.perf_counter() >= deadline:
                            await store._pause()
                            deadline = time.perf_counter() + store.config.slice_ms / 1000
                queue.popleft()
                store.release_compaction(changes[0][0] - 1)
                self._send_batches(batches, last)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("watch delivery failed; closing every watch stream")
            self.close()
        finally:
            self._delivering = None

    def _deliver(self, batches: dict[Watcher, list[Event] | None], w: Watcher, rev: int, change: Change,
                 shared: list[Event | None]) -> None:
        if rev < w.next_rev:  # before it was created, or caught up from the store past rev meanwhile
            return
        if w in batches:
            events = batches[w]
            if events is None:
                return
        elif (stream := w.stream).outbox_events >= self.outbox_events_max \
                or stream.outbox_bytes >= self.outbox_bytes_max:  # the stream is full
            batches[w] = None
            w.next_rev = rev  # everything before rev was delivered
            return
        else:
            events = batches[w] = []
        if not (w.no_put if change.kind == PUT else w.no_delete):  # w.wants(change.kind)
            i = int(w.prev_kv)
            ev = shared[i]
            if ev is None:
                ev = shared[i] = self._event(w, rev, change.key, change.kind, change.row)
            events.append(ev)

    def _send(self, w: Watcher, header_rev: int, events: list[Event]) -> None:
        """Events to ``w``'s stream (live or caught up). etcd reads each previous value a prev_kv
        watcher is sent (not for a key's creation): a range each, in its etcd_mvcc_range_total."""
        if w.prev_kv:
            self.store.counts.ranges += sum(1 for ev in events if ev.kind == DELETE or ev.prev_kv is not None)
        w.stream.put(Message(w.id, header_rev, events, fragment=w.fragment))
        w.sent_since_tick = True

    def _event(self, w: Watcher, rev: int, key: bytes, kind: int, row: bytes) -> Event:
        if kind == DELETE:  # tombstone rows hold the key alone; events carry the revision
            row = deleted_kv(key, rev)
        prev = None
        if w.prev_kv:
            state = self.store.states[self.store.router.shard_for_key(key)]
            e = state.prev_entry_of_put(key, rev) if kind == PUT else state.entry_at(key, rev - 1)
            if e is not None:
                prev = state.get_row(e)
                return Event(kind, row, prev, size=len(row) + len(prev))
        return Event(kind, row, prev, size=len(row))

    # -- catch-up from the store ----------------------------------------

    def catch_up(self, w: Watcher) -> None:
        """Send ``w`` its next batch of history; mark it synced once current."""
        store = self.store
        stream = w.stream
        if w.next_rev < store.compact_rev:
            w.ended = True
            stream.unsynced.discard(w)
            # etcd leaves this response's header revision unset
            stream.put(Message(w.id, 0, canceled=True, compact_revision=store.compact_rev))
            return
        last = min(store.committed, w.next_rev + self.catchup_revs_max - 1)
        events, last = self.history(w, w.next_rev, last, self.outbox_bytes_max - stream.outbox_bytes)
        if events:
            self._send(w, store.committed, events)
        w.next_rev = last + 1
        if last == store.committed:
            stream.unsynced.discard(w)
            self.add_synced(w)

    def history(self, w: Watcher, first: int, last: int, budget: int) -> tuple[list[Event], int]:
        """Events for ``w`` with revisions first..last, read from shard rows, and the revision
        read up to: once they hold ``budget`` bytes, the revisions after the one being read
        are left for the next batch (a revision's events always go together)."""
        if w.end is None:
            return self._key_history(w, first, last, budget)
        rows: list[tuple[bytes, int]] = []
        lo, hi = first_row_key(first), first_row_key(last + 1)
        for sid in w.sids:
            it = self.store.states[sid].db.iter()
            it.seek(lo)
            while it.valid():
                rk = it.key()
                if rk >= hi:
                    break
                rows.append((rk, sid))
                it.next()
        rows.sort()
        events: list[Event] = []
        size = top = 0  # top: the revision of the last event taken
        for rk, sid in rows:
            rev = int.from_bytes(rk[:8], "big")
            if size >= budget and rev != top and top:
                return events, rev - 1
            kind = DELETE if len(rk) > 16 else PUT
            if not w.wants(kind):
                continue
            row = self.store.states[sid].db[rk]
            key = KeyValue.FromString(row).key
            if w.matches(key):
                ev = self._event(w, rev, key, kind, row)
                events.append(ev)
                size += ev.size
                top = rev
        return events, last

    def _key_history(self, w: Watcher, first: int, last: int, budget: int) -> tuple[list[Event], int]:
        sid = w.sids[0]
        state = self.store.states[sid]
        revs = state.entries(w.key)
        lo, hi = bisect.bisect_left(revs, entry_bound(first - 1)), bisect.bisect_left(revs, entry_bound(last))
        events = []
        size = 0
        for e in revs[lo:hi]:
            if size >= budget and events:  # a key changes once in a revision
                return events, entry_main(e) - 1
            kind = DELETE if e & 1 else PUT
            if w.wants(kind):
                ev = self._event(w, entry_main(e), w.key, kind, state.get_row(e))
                events.append(ev)
                size += ev.size
        return events, last

    # -- a follower's state replaced (resync.py) ---------------------------

    def resynced(self, applied_before: int) -> int:
        """The store's state was rebuilt from a checkpoint; it had been applied up to
        ``applied_before``.  Every watcher goes back to catching up from the new
        state's history, from the revision it had been sent up to: no gap and no
        duplicate where the history is still there, and etcd's compaction cancel
        (at its catch-up) where it is not.  A watcher that was sent revisions the
        new state does not have (a newer writer cut them) is cancelled now.
        Returns how many watchers are behind the compaction or cut."""
        store = self.store
        committed, compact_rev = store.committed, store.compact_rev
        behind = 0
        for stream in list(self.streams):
            for w in list(stream.watchers.values()):
                if w.ended:
                    continue
                if w.synced:
                    self.remove(w)
                    w.next_rev = max(applied_before + 1, w.min_rev)
                sent_top = w.next_rev - 1
                if w.min_rev <= sent_top and sent_top > committed:  # saw revisions that are not in the log
                    behind += 1
                    w.ended = True
                    stream.unsynced.discard(w)
                    stream.put(Message(w.id, 0, canceled=True, compact_revision=max(compact_rev, committed),
                                       cancel_reason="mvcc: required revision has been compacted"))
                elif w.next_rev > committed:
                    stream.unsynced.discard(w)
                    self.add_synced(w)
                else:
                    behind += w.next_rev < compact_rev
                    stream.unsynced.add(w)
            if stream.unsynced:
                stream._start_catchup()
            stream._maybe_progress()
        return behind

    # -- progress -------------------------------------------------------

    def progress_tick(self) -> None:
        """Periodic progress notification for idle synced watchers that asked for it."""
        rev = self.sent_through
        for stream in list(self.streams):
            for w in stream.watchers.values():
                if not w.progress_notify:
                    continue
                if w.synced and not w.sent_since_tick:
                    stream.put(Message(w.id, rev))
                w.sent_since_tick = False

    def close(self) -> None:
        for stream in list(self.streams):
            stream.close()
        if self._delivering is not None:
            self._delivering.cancel()
        for changes, _ in self._queue:
            self.store.release_compaction(changes[0][0] - 1)
        self._queue.clear()
