"""``shardetcd migrate``: a live etcd's data into a new shardetcd data dir, revisions kept.

    shardetcd migrate --from https://etcd-0:2379 --cacert ca.crt --cert client.crt --key client.key \\
        --data-dir /var/lib/shardetcd

Takes a snapshot over the live etcd's Maintenance API (what ``etcdctl
snapshot save`` does), checks the SHA-256 etcd appends to it, and restores it
(``shardetcd snapshot restore``): the same keys, revisions, compacted
revision, leases and auth.  The snapshot is a point in time: stop the writers
(kube-apiserver) first, or whatever they write afterwards stays behind.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import grpc

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from shards.errors import DataDirError, LayoutError
from shards.layout import load_layout
from journal.errors import JournalError
from shards.snapshot import SnapshotError, restore_snapshot

from .cli import add_cluster_target, add_jetstream_target, cluster_target, jetstream_target, say

PROGRESS_S = 2.0


class MigrateError(RuntimeError):
    """Why a migration cannot go on, in one line."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="shardetcd migrate",
        description="Copy a live etcd (3.4 or 3.5; 3.6's snapshot has the same buckets, untested) into a new shardetcd data dir: a snapshot over its "
                    "Maintenance API, hash-checked, restored with every revision, the compaction, leases and auth.")
    p.add_argument("--from", dest="source", required=True,
                   help="the etcd client URL(s), comma-separated, e.g. https://etcd-0:2379 (the first that answers)")
    p.add_argument("--data-dir", type=Path, required=True, help="the new data dir (must not exist or be empty)")
    p.add_argument("--shard-layout", type=Path, default=None, help="the layout the server will run with (default: built-in)")
    p.add_argument("--cacert", type=Path, default=None, help="verify the etcd's certificate with this CA bundle")
    p.add_argument("--cert", type=Path, default=None, help="client certificate (etcd's --client-cert-auth)")
    p.add_argument("--key", type=Path, default=None, help="client certificate's key")
    p.add_argument("--user", default=None, help="user:password, when etcd has auth enabled (root or a user with its role)")
    p.add_argument("--dial-timeout", type=float, default=10.0, help="seconds to wait for a connection (default: %(default)s)")
    add_jetstream_target(p)
    add_cluster_target(p, wal_dir=False)  # migrate has no --wal-dir
    return p


def _read(path: Path | None) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        raise MigrateError(f"cannot read {path}: {exc.strerror}") from None


def _channel(url: str, args) -> tuple[grpc.Channel, str]:
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise MigrateError(f"--from {url!r}: want http://HOST:PORT or https://HOST:PORT")
    target = f"{parts.hostname}:{parts.port or 2379}"
    if parts.scheme == "http":
        return grpc.insecure_channel(target), target
    creds = grpc.ssl_channel_credentials(_read(args.cacert), _read(args.key), _read(args.cert))
    return grpc.secure_channel(target, creds), target


def _metadata(ch: grpc.Channel, user: str | None) -> tuple:
    if not user:
        return ()
    name, sep, password = user.partition(":")
    if not sep:
        raise MigrateError("--user wants user:password")
    try:
        token = pbg.AuthStub(ch).Authenticate(pb.AuthenticateRequest(name=name, password=password), timeout=30).token
    except grpc.RpcError as exc:
        raise MigrateError(f"authentication as {name} failed: {exc.details()}") from None
    return (("token", token),)


def download(args, out) -> tuple[str, int]:
    """Stream a snapshot of the first etcd that answers into ``out``; (its address, bytes)."""
    errors = []
    for url in args.source.split(","):
        ch, target = _channel(url.strip(), args)
        with ch:
            try:
                grpc.channel_ready_future(ch).result(timeout=args.dial_timeout)
            except grpc.FutureTimeoutError:
                errors.append(f"{target}: no answer within {args.dial_timeout:g} s")
                continue
            try:
                return target, _stream(ch, _metadata(ch, args.user), target, out)
            except grpc.RpcError as exc:
                raise MigrateError(f"snapshot from {target} failed: {exc.code().name}: {exc.details()}") from None
    raise MigrateError(f"cannot reach etcd at {args.source}: {'; '.join(errors)}")


def _stream(ch: grpc.Channel, metadata: tuple, target: str, out) -> int:
    got, shown = 0, time.monotonic()
    for resp in pbg.MaintenanceStub(ch).Snapshot(pb.SnapshotRequest(), metadata=metadata):
        out.write(resp.blob)
        got += len(resp.blob)
        if time.monotonic() - shown >= PROGRESS_S:
            shown = time.monotonic()
            print(f"receiving snapshot from {target}: {got:,} bytes, {resp.remaining_bytes:,} to go", flush=True)
    return got


def check_hash(path: Path) -> None:
    """etcd streams its database then the SHA-256 of it; a snapshot that does not match is refused."""
    size = path.stat().st_size
    if size < 32 + 4096:
        raise MigrateError(f"the snapshot received is {size} bytes: too short for an etcd database")
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        left = size - 32
        while left:
            chunk = f.read(min(left, 1 << 20))
            digest.update(chunk)
            left -= len(chunk)
        if digest.digest() != f.read(32):
            raise MigrateError("the snapshot received does not match the SHA-256 etcd sent after it")


def migrate_main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    jetstream = jetstream_target(parser, args)
    data_dir = args.data_dir.absolute()
    started = time.monotonic()
    try:
        layout = load_layout(args.shard_layout)
        if data_dir.exists() and (not data_dir.is_dir() or any(data_dir.iterdir())):
            raise DataDirError(f"data dir {data_dir} is not empty: migrate needs a new one")
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=data_dir.parent, prefix=f".{data_dir.name}.migrate-", suffix=".db") as tmp:
            target, size = download(args, tmp)
            tmp.flush()
            os.fsync(tmp.fileno())
            check_hash(Path(tmp.name))
            print(f"snapshot from {target}: {size:,} bytes, SHA-256 checked; restoring", flush=True)
            got = restore_snapshot(Path(tmp.name), data_dir, layout, jetstream=jetstream,
                                   cluster=cluster_target(args), progress=say)
    except (MigrateError, SnapshotError, DataDirError, LayoutError, JournalError) as exc:
        print(f"shardetcd migrate: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"shardetcd migrate: {exc.filename or data_dir}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    from .cli import restored, start_command

    print(f"migrated {target} at revision {got['revision']} into {data_dir} in {time.monotonic() - started:.1f} s: "
          f"{restored(got)}; start it with: {start_command(args)}")
    return 0
