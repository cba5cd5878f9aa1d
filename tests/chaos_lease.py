"""Leases for tests/chaos.py: kept alive through faults, or left to expire, and checked after.

On every member a *keeper* grants a lease, puts a key on two shards under it, and keeps it
alive once a second on one LeaseKeepAlive stream (opened again when it breaks), noting when each
keep-alive was sent and what came back. One more lease is granted and *dropped*: never kept
alive, with a key of its own.

Checks (``check_keeper``, ``check_leases``): a lease a keeper kept alive is not found gone
sooner than the TTL it was answered with, less ``COALESCE_S``, after that keep-alive was sent: a
follower answers a keep-alive from its own latest renewal at the writer (as etcd's grpc-proxy
coalesces them), up to that much older, where etcd's leader answers from the renewal itself; a
writer taking over gives every lease its whole TTL again. A lease gone loses its keys on every
member, and a lease alive keeps them; the dropped lease is gone, and its key with it, once its
TTL and the fault are past.
"""
from __future__ import annotations

import collections
import queue
import threading
import time

import grpc

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests import chaos_auth

KEEPER_TTL_S = 10
DROPPED_TTL_S = 3
KEEP_EVERY_S = 1.0
COALESCE_S = 1.0  # shim/follower.py KeepAlives: 2 batch intervals


def lease_keys(owner: str, r: int) -> list[bytes]:
    """A lease's keys: one on the events shard, one on the default shard (a cross-shard revoke)."""
    return [b"/registry/events/chaos/lease-%s/round%d" % (owner.encode(), r),
            b"/registry/masterleases/chaos-%s-round%d" % (owner.encode(), r)]


def grant_with_keys(kv: pbg.KVStub, lease: pbg.LeaseStub, ttl: int, keys: list[bytes]) -> int:
    lease_id = lease.LeaseGrant(pb.LeaseGrantRequest(TTL=ttl), timeout=10).ID
    kv.Txn(pb.TxnRequest(success=[pb.RequestOp(request_put=pb.PutRequest(key=k, value=b"%x" % lease_id, lease=lease_id))
                                  for k in keys]), timeout=10)
    return lease_id


class Keeper:
    """A lease granted through ``endpoint``, with ``keys`` under it, kept alive until ``stop``."""

    def __init__(self, endpoint: str, keys: list[bytes]) -> None:
        self.endpoint, self.keys = endpoint, keys
        with chaos_auth.channel(endpoint) as ch:
            sent = time.monotonic()
            self.id = grant_with_keys(pbg.KVStub(ch), pbg.LeaseStub(ch), KEEPER_TTL_S, keys)
        self.answers: list[tuple[float, float, int]] = [(sent, time.monotonic(), KEEPER_TTL_S)]  # (sent, answered, TTL)
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._call = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def gone(self) -> bool:
        return any(ttl <= 0 for _, _, ttl in self.answers)

    def _run(self) -> None:
        try:
            while not self._stop.is_set() and not self.gone:
                try:
                    self._stream()
                except grpc.RpcError:
                    pass  # the member is down or restarting, or its writer is: open again
                self._stop.wait(0.3)
        except BaseException as exc:
            self.failure = exc
            raise

    def _stream(self) -> None:
        with chaos_auth.channel(self.endpoint) as channel:
            requests: queue.Queue = queue.Queue()
            sent: collections.deque[float] = collections.deque()  # a stream answers in order

            def ask() -> None:
                sent.append(time.monotonic())
                requests.put(pb.LeaseKeepAliveRequest(ID=self.id))

            call = self._call = pbg.LeaseStub(channel).LeaseKeepAlive(iter(requests.get, None))
            ended = threading.Event()
            asking = threading.Thread(target=self._ask_every, args=(ask, ended), daemon=True)
            asking.start()
            try:
                for r in call:
                    self.answers.append((sent.popleft(), time.monotonic(), r.TTL))
                    if r.TTL <= 0:
                        break
            finally:
                ended.set()
                requests.put(None)
                call.cancel()
                asking.join()

    def _ask_every(self, ask, ended: threading.Event) -> None:
        while not (self._stop.is_set() or ended.is_set() or self.gone):
            ask()
            ended.wait(KEEP_EVERY_S)

    def answered_since(self, since: float, timeout: float) -> bool:
        """Whether a keep-alive sent after ``since`` is answered (or the lease was found gone)
        within ``timeout``."""
        deadline = time.monotonic() + timeout
        while not (self.gone or any(sent >= since for sent, _, _ in self.answers)):
            if time.monotonic() > deadline or self.failure is not None:
                return False
            time.sleep(0.1)
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._call is not None:
            self._call.cancel()
        self._thread.join(10)
        assert not self._thread.is_alive(), "a lease keeper is stuck"
        if self.failure is not None:
            raise AssertionError("a lease keeper failed") from self.failure


