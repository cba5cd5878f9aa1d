"""Malformed HTTP/2 and gRPC requests, answered as etcd answers them.

The same bytes go to a real etcd (whose client port is grpc-go's HTTP/2 server) and to
shardetcd's native gRPC server (shim/grpcserver.py, the default), each on a new
connection after the handshake; then a good Range on the same connection. What became
of the connection and of the malformed stream (answered with a gRPC status, reset with
an HTTP/2 error code, or the connection ended) must be the same on both. Where the
connection ends, etcd just closes it; shardetcd also says why in a GOAWAY, whose code
is RFC 9113's for that fault (asserted per case). After every case shardetcd still
serves a new connection and its log holds no traceback: bad input is answered, not
crashed on.
"""
from __future__ import annotations

import contextlib
import gzip
import random
import socket
import struct
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from proto import rpc_pb2 as pb
from tests.conftest import require_etcd_binary
from tests.integration.h2kit import (
    ACK, CONTINUATION, DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, PADDED, PING, PREFACE, RST_STREAM, SETTINGS,
    WINDOW_UPDATE,
    RawH2, frame, grpc_message, hpack_literals,
)
from tests.shardetcd_fixture import etcd_and_shardetcd

pytestmark = pytest.mark.timeout(300)

PRIORITY_FRAME = 2
PROTOCOL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR, COMPRESSION_ERROR = 1, 3, 6, 9
RANGE = "/etcdserverpb.KV/Range"
REQUEST = grpc_message(pb.RangeRequest(key=b"h2-differential").SerializeToString())
GOOD_STREAM = 101
WATCH, SNAPSHOT = "/etcdserverpb.Watch/Watch", "/etcdserverpb.Maintenance/Snapshot"
GZIPPED = gzip.compress(REQUEST[5:])


@dataclass
class Target:
    host: str
    port: int


def fields(path: str = RANGE, extra=()) -> list[tuple[str, str]]:
    return [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
            ("content-type", "application/grpc"), ("te", "trailers"), *extra]


def call(sid: int = 1, header_fields=None, path: str = RANGE, extra=()) -> bytes:
    """A whole unary Range on stream ``sid``: its headers (as given, or the usual ones) and request."""
    block = hpack_literals(header_fields if header_fields is not None else fields(path, extra))
    return frame(HEADERS, END_HEADERS, sid, block) + frame(DATA, END_STREAM, sid, REQUEST)


def open_stream(sid: int = 1, path: str = RANGE, extra=()) -> bytes:
    return frame(HEADERS, END_HEADERS, sid, hpack_literals(fields(path, extra)))


BASE = fields()[:4]
CONTENT = [("content-type", "application/grpc")]

