"""A small HTTP endpoint: /metrics, /health, /readyz, /livez, /version and the /v3 JSON gateway.

Requests are read as Go's net/http reads them (etcd's client port; compared with a real
etcd in tests/integration/test_http1_differential.py): HTTP/1.0 and 1.1, lines ending in
CRLF or a bare LF, heads up to Go's 1 MiB, and what Go refuses before any handler (a
bad header line or Content-Length, no Host in 1.1, an unknown transfer encoding, a head
too large) answered with its status and words, then closed. A chunked body Go cannot read
is the gateway's 400 on /v3/; any other handler reads no body, answers, and the connection
closes (Go cannot skip the rest of it). Answers carry Go's Date header.

etcd serves these beside gRPC on its client port; here they are served on
--listen-metrics-urls, and on the client port by the native gRPC server, which hands
an HTTP/1.1 connection to ``handle`` and an HTTP/2 request that is not gRPC (curl over
TLS, which negotiates h2) to ``serve`` (grpcio's server cannot share its port).
``serve`` answers through an *answer* object: ``whole(status, headers, payload)``, or
``start(status, headers)``, ``chunk(data)`` and ``end()`` for a stream; ``Http1Answer``
is HTTP/1.1's, the gRPC server's HTTP/2 stream the other.
"""
from __future__ import annotations

import asyncio
import logging

import grpc

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from shards.alarms import NAMES

from .config import ETCD_API_VERSION
from .gateway import PATHS, REASONS, STREAMS, Gateway, GatewayError, compact_json
from .grpcserver import http_date

logger = logging.getLogger(__name__)

HEAD_BYTES_MAX = (1 << 20) + 4096  # Go's http.DefaultMaxHeaderBytes and the 4 KiB it allows over it
READER_LIMIT = HEAD_BYTES_MAX + 1  # a StreamReader's buffer for one line of the head
IDLE_READ_S = 60.0  # a request line, head or chunk header not complete by then: the connection is closed
_TOKEN_BYTES = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"  # a header name's


TEXT = "text/plain; charset=utf-8"
# etcd's client port answers every request with these (its --cors default, "*")
CORS = (("Access-Control-Allow-Headers", "accept, content-type, authorization"),
        ("Access-Control-Allow-Methods", "POST, GET, OPTIONS, PUT, DELETE"),
        ("Access-Control-Allow-Origin", "*"))
GRPC_METADATA = (("Grpc-Metadata-Content-Type", "application/grpc"),)  # a gateway call that reached gRPC
# the same over TLS, where etcd's gRPC server answers through Go's HTTP server (its CORS wrapper
# and the Trailer header included), and the gateway passes that on, errors from gRPC too
GRPC_METADATA_TLS = (*(("Grpc-Metadata-" + name, value) for name, value in CORS), *GRPC_METADATA,
                     *(("Grpc-Metadata-Trailer", name) for name in ("Grpc-Status", "Grpc-Message",
                                                                     "Grpc-Status-Details-Bin")))
JSON = ("Content-Type", "application/json")
GATEWAY_PREFIXES = ("/v3/", "/v3beta/")  # etcd 3.5 serves its gateway under both


def _go_error(status: int, text: str, *extra) -> tuple[int, tuple, bytes]:
    """Go's http.Error: plain text ending in a newline."""
    return status, (("Content-Type", TEXT), ("X-Content-Type-Options", "nosniff"), *extra), text.encode() + b"\n"


NOT_FOUND = _go_error(404, "404 page not found")