def check_keeper(answers: list[tuple[float, float, int]]) -> str:
    """A kept lease is not found gone sooner than the TTL a keep-alive was answered with, less
    ``COALESCE_S``, after it was sent; a summary of what it was answered."""
    ok = [(sent, answered, ttl) for sent, answered, ttl in answers if ttl > 0]
    gone = [answered for _, answered, ttl in answers if ttl <= 0]
    if gone:
        alive_at, _, ttl = max(a for a in ok if a[1] <= gone[0])
        assert gone[0] >= alive_at + ttl - COALESCE_S, \
            f"the lease was found gone {gone[0] - alive_at:.2f} s after a keep-alive answered with TTL {ttl} was sent"
        return f"gone {gone[0] - alive_at:.1f} s after its last renewal"
    longest = max((b[0] - a[0] for a, b in zip(ok, ok[1:])), default=0.0)
    return f"kept ({len(ok)} renewals, longest {longest:.1f} s between)"


def check_leases(alive: dict[int, bool], keys: dict[int, list[bytes]], view: dict) -> None:
    """Every lease's keys present on the members (``view``) exactly when the lease is alive."""
    for lease_id, is_alive in alive.items():
        present = [k for k in keys[lease_id] if view[k]]
        assert present == (keys[lease_id] if is_alive else []), \
            f"lease {lease_id:x} {'alive' if is_alive else 'gone'}, its keys on the members: {present} of {keys[lease_id]}"


class RoundLeases:
    """A round's leases: a keeper through each member, and one dropped lease."""

    def __init__(self, endpoints: dict[str, str], writer: str, r: int) -> None:
        self.keepers = {name: Keeper(endpoint, lease_keys(name, r)) for name, endpoint in endpoints.items()}
        dropped_keys = lease_keys("dropped", r)
        with chaos_auth.channel(writer) as ch:
            self.dropped = grant_with_keys(pbg.KVStub(ch), pbg.LeaseStub(ch), DROPPED_TTL_S, dropped_keys)
        self.keys = {k.id: k.keys for k in self.keepers.values()} | {self.dropped: dropped_keys}

    @property
    def all_keys(self) -> list[bytes]:
        return [k for keys in self.keys.values() for k in keys]

    def stop(self) -> None:
        for k in self.keepers.values():
            k.stop()

    def answered(self, timeout: float = 30.0) -> None:
        """Every keeper's keep-alives are answered again (the members serve again)."""
        since = time.monotonic()
        for name, k in self.keepers.items():
            assert k.answered_since(since, timeout), f"keep-alives through {name} not answered in {timeout} s " \
                f"after the round (answered last at {max(a for _, a, _ in k.answers) - since:.1f} s)"

    def alive(self, writer: str, timeout: float = 60.0) -> dict[int, bool]:
        """Which leases the writer holds, once the dropped one is gone (within ``timeout``)."""
        deadline = time.monotonic() + timeout
        with chaos_auth.channel(writer) as ch:
            def time_to_live(lease_id: int) -> int:  # -1: gone
                return pbg.LeaseStub(ch).LeaseTimeToLive(pb.LeaseTimeToLiveRequest(ID=lease_id), timeout=10).TTL

            while (ttl := time_to_live(self.dropped)) != -1:
                assert time.monotonic() < deadline, f"the dropped lease (TTL {DROPPED_TTL_S} s) has {ttl} s left"
                time.sleep(0.5)
            return {lease_id: time_to_live(lease_id) > 0 for lease_id in self.keys}

    def report(self, before: dict[int, bool], after: dict[int, bool], view: dict, struck: str | None) -> str:
        """Checked against the members' ``view`` of their keys, with which leases the writer held
        ``before`` and ``after`` that view was taken (one that expired meanwhile is left out). Every
        keeper through a member the fault did not strike (``struck``: None for NATS) kept its
        lease: its keep-alives were answered, or refused while the writer could answer none (or was
        being replaced), a time that does not count against a lease (etcd expires nothing without
        a leader, and a new one gives every lease its TTL again)."""
        for name, k in self.keepers.items():
            assert not (k.gone and before[k.id]), f"{name}'s lease {k.id:x} was answered gone, the writer holds it"
            assert name == struck or (before[k.id] and not k.gone), \
                f"the lease kept alive through {name} was lost, a member the fault did not strike: {check_keeper(k.answers)}"
        steady = {lease_id: alive for lease_id, alive in before.items() if after[lease_id] == alive}
        check_leases(steady, self.keys, view)
        kept = "; ".join(f"{name} {check_keeper(k.answers)}" for name, k in self.keepers.items())
        return f"leases: {kept}; dropped gone; keys as their leases on every member ({len(steady)} of {len(before)})"

    def revoke(self, writer: str, alive: dict[int, bool]) -> None:
        """The leases still alive revoked, so that a long run's state does not grow."""
        with chaos_auth.channel(writer) as ch:
            for lease_id in (i for i, a in alive.items() if a):
                try:
                    pbg.LeaseStub(ch).LeaseRevoke(pb.LeaseRevokeRequest(ID=lease_id), timeout=10)
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.NOT_FOUND:  # expired meanwhile
                        raise
