"""The Python load generator, for the shapes etcd's benchmark tool cannot
produce (clientv3's pipelined lease renewal here, the Kubernetes mix in
k8s.py, the partition groups in partitions.py, and the followers bench's
reads, watches and keep-alives spread over several endpoints): a few worker processes, each
one asyncio loop with grpc.aio channels, driving clients with pre-built
requests.

Kept as light as a Python client can be:
  * requests are serialized once, before the run, and sent as raw bytes (the
    channels have no request serializer);
  * one Python list append per request (its latency); everything else happens
    after the run;
  * worker processes are spawned once and reused for every scenario.

Timing: workers set up (connect, create watchers, ...), report ready, and all
get the same start time (CLOCK_MONOTONIC is system-wide, so it is comparable
across processes). Each client runs for warmup + duration; a request counts
if it *started* inside the measured window; throughput = counted / duration.
"""
from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import random
import struct
import time
import traceback
from array import array
from collections import Counter, deque

import grpc

from proto import rpc_pb2 as pb

now = time.monotonic

# one TCP connection per channel (no subchannel sharing between channels)
CHANNEL_OPTIONS = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_receive_message_length", 64 << 20)]

HOT_KEY = b"\0" * 8
WATCH_KEY = b"\0" * 7 + b"\x01"
BIG_REV = 1 << 62

KV_PUT = "/etcdserverpb.KV/Put"
KV_RANGE = "/etcdserverpb.KV/Range"
KV_TXN = "/etcdserverpb.KV/Txn"
WATCH = "/etcdserverpb.Watch/Watch"
LEASE_KEEPALIVE = "/etcdserverpb.Lease/LeaseKeepAlive"
LEASE_GRANT = "/etcdserverpb.Lease/LeaseGrant"


class BenchError(RuntimeError):
    pass


