"""Watchers for tests/chaos.py, and the check that what they saw is one history.

On every member, one watch stream with a watcher on each of a round's keys, from the revision
the round began at. The stream is kept through the member's faults as a client library keeps
it: when it breaks it is opened again, each watcher from the revision after its last event;
when a watcher is cancelled with etcd's compaction answer it is created again from the
compaction revision (the revisions between are lost to it, a *gap*). Every half second the
stream asks for a progress notification (as kube-apiserver's watch cache does before a
consistent read from it): once one says revision R, no watcher created before it may get an
event at R or below. After the round a last put on each key (the *fence*) must reach every
watcher.

Then, key by key (``check_watches``): each watcher's events come in increasing revisions, one
per revision; two watchers never tell different events at one revision; no watcher misses an
event another saw at a revision it covered (outside its gaps); every put event carries a value
some client put (each value once), and, when some watcher has no gap, every acknowledged put's
value is among the events; an event's prev_kv, when there is one (etcd leaves it out when
compaction took it), is the state the watcher's event before left; and the key's state a
watcher's events end in before the fence is what the members serve.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field

import grpc

from proto import kv_pb2, rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests import chaos_auth

FENCE = b"fence"
PROGRESS_EVERY_S = 0.5
PROGRESS_ID = -1  # the watch id of a progress notification for a whole stream


@dataclass
class Seen:
    """What one member's watcher on one key saw."""
    member: str
    key: bytes
    events: list[tuple[int, str, bytes]] = field(default_factory=list)  # (revision, PUT or DELETE, value)
    gaps: list[tuple[int, int]] = field(default_factory=list)  # first and last revision lost to a compaction
    prevs: dict[int, tuple[bytes, int]] = field(default_factory=dict)  # an event's prev_kv (value, mod revision)
    problems: list[str] = field(default_factory=list)  # out of order, cancelled for another reason

    def covers(self, rev: int) -> bool:
        return not any(a <= rev <= b for a, b in self.gaps)


class MemberWatch:
    """One member's watch stream on ``keys`` from ``start_rev``, reopened until ``close``."""

    def __init__(self, member: str, endpoint: str, keys: list[bytes], start_rev: int) -> None:
        self.member, self.endpoint = member, endpoint
        self.seen = {k: Seen(member, k) for k in keys}
        self.next = dict.fromkeys(keys, start_rev)  # each watcher's next revision to see
        self.opened = 0
        self.progress = 0  # progress notifications received
        self.failure: BaseException | None = None  # the watcher itself failed
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._call = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    self._stream()
                except grpc.RpcError:
                    pass  # the member is down or restarting: open again
                self._stop.wait(0.3)
        except BaseException as exc:
            with self._cond:
                self.failure = exc
                self._cond.notify_all()
            raise

    def _stream(self) -> None:
        with chaos_auth.channel(self.endpoint) as channel:
            requests: queue.Queue = queue.Queue()
            call = self._call = pbg.WatchStub(channel).Watch(iter(requests.get, None))
            if self._stop.is_set():
                return
            creating: list[bytes] = []  # creates are answered in the order they were sent
            ids: dict[int, bytes] = {}
            floor: dict[bytes, int] = {}  # per key: the stream's latest progress revision since its watcher was created
            ended = threading.Event()

            def ask_progress() -> None:  # as kube-apiserver's watch cache does, for consistent reads
                while not ended.wait(PROGRESS_EVERY_S):
                    requests.put(pb.WatchRequest(progress_request=pb.WatchProgressRequest()))

            def create(key: bytes) -> None:
                creating.append(key)
                requests.put(pb.WatchRequest(create_request=pb.WatchCreateRequest(
                    key=key, start_revision=self.next[key], prev_kv=True)))

            for key in self.seen:
                create(key)
            threading.Thread(target=ask_progress, daemon=True).start()
            try:
                for n, r in enumerate(call):
                    self.opened += n == 0  # a stream the member answered
                    if r.watch_id == PROGRESS_ID and not (r.created or r.canceled or r.events):
                        # every event up to here was sent, to every watcher of the stream
                        floor.update(dict.fromkeys(ids.values(), r.header.revision))
                        self.progress += 1
                        continue
                    if r.created and r.canceled and r.cancel_reason == chaos_auth.WATCH_INVALID_TOKEN:
                        # a member that lost the stream's token (a restart): a new stream, with a new
                        # token, as a client library does (etcd >= 3.5.6 says why)
                        chaos_auth.stream_token_refused(self.endpoint)
                        return
                    if r.created:
                        ids[r.watch_id] = creating.pop(0)
                        floor[ids[r.watch_id]] = 0
                    key = ids.get(r.watch_id)
                    if key is None:
                        continue
                    with self._cond:
                        self._take(key, r, floor.get(key, 0))
                        self._cond.notify_all()
                    if r.canceled and r.compact_revision:
                        create(key)
            finally:
                ended.set()
                requests.put(None)

    def _take(self, key: bytes, r: pb.WatchResponse, progress: int = 0) -> None:
        """An answer to the watcher on ``key``, the stream's latest progress notification since
        it was created at revision ``progress``."""
        seen = self.seen[key]
        for ev in r.events:
            rev = ev.kv.mod_revision
            if rev < self.next[key]:
                seen.problems.append(f"event at {rev} after the watcher was at {self.next[key]}")
            if rev <= progress:
                seen.problems.append(f"event at {rev} after a progress notification at {progress}")
            seen.events.append((rev, "DELETE" if ev.type == kv_pb2.Event.DELETE else "PUT", ev.kv.value))
            if ev.HasField("prev_kv"):
                seen.prevs[rev] = (ev.prev_kv.value, ev.prev_kv.mod_revision)
            self.next[key] = max(self.next[key], rev + 1)
        if r.canceled:
            if r.compact_revision:
                if r.compact_revision > self.next[key]:
                    seen.gaps.append((self.next[key], r.compact_revision - 1))
                    self.next[key] = r.compact_revision
            else:
                seen.problems.append(f"cancelled: {r.cancel_reason!r}")

    def wait_through(self, key: bytes, rev: int, timeout: float) -> bool:
        """Whether the watcher on ``key`` got past ``rev`` within ``timeout``."""
        with self._cond:
            self._cond.wait_for(lambda: self.next[key] > rev or self.seen[key].problems or self.failure, timeout)
            if self.failure is not None:
                raise AssertionError(f"{self.member}'s watch stream failed") from self.failure
            return self.next[key] > rev or bool(self.seen[key].problems)

    def close(self) -> None:
        self._stop.set()
        if self._call is not None:
            self._call.cancel()
        self._thread.join(10)