# name: (the bytes sent, the GOAWAY code shardetcd ends the connection with, if it does)
CASES = {
    # frames the protocol forbids: the connection ends
    "padding longer than the DATA frame": (open_stream() + frame(DATA, PADDED | END_STREAM, 1, b"\x10abc"),
                                           PROTOCOL_ERROR),
    "padded DATA frame without payload": (open_stream() + frame(DATA, PADDED | END_STREAM, 1), PROTOCOL_ERROR),
    "padded HEADERS frame without payload": (frame(HEADERS, END_HEADERS | PADDED, 1), PROTOCOL_ERROR),
    "PING of 7 bytes": (frame(PING, 0, 0, b"1234567"), FRAME_SIZE_ERROR),
    "PING on a stream": (frame(PING, 0, 1, b"12345678"), PROTOCOL_ERROR),
    "WINDOW_UPDATE of 3 bytes": (frame(WINDOW_UPDATE, 0, 0, b"\0\0\1"), FRAME_SIZE_ERROR),
    "WINDOW_UPDATE of 0 on the connection": (frame(WINDOW_UPDATE, 0, 0, b"\0\0\0\0"), PROTOCOL_ERROR),
    "SETTINGS of 7 bytes": (frame(SETTINGS, 0, 0, b"\0\4\0\0\xff\xff\0"), FRAME_SIZE_ERROR),
    "SETTINGS on a stream": (frame(SETTINGS, 0, 1), PROTOCOL_ERROR),
    "SETTINGS ACK with a payload": (frame(SETTINGS, ACK, 0, b"\0\4\0\0\xff\xff"), FRAME_SIZE_ERROR),
    "initial window of 2^31": (frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 2**31)), FLOW_CONTROL_ERROR),
    "DATA on stream 0": (frame(DATA, 0, 0, b"abc"), PROTOCOL_ERROR),
    "HEADERS on an even stream": (open_stream(2), PROTOCOL_ERROR),
    "HEADERS on a stream below the last": (call(5) + call(3), PROTOCOL_ERROR),
    "RST_STREAM on stream 0": (frame(RST_STREAM, 0, 0, b"\0\0\0\x08"), PROTOCOL_ERROR),
    "RST_STREAM of 3 bytes": (open_stream() + frame(RST_STREAM, 0, 1, b"\0\0\x08"), FRAME_SIZE_ERROR),
    "PRIORITY of 4 bytes": (frame(PRIORITY_FRAME, 0, 1, b"\0\0\0\0"), FRAME_SIZE_ERROR),
    "CONTINUATION without HEADERS": (frame(CONTINUATION, END_HEADERS, 1, hpack_literals(fields())),
                                     PROTOCOL_ERROR),
    "header block that is not HPACK": (frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\xff" * 5), COMPRESSION_ERROR),
    # a broken stream: that stream is reset, the connection and its other calls go on
    "WINDOW_UPDATE of 0 on a stream": (open_stream() + frame(WINDOW_UPDATE, 0, 1, b"\0\0\0\0"), None),
    "DATA after the request's END_STREAM": (call() + frame(DATA, 0, 1, REQUEST), None),
    "DATA beyond the stream's window": (open_stream(1, "/etcdserverpb.Watch/Watch")  # 4.7 MiB of empty requests
                                        + frame(DATA, 0, 1, b"\0" * 16384) * 300, None),
    "grpc-timeout that is not a timeout": (call(extra=[("grpc-timeout", "xyz")]), None),
    "grpc-timeout of 9 digits": (call(extra=[("grpc-timeout", "123456789S")]), None),
    "upper-case header name": (call(extra=[("X-Upper", "1")]), None),
    "header name with a space": (call(extra=[("x a", "1")]), None),
    "empty header name": (call(extra=[("", "1")]), None),
    "header value with NUL": (call(extra=[("x-a", "a\0b")]), None),
    "header value with a newline": (call(extra=[("x-a", "a\nb")]), None),
    "pseudo-header after a regular one": (call(header_fields=BASE[:3] + CONTENT + [(":authority", "x")]), None),
    "unknown pseudo-header": (call(header_fields=BASE + [(":foo", "x")] + CONTENT), None),
    ":status in a request": (call(header_fields=BASE + [(":status", "200")] + CONTENT), None),
    ":path twice": (call(header_fields=BASE + [(":path", RANGE)] + CONTENT), None),
    "no :method": (call(header_fields=BASE[1:] + CONTENT), None),
    "GET instead of POST": (call(header_fields=[(":method", "GET")] + BASE[1:] + CONTENT), None),
    # taken as etcd takes them
    "header value with a tab": (call(extra=[("x-a", "a\tb")]), None),
    "-bin metadata that is not base64": (call(extra=[("x-bin", "a")]), None),
    "connection header": (call(extra=[("connection", "keep-alive")]), None),
    "te other than trailers": (call(header_fields=BASE + CONTENT + [("te", "gzip")]), None),
    "no :path": (call(header_fields=[BASE[0], BASE[1], BASE[3]] + CONTENT), None),
    "path without a method": (call(path="/Range"), None),
    "path without its leading slash": (call(path="etcdserverpb.KV/Range"), None),
    "path with two leading slashes": (call(path="//etcdserverpb.KV/Range"), None),
    "two messages in a unary request": (open_stream() + frame(DATA, END_STREAM, 1, REQUEST * 2), None),
    "DATA on an idle stream": (frame(DATA, 0, 3, b"abc"), None),
    "RST_STREAM on an idle stream": (frame(RST_STREAM, 0, 5, b"\0\0\0\x08"), None),
    "WINDOW_UPDATE past 2^31 - 1": (frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 2**31 - 1)) * 2, None),
    "max frame size of 100": (frame(SETTINGS, 0, 0, struct.pack(">HI", 5, 100)), None),
    "enable push of 2": (frame(SETTINGS, 0, 0, struct.pack(">HI", 2, 2)), None),
    "unknown frame type": (frame(0x20, 0, 0, b"xyz"), None),
    "GOAWAY from the client": (frame(GOAWAY, 0, 0, bytes(8)) + call(), None),
    # what is not a gRPC request: plain-text HTTP/2 goes to grpc-go, which resets it
    "content-type text/plain": (call(header_fields=BASE + [("content-type", "text/plain")]), None),
    "no content-type": (call(header_fields=BASE + [("te", "trailers")]), None),
    "content-type application/grpc-web": (call(header_fields=BASE + [("content-type", "application/grpc-web")]), None),
    "content-type application/grpcx": (call(header_fields=BASE + [("content-type", "application/grpcx")]), None),
    "content-type Application/gRPC": (call(header_fields=BASE + [("content-type", "Application/gRPC")]), None),
    "content-type application/grpc+proto": (call(header_fields=BASE + [("content-type", "application/grpc+proto")]),
                                            None),
    "content-type application/grpc;charset=utf-8": (
        call(header_fields=BASE + [("content-type", "application/grpc;charset=utf-8")]), None),
    # a second header block on a stream: grpc-go checks the request before the stream id
    "trailers from the client": (open_stream() + frame(DATA, 0, 1, REQUEST)
                                 + frame(HEADERS, END_HEADERS | END_STREAM, 1, hpack_literals([("x-t", "1")])), None),
    "a gRPC request again on an open stream": (open_stream() + open_stream(), PROTOCOL_ERROR),
    "a gRPC request again on an answered stream": (call(1) + call(1), PROTOCOL_ERROR),
    "a non-gRPC request on an even stream": (frame(HEADERS, END_HEADERS, 2, hpack_literals(BASE)), None),
    "a non-gRPC request on a lower stream": (call(5) + frame(HEADERS, END_HEADERS, 3, hpack_literals(BASE)), None),
    # the request message: its framing, its compression
    "no request message": (open_stream() + frame(DATA, END_STREAM, 1), None),
    "half a message prefix": (open_stream() + frame(DATA, END_STREAM, 1, b"\0\0\0\0"), None),
    "a message cut short": (open_stream() + frame(DATA, END_STREAM, 1, REQUEST[:-2]), None),
    "payload format 2": (open_stream() + frame(DATA, END_STREAM, 1, b"\2" + REQUEST[1:]), None),
    "compressed flag without grpc-encoding": (open_stream() + frame(DATA, END_STREAM, 1, grpc_message(GZIPPED, True)),
                                              None),
    "compressed flag with grpc-encoding identity": (
        open_stream(extra=[("grpc-encoding", "identity")]) + frame(DATA, END_STREAM, 1, grpc_message(GZIPPED, True)),
        None),
    "gzip": (open_stream(extra=[("grpc-encoding", "gzip")]) + frame(DATA, END_STREAM, 1, grpc_message(GZIPPED, True)),
             None),
    "gzip of 7 bytes": (open_stream(extra=[("grpc-encoding", "gzip")]) + frame(DATA, END_STREAM, 1, grpc_message(
        b"notgzip", True)), None),
    "gzip with a bad header": (open_stream(extra=[("grpc-encoding", "gzip")]) + frame(DATA, END_STREAM, 1, grpc_message(
        b"x" * 20, True)), None),
    "gzip larger than the limit once inflated": (
        open_stream(extra=[("grpc-encoding", "gzip")])
        + frame(DATA, END_STREAM, 1, grpc_message(gzip.compress(b"\0" * (3 << 20)), True)), None),
    "deflate": (open_stream(extra=[("grpc-encoding", "deflate")])
                + frame(DATA, END_STREAM, 1, grpc_message(zlib.compress(REQUEST[5:]), True)), None),
    "an unknown grpc-encoding, message not compressed": (
        open_stream(extra=[("grpc-encoding", 'sn"a\\ppy')]) + frame(DATA, END_STREAM, 1, REQUEST), None),
    "a Watch with an unknown grpc-encoding": (open_stream(path=WATCH, extra=[("grpc-encoding", "snappy")]), None),
    "a Watch request cut short": (open_stream(path=WATCH) + frame(DATA, END_STREAM, 1, b"\0\0\0\0\x09ab"), None),
    "a Watch request with payload format 2": (open_stream(path=WATCH) + frame(DATA, 0, 1, b"\2\0\0\0\0"), None),
    "a Snapshot request cut short": (open_stream(path=SNAPSHOT) + frame(DATA, END_STREAM, 1, b"\0\0\0\0\x09ab"), None),
    "no Snapshot request": (open_stream(path=SNAPSHOT) + frame(DATA, END_STREAM, 1), None),
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    require_etcd_binary()
    with etcd_and_shardetcd(tmp_path_factory.mktemp("h2")) as (etcd, shardetcd):
        yield {"etcd": etcd, "shardetcd": shardetcd}


