"""Snapshots in etcd's format: the whole store at one committed revision.

``Maintenance.Snapshot`` streams the store as etcd 3.5's bbolt database
(``etcd_snapshot.py`` has the buckets, ``bbolt.py`` the pages) followed by
the SHA-256 of the database, as etcd does: ``etcdctl snapshot save`` keeps
it, ``etcdutl snapshot status`` reads it, ``etcdutl snapshot restore`` makes
an etcd data dir of it.

The stream is written straight from the shards' RocksDB snapshots, taken in
one step of the event loop: a first pass over the rows learns how they fall
into pages (which fixes the meta pages and the size), a second pass sends
them.  Nothing is copied to disk, and memory stays bounded whatever the
store's size: one open page per level of each bucket's tree and one chunk
being sent (1 MiB).  The RocksDB snapshots keep that revision's rows until
the stream ends, however slowly the client reads.

``restore_snapshot`` makes a shardetcd data dir of any etcd snapshot (etcd
3.4–3.6, what ``etcdctl snapshot save`` wrote, or a copy of
``member/snap/db``): it reads and checks all of it first (hash, pages,
every row and table), writes nothing before that, routes each key's rows to
its shard by the layout, and writes each shard one checkpoint at the
snapshot's revision (the default shard's carries the leases and the auth
state).  Revisions are kept exactly.
"""
from __future__ import annotations

import asyncio
import hashlib
import heapq
import mmap
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from journal import failpoints
from journal.checkpoint import CheckpointFile, checkpoint_name
from journal.errors import JournalFailed, JournalUnreachable
from journal.jetstream import JetStreamConfig, JetStreamLog, released_key
from journal.fsutil import fsync_dir

from .auth import encode_table as encode_auth_table
from .bbolt import PAGE_SIZE, BoltError, BoltPlan, BoltReader, plan_file, write_file
from .datadir import DataDir, claim_wal_dir
from .errors import DataDirError, SnapshotError
from .etcd_snapshot import HASH_BYTES, Content, Imported, buckets, import_db
from .layout import Layout, Router, partition_layout
from .partition import ClusterLayout, PartitionRouter
from .lease import encode_lease_table
from .record import encode_extra_meta
from .shard import checkpoint_meta
from .store import acknowledged_key, layout_key
from .state import checkpoint_row

if TYPE_CHECKING:
    from .store import Store

__all__ = ["SnapshotError", "SnapshotStream", "freeze", "restore_snapshot"]


# -- save ----------------------------------------------------------------------

def freeze(store: Store) -> Content:
    """The store at its committed revision, taken in one step of the event loop."""
    rev = store.committed
    shard_rows = [shard.state.row_snapshot(rev) for shard in store.shards]

    def rows() -> Iterator[tuple[bytes, bytes]]:
        # a revision's rows may sit on several shards; row keys are unique across them
        return heapq.merge(*(r() for r in shard_rows), key=lambda row: row[0])

    return Content(revision=rev, compact_rev=store.compact_rev, finished_compact_rev=store.compacted_through,
                   term=store.term, leases=sorted(store.leases.table_at(rev).items()),
                   auth=store.auth.state, rows=rows)


class SnapshotStream:
    """The bytes of an etcd snapshot of ``content``; both methods block (run them in a thread)."""

    def __init__(self, content: Content, page_size: int = PAGE_SIZE) -> None:
        self.content = content
        self.page_size = page_size
        self._plan: BoltPlan | None = None

    def measure(self) -> int:
        """First pass: the snapshot's size in bytes, hash included."""
        self._plan = plan_file(buckets(self.content), self.page_size, txid=self.content.revision)
        return self._plan.size + HASH_BYTES

    def chunks(self, chunk_bytes: int) -> Iterator[bytes]:
        """Second pass: the database in chunks of about ``chunk_bytes``, then its SHA-256."""
        if self._plan is None:
            self.measure()
        digest = hashlib.sha256()
        pending: list[bytes] = []
        size = 0
        for page in write_file(self._plan):
            pending.append(page)
            size += len(page)
            if size >= chunk_bytes:
                chunk = b"".join(pending)
                digest.update(chunk)
                yield chunk
                pending, size = [], 0
        if pending:
            chunk = b"".join(pending)
            digest.update(chunk)
            yield chunk
        yield digest.digest()


# -- restore -------------------------------------------------------------------

