"""Watch over gRPC against a shardetcd process: real streams, real clients."""
from __future__ import annotations

import random
import subprocess
import threading
import time

import grpc

from proto import kv_pb2, rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.shardetcd_fixture import start_shardetcd
from tests.watch_client import WatchClient

PREFIXES = [b"/registry/pods/", b"/registry/leases/", b"/registry/events/", b"/registry/configmaps/", b"other/"]


def put(kv, key, value=b"v"):
    return kv.Put(pb.PutRequest(key=key, value=value), timeout=10).header.revision


def test_created_events_prev_kv_and_txn_batching(shardetcd):
    with grpc.insecure_channel(shardetcd.endpoint) as ch:
        kv = pbg.KVStub(ch)
        w = WatchClient(ch)
        w.create(b"/registry/", b"/registry0", prev_kv=True)
        w.wait_for(lambda rs: rs and rs[0].created)
        put(kv, b"/registry/pods/a", b"1")
        txn = pb.TxnRequest(success=[
            pb.RequestOp(request_put=pb.PutRequest(key=b"/registry/pods/a", value=b"2")),
            pb.RequestOp(request_put=pb.PutRequest(key=b"/registry/leases/b", value=b"3")),
        ])
        rev = kv.Txn(txn).header.revision
        kv.DeleteRange(pb.DeleteRangeRequest(key=b"/registry/pods/a"))
        rs = w.wait_for(lambda rs: sum(len(r.events) for r in rs) >= 4)
        txn_resp = [r for r in rs if r.events and r.events[0].kv.mod_revision == rev]
        assert len(txn_resp) == 1 and [e.kv.key for e in txn_resp[0].events] == [b"/registry/pods/a", b"/registry/leases/b"]  # op order
        assert txn_resp[0].header.revision == rev
        evs = w.events()
        assert [e.type for e in evs] == [kv_pb2.Event.PUT] * 3 + [kv_pb2.Event.DELETE]
        assert not evs[0].HasField("prev_kv")
        assert evs[1].prev_kv.value == b"1" and evs[3].prev_kv.value == b"2"
        assert evs[3].kv.key == b"/registry/pods/a" and evs[3].kv.mod_revision == rev + 1
        w.close()


