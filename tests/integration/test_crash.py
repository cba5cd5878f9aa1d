"""Crash safety: SIGKILL shardetcd under concurrent writers, restart, check.

Every acknowledged write must be there with its revision; a cross-shard txn
is all-or-nothing whether or not it was acknowledged; revisions never go back.
"""
from __future__ import annotations

import random
import threading
import time

import grpc

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg

WRITERS = 8
KILL_AFTER_S = 1.5
ROUNDS = 3


def shard_keys(writer: int, i: int) -> list[bytes]:
    return [
        b"/registry/pods/ns/w%d-%d" % (writer, i % 17),
        b"/registry/leases/ns/w%d-%d" % (writer, i % 13),
        b"/registry/events/ns/w%d-%d" % (writer, i),
        b"plain/w%d-%d" % (writer, i % 5),
    ]


class Writer(threading.Thread):
    def __init__(self, endpoint: str, wid: int, round_no: int) -> None:
        super().__init__(daemon=True)
        self.endpoint, self.wid, self.round = endpoint, wid, round_no
        self.acked: list[tuple[bytes, bytes, int]] = []  # (key, value, revision)
        self.txns: list[tuple[bytes, bytes]] = []  # (pod key, lease key) of every txn sent
        self.rng = random.Random(wid * 1000 + round_no)
        self.error: grpc.RpcError | None = None

    def run(self) -> None:
        channel = grpc.insecure_channel(self.endpoint)
        kv = pbg.KVStub(channel)
        i = 0
        try:
            while True:
                i += 1
                value = b"r%d-w%d-%d" % (self.round, self.wid, i)
                if self.rng.random() < 0.3:
                    pod = b"/registry/pods/txn/r%d-w%d-%d" % (self.round, self.wid, i)
                    lease = b"/registry/leases/txn/r%d-w%d-%d" % (self.round, self.wid, i)
                    self.txns.append((pod, lease))
                    txn = pb.TxnRequest(
                        compare=[pb.Compare(key=pod, target=pb.Compare.CREATE, result=pb.Compare.EQUAL, create_revision=0)],
                        success=[
                            pb.RequestOp(request_put=pb.PutRequest(key=pod, value=value)),
                            pb.RequestOp(request_put=pb.PutRequest(key=lease, value=value)),
                        ],
                    )
                    r = kv.Txn(txn, timeout=5)
                    assert r.succeeded
                    self.acked += [(pod, value, r.header.revision), (lease, value, r.header.revision)]
                else:
                    key = self.rng.choice(shard_keys(self.wid, i))
                    r = kv.Put(pb.PutRequest(key=key, value=value), timeout=5)
                    self.acked.append((key, value, r.header.revision))
        except grpc.RpcError as exc:
            self.error = exc  # the server was killed or stopped
        finally:
            channel.close()


def check_acknowledged(kv: pbg.KVStub, acked: list[tuple[bytes, bytes, int]]) -> None:
    for key, value, rev in acked:
        r = kv.Range(pb.RangeRequest(key=key, revision=rev))
        assert len(r.kvs) == 1, f"acknowledged write of {key!r} at rev {rev} is missing"
        assert (r.kvs[0].value, r.kvs[0].mod_revision) == (value, rev), (key, rev)


def check_txns_whole(kv: pbg.KVStub, txns: list[tuple[bytes, bytes]]) -> int:
    whole = 0
    for pod, lease in txns:
        a = kv.Range(pb.RangeRequest(key=pod)).kvs
        b = kv.Range(pb.RangeRequest(key=lease)).kvs
        assert len(a) == len(b), f"half-applied cross-shard txn: {pod!r} present={bool(a)} {lease!r} present={bool(b)}"
        if a:
            assert a[0].mod_revision == b[0].mod_revision and a[0].value == b[0].value
            whole += 1
    return whole


def test_kill_9_under_load_loses_nothing_acknowledged(shardetcd):
    all_acked: list[tuple[bytes, bytes, int]] = []
    last_rev = 1
    for round_no in range(ROUNDS):
        writers = [Writer(shardetcd.endpoint, w, round_no) for w in range(WRITERS)]
        for w in writers:
            w.start()
        time.sleep(KILL_AFTER_S)
        shardetcd.kill()
        for w in writers:
            w.join(10)
        acked = [a for w in writers for a in w.acked]
        assert len(acked) > 50, "writers made too little progress to test anything"
        shardetcd.restart()
        with grpc.insecure_channel(shardetcd.endpoint) as channel:
            kv = pbg.KVStub(channel)
            rev = kv.Range(pb.RangeRequest(key=b"any")).header.revision
            assert rev >= max(r for _, _, r in acked) >= last_rev, "revision went backwards"
            all_acked += acked
            check_acknowledged(kv, all_acked)
            whole = check_txns_whole(kv, [t for w in writers for t in w.txns])
            last_rev = rev
            print(f"round {round_no}: acked={len(acked)} txns_whole={whole}/{sum(len(w.txns) for w in writers)} rev={rev}")
