"""Build, run and stop the gRPC server around a store."""
from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass
from urllib.parse import urlsplit

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from journal import JournalConfig
from shards.layout import load_layout
from shards.store import Store, StoreConfig

from .config import ServerConfig
from .context import Member
from .handlers import service_handler
from .kv import KVService
from .lease import LeaseService
from .maintenance import ClusterService, MaintenanceService
from .watch import WatchService

logger = logging.getLogger(__name__)

GRPC_OVERHEAD_BYTES = 512 * 1024  # etcd lets gRPC receive this much above max-request-bytes


class StartupError(RuntimeError):
    """A reason the server cannot start, said in one line."""


@dataclass
class Running:
    server: grpc.aio.Server
    store: Store
    ports: list[int]
    failed: asyncio.Event
    progress: asyncio.Task | None = None


def parse_listen_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
        raise StartupError(f"invalid listen URL {url!r}: want http://HOST:PORT")
    if parts.scheme == "https":
        raise StartupError(f"listen URL {url!r}: TLS is not supported yet")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{parts.port}"


def grpc_options(config: ServerConfig) -> list[tuple[str, int]]:
    return [
        ("grpc.so_reuseport", 0),
        ("grpc.max_receive_message_length", config.max_request_bytes + GRPC_OVERHEAD_BYTES),
        ("grpc.max_send_message_length", 2**31 - 1),
        # etcd's keepalive policy: clients may ping every 5 s, with or without calls
        ("grpc.http2.min_ping_interval_without_data_ms", int(config.grpc_keepalive_min_time_s * 1000)),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", int(config.grpc_keepalive_min_time_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.keepalive_time_ms", int(config.grpc_keepalive_interval_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(config.grpc_keepalive_timeout_s * 1000)),
    ]


def store_config(config: ServerConfig) -> StoreConfig:
    return StoreConfig(
        data_dir=config.data_dir,
        layout=load_layout(config.shard_layout),
        state_dir=config.state_dir,
        journal=JournalConfig(fsync=config.journal_fsync, segment_bytes_max=config.journal_segment_bytes),
        checkpoint_journal_bytes=config.checkpoint_journal_bytes,
    )


async def start(config: ServerConfig) -> Running:
    addresses = [parse_listen_url(u) for u in config.listen_client_urls]
    store = await Store.open(store_config(config))
    failed = asyncio.Event()
    store.on_failure = lambda exc: failed.set()
    member = Member(store, config)
    server = grpc.aio.server(options=grpc_options(config))
    services = {
        "KV": KVService(member),
        "Watch": WatchService(member),
        "Lease": LeaseService(member),
        "Maintenance": MaintenanceService(member),
        "Cluster": ClusterService(member),
    }
    server.add_generic_rpc_handlers([service_handler(name, svc) for name, svc in services.items()])
    health_servicer = health.aio.HealthServicer()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    ports = []
    try:
        for url, addr in zip(config.listen_client_urls, addresses):
            try:
                ports.append(server.add_insecure_port(addr))
            except RuntimeError:
                raise StartupError(f"cannot listen on {url}: address in use or not available") from None
        await server.start()
    except BaseException:
        await store.close()
        raise
    progress = asyncio.get_running_loop().create_task(_progress_ticks(store, config.watch_progress_notify_interval_s))
    return Running(server, store, ports, failed, progress)


async def _progress_ticks(store: Store, interval_s: float) -> None:
    """Progress notifications to idle watchers that asked for them (etcd's ticker)."""
    while True:
        await asyncio.sleep(interval_s)
        store.hub.progress_tick()


async def stop(running: Running, grace_s: float = 1.0) -> None:
    if running.progress is not None:
        running.progress.cancel()
    running.store.hub.close()
    await running.server.stop(grace_s)
    await running.store.close()


async def serve(config: ServerConfig, ready=None) -> int:
    """Run until SIGINT/SIGTERM (exit 0) or a journal failure (exit 1)."""
    running = await start(config)
    if ready is not None:
        ready(running)
    stop_event = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop_event.set)
    waiters = [asyncio.ensure_future(stop_event.wait()), asyncio.ensure_future(running.failed.wait())]
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    for w in waiters:
        w.cancel()
    code = 1 if running.failed.is_set() else 0
    logger.info("stopping reason=%s", "journal-failure" if code else "signal")
    await stop(running)
    return code