def outcome(target: Target, data: bytes) -> tuple[tuple, int | None]:
    """(what became of the connection and of stream 1, shardetcd's GOAWAY code if one came)."""
    conn = RawH2(target, timeout=10).handshake()
    try:
        conn.pump(lambda: conn.settings_seen)
        with contextlib.suppress(OSError):  # the server may close while we still send
            conn.send(data)
        time.sleep(0.2)  # what the case sent is taken first
        with contextlib.suppress(OSError):
            conn.request(GOOD_STREAM, RANGE, [pb.RangeRequest(key=b"h2-differential")])
        good = conn.streams[GOOD_STREAM]
        with contextlib.suppress(AssertionError):  # closed first, or nothing within the time
            conn.pump(lambda: good.ended or good.reset is not None, timeout=15)
        goaway = conn.goaway[1] if conn.goaway else None
        if conn.closed or goaway is not None:
            if not conn.closed:
                conn.until_closed(timeout=15)
            return ("connection ended",), goaway
        assert good.ended and good.status() == (0, ""), f"the good call was not answered: {vars(good)}"
        first = conn.streams.get(1)
        if first is None or (first.reset is None and not first.ended):
            return ("stream 1 not answered",), None
        # Trailers then RST_STREAM(NO_ERROR) is an answer: grpc-go answers some faults from the headers and, when it
        # has not yet read the DATA that ends the request, asks the client to stop sending (RFC 9113, 8.1) -- a race
        if first.reset is not None and not (first.ended and first.header_blocks and first.reset == 0):
            return ("stream 1 reset", first.reset), None
        return ("stream 1 answered", *first.status()), None
    finally:
        conn.close()


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_input_answered_as_etcd_answers_it(servers, case):
    data, goaway_code = CASES[case]
    etcd, shardetcd = servers["etcd"], servers["shardetcd"]
    logged = shardetcd.log_path.stat().st_size
    with ThreadPoolExecutor(2) as pool:  # both at once: each outcome waits a while for its connection
        (want, _), (got, goaway) = pool.map(lambda port: outcome(Target("127.0.0.1", port), data),
                                            (etcd.client_port, shardetcd.port))
    assert got == want, f"etcd: {want}, shardetcd: {got}"
    assert goaway == goaway_code, f"GOAWAY code {goaway}, RFC 9113's for this fault is {goaway_code}"
    assert shardetcd.running() and shardetcd.answers_range(timeout=10), shardetcd.log_tail()
    with shardetcd.log_path.open(errors="replace") as log:
        log.seek(logged)
        new_lines = log.read()
    assert "Traceback" not in new_lines, new_lines[-4000:]


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def bytes_taken_from_a_client_that_does_not_read(target: Target, limit: int) -> int:
    """Send SETTINGS frames (each calls for an acknowledgement) and read nothing, until the server
    stops taking them (a send waits 3 s) or ``limit`` bytes went; how many bytes went."""
    with socket.create_connection((target.host, target.port), timeout=10) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
        sock.settimeout(3)
        chunk, sent = frame(SETTINGS, 0, 0) * 50_000, 0
        with contextlib.suppress(TimeoutError):
            while sent < limit:
                sock.sendall(chunk)
                sent += len(chunk)
        return sent


