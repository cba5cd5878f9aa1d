"""Linearizability under crashes, in the spirit of etcd's robustness tests.

Clients run get / put / delete / compare-and-swap on a few keys (on several
shards) while the server is SIGKILLed and restarted; every key's recorded
history must be linearizable against a register model.  A failing history is
saved as JSON in $SHARDETCD_FAILURE_DIR (default: the test's tmp dir) and can
be checked again with ``python -m tests.lincheck FILE``.
"""
from __future__ import annotations

import math
import os
import random
import threading
import time

from pathlib import Path

import grpc

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.chaos_reads import Read
from tests.lincheck import Op, linearizable, save

KEYS = [b"/registry/pods/lin", b"/registry/leases/lin", b"lin-plain"]
CLIENTS = 6
RUN_S = 6.0
KILLS_AT_S = (2.0, 4.0)
MIXED = (4, 3, 1, 3)  # a client's weights of get, put, delete, compare-and-swap


def now() -> float:
    return time.monotonic()


def client(endpoint: str, cid: int, stop: threading.Event, history: list, timeout: float = 2,
           keys: list[bytes] = KEYS, weights: tuple[int, int, int, int] = MIXED, connect=grpc.insecure_channel,
           revisions: list | None = None) -> None:
    """Random get / put / delete / compare-and-swap, in proportion to ``weights``, until ``stop``;
    through the channel ``connect`` opens. ``revisions``: each get answered, as a
    ``tests.chaos_reads.Read`` (its header's revision)."""
    rng = random.Random(cid)
    channel = connect(endpoint)
    kv = pbg.KVStub(channel)
    n = 0
    while not stop.is_set():
        key = rng.choice(keys)
        kind = rng.choices(["get", "put", "delete", "cas"], weights)[0]
        n += 1
        value = b"c%d-%d" % (cid, n)
        start = now()
        try:
            if kind == "get":
                got = kv.Range(pb.RangeRequest(key=key), timeout=timeout)
                arg, out = None, (got.kvs[0].value.decode() if got.kvs else None)
                if revisions is not None:
                    revisions.append(Read(start, now(), got.header.revision, endpoint))
            elif kind == "put":
                kv.Put(pb.PutRequest(key=key, value=value), timeout=timeout)
                arg, out = value.decode(), True
            elif kind == "delete":
                kv.DeleteRange(pb.DeleteRangeRequest(key=key), timeout=timeout)
                arg, out = None, True
            else:
                expected = rng.choice([None, *[b"c%d-%d" % (c, max(1, n - rng.randrange(1, 4))) for c in range(CLIENTS)]])
                cmp = (pb.Compare(key=key, target=pb.Compare.VERSION, result=pb.Compare.EQUAL, version=0)
                       if expected is None else
                       pb.Compare(key=key, target=pb.Compare.VALUE, result=pb.Compare.EQUAL, value=expected))
                r = kv.Txn(pb.TxnRequest(compare=[cmp], success=[pb.RequestOp(request_put=pb.PutRequest(key=key, value=value))]), timeout=timeout)
                arg, out = ((expected.decode() if expected else None), value.decode()), r.succeeded
            history.append((key, Op(cid, start, now(), kind, arg, out)))
        except grpc.RpcError:
            if kind != "get":  # the write may or may not have happened
                a = value.decode() if kind == "put" else None
                if kind == "cas":
                    a = ((expected.decode() if expected else None), value.decode())
                history.append((key, Op(cid, start, math.inf, kind, a, None)))
            # wait for the server to come back rather than pile up failed attempts:
            # every write that fails is an op of unknown outcome, and each one
            # multiplies the checker's search
            try:
                grpc.channel_ready_future(channel).result(timeout=20)
            except grpc.FutureTimeoutError:
                pass
    channel.close()


def check_linearizable(history: list[tuple[bytes, Op]], tmp_path: Path, name: str = "history",
                       keys: list[bytes] = KEYS) -> None:
    """Every key's history is linearizable against a register; a failing one is
    saved in $SHARDETCD_FAILURE_DIR (default: tmp_path) for ``python -m tests.lincheck``."""
    for key in keys:
        ops = [op for k, op in history if k == key]
        if not linearizable(ops):
            out = Path(os.environ.get("SHARDETCD_FAILURE_DIR", tmp_path))
            out.mkdir(parents=True, exist_ok=True)
            path = out / f"{name}-{key.decode().replace('/', '_')}.json"
            save(ops, path)
            raise AssertionError(f"history of {key!r} is not linearizable; saved to {path} "
                                 f"(replay: python -m tests.lincheck {path})")


def test_history_is_linearizable_across_kills(shardetcd, tmp_path):
    history: list[tuple[bytes, Op]] = []
    stop = threading.Event()
    threads = [threading.Thread(target=client, args=(shardetcd.endpoint, c, stop, history)) for c in range(CLIENTS)]
    for t in threads:
        t.start()
    started = time.monotonic()
    for at in KILLS_AT_S:
        time.sleep(max(0.0, started + at - time.monotonic()))
        shardetcd.kill()
        shardetcd.restart()
    time.sleep(max(0.0, started + RUN_S - time.monotonic()))
    stop.set()
    for t in threads:
        t.join(30)
    done = [op for _, op in history if not math.isinf(op.ret)]
    assert len(done) > 200, "too little traffic to say anything"
    assert any(math.isinf(op.ret) for _, op in history), "no operation was in flight at a kill"
    check_linearizable(history, tmp_path)
    # the checker is not vacuous on this history: one read of a value nobody
    # wrote makes it fail
    ops = [op for k, op in history if k == KEYS[0]]
    i = next(i for i, op in enumerate(ops) if op.kind == "get" and not math.isinf(op.ret))
    ops[i] = Op(ops[i].client, ops[i].call, ops[i].ret, "get", None, "never-written")
    assert not linearizable(ops)