def restore_snapshot(snapshot: Path, data_dir: Path, layout: Layout, wal_dir: Path | None = None,
                     skip_hash_check: bool = False, jetstream: JetStreamConfig | None = None,
                     cluster: ClusterLayout | None = None, progress: Callable[[str], None] | None = None) -> dict:
    """Make a new shardetcd ``data_dir`` of an etcd snapshot; returns what it held.

    Everything is read and checked before anything is written.  The data dir
    is built beside its final place, fsynced, and renamed into place only when
    complete, so a restore killed part-way leaves no data dir a server would
    start on.  Its meta.json records the restored revision (``floor_revision``):
    a server refuses the dir if any shard lacks a checkpoint at or above it.

    ``wal_dir`` (etcd's --wal-dir, which must not exist yet, as etcdutl wants it): the
    journals' place, made, marked as this data dir's and recorded in its meta.json, so
    the server is started with the same --wal-dir.  ``skip_hash_check``: a SHA-256 at
    the snapshot's end is not checked (a bare database, a copy of member/snap/db, is
    taken either way).

    ``jetstream``: the journals are JetStream's (the server's --journal-url and --journal-prefix):
    each shard's checkpoint goes to its stream's checkpoint bucket instead of the data dir, the
    writer's acknowledged revision becomes the restored one, and the data dir records that journal.
    The streams must hold no message yet (a new prefix, as a new data dir).

    ``cluster``: a ``shardetcd cluster`` layout instead of ``layout``: ``data_dir`` is the cluster's
    (each partition's data dir ``data_dir/<name>``, its journal ``wal_dir/<name>`` or its stream
    ``<prefix>_<name>``), and each partition gets the keys of its resources, the keys every
    partition keeps (those naming no resource), the leases of those keys (the default partition
    also the leases with no key) and the auth state, at the snapshot's
    revision: each is the etcd that kube-apiserver's --etcd-servers-overrides send those resources
    to. The dirs are built beside ``data_dir`` and renamed into place together.

    ``progress``: given a line every ``PROGRESS_S`` while the restore goes on (nothing for a
    restore shorter than that)."""
    started = time.monotonic()
    data_dir = data_dir.absolute()
    if jetstream is not None and wal_dir is not None:
        raise DataDirError("--wal-dir places a local journal: not with --journal-url (the journal is in JetStream)")
    if data_dir.exists() and (not data_dir.is_dir() or any(data_dir.iterdir())):
        raise DataDirError(f"data dir {data_dir} is not empty: restore needs a new one")
    if wal_dir is not None:
        wal_dir = wal_dir.absolute()
        if os.path.lexists(wal_dir):
            raise DataDirError(f"wal dir {wal_dir} exists: restore needs a new one")
        if wal_dir == data_dir or data_dir in wal_dir.parents:
            raise DataDirError(f"wal dir {wal_dir} is inside the data dir {data_dir}: give one outside it, "
                               "or no --wal-dir (the journals then live in the data dir)")
    view, hashed = _mapped(snapshot, skip_hash_check)
    if jetstream is not None:
        asyncio.run(_jetstream_unused(jetstream, layout.names if cluster is None else cluster.names))
    try:
        imported = import_db(BoltReader(view), Router(layout) if cluster is None else PartitionRouter(cluster))
    except (BoltError, SnapshotError) as exc:
        raise SnapshotError(f"{snapshot}: {exc}") from None
    report = None if progress is None else _Report(progress, started, imported.rows_kept)
    if report is not None:
        report.say(f"{snapshot} read and checked: {imported.rows_kept:,} rows up to revision {imported.revision}; "
                   "writing them")
    if cluster is None:
        build = _Build(data_dir, layout, imported, imported.leases, wal_dir, jetstream)
        try:
            _fill(imported, {sid: [f] for sid, f in enumerate(build.files)}, report)
            build.place(report=report)
        finally:
            build.drop()
    else:
        _build_cluster(imported, data_dir, cluster, wal_dir, jetstream, report)
    return {"revision": imported.revision, "compact_revision": imported.compact_rev,
            "keys": imported.keys_live, "rows": len(imported.route), "leases": len(imported.leases),
            "users": len(imported.auth.users), "roles": len(imported.auth.roles), "hashed": hashed,
            "partitions": [] if cluster is None else cluster.names}