def _head(status: int, headers, version: str = "HTTP/1.1") -> bytes:
    """An answer's status line and headers, up to the body."""
    lines = [f"{version} {status} {REASONS.get(status, 'Error')}", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class _Refused(Exception):
    """A request Go's HTTP server refuses before any handler sees it: its answer, then the
    connection is closed."""

    def __init__(self, status: int, reason: str = "", body: str | None = None) -> None:
        super().__init__(status, reason)
        line = f"{status} {REASONS.get(status, 'Error')}" + (f": {reason}" if reason else "")
        self.answer = (f"HTTP/1.1 {line}\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"
                       + (line if body is None else body)).encode()


class _BadChunks(Exception):
    """A chunked request body Go's chunked reader refuses, in its words."""


def _bad_request(reason: str = "") -> _Refused:
    return _Refused(400, reason)


async def _read_until(reader: asyncio.StreamReader, separator: bytes) -> bytes:
    """The next bytes up to ``separator``; TimeoutError after IDLE_READ_S (asyncio.timeout, not
    wait_for, which can lose a stopping server's cancel on 3.11: journal/tasks.py)."""
    async with asyncio.timeout(IDLE_READ_S):
        return await reader.readuntil(separator)


async def _read_line(reader: asyncio.StreamReader) -> str:
    """The next line without its CRLF (or bare LF, which Go takes too); a line longer than the
    reader's limit is a head too large."""
    try:
        line = await _read_until(reader, b"\n")
    except asyncio.LimitOverrunError:
        raise _Refused(431) from None
    return line[:-2 if line.endswith(b"\r\n") else -1].decode("latin-1")


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, str, str, dict[str, str], list[str]]:
    """(method, target, version, headers by lower-case name (the first of each), every
    Content-Length given) of the next request."""
    line = await _read_line(reader)
    method, _, rest = line.partition(" ")
    target, _, version = rest.partition(" ")
    if not method or not target or version not in ("HTTP/1.1", "HTTP/1.0"):
        raise ValueError("not an HTTP/1.x request")  # etcd's port does not take it for HTTP: closed
    headers, size, lengths = {}, len(line), []
    while line := await _read_line(reader):
        size += len(line)
        if size > HEAD_BYTES_MAX:
            raise _Refused(431)
        name, colon, value = line.partition(":")
        if not colon:
            raise _bad_request()  # Go: malformed MIME header line
        if not name or name.encode("latin-1", "replace").translate(None, _TOKEN_BYTES):
            raise _bad_request("invalid header name")
        key, value = name.lower(), value.strip(" \t")
        if key == "content-length":
            lengths.append(value)
        headers.setdefault(key, value)  # the first, as Go's Header.Get
    return method, target, version, headers, lengths


class Http1Answer:
    """An answer on an HTTP/1.x connection: Content-Length, or for a stream chunked (HTTP/1.1)
    or the body as it comes until the connection closes (HTTP/1.0, which has no chunks)."""

    def __init__(self, writer: asyncio.StreamWriter, method: str, version: str = "HTTP/1.1",
                 extra: tuple = ()) -> None:
        self.writer, self.method, self.version, self.extra = writer, method, version, extra
        self.tls = writer.get_extra_info("ssl_object") is not None
        self.chunked = version == "HTTP/1.1"

    async def whole(self, status: int, headers: tuple, payload: bytes) -> None:
        self.writer.write(_head(status, (*headers, *self.extra, ("Date", http_date()), ("Content-Length", len(payload))),
                                self.version)
                          + (payload if self.method != "HEAD" else b""))
        await self.writer.drain()

    def start(self, status: int, headers: tuple) -> None:
        framing = (("Transfer-Encoding", "chunked"),) if self.chunked else ()  # 1.0: the close ends it
        self.writer.write(_head(status, (*headers, ("Date", http_date()), *framing), self.version))

    async def chunk(self, data: bytes) -> None:
        self.writer.write(b"%x\r\n%s\r\n" % (len(data), data) if self.chunked else data)
        await self.writer.drain()

    async def end(self) -> None:
        if self.chunked:
            self.writer.write(b"0\r\n\r\n")
        await self.writer.drain()


