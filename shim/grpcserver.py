"""A gRPC server on asyncio's transports: HTTP/2 framing written here, HPACK decoding by
``hpack``, and the part of grpc.aio's server API the shim uses (generic handlers, the
four call shapes, ``ServicerContext.abort``/``invocation_metadata``/``code``/
``auth_context``, deadlines, cancellation, ``stop(grace)``).

Why: grpc.aio costs ~200 µs of CPU per unary call and ~80 µs per streamed message on
this hardware (bench/README.md, "The gRPC server"); this server does the same calls for
a fraction of that, so that the store, not the transport, bounds what a process serves.
grpcio's server stays available (``--grpc-server grpcio``) and the clients the shim
uses (followers, the gateway) stay grpcio's.

What it implements of RFC 9113 and gRPC's HTTP/2 protocol:
* the connection preface, SETTINGS (initial window, max frame size, max concurrent
  streams), PING (answered; clients pinging more often than ``min_ping_interval_s``
  get GOAWAY ENHANCE_YOUR_CALM "too_many_pings" after two strikes, as grpc-go), GOAWAY, RST_STREAM, WINDOW_UPDATE, CONTINUATION, padding and
  priority fields;
* flow control both ways: what a stream sends waits for the peer's windows; what it
  receives is credited back as a unary call gets its request, and as a streaming call's
  handler takes each message (so a handler that stops reading stops its client), and a
  client that sends past a stream's window has that stream reset (FLOW_CONTROL_ERROR);
* bad input answered as etcd's grpc-go server answers it (tests/integration/
  test_http2_differential.py): a frame RFC 9113 forbids (wrong stream, wrong length,
  padding as long as the frame) ends the connection with a GOAWAY carrying the RFC's
  code; a malformed request (a header name that is not a lower-case token, a control
  character in a value, unknown, repeated or misplaced pseudo-headers, a method other
  than POST, a grpc-timeout that is not one) has its stream reset with PROTOCOL_ERROR,
  DATA after the client's END_STREAM with STREAM_CLOSED; the connection's other calls go on;
  a second header block on a stream is checked as grpc-go checks it (a request that is not
  gRPC's first: the stream reset; a gRPC request on a stream id used before ends the
  connection); a client's GOAWAY changes nothing;
* gRPC framing: length-prefixed messages (gzip-compressed ones inflated as Go reads gzip,
  shim/gogzip.py; another grpc-encoding, a compressed flag without one, a payload format other
  than 0 or 1, a request that ends within its message, each refused in grpc-go's words),
  ``grpc-timeout``, ``-bin`` metadata, status in trailers (trailers-only when nothing
  was sent), ``grpc-message`` percent-encoded;
* server keepalive: an idle connection is pinged every ``keepalive_interval_s`` and
  closed if the answer takes longer than ``keepalive_timeout_s``; one that has not sent its
  preface within ``handshake_timeout_s`` (grpc-go's 120 s) is closed; one whose client keeps
  calling for acknowledgements without reading ours is not read until it does (grpc-go's
  rule, ``Connection._answer``);
* a connection that opens with an HTTP/1.1 request instead of the HTTP/2 preface goes to
  ``Server.http1`` (the shim's HTTP endpoint: etcd's /health, /metrics, /version and JSON
  gateway share its client port); our SETTINGS wait for the client's preface, so such a
  client never sees an HTTP/2 byte. An HTTP/2 request whose content-type is not gRPC's is
  answered as HTTP by ``Server.http2`` on a TLS connection (curl over TLS negotiates h2; etcd's
  Go server routes by content-type there), and reset with PROTOCOL_ERROR on a plain one (etcd
  hands plain-text HTTP/2 to grpc-go, which does that).

Response headers are written as HPACK literals without indexing, so the peer's dynamic
table is never touched and nothing needs an encoder's state.

Each call's handler runs in a task, except a unary method marked ``eager`` (an attribute
of its behavior function, set by ``shim.handlers.eager``): it starts in ``Server.begin``
once the bytes that completed its request were read, and a task takes over only where it
first waits. A Range that answers at once so costs no task and no loop turn.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import collections.abc
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import formatdate
import logging
from types import SimpleNamespace
import socket
import ssl
import time

import grpc
from hpack import Decoder
from hpack.exceptions import HPACKError

from .gogzip import GzipError, TooLarge, gunzip
from .gojson import go_quote_bytes
from .peercheck import rejects
from .wire import Parts

logger = logging.getLogger(__name__)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR = 0, 1, 2, 3, 6
STREAM_CLOSED, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 5, 7, 8, 9, 11
SETTINGS_HEADER_TABLE_SIZE, SETTINGS_MAX_CONCURRENT_STREAMS, SETTINGS_INITIAL_WINDOW_SIZE = 1, 3, 4
SETTINGS_MAX_FRAME_SIZE = 5
END_DATA = -1  # a stream's queued last frame: an empty DATA frame with END_STREAM
DEFAULT_WINDOW = 65535
MAX_WINDOW = 2**31 - 1
STREAM_WINDOW = 4 << 20  # what one stream may have in flight towards us
CONNECTION_WINDOW = 16 << 20
MAX_FRAME = 16384  # what we accept (the protocol's default); what we send follows the peer's setting
MAX_HEADER_BLOCK = 1 << 20  # a longer header block (or decoded list) ends the connection
MAX_UNREAD_ANSWERS = 50  # see Connection._answer
WRITE_BACKLOG = 64 << 20  # unread bytes past which a client's requests are not read either (a backstop)
LINGER_S = 1.0  # longest a closing connection reads (and drops) what its client still sends: Connection.close
MAX_PING_STRIKES = 2  # grpc-go's: the third too-early ping closes the connection
_HIGH_BIT_BYTES = bytes(range(128, 256))
_DECOMPRESSED = (None, b"", b"identity", b"gzip")  # the grpc-encodings etcd's server takes
UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


def _frame(kind: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + sid.to_bytes(4, "big") + payload


def _hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 127) | 128)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: bytes, value: bytes) -> bytes:
    """A header field as an HPACK literal without indexing, new name, no Huffman."""
    return b"\x00" + _hpack_int(len(name), 7) + name + _hpack_int(len(value), 7) + value


# :status 200 (static index 8) and content-type (static name index 31) as a literal
RESPONSE_HEADERS = b"\x88" + b"\x0f\x10" + _hpack_int(16, 7) + b"application/grpc"
OK_TRAILERS = _literal(b"grpc-status", b"0")


def _percent_encode(message: str) -> bytes:
    raw = message.encode("utf-8", "replace")
    if all(0x20 <= b <= 0x7E and b != 0x25 for b in raw):
        return raw
    return b"".join(bytes((b,)) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in raw)


def _status_block(code: grpc.StatusCode, message: str) -> bytes:
    block = _literal(b"grpc-status", str(code.value[0]).encode())
    return block + _literal(b"grpc-message", _percent_encode(message)) if message else block


# what etcd's Go HTTP/2 server takes for a header name (a lower-case token), for a value
# (no control character but HTAB) and for a request's pseudo-header fields; a field that
# breaks them makes the request malformed: its stream is reset with PROTOCOL_ERROR
_NAME_BYTES = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz"
_BAD_VALUE_BYTES = bytes(b for b in range(32) if b != 9) + b"\x7f"
_PSEUDO = frozenset((b":method", b":scheme", b":path", b":authority"))
MALFORMED, MALFORMED_GRPC = 1, 2  # a malformed request; a request that is malformed as a gRPC call


def _read_fields(fields: list[tuple[bytes, bytes]]) -> tuple:
    """(path, timeout in seconds or None, grpc-encoding, metadata, whether the content type is gRPC,
    0 or how it is malformed) of a call's request headers."""
    path, timeout, encoding, metadata, grpc_content = "", None, None, [], False
    malformed, method, pseudo, regular = 0, b"", [], False
    for name, value in fields:
        if len(value.translate(None, _BAD_VALUE_BYTES)) != len(value):
            malformed = MALFORMED
        if name[:1] == b":":
            if regular or name not in _PSEUDO or name in pseudo:  # after a regular field, unknown, twice
                malformed = MALFORMED
            pseudo.append(name)
            if name == b":path":
                path = value.decode("utf-8", "replace")
                if path[:1] != "/" and "/" in path:  # etcd's server takes "service/method" too
                    path = "/" + path
            elif name == b":method":
                method = value
            continue
        if not name or name.translate(None, _NAME_BYTES):
            malformed = MALFORMED
        regular = True
        if name == b"grpc-timeout":
            timeout = _timeout_s(value)
            if timeout is None:
                malformed = malformed or MALFORMED_GRPC
        elif name == b"grpc-encoding":
            encoding = value
        elif name in (b"content-type", b"te", b"grpc-accept-encoding", b"user-agent"):
            if name == b"user-agent":
                metadata.append(("user-agent", value.decode("latin-1")))
            elif name == b"content-type":  # grpc-go's rule: application/grpc, or it and + or ; and more
                grpc_content = value[:16] == b"application/grpc" and value[16:17] in (b"", b"+", b";")
        else:
            key = name.decode("latin-1")
            if key.endswith("-bin"):
                try:
                    metadata.append((key, base64.b64decode(value + b"=" * (-len(value) % 4))))
                except binascii.Error:
                    pass  # etcd's server drops a value that is not base64 and serves the call
            else:
                metadata.append((key, value.decode("latin-1")))
    if method != b"POST":
        malformed = malformed or MALFORMED_GRPC
    return path, timeout, encoding, tuple(metadata), grpc_content, malformed


