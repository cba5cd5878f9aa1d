"""The ceiling: a do-nothing gRPC server that answers KV.Put, KV.Range,
KV.Txn, Lease.LeaseGrant, Lease.LeaseKeepAlive and Watch.

It parses each request (any real server has to) and answers with a canned,
pre-serialized response, so driving it with the same load generator shows how
far Python + grpcio (server and client on the same 2 cores) can go at all.
With --fsync-dir (how the bench starts it) a Put or Txn is also made durable
the way any durable server must: its bytes appended to a file (written over
zeros written ahead) and answered once a group-committed fdatasync covering them
has returned (GroupCommit) --
the same fdatasync cadence as shardetcd's journal with fsync=always, nothing
else. On the native gRPC server, Put and Txn calls completed in one loop turn are
answered as one batch (one append, one wait), as shardetcd's are (shim.handlers.batched).
--fsync-mode chooses where write + fdatasync run: shardetcd's journal's
policy (hybrid, the default: a dedicated thread, a lone writer's batch inline on
the loop), a dedicated thread always, the default executor, or inline on the
event loop always (measured in bench/README.md). With --metrics-port it serves
/metrics with etcd's own fdatasync histogram name
(etcd_disk_wal_fsync_duration_seconds), so the bench counts writes per
fdatasync the same way on etcd, shardetcd and the ceiling.
Watch is the same idea: a Put is sent, as one event, to every watcher whose
key or range holds the put's key, one response per watcher as etcd sends them;
nothing is stored, so there is no history, no prev_kv and no filtering.

--grpc-server chooses the gRPC server as shardetcd's flag of that name does, with
the same default: the ceiling does the gRPC work shardetcd does, and nothing else.

--mvcc STATE_DIR makes it the *floor* (class Floor): each Put and Txn also does the
least any multi-version store must (a revision, the key's versions, its row in RocksDB,
the row as the journal record), so floor/ceiling is what such a store costs in Python.

    python -m bench.ceiling --port 23790
"""
from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from queue import SimpleQueue
import signal
import threading
import time

import grpc
from prometheus_client import Histogram, start_http_server

from journal.fsutil import pwrite_all
from journal.record import frame_header
from journal.writer import zeros_ahead
from proto import kv_pb2, rpc_pb2 as pb
from shim import grpcserver
from shim.handlers import eager
from shim.config import GRPC_SERVERS, ServerConfig
from shim.wire import varint
from shim.loop import EVENT_LOOPS, default_event_loop, run as run_loop

_HEADER = pb.ResponseHeader(cluster_id=1, member_id=1, revision=1, raft_term=2)
PUT_RESPONSE = pb.PutResponse(header=_HEADER).SerializeToString()
RANGE_RESPONSE = pb.RangeResponse(
    header=_HEADER, count=1,
    kvs=[kv_pb2.KeyValue(key=b"\0" * 8, value=b"v" * 256, create_revision=1, mod_revision=1, version=1)],
).SerializeToString()


TXN_RESPONSE = pb.TxnResponse(header=_HEADER, succeeded=True,
                              responses=[pb.ResponseOp(response_put=pb.PutResponse(header=_HEADER))]).SerializeToString()
_revision = [1]
_watch_streams: set[asyncio.Queue] = set()  # one per Watch stream: its watchers and what to send


