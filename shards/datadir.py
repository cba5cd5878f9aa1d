"""The data directory: format marker, identity, lock, and where shards live.

    <data-dir>/
      meta.json                      format, layout fingerprint, ids, start count
      LOCK                           flock()ed while a server uses the dir
    <state-dir>/LOCK                 flock()ed too: a second server must not wipe the first's RocksDB
      shards/<name>/journal/*.wal    the shard's journal segments; with --wal-dir W, ``journal`` is a
                                     symbolic link to W/<name> (W recorded in meta.json; W/LOCK
                                     flock()ed, W/DATA_DIR names the data dir W belongs to)
      shards/<name>/checkpoint-*.ckpt
      tmp/                           scratch, emptied at every start (snapshots are streamed without
                                     it now; the former format was written here first)
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import stat
import secrets
import shutil
import tempfile
from pathlib import Path

from journal.fsutil import PRIVATE_FILE, fsync_dir, write_private
from journal.watermark import FILE_NAME as WATERMARK_FILE, acknowledged_revision

from .errors import DataDirError
from .layout import Layout

FORMAT = 1
WAL_OWNER = "DATA_DIR"  # in a --wal-dir: which data dir its journals belong to

logger = logging.getLogger(__name__)


class DataDir:
    def __init__(self, path: Path, meta: dict, lock_fd: int, wal: tuple[Path, int] | None = None) -> None:
        self.path = path
        self.meta = meta
        self._lock_fd = lock_fd
        self._wal = wal  # (--wal-dir, its LOCK's fd) when the journals live there
        self._default_state_base: Path | None = None  # set when state lives in the default place
        self._state_lock: tuple[Path, int] | None = None

    @property
    def cluster_id(self) -> int:
        return self.meta["cluster_id"]

    def adopt_cluster_id(self, cluster_id: int) -> None:
        """The cluster's id is the one its journals were first written under (a
        replicated journal keeps it, so every machine that takes over agrees)."""
        if self.meta["cluster_id"] != cluster_id:
            logger.info("cluster id taken from the journal cluster_id=%x was=%x", cluster_id, self.meta["cluster_id"])
            self.meta["cluster_id"] = cluster_id
            self.save_meta()

    @property
    def member_id(self) -> int:
        return self.meta["member_id"]

    @property
    def term(self) -> int:
        """Like etcd's raft term on a single member: 2 on first start, +1 per restart."""
        return self.meta["starts"] + 1

    @classmethod
    def open(cls, path: Path, layout: Layout, wal_dir: Path | None = None) -> DataDir:
        """Open (or create) the data dir and lock it. ``wal_dir``: the local journals' place
        (etcd's --wal-dir), recorded at the first start and required to stay the same."""
        path = path.absolute()
        try:
            if path.is_dir():
                _check_private(path)
            else:
                private_dirs(path)
            if not (path / "meta.json").exists():
                if (path / "member" / "snap" / "db").is_file():  # etcd's own data dir (a swapped manifest)
                    raise DataDirError(
                        f"data dir {path} is not empty and holds an etcd member, not shardetcd data: bring its "
                        f"keys over into a new dir with `shardetcd migrate --from <etcd URL> --data-dir NEW` while "
                        f"that etcd runs, or `shardetcd snapshot restore {path / 'member' / 'snap' / 'db'} "
                        "--data-dir NEW` once it has stopped cleanly")
                if any(p.name not in ("LOCK", "shards", "tmp") for p in path.iterdir()):
                    raise DataDirError(f"data dir {path} is not empty and holds no shardetcd data")
                if (path / "shards").is_dir() and any((path / "shards").iterdir()):
                    raise DataDirError(f"data dir {path} holds shard data but no meta.json: an interrupted "
                                       "restore or a damaged dir (restore into a new dir)")
        except OSError as exc:
            raise DataDirError(f"data dir {path} is not writable: {exc.strerror}") from None
        lock_fd = _lock(path, "data dir")
        wal = None
        try:
            meta = _load_or_create_meta(path, layout)
            if wal_dir is not None or "wal_dir" in meta:
                wal = _open_wal_dir(path, meta, layout, wal_dir)
            _write_atomic(path / "meta.json", json.dumps(meta, indent=1).encode())
            _empty_scratch(path / "tmp")
        except BaseException:
            if wal is not None:
                os.close(wal[1])
            os.close(lock_fd)
            raise
        return cls(path, meta, lock_fd, wal)

    def check_journal(self, name: str) -> None:
        """The journal backend must be the one this dir was started with ("local"
        before it was recorded); the first start records it."""
        had = self.meta.get("journal", "local" if self.meta["starts"] > 1 else None)
        if had is None:
            self.meta["journal"] = name
            self.save_meta()
        elif had != name:
            how = (" (a snapshot restores into JetStream with `shardetcd snapshot restore FILE --data-dir NEW "
                   "--journal-url URLS`)" if name.startswith("nats:") and "floor_revision" in self.meta else "")
            raise DataDirError(f"data dir {self.path} keeps its journal in {had}, not {name}: "
                               f"a data dir cannot change journal backends{how}")

    def save_meta(self) -> None:
        _write_atomic(self.path / "meta.json", json.dumps(self.meta, indent=1).encode())

    def shard_dir(self, name: str) -> Path:
        shards = self.path / "shards"
        private_dirs(shards)
        if mode_bits(shards) != PRIVATE_DIR:
            shards.chmod(PRIVATE_DIR)  # an earlier shardetcd's: the journals are the keyspace
        d = shards / name
        d.mkdir(exist_ok=True)
        if self._wal is not None:
            _link_journal(d / "journal", self._wal[0] / name)
        return d

    def state_dir(self, base: Path | None, name: str) -> Path:
        if base is None:
            root = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
            tag = hashlib.sha256(str(self.path).encode()).hexdigest()[:12]
            base = self._default_state_base = root / f"shardetcd-{os.getuid()}-{tag}"
        if self._state_lock is None:
            self._state_lock = (base, _lock_state_base(base))
        return base / name

    def close(self) -> None:
        """Release the locks; remove the default state base dir once the shards emptied it."""
        if self._state_lock is not None:
            base, fd = self._state_lock
            if base == self._default_state_base:
                (base / "LOCK").unlink(missing_ok=True)
            os.close(fd)
            self._state_lock = None
        if self._default_state_base is not None:
            try:
                self._default_state_base.rmdir()
            except OSError:  # not empty (a shard still open elsewhere) or already gone
                pass
        if self._wal is not None:
            os.close(self._wal[1])
            self._wal = None
        os.close(self._lock_fd)


