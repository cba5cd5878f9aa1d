"""A stopping server's last answers reach a client that is still writing.

The native gRPC server on 127.0.0.1, a raw HTTP/2 client on a socket: one call in flight when
the server stops (GOAWAY), answered, then the connection closed. The client keeps sending
PINGs all the while and reads only at the end. A close with the client's bytes unread (or
arriving after it) is answered by the kernel with an RST, and the client's next write fails
("Broken pipe"): grpc's C core then drops the connection before reading the answer, which is
how a fail-stop's "etcdserver: server stopped" reached clients as "Broken pipe". The server
closes with a FIN and reads what the client still sends until it closes too.
"""
from __future__ import annotations

import asyncio

import grpc

from shim import grpcserver as gs
from tests.integration.h2kit import (
    DATA, END_HEADERS, END_STREAM, HEADERS, PREFACE, SETTINGS, frame, grpc_message, hpack_literals, split_frames,
)

PING, GOAWAY = 0x6, 0x7


def run(body) -> None:
    asyncio.run(asyncio.wait_for(body(), 20))  # a deadline for a hang, not a timing


def test_a_stopping_server_closes_so_that_a_client_still_writing_reads_every_answer():
    async def body():
        release = asyncio.Event()

        async def handler(request, context):
            await release.wait()
            return b"answer"

        server = gs.Server()
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "t.S", {"M": grpc.unary_unary_rpc_method_handler(handler)})])
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        headers = [(":method", "POST"), (":scheme", "http"), (":path", "/t.S/M"), (":authority", "x"),
                   ("content-type", "application/grpc"), ("te", "trailers")]
        writer.write(PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, END_HEADERS, 1, hpack_literals(headers))
                     + frame(DATA, END_STREAM, 1, grpc_message(b"request")))
        await writer.drain()
        while not server.tasks:  # the call is in flight
            await asyncio.sleep(0.01)
        stopping = asyncio.ensure_future(server.stop(grace=5))
        await asyncio.sleep(0.05)
        release.set()  # answered during the grace period, then the connection closes
        for i in range(30):  # the client keeps writing, without reading, past the close
            writer.write(frame(PING, 0, 0, i.to_bytes(8, "big")))
            await writer.drain()
            await asyncio.sleep(0.01)
        received = await reader.read()  # up to the server's FIN: an RST would raise here
        writer.close()
        await stopping
        got, rest = split_frames(received)
        kinds = [(kind, sid) for kind, _, sid, _ in got]
        assert rest == b"" and (GOAWAY, 0) in kinds
        answer = [payload for kind, _, sid, payload in got if (kind, sid) == (DATA, 1)]
        assert answer == [grpc_message(b"answer")]
        assert kinds.count((HEADERS, 1)) == 2  # its headers, and the trailers with grpc-status

    run(body)