def value_bytes(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def channel(target: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)


async def open_channels(target: str, n: int) -> list[grpc.aio.Channel]:
    chans = [channel(target) for _ in range(n)]
    for ch in chans:
        await asyncio.wait_for(ch.channel_ready(), 30)
    return chans


def job_channels(job: dict, conn_ids: list[int]) -> list[grpc.aio.Channel]:
    """One channel per global connection index; with job["targets"] (a list of endpoints,
    e.g. a writer and its followers) connection g goes to targets[g % len(targets)], so
    connections (and the clients on them) are spread evenly over the endpoints; without it,
    every connection goes to job["target"]."""
    targets = job.get("targets") or [job["target"]]
    return [channel(targets[g % len(targets)]) for g in conn_ids]


async def open_job_channels(job: dict, conn_ids: list[int]) -> list[grpc.aio.Channel]:
    chans = job_channels(job, conn_ids)
    for ch in chans:
        await asyncio.wait_for(ch.channel_ready(), 30)
    return chans


def my_share(total: int, wi: int, wn: int) -> list[int]:
    """Global indexes (of clients, connections, ...) that worker `wi` of `wn` runs."""
    return [g for g in range(total) if g % wn == wi]


async def ready(conn) -> float:
    """Tell the parent this worker is set up; block until it says go; return the start time."""
    conn.send(("ready",))
    msg = conn.recv()
    if msg[0] != "go":
        raise BenchError(f"expected go, got {msg!r}")
    return msg[1]


class Window:
    def __init__(self, t_start: float, warmup: float, duration: float) -> None:
        self.t0 = t_start
        self.start = t_start + warmup
        self.end = self.start + duration


async def wait_until(t: float) -> None:
    d = t - now()
    if d > 0:
        await asyncio.sleep(d)


# ---------------------------------------------------------------- closed loop


async def closed_loop(call, reqs: list[bytes], win: Window, lat: list, errors: Counter, total: list) -> None:
    """Send reqs[i], reqs[i+1], ... (cycling) one at a time until the window ends."""
    n = len(reqs)
    i = 0
    done = 0
    append = lat.append
    start, end = win.start, win.end
    await wait_until(win.t0)
    while True:
        t0 = now()
        if t0 >= end:
            break
        try:
            await call(reqs[i])
        except grpc.aio.AioRpcError as exc:
            errors[exc.code().name] += 1
            await asyncio.sleep(0.01)
            continue
        t1 = now()
        done += 1
        if t0 >= start:
            append(t1 - t0)
        i += 1
        if i == n:
            i = 0
    total[0] += done


def build_unary_requests(job: dict, g: int) -> tuple[str, list[bytes]]:
    op, keys = job["op"], job["keys"]
    value = value_bytes(job.get("val_size", 256))
    if keys == "hot":
        keylist = [HOT_KEY]
    else:  # sequential distinct keys: client g of C takes g, g+C, g+2C, ... < keyspace
        keylist = [struct.pack(">Q", k) for k in range(g, job["keyspace"], job["clients"])] or [struct.pack(">Q", g)]
    if op == "put":
        return KV_PUT, [pb.PutRequest(key=k, value=value).SerializeToString() for k in keylist]
    if op == "range":
        return KV_RANGE, [pb.RangeRequest(key=k, serializable=job["serializable"]).SerializeToString() for k in keylist]
    if op == "txn":
        return KV_TXN, [pb.TxnRequest(
            compare=[pb.Compare(key=k, target=pb.Compare.MOD, result=pb.Compare.LESS, mod_revision=BIG_REV)],
            success=[pb.RequestOp(request_put=pb.PutRequest(key=k, value=value))],
        ).SerializeToString() for k in keylist]
    raise BenchError(f"unknown op {op}")


async def run_unary(job: dict, wi: int, wn: int, conn) -> dict:
    clients = my_share(job["clients"], wi, wn)
    chans = await open_job_channels(job, my_share(job["conns"], wi, wn) or [wi])
    nconns = len(chans)
    work = []
    for j, g in enumerate(clients):
        method, reqs = build_unary_requests(job, g)
        work.append((chans[j % nconns].unary_unary(method), reqs))
    lat: list[float] = []
    errors: Counter = Counter()
    total = [0]
    win = Window(await ready(conn), job["warmup"], job["duration"])
    cpu0 = time.process_time()
    await asyncio.gather(*(closed_loop(call, reqs, win, lat, errors, total) for call, reqs in work))
    cpu = time.process_time() - cpu0
    for ch in chans:
        await ch.close()
    return {"lat": array("d", lat).tobytes(), "errors": dict(errors), "total": total[0], "cpu": cpu}


# --------------------------------------------------------------- keep-alive


async def run_keepalive(job: dict, wi: int, wn: int, conn) -> dict:
    streams = my_share(job["clients"], wi, wn)
    chans = await open_job_channels(job, my_share(job["conns"], wi, wn) or [wi])
    nconns = len(chans)
    grant = chans[0].unary_unary(LEASE_GRANT, request_serializer=pb.LeaseGrantRequest.SerializeToString,
                                 response_deserializer=pb.LeaseGrantResponse.FromString)
    lease = (await grant(pb.LeaseGrantRequest(TTL=600))).ID
    req = pb.LeaseKeepAliveRequest(ID=lease).SerializeToString()
    calls = [chans[j % nconns].stream_stream(LEASE_KEEPALIVE)() for j in range(len(streams))]
    lat: list[float] = []
    errors: Counter = Counter()
    total = [0]

    async def one(call) -> None:
        async def send(r: bytes) -> None:
            await call.write(r)
            await call.read()
        await closed_loop(send, [req], win, lat, errors, total)
        call.cancel()

    win = Window(await ready(conn), job["warmup"], job["duration"])
    cpu0 = time.process_time()
    await asyncio.gather(*(one(c) for c in calls))
    cpu = time.process_time() - cpu0
    for ch in chans:
        await ch.close()
    return {"lat": array("d", lat).tobytes(), "errors": dict(errors), "total": total[0], "cpu": cpu}


async def run_keepalive_pipelined(job: dict, wi: int, wn: int, conn) -> dict:
    """clientv3's shape: a few streams, each renewing many leases without waiting
    for each answer (up to `window` keep-alives in flight per stream). A stream
    answers in order, so a FIFO of send times gives each answer's latency."""
    streams = my_share(job["clients"], wi, wn)
    chans = await open_job_channels(job, my_share(job["conns"], wi, wn) or [wi])
    nconns = len(chans)
    ids = job["setup"]["lease_ids"]
    calls = [chans[j % nconns].stream_stream(LEASE_KEEPALIVE)() for j in range(len(streams))]
    # stream g renews leases g, g+S, g+2S, ... (S streams in all)
    reqs = [[pb.LeaseKeepAliveRequest(ID=i).SerializeToString() for i in ids[g::job["clients"]]] for g in streams]
    lat: list[float] = []
    errors: Counter = Counter()
    total = [0]
    parse = pb.LeaseKeepAliveResponse.FromString

    async def one(call, mine: list[bytes]) -> None:
        sent: deque[float] = deque()
        room = asyncio.Semaphore(job["window"])
        start, end = win.start, win.end

        async def reader() -> None:
            while True:
                r = await call.read()
                if r is grpc.aio.EOF:
                    return
                t0 = sent.popleft()
                if parse(r).TTL <= 0:
                    errors["TTL0"] += 1
                elif t0 >= start:
                    lat.append(now() - t0)
                total[0] += 1
                room.release()

        await wait_until(win.t0)
        read = asyncio.create_task(reader())
        i, n = 0, len(mine)
        try:
            while now() < end:
                await room.acquire()
                sent.append(now())
                await call.write(mine[i])
                i = i + 1 if i + 1 < n else 0
            await call.done_writing()
            await read
        except grpc.aio.AioRpcError as exc:
            errors[exc.code().name] += 1
            read.cancel()

    win = Window(await ready(conn), job["warmup"], job["duration"])
    cpu0 = time.process_time()
    await asyncio.gather(*(one(c, r) for c, r in zip(calls, reqs)))
    cpu = time.process_time() - cpu0
    for ch in chans:
        await ch.close()
    return {"lat": array("d", lat).tobytes(), "errors": dict(errors), "total": total[0], "cpu": cpu}


# -------------------------------------------------------------------- watch

_STAMP = struct.Struct("<dB")  # put-sent time, stop flag; then padding to the value size


async def _watch_writer(job: dict, target: str, win: Window, out: dict) -> None:
    ch = (await open_channels(target, 1))[0]
    put = ch.unary_unary(KV_PUT, response_deserializer=pb.PutResponse.FromString)
    pad = value_bytes(job.get("val_size", 256) - _STAMP.size)
    rate = job["put_rate"]
    revs, acks = array("q"), array("d")
    await wait_until(win.t0)
    i = 0
    while True:
        if rate:
            await wait_until(win.t0 + i / rate)
        t = now()
        stop = t >= win.end
        resp = await put(pb.PutRequest(key=WATCH_KEY, value=_STAMP.pack(t, stop) + pad).SerializeToString())
        if stop:
            break
        if t >= win.start:
            revs.append(resp.header.revision)
            acks.append(now())
        i += 1
    out["writer"] = {"revs": revs.tobytes(), "acks": acks.tobytes(), "puts": len(revs)}
    await ch.close()


async def run_watch(job: dict, wi: int, wn: int, conn) -> dict:
    """Watchers on workers 0..wn-2; the last worker only writes, so that reading
    events never delays the writer (it runs in its own process and loop)."""
    writer = wi == wn - 1
    nw = wn - 1
    watchers = [] if writer else my_share(job["clients"], wi, nw)
    streams = [] if writer else (my_share(job["streams"], wi, nw) or [wi])
    # one channel per endpoint this worker's streams go to (global stream g -> targets[g % n]);
    # the writer of the watched key always puts to job["target"]
    targets = job.get("targets") or [job["target"]]
    stream_target = [targets[g % len(targets)] for g in streams]
    chan_of = {t: channel(t) for t in (dict.fromkeys(stream_target) or [job["target"]])}
    for c in chan_of.values():
        await asyncio.wait_for(c.channel_ready(), 30)
    create = pb.WatchRequest(create_request=pb.WatchCreateRequest(key=WATCH_KEY)).SerializeToString()
    per_stream = [watchers[j::len(streams)] for j in range(len(streams))] if streams else []
    calls = []
    for j, ws in enumerate(per_stream):
        if not ws:
            continue
        call = chan_of[stream_target[j]].stream_stream(WATCH, response_deserializer=pb.WatchResponse.FromString)()
        for _ in ws:
            await call.write(create)
        created = 0
        while created < len(ws):
            resp = await call.read()
            created += resp.created
        calls.append((call, len(ws)))
    lat, revs, recvs = array("d"), array("q"), array("d")
    in_window = [0]
    out: dict = {}

    async def reader(call, n: int) -> None:
        stops = 0
        unpack = _STAMP.unpack_from
        while stops < n:
            resp = await call.read()
            if resp is grpc.aio.EOF:
                return
            t = now()
            for ev in resp.events:
                sent, stop = unpack(ev.kv.value)
                if stop:
                    stops += 1
                    continue
                if win.start <= t < win.end:
                    in_window[0] += 1
                if sent >= win.start:
                    lat.append(t - sent)
                    revs.append(ev.kv.mod_revision)
                    recvs.append(t)
        call.cancel()

    win = Window(await ready(conn), job["warmup"], job["duration"])
    cpu0 = time.process_time()
    tasks = [reader(c, n) for c, n in calls]
    if writer:
        tasks.append(_watch_writer(job, job["target"], win, out))
    grace = 30.0
    timed_out = False
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), win.end - now() + grace)
    except asyncio.TimeoutError:
        timed_out = True
    cpu = time.process_time() - cpu0
    for c in chan_of.values():
        await c.close()
    return {"lat": lat.tobytes(), "revs": revs.tobytes(), "recvs": recvs.tobytes(), "events_in_window": in_window[0],
            "timed_out": timed_out, "cpu": cpu, "total": len(lat), "errors": {}, **out}


