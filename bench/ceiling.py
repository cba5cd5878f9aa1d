"""The ceiling: a do-nothing grpc.aio server that answers KV.Put, KV.Range,
KV.Txn, Lease.LeaseGrant, Lease.LeaseKeepAlive and Watch.

It parses each request (any real server has to) and answers with a canned,
pre-serialized response, so driving it with the same load generator shows how
far Python + grpcio (server and client on the same 2 cores) can go at all.
Watch is the same idea: a Put is sent, as one event, to every watcher whose
key or range holds the put's key, one response per watcher as etcd sends them;
nothing is stored, so there is no history, no prev_kv and no filtering.

    python -m bench.ceiling --port 23790
"""
from __future__ import annotations

import argparse
import asyncio
import signal

import grpc

from proto import kv_pb2, rpc_pb2 as pb

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


async def _put(request: bytes, context) -> bytes:
    req = pb.PutRequest.FromString(request)
    if _watch_streams:
        _revision[0] += 1
        _fan_out(req, _revision[0])
    return PUT_RESPONSE


def _fan_out(req: pb.PutRequest, rev: int) -> None:
    kv = kv_pb2.KeyValue(key=req.key, value=req.value, create_revision=rev, mod_revision=rev, version=1)
    header = pb.ResponseHeader(cluster_id=1, member_id=1, revision=rev, raft_term=2)
    for queue in _watch_streams:
        for watch_id, key, end in queue.watchers:
            if req.key == key or (end and (end == b"\0" or key <= req.key < end)):
                queue.put_nowait(pb.WatchResponse(header=header, watch_id=watch_id, events=[
                    kv_pb2.Event(type=kv_pb2.Event.PUT, kv=kv)]).SerializeToString())


async def _txn(request: bytes, context) -> bytes:
    pb.TxnRequest.FromString(request)
    return TXN_RESPONSE


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


async def serve(port: int) -> None:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    # no (de)serializers: handlers see and return raw bytes
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("etcdserverpb.KV", {
        "Put": grpc.unary_unary_rpc_method_handler(_put),
        "Range": grpc.unary_unary_rpc_method_handler(_range),
        "Txn": grpc.unary_unary_rpc_method_handler(_txn),
    }), grpc.method_handlers_generic_handler("etcdserverpb.Watch", {
        "Watch": grpc.stream_stream_rpc_method_handler(_watch),
    }), grpc.method_handlers_generic_handler("etcdserverpb.Lease", {
        "LeaseGrant": grpc.unary_unary_rpc_method_handler(_grant),
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
    asyncio.run(serve(ap.parse_args().port))


if __name__ == "__main__":
    main()
