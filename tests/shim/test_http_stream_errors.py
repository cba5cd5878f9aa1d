"""The JSON gateway's streaming routes when our own code fails: the client gets gRPC's
answer to an exception in a handler (UNKNOWN with its text) as grpc-gateway frames it
(a last error line, the chunked body ended), and the failure is logged; before, the
connection was dropped mid-stream."""
from __future__ import annotations

import asyncio
import json
import logging
from types import SimpleNamespace

import pytest

from shim.http import HttpEndpoint


class FailingGateway:
    """Streams one line, then fails; or fails before its first line."""

    def __init__(self, lines_before: int | None) -> None:
        self.lines_before = lines_before

    async def stream(self, path, body, authorization=None):
        if self.lines_before is None:
            raise RuntimeError("broken before the stream")

        async def chunks():
            for i in range(self.lines_before):
                yield b'{"result":{"n":%d}}\n' % i
            raise RuntimeError("broken in the stream")
        return chunks()


async def exchange(endpoint: HttpEndpoint, request: bytes) -> bytes:
    server = await asyncio.start_server(endpoint.handle, "127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
        writer.write(request)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        length = [ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length:")]
        if length:  # an answer in one piece: the connection stays open for the next request
            body = await asyncio.wait_for(reader.readexactly(int(length[0].split(b":")[1])), 10)
        else:  # a stream: the server ends the connection after it
            body = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        return head + body
    finally:
        server.close()
        await server.wait_closed()


def chunks_of(body: bytes) -> list[bytes]:
    out = []
    while body:
        size, _, rest = body.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out.append(rest[:n])
        body = rest[n + 2:]
    return out


WATCH = b'POST /v3/watch HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}'


@pytest.mark.parametrize("lines_before", [0, 1])
def test_a_failure_inside_a_stream_ends_it_with_an_unknown_error_line(lines_before, caplog):
    member = SimpleNamespace(config=SimpleNamespace(receive_cap_bytes=1 << 20, enable_pprof=False))
    endpoint = HttpEndpoint(member, None, FailingGateway(lines_before))
    with caplog.at_level(logging.ERROR, logger="shim.http"):
        answer = asyncio.run(exchange(endpoint, WATCH))
    head, _, body = answer.partition(b"\r\n\r\n")
    # grpc-gateway: the status is 200 once a line went out, else the error's (UNKNOWN: 500)
    assert head.startswith(b"HTTP/1.1 200 OK" if lines_before else b"HTTP/1.1 500 Internal Server Error"), head
    assert b"Transfer-Encoding: chunked" in head
    lines = chunks_of(body)
    assert len(lines) == lines_before + 1, lines
    assert json.loads(lines[-1]) == {"error": {"grpc_code": 2, "http_code": 500, "message": "broken in the stream",
                                               "http_status": "Internal Server Error"}}
    assert body.endswith(b"0\r\n\r\n")  # the chunked body is ended, not cut
    assert any("gateway call failed path=/v3/watch" in r.getMessage() for r in caplog.records)


def test_a_failure_opening_a_stream_is_an_unknown_answer():
    member = SimpleNamespace(config=SimpleNamespace(receive_cap_bytes=1 << 20, enable_pprof=False))
    endpoint = HttpEndpoint(member, None, FailingGateway(None))
    answer = asyncio.run(exchange(endpoint, WATCH))
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 500 Internal Server Error"), head
    assert json.loads(body) == {"error": "broken before the stream", "code": 2, "message": "broken before the stream"}


def test_a_stream_to_an_http10_client_is_not_chunked():
    """HTTP/1.0 has no chunked encoding: a streamed answer is its lines as they come, ended by the
    connection's close (as Go's server answers a 1.0 client), the error line included."""
    member = SimpleNamespace(config=SimpleNamespace(receive_cap_bytes=1 << 20, enable_pprof=False))
    endpoint = HttpEndpoint(member, None, FailingGateway(1))
    answer = asyncio.run(exchange(endpoint, WATCH.replace(b"HTTP/1.1", b"HTTP/1.0")))
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200 OK") and b"Transfer-Encoding" not in head, head
    first, error = body.splitlines()
    assert json.loads(first) == {"result": {"n": 0}}
    assert json.loads(error)["error"]["message"] == "broken in the stream"
