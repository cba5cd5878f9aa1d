"""The ceiling: a do-nothing grpc.aio server that answers KV.Put, KV.Range,
Lease.LeaseGrant and Lease.LeaseKeepAlive.

It parses each request (any real server has to) and answers with a canned,
pre-serialized response, so driving it with the same load generator shows how
far Python + grpcio (server and client on the same 2 cores) can go at all.

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


async def _put(request: bytes, context) -> bytes:
    pb.PutRequest.FromString(request)
    return PUT_RESPONSE


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