def test_etcdctl_watch_prefix_rev_prev_kv(shardetcd):
    with grpc.insecure_channel(shardetcd.endpoint) as ch:
        kv = pbg.KVStub(ch)
        put(kv, b"/registry/pods/x", b"one")
        put(kv, b"/registry/leases/y", b"two")
        put(kv, b"/registry/pods/x", b"three")
    proc = subprocess.Popen(
        ["/usr/bin/etcdctl", f"--endpoints={shardetcd.endpoint}", "watch", "/registry/", "--prefix", "--rev=2", "--prev-kv"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={"ETCDCTL_API": "3"},
    )
    lines: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        with grpc.insecure_channel(shardetcd.endpoint) as ch:  # --rev=2: seen however late etcdctl's watch starts
            pbg.KVStub(ch).DeleteRange(pb.DeleteRangeRequest(key=b"/registry/leases/y"))
        deadline = time.monotonic() + 30
        while len(lines) < 13 and reader.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        reader.join(10)
    assert lines[:13] == [
        "PUT", "/registry/pods/x", "one",
        "PUT", "/registry/leases/y", "two",
        "PUT", "/registry/pods/x", "one", "/registry/pods/x", "three",
        "DELETE", "/registry/leases/y",
    ]


def test_thousand_watchers_over_ten_streams_get_every_event_once_in_order(shardetcd):
    rng = random.Random(3)
    keys = [p + b"k%d" % i for p in PREFIXES for i in range(8)]
    channels = [grpc.insecure_channel(shardetcd.endpoint) for _ in range(10)]
    clients = [WatchClient(ch) for ch in channels]
    specs = []  # (client index, watch id, key, range_end)
    for c, client in enumerate(clients):
        for wid in range(100):
            if wid % 2:
                key, end = rng.choice(keys), b""
            else:
                p = rng.choice(PREFIXES + [b"/registry/"])
                key, end = p, p[:-1] + bytes([p[-1] + 1])
            client.create(key, end, watch_id=wid + 1)
            specs.append((c, wid + 1, key, end))
    for client in clients:
        client.wait_for(lambda rs: sum(r.created for r in rs) == 100)
    kv = pbg.KVStub(channels[0])
    start = kv.Range(pb.RangeRequest(key=b"x")).header.revision

    def writer(seed):
        r = random.Random(seed)
        with grpc.insecure_channel(shardetcd.endpoint) as ch:
            stub = pbg.KVStub(ch)
            for _ in range(150):
                k = r.choice(keys)
                if r.random() < 0.2:
                    stub.DeleteRange(pb.DeleteRangeRequest(key=k))
                else:
                    stub.Put(pb.PutRequest(key=k, value=b"%d" % r.random()))

    threads = [threading.Thread(target=writer, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    end_rev = kv.Range(pb.RangeRequest(key=b"x")).header.revision
    # the truth: every change in (start, end_rev], from history
    history = []
    for rev in range(start + 1, end_rev + 1):
        now = {kv_.key: kv_ for kv_ in kv.Range(pb.RangeRequest(key=b"\x00", range_end=b"\x00", revision=rev)).kvs}
        before = {kv_.key: kv_ for kv_ in kv.Range(pb.RangeRequest(key=b"\x00", range_end=b"\x00", revision=rev - 1)).kvs}
        for k in sorted(set(now) | set(before)):
            if k in now and now[k].mod_revision == rev:
                history.append((rev, k, 0))
            elif k in before and k not in now:
                history.append((rev, k, 1))
    assert len(history) > 300
    for c, wid, key, end in specs:
        want = [(r, k, t) for r, k, t in history if (k == key if not end else key <= k < end)]
        clients[c].wait_for(lambda rs: sum(len(r.events) for r in rs if r.watch_id == wid) >= len(want), timeout=30)
        got = [(e.kv.mod_revision, e.kv.key, e.type) for e in clients[c].events(wid)]
        assert got == want, f"watcher {wid} on stream {c} for {key!r}..{end!r}"
    for client in clients:
        client.close()
    for ch in channels:
        ch.close()


def test_resume_after_restart_from_last_seen_revision(shardetcd):
    seen = []
    with grpc.insecure_channel(shardetcd.endpoint) as ch:
        kv = pbg.KVStub(ch)
        w = WatchClient(ch)
        w.create(b"/registry/pods/", b"/registry/pods0")
        w.wait_for(lambda rs: rs and rs[0].created)
        for i in range(20):
            put(kv, b"/registry/pods/p%d" % (i % 4), b"%d" % i)
        w.wait_for(lambda rs: sum(len(r.events) for r in rs) == 20)
        seen = [(e.kv.mod_revision, e.kv.key) for e in w.events()]
        w.close()
    last = seen[-1][0]
    shardetcd.kill()
    shardetcd.restart()
    with grpc.insecure_channel(shardetcd.endpoint) as ch:
        kv = pbg.KVStub(ch)
        for i in range(20, 30):
            put(kv, b"/registry/pods/p%d" % (i % 4), b"%d" % i)
        w = WatchClient(ch)
        w.create(b"/registry/pods/", b"/registry/pods0", start_revision=last + 1)
        w.wait_for(lambda rs: sum(len(r.events) for r in rs) == 10)
        resumed = [(e.kv.mod_revision, e.kv.key) for e in w.events()]
        w.close()
    revs = [r for r, _ in seen + resumed]
    assert revs == list(range(2, 32))


def test_progress_notify_and_progress_request(tmp_path):
    server = start_shardetcd(tmp_path, extra_args=("--experimental-watch-progress-notify-interval", "200ms"))
    try:
        with grpc.insecure_channel(server.endpoint) as ch:
            kv = pbg.KVStub(ch)
            rev = put(kv, b"a")
            w = WatchClient(ch, metadata=(("hasleader", "true"),))
            w.create(b"a", progress_notify=True, watch_id=3)
            rs = w.wait_for(lambda rs: len([r for r in rs if not r.created and not r.events]) >= 2, timeout=5)
            ticks = [r for r in rs if not r.created and not r.events]
            assert all(r.watch_id == 3 and r.header.revision == rev for r in ticks)
            w.progress()
            rs = w.wait_for(lambda rs: any(r.watch_id == -1 for r in rs))
            assert [r.header.revision for r in rs if r.watch_id == -1] == [rev]
            w.close()
    finally:
        server.stop()
