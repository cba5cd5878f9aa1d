"""What a read shows is never taken back by a later linearizable read (DESIGN.md invariant 11).

A serializable read through any member answers at what that member has applied; a
linearizable read anywhere answers at least at the writer's committed revision when it
began. So once a serializable read has answered at revision R (its header's), every
linearizable read that begins after it answers at R or later: a member that applied a
revision before the writer had it acknowledged (a follower that took a JetStream message
as soon as it was stored) showed a write that a linearizable read elsewhere then missed.

``SerialReader`` asks one member serializable Ranges on the round's keys until stopped;
``test_linearizability.client`` records its linearizable gets' header revisions when given
a list; ``check_reads`` holds the two against each other.
"""
from __future__ import annotations

import bisect
import random
import threading
import time
from dataclasses import dataclass

import grpc

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests import chaos_auth


@dataclass(frozen=True)
class Read:
    start: float  # time.monotonic() when it was sent
    end: float  # ... and when its answer came
    revision: int  # its header's
    member: str  # the endpoint that answered


def serial_reads(endpoint: str, stop: threading.Event, keys: list[bytes], seen: list[Read], seed: int) -> None:
    """Serializable Ranges of ``keys`` through ``endpoint`` until ``stop``; each answer into ``seen``."""
    rng = random.Random(seed)
    with chaos_auth.channel(endpoint) as channel:
        kv = pbg.KVStub(channel)
        while not stop.is_set():
            start = time.monotonic()
            try:
                header = kv.Range(pb.RangeRequest(key=rng.choice(keys), serializable=True), timeout=5).header
            except grpc.RpcError:
                stop.wait(0.2)  # a member down or cut off: asked again soon, as a client would
                continue
            seen.append(Read(start, time.monotonic(), header.revision, endpoint))
            stop.wait(0.002)


def check_reads(serial: list[Read], linear: list[Read]) -> str:
    """AssertionError naming the first linearizable read that answered below a revision a
    serializable read had answered at before it began; else a line saying how many were held."""
    serial = sorted(serial, key=lambda r: r.end)
    ends = [r.end for r in serial]
    highest: list[Read] = []  # highest[i]: the highest revision among serial[:i + 1]
    for r in serial:
        highest.append(r if not highest or r.revision > highest[-1].revision else highest[-1])
    checked = 0
    for lin in sorted(linear, key=lambda r: r.start):
        i = bisect.bisect_left(ends, lin.start) - 1  # the serializable reads that ended before it began
        if i < 0:
            continue
        checked += 1
        shown = highest[i]
        if lin.revision < shown.revision:
            raise AssertionError(
                f"a linearizable read through {lin.member} begun at {lin.start:.3f} answered at revision "
                f"{lin.revision}, below revision {shown.revision} that a serializable read through {shown.member} "
                f"had answered at by {shown.end:.3f}: a member showed a write before the writer had it committed")
    return (f"reads: {len(linear)} linearizable ones, {checked} after a serializable one, none below what "
            f"{len(serial)} serializable ones had shown")
