"""A small HTTP/1.1 endpoint for /metrics, /health, /readyz, /livez and /version.

etcd serves these beside gRPC; here they are served on --listen-metrics-urls
(grpcio cannot share its port with an HTTP/1.1 server).
"""
from __future__ import annotations

import asyncio
import json
import logging

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from shards.alarms import NAMES

from .config import ETCD_API_VERSION

logger = logging.getLogger(__name__)

REQUEST_BYTES_MAX = 8192


class HttpEndpoint:
    def __init__(self, member, metrics) -> None:
        self.m = member
        self.metrics = metrics

    def health(self) -> tuple[bool, str]:
        if self.m.store.failure is not None:
            return False, "journal failure"
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
            body = json.dumps({"health": "true" if ok else "false", "reason": reason}).encode()
            return (200 if ok else 503), "application/json", body
        if path in ("/readyz", "/livez"):
            ok, reason = self.health()
            return (200, "text/plain", b"ok") if ok else (503, "text/plain", f"failed: {reason}".encode())
        if path == "/version":
            cluster = ETCD_API_VERSION.rsplit(".", 1)[0] + ".0"  # etcd reports the cluster version as major.minor.0
            body = json.dumps({"etcdserver": ETCD_API_VERSION, "etcdcluster": cluster})
            return 200, "application/json", body.encode()
        return 404, "text/plain", b"404 page not found\n"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
            if len(head) > REQUEST_BYTES_MAX:
                raise ValueError("request too large")
            method, path, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            status, ctype, body = self.route(path) if method in ("GET", "HEAD") else (405, "text/plain", b"")
            reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}[status]
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                f"Connection: close\r\n\r\n".encode() + (body if method == "GET" else b"")
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ValueError, ConnectionError):
            pass
        finally:
            writer.close()


async def start_http(urls: tuple[str, ...], endpoint: HttpEndpoint, parse_url) -> list[asyncio.base_events.Server]:
    servers = []
    for url in urls:
        hostport, tls = parse_url(url)
        if tls:
            raise ValueError(f"metrics URL {url!r}: only http:// is supported")
        host, _, port = hostport.rpartition(":")
        servers.append(await asyncio.start_server(endpoint.handle, host.strip("[]"), int(port)))
    return servers
