"""Build, run and stop the gRPC server around a store."""
from __future__ import annotations

import asyncio
import errno
import functools
import logging
import os
import signal
import ssl
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import grpc
from grpc_health.v1 import health_pb2

from journal import Journal, JournalConfig, failpoints
from journal.errors import JournalFailed, JournalFenced, JournalGap, JournalGone, JournalUnreachable
from journal.fsutil import files_stamp
from journal.jetstream import JetStreamConfig, JetStreamLog, writer_bucket_streams
from journal.leadership import WriterLease
from journal.tail import LocalFollowLog, LocalMembers, write_writer_file
from journal.tasks import awaiting, cancel_and_wait
from shards import collector
from shards.errors import StateStoreError
from shards.layout import load_layout, partition_layout
from shards.partition import PartitionGuard, load_cluster_layout
from shards.recovery import FOLLOW_FETCH_TRIES
from shards.resync import keep_following
from shards.store import Store, StoreConfig

from proto import v3election_pb2, v3lock_pb2

from . import autocompact, grpcserver, supervised
from .concurrency import ElectionService, LockService
from .auth import AuthService
from .config import ServerConfig
from .context import Member
from .etcdflags import CIPHER_SUITES
from .peercheck import CertificateCheck
from . import handlers
from .handlers import Handling, Slow, service_handler, unknown_methods
from .health import HealthService
from .gateway import Gateway
from .http import READER_LIMIT, HttpEndpoint, start_http
from .kv import KVService
from .lease_auth import CheckedLeaseService
from .maintenance import ClusterService, MaintenanceService
from .follower import (TokenCatchUp, WriterLink, WriterTLS, follower_kv, forwarding_handlers, keepalive_handler,
                       record_epoch, writer_key, writer_record)
from .members import Registry
from .metrics import Metrics, StandbyMetrics
from .watch import WatchService

logger = logging.getLogger(__name__)

TAKEOVER_LISTEN_WAIT_S = 60.0  # a standby that took over waits this long for its URL (listen_on)


class StartupError(RuntimeError):
    """A reason the server cannot start, said in one line."""


class StoreStopped(RuntimeError):
    """The server stopped itself after a journal or state-store failure (fail-stop)."""


@dataclass
class Running:
    server: grpc.aio.Server | grpcserver.Server
    store: Store
    ports: list[int]
    failed: asyncio.Event
    progress: asyncio.Task | None = None
    autocompact: asyncio.Task | None = None
    http: list = field(default_factory=list)
    lease: WriterLease | None = None
    link: WriterLink | None = None  # a follower's way to the writer
    following: asyncio.Task | None = None
    registry: Registry | None = None  # with a replicated journal: who serves it
    promotion: asyncio.Task | None = None  # --follow --standby: takes over when the writer lease is free
    leaderless: asyncio.Task | None = None  # ends streams that require a leader when the lease is not sure
    heartbeat: asyncio.Task | None = None  # under `shardetcd cluster`: tells the supervisor the loop runs


def parse_listen_url(url: str) -> tuple[str, bool]:
    """(host:port, is TLS) of an http:// or https:// URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
        raise StartupError(f"invalid listen URL {url!r}: want http://HOST:PORT or https://HOST:PORT")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{parts.port}", parts.scheme == "https"


def _read(path: Path | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        raise StartupError(f"cannot read {what} {path}: {exc.strerror}") from None


_HTTP2_REQUIRED = ("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256")


def _restrict_ciphers(context: ssl.SSLContext, names: tuple[str, ...]) -> None:
    """etcd's --cipher-suites: TLS 1.2 offers only these; TLS 1.3 offers its own three, as Go's
    server does. As there, a list without one of the two suites HTTP/2 requires stops the start
    (etcd 3.5.1's client listener fails on it)."""
    if not any(n in _HTTP2_REQUIRED for n in names):
        raise StartupError("--cipher-suites is missing an HTTP/2-required AES_128_GCM_SHA256 cipher (need at least "
                           f"one of {' or '.join(_HTTP2_REQUIRED)})")
    openssl = [CIPHER_SUITES[n] for n in names if CIPHER_SUITES[n] is not None]
    try:
        context.set_ciphers(":".join(dict.fromkeys(openssl)))
    except ssl.SSLError:
        raise StartupError(f"--cipher-suites: this machine's OpenSSL offers none of {', '.join(names)}") from None


def tls_credentials(config: ServerConfig) -> grpc.ServerCredentials | ssl.SSLContext:
    """etcd's client TLS: certificate and key; with --client-cert-auth, clients
    must present a certificate signed by --trusted-ca-file. grpcio's credentials, or
    for the native server an SSL context offering h2 (ALPN). Either reads the certificate
    and key again for a new connection once the files changed (CertificateReload)."""
    if config.cert_file is None or config.key_file is None:
        raise StartupError("https:// client URLs need --cert-file and --key-file")
    if config.client_cert_auth and config.trusted_ca_file is None:
        raise StartupError("--client-cert-auth needs --trusted-ca-file")
    if config.grpc_server == "grpcio":
        cert, key = _read(config.cert_file, "--cert-file"), _read(config.key_file, "--key-file")
        for flag, value in (("--cipher-suites", config.cipher_suites), ("--client-crl-file", config.client_crl_file),
                            ("--client-cert-allowed-hostname", config.client_cert_allowed_hostname)):
            if value:
                raise StartupError(f"{flag} needs --grpc-server native (grpc.aio's server has no such hook)")
        ca = _read(config.trusted_ca_file, "--trusted-ca-file")
        reload = CertificateReload(config, lambda: grpc.ssl_server_certificate_configuration(
            [(config.key_file.read_bytes(), config.cert_file.read_bytes())], root_certificates=ca))
        return grpc.dynamic_ssl_server_credentials(
            grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca), reload.fetch,
            require_client_authentication=config.client_cert_auth)
    return tls_context(config, "h2")


