"""A small HTTP endpoint: /metrics, /health, /readyz, /livez, /version and the /v3 JSON gateway.

Requests are read as Go's net/http reads them (etcd's client port; compared with a real
etcd in tests/integration/test_http1_differential.py): HTTP/1.0 and 1.1, lines ending in
CRLF or a bare LF, continued header lines, heads up to Go's 1 MiB, and what Go refuses before
any handler (a target with a control character or a bad escape, a bad header line or
Content-Length, an unknown transfer encoding, no Host in 1.1, two Hosts or a malformed one, a
control character in a header value, an Expect other than 100-continue, a head too large)
answered with its status and words, in Go's order, then closed. On the client port the first
request line is held to the 4 KiB cmux reads. 100 Continue is sent only to a handler that
reads the body, as Go sends it. The path is routed as Go's ServeMux routes it (decoded, and a
path with empty, . or .. segments redirected to its clean form). A chunked body Go cannot
read is the gateway's 400 on /v3/; any other handler reads no body, answers, and the
connection closes (Go cannot skip the rest of it). Answers carry Go's Date header; /metrics
is promhttp's (text format 0.0.4, gzip when accepted, streamed).

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
import gzip
import logging
import re
import ssl
from dataclasses import dataclass
from urllib.parse import quote

import grpc

from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

from journal.tasks import unheard
from shards.alarms import NAMES
from shards.types import RangeReq

from .config import ETCD_API_VERSION
from .debug import tasks_text
from .peercheck import CertificateCheck, rejects
from .gateway import PATHS, REASONS, STREAMS, Gateway, GatewayError, compact_json
from .grpcserver import http_date

logger = logging.getLogger(__name__)

HEAD_BYTES_MAX = (1 << 20) + 4096  # Go's http.DefaultMaxHeaderBytes and the 4 KiB it allows over it
# etcd's plain-text client port tells HTTP/1 from HTTP/2 with cmux, which reads a connection's first
# request line into 4 KiB: a longer one, or one that is not HTTP/1.x, is not taken and the connection
# is closed (later requests, TLS connections and the metrics port: Go's server alone, which answers 400)
FIRST_LINE_MAX_CLIENT_PORT = 4096
DISCARD_BYTES_MAX = 256 << 10  # what Go's server reads of an unread body to keep a connection (maxPostHandlerReadBytes)
READER_LIMIT = HEAD_BYTES_MAX + 1  # a StreamReader's buffer for one line of the head
IDLE_READ_S = 60.0  # a request line, head or chunk header not complete by then: the connection is closed
GONE_CHECK_S = 0.5  # while a request is answered, how often whether its client closed the connection is looked at
_TOKEN_BYTES = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"  # a header name's
_HOST_CHARS = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ!$%&'()*+,-.:;=[]_~")  # httpguts
_CTL = re.compile("[\x00-\x08\x0a-\x1f\x7f]")  # what Go refuses in a header value (a tab is allowed)
_BAD_ESCAPE = re.compile("%(?![0-9a-fA-F]{2})")
_PERCENT = re.compile("%([0-9a-fA-F]{2})")
_VERSION = re.compile(r"HTTP/\+?(\d+)\.\+?(\d+)", re.ASCII)


TEXT = "text/plain; charset=utf-8"
METRICS_TEXT = CONTENT_TYPE_PLAIN_0_0_4  # Prometheus' text format as etcd's promhttp labels it
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
DEBUG_TASKS = "/debug/tasks"  # --enable-pprof (shim/debug.py)


def _head(status: int, headers, version: str = "HTTP/1.1") -> bytes:
    """An answer's status line and headers, up to the body."""
    lines = [f"{version} {status} {REASONS.get(status, 'Error')}", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


HEALTH_READ = RangeReq(b"health", keys_only=True, limit=1)


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


def _text(raw: bytes) -> str:
    """A line read up to its LF, without its CRLF (or bare LF, which Go takes too)."""
    return raw[:-2 if raw.endswith(b"\r\n") else -1].decode("latin-1")


async def _read_line(reader: asyncio.StreamReader) -> str:
    """The next line (``_text``); a line longer than the reader's limit is a head too large."""
    try:
        return _text(await _read_until(reader, b"\n"))
    except asyncio.LimitOverrunError:
        raise _Refused(431) from None


@dataclass(slots=True)
class _Head:
    method: str
    target: str
    version: str
    headers: dict[str, str]  # by lower-case name, the first of each (Go's Header.Get)
    lengths: list[str]  # every Content-Length given
    hosts: list[str]  # every Host given
    bad_value: bool  # a header value with a control character


async def _read_head(reader: asyncio.StreamReader, first_line_max: int | None = None) -> _Head:
    """The head of the next request, read as Go's textproto reads it (a line beginning with a
    space or tab continues the header before it)."""
    if first_line_max is not None:  # cmux's look at a connection's first line
        try:
            raw = await _read_until(reader, b"\n")
        except asyncio.LimitOverrunError:
            raise ValueError("not an HTTP/1.x request") from None
        if len(raw) > first_line_max:
            raise ValueError("not an HTTP/1.x request")
        line = _text(raw)
    else:
        line = await _read_line(reader)
    method, sp1, rest = line.partition(" ")
    target, sp2, version = rest.partition(" ")
    proto = _http_version(version)
    if first_line_max is not None and not (sp1 and sp2 and proto is not None and proto[0] == 1):
        raise ValueError("not an HTTP/1.x request")  # cmux does not take it for HTTP: the connection is closed
    if not (sp1 and sp2) or not method or method.encode("latin-1", "replace").translate(None, _TOKEN_BYTES):
        raise _bad_request()  # Go: malformed HTTP request, invalid method
    if proto is None:
        raise _bad_request()  # Go: malformed HTTP version
    if proto[0] != 1:
        raise _Refused(505, "unsupported protocol version")
    version = "HTTP/1.0" if proto == (1, 0) else "HTTP/1.1"  # (1.2 and up are served as 1.1, as Go serves them)
    size, fields = len(line), []
    while line := await _read_line(reader):
        size += len(line)
        if size > HEAD_BYTES_MAX:
            raise _Refused(431)
        if line[0] in " \t":  # a continuation line (obs-fold): joined to the header before it
            if not fields:
                raise _bad_request()  # Go: malformed MIME header initial line
            key, value = fields[-1]
            more = line.strip(" \t")
            fields[-1] = (key, f"{value} {more}" if value else more)
            continue
        name, colon, value = line.partition(":")
        if not colon:
            raise _bad_request()  # Go: malformed MIME header line
        if not name or name.encode("latin-1", "replace").translate(None, _TOKEN_BYTES):
            raise _bad_request("invalid header name")
        fields.append((name.lower(), value.strip(" \t")))
    headers, lengths, hosts = {}, [], []
    for key, value in fields:
        if key == "content-length":
            lengths.append(value)
        elif key == "host":
            hosts.append(value)
        headers.setdefault(key, value)
    return _Head(method, target, version, headers, lengths, hosts, any(_CTL.search(v) for _, v in fields))


def _http_version(version: str) -> tuple[int, int] | None:
    """Go's ParseHTTPVersion: (major, minor) of "HTTP/M.N", None if it is not one."""
    match = _VERSION.fullmatch(version)
    if match is None:
        return None
    major, minor = int(match.group(1)), int(match.group(2))
    return (major, minor) if major <= 1_000_000 and minor <= 1_000_000 else None


def _has_token(value: str, token: str) -> bool:
    """A comma-separated header value names ``token`` (any case), as Go's hasToken."""
    return any(part.strip(" \t").lower() == token for part in value.split(","))


def go_unescape_path(path: str) -> str | None:
    """Go's URL.Path of a request target's path (%XX decoded, as Latin-1 like the rest); None
    if a % is not followed by two hex digits (url.ParseRequestURI's "invalid URL escape")."""
    if "%" not in path:
        return path
    if _BAD_ESCAPE.search(path):
        return None
    return _PERCENT.sub(lambda m: chr(int(m.group(1), 16)), path)


def go_clean_path(path: str) -> str:
    """Go's ServeMux cleanPath: rooted, no empty, . or .. segments, a trailing slash kept."""
    parts: list[str] = []
    for part in path.split("/"):
        if part == "..":
            if parts:
                parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    clean = "/" + "/".join(parts)
    return clean + "/" if path.endswith("/") and clean != "/" else clean


class Http1Answer:
    """An answer on an HTTP/1.x connection: Content-Length, or for a stream chunked (HTTP/1.1)
    or the body as it comes until the connection closes (HTTP/1.0, which has no chunks)."""

    def __init__(self, writer: asyncio.StreamWriter, method: str, version: str = "HTTP/1.1",
                 extra: tuple = ()) -> None:
        self.writer, self.method, self.version, self.extra = writer, method, version, extra
        self.tls = writer.get_extra_info("ssl_object") is not None
        self.chunked = version == "HTTP/1.1" and method != "HEAD"
        self.framed = version == "HTTP/1.1"  # a streamed answer's end is marked: the connection goes on

    async def whole(self, status: int, headers: tuple, payload: bytes) -> None:
        self.writer.write(_head(status, (*headers, *self.extra, ("Date", http_date()), ("Content-Length", len(payload))),
                                self.version)
                          + (payload if self.method != "HEAD" else b""))
        await self.writer.drain()

    def start(self, status: int, headers: tuple) -> None:
        framing = (("Transfer-Encoding", "chunked"),) if self.chunked else ()  # 1.0: the close ends it
        extra = self.extra if self.framed else ()  # (1.0: no keep-alive once a body runs to the close)
        self.writer.write(_head(status, (*headers, *extra, ("Date", http_date()), *framing), self.version))

    async def chunk(self, data: bytes) -> None:
        if self.method == "HEAD":
            return
        self.writer.write(b"%x\r\n%s\r\n" % (len(data), data) if self.chunked else data)
        await self.writer.drain()

    async def end(self) -> None:
        if self.chunked:
            self.writer.write(b"0\r\n\r\n")
        await self.writer.drain()


class HealthChecks:
    """/health answers given, as etcd counts them (etcd_server_health_success / _failures)."""

    success = 0
    failures = 0


class HttpEndpoint:
    def __init__(self, member, metrics, gateway: Gateway | None = None) -> None:
        self.m = member
        self.metrics = metrics
        self.gateway = gateway
        # room for a request base64 makes a third larger, up to what gRPC takes before refusing
        self.body_bytes_max = 2 * member.config.receive_cap_bytes
        self.debug = member.config.enable_pprof  # serve /debug/tasks

    def health(self) -> tuple[bool, str]:
        if (source := self.m.store.failure_source) is not None:
            return False, f"{source} failure"
        alarms = self.m.alarms.get()
        if alarms:
            return False, "ALARM " + ",".join(NAMES[a] for _, a in alarms)
        return True, ""

    def health_read(self) -> tuple[bool, str]:
        """etcd's /health: the checks above, then a read of the store (one more range
        counted); the answer counted."""
        ok, reason = self.health()
        if ok:
            try:
                self.m.store.range(HEALTH_READ)
            except Exception as exc:
                ok, reason = False, f"RANGE ERROR:{exc}"
        if ok:
            HealthChecks.success += 1
        else:
            HealthChecks.failures += 1
        return ok, reason

    def route(self, method: str, path: str) -> tuple[int, tuple, bytes]:
        """A request outside the gateway and /metrics, answered as etcd's client port answers it."""
        if path in ("/health", "/version", "/readyz", "/livez") and method != "GET":
            return _go_error(405, "Method Not Allowed", ("Allow", "GET"))
        if path == "/health":
            ok, reason = self.health_read()
            body = compact_json({"health": "true" if ok else "false", "reason": reason})
            # etcd sets no content type (Go's sniffing says text/plain) and sends an unhealthy
            # answer through Go's http.Error
            return (200, (("Content-Type", TEXT),), body) if ok else _go_error(503, body.decode())
        if path in ("/readyz", "/livez"):
            ok, reason = self.health()
            return (200, (("Content-Type", "text/plain"),), b"ok") if ok else \
                (503, (("Content-Type", "text/plain"),), f"failed: {reason}".encode())
        if path == DEBUG_TASKS and self.debug:
            if method != "GET":
                return _go_error(405, "Method Not Allowed", ("Allow", "GET"))
            return 200, (("Content-Type", "text/plain; charset=utf-8"),), tasks_text().encode()
        if path == "/version":
            cluster = ETCD_API_VERSION.rsplit(".", 1)[0] + ".0"  # etcd reports the cluster version as major.minor.0
            body = compact_json({"etcdserver": ETCD_API_VERSION, "etcdcluster": cluster})
            return 200, (JSON,), body
        return NOT_FOUND

    async def handle_client_port(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """``handle`` for an HTTP/1 connection on the client port (the native gRPC server hands it
        over). A plain-text one's first request line is read as etcd's cmux reads it (at most 4 KiB,
        HTTP/1.x, or the connection is closed); over TLS etcd's Go server reads every line itself."""
        tls = writer.get_extra_info("ssl_object") is not None
        await self.handle(reader, writer, None if tls else FIRST_LINE_MAX_CLIENT_PORT)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     first_line_max: int | None = None) -> None:
        """Serve requests on one connection until the client closes it (or sends what Go's HTTP
        server refuses: answered as it answers, then closed)."""
        try:
            while await self._one(reader, writer, first_line_max):
                first_line_max = None
        except _Refused as refused:
            writer.write(refused.answer)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ValueError,
                ConnectionError):
            pass
        finally:
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   first_line_max: int | None = None) -> bool:
        """One request read and answered; whether the connection takes another. Parsed and
        checked as Go's net/http does it (etcd's client port), in its order: the target, the
        body's framing, the Host, the header values; lines may end in CRLF or LF alone."""
        async with asyncio.timeout(IDLE_READ_S):  # the whole head, not each line: no slow trickle
            head = await _read_head(reader, first_line_max)
        method, target, version, headers, lengths = head.method, head.target, head.version, head.headers, head.lengths
        if target.startswith(("http://", "https://")):  # the absolute form a proxy sends
            target = "/" + target.split("/", 3)[3] if target.count("/") >= 3 else "/"
        elif not target.startswith("/") and method != "CONNECT":
            raise _bad_request()
        if _CTL.search(target) or "\t" in target or go_unescape_path(target.split("?", 1)[0]) is None:
            raise _bad_request()  # url.ParseRequestURI: a control character, a bad escape
        if (encoding := headers.get("transfer-encoding")) is not None and encoding.lower() != "chunked":
            raise _Refused(501, body="Unsupported transfer encoding")
        if lengths and (len(set(lengths)) > 1 or not (lengths[0].isascii() and lengths[0].isdigit())):
            raise _bad_request()  # Go: a Content-Length that is not a number, or two that differ
        if version == "HTTP/1.1" and not head.hosts and method != "CONNECT":
            raise _bad_request("missing required Host header")
        if len(head.hosts) > 1:
            raise _bad_request("too many Host headers")
        if head.hosts and not _HOST_CHARS.issuperset(head.hosts[0]):
            raise _bad_request("malformed Host header")
        if head.bad_value:
            raise _bad_request("invalid header value")
        options = {token.strip() for token in headers.get("connection", "").lower().split(",")}
        if version == "HTTP/1.1":  # kept unless the client closes it, which Go's answer then says
            keep = "close" not in options
            extra = () if keep else (("Connection", "close"),)
        else:  # HTTP/1.0: one request unless the client asks to keep the connection
            keep = "keep-alive" in options
            extra = (("Connection", "keep-alive"),) if keep else ()
        if expect := headers.get("expect", ""):
            if not _has_token(expect, "100-continue"):  # Go answers any other expectation itself
                writer.write(_head(417, (("Connection", "close"), ("Date", http_date()), ("Content-Length", 0)),
                                   version))
                return False
            if version == "HTTP/1.1" and (encoding is not None or (lengths and int(lengths[0]) != 0)):
                # Go says 100 Continue when the handler reads the body; a handler that reads none
                # answers at once, and the connection closes once the client's body is read past
                if not self._reads_body(method, target):
                    await self.serve(method, target, headers, b"", Http1Answer(writer, method, version,
                                                                               (("Connection", "close"),)))
                    await _discard(reader, int(lengths[0]) if lengths and encoding is None else DISCARD_BYTES_MAX)
                    return False
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
        served = await _unless_gone(reader, self.serve(method, target, headers, body,
                                                       Http1Answer(writer, method, version, extra)))
        return served and keep

    async def serve(self, method: str, path: str, headers: dict[str, str], body: bytes, answer) -> bool:
        """Answer one request (``headers`` with lower-case names) through ``answer``; whether
        the connection can take another request (not after a stream)."""
        raw_path, mark, query = path.partition("?")
        path = go_unescape_path(raw_path)
        if path is None:  # (over HTTP/2: HTTP/1 refused it before)
            path = raw_path
        authorization = headers.get("authorization")
        clean = path if method == "CONNECT" else go_clean_path(path)
        if method == "OPTIONS":  # etcd's CORS handler answers any preflight itself
            status, extra, payload = 200, (), b""
        elif clean != path:  # Go's ServeMux sends a path with empty, . or .. segments to its clean form
            status, extra, payload = _redirect(method, quote(clean, safe="/$&+,:;=@") + (mark + query if query else ""))
        elif path == "/metrics":  # any method, as Prometheus' handler
            return await self._metrics(method, headers, answer)
        elif self.gateway is not None and path == "/v3":  # Go's ServeMux: the subtree's slash
            status, extra, payload = _redirect(method, path + "/")
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

    def _reads_body(self, method: str, target: str) -> bool:
        """Whether the handler ``target`` goes to reads the request body: the gateway's routes."""
        path = go_unescape_path(target.split("?", 1)[0])
        if self.gateway is None or method != "POST" or path is None or go_clean_path(path) != path:
            return False
        return path.startswith(GATEWAY_PREFIXES) and "/v3/" + path.split("/", 2)[2] in PATHS

    async def _metrics(self, method: str, headers: dict[str, str], answer) -> bool:
        """/metrics as etcd's promhttp handler writes it: Prometheus' text format 0.0.4, gzip when
        the client takes it, streamed (chunked over HTTP/1.1). Whether the connection goes on."""
        payload = generate_latest(self.metrics.registry)
        extra = ()
        if any(part.strip(" ") == "gzip" or part.strip(" ").startswith("gzip;")
               for part in headers.get("accept-encoding", "").split(",")):
            payload, extra = gzip.compress(payload, 6), (("Content-Encoding", "gzip"),)
        answer.start(200, (*CORS, *extra, ("Content-Type", METRICS_TEXT)))
        if method != "HEAD":
            await answer.chunk(payload)
        await answer.end()
        return answer.framed

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


