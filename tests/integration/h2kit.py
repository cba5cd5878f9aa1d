"""A raw HTTP/2 client for transport tests: frames built by hand, header blocks as HPACK
literals, each stream's answer recorded (tests/integration/test_grpc_server.py and
test_http2_differential.py)."""
from __future__ import annotations

import socket
import struct
import time
import urllib.parse

from hpack import Decoder

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
FRAME_SIZE_ERROR, ENHANCE_YOUR_CALM = 0x6, 0xB
SETTINGS_MAX_FRAME_SIZE = 0x5


def frame(ftype: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((ftype, flags)) + struct.pack(">I", stream) + payload


def grpc_message(body: bytes, compressed: bool = False) -> bytes:
    """One length-prefixed gRPC message (``body`` already compressed if ``compressed``)."""
    return bytes((compressed,)) + struct.pack(">I", len(body)) + body


def split_frames(data: bytes) -> tuple[list[tuple[int, int, int, bytes]], bytes]:
    """The whole frames at the start of ``data`` as (type, flags, stream, payload), and the rest."""
    out, pos = [], 0
    while len(data) - pos >= 9:
        n = int.from_bytes(data[pos:pos + 3], "big")
        if len(data) - pos < 9 + n:
            break
        out.append((data[pos + 3], data[pos + 4], int.from_bytes(data[pos + 5:pos + 9], "big") & 0x7FFFFFFF,
                    data[pos + 9:pos + 9 + n]))
        pos += 9 + n
    return out, data[pos:]


def _encode_int(n: int, prefix_bits: int, first: int = 0) -> bytes:
    cap = (1 << prefix_bits) - 1
    if n < cap:
        return bytes((first | n,))
    out, n = [first | cap], n - cap
    while n >= 128:
        out.append(n % 128 + 128)
        n //= 128
    return bytes((*out, n))


def hpack_literals(headers) -> bytes:
    """A header block of literals without indexing, new names, no Huffman: valid for any decoder."""
    out = b""
    for name, value in headers:
        name, value = name.encode(), value.encode()
        out += b"\x00" + _encode_int(len(name), 7) + name + _encode_int(len(value), 7) + value
    return out


class RawStream:
    def __init__(self) -> None:
        self.header_blocks: list[list[tuple[str, str]]] = []
        self.data = b""
        self.ended = False
        self.reset: int | None = None

    def messages(self) -> list[bytes]:
        out, data = [], self.data
        while data:
            assert len(data) >= 5 and data[0] == 0, f"bad gRPC message framing: {data[:16]!r}"
            n = int.from_bytes(data[1:5], "big")
            out.append(data[5:5 + n])
            data = data[5 + n:]
        return out

    def status(self) -> tuple[int, str]:
        """(grpc-status, grpc-message) of the trailers (or a trailers-only answer)."""
        trailers = dict(self.header_blocks[-1])
        return int(trailers["grpc-status"]), urllib.parse.unquote(trailers.get("grpc-message", ""))

    @property
    def trailers_only(self) -> bool:
        return len(self.header_blocks) == 1 and self.ended


class RawH2:
    """An HTTP/2 client connection on a plain socket: sends what it is told, acknowledges
    SETTINGS and PINGs, keeps the receive windows open, and records each stream's answer."""

    def __init__(self, server, timeout: float = 10.0) -> None:
        """``server``: anything with ``host`` and ``port``."""
        self.sock = socket.create_connection((server.host, server.port), timeout=timeout)
        self.buf = b""
        self.hpack = Decoder()
        self.streams: dict[int, RawStream] = {}
        self.goaway: tuple[int, int, bytes] | None = None
        self.closed = False
        self._block: tuple[int, bool, bytearray] | None = None
        self.auto_credit = True  # False: the test gives the server its windows itself
        self.settings_seen = False  # the server's SETTINGS arrived (and were acknowledged)
        self.settings: dict[int, int] = {}  # what they said
        self.largest_data = 0  # the longest DATA payload received

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _reply(self, data: bytes) -> None:
        """What the client answers by itself (acknowledgements, window): a server that has
        closed the connection meanwhile needs none of it."""
        try:
            self.sock.sendall(data)
        except OSError:
            self.closed = True

    def handshake(self) -> RawH2:
        self.send(PREFACE + frame(SETTINGS, 0, 0))
        return self

    def request(self, stream: int, path: str, messages=(), headers=(), end_stream: bool = True) -> RawStream:
        self.streams[stream] = RawStream()
        block = hpack_literals([(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
                                ("content-type", "application/grpc"), ("te", "trailers"), *headers])
        out = frame(HEADERS, END_HEADERS | (END_STREAM if end_stream and not messages else 0), stream, block)
        for i, m in enumerate(messages):
            last = i == len(messages) - 1
            out += frame(DATA, END_STREAM if end_stream and last else 0, stream, grpc_message(m.SerializeToString()))
        self.send(out)
        return self.streams[stream]

    def pump(self, until, timeout: float = 10.0) -> None:
        """Read frames until ``until()`` holds (or the connection closes, then check ``until``)."""
        deadline = time.monotonic() + timeout
        while not until():
            if self.closed:
                raise AssertionError(f"connection closed first; goaway={self.goaway}")
            left = deadline - time.monotonic()
            if left <= 0:
                streams = {k: vars(v) for k, v in self.streams.items()}
                raise AssertionError(f"nothing more within {timeout}s; streams={streams}")
            data = self._recv(left)
            if data:
                self.buf += data
                self._frames()

    def until_closed(self, timeout: float = 10.0) -> None:
        """Read (and drop) whatever comes until the server closes the connection."""
        deadline = time.monotonic() + timeout
        while not self.closed:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"the server kept the connection open for {timeout}s")
            self._recv(left)

    def _recv(self, timeout: float) -> bytes | None:
        """What arrives within ``timeout`` (None: nothing yet); at the end of the connection b""
        and ``closed`` set."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 16)
        except TimeoutError:
            return None
        except ConnectionError:
            data = b""
        if not data:
            self.closed = True
        return data

    def close(self, reset: bool = False) -> None:
        if reset:  # an RST instead of a FIN
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def _frames(self) -> None:
        frames, self.buf = split_frames(self.buf)
        for frame_ in frames:
            self._frame(*frame_)

    @staticmethod
    def _unpad(flags: int, payload: bytes) -> bytes:
        if flags & PADDED:
            return payload[1:len(payload) - payload[0]]
        return payload

    def _frame(self, ftype: int, flags: int, stream: int, payload: bytes) -> None:
        if ftype == SETTINGS and not flags & ACK:
            self._reply(frame(SETTINGS, ACK, 0))
            self.settings_seen = True
            self.settings.update(struct.unpack(">HI", payload[i:i + 6]) for i in range(0, len(payload), 6))
        elif ftype == PING and not flags & ACK:
            self._reply(frame(PING, ACK, 0, payload))
        elif ftype == GOAWAY:
            self.goaway = (int.from_bytes(payload[:4], "big") & 0x7FFFFFFF, int.from_bytes(payload[4:8], "big"),
                           payload[8:])
        elif ftype == HEADERS:
            fragment = self._unpad(flags, payload)
            if flags & PRIORITY:
                fragment = fragment[5:]
            self._block = (stream, bool(flags & END_STREAM), bytearray(fragment))
            if flags & END_HEADERS:
                self._headers_done()
        elif ftype == CONTINUATION:
            self._block[2].extend(payload)
            if flags & END_HEADERS:
                self._headers_done()
        elif ftype == DATA:
            st = self.streams.setdefault(stream, RawStream())
            st.data += self._unpad(flags, payload)
            self.largest_data = max(self.largest_data, len(payload))
            if payload and self.auto_credit:  # give the window back at once
                update = struct.pack(">I", len(payload))
                self._reply(frame(WINDOW_UPDATE, 0, 0, update) +
                            (b"" if flags & END_STREAM else frame(WINDOW_UPDATE, 0, stream, update)))
            if flags & END_STREAM:
                st.ended = True
        elif ftype == RST_STREAM:
            self.streams.setdefault(stream, RawStream()).reset = int.from_bytes(payload, "big")

    def _headers_done(self) -> None:
        stream, end, block = self._block
        self._block = None
        st = self.streams.setdefault(stream, RawStream())
        st.header_blocks.append(self.hpack.decode(bytes(block)))
        if end:
            st.ended = True