def _timeout_s(value: bytes) -> float | None:
    """gRPC's grpc-timeout: one to eight digits and a unit; None if it is not that."""
    digits = value[:-1]
    unit = UNITS.get(chr(value[-1])) if value else None
    if unit is None or not 0 < len(digits) <= 8 or not digits.isdigit():
        return None
    return int(digits) * unit


class CallDetails:
    """grpc.HandlerCallDetails, as a generic handler's ``service()`` reads it."""

    __slots__ = ("method", "invocation_metadata")

    def __init__(self, method: str, metadata: tuple = ()) -> None:
        self.method, self.invocation_metadata = method, metadata


def _identity(message):
    return message


def _unpadded(payload: bytes) -> bytes:
    """A padded frame's payload without its pad length byte and padding; padding as long as
    the payload is a connection error PROTOCOL_ERROR (RFC 9113 6.1)."""
    if not payload or payload[0] >= len(payload):
        raise _ConnectionError(PROTOCOL_ERROR)
    return payload[1:len(payload) - payload[0]]


@dataclass
class ServerOptions:
    max_receive_message_bytes: int = 4 << 20  # a longer request message is refused before it is held
    receive_limit_bytes: int | None = None  # the limit the refusal names (etcd's, which the handlers enforce)
    max_concurrent_streams: int = 2**31 - 1
    min_ping_interval_s: float = 300.0  # grpc-go's default enforcement
    keepalive_interval_s: float = 7200.0
    keepalive_timeout_s: float = 20.0
    handshake_timeout_s: float = 120.0  # a connection that has not sent its preface by then is closed (grpc-go's)
    # once a TLS handshake is done: the client's certificate (DER, or None) -> why it is refused, or None
    check_client: Callable[[bytes | None], str | None] | None = None


class _Ended(Exception):
    """The call is over (aborted, cancelled or answered): nothing more is sent on it."""