class HttpEndpoint:
    def __init__(self, member, metrics, gateway: Gateway | None = None) -> None:
        self.m = member
        self.metrics = metrics
        self.gateway = gateway
        # room for a request base64 makes a third larger, up to what gRPC takes before refusing
        self.body_bytes_max = 2 * member.config.receive_cap_bytes

    def health(self) -> tuple[bool, str]:
        if (source := self.m.store.failure_source) is not None:
            return False, f"{source} failure"
        alarms = self.m.alarms.get()
        if alarms:
            return False, "ALARM " + ",".join(NAMES[a] for _, a in alarms)
        return True, ""

    def route(self, method: str, path: str) -> tuple[int, tuple, bytes]:
        """A request outside the gateway, answered as etcd's client port answers it."""
        if path == "/metrics":  # any method, as Prometheus' handler
            return 200, (("Content-Type", CONTENT_TYPE_LATEST),), generate_latest(self.metrics.registry)
        if path in ("/health", "/version", "/readyz", "/livez") and method != "GET":
            return _go_error(405, "Method Not Allowed", ("Allow", "GET"))
        if path == "/health":
            ok, reason = self.health()
            body = compact_json({"health": "true" if ok else "false", "reason": reason})
            # etcd sets no content type (Go's sniffing says text/plain) and sends an unhealthy
            # answer through Go's http.Error
            return (200, (("Content-Type", TEXT),), body) if ok else _go_error(503, body.decode())
        if path in ("/readyz", "/livez"):
            ok, reason = self.health()
            return (200, (("Content-Type", "text/plain"),), b"ok") if ok else \
                (503, (("Content-Type", "text/plain"),), f"failed: {reason}".encode())
        if path == "/version":
            cluster = ETCD_API_VERSION.rsplit(".", 1)[0] + ".0"  # etcd reports the cluster version as major.minor.0
            body = compact_json({"etcdserver": ETCD_API_VERSION, "etcdcluster": cluster})
            return 200, (JSON,), body
        return NOT_FOUND

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve requests on one connection until the client closes it (or sends what Go's HTTP
        server refuses: answered as it answers, then closed)."""
        try:
            while await self._one(reader, writer):
                pass
        except _Refused as refused:
            writer.write(refused.answer)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ValueError,
                ConnectionError):
            pass
        finally:
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """One request read and answered; whether the connection takes another. Parsed as Go's
        net/http parses it (etcd's client port): lines may end in CRLF or LF alone."""
        async with asyncio.timeout(IDLE_READ_S):  # the whole head, not each line: no slow trickle
            method, target, version, headers, lengths = await _read_head(reader)
        if version == "HTTP/1.1" and "host" not in headers:
            raise _bad_request("missing required Host header")
        if (encoding := headers.get("transfer-encoding")) is not None and encoding.lower() != "chunked":
            raise _Refused(501, body="Unsupported transfer encoding")
        if lengths and (len(set(lengths)) > 1 or not (lengths[0].isascii() and lengths[0].isdigit())):
            raise _bad_request()  # Go: a Content-Length that is not a number, or two that differ
        if target.startswith(("http://", "https://")):  # the absolute form a proxy sends
            target = "/" + target.split("/", 3)[3] if target.count("/") >= 3 else "/"
        elif not target.startswith("/") and method != "CONNECT":
            raise _bad_request()
        options = {token.strip() for token in headers.get("connection", "").lower().split(",")}
        if version == "HTTP/1.1":  # kept unless the client closes it, which Go's answer then says
            keep = "close" not in options
            extra = () if keep else (("Connection", "close"),)
        else:  # HTTP/1.0: one request unless the client asks to keep the connection
            keep = "keep-alive" in options
            extra = (("Connection", "keep-alive"),) if keep else ()
        if headers.get("expect", "").lower() == "100-continue":  # curl asks before sending a larger body
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        try:
            body = await self._body(reader, headers)
        except _BadChunks as exc:
            answer = Http1Answer(writer, method, version, (("Connection", "close"),))
            if self.gateway is not None and target.split("?", 1)[0].startswith(GATEWAY_PREFIXES):
                err = GatewayError(grpc.StatusCode.INVALID_ARGUMENT, str(exc))  # it reads the body: Go's error
                await answer.whole(err.http_status, (*CORS, JSON), err.body())
            else:  # a handler that reads no body answers; Go then cannot skip the rest, so it closes
                await self.serve(method, target, headers, b"", answer)
            return False
        served = await self.serve(method, target, headers, body, Http1Answer(writer, method, version, extra))
        return served and keep

    async def serve(self, method: str, path: str, headers: dict[str, str], body: bytes, answer) -> bool:
        """Answer one request (``headers`` with lower-case names) through ``answer``; whether
        the connection can take another request (not after a stream)."""
        path = path.split("?", 1)[0]
        authorization = headers.get("authorization")
        if method == "OPTIONS":  # etcd's CORS handler answers any preflight itself
            status, extra, payload = 200, (), b""
        elif self.gateway is not None and path == "/v3":  # Go's ServeMux: the subtree's slash
            status, extra, payload = 301, (("Location", path + "/"),), b""
            if method in ("GET", "HEAD"):
                extra += (("Content-Type", "text/html; charset=utf-8"),)
                payload = f'<a href="{path}/">Moved Permanently</a>.\n\n'.encode()
        elif self.gateway is not None and path.startswith(GATEWAY_PREFIXES):
            route = "/v3/" + path.split("/", 2)[2]
            if route not in PATHS:
                status, extra, payload = _go_error(404, "Not Found")
            elif method != "POST":
                status, extra, payload = _go_error(405, "Method Not Allowed")
            elif route in STREAMS:
                return await self._stream(answer, route, body, authorization)
            else:
                status, extra, payload = await self._call(route, body, authorization, answer.tls)
        else:
            status, extra, payload = self.route(method, path)
        await answer.whole(status, (*CORS, *extra), payload)
        return True

    async def _body(self, reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
        """The request body: Content-Length bytes, or chunked (``Transfer-Encoding: chunked``,
        as clients that stream a body send it); at most body_bytes_max either way."""
        if "transfer-encoding" not in headers:
            length = int(headers.get("content-length", "0"))
            if length > self.body_bytes_max:
                raise ValueError("request body too large")
            return await reader.readexactly(length) if length else b""
        parts, size = [], 0
        while True:
            size_field = (await _read_line(reader)).split(";", 1)[0].strip(" \t")
            if not size_field:
                raise _BadChunks("empty hex number for chunk length")
            if size_field.strip("0123456789abcdefABCDEF"):
                raise _BadChunks("invalid byte in chunk length")
            n = int(size_field, 16)
            if n == 0:
                while await _read_line(reader):
                    pass  # trailers
                return b"".join(parts)
            size += n
            if size > self.body_bytes_max:
                raise ValueError("request body too large")
            parts.append(await reader.readexactly(n))
            if await _read_line(reader):
                raise _BadChunks("malformed chunked encoding")  # the chunk did not end where its size said

    async def _call(self, route: str, body: bytes, authorization: str | None, tls: bool) -> tuple[int, tuple, bytes]:
        try:
            payload = await self.gateway.call(route, body, authorization)
            return 200, (JSON, *(GRPC_METADATA_TLS if tls else GRPC_METADATA)), payload
        except Exception as exc:
            err = _gateway_error(route, exc)
            return err.http_status, (JSON, *(GRPC_METADATA_TLS if tls and err.from_grpc else ())), err.body()

    async def _stream(self, answer, route: str, body: bytes, authorization: str | None) -> bool:
        """A streaming route: JSON lines. An error before the first line is the answer's
        status; one after it is a last {"error": ...} line, as grpc-gateway sends them.
        Whether the connection can take another request (not after a stream)."""
        try:
            chunks = await self.gateway.stream(route, body, authorization)
        except Exception as exc:  # the request could not be read, or a bug of ours
            err = _gateway_error(route, exc)
            await answer.whole(err.http_status, (*CORS, JSON), err.body())
            return True
        started = False

        def start(status: int) -> None:
            nonlocal started
            started = True
            answer.start(status, (*CORS, JSON, *(GRPC_METADATA_TLS if answer.tls else GRPC_METADATA)))

        try:
            async for chunk in chunks:
                if not started:
                    start(200)
                await answer.chunk(chunk)
        except ConnectionError:  # the client went away: nobody to tell
            raise
        except Exception as exc:  # the stream's error as its last line
            err = _gateway_error(route, exc)
            if not started:
                start(err.http_status)
            await answer.chunk(err.chunk())
        if not started:
            start(200)
        await answer.end()
        return False


def _gateway_error(route: str, exc: Exception) -> GatewayError:
    """What a gateway route answers for ``exc``: a GatewayError as it is; anything else is a
    bug of ours, logged and answered as gRPC answers an exception in a handler (UNKNOWN
    with its text)."""
    if isinstance(exc, GatewayError):
        return exc
    logger.error("gateway call failed path=%s", route, exc_info=exc)
    return GatewayError(grpc.StatusCode.UNKNOWN, str(exc))


async def start_http(urls: tuple[str, ...], endpoint: HttpEndpoint, parse_url) -> list[asyncio.base_events.Server]:
    servers = []
    for url in urls:
        hostport, tls = parse_url(url)
        if tls:
            raise ValueError(f"metrics URL {url!r}: only http:// is supported")
        host, _, port = hostport.rpartition(":")
        servers.append(await asyncio.start_server(endpoint.handle, host.strip("[]"), int(port), limit=READER_LIMIT))
    return servers