def test_a_client_that_sends_and_never_reads_is_not_read_either(servers):
    """A client that keeps sending frames that call for an answer, and never reads: etcd stops
    reading it once the answers back up (a few MB taken, its memory flat), and so does shardetcd,
    where before its answers piled up without bound (221 MB taken in a minute, +219 MiB)."""
    limit = 128 << 20
    etcd, shardetcd = servers["etcd"], servers["shardetcd"]
    assert bytes_taken_from_a_client_that_does_not_read(Target("127.0.0.1", etcd.client_port), limit) < limit
    before = rss_mib(shardetcd.pid)
    taken = bytes_taken_from_a_client_that_does_not_read(Target("127.0.0.1", shardetcd.port), limit)
    grown = rss_mib(shardetcd.pid) - before
    assert taken < 64 << 20 and grown < 64, (taken, grown)
    assert shardetcd.running() and shardetcd.answers_range(timeout=10), shardetcd.log_tail()


def damaged_gzip(seed: int) -> list[tuple[str, bytes]]:
    """A gzip request message damaged in random ways: bits flipped in its deflate data or CRC,
    cut short, garbage or part of a second member after it; where the damage reaches the
    trailer, its size field made small again, so that the inflating itself fails."""
    r = random.Random(seed)
    whole = gzip.compress(pb.RangeRequest(key=r.randbytes(300) + b"abc" * 200, range_end=b"zz").SerializeToString())
    out = []
    for i in range(24):
        b, kind = bytearray(whole), ("flip", "flip", "cut", "garbage", "second member")[i % 5]
        if kind == "flip":
            for _ in range(r.randint(1, 8)):
                b[r.randrange(10, len(b) - 8)] ^= 1 << r.randrange(8)
        elif kind == "cut":
            b = b[:r.randrange(11, len(b))]
        elif kind == "garbage":
            b += r.randbytes(r.randint(1, 20))
        else:
            b += gzip.compress(b"xyz")[:r.randint(1, 20)]
        if kind != "flip" and len(b) > 14:
            b[-4:] = r.randrange(3000).to_bytes(4, "little")
        out.append((f"{i} {kind}", bytes(b)))
    return out