async def _unless_gone(reader: asyncio.StreamReader, answering) -> bool:
    """Await ``answering`` (one request answered: whether the connection takes another) unless
    the client closes the connection first: then it is cancelled, and the connection is done.
    Go's server cancels a request's context when its connection reads EOF, so on etcd a gateway
    Lock or Campaign whose client gave up leaves the queue, and a stream to a client gone quiet
    ends; answered regardless, a Lock would be had, and held, by nobody until its lease ran out.
    A request pipelined behind this one stays in the reader's buffer, which is not EOF."""
    task = asyncio.ensure_future(answering)
    task.add_done_callback(unheard)  # a cancelled one's end is nobody's to read
    try:
        while True:
            done, _ = await asyncio.wait((task,), timeout=GONE_CHECK_S)
            if done:
                return task.result()
            if reader.at_eof():
                logger.debug("http client closed the connection before its answer")
                return False
    finally:
        task.cancel()


def _redirect(method: str, location: str) -> tuple[int, tuple, bytes]:
    """Go's http.Redirect with 301: a short HTML body for GET and HEAD."""
    if method not in ("GET", "HEAD"):
        return 301, (("Location", location),), b""
    return 301, (("Content-Type", "text/html; charset=utf-8"), ("Location", location)), \
        f'<a href="{location}">Moved Permanently</a>.\n\n'.encode()


