"""A small tmpfs mounted for one test (the tests run as root in CI), always unmounted."""
from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def mounted_tmpfs(mnt: Path, size: str) -> Iterator[Path]:
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
