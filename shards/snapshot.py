"""Snapshots: the whole store at one committed revision, as one file.

A snapshot is a tar archive followed by the SHA-256 of the archive (32
bytes), like etcd's (a 512-byte-aligned body + its SHA-256, which
``etcdctl snapshot save`` checks)::

    meta.json                             format, revision, compact revision, layout
    shards/<name>/checkpoint-<rev>.ckpt   each shard's checkpoint at that revision

The checkpoint files are the journal's own CRC-framed checkpoints, so a
snapshot checks itself; restoring one lays them into a new data dir, whose
server recovers from them exactly as from its own checkpoints.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from journal import failpoints, load_latest_checkpoint, write_checkpoint
from journal.fsutil import fsync_dir

from .datadir import DataDir
from .errors import DataDirError
from .layout import Layout

if TYPE_CHECKING:
    from .store import Store

SNAPSHOT_FORMAT = 1


class SnapshotError(ValueError):
    """A snapshot file that cannot be restored."""


def freeze(store: Store):
    """Everything a snapshot needs, taken in one step of the event loop."""
    rev, compact = store.committed, store.compact_rev
    sources = []
    for shard in store.shards:
        sources.append((shard.name, *shard.checkpoint_source(rev, compact, store.checkpoint_extra(shard, rev))))
    meta = {"format": SNAPSHOT_FORMAT, "revision": rev, "compact_revision": compact,
            "layout": store.config.layout.fingerprint(), "shards": store.config.layout.names}
    return meta, sources


def write_snapshot(meta: dict, sources, out: Path) -> Path:
    """Write the frozen store into the tar file ``out`` (blocking; run in a thread)."""
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        root = Path(tmp)
        (root / "meta.json").write_text(json.dumps(meta))
        for name, ckpt_meta, rows in sources:
            write_checkpoint(root / "shards" / name, meta["revision"], ckpt_meta, rows)
        with tarfile.open(out, "w") as tar:
            tar.add(root / "meta.json", arcname="meta.json")
            tar.add(root / "shards", arcname="shards")
    with open(out, "r+b") as f:
        digest = _sha256(f)
        f.seek(0, 2)
        f.write(digest)
    return out


def _sha256(f, end: int | None = None) -> bytes:
    h = hashlib.sha256()
    f.seek(0)
    left = end
    while chunk := f.read(1 << 20 if left is None else min(1 << 20, left)):
        h.update(chunk)
        if left is not None:
            left -= len(chunk)
    return h.digest()


def _verify(snapshot: Path) -> None:
    try:
        size = snapshot.stat().st_size
        with open(snapshot, "rb") as f:
            ok = size % 512 == 32 and _sha256(f, size - 32) == (f.seek(size - 32), f.read(32))[1]
    except OSError as exc:
        raise SnapshotError(f"{snapshot}: {exc.strerror}") from None
    if not ok:
        raise SnapshotError(f"{snapshot} is not a shardetcd snapshot (its SHA-256 trailer does not match)")


def restore_snapshot(snapshot: Path, data_dir: Path, layout: Layout) -> dict:
    """Lay ``snapshot`` into a new ``data_dir``; return the snapshot's meta.

    The data dir is built beside its final place, fsynced, and renamed into
    place only when complete, so a restore killed part-way leaves no data dir
    a server would start on.  Its meta.json records the restored revision
    (``floor_revision``): a server refuses the dir if any shard lacks a
    checkpoint at or above it."""
    data_dir = data_dir.absolute()
    if data_dir.exists() and (not data_dir.is_dir() or any(data_dir.iterdir())):
        raise DataDirError(f"data dir {data_dir} is not empty: restore needs a new one")
    _verify(snapshot)
    try:
        tar = tarfile.open(snapshot, "r")
    except (OSError, tarfile.TarError) as exc:
        raise SnapshotError(f"{snapshot} is not a shardetcd snapshot: {exc}") from None
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    with tar, tempfile.TemporaryDirectory() as tmp, \
            tempfile.TemporaryDirectory(dir=data_dir.parent, prefix=f".{data_dir.name}.restoring-") as building:
        tar.extractall(tmp, filter="data")
        meta = _check_meta(Path(tmp), layout, snapshot)
        new = Path(building) / "data"
        datadir = DataDir.open(new, layout)  # meta.json with fresh ids
        datadir.meta["floor_revision"] = meta["revision"]
        datadir.save_meta()
        for name in meta["shards"]:
            src = Path(tmp) / "shards" / name
            ckpt = load_latest_checkpoint(src)
            if ckpt is None or ckpt.rev != meta["revision"]:
                raise SnapshotError(f"{snapshot}: checkpoint of shard {name!r} is missing or damaged")
            sum(1 for _ in ckpt.rows())  # verify every frame before using it
            shutil.copytree(src, new / "shards" / name)
            failpoints.hit("snapshot.restore_between_shards")
        datadir.close()
        _fsync_tree(new)
        if data_dir.exists():
            data_dir.rmdir()  # empty, checked above
        os.rename(new, data_dir)
        fsync_dir(data_dir.parent)
    return meta


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


def _check_meta(root: Path, layout: Layout, snapshot: Path) -> dict:
    try:
        meta = json.loads((root / "meta.json").read_text())
    except (OSError, ValueError):
        raise SnapshotError(f"{snapshot} has no readable meta.json") from None
    if meta.get("format") != SNAPSHOT_FORMAT:
        raise SnapshotError(f"{snapshot} has snapshot format {meta.get('format')!r}; this shardetcd reads {SNAPSHOT_FORMAT}")
    if meta.get("layout") != layout.fingerprint():
        raise SnapshotError(f"{snapshot} was taken with shard layout {meta.get('shards')}, not {layout.names}")
    return meta