async def _discard(reader: asyncio.StreamReader, limit: int) -> None:
    """Read and drop up to ``limit`` bytes of a body nobody reads, as Go's server does before it
    closes; give up after IDLE_READ_S."""
    try:
        async with asyncio.timeout(IDLE_READ_S):
            while limit > 0 and (data := await reader.read(min(limit, 65536))):
                limit -= len(data)
    except (TimeoutError, ConnectionError):
        pass


def _gateway_error(route: str, exc: Exception) -> GatewayError:
    """What a gateway route answers for ``exc``: a GatewayError as it is; anything else is a
    bug of ours, logged and answered as gRPC answers an exception in a handler (UNKNOWN
    with its text)."""
    if isinstance(exc, GatewayError):
        return exc
    logger.error("gateway call failed path=%s", route, exc_info=exc)
    return GatewayError(grpc.StatusCode.UNKNOWN, str(exc))


async def start_http(urls: tuple[str, ...], endpoint: HttpEndpoint, parse_url, tls: ssl.SSLContext | None = None,
                     check: CertificateCheck | None = None) -> list[asyncio.base_events.Server]:
    """Serve ``endpoint`` on each URL: https:// ones with ``tls``, each client's certificate
    then checked by ``check`` (etcd's CRL and allowed hostname) before a request is read."""

    async def checked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not rejects(check, writer.transport):
            await endpoint.handle(reader, writer)

    servers = []
    for url in urls:
        hostport, secure = parse_url(url)
        if secure and tls is None:
            raise ValueError(f"metrics URL {url!r}: https:// needs the client TLS settings")
        host, _, port = hostport.rpartition(":")
        handler = checked if secure and check is not None else endpoint.handle
        servers.append(await asyncio.start_server(handler, host.strip("[]"), int(port), limit=READER_LIMIT,
                                                  ssl=tls if secure else None))
    return servers
