"""Segment files: naming, listing and the per-segment summary kept in memory.

A journal is a directory of segment files named `{seq:016x}-{firstrev:016x}.wal`.
`seq` is the segment index (contiguous, increasing); `firstrev` is the revision
tag of the first record written to the segment when it was created. Readers
use the name only for ordering; revisions are always taken from the frames.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from journal.fsutil import fsync_dir

SEGMENT_SUFFIX = ".wal"
RELEASED_FILE = "released"  # the first segment the writer kept at its last release, in decimal
_NAME = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{16})\.wal$")


@dataclass(unsafe_hash=True)  # immutable by convention: a frozen dataclass's __init__ costs ~1.4 µs more
class SegmentInfo:
    """What is known about one segment: its valid length and the revisions it holds."""

    path: Path
    seq: int
    size: int = 0
    count: int = 0
    first_rev: int | None = None
    last_rev: int | None = None

    def with_record(self, rev: int, frame_bytes: int) -> SegmentInfo:
        first = self.first_rev if self.count else rev  # not dataclasses.replace: ~4x its speed
        return SegmentInfo(self.path, self.seq, self.size + frame_bytes, self.count + 1, first, rev)

    def covered_by(self, rev: int) -> bool:
        """True when every record in the segment has a revision tag <= rev."""
        return self.last_rev is None or self.last_rev <= rev


def segment_name(seq: int, first_rev: int) -> str:
    return f"{seq:016x}-{first_rev:016x}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> tuple[int, int] | None:
    """(seq, firstrev) for a segment file name, None for any other file."""
    match = _NAME.match(name)
    if match is None:
        return None
    return int(match.group(1), 16), int(match.group(2), 16)


def list_segments(directory: Path) -> list[tuple[int, Path]]:
    """(seq, path) of every segment file in `directory`, ordered by seq."""
    found = []
    for path in directory.iterdir():
        parsed = parse_segment_name(path.name)
        if parsed is not None and path.is_file():
            found.append((parsed[0], path))
    return sorted(found)


def write_released(directory: Path, first_kept: int) -> None:
    """Before a release deletes the segments before ``first_kept``: that number, durable before any
    of them goes (``head_lost`` holds a journal to it)."""
    tmp = directory / (RELEASED_FILE + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, b"%d\n" % first_kept)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, directory / RELEASED_FILE)
    fsync_dir(directory)


def head_lost(directory: Path, listed: list[tuple[int, Path]]) -> str | None:
    """Why the journal in ``directory``, whose segments were ``listed`` before this reads its release
    marker, starts past the first segment its writer kept at its last release; None when it does
    not, or no release was recorded (a journal never released, or released before the marker)."""
    try:
        kept = int((directory / RELEASED_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return None
    first = listed[0][0] if listed else None
    if first is not None and first <= kept:
        return None
    gone = f"segments {kept}..{first - 1} are" if first is not None else f"every segment from {kept} on is"
    return (f"{gone} missing, but its writer released only the segments before {kept} "
            f"({directory / RELEASED_FILE}): their records were removed by something else (deleted by hand?)")