class GroupCommit:
    """--fsync-dir: what any durable server must add to a write, and nothing else:
    each Put/Txn's request bytes are appended to one file, and answered once an
    fdatasync covering them has returned. One write + fdatasync in flight at a
    time; whatever arrives meanwhile goes into the next one (group commit). The
    file is written over zeros written ahead, as shardetcd's journal segments are
    (journal/writer.py: a write + fdatasync that does not grow the file is cheaper).

    Mode "hybrid" (the default) is shardetcd's journal's policy: a thread, but a
    lone writer's batch (one request, nothing else arrived while the previous one
    was written, a quick fsync, and no other call being handled) is written on the
    loop after the current turn, saving the two cross-CPU wake-ups of a thread hop."""

    INLINE_FSYNC_MAX_S = 0.001

    def __init__(self, directory: str, mode: str) -> None:
        self.fd = os.open(os.path.join(directory, "ceiling.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.end = self.written = 0  # written over zeros written ahead, as the journal's segments are
        self.mode = mode
        self.parts: list[bytes] = []
        self.waiters: list[asyncio.Future] = []
        self.busy = False
        self.lone = False
        self.loop = asyncio.get_running_loop()
        if mode in ("thread", "hybrid"):
            self.q: SimpleQueue = SimpleQueue()
            threading.Thread(target=self._thread, daemon=True).start()

    def append(self, data: bytes) -> asyncio.Future:
        return self.append_many((data,))

    def append_many(self, parts) -> asyncio.Future:
        """``parts`` (a batch of calls' requests: shim.handlers.batched), answered together."""
        fut = self.loop.create_future()
        self.parts.extend(parts)
        self.waiters.append(fut)
        if not self.busy:
            if self.mode == "hybrid" and self.lone and _calls[0] <= 1:
                self.busy = True
                self.loop.call_soon(self._inline)
            else:
                self._kick()
        return fut

    def _inline(self) -> None:
        parts, waiters = self.parts, self.waiters
        self.parts, self.waiters = [], []
        started = time.monotonic()
        self._write(parts)
        self._done(waiters, len(parts) == 1 and time.monotonic() - started < self.INLINE_FSYNC_MAX_S)

    def _kick(self) -> None:
        parts, waiters = self.parts, self.waiters
        self.parts, self.waiters = [], []
        self.busy = True
        if self.mode == "inline":
            self._write(parts)
            self._done(waiters)
        elif self.mode in ("thread", "hybrid"):
            self.q.put((parts, waiters))
        else:
            fut = self.loop.run_in_executor(None, self._write, parts)
            fut.add_done_callback(lambda f: self._done(waiters))

    def _write(self, parts: list[bytes]) -> None:
        with _FSYNC.time():
            data = b"".join(parts)
            start, self.end = self.end, self.end + len(data)
            if self.end > self.written:
                self.written = zeros_ahead(self.fd, self.end, 1 << 62)
            pwrite_all(self.fd, data, start)
            os.fdatasync(self.fd)

    def _thread(self) -> None:
        while (item := self.q.get()) is not None:
            parts, waiters = item
            started = time.monotonic()
            self._write(parts)
            lone = len(parts) == 1 and not self.parts and time.monotonic() - started < self.INLINE_FSYNC_MAX_S
            self.loop.call_soon_threadsafe(self._done, waiters, lone)
        os.close(self.fd)

    def close(self) -> None:
        """Once nothing is in flight."""
        if self.mode in ("thread", "hybrid"):
            self.q.put(None)
        else:
            os.close(self.fd)

    def _done(self, waiters: list[asyncio.Future], lone: bool = False) -> None:
        for w in waiters:
            w.set_result(None)
        self.busy = False
        self.lone = lone
        if self.parts:
            self._kick()


_commit: list[GroupCommit | None] = [None]


class Floor:
    """--mvcc: the least any multi-version store must add to the ceiling's durable write, for the
    *floor* (bench/README.md): a revision per write, the key's revisions (its create revision and
    version follow from them), a new key in a sorted list (ranges read keys in order), the row
    (etcd's mvccpb.KeyValue) put in RocksDB on tmpfs as shardetcd's state is, a journal record (the
    row, framed with its CRC) group-committed in place of the request's bytes, and a response
    carrying the revision. No checks, leases, watches, sharding, history reads or metrics: what
    shardetcd costs beyond this is its etcd contract and its own design, not Python's floor."""

    def __init__(self, state_dir: str) -> None:
        from sortedcontainers import SortedList

        from shards.state import open_rocks
        from shim.wire import Headers
        self.db = open_rocks(Path(state_dir))
        self.index: dict[bytes, list[int]] = {}
        self.keys = SortedList()
        self.rev = 1
        self.headers = Headers(1, 1, 2)

    def put(self, req: pb.PutRequest) -> tuple[bytes, bytes]:
        """The put's journal record and its response."""
        self.rev = rev = self.rev + 1
        key = req.key
        revs = self.index.get(key)
        if revs is None:
            revs = self.index[key] = [rev]
            self.keys.add(key)
        else:
            revs.append(rev)
        row = kv_pb2.KeyValue(key=key, create_revision=revs[0], mod_revision=rev, version=len(revs),
                              value=req.value, lease=req.lease).SerializeToString()
        self.db[rev.to_bytes(8, "big")] = row
        return frame_header(1, rev, row) + row, self.headers.framed(rev)

    def txn(self, req: pb.TxnRequest) -> tuple[bytes, bytes]:
        """A Txn of one Put (the tool's txn-put): that put, answered as a TxnResponse."""
        record, header = self.put(req.success[0].request_put)
        put = b"\x12" + varint(len(header)) + header
        return record, header + b"\x10\x01\x1a" + varint(len(put)) + put


_floor: list[Floor | None] = [None]
_calls = [0]  # unary calls being handled (the hybrid mode writes inline only when one is)


def _counted(handler, batch=None):
    """``handler`` counted in _calls; with ``batch``, answerable in batches as shardetcd's Put and Txn
    are (shim.handlers.batched: the native server hands the calls of one loop turn over together)."""
    async def counted(request: bytes, context) -> bytes:
        _calls[0] += 1
        try:
            return await handler(request, context)
        finally:
            _calls[0] -= 1

    async def counted_batch(requests: list, contexts: list) -> list:
        _calls[0] += len(requests)
        try:
            return await batch(requests, contexts)
        finally:
            _calls[0] -= len(requests)

    if batch is not None:
        counted.batch = counted_batch
    return counted
_FSYNC = Histogram("etcd_disk_wal_fsync_duration_seconds", "GroupCommit write + fdatasync latency.")


async def _put(request: bytes, context) -> bytes:
    req = pb.PutRequest.FromString(request)
    if _floor[0] is not None:
        record, response = _floor[0].put(req)
        await _commit[0].append(record)
        return response
    if _commit[0] is not None:
        await _commit[0].append(request)
    if _watch_streams:
        _revision[0] += 1
        _fan_out(req, _revision[0])
    return PUT_RESPONSE


async def _put_batch(requests: list, contexts: list) -> list:
    reqs = [pb.PutRequest.FromString(request) for request in requests]
    if _floor[0] is not None:
        done = [_floor[0].put(req) for req in reqs]
        await _commit[0].append_many([record for record, _ in done])
        return [response for _, response in done]
    if _commit[0] is not None:
        await _commit[0].append_many(requests)
    if _watch_streams:
        for req in reqs:
            _revision[0] += 1
            _fan_out(req, _revision[0])
    return [PUT_RESPONSE] * len(requests)


def _fan_out(req: pb.PutRequest, rev: int) -> None:
    kv = kv_pb2.KeyValue(key=req.key, value=req.value, create_revision=rev, mod_revision=rev, version=1)
    header = pb.ResponseHeader(cluster_id=1, member_id=1, revision=rev, raft_term=2)
    for queue in _watch_streams:
        for watch_id, key, end in queue.watchers:
            if req.key == key or (end and (end == b"\0" or key <= req.key < end)):
                queue.put_nowait(pb.WatchResponse(header=header, watch_id=watch_id, events=[
                    kv_pb2.Event(type=kv_pb2.Event.PUT, kv=kv)]).SerializeToString())


async def _txn(request: bytes, context) -> bytes:
    req = pb.TxnRequest.FromString(request)
    if _floor[0] is not None:
        record, response = _floor[0].txn(req)
        await _commit[0].append(record)
        return response
    if _commit[0] is not None:
        await _commit[0].append(request)
    return TXN_RESPONSE


async def _txn_batch(requests: list, contexts: list) -> list:
    reqs = [pb.TxnRequest.FromString(request) for request in requests]
    if _floor[0] is not None:
        done = [_floor[0].txn(req) for req in reqs]
        await _commit[0].append_many([record for record, _ in done])
        return [response for _, response in done]
    if _commit[0] is not None:
        await _commit[0].append_many(requests)
    return [TXN_RESPONSE] * len(requests)


async def _watch(requests, context):
    queue: asyncio.Queue = asyncio.Queue()
    queue.watchers = []  # (watch id, key, range end)

    async def read() -> None:
        async for raw in requests:
            req = pb.WatchRequest.FromString(raw)
            if req.HasField("create_request"):
                c = req.create_request
                watch_id = len(queue.watchers)
                queue.watchers.append((watch_id, c.key, c.range_end))
                queue.put_nowait(pb.WatchResponse(header=_HEADER, watch_id=watch_id, created=True).SerializeToString())

    reader = asyncio.ensure_future(read())
    _watch_streams.add(queue)
    try:
        while True:
            yield await queue.get()
    finally:
        _watch_streams.discard(queue)
        reader.cancel()


async def _range(request: bytes, context) -> bytes:
    pb.RangeRequest.FromString(request)
    return RANGE_RESPONSE


KEEPALIVE_RESPONSE = pb.LeaseKeepAliveResponse(header=_HEADER, ID=1, TTL=600).SerializeToString()
_lease_ids = iter(range(1, 1 << 62))


async def _grant(request: bytes, context) -> bytes:
    req = pb.LeaseGrantRequest.FromString(request)
    return pb.LeaseGrantResponse(header=_HEADER, ID=req.ID or next(_lease_ids), TTL=req.TTL).SerializeToString()


async def _keepalive(requests, context):
    async for request in requests:
        pb.LeaseKeepAliveRequest.FromString(request)
        yield KEEPALIVE_RESPONSE


async def serve(port: int, fsync_dir: str | None = None, fsync_mode: str = "hybrid",
                metrics_port: int | None = None, grpc_server: str = ServerConfig.grpc_server,
                mvcc_dir: str | None = None) -> None:
    if metrics_port:
        start_http_server(metrics_port, addr="127.0.0.1")
    if fsync_dir:
        _commit[0] = GroupCommit(fsync_dir, fsync_mode)
        if mvcc_dir:
            _floor[0] = Floor(mvcc_dir)
    server = (grpc.aio.server(options=[("grpc.so_reuseport", 0)]) if grpc_server == "grpcio"
              else grpcserver.Server())
    # no (de)serializers: handlers see and return raw bytes
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("etcdserverpb.KV", {
        "Put": grpc.unary_unary_rpc_method_handler(_counted(_put, _put_batch)),  # batched as shardetcd's
        "Range": grpc.unary_unary_rpc_method_handler(eager(_counted(_range))),  # as shardetcd's (shim/kv.py)
        "Txn": grpc.unary_unary_rpc_method_handler(_counted(_txn, _txn_batch)),
    }), grpc.method_handlers_generic_handler("etcdserverpb.Watch", {
        "Watch": grpc.stream_stream_rpc_method_handler(_watch),
    }), grpc.method_handlers_generic_handler("etcdserverpb.Lease", {
        "LeaseGrant": grpc.unary_unary_rpc_method_handler(_counted(_grant)),
        "LeaseKeepAlive": grpc.stream_stream_rpc_method_handler(_keepalive),
    })])
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(0.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--fsync-dir", default=None, help="make Put and Txn durable: group-committed to a file here")
    ap.add_argument("--fsync-mode", default="hybrid", choices=["hybrid", "thread", "executor", "inline"])
    ap.add_argument("--metrics-port", type=int, default=None, help="serve /metrics (fdatasync count and time) here")
    ap.add_argument("--event-loop", choices=EVENT_LOOPS, default=default_event_loop(),
                    help="the same choice as shardetcd's --event-loop, whose default it shares (default: %(default)s)")
    ap.add_argument("--grpc-server", choices=GRPC_SERVERS, default=ServerConfig.grpc_server,
                    help="the same choice as shardetcd's --grpc-server, whose default it shares (default: %(default)s)")
    ap.add_argument("--mvcc", default=None, metavar="STATE_DIR",
                    help="the floor: with --fsync-dir, also do the least a multi-version store must (class Floor), "
                         "its rows in RocksDB in STATE_DIR (tmpfs, as shardetcd's state)")
    args = ap.parse_args()
    if args.mvcc and not args.fsync_dir:
        ap.error("--mvcc needs --fsync-dir")
    run_loop(serve(args.port, args.fsync_dir, args.fsync_mode, args.metrics_port, args.grpc_server, args.mvcc),
             args.event_loop)


if __name__ == "__main__":
    main()