def tls_context(config: ServerConfig, alpn: str) -> ssl.SSLContext:
    """The client TLS of etcd's --cert-file, --key-file, --trusted-ca-file, --client-cert-auth and
    --cipher-suites as an SSL context offering ``alpn``."""
    for path, flag in ((config.cert_file, "--cert-file"), (config.key_file, "--key-file")):
        _read(path, flag)  # readable, or one line saying which is not
    ca = _read(config.trusted_ca_file, "--trusted-ca-file")
    try:
        context = _server_context(config, alpn, ca)
    except (ssl.SSLError, ValueError) as exc:
        raise StartupError(f"cannot use the TLS certificate, key or CA: {exc}") from None
    context.sni_callback = CertificateReload(config, lambda: _server_context(config, alpn, ca)).handshake
    return context


def _server_context(config: ServerConfig, alpn: str, ca: bytes | None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(config.cert_file, config.key_file)
    if ca is not None:
        context.load_verify_locations(cadata=ca.decode("latin-1"))
    if config.cipher_suites:
        _restrict_ciphers(context, config.cipher_suites)
    context.verify_mode = (ssl.CERT_REQUIRED if config.client_cert_auth else
                           ssl.CERT_OPTIONAL if ca is not None else ssl.CERT_NONE)
    context.set_alpn_protocols([alpn])
    return context


class CertificateReload:
    """etcd reads --cert-file and --key-file again for every new TLS connection, so a certificate
    renewed on disk (kubeadm certs renew, cert-manager) serves from the next connection on, with
    no restart; connections already open go on with theirs. Here the files are looked at (stat)
    for each new connection and loaded again only once they changed; files that cannot be loaded
    fail new handshakes, as etcd's, until they change again (logged once for each change). The CA
    (--trusted-ca-file) is read once, at start, as etcd reads it."""

    def __init__(self, config: ServerConfig, load) -> None:
        self.paths = (config.cert_file, config.key_file)
        self.load = load  # builds what serves the files as they are now
        self.stamp = files_stamp(*self.paths)  # of the files the first context was built from
        self.renewed = None  # what serves the files since they last changed (None: the first context)
        self.error: Exception | None = None  # why the files as they are now cannot be loaded

    def _changed(self) -> bool:
        """Look at the files; load them again if they changed. Whether a renewal was loaded now."""
        try:
            stamp = files_stamp(*self.paths)
        except OSError as exc:
            stamp, self.error = None, exc
        if stamp == self.stamp:
            return False
        self.stamp = stamp
        if stamp is None:
            logger.warning("cannot read the TLS certificate files cert_file=%s key_file=%s error=%s",
                           *self.paths, self.error)
            return False
        try:
            self.renewed, self.error = self.load(), None
        except (ssl.SSLError, ValueError, OSError) as exc:
            self.renewed, self.error = None, exc
            logger.warning("cannot load the renewed TLS certificate cert_file=%s key_file=%s error=%s",
                           *self.paths, exc)
            return False
        logger.info("loaded the renewed TLS certificate cert_file=%s", self.paths[0])
        return True

    def handshake(self, ssl_object: ssl.SSLObject, server_name: str | None, context: ssl.SSLContext) -> int | None:
        """The listening context's SNI callback, called for every handshake (also without SNI)."""
        self._changed()
        if self.error is not None:
            return ssl.ALERT_DESCRIPTION_INTERNAL_ERROR  # as Go's server when GetCertificate fails
        if self.renewed is not None:
            ssl_object.context = self.renewed
        return None

    def fetch(self):
        """grpc.aio's server's certificate fetcher, called for every new connection: the renewed
        configuration once, when the files changed; None (no change) otherwise, also when they
        cannot be loaded (its server then goes on with the last it loaded)."""
        return self.renewed if self._changed() else None


async def serve_metrics(config: ServerConfig, endpoint) -> list:
    """--listen-metrics-urls; an https:// one with the client port's TLS, as etcd serves it (client
    certificates required with --client-cert-auth, the CRL and allowed hostname checked)."""
    if not config.listen_metrics_urls:
        return []
    tls = check = None
    for url in config.listen_metrics_urls:
        hostport, secure = parse_listen_url(url)
        if secure and (config.cert_file is None or config.key_file is None):  # etcd's words
            raise StartupError(f"cannot listen on TLS for {hostport}: KeyFile and CertFile are not presented")
        if secure and tls is None:
            if config.client_cert_auth and config.trusted_ca_file is None:
                raise StartupError("--client-cert-auth needs --trusted-ca-file")
            tls, check = tls_context(config, "http/1.1"), client_check(config)
    try:
        return await start_http(config.listen_metrics_urls, endpoint, parse_listen_url, tls, check)
    except (OSError, ValueError) as exc:
        raise StartupError(f"cannot serve metrics on {', '.join(config.listen_metrics_urls)}: {exc}") from None


def grpc_server(config: ServerConfig):
    """The gRPC server --grpc-server names."""
    if config.grpc_server == "grpcio":
        return grpc.aio.server(options=grpc_options(config))
    return grpcserver.Server(grpcserver.ServerOptions(
        max_receive_message_bytes=config.receive_cap_bytes, receive_limit_bytes=config.max_message_bytes,
        max_concurrent_streams=min(config.max_concurrent_streams, 2**31 - 1),
        min_ping_interval_s=config.grpc_keepalive_min_time_s,
        keepalive_interval_s=config.grpc_keepalive_interval_s,
        keepalive_timeout_s=config.grpc_keepalive_timeout_s,
        check_client=client_check(config)))


def client_check(config: ServerConfig) -> CertificateCheck | None:
    """--client-crl-file and --client-cert-allowed-hostname, checked per TLS connection."""
    if config.client_crl_file is None and config.client_cert_allowed_hostname is None:
        return None
    try:
        return CertificateCheck(config.client_crl_file, config.client_cert_allowed_hostname)
    except OSError as exc:
        raise StartupError(f"cannot read --client-crl-file {config.client_crl_file}: {exc.strerror}") from None
    except ValueError as exc:
        raise StartupError(f"--client-crl-file {config.client_crl_file} is no certificate revocation list: "
                           f"{exc}") from None


def grpc_options(config: ServerConfig) -> list[tuple[str, int]]:
    return [
        ("grpc.so_reuseport", 0),
        # above etcd's limit, which the handlers check (shim/handlers.py) to answer in grpc-go's words
        ("grpc.max_receive_message_length", config.receive_cap_bytes),
        ("grpc.max_send_message_length", 2**31 - 1),
        # etcd's keepalive policy: clients may ping every 5 s, with or without calls
        ("grpc.http2.min_ping_interval_without_data_ms", int(config.grpc_keepalive_min_time_s * 1000)),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", int(config.grpc_keepalive_min_time_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        # either 0: no server pings, as etcd (grpc core's "never" is INT_MAX)
        ("grpc.keepalive_time_ms", int(config.grpc_keepalive_interval_s * 1000)
         if config.grpc_keepalive_interval_s > 0 and config.grpc_keepalive_timeout_s > 0 else 2**31 - 1),
        ("grpc.keepalive_timeout_ms", int(config.grpc_keepalive_timeout_s * 1000)),
        ("grpc.max_concurrent_streams", min(config.max_concurrent_streams, 2**31 - 1)),
    ]


def moved_resource(partition: str, key: bytes, owner: str) -> str:
    """Why a partition whose data holds another partition's keys does not start."""
    return (f"partition {partition} holds keys the cluster layout gives to partition {owner} (e.g. "
            f"{key.decode('utf-8', 'backslashreplace')}): the layout moved a resource whose keys are here, and "
            f"{owner} would serve it without them. Moving a resource between partitions is not supported: start "
            "with the layout these keys were written under, or split a snapshot of this partition into the new "
            "layout (shardetcd snapshot restore FILE --cluster-layout NEW --data-dir NEW_DIR)")


def partition_guard(config: ServerConfig) -> PartitionGuard | None:
    if config.partition is None:
        return None
    if config.cluster_layout is None:
        raise StartupError("--partition needs --cluster-layout")
    return PartitionGuard(load_cluster_layout(config.cluster_layout), config.partition)


def store_config(config: ServerConfig) -> StoreConfig:
    # a partition process keeps its resources in one shard named after it
    layout = partition_layout(config.partition) if config.partition else load_layout(config.shard_layout)
    return StoreConfig(
        data_dir=config.data_dir,
        layout=layout,
        state_dir=config.state_dir,
        journal=JournalConfig(fsync=config.journal_fsync, segment_bytes_max=config.journal_segment_bytes,
                              inline_lone_writes=config.journal_inline_writes),
        checkpoint_journal_bytes=config.checkpoint_journal_bytes,
        bcrypt_cost=config.bcrypt_cost,
        auth_token_ttl_s=config.auth_token_ttl_s,
        auth_token=config.auth_token,
        jetstream=jetstream_config(config),
        wal_dir=config.wal_dir,
    )


def jetstream_config(config: ServerConfig) -> JetStreamConfig | None:
    if not config.journal_urls:
        return None
    return JetStreamConfig(urls=config.journal_urls, prefix=config.journal_prefix, replicas=config.journal_replicas,
                           stale_after_s=config.journal_lease_ttl_s / 2,  # found stale well before the lease lapses
                           lease_ttl_s=config.journal_lease_ttl_s, access=config.journal_access)


async def start_following(config: ServerConfig, log=None) -> tuple[Store, WriterLink, asyncio.Task]:
    """--follow: a state that follows the writer's journals (a follower that falls
    behind the journal's checkpoints, or finds its state diverged, rebuilds its
    state from the newest checkpoint in-process and goes on: shards/resync.py).
    ``log``: the journals' connection a --standby's writer lease already uses."""
    owned = log is None
    if owned:
        log = await _followed_log(config)
    try:
        store = await open_to_follow(config, log, "follower")
    except BaseException:
        if owned:
            await log.close()
        raise
    link = WriterLink(log, config.partition or "writer", store, tls=WriterTLS.of(config))
    following = asyncio.ensure_future(keep_following(store))

    def stopped(task: asyncio.Task) -> None:
        if not task.cancelled():
            store._fail(task.exception() or JournalFailed("stopped following the journals"))

    following.add_done_callback(stopped)
    logger.warning("following the writer's journals rev=%d", store.committed)
    return store, link, following


async def _followed_log(config: ServerConfig):
    """The journals a follower reads: JetStream's, or the local ones of a writer on this machine."""
    js = jetstream_config(config)
    if config.follow_data_dir is not None:
        if js is not None:
            raise StartupError("--follow takes --journal-url (JetStream) or --follow-data-dir (a local journal), not both")
        if config.follow_data_dir.absolute() == config.data_dir.absolute():
            raise StartupError("--follow-data-dir is the writer's data dir: the follower needs a --data-dir of its own")
        try:
            return LocalFollowLog(config.follow_data_dir, store_config(config).layout.names)
        except JournalUnreachable as exc:
            raise StartupError(str(exc)) from exc
    if js is None:
        raise StartupError("--follow needs the writer's journals: --journal-url (JetStream) or --follow-data-dir "
                           "(the data dir of a writer on this machine)")
    try:
        return await JetStreamLog(js).connect()
    except JournalUnreachable as exc:
        raise StartupError(str(exc)) from exc


async def take_writer_lease(config: ServerConfig) -> WriterLease | None:
    """With a JetStream journal: connect and hold the writer lease before touching
    the journals (anyone but a --standby is refused while another holds it).
    A standby gets the lease unheld: ``stand_by`` waits for it."""
    js = jetstream_config(config)
    if js is None:
        if config.standby:
            raise StartupError("--standby needs --journal-url (a standby takes over a replicated journal)")
        return None
    try:
        log = await JetStreamLog(js).connect()
    except JournalUnreachable as exc:
        raise StartupError(str(exc)) from exc
    lease = WriterLease(log, ttl_s=config.journal_lease_ttl_s, key=config.partition or "writer")
    if config.standby:
        return lease
    try:
        await lease.acquire()
    except JournalUnreachable as exc:
        await log.close()
        raise StartupError(str(exc)) from exc
    except BaseException:
        await log.close()
        raise
    log.write_under(lease)  # its revision stamped on every message this writer publishes
    lease.start_renewing()  # from now on: a recovery longer than the TTL must not let it lapse
    try:  # the journals' too, as each is opened to be written
        await log.keep_replicas(*writer_bucket_streams(log.config.prefix))
    except JournalUnreachable as exc:
        await release_writer_lease(lease)
        raise StartupError(str(exc)) from exc
    return lease


async def release_writer_lease(lease: WriterLease | None) -> None:
    if lease is not None:
        await lease.release()
        await lease.log.close()


async def open_store(config: ServerConfig, log=None, follow: bool = False) -> Store:
    """Open and recover the store; a disk that cannot take it is one line, not a traceback."""
    try:
        store = await Store.open(store_config(config), log, follow)
    except OSError as exc:
        where = exc.filename or config.data_dir
        if exc.errno == errno.ENOSPC:
            raise StartupError(f"no space left on the disk of {where} (data dir {config.data_dir}): "
                               "free space there and start again") from exc
        raise StartupError(f"{where}: {exc.strerror or exc}") from exc
    except StateStoreError as exc:
        hint = " (free space there and start again)" if "No space left" in str(exc) else ""
        raise StartupError(f"cannot rebuild the in-memory state: {exc}{hint}") from exc
    except JournalUnreachable as exc:
        raise StartupError(str(exc)) from exc
    for shard in store.shards:
        if isinstance(shard.journal, Journal):  # a lone writer's batch may hold the loop only while no other call waits
            shard.journal.inline_gate = handlers.alone
    return store


async def open_to_follow(config: ServerConfig, log, who: str) -> Store:
    """``open_store`` for a follower or a standby. The writer may release its journals past a
    checkpoint while this one starts (it checkpoints as it writes); the start then fetches the newer
    one (``recover_to_follow``), a bounded number of times: past that, the writer checkpoints more
    often than a start fetches and reads, and this says so."""
    try:
        return await open_store(config, log, follow=True)
    except JournalGap as exc:
        raise StartupError(f"the writer's checkpoints keep moving while this {who} loads "
                           f"({FOLLOW_FETCH_TRIES} tries; a larger --checkpoint-journal-bytes on the writer "
                           f"spaces them out): {exc}") from exc


async def stand_by(config: ServerConfig, lease: WriterLease) -> Store:
    """--standby: keep a state that follows the writer's journals, without
    serving clients, until the writer lease is free; then take the journals
    over and return the store, ready to serve.  /health on the metrics URLs
    says "standby" meanwhile."""
    status = StandbyStatus(config)
    status.log = lease.log
    http = await serve_metrics(config, status)
    try:
        while True:
            store = await open_to_follow(config, lease.log, "standby")
            status.store = store
            logger.warning("standing by, following the writer's journals rev=%d", store.committed)
            following = asyncio.ensure_future(store.follow_journals())
            acquiring = asyncio.ensure_future(lease.wait())
            try:
                await asyncio.wait({following, acquiring}, return_when=asyncio.FIRST_COMPLETED)
            except BaseException:
                await cancel_and_wait(following, acquiring)
                await store.close()
                raise
            if acquiring.done() and not acquiring.cancelled() and acquiring.exception() is None:
                await take_over_as_writer(lease, store, following)
                return store
            reason = following.exception() if following.done() else acquiring.exception()
            await cancel_and_wait(following, acquiring)  # the lease wait failed: stop following the store closed next
            await store.close()
            if isinstance(reason, JournalGone):  # its records went with it: a state rebuilt would lack them
                raise reason
            logger.warning("standby rebuilds its state reason=%r", reason)
    finally:
        for server in http:
            server.close()


async def take_over_as_writer(lease: WriterLease, store: Store, following: asyncio.Future) -> None:
    """The writer lease is ours: stop following, stamp our epoch on what we publish, keep
    the lease renewed, and take the journals over (shards.store.Store.take_over)."""
    await cancel_and_wait(following)
    lease.log.write_under(lease, took_over=True)
    lease.start_renewing()
    logger.warning("taking over as the writer epoch=%d", lease.revision)
    await store.take_over()
    lease.log.keep_replicas_soon(*writer_bucket_streams(lease.log.config.prefix))  # as a plain writer does at start


class StandbyStatus(HttpEndpoint):
    """The metrics URLs of a standby: /health, /readyz 503 "standby", /livez ok,
    /metrics (is_leader 0 and the revision followed), /version."""

    def __init__(self, config: ServerConfig) -> None:
        self.store: Store | None = None
        self.log: JetStreamLog | None = None  # the journals' NATS connection
        self.metrics = StandbyMetrics(self)
        self.gateway = None
        self.body_bytes_max = 4096
        self.debug = config.enable_pprof

    def health(self) -> tuple[bool, str]:
        return False, "standby"

    def route(self, method: str, path: str) -> tuple[int, tuple, bytes]:
        if path == "/livez" and method == "GET":
            return 200, (("Content-Type", "text/plain"),), b"ok"
        return super().route(method, path)


def check_client_tls(config: ServerConfig, addresses: list[tuple[str, bool]]) -> None:
    """--client-cert-file and --client-key-file: both or neither, readable; as etcd, checked when a
    client URL serves TLS (etcd builds its client side's TLS from the same settings then)."""
    if not any(tls for _, tls in addresses):
        return
    if (config.client_cert_file is None) != (config.client_key_file is None):
        raise StartupError("ClientKeyFile and ClientCertFile must both be present or both absent: "
                           f"key: {config.client_key_file or ''}, cert: {config.client_cert_file or ''}]")
    _read(config.client_cert_file, "--client-cert-file")
    _read(config.client_key_file, "--client-key-file")


async def listen_on(server, url: str, addr: str, creds, took_over: bool) -> int:
    """Listen on a client URL (TLS with ``creds``); its port. A supervised standby that took over
    (``took_over``: `shardetcd cluster --standbys`, two processes on one URL) may find the URL still
    held by the process it took over from, deposed but not gone (stopped, or hung where it would
    notice): it says so (supervised.URL_HELD) on its standard error, where the supervisor reads it
    and kills that process, and tries again meanwhile, for up to TAKEOVER_LISTEN_WAIT_S."""
    deadline = None
    while True:
        try:
            return server.add_secure_port(addr, creds) if creds is not None else server.add_insecure_port(addr)
        except RuntimeError:
            if not took_over or deadline is not None and time.monotonic() > deadline:
                raise StartupError(f"cannot listen on {url}: address in use or not available") from None
        if deadline is None:
            deadline = time.monotonic() + TAKEOVER_LISTEN_WAIT_S
            logger.warning("client URL held by the process taken over from, waiting for it url=%s", url)
            print(f"shardetcd: {url} {supervised.URL_HELD}", file=sys.stderr, flush=True)
        await asyncio.sleep(0.1)


async def start(config: ServerConfig) -> Running:
    addresses = [parse_listen_url(u) for u in config.listen_client_urls]
    check_client_tls(config, addresses)
    guard = partition_guard(config)
    link = following = None
    if config.follow_data_dir is not None and not config.follow:
        raise StartupError("--follow-data-dir goes with --follow")
    if config.wal_dir is not None and (config.journal_urls or config.follow):
        raise StartupError("--wal-dir places a local journal written by this process: not with "
                           + ("--journal-url (the journal is in JetStream)" if config.journal_urls else "--follow"))
    if config.follow and config.standby:  # a follower now, the writer once the writer lease is free
        if config.follow_data_dir is not None:
            raise StartupError("--follow --standby takes over a replicated journal: give --journal-url, "
                               "not --follow-data-dir")
        lease = await take_writer_lease(config)
        try:
            store, link, following = await start_following(config, lease.log)
        except BaseException:
            await release_writer_lease(lease)
            raise
    elif config.follow:
        lease = None
        store, link, following = await start_following(config)
    else:
        lease = await take_writer_lease(config)
        try:
            if config.standby:
                store = await stand_by(config, lease)
            else:
                store = await open_store(config, lease.log if lease else None)
        except BaseException:
            await release_writer_lease(lease)
            raise
    collector.freeze_now()  # the store's large containers out of the collector's sight (shards/collector.py)
    failed = asyncio.Event()
    store.on_failure = lambda exc: failed.set()
    if lease is not None:
        lease.on_lost = store._fail
        if link is None:  # writing: a lease taken again after a lapse is trusted once the journals are fenced again
            try:
                await lease.fence_with(store.fence_journals)
            except JournalFailed:
                pass  # lease.lost, below
        if lease.lost is not None:  # while recovering: another process writes now
            await store.close()
            await release_writer_lease(lease)
            raise StartupError(f"{lease.lost} while recovering: another shardetcd writes these journals now")
    if guard is not None and (stray := next(filter(None, (guard.foreign(s.live) for s in store.states)), None)):
        await store.close()
        await release_writer_lease(lease)
        raise StartupError(moved_resource(config.partition, *stray))
    member = Member(store, config, guard)
    member.link = link
    member.standing_by = link is not None and lease is not None  # --follow --standby: until it takes over
    member.lease = lease if link is None else None  # a writer's linearizable answers need it surely held
    if member.lease is not None:
        member.leader_probe = member.lease_sure
    elif link is not None and isinstance(link.log, JetStreamLog):  # a follower knows a leader while NATS names one
        holder = lease or WriterLease(link.log, ttl_s=config.journal_lease_ttl_s, key=config.partition or "writer")
        member.leader_probe = functools.partial(holder.held, config.journal_lease_ttl_s)  # a slow answer is an answer
    elif link is not None:  # a local journal's follower: its leader is the writer process on this machine
        member.leader_probe = functools.partial(link.answers, config.journal_lease_ttl_s)
    server = grpc_server(config)
    gate, front = None, []
    if link is not None:  # a follower: these go to the writer (registered first, so they win)
        front = [keepalive_handler(link, member), *forwarding_handlers(link, member.headers)]
        server.add_generic_rpc_handlers(front)
        gate = link.tokens = TokenCatchUp(link, member)  # calls served here learn new tokens first
    services = {
        "KV": follower_kv(member, link) if link is not None else KVService(member),
        "Watch": WatchService(member),
        "Lease": CheckedLeaseService(member),
        "Maintenance": MaintenanceService(member),
        "Cluster": ClusterService(member),
        "Auth": AuthService(member),
    }
    limit = config.max_message_bytes
    Slow.threshold_s = config.warning_apply_duration_s
    Handling.on = config.metrics == "extensive"
    native = isinstance(server, grpcserver.Server)
    server.add_generic_rpc_handlers([service_handler(name, svc, gate=gate, max_message=limit, parts=native)
                                     for name, svc in services.items()])
    recipes = {"Lock": LockService(member), "Election": ElectionService(member)}
    server.add_generic_rpc_handlers([service_handler("Lock", recipes["Lock"], v3lock_pb2, gate, limit),
                                     service_handler("Election", recipes["Election"], v3election_pb2, gate, limit)])
    registry = None
    try:  # before serving: followers find the writer here (after a takeover too); MemberList lists who serves
        if lease is not None and link is None:
            try:
                await failpoints.pause("server.before_announce")
                await announce_writer(lease, member, config)
            except JournalFenced as exc:
                raise StartupError(str(exc)) from None
        elif store.watermark is not None:  # a local journal: its followers on this machine look here
            write_writer_file(store.datadir.path, writer_record(config.client_urls, member.member_id, config.name,
                                                                      member.forward_secret))
        journal_log = lease.log if lease is not None else link.log if link is not None else None
        if journal_log is None and store.watermark is not None:  # a local journal: followers may list it
            journal_log = LocalMembers(store.datadir.path)
        if journal_log is not None:
            member.registry = registry = Registry(journal_log, config.partition or "writer", services["Cluster"]._me())
            await registry.start()
    except BaseException:
        await store.close()
        await release_writer_lease(lease)
        raise
    server.add_generic_rpc_handlers([service_handler("Health", HealthService(), health_pb2, max_message=limit)])
    served = [f"etcdserverpb.{name}" for name in services] + ["v3lockpb.Lock", "v3electionpb.Election",
                                                               "grpc.health.v1.Health"]
    server.add_generic_rpc_handlers([unknown_methods(served)])  # last: only what nothing else serves
    gateway = Gateway(services | recipes, config.max_message_bytes, front, gate)  # as a gRPC call would go
    endpoint = HttpEndpoint(member, Metrics(member), gateway)
    if isinstance(server, grpcserver.Server):  # HTTP on the client port too, as etcd serves it
        server.http1, server.http2 = endpoint.handle_client_port, endpoint.serve
        server.http1_read_limit = READER_LIMIT
    ports, http = [], []
    try:
        creds = tls_credentials(config) if any(tls for _, tls in addresses) else None
        took_over = config.standby and not config.follow and supervised.supervisor is not None
        for url, (addr, tls) in zip(config.listen_client_urls, addresses):
            ports.append(await listen_on(server, url, addr, creds if tls else None, took_over))
        # the metrics URLs before the client port serves: whoever finds that serving finds them too
        # (a probe of /health, a scrape right after a start)
        http = await serve_metrics(config, endpoint)
        await server.start()
    except BaseException:
        for listener in http:
            listener.close()
        if registry is not None:
            await registry.stop()
        await store.close()
        await release_writer_lease(lease)
        raise
    loop = asyncio.get_running_loop()
    logger.info("serving event_loop=%s", type(loop).__module__.split(".")[0])  # uvloop or asyncio
    progress = loop.create_task(_progress_ticks(store, config.watch_progress_notify_interval_s))
    running = Running(server, store, ports, failed, progress, lease=lease, link=link, following=following,
                      registry=registry, http=http)
    if supervised.heartbeat_fd is not None:  # under `shardetcd cluster`
        running.heartbeat = loop.create_task(supervised.heartbeat())
    if member.leader_probe is not None:  # a replicated journal's writer or follower can lose its leader
        running.leaderless = loop.create_task(member.end_streams_without_a_leader(config.journal_lease_ttl_s / 3))
    if link is None:  # a follower's journals are written by the writer, compactions included
        running.autocompact = autocompact.start(config.auto_compaction, lambda: store.committed, store.compact)
    elif lease is not None:
        running.promotion = loop.create_task(promote_when_free(running, member, config))
    return running


async def announce_writer(lease: WriterLease, member: Member, config: ServerConfig) -> None:
    """Say in the journal's meta bucket where the writer serves: followers hand their writes there.
    Never over the record of a writer that took the journals over after this one (a greater epoch):
    this one, frozen after its lease and journals were taken over and resumed before it noticed,
    pointed every follower's writes at itself, a writer about to fail-stop, and the new writer
    never said again where it serves. JournalFenced instead: its journals are another's."""
    epoch = lease.log.epoch
    record = writer_record(config.client_urls, member.member_id, config.name, member.forward_secret, epoch)
    if not await lease.log.update_meta(writer_key(lease.key), record, lambda current: record_epoch(current) > epoch):
        raise JournalFenced(f"another shardetcd took these journals over after this one (writer lease revision "
                            f"{epoch}) and serves them now")


async def promote_when_free(running: Running, member: Member, config: ServerConfig) -> None:
    """--follow --standby: serve as a follower until the writer lease is free, then
    take the journals over (as a --standby does) and serve everything here, on
    the connections clients already have: nothing to reconnect to."""
    lease, store, link = running.lease, running.store, running.link
    while True:
        try:
            await lease.wait()
            break
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - NATS unreachable: the writer cannot renew either; ask again
            logger.warning("writer lease not readable, standing by error=%r", exc)
            await asyncio.sleep(lease.ttl_s / 3)
    try:
        await take_over_as_writer(lease, store, running.following)
        link.active = False  # from here on every call is served here; calls in flight to the old writer find us
        await lease.fence_with(store.fence_journals)
        member.took_over(lease)
        await announce_writer(lease, member, config)
        running.autocompact = autocompact.start(config.auto_compaction, lambda: store.committed, store.compact)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - a takeover that failed half-way: stop, as a writer whose journal failed
        logger.error("takeover failed error=%r", exc)
        store._fail(exc)


async def _progress_ticks(store: Store, interval_s: float) -> None:
    """Progress notifications to idle watchers that asked for them (etcd's ticker)."""
    while True:
        await asyncio.sleep(interval_s)
        store.hub.progress_tick()


async def stop(running: Running, grace_s: float = 1.0) -> None:
    for http in running.http:
        http.close()
    for task in (running.progress, running.autocompact, running.leaderless, running.heartbeat):
        if task is not None:
            task.cancel()
    await cancel_and_wait(running.promotion)
    running.store.hub.close()
    await running.server.stop(grace_s)
    if running.registry is not None:
        await running.registry.stop()
    await cancel_and_wait(running.following)
    await running.store.close()
    await release_writer_lease(running.lease)
    if running.link is not None:
        await running.link.close()
        if running.lease is None or running.link.log is not running.lease.log:  # the lease's log: closed above
            await running.link.log.close()


STOP_BOUND_S = 20.0  # a stop still going this long after its last sign of work is stuck (1 s grace for calls)


async def bounded(stopping, bound_s: float, working=lambda: False, exit=os._exit) -> None:
    """Await ``stopping``; if it has not ended within ``bound_s`` and ``working()`` says nothing
    is still being done (a checkpoint being written: the stop waits for it, and then gives the stop
    ``bound_s`` more, as a stop waiting on that work may not have run on yet), log every task
    still pending and where it waits, and end the process (exit 1) rather than hang
    half-stopped: its listeners may be closed already, and a stuck process neither serves nor
    gets restarted. Nothing acknowledged is lost by that: it is in the journal already."""
    task = asyncio.ensure_future(stopping)
    waited_for_work = False
    while True:
        done, _ = await asyncio.wait({task}, timeout=bound_s)
        if done:
            return task.result()
        if working():
            waited_for_work = True
            logger.warning("stop waits for a checkpoint being written")
        elif waited_for_work:  # the work just ended: the stop gets a whole bound after it to finish
            waited_for_work = False
        else:
            break
    me = asyncio.current_task()
    pending = sorted((t for t in asyncio.all_tasks() if t is not me), key=lambda t: t.get_name())
    logger.critical("stop did not end within %.0f s, exiting; tasks pending: %s", bound_s,
                    "; ".join(f"{t.get_name()}: {awaiting(t)}" for t in pending))
    print(f"shardetcd: the stop did not end within {bound_s:.0f} s (stuck, see the log); exiting",
          file=sys.stderr, flush=True)
    logging.shutdown()
    exit(1)


async def stop_then_the_rest(stopping, *spared: asyncio.Task) -> None:
    """Await ``stopping``, then end every other task still pending (but ``spared``), cancelling
    again those that go on: asyncio.run's own clean-up cancels once and waits for ever, and on
    Python 3.11 a cancel can be lost in a wait_for (journal/tasks.py)."""
    await stopping
    me = asyncio.current_task()
    await cancel_and_wait(*(t for t in asyncio.all_tasks() if t is not me and t not in spared))


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
    source = running.store.failure_source
    logger.info("stopping reason=%s", f"{source}-failure" if code else "signal")
    await bounded(stop_then_the_rest(stop(running), asyncio.current_task()), STOP_BOUND_S,
                  working=lambda: any(shard.checkpoint_task is not None for shard in running.store.shards))
    if code:
        raise StoreStopped(f"stopped after a {source} failure: {running.store.failure}")
    return code