def written(history: list, key: bytes) -> tuple[set[bytes], set[bytes]]:
    """Values put on ``key`` in a round's client history: (acknowledged, maybe applied)."""
    acked, maybe = set(), set()
    for k, op in history:
        if k != key or op.kind not in ("put", "cas"):
            continue
        value = (op.arg if op.kind == "put" else op.arg[1]).encode()
        if op.out is None:  # outcome unknown
            maybe.add(value)
        elif op.kind == "put" or op.out is True:
            acked.add(value)
    return acked, acked | maybe


def check_watches(seen: list[Seen], start_rev: int, fence_rev: int, served: list, history: list) -> int:
    """The watchers of one key (one per member) against each other, the clients' history and
    ``served``, the key's [(value, mod revision)] on every member before the fence; how many
    revisions the watchers told of."""
    key = seen[0].key
    at: dict[int, tuple[str, bytes, str]] = {}
    for s in seen:
        assert not s.problems, f"{s.member}'s watcher on {key!r}: {s.problems}"
        revs = [rev for rev, _, _ in s.events]
        assert revs == sorted(set(revs)), f"{s.member}'s watcher on {key!r}: revisions {revs}"
        assert not revs or revs[0] >= start_rev, f"{s.member}'s watcher on {key!r} began at {revs[0]} < {start_rev}"
        for rev, kind, value in s.events:
            other = at.setdefault(rev, (kind, value, s.member))
            assert other[:2] == (kind, value), f"on {key!r} at {rev}: {s.member} saw {kind} {value!r}, " \
                                               f"{other[2]} saw {other[0]} {other[1]!r}"
    assert at.get(fence_rev, (None, None))[:2] == ("PUT", FENCE), f"the fence on {key!r} at {fence_rev}: {at.get(fence_rev)}"
    for s in seen:
        own = {rev for rev, _, _ in s.events}
        missed = sorted(rev for rev in at if start_rev <= rev <= fence_rev and s.covers(rev) and rev not in own)
        assert not missed, f"{s.member}'s watcher on {key!r} missed revisions {missed} " \
                           f"(seen by {sorted({at[r][2] for r in missed})}; its gaps {s.gaps})"
        state, last = None, start_rev - 1  # the key is new in the round
        for rev, kind, value in s.events:  # prev_kv: the state after the event before, unless a gap hides it
            if rev in s.prevs and not any(last < a <= rev for a, _ in s.gaps):
                assert s.prevs[rev] == state, f"{s.member}'s watcher on {key!r} at {rev}: prev_kv {s.prevs[rev]}, " \
                                              f"its event before left {state}"
            state, last = ((value, rev) if kind == "PUT" else None), rev
        before = [e for e in s.events if e[0] < fence_rev]
        if not any(a > (before[-1][0] if before else start_rev - 1) for a, _ in s.gaps):  # nothing hidden after its last
            ended = [(before[-1][2], before[-1][0])] if before and before[-1][1] == "PUT" else []
            assert ended == served, f"{s.member}'s watcher on {key!r} ended in {ended}, the members serve {served}"
    acked, maybe = written(history, key)
    puts = [value for rev, (kind, value, _) in sorted(at.items()) if kind == "PUT" and rev != fence_rev]
    assert len(puts) == len(set(puts)), f"on {key!r} a value was put twice: {puts}"
    assert set(puts) <= maybe, f"on {key!r} put events of values no client put: {set(puts) - maybe}"
    whole = [s for s in seen if not s.gaps]
    if whole:
        assert acked <= set(puts), f"on {key!r} acknowledged puts no watcher saw: {acked - set(puts)}"
    return len(at)


def watch_report(watches: list[MemberWatch], keys: list[bytes], start_rev: int, fences: dict[bytes, int],
                 view: dict, history: list) -> str:
    """Every key's watchers checked (``check_watches``); a line for the round's log."""
    events = sum(check_watches([w.seen[k] for w in watches], start_rev, fences[k], view[k], history) for k in keys)
    prevs = sum(len(s.prevs) for w in watches for s in w.seen.values())
    progress = sum(w.progress for w in watches)
    return (f"watches agree: {events} events on {len(keys)} keys, {prevs} prev_kvs, {progress} progress notifications; "
            f"per member, streams opened and "
            f"compaction gaps: {', '.join(f'{w.member} {w.opened}/{sum(len(s.gaps) for s in w.seen.values())}' for w in watches)}")
