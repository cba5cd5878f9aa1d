"""The ``shardetcd`` command: serve the etcd v3 API (default)."""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import sys
from pathlib import Path

from journal import JournalCorrupt
from journal.errors import JournalError, JournalGone, JournalHeadLost
from journal.verify import repair, verify
from shards.errors import DataDirError, LayoutError
from shards.layout import load_layout
from shards.snapshot import SnapshotError, restore_snapshot
from shards.durations import go_duration_s
from shards.tokens import TokenOptionsError, parse_auth_token

from . import logs
from .autocompact import AutoCompaction
from .config import ETCD_API_VERSION, GRPC_SERVERS, ServerConfig
from .etcdflags import FlagError, cipher_suites, normalize, refusal, validate
from .loop import EVENT_LOOPS, default_event_loop, run as run_loop
from .server import StartupError, StoreStopped, serve

logger = logging.getLogger("shim.cli")

DESCRIPTION = """\
Serve the etcd v3 gRPC API from journaled, resource-sharded MVCC state.
With no arguments: listen on http://127.0.0.1:2379, data in ./default.shardetcd.
Flags follow etcd's names where etcd has the same knob, and etcd 3.5's command line is
read as etcd reads it (Go's flag syntax, ETCD_* environment variables): etcd's flags for
Raft, peers and bbolt are accepted and have no effect; the few whose loss would weaken
security or split a cluster (e.g. --auto-tls, a multi-member --initial-cluster with a
local journal) stop the start with a line saying why.

Other commands (each has --help):
  shardetcd cluster ...            one process per partition of a cluster layout, supervised
  shardetcd migrate --from URL ... a live etcd's data into a new data dir, revisions kept
  shardetcd snapshot restore ...   an etcd snapshot into a new data dir
  shardetcd journal verify ...     check journals and checkpoints (local or JetStream)"""


def _urls(text: str) -> tuple[str, ...]:
    urls = tuple(u.strip() for u in text.split(",") if u.strip())
    if not urls:
        raise argparse.ArgumentTypeError("at least one URL is required")
    return urls