def acknowledged_on_disk(path: Path, meta: dict) -> int:
    """The revision up to which the last writer of the data dir at ``path`` (``meta``: its meta.json)
    acknowledged writes (its watermark), when its journal policy synced them (meta.json keeps the
    policy of the last start: with fsync off an OS crash may lose acknowledged writes by design);
    0 when unknown."""
    if meta.get("journal_fsync", "off") == "off":
        return 0
    return acknowledged_revision(path / WATERMARK_FILE, meta.get("member_id"))


def _open_wal_dir(path: Path, meta: dict, layout: Layout, wal_dir: Path | None) -> tuple[Path, int]:
    """Check ``wal_dir`` against what the data dir recorded (recording it on its first use), lock it
    and check it is this data dir's (``WAL_OWNER``); the journals are linked in by ``shard_dir``."""
    had = meta.get("wal_dir")
    want = str(wal_dir.absolute()) if wal_dir is not None else None
    if had is not None and had != want:
        given = f"--wal-dir {want}" if want else "no --wal-dir"
        raise DataDirError(f"data dir {path} keeps its journal in {had} (its --wal-dir), but this start has {given}: "
                           f"give --wal-dir {had}")
    if had is None:
        kept = [n for n in layout.names if os.path.lexists(path / "shards" / n / "journal")]
        if kept:
            raise DataDirError(
                f"data dir {path} keeps its journal in itself (shards {', '.join(kept)}), so --wal-dir {want} "
                "cannot be taken up: start without it, or move the keys into a new data dir that starts with it "
                "(`etcdctl snapshot save`, then `shardetcd snapshot restore FILE --data-dir NEW`)")
        meta["wal_dir"] = want
    wal = Path(meta["wal_dir"])
    try:
        wal.mkdir(mode=0o700, parents=True, exist_ok=True)  # etcd makes its wal dir private too
    except OSError as exc:
        raise DataDirError(f"wal dir {wal} is not writable: {exc.strerror}") from None
    fd = _lock(wal, "wal dir")
    try:
        _claim(wal, path, meta["member_id"])
    except BaseException:
        os.close(fd)
        raise
    return wal, fd


def _claim(wal: Path, path: Path, member_id: int) -> None:
    """A wal dir holds one data dir's journals: the first start marks it with the data dir's member id,
    and a wal dir marked by another data dir, or holding anything unmarked, is refused."""
    owner = wal / WAL_OWNER
    try:
        others = sorted(p.name for p in wal.iterdir() if p.name not in ("LOCK", WAL_OWNER, WAL_OWNER + ".tmp"))
        if owner.exists():
            mark = json.loads(owner.read_text())
            if mark.get("member_id") == member_id:
                return
            if others:  # (a mark alone: a first start that stopped before its data dir was written)
                raise DataDirError(f"wal dir {wal} holds the journal of another data dir ({mark.get('data_dir')}): "
                                   "give an empty --wal-dir")
        elif others:
            raise DataDirError(f"wal dir {wal} is not empty ({', '.join(others[:3])}) and is not this data dir's: "
                               "give an empty --wal-dir")
        claim_wal_dir(wal, path, member_id)
    except (OSError, ValueError) as exc:
        raise DataDirError(f"wal dir {wal}: {getattr(exc, 'strerror', None) or exc}") from None


