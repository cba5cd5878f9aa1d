"""A small HTTP/1.1 endpoint: /metrics, /health, /readyz, /livez, /version and the /v3 JSON gateway.

etcd serves these beside gRPC; here they are served on --listen-metrics-urls
(grpcio cannot share its port with an HTTP/1.1 server).
"""
from __future__ import annotations

import asyncio
import logging

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from shards.alarms import NAMES

from .config import ETCD_API_VERSION
from .gateway import HTTP_STATUS, Gateway, GatewayError, compact_json

logger = logging.getLogger(__name__)

REQUEST_BYTES_MAX = 8192


REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 429: "Too Many Requests",
           500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable"}


class HttpEndpoint:
    def __init__(self, member, metrics, gateway: Gateway | None = None) -> None:
        self.m = member
        self.metrics = metrics
        self.gateway = gateway
        self.body_bytes_max = 2 * member.config.max_request_bytes + 4096

    def health(self) -> tuple[bool, str]:
        if (source := self.m.store.failure_source) is not None:
            return False, f"{source} failure"
        alarms = self.m.alarms.get()
        if alarms:
            return False, "ALARM " + ",".join(NAMES[a] for _, a in alarms)
        return True, ""

    def route(self, path: str) -> tuple[int, str, bytes]:
        path = path.split("?", 1)[0]
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.metrics.registry)
        if path == "/health":
            ok, reason = self.health()
            body = compact_json({"health": "true" if ok else "false", "reason": reason})
            # etcd sends an unhealthy answer through Go's http.Error, which ends it with a newline
            return (200, "application/json", body) if ok else (503, "application/json", body + b"\n")
        if path in ("/readyz", "/livez"):
            ok, reason = self.health()
            return (200, "text/plain", b"ok") if ok else (503, "text/plain", f"failed: {reason}".encode())
        if path == "/version":
            cluster = ETCD_API_VERSION.rsplit(".", 1)[0] + ".0"  # etcd reports the cluster version as major.minor.0
            return 200, "application/json", compact_json({"etcdserver": ETCD_API_VERSION, "etcdcluster": cluster})
        return 404, "text/plain", b"404 page not found\n"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve requests on one connection until the client closes it."""
        try:
            while await self._one(reader, writer):
                pass
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ValueError,
                ConnectionError):
            pass
        finally:
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=60)
        if len(head) > REQUEST_BYTES_MAX:
            raise ValueError("request head too large")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {k.strip().lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:] if l)}
        length = int(headers.get("content-length", "0"))
        if length > self.body_bytes_max:
            raise ValueError("request body too large")
        body = await reader.readexactly(length) if length else b""
        path = path.split("?", 1)[0]
        if method == "POST" and path == "/v3/watch" and self.gateway is not None:
            await self._stream(writer, self.gateway.watch_stream(body, headers.get("authorization")))
            return False
        if method == "POST" and path == "/v3/election/observe" and self.gateway is not None:
            await self._stream(writer, self.gateway.observe_stream(body, headers.get("authorization")))
            return False
        if method == "POST" and path.startswith("/v3/") and self.gateway is not None:
            try:
                payload = await self.gateway.call(path, body, headers.get("authorization"))
                status, ctype = 200, "application/json"
            except GatewayError as err:
                status, ctype, payload = HTTP_STATUS.get(err.code, 500), "application/json", err.body()
        elif method in ("GET", "HEAD"):
            status, ctype, payload = self.route(path)
        else:
            status, ctype, payload = 405, "text/plain", b""
        writer.write(
            f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n".encode() + (payload if method != "HEAD" else b"")
        )
        await writer.drain()
        return headers.get("connection", "").lower() != "close"

    async def _stream(self, writer: asyncio.StreamWriter, chunks) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        async for chunk in chunks:
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()


async def start_http(urls: tuple[str, ...], endpoint: HttpEndpoint, parse_url) -> list[asyncio.base_events.Server]:
    servers = []
    for url in urls:
        hostport, tls = parse_url(url)
        if tls:
            raise ValueError(f"metrics URL {url!r}: only http:// is supported")
        host, _, port = hostport.rpartition(":")
        servers.append(await asyncio.start_server(endpoint.handle, host.strip("[]"), int(port)))
    return servers