def _duration_or_zero(default_s: float):
    """A Go duration where 0 (or less) means ``default_s``, as etcd and grpc-go read their knobs:
    --grpc-keepalive-min-time 0 is grpc-go's 5 minutes, a progress interval of 0 etcd's 10, a
    keepalive interval or timeout of 0 no pings, an apply warning after 0 every request."""
    def parse(text: str) -> float:
        try:
            value = go_duration_s(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid duration {text!r}: want e.g. 10m, 5s or 100ms") from None
        return value if value > 0 else default_s
    return parse


def _bcrypt_cost(text: str) -> int:
    try:
        cost = int(text)
    except ValueError:
        cost = 0
    if not 4 <= cost <= 31:
        raise argparse.ArgumentTypeError(f"invalid bcrypt cost {text!r}: valid values are between 4 and 31")
    return cost


def _auth_token(text: str) -> str:
    """Checked now (keys read, options parsed) so that a bad value stops the start, as in etcd."""
    try:
        parse_auth_token(text, 300.0)
    except TokenOptionsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: want a positive whole number")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shardetcd", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = ServerConfig()
    p.add_argument("--name", default=d.name, help="human-readable name of this member (default: %(default)s)")
    p.add_argument("--data-dir", type=Path, default=None, help="where journals and checkpoints live (default: ./${name}.shardetcd)")
    p.add_argument("--listen-client-urls", type=_urls, default=d.listen_client_urls, help="comma-separated URLs to serve clients on (default: http://127.0.0.1:2379)")
    p.add_argument("--advertise-client-urls", type=_urls, default=(), help="client URLs to report in MemberList and to followers; required with "
                   "--listen-client-urls, as etcd (default: the listen URLs, with no --listen-client-urls or "
                   "from a --config-file)")
    p.add_argument("--initial-advertise-peer-urls", type=_urls, default=d.initial_advertise_peer_urls,
                   help="peer URLs to report in MemberList, as etcd (no peer traffic here: writers and standbys "
                        "share a journal, not Raft) (default: %(default)s)")
    p.add_argument("--max-request-bytes", type=int, default=d.max_request_bytes, help="largest write request accepted, in bytes (default: %(default)s = 1.5 MiB)")
    p.add_argument("--max-txn-ops", type=int, default=d.max_txn_ops, help="most operations in one txn (default: %(default)s)")
    p.add_argument("--quota-backend-bytes", type=int, default=d.quota_backend_bytes, help="state size that raises the NOSPACE alarm; 0 = etcd's default of 2 GiB (default: %(default)s)")
    p.add_argument("--experimental-watch-progress-notify-interval", type=_duration_or_zero(600.0), default="10m",
                   help="how often idle watchers that asked for progress notifications get one, e.g. 10m, 5s, 100ms; "
                        "0: the default, as etcd (default: %(default)s)")
    p.add_argument("--metrics", default=ServerConfig().metrics,
                   help="etcd's metrics level: 'extensive' also observes every gRPC call's handling time "
                        "(grpc_server_handling_seconds); anything else is 'basic', as etcd reads it (default: %(default)s)")
    p.add_argument("--experimental-warning-apply-duration", type=_duration_or_zero(0.0), default="100ms",
                   help="a request taking longer is logged as too long and counted in etcd_server_slow_apply_total "
                        "(default: %(default)s, as etcd)")
    p.add_argument("--enable-pprof", action="store_true",
                   help="serve /debug/tasks on the client and metrics URLs: what every asyncio task (down to what "
                        "it waits on) and every thread of the process is doing, as text; what etcd's flag serves "
                        "is the Go runtime's profiles (/debug/pprof), these are a Python server's goroutine dump")
    p.add_argument("--max-concurrent-streams", type=int, default=d.max_concurrent_streams, help="most concurrent gRPC streams per client connection (default: %(default)s, as etcd)")
    p.add_argument("--grpc-keepalive-min-time", type=_duration_or_zero(300.0), default=f"{d.grpc_keepalive_min_time_s:g}s", help="shortest interval a client may ping at; 0: grpc-go's 5 minutes, as etcd (default: %(default)s)")
    p.add_argument("--grpc-keepalive-interval", type=_duration_or_zero(0.0), default=f"{d.grpc_keepalive_interval_s / 3600:g}h", help="how often the server pings an idle connection; 0: never, as is 0 for the timeout (default: %(default)s)")
    p.add_argument("--grpc-keepalive-timeout", type=_duration_or_zero(0.0), default=f"{d.grpc_keepalive_timeout_s:g}s", help="how long the server waits for a ping answer before closing; 0: no pings (default: %(default)s)")
    p.add_argument("--grpc-server", choices=GRPC_SERVERS, default=d.grpc_server,
                   help="the gRPC server: native (HTTP/2 on asyncio, shim/grpcserver.py) or grpcio (grpc.aio's); "
                        "the same calls and answers, native at a fraction of the CPU (default: %(default)s)")
    p.add_argument("--cert-file", type=Path, default=None, help="server TLS certificate (PEM), used by https:// client URLs")
    p.add_argument("--key-file", type=Path, default=None, help="server TLS private key (PEM)")
    p.add_argument("--trusted-ca-file", type=Path, default=None, help="CA bundle (PEM) that client certificates must be signed by")
    p.add_argument("--cipher-suites", type=cipher_suites, default=(),
                   help="comma-separated TLS 1.2 cipher suites offered to clients, by Go's names as etcd takes them "
                        "(e.g. TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256); TLS 1.3's are always offered "
                        "(default: OpenSSL's)")
    p.add_argument("--client-crl-file", type=Path, default=None,
                   help="certificate revocation list (PEM or DER): a TLS client whose certificate it names is cut "
                        "off after the handshake; read again when the file changes (native gRPC server)")
    p.add_argument("--client-cert-allowed-hostname", default=None,
                   help="TLS clients' certificates must name this host among their subject alternative names "
                        "(native gRPC server)")
    p.add_argument("--client-cert-file", type=Path, default=None,
                   help="client TLS certificate (PEM) this member presents when it calls another: a follower its "
                        "writer's https:// URL (default: --cert-file, as etcd)")
    p.add_argument("--client-key-file", type=Path, default=None, help="the key of --client-cert-file (PEM)")
    p.add_argument("--client-cert-auth", action="store_true", help="refuse TLS clients without a certificate signed by --trusted-ca-file")
    p.add_argument("--listen-metrics-urls", type=_urls, default=(), help="comma-separated URLs serving /metrics, /health, /readyz, /livez and /version; https:// ones "
                        "with the client TLS settings (--cert-file, --key-file, --client-cert-auth, ...), as etcd")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warn", "error"], help="log verbosity (default: %(default)s)")
    p.add_argument("--log-outputs", type=lambda text: tuple(t for t in text.split(",") if t), default=("default",),
                   help="comma-separated, as etcd's: default or stderr, stdout, systemd/journal (the journal's socket), "
                        "or file paths appended to (default: default)")
    p.add_argument("--enable-log-rotation", action="store_true",
                   help="rotate the one file of --log-outputs as etcd does (see --log-rotation-config-json)")
    p.add_argument("--log-rotation-config-json", default=logs.ROTATION_DEFAULT,
                   help="etcd's: maxsize (MiB), maxage (days), maxbackups, localtime, compress (default: %(default)s)")
    p.add_argument("--logger", default="zap", help="etcd's; zap, the only one etcd 3.5 has (default: %(default)s)")
    p.add_argument("--shard-layout", type=Path, default=None, help="TOML file naming which Kubernetes resources each shard owns (default: built-in leases/events/pods/nodes/default)")
    p.add_argument("--journal-fsync", choices=["always", "batch", "off"], default=d.journal_fsync,
                   help="always: fdatasync every group-commit batch before acknowledging; batch: the same, gathering writes for up to 2 ms per fsync; "
                        "off: acknowledge once written to the OS (survives a process crash, not a power loss) (default: %(default)s)")
    p.add_argument("--event-loop", choices=EVENT_LOOPS, default=default_event_loop(),
                   help="the event loop serving every request: uvloop (libuv; less CPU per request) or the standard "
                        "library's asyncio (default: %(default)s)")
    p.add_argument("--journal-inline-writes", choices=["on", "off"], default="on" if d.journal_inline_writes else "off",
                   help="local journal: on: a lone writer's batch (one write, quick fsyncs, no other call in flight) is written and synced on the "
                        "event loop, saving a thread hand-off; off: every batch goes to the journal's writer thread, so a disk "
                        "that stalls in fdatasync holds back writes only, never reads, watches or /health (default: %(default)s)")
    p.add_argument("--wal-dir", type=Path, default=None,
                   help="keep the local journal (etcd's WAL) in this dir, e.g. on a disk of its own, instead of the data "
                        "dir: each shard's journal dir becomes a link to WAL_DIR/<shard>. Recorded at the first start; "
                        "later starts must give the same dir (default: in the data dir)")
    p.add_argument("--state-dir", type=Path, default=None, help="where the in-memory RocksDB state lives (default: a directory under /dev/shm); rebuilt on every start")
    p.add_argument("--cluster-layout", type=Path, default=None, help="with --partition: the `shardetcd cluster` layout this process is one partition of")
    p.add_argument("--partition", default=None, help="serve this partition of --cluster-layout: writes to other partitions' resources are refused")
    p.add_argument("--journal-segment-bytes", type=int, default=d.journal_segment_bytes, help="size at which a journal segment is closed and a new one started (default: %(default)s)")
    p.add_argument("--auth-token", type=_auth_token, default="simple",
                   help="auth token type as etcd: simple, or jwt,sign-method=RS256|ES256|HS256|...,priv-key=FILE[,pub-key=FILE][,ttl=5m] "
                        "(default: %(default)s)")
    p.add_argument("--auth-token-ttl", type=_positive_int, default=d.auth_token_ttl_s, help="seconds an auth token lives unused (default: %(default)s)")
    p.add_argument("--bcrypt-cost", type=_bcrypt_cost, default=d.bcrypt_cost, help="bcrypt cost of stored password hashes, 4 to 31 (default: %(default)s)")
    p.add_argument("--auto-compaction-mode", choices=["periodic", "revision"], default="periodic",
                   help="how --auto-compaction-retention is read: periodic (a time window) or revision (a count) (default: %(default)s)")
    p.add_argument("--auto-compaction-retention", default="0",
                   help="history to keep, as etcd: periodic: a duration (30m, 72h) or a number of hours; revision: a number of revisions; "
                        "0 = no automatic compaction (default: %(default)s)")
    p.add_argument("--checkpoint-journal-bytes", type=int, default=d.checkpoint_journal_bytes, help="journal bytes after which a shard writes a checkpoint, bounding replay time (default: %(default)s)")
    p.add_argument("--journal-url", type=_nats_urls, default=(), dest="journal_urls",
                   help="comma-separated nats:// URLs of a NATS JetStream cluster: keep the journals and checkpoints there, "
                        "replicated, instead of in --data-dir; while NATS cannot take a write it waits (etcd's request "
                        "timeout applies); check the streams with `shardetcd journal verify --journal-url URLS` "
                        "(default: local journal)")
    p.add_argument("--journal-replicas", type=_positive_int, default=d.journal_replicas,
                   help="with --journal-url: JetStream replicas of each journal stream and checkpoint bucket (default: %(default)s)")
    p.add_argument("--standby", action="store_true",
                   help="with --journal-url: do not serve clients; keep a state that follows the writer's journals, "
                        "and when the writer's lease lapses (it stopped or died) take the journals over and serve "
                        "the same revision sequence (/health on --listen-metrics-urls says standby meanwhile). With "
                        "--follow: serve as a follower until then (reads and watches here, the rest handed to the "
                        "writer), so clients given this URL are already connected to it when it takes over")
    p.add_argument("--follow", action="store_true",
                   help="a follower: serve reads and watches from a state that follows the writer's journals "
                        "(linearizable reads ask the writer's committed revision first), and hand writes, leases "
                        "and auth calls to the writer (auth tokens from any member work here); the journals are the "
                        "JetStream ones of --journal-url, or the local ones of a writer on this machine named by "
                        "--follow-data-dir; one that falls behind the journal's checkpoints rebuilds its state from "
                        "the newest checkpoint without exiting; /metrics on --listen-metrics-urls shows its lag")
    p.add_argument("--follow-data-dir", type=Path, default=None, metavar="DIR",
                   help="with --follow: the --data-dir of a writer on this machine that keeps its journal there "
                        "(the default local journal); read only, never written: the follower keeps its own "
                        "--data-dir and state, applies what the writer has made durable and committed (it polls "
                        "the writer's published position every 1-5 ms) and finds the writer's client URL there")
    p.add_argument("--journal-lease-ttl", type=float, default=d.journal_lease_ttl_s, dest="journal_lease_ttl",
                   help="with --journal-url: seconds the writer lease lasts without renewal, so how soon a standby "
                        "takes over (default: %(default)s)")
    p.add_argument("--journal-prefix", default=d.journal_prefix,
                   help="with --journal-url: prefix of the stream and bucket names, one set per cluster (default: %(default)s)")
    add_journal_access(p)
    return p


_ACCESS = (  # how to reach the NATS servers of --journal-url: each flag takes a FILE
    ("--journal-trusted-ca-file", "with --journal-url: the CA that signed the NATS servers' certificates (default: "
                                  "the system's); a server that requires TLS is then reached over TLS"),
    ("--journal-cert-file", "with --journal-url: a client certificate for NATS servers that verify clients"),
    ("--journal-key-file", "the key of --journal-cert-file"),
    ("--journal-creds-file", "with --journal-url: the NATS user's credentials file (its JWT and NKey seed, as an "
                             "operator-mode NATS account issues them, e.g. with nsc)"),
    ("--journal-nkey-file", "with --journal-url: a file holding the NKey seed (SU...) of a NATS `nkey:` user. A user "
                            "and password or a token go in the URL instead (nats://USER:PASSWORD@HOST:PORT), which "
                            "shows them to anyone who can list processes; a file does not"),
)
_ACCESS_FLAGS = tuple(flag for flag, _ in _ACCESS)


def add_journal_access(p: argparse.ArgumentParser) -> None:
    """How to reach the NATS servers of --journal-url: TLS and a NATS user's credentials (every
    command that reaches them)."""
    for flag, text in _ACCESS:
        p.add_argument(flag, default=None, metavar="FILE", help=text)


def journal_access(p: argparse.ArgumentParser, args: argparse.Namespace):
    """``add_journal_access``'s NatsAccess, or None (parser error: a certificate without its key, two
    credentials files, or any of them without --journal-url)."""
    ca, cert, key = args.journal_trusted_ca_file, args.journal_cert_file, args.journal_key_file
    creds, nkey = args.journal_creds_file, args.journal_nkey_file
    if not (ca or cert or key or creds or nkey):
        return None
    if bool(cert) != bool(key):
        p.error("--journal-cert-file and --journal-key-file go together")
    if creds and nkey:
        p.error("--journal-creds-file and --journal-nkey-file are two ways to name the NATS user: give one")
    if not args.journal_urls:
        p.error(f"{', '.join(_ACCESS_FLAGS[:-1])} and {_ACCESS_FLAGS[-1]} go with --journal-url")
    from journal.jetstream import NatsAccess

    return NatsAccess(ca, cert, key, creds, nkey)


def _nats_urls(text: str) -> tuple[str, ...]:
    urls = tuple(u.strip() for u in text.split(",") if u.strip())
    for u in urls:
        if not u.startswith(("nats://", "tls://")):
            raise argparse.ArgumentTypeError(f"not a nats:// URL: {u!r}")
    return urls


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(
        name=args.name,
        data_dir=args.data_dir or Path(f"{args.name}.shardetcd"),
        listen_client_urls=args.listen_client_urls,
        advertise_client_urls=args.advertise_client_urls,
        initial_advertise_peer_urls=args.initial_advertise_peer_urls,
        max_request_bytes=args.max_request_bytes,
        max_txn_ops=args.max_txn_ops,
        quota_backend_bytes=args.quota_backend_bytes,
        shard_layout=args.shard_layout,
        state_dir=args.state_dir,
        wal_dir=args.wal_dir,
        journal_fsync=args.journal_fsync,
        journal_inline_writes=args.journal_inline_writes == "on",
        journal_segment_bytes=args.journal_segment_bytes,
        checkpoint_journal_bytes=args.checkpoint_journal_bytes,
        journal_urls=args.journal_urls,
        journal_replicas=args.journal_replicas,
        journal_prefix=args.journal_prefix,
        journal_lease_ttl_s=args.journal_lease_ttl,
        standby=args.standby,
        follow=args.follow,
        follow_data_dir=args.follow_data_dir,
        watch_progress_notify_interval_s=args.experimental_watch_progress_notify_interval,
        warning_apply_duration_s=args.experimental_warning_apply_duration,
        enable_pprof=args.enable_pprof,
        metrics=args.metrics,
        cert_file=args.cert_file,
        key_file=args.key_file,
        trusted_ca_file=args.trusted_ca_file,
        client_cert_auth=args.client_cert_auth,
        client_cert_file=args.client_cert_file,
        client_key_file=args.client_key_file,
        cipher_suites=args.cipher_suites,
        client_crl_file=args.client_crl_file,
        client_cert_allowed_hostname=args.client_cert_allowed_hostname,
        listen_metrics_urls=args.listen_metrics_urls,
        max_concurrent_streams=args.max_concurrent_streams,
        grpc_server=args.grpc_server,
        grpc_keepalive_min_time_s=args.grpc_keepalive_min_time,
        grpc_keepalive_interval_s=args.grpc_keepalive_interval,
        grpc_keepalive_timeout_s=args.grpc_keepalive_timeout,
        cluster_layout=args.cluster_layout,
        partition=args.partition,
        bcrypt_cost=args.bcrypt_cost,
        auth_token_ttl_s=args.auth_token_ttl,
        auth_token=args.auth_token,
        auto_compaction=AutoCompaction.parse(args.auto_compaction_mode, args.auto_compaction_retention),
    )


def version_text() -> str:
    """``shardetcd --version``: etcd's four lines, for this program."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    try:
        own = version("shardetcd")
    except PackageNotFoundError:
        own = "unknown"
    return (f"shardetcd Version: {own}\netcd API Version: {ETCD_API_VERSION}\n"
            f"Python Version: {platform.python_version()}\nOS/Arch: {sys.platform}/{platform.machine()}")


def say(line: str) -> None:
    """A long command's progress line, on standard output as it happens."""
    print(line, flush=True)


def snapshot_main(argv: list[str]) -> int:
    """shardetcd snapshot restore FILE --data-dir DIR [--shard-layout FILE]"""
    p = argparse.ArgumentParser(prog="shardetcd snapshot", description="Restore an etcd snapshot into a new data dir.")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("restore", help="make a new data dir of an etcd snapshot",
                       description="Make a new shardetcd data dir of an etcd snapshot: what `etcdctl snapshot save` "
                                   "wrote (from etcd 3.4, 3.5 or shardetcd; 3.6 writes the same buckets, untested; its "
                                   "SHA-256 is checked) or a copy of "
                                   "an etcd member's member/snap/db.  Keys, revisions, the compacted revision, leases "
                                   "and auth are kept; keys go to shards by the layout.")
    r.add_argument("file", type=Path)
    r.add_argument("--data-dir", type=Path, required=True, help="the new data dir (must not exist or be empty)")
    r.add_argument("--shard-layout", type=Path, default=None, help="the layout the server will run with (default: built-in)")
    r.add_argument("--wal-dir", type=Path, default=None,
                   help="where the journals go (must not exist; etcd's --wal-dir): start the server with the same "
                        "--wal-dir (default: in the data dir)")
    add_cluster_target(r)
    add_jetstream_target(r)
    r.add_argument("--skip-hash-check", action="store_true",
                   help="do not check the SHA-256 at the snapshot's end (a copy of member/snap/db, which has none, "
                        "is taken without this flag too)")
    # etcdutl's member flags, taken so that its restore command lines work unchanged: the name must be
    # one of --initial-cluster's, as etcdutl checks; the member's name is then the server's --name
    r.add_argument("--name", default="default", help="this member's name, one of --initial-cluster's (default: %(default)s)")
    r.add_argument("--initial-cluster", default="default=http://localhost:2380", help="as etcdutl's (checked only)")
    r.add_argument("--initial-cluster-token", default="etcd-cluster", help="as etcdutl's (not used: no Raft)")
    r.add_argument("--initial-advertise-peer-urls", default="http://localhost:2380",
                   help="as etcdutl's (not used: no Raft)")
    args = p.parse_args(argv)
    logs.setup("warn")
    if args.name not in [e.partition("=")[0] for e in args.initial_cluster.split(",")]:
        print(f'shardetcd: couldn\'t find local name "{args.name}" in the initial cluster configuration',
              file=sys.stderr)
        return 2
    jetstream = jetstream_target(r, args)
    try:
        got = restore_snapshot(args.file, args.data_dir, load_layout(args.shard_layout), args.wal_dir,
                               args.skip_hash_check, jetstream, cluster_target(args), progress=say)
    except (SnapshotError, DataDirError, LayoutError, JournalError) as exc:
        print(f"shardetcd: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"shardetcd: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    into = f"{args.data_dir.absolute()}" + (f" (journals in {args.wal_dir.absolute()})" if args.wal_dir else "") + (
        f" (journals in JetStream, prefix {args.journal_prefix})" if jetstream else "") + (
        f" (partitions {', '.join(got['partitions'])})" if got["partitions"] else "")
    print(f"restored {args.file} at revision {got['revision']} into {into}: {restored(got)}; "
          f"start it with: {start_command(args)}")
    return 0


def start_command(args: argparse.Namespace) -> str:
    """How to start a server (or cluster) on what a restore or migrate made."""
    words = ["shardetcd", "cluster", "--layout", str(args.cluster_layout)] if args.cluster_layout else ["shardetcd"]
    words += ["--data-dir", str(args.data_dir.absolute())]
    if getattr(args, "wal_dir", None):
        words += ["--wal-dir", str(args.wal_dir.absolute())]
    if args.journal_urls:
        from journal.jetstream import shown_urls

        words += ["--journal-url", shown_urls(args.journal_urls), "--journal-prefix", args.journal_prefix]
        for flag in _ACCESS_FLAGS:
            if given := getattr(args, flag[2:].replace("-", "_")):
                words += [flag, given]
    return " ".join(words)


def add_jetstream_target(p: argparse.ArgumentParser) -> None:
    """The JetStream journal a restore (or migrate) puts its checkpoints in."""
    p.add_argument("--journal-url", type=_nats_urls, default=(), dest="journal_urls",
                   help="the journals are in JetStream at these NATS URLs (the server's --journal-url): the checkpoints "
                        "go to its buckets; the streams must hold no message yet")
    p.add_argument("--journal-prefix", default=ServerConfig().journal_prefix,
                   help="with --journal-url: the server's --journal-prefix (default: %(default)s)")
    p.add_argument("--journal-replicas", type=_positive_int, default=ServerConfig().journal_replicas,
                   help="with --journal-url: replicas of the streams and buckets it makes (default: %(default)s)")
    p.add_argument("--journal-lease-ttl", type=float, default=ServerConfig().journal_lease_ttl_s,
                   dest="journal_lease_ttl",
                   help="with --journal-url: the server's --journal-lease-ttl; the restore holds the writer lease "
                        "while it uploads, so no server starts writing meanwhile (default: %(default)s)")
    add_journal_access(p)


def add_cluster_target(p: argparse.ArgumentParser, wal_dir: bool = True) -> None:
    p.add_argument("--cluster-layout", type=Path, default=None,
                   help="a `shardetcd cluster` layout: the data dir is the cluster's, each partition's keys in "
                        f"DIR/<partition>{' (and --wal-dir W/<partition>)' if wal_dir else ''}; not with --shard-layout")


def cluster_target(args: argparse.Namespace):
    """``add_cluster_target``'s ClusterLayout, or None (LayoutError when it cannot be read, or
    comes with --shard-layout)."""
    if args.cluster_layout is None:
        return None
    from shards.partition import load_cluster_layout

    if args.shard_layout is not None:
        raise LayoutError("--cluster-layout is the partitions' layout: not with --shard-layout")
    return load_cluster_layout(args.cluster_layout)


def jetstream_target(p: argparse.ArgumentParser, args: argparse.Namespace):
    """``add_jetstream_target``'s JetStreamConfig, or None (the local journal)."""
    access = journal_access(p, args)
    if not args.journal_urls:
        return None
    from journal.jetstream import JetStreamConfig

    return JetStreamConfig(urls=args.journal_urls, prefix=args.journal_prefix, replicas=args.journal_replicas,
                           lease_ttl_s=args.journal_lease_ttl, access=access)


def restored(got: dict) -> str:
    """What a restore brought in, in one line (snapshot restore, migrate)."""
    compacted = f"compacted at {got['compact_revision']}" if got["compact_revision"] >= 0 else "never compacted"
    return (f"{got['keys']} keys ({got['rows']} revisions of them), {compacted}, "
            f"{got['leases']} leases, {got['users']} users, {got['roles']} roles")


class _OneLineParser(argparse.ArgumentParser):
    """Wrong flags are one line on stderr (exit 2), not a usage block."""

    def error(self, message: str):
        self.exit(2, f"shardetcd: {self.prog}: {message} (see --help)\n")


JOURNAL_DESCRIPTION = """\
Check or repair journals.
  verify --data-dir DIR                  every segment and checkpoint of a data dir (server stopped)
  verify --journal-url URLS [--journal-prefix P] [--journal-replicas N]
                                         every JetStream stream of that prefix and its checkpoints,
                                         and on which NATS servers each is stored (with N: fewer
                                         replicas is a finding); read-only (never publishes, purges
                                         or fences): safe while a server runs
  repair --data-dir DIR                  cut a torn tail of the last segment, keeping a copy
Exit status: 0 sound (a torn tail is repairable, so sound), 1 damage found, 2 wrong flags or
nothing to check (missing dir, NATS unreachable)."""


def journal_main(argv: list[str]) -> int:
    """shardetcd journal verify|repair --data-dir DIR; shardetcd journal verify --journal-url URLS [--journal-prefix P]"""
    p = _OneLineParser(prog="shardetcd journal", description=JOURNAL_DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["verify", "repair"],
                   help="verify: report every segment or stream and every checkpoint, change nothing; "
                        "repair: cut a torn tail of local segments, keeping a copy")
    p.add_argument("--data-dir", type=Path, default=None, help="a server's data dir: its local journals")
    p.add_argument("--journal-url", type=_nats_urls, default=(), dest="journal_urls",
                   help="comma-separated nats:// URLs, as given to the server: check its JetStream journals instead")
    p.add_argument("--journal-prefix", default=None,
                   help=f"with --journal-url: the server's --journal-prefix (default: {ServerConfig().journal_prefix})")
    p.add_argument("--journal-replicas", type=_positive_int, default=None,
                   help="with --journal-url: the servers' --journal-replicas; a stream or bucket they write stored "
                        "on fewer NATS servers is reported as a finding (default: replicas are only shown)")
    add_journal_access(p)
    args = p.parse_args(argv)
    logs.setup("warn")
    access = journal_access(p, args)
    if args.journal_urls:
        if args.data_dir is not None:
            p.error("give --data-dir (a local journal) or --journal-url (JetStream), not both")
        return _jetstream_journal_command(args.command, args.journal_urls,
                                          args.journal_prefix or ServerConfig().journal_prefix, args.journal_replicas,
                                          access)
    for flag, given in (("--journal-prefix", args.journal_prefix), ("--journal-replicas", args.journal_replicas)):
        if given is not None:
            p.error(f"{flag} goes with --journal-url")
    if args.data_dir is None:
        p.error("--data-dir DIR (a local journal) or --journal-url URLS (JetStream) is required")
    if not args.data_dir.is_dir():
        print(f"shardetcd: data dir {args.data_dir} does not exist or is not a directory", file=sys.stderr)
        return 2
    shards = sorted(d for d in (args.data_dir / "shards").glob("*") if d.is_dir())
    if not shards:
        print(f"shardetcd: {args.data_dir} holds no shard journals", file=sys.stderr)
        return 2
    try:
        return _journal_command(args.command, shards, args.data_dir)
    except OSError as exc:
        print(f"shardetcd: {args.data_dir}: {exc.strerror or exc}: {exc.filename}", file=sys.stderr)
        return 2


def _jetstream_journal_command(command: str, urls: tuple[str, ...], prefix: str, replicas: int | None, access) -> int:
    from journal.errors import JournalUnreachable
    from journal.jetstream import shown_urls
    from journal.verify_jetstream import acknowledged_lines, report_lines, verify_jetstream

    if command == "repair":
        print("shardetcd: journal repair is for local segment files only: JetStream stores each message whole "
              "or not at all, so a stream has no torn tail to cut (`shardetcd journal verify --journal-url ...` "
              "reports damage)", file=sys.stderr)
        return 2
    where = f"prefix {prefix} at {shown_urls(urls)}"
    try:
        found = asyncio.run(verify_jetstream(urls, prefix, access=access))
    except JournalUnreachable as exc:
        print(f"shardetcd: {exc}", file=sys.stderr)
        return 2
    reports = found.streams
    if not reports and found.acknowledged == {}:
        print(f"shardetcd: no journal streams with {where}", file=sys.stderr)
        return 2
    ack_lines, gone = acknowledged_lines(reports, found.acknowledged, prefix, found.spans)
    for line in [*report_lines(reports), *ack_lines, *(r.line(replicas) for r in found.replicas)]:
        print(line)
    unavailable = [r.shard for r in reports if r.unavailable]
    damaged = [r.shard for r in reports if not r.sound and not r.unavailable]
    found_wrong = []
    if damaged:
        found_wrong.append(f"{len(damaged)} damaged ({', '.join(damaged)})")
    if unavailable:
        found_wrong.append(f"{len(unavailable)} unavailable, not read ({', '.join(unavailable)})")
    verdict = "; ".join(found_wrong) or "all sound"
    if found.acknowledged is None:
        verdict += "; what the writers acknowledged is unknown"
    if gone:
        verdict += "; acknowledged records are gone"
    if short := [r.stream for r in found.replicas if r.fewer_than(replicas)]:
        verdict += (f"; {len(short)} stored on fewer than {replicas} replicas, so a lost NATS server takes what only "
                    f"it holds (a writer started with --journal-replicas {replicas} moves them): {', '.join(short)}")
    print(f"summary: {len(reports)} streams, {where}: {verdict}")
    return 1 if damaged or unavailable or gone or short or found.acknowledged is None else 0


def _journal_command(command: str, shards: list[Path], data_dir: Path) -> int:
    worst = 0
    checkpoints: dict[str, int] = {}  # the newest sound checkpoint's revision, by shard
    for shard in shards:
        if command == "repair":
            try:
                repair(shard / "journal")
            except (JournalCorrupt, JournalHeadLost) as exc:
                print(f"{shard.name}: cannot repair: {exc}")
                worst = 1
        journal = shard / "journal"
        if journal.is_symlink() and not journal.is_dir():  # in a --wal-dir that is not there (a disk not mounted?)
            print(f"{shard.name}: journal: missing; {journal} links to {os.readlink(journal)}, which is not there")
            worst = 1
        elif not journal.is_dir():
            print(f"{shard.name}: no journal yet")
        for r in verify(journal):
            revs = f"revs {r.first_rev}..{r.last_rev}" if r.first_rev is not None else "empty"
            print(f"{shard.name}: {r.path.name}: {r.status}, {r.records} records, {revs}" + (f"; {r.detail}" if r.detail else ""))
            worst = max(worst, {"ok": 0, "torn tail": 0, "corrupt": 1}[r.status])
            if r.detail == "checkpoint" and r.status == "ok":
                checkpoints[shard.name] = max(checkpoints.get(shard.name, 0), r.first_rev)
    return max(worst, _acknowledged(data_dir, checkpoints))


def _acknowledged(data_dir: Path, checkpoints: dict[str, int]) -> int:
    """The writer's watermark against the journals, as a start checks it: one line when known."""
    import json

    from journal.verify import lost_revisions, runs_text
    from shards.datadir import acknowledged_on_disk
    from shards.recovery import whole_on_disk, writes_on_disk

    try:
        meta = json.loads((data_dir / "meta.json").read_text())
    except (OSError, ValueError):
        return 0
    acked = acknowledged_on_disk(data_dir, meta) if meta.get("journal", "local") == "local" else 0
    if not acked:
        return 0
    names = list(meta.get("shards", []))
    revs = [checkpoints.get(n, 0) for n in names]
    on_disk = writes_on_disk(data_dir, names)
    whole = whole_on_disk(on_disk, revs)
    if whole < acked:
        print(f"acknowledged: writes up to revision {acked} (the writer's watermark), but the journals hold every "
              f"revision only up to {whole}: acknowledged records are gone, and a start refuses this data dir")
        return 1
    if lost := lost_revisions((({r for r, _ in writes}, rev) for writes, rev in zip(on_disk, revs)), acked):
        print(f"acknowledged: writes up to revision {acked} (the writer's watermark), but revisions {runs_text(lost)} "
              "are in no journal, and no checkpoint of a journal whose records start past them reaches them: "
              "acknowledged records are gone, and a start refuses this data dir")
        return 1
    print(f"acknowledged: writes up to revision {acked} (the writer's watermark), every one in the journals")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["snapshot"]:
        return snapshot_main(argv[1:])
    if argv[:1] == ["journal"]:
        return journal_main(argv[1:])
    if argv[:1] == ["migrate"]:
        from .migrate import migrate_main

        return migrate_main(argv[1:])
    if argv[:1] == ["cluster"]:
        from .cluster import cluster_main

        return cluster_main(argv[1:])
    parser = build_parser()
    try:
        reading = normalize(argv, parser)
    except FlagError as exc:
        print(f"shardetcd: {exc} (see shardetcd --help)", file=sys.stderr)
        return exc.code
    if reading.help:
        parser.print_help()
        return 0
    if reading.version:
        print(version_text())
        return 0
    args = parser.parse_args(reading.argv)
    try:
        logs.check_logger(args.logger)
        rotate = logs.rotation(args.log_outputs, args.log_rotation_config_json) if args.enable_log_rotation else None
        logs.setup(args.log_level, args.log_outputs, rotate)
    except logs.OutputError as exc:  # etcd: "failed to verify flags", exit 1
        print(f"shardetcd: {exc}", file=sys.stderr)
        return 1
    for warning in reading.warnings:
        logger.warning("%s", warning)
    if (why := validate(reading)) is not None:  # etcd: "failed to verify flags", exit 1
        print(f"shardetcd: {why}", file=sys.stderr)
        return 1
    if (reason := refusal(reading, args.journal_urls)) is not None:
        print(f"shardetcd: refusing to start: {reason}", file=sys.stderr)
        return 1
    if unused := reading.no_effect():
        logger.info("etcd flags accepted with no effect here flags=%s", ",".join(unused))
    try:
        config = dataclasses.replace(config_from_args(args), journal_access=journal_access(parser, args))
    except ValueError as exc:  # e.g. an --auto-compaction-retention its mode cannot read
        parser.error(str(exc))

    def ready(running) -> None:
        urls = ", ".join(config.listen_client_urls)
        print(f"shardetcd serving the etcd v3 API on {urls} (data: {config.data_dir.absolute()})", flush=True)

    try:
        return run_loop(serve(config, ready), args.event_loop)
    except (StartupError, DataDirError, LayoutError, JournalGone, JournalHeadLost) as exc:
        print(f"shardetcd: {exc}", file=sys.stderr)
        return 2
    except JournalCorrupt as exc:
        print(f"shardetcd: journal corrupt, refusing to start: {exc} (see `shardetcd journal verify`)", file=sys.stderr)
        return 2
    except StoreStopped as exc:
        print(f"shardetcd: {exc}", file=sys.stderr)
        return 1
    except JournalError as exc:  # before serving: e.g. JetStream stopped answering a request the start made
        print(f"shardetcd: the journal failed while starting: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
