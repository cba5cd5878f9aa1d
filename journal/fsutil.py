"""Small durable-file helpers. Functions look up os.* at call time so tests can monkeypatch them."""

from __future__ import annotations

import os
from pathlib import Path


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