RUNNERS = {"unary": run_unary, "keepalive": run_keepalive, "keepalive-pipelined": run_keepalive_pipelined,
           "watch": run_watch}


# ------------------------------------------------------------- worker pool


def _worker_main(conn) -> None:
    from . import k8s  # registers the k8s runner

    from . import partitions

    RUNNERS["k8s"] = k8s.run_k8s
    RUNNERS["groups"] = partitions.run_groups
    while True:
        msg = conn.recv()
        if msg[0] == "exit":
            return
        _, job, wi, wn = msg
        try:
            result = asyncio.run(RUNNERS[job["kind"]](job, wi, wn, conn))
            conn.send(("result", result))
        except BaseException:
            conn.send(("error", traceback.format_exc()))


class Pool:
    """`size` spawned worker processes, reused across runs."""

    def __init__(self, size: int) -> None:
        ctx = mp.get_context("spawn")
        self.conns, self.procs = [], []
        for _ in range(size):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker_main, args=(child,), daemon=True)
            p.start()
            self.conns.append(parent)
            self.procs.append(p)

    def _recv(self, conn, timeout: float, expect: str):
        if not conn.poll(timeout):
            raise BenchError(f"load worker silent for {timeout:.0f}s while waiting for {expect}")
        msg = conn.recv()
        if msg[0] == "error":
            raise BenchError(f"load worker failed:\n{msg[1]}")
        if msg[0] != expect:
            raise BenchError(f"load worker sent {msg[0]!r}, expected {expect!r}")
        return msg

    def run(self, job: dict, workers: int, on_window=None) -> list[dict]:
        """Run `job` on `workers` workers; returns their result dicts.
        `on_window(t_start, t_end)` is called (in this process) around the
        measured window, e.g. to sample server CPU."""
        use = self.conns[:workers]
        for wi, c in enumerate(use):
            c.send(("job", job, wi, len(use)))
        errors = []
        for c in use:
            try:
                self._recv(c, 180, "ready")
            except BenchError as exc:
                errors.append(exc)
        if errors:
            for c in use:  # release the workers that are ready
                c.send(("abort",))
            for c in use:
                if c.poll(30):
                    c.recv()
            raise errors[0]
        t0 = now() + 0.1
        for c in use:
            c.send(("go", t0))
        sample = None
        if on_window:
            pids = [p.pid for p in self.procs[:workers]]
            start = t0 + job["warmup"]
            time.sleep(max(0.0, start - now()))
            a = on_window(pids)
            time.sleep(max(0.0, start + job["duration"] - now()))
            sample = (a, on_window(pids))
        results = [self._recv(c, job["warmup"] + job["duration"] + 120, "result")[1] for c in use]
        if sample:
            results[0]["_window_sample"] = sample
        return results

    def close(self) -> None:
        for c in self.conns:
            try:
                c.send(("exit",))
            except OSError:
                pass
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                os.kill(p.pid, 9)
                p.join()
