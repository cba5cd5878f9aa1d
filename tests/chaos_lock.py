"""Locks for tests/chaos.py: etcd's server-side lock (v3lockpb), taken again and again through
every member while the faults strike, and checked after.

Through each member a *locker* uses the lease its member's lease keeper keeps alive
(tests/chaos_lease.py) as its session, as a clientv3 concurrency session would: Lock, then
read the lock's keys at the revision the Lock answer names, then a write fenced by its own
lock key (a Txn comparing the key's create revision, the fencing etcd's lock documentation
asks for), then Unlock; again until the round ends. A Lock call is given no deadline (as
``etcdctl lock`` gives none): it is cancelled only when the round ends.

Checks (``check_lockers``):

* a Lock answer names the key ``<name>/<session lease in hex>``;
* at the revision a Lock answer names, that key is the oldest (lowest create revision) under
  ``<name>/``: the caller holds the lock, nobody else does (read right after, before the round's
  compaction passes it; a read that could not be made is counted, not judged; one answered with
  "future revision" is a finding: the answer named a revision the member does not have);
* a fenced write made right after an acquisition succeeds while the lease lives, unless the
  locker's previous Lock call failed or was cancelled (etcd then deletes the key that call
  put, which may be the key a later call got: the same lease gives the same key);
* every locker through a member the fault did not strike took the lock at least once.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import grpc

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg, v3lock_pb2 as lpb, v3lock_pb2_grpc as lpbg

RETRY_S = 0.3


def prefix_end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


@dataclass
class Held:
    """One acquisition: the key and revision the Lock answer named, and what was found after."""
    key: bytes
    revision: int
    oldest: bytes | None = None  # the oldest key under the prefix at ``revision``
    read_error: str = ""  # why it could not be read
    fenced: bool | None = None  # the fenced write: succeeded, failed its compare, or None (no answer)
    after_failed_call: bool = False  # the locker's Lock call before this one failed or was cancelled


class Locker:
    """Lock, read, fenced write, Unlock through ``endpoint`` with ``lease`` as the session, until stopped."""

    def __init__(self, member: str, endpoint: str, name: bytes, lease: int) -> None:
        self.member, self.endpoint, self.name, self.lease = member, endpoint, name, lease
        self.held: list[Held] = []
        self.errors: list[str] = []
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._call = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            failed_before = False
            with grpc.insecure_channel(self.endpoint) as channel:
                lock, kv = lpbg.LockStub(channel), pbg.KVStub(channel)
                while not self._stop.is_set():
                    held = self._acquire(lock)
                    if held is None:
                        failed_before = True
                        self._stop.wait(RETRY_S)
                        continue
                    held.after_failed_call, failed_before = failed_before, False
                    self.held.append(held)
                    self._look(kv, held)
                    try:
                        lock.Unlock(lpb.UnlockRequest(key=held.key), timeout=10)
                    except grpc.RpcError as exc:
                        self.errors.append(f"Unlock: {exc.code().name}: {exc.details()}")
        except BaseException as exc:
            self.failure = exc
            raise

    def _acquire(self, lock: lpbg.LockStub) -> Held | None:
        self._call = lock.Lock.future(lpb.LockRequest(name=self.name, lease=self.lease))
        try:
            answer = self._call.result()
        except grpc.FutureCancelledError:  # by stop()
            return None
        except grpc.RpcError as exc:
            self.errors.append(f"Lock: {exc.code().name}: {exc.details()}")
            return None
        return Held(answer.key, answer.header.revision)

    def _look(self, kv: pbg.KVStub, held: Held) -> None:
        pfx = self.name + b"/"
        try:
            oldest = kv.Range(pb.RangeRequest(key=pfx, range_end=prefix_end(pfx), revision=held.revision, limit=1,
                                              sort_order=pb.RangeRequest.ASCEND,
                                              sort_target=pb.RangeRequest.CREATE), timeout=10).kvs
        except grpc.RpcError as exc:
            held.read_error = f"{exc.code().name}: {exc.details()}"
            return
        held.oldest = oldest[0].key if oldest else None
        if held.oldest != held.key:
            return
        fence = pb.Compare(target=pb.Compare.CREATE, key=held.key, create_revision=oldest[0].create_revision)
        put = pb.RequestOp(request_put=pb.PutRequest(key=self.name + b"-fenced", value=self.member.encode()))
        try:
            held.fenced = kv.Txn(pb.TxnRequest(compare=[fence], success=[put]), timeout=10).succeeded
        except grpc.RpcError as exc:
            self.errors.append(f"fenced Txn: {exc.code().name}: {exc.details()}")

    def stop(self) -> None:
        self._stop.set()
        if self._call is not None:
            self._call.cancel()
        self._thread.join(30)
        assert not self._thread.is_alive(), f"the locker through {self.member} is stuck"
        if self.failure is not None:
            raise AssertionError(f"the locker through {self.member} failed") from self.failure


def check_lockers(lockers: list[Locker], alive: dict[int, bool], struck: str | None) -> str:
    """The checks of the module's docstring, with which sessions' leases the writer held at the end
    (``alive``) and the member the fault struck; a summary."""
    unread = 0
    for lk in lockers:
        mine = lk.name + b"/" + b"%x" % lk.lease
        for h in lk.held:
            assert h.key == mine, f"{lk.member}'s Lock answered key {h.key!r}, its session's is {mine!r}"
            assert "future revision" not in h.read_error, \
                f"{lk.member}'s Lock answered revision {h.revision}, which it does not have: {h.read_error}"
            if h.read_error:
                unread += 1
                continue
            assert h.oldest == h.key, f"{lk.member}'s Lock answered at revision {h.revision}, where the oldest " \
                f"key under the lock is {h.oldest!r}, not its {h.key!r}: the lock was held twice"
            assert h.fenced is not False or h.after_failed_call or not alive[lk.lease], \
                f"{lk.member}'s write fenced by its lock key {h.key!r} failed right after it took the lock at " \
                f"revision {h.revision}, its session alive"
        assert lk.held or lk.member == struck, \
            f"the locker through {lk.member} never took the lock: {lk.errors[-3:]}"
    taken = ", ".join(f"{lk.member} {len(lk.held)}" for lk in lockers)
    fenced = sum(1 for lk in lockers for h in lk.held if h.fenced)
    return f"locks: taken {taken}; {fenced} fenced writes; {unread} not read back"