class Call:
    """One stream: the server side of one gRPC call, and the ServicerContext its handler sees."""

    __slots__ = ("conn", "sid", "method", "metadata", "handler", "task", "recv", "messages", "waiter",
                 "remote_done", "window", "pending", "drained", "headers_sent", "closed", "_code", "_details",
                 "deadline", "timer", "encoding", "unacked", "owed", "streaming_request", "expired", "serialize",
                 "deserialize", "refusal")

    def __init__(self, conn: Connection, sid: int, method: str, metadata: tuple, handler, encoding: bytes | None):
        self.conn, self.sid, self.method, self.metadata, self.handler = conn, sid, method, metadata, handler
        self.task: asyncio.Task | None = None
        self.recv = bytearray()  # bytes of a message not complete yet
        self.messages: deque = deque()  # complete request messages the handler has not taken
        self.waiter: asyncio.Future | None = None  # a handler waiting for the next message
        self.remote_done = False  # the client half-closed (END_STREAM) or went away
        self.window = conn.peer_initial_window
        self.pending: deque = deque()  # frames waiting for flow-control window
        self.drained: asyncio.Future | None = None
        self.headers_sent = False
        self.closed = False
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self.deadline: float | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.encoding = encoding
        self.unacked = 0  # bytes taken from the stream and not yet credited back
        self.owed = 0  # bytes received on the stream and not yet credited back (its window used)
        self.streaming_request = handler.request_streaming
        self.expired = False
        self.serialize = handler.response_serializer or _identity
        self.deserialize = handler.request_deserializer or _identity
        # etcd's server decompresses gzip only: a call naming another grpc-encoding is refused
        # before its messages are read, compressed or not
        self.refusal: tuple[grpc.StatusCode, str] | None = None if encoding in _DECOMPRESSED else (
            grpc.StatusCode.UNIMPLEMENTED,
            f"grpc: Decompressor is not installed for grpc-encoding {go_quote_bytes(encoding)}")

    # -- the ServicerContext the shim's handlers use ------------------------------------

    def invocation_metadata(self) -> tuple:
        return self.metadata

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata=()) -> None:
        """The call ends now with this status, whichever task aborts it (as grpc.aio's): a
        stream's request reader aborting ends the call its handler is still serving."""
        self.end(code, details)
        raise grpc.aio.AbortError()

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def set_details(self, details: str) -> None:
        self._details = details

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def details(self) -> str:
        return self._details

    def time_remaining(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - self.conn.loop.time())

    def cancelled(self) -> bool:
        """The client went away, or the deadline passed (an answered or aborted call was not cancelled)."""
        return self.closed and (self._code is None or self.expired)

    def done(self) -> bool:
        return self.closed

    def peer(self) -> str:
        host, port = (self.conn.transport.get_extra_info("peername") or ("", 0))[:2]
        return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"

    def auth_context(self) -> dict:
        """What grpc's auth context holds that the shim reads: the client certificate's Common Name."""
        cert = self.conn.transport.get_extra_info("peercert")
        names = [value.encode() for rdn in (cert or {}).get("subject", ()) for key, value in rdn
                 if key == "commonName"]
        return {"x509_common_name": names} if names else {}

    async def read(self):
        """The next request message, or grpc.aio.EOF."""
        try:
            return await self._next()
        except StopAsyncIteration:
            return grpc.aio.EOF

    async def write(self, message) -> None:
        self.send_message(self.serialize(message))
        if self.pending or self.conn.paused:
            await self._drain()

    # -- requests -----------------------------------------------------------------------

    def __aiter__(self):
        return self

    async def __anext__(self):
        return await self._next()

    async def _next(self):
        while not self.messages:
            if self.remote_done or self.closed:
                raise StopAsyncIteration
            self.waiter = self.conn.loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        raw = self.messages.popleft()
        self.conn.credit(self, len(raw) + 5)
        return self.deserialize(raw)

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def received(self, data: bytes) -> bool:
        """DATA for this call: complete messages queued; False if the call was refused."""
        if self.refusal is not None:
            self.end(*self.refusal)
            return False
        recv = self.recv
        recv += data
        while len(recv) >= 5:
            size = int.from_bytes(recv[1:5], "big")
            options = self.conn.server.options
            size_cap = options.max_receive_message_bytes
            if size > size_cap:  # refused before it is held, in grpc-go's words
                self.end(grpc.StatusCode.RESOURCE_EXHAUSTED, f"grpc: received message larger than max ({size} "
                            f"vs. {options.receive_limit_bytes or size_cap})")
                return False
            if len(recv) < 5 + size:
                break
            compressed = recv[0]
            raw = bytes(recv[5:5 + size])
            del recv[:5 + size]
            if compressed:
                refused = self._decompress(raw, compressed, options.receive_limit_bytes or size_cap)
                if type(refused) is not bytes:
                    self.end(*refused)
                    return False
                raw = refused
                if self.streaming_request:  # taking it credits len(raw) + 5: what was sent is size + 5
                    self.unacked += size - len(raw)
            self.messages.append(raw)
        if self.messages:
            self._wake()
        return True

    def _decompress(self, raw: bytes, flag: int, limit: int) -> bytes | tuple[grpc.StatusCode, str]:
        """The message inflated, or the status etcd's server refuses it with (grpc-go's words)."""
        if flag != 1:
            return grpc.StatusCode.INTERNAL, f"grpc: received unexpected payload format {flag}"
        if self.encoding != b"gzip":  # none, or identity (any other was refused before)
            return grpc.StatusCode.INTERNAL, "grpc: compressed flag set with identity or empty encoding"
        try:
            return gunzip(raw, limit)
        except GzipError as exc:
            return grpc.StatusCode.INTERNAL, f"grpc: failed to decompress the received message {exc}"
        except TooLarge as exc:
            return grpc.StatusCode.RESOURCE_EXHAUSTED, f"grpc: received message larger than max ({exc.size} vs. {limit})"

    def end(self, code: grpc.StatusCode, message: str) -> None:
        """The call ends now with this status, its handler cancelled (unless it is the caller)."""
        if self.closed:
            return
        self.finish(code, message)
        if self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel()

    def half_closed(self) -> None:
        self.remote_done = True
        self._wake()

    # -- responses ----------------------------------------------------------------------

    def send_message(self, payload: bytes) -> None:
        if self.closed:
            raise _Ended()
        conn = self.conn
        conn.sent_data = True
        if not self.headers_sent:
            self.headers_sent = True
            conn.write(_frame(HEADERS, END_HEADERS, self.sid, RESPONSE_HEADERS))
        if type(payload) is Parts:  # framed part by part, never joined
            self._queue(b"\0" + payload.size.to_bytes(4, "big") + payload[0])
            for part in payload[1:]:
                self._queue(part)
            conn.send_pending(self)
            return
        length = len(payload)
        size = length + 5
        if not self.pending and size <= self.window and size <= conn.window and size <= conn.peer_max_frame:
            self.window -= size
            conn.window -= size
            # one DATA frame: its header and the message's 5-byte prefix, then the message as it is
            conn.out.append(size.to_bytes(3, "big") + b"\0\0" + self.sid.to_bytes(4, "big") + b"\0"
                            + length.to_bytes(4, "big"))
            conn.write(payload)
            return
        # the message's prefix and first part, then the rest as it is (a 100 MB answer copied and
        # cut up at once held the event loop 0.15 s)
        head = conn.peer_max_frame - 5
        self._queue(b"\0" + length.to_bytes(4, "big") + payload[:head])
        self._queue(memoryview(payload)[head:])
        conn.send_pending(self)

    def _queue(self, data: bytes | memoryview) -> None:
        """``data`` to send; ``send_pending`` cuts it into frames as the windows allow."""
        if data:
            self.pending.append((DATA, memoryview(data)))

    def finish(self, code: grpc.StatusCode = grpc.StatusCode.OK, message: str = "") -> None:
        """The call's status (trailers, END_STREAM); the call is over."""
        if self.closed:
            return
        if self._code is None:
            self._code, self._details = code, message
        if code is grpc.StatusCode.OK and not message:
            block = OK_TRAILERS
        else:
            block = _status_block(code, message)
        self.conn.sent_data = True
        if not self.headers_sent:  # trailers-only
            self.headers_sent = True
            block = RESPONSE_HEADERS + block
        if self.pending:  # after the data that waits for window
            self.pending.append((HEADERS, block))
            self.conn.send_pending(self)
        else:
            self.conn._trailers(self.sid, block)
            self.conn.calls.pop(self.sid, None)
        self._close()

    def _close(self) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self._wake()
        self._wake_drained()

    async def _drain(self) -> None:
        conn = self.conn
        while (self.pending or conn.paused) and not self.closed:
            self.drained = conn.loop.create_future()
            try:
                await self.drained
            finally:
                self.drained = None
        if self.closed:
            raise _Ended()

    def _wake_drained(self) -> None:
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    def expire(self) -> None:
        """The call's deadline passed."""
        self.timer = None
        if self.closed:
            return
        self.expired = True
        self.end(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        self.conn.reset(self.sid, CANCEL)

    def cancel(self) -> None:
        """The client reset the stream or went away."""
        self.remote_done = True
        if not self.closed:
            self.pending.clear()
            self._close()
        if self.task is not None and not self.task.done():
            self.task.cancel()


# what an HTTP stream's Call part reads of a handler
_HTTP_HANDLER = SimpleNamespace(request_streaming=False, response_serializer=None, request_deserializer=None)


class HttpStream(Call):
    """An HTTP/2 request that is not a gRPC call (curl over TLS negotiates h2 and asks for
    /health): its body is gathered, then ``Server.http2`` answers it as HTTP through this
    object's ``whole``, or ``start``, ``chunk`` and ``end`` for a streamed answer. Flow control,
    cancellation and the connection's bookkeeping are a call's."""

    __slots__ = ("http_method", "headers", "tls")
    framed = True  # a streamed answer ends with END_STREAM: the connection goes on

    def __init__(self, conn: Connection, sid: int, fields: list[tuple[bytes, bytes]]) -> None:
        method, path, headers = "GET", "/", {}
        for name, value in fields:
            if name == b":method":
                method = value.decode("latin-1")
            elif name == b":path":
                path = value.decode("latin-1")
            elif name[:1] != b":":
                headers[name.decode("latin-1")] = value.decode("latin-1")
        super().__init__(conn, sid, path, (), _HTTP_HANDLER, None)
        self.http_method, self.headers = method, headers
        self.tls = conn.transport.get_extra_info("ssl_object") is not None

    def received(self, data: bytes) -> bool:
        self.recv += data
        if len(self.recv) > self.conn.server.options.max_receive_message_bytes:
            self.start(413, (("content-type", "text/plain; charset=utf-8"),))
            self._last(b"request body too large\n")
            return False
        return True

    def half_closed(self) -> None:
        super().half_closed()
        if self.task is None and not self.closed:
            self.task = self.conn.loop.create_task(self._serve())

    async def _serve(self) -> None:
        conn, task = self.conn, self.task
        conn.server.tasks.add(task)
        try:
            await conn.server.http2(self.http_method, self.method, self.headers, bytes(self.recv), self)
        except (_Ended, asyncio.CancelledError, ConnectionError):
            pass
        except Exception:
            logger.exception("HTTP request failed path=%s", self.method)
            if not self.closed:  # nothing more of the answer: the stream is reset
                self.pending.clear()
                self._close()
                conn.reset(self.sid, INTERNAL_ERROR)
        finally:
            conn.server.call_over(self, task)

    # -- the answer -------------------------------------------------------------------

    def start(self, status: int, headers: tuple) -> None:
        if self.closed:
            raise _Ended()
        self.headers_sent = True
        self.conn.sent_data = True
        block = _literal(b":status", str(status).encode()) + b"".join(
            _literal(name.lower().encode("latin-1"), str(value).encode("latin-1"))
            for name, value in (*headers, ("date", http_date())))
        self.conn.write(_frame(HEADERS, END_HEADERS, self.sid, block))

    def _last(self, data: bytes) -> None:
        """``data`` and the end of the answer, sent as the windows allow; the stream is done."""
        self._queue(data)
        self.pending.append((END_DATA, b""))
        self.conn.send_pending(self)
        self._close()

    async def chunk(self, data: bytes) -> None:
        if self.closed:
            raise _Ended()
        self._queue(data)
        self.conn.send_pending(self)
        if self.pending or self.conn.paused:
            await self._drain()

    async def end(self) -> None:
        if self.closed:
            raise _Ended()
        self._last(b"")

    async def whole(self, status: int, headers: tuple, payload: bytes) -> None:
        self.start(status, (*headers, ("content-length", len(payload))))
        self._last(payload if self.http_method != "HEAD" else b"")


_date: tuple[int, str] = (0, "")


def http_date() -> str:
    """The Date header an HTTP answer carries, as Go's net/http adds it to every handler's answer
    ("Fri, 27 Nov 2026 15:48:36 GMT"); formatted once a second."""
    global _date
    now = int(time.time())
    if _date[0] != now:
        _date = (now, formatdate(now, usegmt=True))
    return _date[1]


class Connection(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.tls = False
        self.buffer = b""
        self.preface = False
        self.decoder = Decoder()
        self.decoder.max_header_list_size = MAX_HEADER_BLOCK
        self.decoded: dict[bytes, list] = {}  # see _decode
        self.calls: dict[int, Call] = {}
        self.last_sid = 0
        self.out: list[bytes] = []
        self.flushing = False
        self.window = DEFAULT_WINDOW  # ours to send on the connection
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = MAX_FRAME
        self.blocked: dict[int, Call] = {}  # calls with frames waiting for window, in order
        self.unacked = 0  # connection-level bytes received and not yet credited back
        self.headers_in: tuple[int, int, bytearray] | None = None  # a header block awaiting CONTINUATION
        self.paused = False
        self.reading_paused = False  # stopped reading a client that does not read: see _answer
        self.unread_answers = 0
        self.going_away = False
        self.lingering: asyncio.TimerHandle | None = None  # closing: see close()
        self.ping_strikes = 0
        self.last_ping = float("-inf")
        self.sent_data = False  # headers or data sent since the last ping
        self.keepalive: asyncio.TimerHandle | None = None
        self.handshake: asyncio.TimerHandle | None = None  # until the preface: _handshake_expired
        self.ping_sent_at: float | None = None
        self.active = self.loop.time()
        self.starting: list[Call] = []  # eager calls completed by the bytes being read (Server.begin)

    # -- transport ------------------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.tls = transport.get_extra_info("ssl_object") is not None
        self.server.connections.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        opts = self.server.options
        if opts.keepalive_interval_s > 0 and opts.keepalive_timeout_s > 0:  # either 0: no pings, as etcd
            self.keepalive = self.loop.call_later(opts.keepalive_interval_s, self._keepalive)
        self.handshake = self.loop.call_later(self.server.options.handshake_timeout_s, self._handshake_expired)
        if self.tls and opts.check_client is not None:  # etcd's checks of the client's certificate
            rejects(opts.check_client, transport)

    def _stop_timers(self) -> None:
        """The connection is ending, or no longer ours (handed to the HTTP endpoint)."""
        for timer in (self.keepalive, self.handshake):
            if timer is not None:
                timer.cancel()

    def _handshake_expired(self) -> None:
        """No HTTP/2 preface (nor an HTTP/1.1 request) within the handshake timeout: an idle or
        stalled connection is not held for ever (grpc-go's 120 s connection timeout)."""
        self.handshake = None
        if not self.preface:
            self.transport.close()

    def _server_preface(self) -> None:
        """Our SETTINGS, once the client's preface says it speaks HTTP/2 (so that an HTTP/1.1
        client handed to the HTTP endpoint never sees them)."""
        opts = self.server.options
        settings = (SETTINGS_MAX_CONCURRENT_STREAMS.to_bytes(2, "big") + min(opts.max_concurrent_streams, 2**32 - 1).to_bytes(4, "big")
                    + SETTINGS_INITIAL_WINDOW_SIZE.to_bytes(2, "big") + STREAM_WINDOW.to_bytes(4, "big"))
        self.write(_frame(SETTINGS, 0, 0, settings)
                   + _frame(WINDOW_UPDATE, 0, 0, (CONNECTION_WINDOW - DEFAULT_WINDOW).to_bytes(4, "big")))

    def _hand_to_http1(self, data: bytes) -> None:
        """Not HTTP/2: an HTTP/1.1 request goes to the HTTP endpoint (etcd serves /health, /metrics,
        /version and its JSON gateway on the client port too); anything else is closed."""
        handler = self.server.http1
        method, space, _ = data[:16].partition(b" ")
        if handler is not None and method.isalpha() and not space and len(data) < 16:
            self.buffer = data  # the method's first letters: wait for the rest of it
            return
        if handler is None or not method.isalpha() or not space:
            self.transport.close()
            return
        self.server.connections.discard(self)
        self._stop_timers()
        reader = asyncio.StreamReader(limit=self.server.http1_read_limit, loop=self.loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=self.loop)
        self.transport.set_protocol(protocol)
        protocol.connection_made(self.transport)
        reader.feed_data(data)
        writer = asyncio.StreamWriter(self.transport, protocol, reader, self.loop)
        task = self.loop.create_task(handler(reader, writer))
        self.server.tasks.add(task)
        task.add_done_callback(self.server.tasks.discard)

    def connection_lost(self, exc) -> None:
        self.server.connections.discard(self)
        self._stop_timers()
        if self.lingering is not None:
            self.lingering.cancel()
        for call in list(self.calls.values()):
            call.cancel()
        self.calls.clear()
        self.blocked.clear()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.unread_answers = 0
        if self.reading_paused:
            self.reading_paused = False
            self.transport.resume_reading()
        for call in list(self.calls.values()):
            call._wake_drained()

    def write(self, data: bytes) -> None:
        self.out.append(data)
        if not self.flushing:
            self.flushing = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flushing = False
        out, self.out = self.out, []
        transport = self.transport
        if not transport.is_closing() and self.lingering is None:  # nothing goes out after close()
            transport.write(b"".join(out))
            if transport.get_write_buffer_size() > WRITE_BACKLOG:  # a client that does not read at all
                self._stop_reading()

    def _answer(self, data: bytes) -> None:
        """A control frame the client's own frame calls for (a SETTINGS or PING acknowledgement, a
        stream's reset). A client that keeps calling for them without reading what we send would
        have them pile up here: past MAX_UNREAD_ANSWERS while our writes are paused, its frames wait
        in its socket until it has read ours (grpc-go's rule, so etcd's)."""
        self.write(data)
        if self.paused:
            self.unread_answers += 1
            if self.unread_answers > MAX_UNREAD_ANSWERS:
                self._stop_reading()

    def _stop_reading(self) -> None:
        if not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()  # until resume_writing

    def close(self) -> None:
        """Close the connection after what was written so far: our FIN once it is out, then what
        the client still sends is read and dropped until it closes its side too, for at most
        LINGER_S. Closing with its bytes unread, or with more on the way, would make our kernel
        answer with an RST, and a client whose next write meets that (a WINDOW_UPDATE, the next
        call) tears the connection down before it has read the answers and the GOAWAY sent
        ahead of it: a fail-stop's "etcdserver: server stopped" became "Broken pipe" so."""
        if self.lingering is not None:
            return
        self._flush()
        self._stop_timers()
        transport = self.transport
        if transport.is_closing() or not transport.can_write_eof():  # TLS: no half-close
            transport.close()
            return
        self.lingering = self.loop.call_later(LINGER_S, transport.abort)
        if self.reading_paused:
            self.reading_paused = False
            transport.resume_reading()
        transport.write_eof()  # once the buffer is out; the client's EOF then closes it (eof_received)

    def reset(self, sid: int, code: int) -> None:
        self._answer(_frame(RST_STREAM, 0, sid, code.to_bytes(4, "big")))

    def _forget(self, sid: int) -> None:
        """Stream ``sid`` is over on the client's side (reset, or broken): its call ends
        unanswered and what it still had to send is dropped."""
        call = self.calls.pop(sid, None)
        self.blocked.pop(sid, None)
        if call is not None:
            call.cancel()

    def _stream_error(self, sid: int, code: int) -> None:
        """A stream the client broke the protocol on: forgotten, and reset with ``code``; the
        connection and its other calls go on."""
        self._forget(sid)
        self.reset(sid, code)

    def go_away(self, code: int, debug: bytes = b"", close: bool = True) -> None:
        self.going_away = True
        self.write(_frame(GOAWAY, 0, 0, self.last_sid.to_bytes(4, "big") + code.to_bytes(4, "big") + debug))
        if close:
            self.close()

    # -- frames in ------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.lingering is not None:
            return  # closing: read only so that the client's close is a FIN, not our RST
        self.active = self.loop.time()
        buf = self.buffer + data if self.buffer else data
        if not self.preface:
            if len(buf) < len(PREFACE):
                if not PREFACE.startswith(buf):
                    self._hand_to_http1(buf)
                    return
                self.buffer = buf
                return
            if not buf.startswith(PREFACE):
                self._hand_to_http1(buf)  # not HTTP/2 with prior knowledge
                return
            self.preface = True
            if self.handshake is not None:
                self.handshake.cancel()
                self.handshake = None
            self._server_preface()
            buf = buf[len(PREFACE):]
        pos, size = 0, len(buf)
        try:
            while size - pos >= 9:
                length = int.from_bytes(buf[pos:pos + 3], "big")
                if length > MAX_FRAME:  # more than our SETTINGS allow
                    raise _ConnectionError(FRAME_SIZE_ERROR)
                end = pos + 9 + length
                if end > size:
                    break
                self._frame(buf[pos + 3], buf[pos + 4], int.from_bytes(buf[pos + 5:pos + 9], "big") & 0x7FFFFFFF,
                            buf[pos + 9:end])
                pos = end
        except _ConnectionError as exc:
            self.buffer = b""
            self.go_away(exc.code)
            return
        except Exception:
            logger.exception("gRPC connection failed")
            self.buffer = b""
            self.go_away(INTERNAL_ERROR)
            return
        finally:  # unary calls completed by these bytes start once all of them were read, as tasks would
            if self.starting:
                starting, self.starting = self.starting, []
                for call in starting:
                    if not call.closed:  # not reset by a later frame
                        self.server.begin(call)
        self.buffer = buf[pos:] if pos < size else b""

    def _frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        """One frame in. A frame the protocol forbids (RFC 9113 section 6: the wrong stream,
        the wrong length, padding longer than the frame) ends the connection with the
        RFC's error code, as etcd's grpc-go server ends it."""
        if self.headers_in is not None and kind != CONTINUATION:
            raise _ConnectionError(PROTOCOL_ERROR)
        if kind == DATA:
            if sid == 0:
                raise _ConnectionError(PROTOCOL_ERROR)
            self._data(flags, sid, payload)
        elif kind == HEADERS:
            if sid == 0:
                raise _ConnectionError(PROTOCOL_ERROR)
            if flags & PADDED:
                payload = _unpadded(payload)
            if flags & PRIORITY_FLAG:
                if len(payload) < 5:
                    raise _ConnectionError(FRAME_SIZE_ERROR)
                payload = payload[5:]
            if flags & END_HEADERS:
                self._headers(sid, flags, payload)
            else:
                self.headers_in = (sid, flags, bytearray(payload))
        elif kind == CONTINUATION:
            if self.headers_in is None or self.headers_in[0] != sid:
                raise _ConnectionError(PROTOCOL_ERROR)
            self.headers_in[2].extend(payload)
            if len(self.headers_in[2]) > MAX_HEADER_BLOCK:  # a CONTINUATION flood
                raise _ConnectionError(ENHANCE_YOUR_CALM)
            if flags & END_HEADERS:
                sid, first, block = self.headers_in
                self.headers_in = None
                self._headers(sid, first, bytes(block))
        elif kind == SETTINGS:
            if sid != 0:
                raise _ConnectionError(PROTOCOL_ERROR)
            if len(payload) % 6 or (flags & ACK and payload):
                raise _ConnectionError(FRAME_SIZE_ERROR)
            if not flags & ACK:
                self._settings(payload)
                self._answer(_frame(SETTINGS, ACK, 0))
        elif kind == WINDOW_UPDATE:
            if len(payload) != 4:
                raise _ConnectionError(FRAME_SIZE_ERROR)
            self._window_update(sid, int.from_bytes(payload, "big") & 0x7FFFFFFF)
        elif kind == PING:
            if sid != 0:
                raise _ConnectionError(PROTOCOL_ERROR)
            if len(payload) != 8:
                raise _ConnectionError(FRAME_SIZE_ERROR)
            if not flags & ACK:
                self._ping(payload)
            elif self.ping_sent_at is not None:
                self.ping_sent_at = None
        elif kind == RST_STREAM:
            if sid == 0:
                raise _ConnectionError(PROTOCOL_ERROR)
            if len(payload) != 4:
                raise _ConnectionError(FRAME_SIZE_ERROR)
            self._forget(sid)
        elif kind == PRIORITY:
            if sid == 0:
                raise _ConnectionError(PROTOCOL_ERROR)
            if len(payload) != 5:
                raise _ConnectionError(FRAME_SIZE_ERROR)
        elif kind == GOAWAY:
            if sid != 0:
                raise _ConnectionError(PROTOCOL_ERROR)
            if len(payload) < 8:
                raise _ConnectionError(FRAME_SIZE_ERROR)
            # a client's GOAWAY changes nothing: etcd's grpc-go server goes on serving its calls,
            # those it opens after it too, until it closes the connection
        # PUSH_PROMISE (a client must not send it) and unknown types are ignored

    def _settings(self, payload: bytes) -> None:
        for i in range(0, len(payload) - 5, 6):
            key, value = int.from_bytes(payload[i:i + 2], "big"), int.from_bytes(payload[i + 2:i + 6], "big")
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise _ConnectionError(FLOW_CONTROL_ERROR)
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for call in self.calls.values():
                    call.window += delta
                if delta > 0:
                    self._unblock()
            elif key == SETTINGS_MAX_FRAME_SIZE:
                self.peer_max_frame = max(MAX_FRAME, min(value, 2**24 - 1))
            elif key == SETTINGS_HEADER_TABLE_SIZE:
                pass  # we never index what we send

    def _window_update(self, sid: int, increment: int) -> None:
        if increment == 0:  # a connection error on the connection, a stream error on a stream (RFC 9113 6.9)
            if sid == 0:
                raise _ConnectionError(PROTOCOL_ERROR)
            self._stream_error(sid, PROTOCOL_ERROR)
            return
        if sid == 0:
            self.window += increment
            self._unblock()
            return
        call = self.calls.get(sid)
        if call is not None:
            call.window += increment
            if call.pending:
                self.send_pending(call)

    def _ping(self, payload: bytes) -> None:
        """Answered; a client pinging more often than the policy allows (since we last sent
        headers or data) gets two strikes, then GOAWAY: grpc-go's enforcement, with calls
        in flight or not (etcd's server permits pings without calls at its minimum time)."""
        now = self.loop.time()
        if self.sent_data:  # grpc-go forgives earlier pings once it has sent headers or data
            self.sent_data = False
            self.ping_strikes, self.last_ping = 0, float("-inf")
        if now - self.last_ping < self.server.options.min_ping_interval_s:
            self.ping_strikes += 1
            if self.ping_strikes > MAX_PING_STRIKES:
                self.go_away(ENHANCE_YOUR_CALM, b"too_many_pings")
                return
        self.last_ping = now
        self._answer(_frame(PING, ACK, 0, payload))

    def _decode(self, block: bytes) -> list:
        """[fields, what _headers read from them] of a header block, HPACK-decoded. A block of
        one-byte indexed fields only (what a client's repeated headers become) leaves the dynamic
        table as it is, so both are remembered until a block that may change the table arrives."""
        indexed_only = not block.translate(None, _HIGH_BIT_BYTES)
        if indexed_only:
            decoded = self.decoded.get(block)
            if decoded is not None:
                return decoded
        else:
            self.decoded.clear()
        try:
            decoded = [self.decoder.decode(block, raw=True), None]
        except HPACKError:
            raise _ConnectionError(COMPRESSION_ERROR) from None
        if indexed_only:
            if len(self.decoded) >= 256:
                self.decoded.clear()
            self.decoded[block] = decoded
        return decoded

    def _headers(self, sid: int, flags: int, block: bytes) -> None:
        decoded = self._decode(block)
        fields, read = decoded
        if read is None:
            read = decoded[1] = _read_fields(fields)
        path, timeout, encoding, metadata, grpc_content, malformed = read
        http = self.tls and self.server.http2 is not None  # HTTP requests are served over h2 (TLS only)
        if sid <= self.last_sid or sid % 2 == 0:
            call = self.calls.get(sid)
            if http and call is not None:  # trailers from the client end its stream
                if flags & END_STREAM:
                    self._half_closed(call)
                return
            if not grpc_content or malformed == MALFORMED:
                self._stream_error(sid, PROTOCOL_ERROR)  # grpc-go checks the request before the stream id
                return
            raise _ConnectionError(PROTOCOL_ERROR)  # a stream id used before, or the server's
        self.last_sid = sid
        if self.going_away or self.server.stopping:
            self.reset(sid, REFUSED_STREAM)
            return
        if len(self.calls) >= self.server.options.max_concurrent_streams:
            self.reset(sid, REFUSED_STREAM)
            return
        if malformed and (grpc_content or malformed == MALFORMED):
            self.reset(sid, PROTOCOL_ERROR)  # RFC 9113 8.1.1: a malformed request is a stream error
            return
        if not grpc_content:
            if not http:  # etcd's plain-text client port hands HTTP/2 to grpc-go, which resets what is not gRPC
                self.reset(sid, PROTOCOL_ERROR)
                return
            call = self.calls[sid] = HttpStream(self, sid, fields)
            if flags & END_STREAM:
                self._half_closed(call)
            return
        handler = self.server.find_handler(path, metadata)
        if handler is None:
            self.write(_frame(HEADERS, END_HEADERS | END_STREAM, sid, RESPONSE_HEADERS + _status_block(
                grpc.StatusCode.UNIMPLEMENTED, "Method not found!")))
            return
        call = Call(self, sid, path, metadata, handler, encoding)
        self.calls[sid] = call
        if timeout is not None:
            call.deadline = self.loop.time() + timeout
            call.timer = self.loop.call_later(timeout, call.expire)
        if handler.request_streaming:
            if call.refusal is not None:  # refused before its handler runs
                call.finish(*call.refusal)
                if not flags & END_STREAM:
                    self.reset(sid, NO_ERROR)
                return
            call.task = self.loop.create_task(self.server.run(call))
        if flags & END_STREAM:
            self._half_closed(call)

    def _half_closed(self, call: Call) -> None:
        """The client ended its side of ``call``: a unary call's request is complete, or missing."""
        call.half_closed()
        if call.streaming_request:
            if call.recv and not call.closed:  # in the middle of a message: a streaming Recv's error
                call.end(grpc.StatusCode.INTERNAL, "unexpected EOF")
            return
        if call.task is not None or call.closed:
            return
        if call.refusal is not None:
            call.finish(*call.refusal)
        elif call.messages:
            if (batch := getattr(call.handler.unary_unary, "batch", None)) is not None:
                self.server.batch(batch, call)
            elif getattr(call.handler.unary_unary, "eager", False):
                self.starting.append(call)  # begun once the rest of this read is handled (data_received)
            else:
                call.task = self.loop.create_task(self.server.run(call))
        elif not call.recv:  # no request message: grpc-go's io.EOF, as its status
            call.finish(grpc.StatusCode.UNKNOWN, "EOF")
        else:  # the request ended within its message: io.ErrUnexpectedEOF, which a stream's RecvMsg makes INTERNAL
            call.finish(grpc.StatusCode.INTERNAL if call.handler.response_streaming else grpc.StatusCode.UNKNOWN,
                        "unexpected EOF")

    def _data(self, flags: int, sid: int, payload: bytes) -> None:
        length = len(payload)
        self.unacked += length
        if self.unacked >= CONNECTION_WINDOW // 4:
            self.write(_frame(WINDOW_UPDATE, 0, 0, self.unacked.to_bytes(4, "big")))
            self.unacked = 0
        if flags & PADDED:
            payload = _unpadded(payload)
        call = self.calls.get(sid)
        if call is None or call.closed:
            return
        if call.remote_done:  # DATA after the client's END_STREAM (RFC 9113 5.1: half-closed)
            self._stream_error(sid, STREAM_CLOSED)
            return
        call.owed += length
        if call.owed > STREAM_WINDOW:  # more than the window we gave the stream: it is not held
            self._stream_error(sid, FLOW_CONTROL_ERROR)
            return
        if payload and not call.received(payload):
            if not flags & END_STREAM:  # answered: the client need not send more (grpc-go's reset)
                self.reset(sid, NO_ERROR)
            return
        # a unary call's bytes are credited as they arrive, a stream's as its handler takes
        # each message (and the padding, which no handler takes, at once)
        if not call.streaming_request:
            self.credit(call, length)
        elif length > len(payload):
            self.credit(call, length - len(payload))
        if flags & END_STREAM:
            self._half_closed(call)

    def credit(self, call: Call, size: int) -> None:
        """``size`` bytes of ``call``'s have been taken: the client may send as many more on it."""
        call.unacked += size
        if call.unacked >= STREAM_WINDOW // 4 and not call.remote_done:
            self.write(_frame(WINDOW_UPDATE, 0, call.sid, call.unacked.to_bytes(4, "big")))
            call.owed -= call.unacked
            call.unacked = 0

    # -- frames out under flow control ---------------------------------------------------

    def send_pending(self, call: Call) -> None:
        """Send what of ``call``'s queued frames the windows allow; the rest waits for WINDOW_UPDATE."""
        pending = call.pending
        while pending:
            kind, payload = pending[0]
            if kind == DATA:
                while True:  # frames of at most the peer's size, as long as the windows allow
                    size = min(len(payload), self.peer_max_frame)
                    allowed = min(call.window, self.window)
                    if size > allowed:  # what the windows allow now, the rest when they grow
                        if allowed > 0:
                            call.window -= allowed
                            self.window -= allowed
                            self.write(_frame(DATA, 0, call.sid, payload[:allowed]))
                            self.sent_data = True  # as grpc-go, a ping is forgiven by any data written since
                            pending[0] = (DATA, payload[allowed:])
                        self.blocked[call.sid] = call
                        return
                    call.window -= size
                    self.window -= size
                    self.write(_frame(DATA, 0, call.sid, payload[:size]))
                    self.sent_data = True
                    if size == len(payload):
                        break
                    payload = payload[size:]
                    pending[0] = (DATA, payload)
            else:  # the call's last frame: trailers, or the empty DATA frame that ends an HTTP answer
                if kind == HEADERS:
                    self._trailers(call.sid, payload)
                else:
                    self.write(_frame(DATA, END_STREAM, call.sid))
                self.calls.pop(call.sid, None)
            pending.popleft()
        self.blocked.pop(call.sid, None)
        call._wake_drained()

    def _trailers(self, sid: int, block: bytes) -> None:
        frame_max = self.peer_max_frame
        if len(block) <= frame_max:
            self.write(_frame(HEADERS, END_HEADERS | END_STREAM, sid, block))
            return
        parts = [block[i:i + frame_max] for i in range(0, len(block), frame_max)]
        self.write(_frame(HEADERS, END_STREAM, sid, parts[0]))
        for i, part in enumerate(parts[1:], 1):
            self.write(_frame(CONTINUATION, END_HEADERS if i == len(parts) - 1 else 0, sid, part))

    def _unblock(self) -> None:
        for call in list(self.blocked.values()):
            if self.window <= 0:
                return
            self.send_pending(call)
        if self.going_away and not self.calls:
            self.close()

    # -- keepalive ----------------------------------------------------------------------------

    def _keepalive(self) -> None:
        opts = self.server.options
        now = self.loop.time()
        if self.ping_sent_at is not None:  # the last ping went unanswered
            if now - self.ping_sent_at >= opts.keepalive_timeout_s:
                self.transport.close()
                return
            self.keepalive = self.loop.call_later(opts.keepalive_timeout_s, self._keepalive)
            return
        if now - self.active >= opts.keepalive_interval_s:
            self.ping_sent_at = now
            self.write(_frame(PING, 0, 0, b"\0" * 8))
            self.keepalive = self.loop.call_later(opts.keepalive_timeout_s, self._keepalive)
        else:
            self.keepalive = self.loop.call_later(opts.keepalive_interval_s - (now - self.active), self._keepalive)


class _Rest(collections.abc.Coroutine):
    """The rest of a coroutine that ran until it first waited (Server.begin), as a task's
    coroutine: the task's first step is handed what it waits for, as if it had run it."""

    __slots__ = ("coro", "awaited")

    def __init__(self, coro, awaited) -> None:
        self.coro, self.awaited = coro, awaited

    def send(self, value):
        if (awaited := self.awaited) is not _STARTED:
            self.awaited = _STARTED
            return awaited
        return self.coro.send(value)

    def throw(self, typ, val=None, tb=None):
        """Into the coroutine where it waits; cancelled before the task's first step, what it
        waits for is cancelled too (as a task cancels what it waits for)."""
        if (awaited := self.awaited) is not _STARTED:
            self.awaited = _STARTED
            if isinstance(awaited, asyncio.Future):
                awaited.cancel()
        return self.coro.throw(typ) if val is None and tb is None else self.coro.throw(typ, val, tb)

    def close(self) -> None:
        self.coro.close()

    @property
    def cr_frame(self):  # where it waits, for the task's stack (journal.tasks.awaiting)
        return self.coro.cr_frame

    @property
    def cr_await(self):
        return self.coro.cr_await

    @property
    def __name__(self) -> str:  # the task's repr names the coroutine it goes on with
        return self.coro.__qualname__

    def __await__(self):
        return self

    def __next__(self):
        return self.send(None)


_STARTED = object()


class _ConnectionError(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class Server:
    """grpc.aio.Server's surface as the shim uses it."""

    def __init__(self, options: ServerOptions | None = None) -> None:
        self.options = options or ServerOptions()
        self.handlers: list = []
        self.sockets: list[tuple[socket.socket, ssl.SSLContext | None]] = []
        self.listeners: list[asyncio.AbstractServer] = []
        self.connections: set[Connection] = set()
        self.tasks: set[asyncio.Task] = set()
        self.batches: dict = {}  # handlers.batched's batch -> its calls completed this loop turn
        self.stopping = False
        self.loop: asyncio.AbstractEventLoop | None = None
        # an HTTP/1.1 connection on the gRPC port goes here: handler(reader, writer), as asyncio.start_server's
        self.http1 = None
        self.http1_read_limit = 1 << 16  # its StreamReader's limit (asyncio's default)
        # an HTTP/2 request that is not gRPC: handler(method, path, headers, body, answer), see HttpStream
        self.http2 = None

    def add_generic_rpc_handlers(self, handlers) -> None:
        self.handlers.extend(handlers)

    def add_insecure_port(self, address: str) -> int:
        return self._bind(address, None)

    def add_secure_port(self, address: str, context: ssl.SSLContext) -> int:
        return self._bind(address, context)

    def _bind(self, address: str, context: ssl.SSLContext | None) -> int:
        host, _, port = address.rpartition(":")
        host = host[1:-1] if host.startswith("[") else host
        port_number = int(port)
        bound = 0
        try:
            infos = socket.getaddrinfo(host or None, port_number, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except socket.gaierror as exc:
            raise RuntimeError(f"cannot resolve {address}: {exc}") from None
        seen, listening = set(), []
        for family, kind, proto, _, sockaddr in infos:
            if (family, sockaddr[0]) in seen:
                continue
            seen.add((family, sockaddr[0]))
            sock = socket.socket(family, kind, proto)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind((sockaddr[0], bound or port_number, *sockaddr[2:]))
                sock.listen(1024)
            except OSError as exc:
                for s in (sock, *listening):  # all of the address or none: a caller may try it again
                    s.close()
                raise RuntimeError(f"cannot listen on {address}: {exc.strerror}") from None
            sock.setblocking(False)
            bound = sock.getsockname()[1]
            listening.append(sock)
        if not bound:
            raise RuntimeError(f"cannot listen on {address}")
        self.sockets += [(sock, context) for sock in listening]
        return bound

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        for sock, context in self.sockets:
            self.listeners.append(await self.loop.create_server(lambda: Connection(self), sock=sock, ssl=context))

    def find_handler(self, path: str, metadata: tuple):
        details = CallDetails(path, metadata)
        for generic in self.handlers:
            handler = generic.service(details)
            if handler is not None:
                return handler
        return None

    def begin(self, call: Call) -> None:
        """Run a unary call's handler here and now, up to where it first waits; a task takes the rest."""
        call.task = self._start(self.run(call))

    def _start(self, coro) -> asyncio.Task | None:
        """Run ``coro`` here and now up to where it first waits; a task (returned) takes the rest."""
        try:
            awaited = coro.send(None)
        except StopIteration:
            return None
        task = self.loop.create_task(_Rest(coro, awaited))
        self.tasks.add(task)
        return task

    def batch(self, batch, call: Call) -> None:
        """``call``'s request is complete and its method is batched (handlers.batched): it joins the
        calls to ``batch`` of this loop turn, which start together at the turn's end."""
        calls = self.batches.get(batch)
        if calls is None:
            if not self.batches:
                self.loop.call_soon(self._start_batches)
            calls = self.batches[batch] = []
        calls.append(call)

    def _start_batches(self) -> None:
        batches, self.batches = self.batches, {}
        for batch, calls in batches.items():
            calls = [call for call in calls if not call.closed]  # not reset or expired meanwhile
            if len(calls) > 1:
                self._start(self._run_batch(batch, calls))
            elif calls:  # alone: its own handler is cheaper than a batch of one
                self.begin(calls[0])

    async def _run_batch(self, batch, calls: list[Call]) -> None:
        """Answer ``calls`` through ``batch``, each with its own response or status. The calls
        have no task of their own (call.task): one reset, expiring or aborted leaves the others be."""
        try:
            try:
                results = await batch([call.deserialize(call.messages.popleft()) for call in calls], calls)
            except asyncio.CancelledError as exc:  # the server is stopping
                results = [exc] * len(calls)
            except Exception as exc:
                logger.exception("gRPC handler failed method=%s", calls[0].method)
                results = [exc] * len(calls)
            for call, result in zip(calls, results):
                if call.closed:  # reset, expired or refused meanwhile
                    continue
                if isinstance(result, BaseException):
                    self._failed(call, result)
                else:
                    call.send_message(call.serialize(result))
                    call.finish()
        finally:
            for call in calls:
                self.call_over(call, None)
            self.tasks.discard(asyncio.current_task())

    @staticmethod
    def _failed(call: Call, exc: BaseException) -> None:
        """``call``'s handler ended in ``exc``: the status the call ends with."""
        if isinstance(exc, grpc.aio.AbortError):
            call.finish(call._code or grpc.StatusCode.UNKNOWN, call._details)  # set by abort; this is for a handler's own
        elif isinstance(exc, asyncio.CancelledError):
            if not call.closed:  # the server is stopping
                call.finish(grpc.StatusCode.UNAVAILABLE, "server is shutting down")
        elif not isinstance(exc, _Ended):
            call.finish(grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc)}: {exc}")

    async def run(self, call: Call) -> None:
        """Run ``call``'s handler and send its answer and status."""
        handler = call.handler
        if (task := call.task) is not None:
            self.tasks.add(task)
        try:
            request = call if handler.request_streaming else call.deserialize(call.messages.popleft())
            if handler.response_streaming:
                fn = handler.stream_stream if handler.request_streaming else handler.unary_stream
                responses = fn(request, call)
                if hasattr(responses, "__aiter__"):
                    try:
                        async for response in responses:
                            call.send_message(call.serialize(response))
                            if call.pending or call.conn.paused:
                                await call._drain()
                    finally:  # a call ended between two messages: the handler's cleanup runs now
                        if (aclose := getattr(responses, "aclose", None)) is not None:
                            await aclose()
                else:
                    await responses  # a handler that writes through context.write()
            else:
                fn = handler.stream_unary if handler.request_streaming else handler.unary_unary
                call.send_message(call.serialize(await fn(request, call)))
            call.finish()
        except (grpc.aio.AbortError, _Ended, asyncio.CancelledError) as exc:
            self._failed(call, exc)
        except Exception as exc:
            logger.exception("gRPC handler failed method=%s", call.method)
            self._failed(call, exc)
        finally:
            self.call_over(call, call.task)

    def call_over(self, call: Call, task: asyncio.Task) -> None:
        """``call``'s handler task ended (an HTTP stream's too): its stream is reset if the client
        still sends, forgotten once its last frames are out, and a going-away connection closes
        after its last call."""
        self.tasks.discard(task)
        conn = call.conn
        if call.remote_done is False and call.closed and not call.expired:
            conn.reset(call.sid, NO_ERROR)  # we answered: the client need not send more
        if not call.pending:
            conn.calls.pop(call.sid, None)
        if conn.going_away and not conn.calls:
            conn.close()

    async def stop(self, grace: float | None) -> None:
        """Refuse new calls (GOAWAY), let calls in flight end within ``grace`` seconds, then cancel them."""
        self.stopping = True
        for listener in self.listeners:
            listener.close()
        for conn in list(self.connections):
            conn.go_away(NO_ERROR, close=False)
        if self.tasks and grace:
            await asyncio.wait(list(self.tasks), timeout=grace)
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=1.0)
        for conn in list(self.connections):
            conn.close()
        deadline = self.loop.time() + LINGER_S
        while self.connections and self.loop.time() < deadline:  # their clients close, or LINGER_S aborts them
            await asyncio.sleep(0.01)
        for listener in self.listeners:
            await listener.wait_closed()