def claim_wal_dir(wal: Path, path: Path, member_id: int) -> None:
    """Mark ``wal`` as the journals' place of the data dir at ``path`` (its member id decides)."""
    _write_atomic(wal / WAL_OWNER, json.dumps({"data_dir": str(path), "member_id": member_id}, indent=1).encode())


def _link_journal(link: Path, target: Path) -> None:
    """``link`` (a shard's journal) is a symbolic link to ``target`` in the wal dir, made here the first
    time; a target that is gone (a disk not mounted) is refused, never replaced by an empty journal."""
    if link.is_symlink():
        if os.readlink(link) != str(target):
            raise DataDirError(f"{link} links to {os.readlink(link)}, not to {target} in the wal dir")
        if not target.is_dir():
            raise DataDirError(f"the journal {link} links to {target}, which is missing: is the wal dir's disk "
                               "mounted? (refusing to start: the acknowledged writes are in that journal)")
        return
    if os.path.lexists(link):
        raise DataDirError(f"{link} is a journal inside the data dir, but the data dir's journals are in the wal dir")
    try:
        target.mkdir(mode=0o700, exist_ok=True)
        fsync_dir(target.parent)
        os.symlink(target, link)
        fsync_dir(link.parent)
    except OSError as exc:
        raise DataDirError(f"cannot place the journal of {link.parent.name} in {target}: {exc.strerror}") from None


def _empty_scratch(tmp: Path) -> None:
    """Remove what a process killed mid-snapshot left in the scratch dir (we hold the lock)."""
    if not tmp.is_dir():
        return
    left = list(tmp.iterdir())
    if not left:
        return
    size = sum(f.stat().st_size for p in left for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file())
    for p in left:
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()
    logger.warning("removed leftovers of an interrupted snapshot dir=%s entries=%d bytes=%d", tmp, len(left), size)


def _lock_state_base(base: Path) -> int:
    """flock ``base``/LOCK before any shard clears its state dir under it (made private when new:
    the shards' RocksDB states hold every value; each is private in any case, state.open_rocks)."""
    try:
        private_dirs(base)
    except OSError as exc:
        raise DataDirError(f"state dir {base} is not writable: {exc.strerror}") from None
    return _lock(base, "state dir")


PRIVATE_DIR = 0o700  # etcd's PrivateDirMode: its data dir and member dir are its user's alone


def mode_bits(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def private_dirs(path: Path) -> None:
    """Make ``path`` and each missing parent readable by this user only, as etcd's TouchDirAll
    makes its data dir (the keyspace holds every Kubernetes Secret)."""
    missing = []
    while not path.is_dir():
        missing.append(path)
        path = path.parent
    for d in reversed(missing):
        d.mkdir(mode=PRIVATE_DIR, exist_ok=True)


def _check_private(path: Path) -> None:
    """etcd's warning, word for word, for a data dir others may read (it is used as it is)."""
    mode = path.stat().st_mode
    if stat.S_IMODE(mode) != PRIVATE_DIR:
        logger.warning('check file permission error=directory "%s" exist, but the permission is "%s". The '
                       'recommended permission is "-rwx------" to prevent possible unprivileged access to the data',
                       path, stat.filemode(mode))


def _lock(directory: Path, what: str) -> int:
    """flock ``directory``/LOCK for as long as this process runs; the held fd."""
    try:
        fd = os.open(directory / "LOCK", os.O_RDWR | os.O_CREAT, PRIVATE_FILE)
    except OSError as exc:
        raise DataDirError(f"{what} {directory} is not writable: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise DataDirError(f"{what} {directory} is in use by another shardetcd process") from None
    return fd


def _load_or_create_meta(path: Path, layout: Layout) -> dict:
    meta_path = path / "meta.json"
    if meta_path.exists():
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError) as exc:
            raise DataDirError(f"data dir {path}: meta.json is unreadable: {exc}") from None
        if meta.get("format") != FORMAT:
            raise DataDirError(
                f"data dir {path} was written by an incompatible version (format {meta.get('format')!r}; "
                f"this shardetcd reads format {FORMAT})"
            )
        if meta.get("layout") != layout.fingerprint():
            raise DataDirError(
                f"data dir {path} was created with shard layout {meta.get('shards')}, "
                f"not {layout.names}: moving keys between shards is not supported"
            )
        meta["starts"] += 1
    else:
        meta = {
            "format": FORMAT,
            "layout": layout.fingerprint(),
            "shards": layout.names,
            "cluster_id": secrets.randbits(63) or 1,
            "member_id": secrets.randbits(63) or 1,
            "starts": 1,
        }
    return meta


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    write_private(tmp, data, sync=True)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