def test_damaged_gzip_refused_in_etcds_words(servers):
    """etcd's server reads a gzip message with Go's compress/gzip: its header first, then the size
    its trailer declares against the receive limit, then the data, member after member. Each damage
    gets the same status and words from shardetcd (shim/gogzip.py), "flate: corrupt input before
    offset N" included."""
    etcd, shardetcd = servers["etcd"], servers["shardetcd"]
    head = open_stream(extra=[("grpc-encoding", "gzip")])
    kinds = set()
    for name, damaged in damaged_gzip(11):
        data = head + frame(DATA, END_STREAM, 1, grpc_message(damaged, True))
        with ThreadPoolExecutor(2) as pool:
            (want, _), (got, _) = pool.map(lambda port: outcome(Target("127.0.0.1", port), data),
                                           (etcd.client_port, shardetcd.port))
        assert got == want, f"{name}: etcd {want}, shardetcd {got}"
        kinds.add(want[2].split(" message ")[-1].split(" before ")[0])
    # the damage reached each of Go's verdicts
    assert {"flate: corrupt input", "gzip: invalid checksum", "unexpected EOF", "gzip: invalid header"} <= kinds, kinds


def test_a_request_ended_with_its_headers_is_answered(servers):
    """A unary request whose HEADERS frame ends the stream has no message: etcd 3.5.1's grpc-go
    never answers it (its reader waits for an end of stream it already had); shardetcd answers
    as grpc-go does a request ended by an empty DATA frame."""
    conn = RawH2(Target("127.0.0.1", servers["shardetcd"].port), timeout=10).handshake()
    try:
        conn.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, hpack_literals(fields())))
        conn.pump(lambda: 1 in conn.streams and conn.streams[1].ended, timeout=10)
        assert conn.streams[1].status() == (2, "EOF")
    finally:
        conn.close()