def _mapped(snapshot: Path, skip_hash_check: bool = False) -> tuple[memoryview, bool]:
    """The database part of ``snapshot``, memory-mapped, and whether a SHA-256
    followed it (checked here); SnapshotError for a file that is neither an
    etcd snapshot nor a bbolt database.  The mapping goes away with the last
    view of it (readers hold slices, so it is not closed explicitly)."""
    try:
        with open(snapshot, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise SnapshotError(f"{snapshot} is empty, not an etcd snapshot")
            view = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    except OSError as exc:
        raise SnapshotError(f"{snapshot}: {exc.strerror}") from None
    hashed = _check_frame(snapshot, view, size, skip_hash_check)
    return (view[: size - HASH_BYTES] if hashed else view), hashed


def _check_frame(snapshot: Path, view: memoryview, size: int, skip_hash_check: bool = False) -> bool:
    """Whether the file is a database + SHA-256 (checked) or a bare database."""
    if size > 262 and bytes(view[257:262]) == b"ustar":
        raise SnapshotError(f"{snapshot} is a snapshot in shardetcd's former format (a tar of checkpoints); "
                            "this shardetcd restores etcd snapshots only")
    hashed = size % 512 == HASH_BYTES
    db = view[: size - HASH_BYTES] if hashed else view
    try:
        page_size = BoltReader(db).meta.page_size  # not a bbolt file, or cut inside its pages
    except BoltError as exc:
        raise SnapshotError(f"{snapshot} is not an etcd snapshot: {exc}") from None
    if hashed:
        if not skip_hash_check and hashlib.sha256(db).digest() != bytes(view[size - HASH_BYTES :]):
            raise SnapshotError(f"{snapshot}: the SHA-256 at its end does not match its content: "
                                "the file is damaged or was cut short")
    elif size % page_size:
        raise SnapshotError(f"{snapshot} was cut short or is damaged: {size} bytes are neither whole pages "
                            f"of {page_size} bytes (a copy of member/snap/db) nor whole pages followed by "
                            "a SHA-256 (etcdctl snapshot save)")
    return hashed


def partition_leases(imported: Imported, pid: int, default: bool) -> list[tuple[int, int]]:
    """The leases partition ``pid`` keeps: those attached to one of its keys or to a key every
    partition keeps, and on the default partition also those attached to no key. A lease whose
    keys are on several partitions is on each, and revokes its keys there when it expires: each
    partition is an etcd of its own."""
    kept = []
    for lease, ttl in imported.leases:
        on = imported.lease_routes.get(lease)
        if default if on is None else (pid in on or PartitionRouter.EVERY in on):
            kept.append((lease, ttl))
    return kept


def _build_cluster(imported: Imported, data_dir: Path, cluster: ClusterLayout, wal_dir: Path | None,
                   jetstream: JetStreamConfig | None, report: _Report | None) -> None:
    """Every partition's data dir, built together beside ``data_dir`` (from one pass over the
    snapshot's rows) and renamed into place at once; then the wal dirs."""
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=data_dir.parent, prefix=f".{data_dir.name}.restoring-") as building:
        new = Path(building) / "cluster"
        new.mkdir(mode=0o700)  # becomes the data dir (each partition's in it made private too)
        builds: list[_Build] = []
        try:
            for pid, p in enumerate(cluster.partitions):
                builds.append(_Build(new / p.name, partition_layout(p.name), imported,
                                     partition_leases(imported, pid, p.default),
                                     None if wal_dir is None else wal_dir / p.name, jetstream))
            files = {pid: [b.files[0]] for pid, b in enumerate(builds)}  # a partition's layout is one shard
            files[PartitionRouter.EVERY] = [b.files[0] for b in builds]  # rows every partition keeps
            _fill(imported, files, report)
            members = {p.name: b.place(make_wal=False, role=p.name, report=report)
                       for p, b in zip(cluster.partitions, builds)}
        finally:
            for b in builds:
                b.drop()
        _fsync_tree(new)
        if data_dir.exists():
            data_dir.rmdir()  # empty, checked above
        os.rename(new, data_dir)
        fsync_dir(data_dir.parent)
    if wal_dir is not None:
        for name, member_id in members.items():
            _make_wal_dir(wal_dir / name, data_dir / name, member_id)


PROGRESS_S = 2.0  # a restore's progress lines: the first after this long, then this often
PROGRESS_ROWS = 4096  # rows written between two looks at the clock


