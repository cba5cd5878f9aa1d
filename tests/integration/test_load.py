"""Load: 1,000 connections at once, and watch streams whose readers stall or vanish.

The server must keep answering other clients, a stalled reader must not block
writers (its watchers fall back to catching up from the store), and every
resource of a dead stream must be freed.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.watch_client import WatchClient

N_CONNECTIONS = 1000


def test_thousand_concurrent_connections(shardetcd):
    channels = [grpc.insecure_channel(shardetcd.endpoint, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(N_CONNECTIONS)]
    try:
        futures = [pbg.KVStub(ch).Put.future(pb.PutRequest(key=b"/registry/pods/c%d" % i, value=b"v"), timeout=60)
                   for i, ch in enumerate(channels)]
        revs = sorted(f.result().header.revision for f in futures)
        assert revs == list(range(2, N_CONNECTIONS + 2)), "every write took its own revision"
        r = pbg.KVStub(channels[0]).Range(pb.RangeRequest(key=b"/registry/pods/", range_end=b"/registry/pods0",
                                                          count_only=True), timeout=10)
        assert r.count == N_CONNECTIONS
    finally:
        for ch in channels:
            ch.close()


class StalledWatch:
    """A watch stream whose client never reads a response."""

    def __init__(self, channel: grpc.Channel, key: bytes) -> None:
        req = pb.WatchRequest(create_request=pb.WatchCreateRequest(key=key, range_end=b"\x00"))
        self.call = pbg.WatchStub(channel).Watch(iter([req]))  # never iterated

    def close(self) -> None:
        self.call.cancel()


def rss_bytes(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def watchers(metrics_base: str) -> float:
    from tests.integration.test_metrics import scrape

    return scrape(metrics_base)[("etcd_debugging_mvcc_watcher_total", ())]


def test_stalled_and_vanishing_watch_streams_do_not_hurt_others(tmp_path):
    from tests.etcd_fixture import free_port
    from tests.shardetcd_fixture import start_shardetcd

    metrics_port = free_port()
    shardetcd = start_shardetcd(tmp_path, extra_args=("--listen-metrics-urls", f"http://127.0.0.1:{metrics_port}"))
    base = f"http://127.0.0.1:{metrics_port}"
    try:
        run_stalled_streams(shardetcd, base)
    finally:
        shardetcd.stop()


def run_stalled_streams(shardetcd, base: str) -> None:
    rss_before = rss_bytes(shardetcd.pid)
    with grpc.insecure_channel(shardetcd.endpoint) as main:
        kv = pbg.KVStub(main)
        stalled_channels = [grpc.insecure_channel(shardetcd.endpoint) for _ in range(20)]
        stalled = [StalledWatch(ch, b"/") for ch in stalled_channels for _ in range(10)]
        live_channel = grpc.insecure_channel(shardetcd.endpoint)
        live = WatchClient(live_channel)
        live.create(b"/", b"\x00")
        live.wait_for(lambda rs: rs and rs[0].created)
        value = b"x" * 2000
        stop = threading.Event()
        latencies: list[float] = []

        def writer(w: int) -> None:
            with grpc.insecure_channel(shardetcd.endpoint) as ch:
                stub = pbg.KVStub(ch)
                for i in range(250):
                    stub.Put(pb.PutRequest(key=b"/registry/events/w%d-%d" % (w, i), value=value), timeout=30)

        def prober() -> None:  # another client's reads while the stalled streams pile up
            while not stop.is_set():
                t = time.monotonic()
                kv.Range(pb.RangeRequest(key=b"/registry/events/w0-0"), timeout=30)
                latencies.append(time.monotonic() - t)
                time.sleep(0.05)

        probe = threading.Thread(target=prober)
        probe.start()
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(writer, range(4)))  # writers finish although 200 readers never read
        stop.set()
        probe.join()
        assert latencies, "the other client was not served"
        grown = rss_bytes(shardetcd.pid) - rss_before
        # 8 MB of events were written to each of 200 stalled watchers (1.6 GB if buffered)
        assert grown < 300 * 1024 * 1024, f"server memory grew by {grown / 2**20:.0f} MiB"
        assert watchers(base) == 201
        end_rev = kv.Range(pb.RangeRequest(key=b"x")).header.revision
        live.wait_for(lambda rs: sum(len(r.events) for r in rs) == 1000, timeout=60)
        assert [e.kv.mod_revision for e in live.events()] == list(range(2, end_rev + 1))
        for s in stalled:
            s.close()
        for ch in stalled_channels:
            ch.close()
        live.close()
        live_channel.close()
        deadline = time.monotonic() + 15
        while watchers(base) != 0:
            assert time.monotonic() < deadline, "watchers of closed streams were not freed"
            time.sleep(0.1)
        kv.Put(pb.PutRequest(key=b"after", value=b"ok"), timeout=10)
