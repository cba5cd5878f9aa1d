"""Server configuration: etcd's flag names where etcd has the same knob."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .autocompact import AutoCompaction

if TYPE_CHECKING:
    from journal.jetstream import NatsAccess

ETCD_API_VERSION = "3.5.16"  # the etcd release whose API and behaviour we implement
# etcd's slack above --max-request-bytes: how much gRPC may receive, and the
# size at which a watch response that allows fragments is cut
GRPC_OVERHEAD_BYTES = 512 * 1024
GRPC_SERVERS = ("native", "grpcio")  # --grpc-server: shim/grpcserver.py, grpc.aio's server


@dataclass(frozen=True)
class ServerConfig:
    name: str = "default"
    data_dir: Path = Path("default.shardetcd")
    listen_client_urls: tuple[str, ...] = ("http://127.0.0.1:2379",)
    advertise_client_urls: tuple[str, ...] = ()
    initial_advertise_peer_urls: tuple[str, ...] = ("http://localhost:2380",)  # etcd's default; only reported
    max_request_bytes: int = 1536 * 1024
    max_txn_ops: int = 128
    quota_backend_bytes: int = 0
    shard_layout: Path | None = None
    state_dir: Path | None = None
    wal_dir: Path | None = None  # the local journals here (etcd's --wal-dir), e.g. on a disk of their own
    journal_fsync: str = "always"
    journal_inline_writes: bool = True  # a lone writer's batches written on the event loop (JournalConfig.inline_lone_writes)
    journal_segment_bytes: int = 64 * 1024 * 1024
    checkpoint_journal_bytes: int = 256 * 1024 * 1024
    journal_urls: tuple[str, ...] = ()  # nats:// URLs: journals on NATS JetStream instead of local segments
    journal_replicas: int = 3
    journal_prefix: str = "shardetcd"
    journal_lease_ttl_s: float = 3.0  # the writer lease: a standby takes over this long after the writer stops
    journal_access: NatsAccess | None = None  # TLS to the NATS servers, a NATS user's credentials file
    standby: bool = False  # wait for the writer lease, then take over
    follow: bool = False  # serve reads and watches from the writer's journals; hand everything else to it
    follow_data_dir: Path | None = None  # with follow: the data dir of a writer on this machine (its local journal)
    watch_progress_notify_interval_s: float = 600.0
    metrics: str = "basic"  # etcd's --metrics: "extensive" adds grpc_server_handling_seconds
    warning_apply_duration_s: float = 0.1  # a unary call slower than this is logged and counted, as etcd's
    enable_pprof: bool = False  # serve /debug/tasks (shim/debug.py)
    cert_file: Path | None = None
    key_file: Path | None = None
    trusted_ca_file: Path | None = None
    client_cert_auth: bool = False
    # what this member presents when it calls another (a follower its writer), as etcd's own
    # client side: these, else cert_file/key_file
    client_cert_file: Path | None = None
    client_key_file: Path | None = None
    cipher_suites: tuple[str, ...] = ()  # Go's names (--cipher-suites); empty: OpenSSL's defaults
    client_crl_file: Path | None = None  # serials refused after the handshake (shim/peercheck.py)
    client_cert_allowed_hostname: str | None = None  # a client certificate must name this host
    listen_metrics_urls: tuple[str, ...] = ()
    grpc_keepalive_min_time_s: float = 5.0
    grpc_keepalive_interval_s: float = 2 * 60 * 60
    grpc_keepalive_timeout_s: float = 20.0
    max_concurrent_streams: int = 2**32 - 1  # etcd's default: math.MaxUint32
    grpc_server: str = "native"  # one of GRPC_SERVERS: shim/grpcserver.py, or grpc.aio's server
    cluster_layout: Path | None = None  # with partition: serve one partition of a `shardetcd cluster`
    partition: str | None = None
    bcrypt_cost: int = 10  # etcd's --bcrypt-cost
    auth_token_ttl_s: int = 300  # etcd's --auth-token-ttl
    auth_token: str = "simple"  # etcd's --auth-token
    auto_compaction: AutoCompaction = AutoCompaction("periodic", 0.0)  # off, as etcd's default
    extra: dict = field(default_factory=dict)

    @property
    def client_urls(self) -> tuple[str, ...]:
        return self.advertise_client_urls or self.listen_client_urls

    @property
    def max_message_bytes(self) -> int:
        """etcd's gRPC receive limit: the largest request plus its gRPC overhead allowance."""
        return self.max_request_bytes + GRPC_OVERHEAD_BYTES

    @property
    def receive_cap_bytes(self) -> int:
        """The most one request message may make the server hold before it is refused: grpc's own
        receive limit, set above etcd's so the handlers can refuse in grpc-go's words."""
        return max(4 * self.max_message_bytes, 16 << 20)
