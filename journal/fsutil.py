"""Small durable-file helpers. Functions look up os.* at call time so tests can monkeypatch them."""

from __future__ import annotations

import os
from pathlib import Path


PRIVATE_FILE = 0o600  # etcd's PrivateFileMode: every file of its data dir is its user's alone


def open_private(path: Path) -> int:
    """``path`` created (or truncated) for writing, readable by this user only; the fd."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    os.fchmod(fd, PRIVATE_FILE)  # one left by an earlier version with the umask's mode
    return fd


def write_private(path: Path, data: bytes, sync: bool = False) -> None:
    """``path`` holds ``data``, readable by this user only (fsync'ed with ``sync``)."""
    with os.fdopen(open_private(path), "wb") as f:
        f.write(data)
        if sync:
            f.flush()
            os.fsync(f.fileno())


def pwrite_all(fd: int, data: bytes, offset: int) -> None:
    """os.pwrite at ``offset`` until every byte is written (short writes are continued, errors propagate)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def fdatasync(fd: int) -> None:
    sync = getattr(os, "fdatasync", os.fsync)
    sync(fd)


def fsync_dir(directory: Path) -> None:
    """Make renames, creations and deletions inside `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_dir(directory: Path) -> None:
    """Create `directory` (and parents) if missing, making the new entry durable."""
    if directory.is_dir():
        return
    directory.mkdir(parents=True, exist_ok=True)
    fsync_dir(directory.parent)


def files_stamp(*paths) -> tuple:
    """What changes when any of ``paths`` is written or replaced (a renewed certificate moved into
    place, a Kubernetes secret's symlink swapped): device, inode, mtime and size of each, links
    followed. OSError when one cannot be looked at."""
    return tuple((st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size) for st in map(os.stat, paths))