class _Report:
    """A restore's progress lines: none before ``PROGRESS_S``, then one at most every ``PROGRESS_S``."""

    def __init__(self, progress: Callable[[str], None], started: float, rows: int) -> None:
        self.progress, self.rows = progress, rows
        self.next_at = started + PROGRESS_S

    def say(self, line: str) -> None:
        if (now := time.monotonic()) >= self.next_at:
            self.next_at = now + PROGRESS_S
            self.progress(line)

    def written(self, done: int) -> None:
        self.say(f"written {done:,} of {self.rows:,} rows ({100 * done // max(self.rows, 1)} %)")


def _upload_lines(report: _Report, shard: str, size: int, prefix: str) -> Callable[[int], None]:
    """What tells ``report`` how the upload of ``shard``'s checkpoint (``size`` bytes) goes."""
    def sent(done: int) -> None:
        report.say(f"stored {done / 1e6:,.1f} of {size / 1e6:,.1f} MB of shard {shard}'s checkpoint in JetStream "
                   f"(prefix {prefix})")
    return sent


def _fill(imported: Imported, files: dict[int, list[CheckpointFile]], report: _Report | None) -> None:
    """One pass over the snapshot's key rows, each added to the checkpoints of its route."""
    for done, (route, rk, value) in enumerate(imported.routed_rows(), 1):
        row = checkpoint_row(rk, value)
        for f in files[route]:
            f.add(row)
        if report is not None and not done % PROGRESS_ROWS:
            report.written(done)


def _make_wal_dir(wal_dir: Path, data_dir: Path, member_id: int) -> None:
    wal_dir.mkdir(mode=0o700, parents=True)  # private, as etcd makes its wal dir
    claim_wal_dir(wal_dir, data_dir, member_id)
    fsync_dir(wal_dir.parent)


class _Build:
    """A data dir being built beside ``data_dir``: its meta.json, and each shard's checkpoint at the
    snapshot's revision, open (``files``) for the caller to add the shard's rows to; ``place``
    finishes them and renames the data dir into place, then makes and marks ``wal_dir``, which its
    meta.json names (a restore stopped before that leaves no wal dir: the server's first start
    makes it, as any first start with --wal-dir does). ``drop`` removes what is left, always."""

    def __init__(self, data_dir: Path, layout: Layout, imported: Imported, leases: list[tuple[int, int]],
                 wal_dir: Path | None = None, jetstream: JetStreamConfig | None = None) -> None:
        self.data_dir, self.layout, self.wal_dir, self.jetstream = data_dir, layout, wal_dir, jetstream
        self.rev = rev = imported.revision
        tables = encode_extra_meta(encode_lease_table(leases), encode_auth_table(imported.auth))
        default = len(layout.shards) - 1  # the lease and auth tables live in the default shard's checkpoints
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.building = Path(tempfile.mkdtemp(dir=data_dir.parent, prefix=f".{data_dir.name}.restoring-"))
        self.new = self.building / "data"
        self.files: list[CheckpointFile] = []
        self.datadir: DataDir | None = None
        try:
            datadir = self.datadir = DataDir.open(self.new, layout)  # meta.json with fresh ids
            self.member_id = datadir.member_id
            datadir.meta["floor_revision"] = rev
            if wal_dir is not None:
                datadir.meta["wal_dir"] = str(wal_dir)
            # the journal the checkpoints are in: a first start with another one is refused
            datadir.meta["journal"] = "local" if jetstream is None else f"nats:{jetstream.prefix}"
            datadir.save_meta()
            for sid, spec in enumerate(layout.shards):
                meta = checkpoint_meta(rev, imported.compact_rev, sid, tables if sid == default else b"")
                self.files.append(CheckpointFile(self.new / "shards" / spec.name, rev, meta))
        except BaseException:
            self.drop()
            raise

    def place(self, make_wal: bool = True, role: str = "writer", report: _Report | None = None) -> int:
        """The data dir whole and in place; its member id. ``report``: the restore's progress lines,
        told how the checkpoints' upload to JetStream goes."""
        for f in self.files:
            f.finish()
            failpoints.hit("snapshot.restore_between_shards")
        self.datadir.close()
        self.datadir = None
        if self.jetstream is not None:  # the checkpoints go to JetStream, and only there
            asyncio.run(_to_jetstream(self.jetstream, self.layout, self.new, self.rev, role, report))
        _fsync_tree(self.new)
        if self.data_dir.exists():
            self.data_dir.rmdir()  # empty, checked above
        os.rename(self.new, self.data_dir)
        fsync_dir(self.data_dir.parent)
        if self.wal_dir is not None and make_wal:
            _make_wal_dir(self.wal_dir, self.data_dir, self.member_id)
        return self.member_id

    def drop(self) -> None:
        for f in self.files:
            f.drop()
        if self.datadir is not None:
            self.datadir.close()
            self.datadir = None
        shutil.rmtree(self.building, ignore_errors=True)


