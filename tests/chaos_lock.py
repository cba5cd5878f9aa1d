"""Locks and elections for tests/chaos.py: etcd's server-side lock (v3lockpb) and election
(v3electionpb), taken again and again through every member while the faults strike, and checked
after.

Through each member a *locker* and a *candidate* use the lease its member's lease keeper keeps
alive (tests/chaos_lease.py) as their session, as a clientv3 concurrency session would. The
locker: Lock, then read the lock's keys at the revision the Lock answer names, then a write
fenced by its own lock key (a Txn comparing the key's create revision, the fencing etcd's lock
documentation asks for), then Unlock. The candidate: Campaign, then Proclaim (itself a write
fenced by the leader key's create revision), then read the election's keys at the Proclaim's
revision (a Campaign answer names its first write's revision, as etcd's does, which may come
before it leads), then Resign. Again until the round ends; a Lock or Campaign call is given no
deadline (as ``etcdctl lock`` and ``elect`` give none): it is cancelled only when the round ends.

Checks (``check_lockers``, for each kind):

* an answer names the key ``<name>/<session lease in hex>``;
* at the revision checked, that key is the oldest (lowest create revision) under ``<name>/``:
  the caller holds the lock or leads, nobody else does (read right after, before the round's
  compaction passes it; a read that could not be made is counted, not judged; one answered with
  "future revision" is a finding: the answer named a revision the member does not have);
* the fenced write made right after succeeds while the lease lives, unless the client's
  previous call failed or was cancelled (etcd then deletes the key that call put, which may be
  the key a later call got: the same lease gives the same key);
* every client through a member the fault did not strike got the lock, or led, at least once.

Through each member also an *observer* keeps an Observe on the election (``Observer``), opened
again whenever it ends, each answer read back (``check_observers``).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import grpc

from proto import (rpc_pb2 as pb, rpc_pb2_grpc as pbg, v3election_pb2 as epb, v3election_pb2_grpc as epbg,
                   v3lock_pb2 as lpb, v3lock_pb2_grpc as lpbg)
from tests import chaos_auth

RETRY_S = 0.3


def prefix_end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


def cancel_until_ended(thread: threading.Thread, call, timeout: float) -> None:
    """Until ``thread`` ends (at most ``timeout``): the call it makes now (``call()``) cancelled,
    again should it begin another meanwhile."""
    deadline = time.monotonic() + timeout
    while thread.is_alive() and time.monotonic() < deadline:
        if (now := call()) is not None:
            now.cancel()
        thread.join(0.2)


def oldest_at(channel: grpc.Channel, name: bytes, revision: int) -> pb.KeyValue | None:
    """The oldest key (lowest create revision) under ``name/`` at ``revision``: who holds the lock,
    or leads; None if there is none."""
    pfx = name + b"/"
    kvs = pbg.KVStub(channel).Range(pb.RangeRequest(
        key=pfx, range_end=prefix_end(pfx), revision=revision, limit=1,
        sort_order=pb.RangeRequest.ASCEND, sort_target=pb.RangeRequest.CREATE), timeout=10).kvs
    return kvs[0] if kvs else None


@dataclass
class Held:
    """One acquisition: the key and revision the Lock answer named, and what was found after."""
    key: bytes
    revision: int
    oldest: bytes | None = None  # the oldest key under the prefix at ``revision``
    read_error: str = ""  # why it could not be read
    fenced: bool | None = None  # the fenced write: succeeded, failed its compare, or None (no answer)
    after_failed_call: bool = False  # the client's call before this one failed or was cancelled
    leader: object = None  # a Campaign's LeaderKey


class Taker:
    """One recipe taken again and again through ``endpoint`` with ``lease`` as the session, until stopped:
    ``_take`` (a call given no deadline), ``_look`` (the checks' reads and fenced write), ``_give_back``."""

    kind = ""  # the call that takes it
    noun = ""  # what the report calls them

    def __init__(self, member: str, endpoint: str, name: bytes, lease: int) -> None:
        self.member, self.endpoint, self.name, self.lease = member, endpoint, name, lease
        self.held: list[Held] = []
        self.errors: list[str] = []
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._call = None
        self.doing = ("", 0.0)  # what its thread does, since when (for a report)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            failed_before = False
            with chaos_auth.channel(self.endpoint) as channel:
                while not self._stop.is_set():
                    self.doing = (self.kind, time.monotonic())
                    held = self._taken(channel)
                    if held is None:
                        failed_before = True
                        self._stop.wait(RETRY_S)
                        continue
                    held.after_failed_call, failed_before = failed_before, False
                    self.held.append(held)
                    self.doing = ("its checks", time.monotonic())
                    self._look(channel, held)
                    try:
                        self.doing = ("giving back", time.monotonic())
                        self._give_back(channel, held)
                    except grpc.RpcError as exc:
                        self.errors.append(f"giving back: {exc.code().name}: {exc.details()}")
        except BaseException as exc:
            self.failure = exc
            raise

    def _taken(self, channel: grpc.Channel) -> Held | None:
        self._call = self._take(channel)
        try:
            return self._held(self._call.result())
        except grpc.FutureCancelledError:  # by stop()
            return None
        except grpc.RpcError as exc:
            self.errors.append(f"{self.kind}: {exc.code().name}: {exc.details()}")
            return None

    def _oldest(self, channel: grpc.Channel, held: Held) -> pb.KeyValue | None:
        """The oldest key under the name at ``held.revision`` (``held.oldest``), None if not read."""
        try:
            oldest = oldest_at(channel, self.name, held.revision)
        except grpc.RpcError as exc:
            held.read_error = f"{exc.code().name}: {exc.details()}"
            return None
        held.oldest = oldest.key if oldest else None
        return oldest

    def stop(self, timeout: float = 45.0) -> None:
        """Until the thread ends: its call cancelled, again should it have begun one as the stop came
        (a Lock or Campaign begun then waits for what nobody gives back any more); a read, a fenced
        write or a give-back under way ends within its 10 s deadline."""
        self._stop.set()
        cancel_until_ended(self._thread, lambda: self._call, timeout)
        what, since = self.doing
        assert not self._thread.is_alive(), f"the {self.kind} client through {self.member} is stuck in {what} " \
            f"for {time.monotonic() - since:.1f} s; last errors: {self.errors[-3:]}"
        if self.failure is not None:
            raise AssertionError(f"the {self.kind} client through {self.member} failed") from self.failure


class Locker(Taker):
    """Lock; the lock's oldest key at the answer's revision; a Txn fenced by the lock key; Unlock."""

    kind, noun = "Lock", "locks"

    def _take(self, channel: grpc.Channel):
        return lpbg.LockStub(channel).Lock.future(lpb.LockRequest(name=self.name, lease=self.lease))

    def _held(self, answer: lpb.LockResponse) -> Held:
        return Held(answer.key, answer.header.revision)

    def _look(self, channel: grpc.Channel, held: Held) -> None:
        oldest = self._oldest(channel, held)
        if oldest is None or oldest.key != held.key:
            return
        fence = pb.Compare(target=pb.Compare.CREATE, key=held.key, create_revision=oldest.create_revision)
        put = pb.RequestOp(request_put=pb.PutRequest(key=self.name + b"-fenced", value=self.member.encode()))
        try:
            held.fenced = pbg.KVStub(channel).Txn(pb.TxnRequest(compare=[fence], success=[put]), timeout=10).succeeded
        except grpc.RpcError as exc:
            self.errors.append(f"fenced Txn: {exc.code().name}: {exc.details()}")

    def _give_back(self, channel: grpc.Channel, held: Held) -> None:
        lpbg.LockStub(channel).Unlock(lpb.UnlockRequest(key=held.key), timeout=10)


class Candidate(Taker):
    """Campaign; Proclaim (the write fenced by the leader key); the oldest key at the Proclaim's
    revision; Resign. A Campaign answer's revision is its first write's, as etcd's, maybe before it
    leads: what is checked is the revision of the Proclaim it made as the leader."""

    kind, noun = "Campaign", "elections"

    def _take(self, channel: grpc.Channel):
        return epbg.ElectionStub(channel).Campaign.future(
            epb.CampaignRequest(name=self.name, lease=self.lease, value=self.member.encode()))

    def _held(self, answer: epb.CampaignResponse) -> Held:
        held = Held(answer.leader.key, answer.header.revision)
        held.leader = answer.leader
        return held

    def _look(self, channel: grpc.Channel, held: Held) -> None:
        try:
            held.revision = epbg.ElectionStub(channel).Proclaim(epb.ProclaimRequest(
                leader=held.leader, value=b"%s leads" % self.member.encode()), timeout=10).header.revision
            held.fenced = True
        except grpc.RpcError as exc:
            if exc.details() == "election: not leader":
                held.fenced = False
            self.errors.append(f"Proclaim: {exc.code().name}: {exc.details()}")
            held.read_error = "not proclaimed"
            return
        self._oldest(channel, held)

    def _give_back(self, channel: grpc.Channel, held: Held) -> None:
        epbg.ElectionStub(channel).Resign(epb.ResignRequest(leader=held.leader), timeout=10)


def check_lockers(lockers: list[Taker], alive: dict[int, bool], struck: str | None) -> str:
    """The checks of the module's docstring, with which sessions' leases the writer held at the end
    (``alive``) and the member the fault struck; a summary."""
    unread = 0
    for lk in lockers:
        mine = lk.name + b"/" + b"%x" % lk.lease
        for h in lk.held:
            assert h.key == mine, f"{lk.member}'s {lk.kind} answered key {h.key!r}, its session's is {mine!r}"
            assert h.fenced is not False or h.after_failed_call or not alive[lk.lease], \
                f"{lk.member}'s write fenced by its {lk.kind} key {h.key!r} failed right after it got it " \
                f"(revision {h.revision}), its session alive"
            assert "future revision" not in h.read_error, \
                f"{lk.member}'s {lk.kind} answered revision {h.revision}, which it does not have: {h.read_error}"
            if h.read_error:
                unread += 1
                continue
            assert h.oldest == h.key, f"at revision {h.revision} of {lk.member}'s {lk.kind}, the oldest key under " \
                f"{lk.name!r} is {h.oldest!r}, not its {h.key!r}: held twice"
        assert lk.held or lk.member == struck, \
            f"{lk.kind} through {lk.member} never got what it asked: {lk.errors[-3:]}"
    taken = ", ".join(f"{lk.member} {len(lk.held)}" for lk in lockers)
    fenced = sum(1 for lk in lockers for h in lk.held if h.fenced)
    return f"{lockers[0].noun}: taken {taken}; {fenced} fenced writes; {unread} not read back"


@dataclass
class Observed:
    """One answer of an Observe stream, and what was read back at the revision it speaks for."""
    revision: int  # the answer's header revision
    kv: tuple[bytes, int, int, bytes]  # the leader's key, create revision, mod revision, value
    stream: int  # which of the observer's streams it came on
    oldest: tuple[bytes, int, bytes] | None = None  # the oldest key under the name at ``at``: key, mod revision, value
    read_error: str = ""
    # a put to the leader's key the stream told before, the same key since its creation (its revision: the
    # put's); a key of the same name created again (the same lease campaigning again) is a new leader
    proclaimed: bool = False

    @property
    def at(self) -> int:
        """The revision the answer names the leader at: a new leader's (read, as etcd's observer reads
        it, at the answer's revision); a proclamation's own, as a watch event's (the answer's header,
        as etcd's, is the watch response's: it may be later, when the leader may have gone)."""
        return self.kv[2] if self.proclaimed else self.revision


def proclaims(before: Observed | None, kv: tuple[bytes, int, int, bytes]) -> bool:
    """Whether an answer telling ``kv`` after ``before`` on one stream is a put to the leader's key
    ``before`` told: the same key since its creation. A key of the same name created again (the same
    lease campaigning again) is a new leader."""
    return before is not None and before.kv[:2] == kv[:2]


class Observer:
    """Observe on an election through one member, as a client keeps it: opened again whenever it
    ends (broken by a fault, or ended by the server), each answer read back right after."""

    def __init__(self, member: str, endpoint: str, name: bytes) -> None:
        self.member, self.endpoint, self.name = member, endpoint, name
        self.seen: list[Observed] = []
        self.errors: list[str] = []
        self.failure: BaseException | None = None
        self.streams = 0
        self._stop = threading.Event()
        self._call = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with chaos_auth.channel(self.endpoint) as channel:
                while not self._stop.is_set():
                    self.streams += 1
                    self._call = epbg.ElectionStub(channel).Observe(epb.LeaderRequest(name=self.name))
                    try:
                        before = None
                        for r in self._call:
                            kv = r.kv
                            told = (kv.key, kv.create_revision, kv.mod_revision, kv.value)
                            seen = Observed(r.header.revision, told, self.streams, proclaimed=proclaims(before, told))
                            self._read_back(channel, seen)
                            self.seen.append(seen)
                            before = seen
                    except grpc.RpcError as exc:
                        if exc.code() != grpc.StatusCode.CANCELLED:
                            self.errors.append(f"Observe: {exc.code().name}: {exc.details()}")
                    self._stop.wait(RETRY_S)
        except BaseException as exc:
            self.failure = exc
            raise

    def _read_back(self, channel: grpc.Channel, seen: Observed) -> None:
        try:
            oldest = oldest_at(channel, self.name, seen.at)
        except grpc.RpcError as exc:
            seen.read_error = f"{exc.code().name}: {exc.details()}"
            return
        seen.oldest = (oldest.key, oldest.mod_revision, oldest.value) if oldest else None

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        cancel_until_ended(self._thread, lambda: self._call, timeout)
        assert not self._thread.is_alive(), f"the observer through {self.member} is stuck; last errors: {self.errors[-3:]}"
        if self.failure is not None:
            raise AssertionError(f"the observer through {self.member} failed") from self.failure


def check_observers(observers: list[Observer], struck: str | None) -> str:
    """Each Observe answer names the leader at the revision it speaks for (``Observed.at``): the
    oldest key under the election's name, with the value and mod revision it had there (read back;
    one that could not be read is counted, one answered "future revision" is a finding); within a
    stream, revisions never go back and a new leader is a later-created key than the one before;
    every observer through a member the fault did not strike saw a leader."""
    unread = 0
    for o in observers:
        before: Observed | None = None
        for s in o.seen:
            key, created, modified, value = s.kv
            assert modified <= s.revision, f"{o.member}'s observer: leader {key!r} modified at {modified}, " \
                f"after the answer's revision {s.revision}"
            if before is not None and before.stream == s.stream:
                assert s.revision >= before.revision, f"{o.member}'s observer went back from revision " \
                    f"{before.revision} to {s.revision}"
                assert created >= before.kv[1], f"{o.member}'s observer: leader {key!r} (created {created}) after " \
                    f"{before.kv[0]!r} (created {before.kv[1]}), an older key"
            before = s
            assert "future revision" not in s.read_error, \
                f"{o.member}'s observer was answered at revision {s.at}, which it does not have: {s.read_error}"
            if s.read_error:
                unread += 1
                continue
            assert s.oldest == (key, modified, value), f"{o.member}'s observer named {s.kv} (key, created, " \
                f"modified, value) the leader at revision {s.at} (answer at {s.revision}, stream {s.stream}, " \
                f"after {o.seen[max(0, o.seen.index(s) - 3):o.seen.index(s)]}), where the oldest key under " \
                f"{o.name!r} is {s.oldest}"
        assert o.seen or o.member == struck, f"the observer through {o.member} saw no leader: {o.errors[-3:]}"
    seen = ", ".join(f"{o.member} {len(o.seen)} ({o.streams} streams)" for o in observers)
    return f"observers: answers {seen}; {unread} not read back"