async def _jetstream_unused(config: JetStreamConfig, names: list[str]) -> None:
    """Refuse journal streams that hold any message: they are another deployment's (or this
    one's, running), and a restore starts a journal anew."""
    log = await JetStreamLog(config).connect()
    try:
        await _refuse_used(log, names)
    finally:
        await log.close()


async def _refuse_used(log: JetStreamLog, names: list[str]) -> None:
    from nats.js.errors import NotFoundError

    for name in names:
        stream = log.stream_name(name)
        try:
            info = await log.retrying(f"stream {stream}", lambda: log.js.stream_info(stream))
        except NotFoundError:
            continue
        if info.state.last_seq:
            raise DataDirError(f"JetStream stream {stream} already holds a journal ({info.state.messages} "
                               f"messages): restore needs a new --journal-prefix, or that one's streams deleted")


async def _to_jetstream(config: JetStreamConfig, layout: Layout, built: Path, rev: int, role: str,
                        report: _Report | None = None) -> None:
    """Move each shard's checkpoint from the data dir being built to its stream's bucket, then
    set the writer's acknowledged revision to the restored one; all the while holding the
    writer lease of ``role`` (``writer``, or the partition's name), so that a server started on
    the prefix meanwhile does not write (a plain start is refused, a standby waits), and
    checking again, once it is held, that the streams hold nothing. Each stream's release key says
    it keeps from its first message (a hand purge is refused from the start)."""
    from journal.leadership import WriterLease

    log = await JetStreamLog(config).connect()
    lease = WriterLease(log, ttl_s=config.lease_ttl_s, key=role)
    try:
        deadline = asyncio.get_running_loop().time() + lease.ttl_s + 1.0  # a lease left by a killed restore lapses
        while not await lease.try_acquire():
            if asyncio.get_running_loop().time() > deadline:
                raise DataDirError(f"a shardetcd ({await lease.holder()}) holds the writer lease {role} of "
                                   f"{config.prefix}: a restore needs the journal unused (stop it, or restore "
                                   "under a new --journal-prefix)")
            await asyncio.sleep(0.2)
        lease.start_renewing()
        await _refuse_used(log, layout.names)
        for spec in layout.shards:
            shard_dir = built / "shards" / spec.name
            path = shard_dir / checkpoint_name(rev)
            journal = await log.open_journal(spec.name, shard_dir / "upload", follow=True)  # made if missing
            sent = None if report is None else _upload_lines(report, spec.name, path.stat().st_size, config.prefix)
            await journal.store_checkpoint(path, rev, only=True, sent=sent)
            path.unlink()
            failpoints.hit("snapshot.restore_between_uploads")
            await failpoints.pause("snapshot.restore_between_uploads")
        try:
            await lease.confirm(lease.ttl_s)  # held all along: no server started writing meanwhile
        except (JournalFailed, JournalUnreachable) as exc:
            raise DataDirError(f"the writer lease {role} of {config.prefix} was not held throughout the restore "
                               f"({exc}): try again (the streams are checked again first)") from None
        await _refuse_used(log, layout.names)
        for name in layout.names:  # each stream keeps from its first message: over a key an earlier deployment left,
            await log.put_meta(released_key(log.stream_name(name)), "1")  # so a hand purge is refused from the start
        await log.put_meta(layout_key(layout), layout.describe())  # a prefix's earlier journals may have had another
        await log.put_meta(acknowledged_key(layout), str(rev))
    finally:
        await lease.release()
        await log.close()


def _fsync_tree(root: Path) -> None:
    """fsync every file, then every directory bottom-up, under ``root``."""
    for dirpath, _, files in os.walk(root, topdown=False):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))
