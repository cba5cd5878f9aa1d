"""Offline checks of a journal directory: what each segment and checkpoint holds.

``verify`` never changes a file.  ``repair`` is what opening a journal does
anyway: cut a torn tail of the last segment (keeping a ``.broken-<offset>``
copy); corruption anywhere else is reported, never "repaired".
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Collection, Iterable

from journal.checkpoint import _list_checkpoints, _load
from journal.config import CheckpointConfig, JournalConfig
from journal.errors import JournalCorrupt
from journal.reader import corrupt_unless_torn
from journal.recovery import recover, scan_segment, sequence_gaps
from journal.segment import head_lost, list_segments


@dataclass(frozen=True)
class FileReport:
    path: Path
    status: str  # "ok", "torn tail" (repairable), "corrupt"
    records: int = 0
    first_rev: int | None = None
    last_rev: int | None = None
    detail: str = ""


def verify(directory: Path, config: JournalConfig = JournalConfig()) -> list[FileReport]:
    reports = []
    listed = list_segments(directory) if directory.is_dir() else []  # a restored shard has no journal yet
    prev_rev = 0
    gaps = sequence_gaps(listed)  # start-up refuses these
    for index, (seq, path) in enumerate(listed):
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            try:
                info, bad = scan_segment(f, path, seq, size, prev_rev, config)
            except JournalCorrupt as exc:
                reports.append(FileReport(path, "corrupt", detail=str(exc)))
                continue
            status, detail = "ok", ""
            if bad is not None:
                later = corrupt_unless_torn(f, bad.offset, size, config.record_bytes_max)
                if index == len(listed) - 1 and later is None:
                    status = "torn tail"
                    detail = f"{size - bad.offset} bytes from offset {bad.offset} ({bad.reason}); `journal repair` cuts them"
                else:
                    status, detail = "corrupt", f"offset {bad.offset}: {bad.reason}"
        if path in gaps:
            status, detail = "corrupt", "; ".join(filter(None, (gaps[path], detail)))
        prev_rev = info.last_rev or prev_rev
        reports.append(FileReport(path, status, info.count, info.first_rev, info.last_rev, detail))
    if listed and (why := head_lost(directory, listed)) is not None:  # (no segment: a restored shard's)
        reports.append(FileReport(directory, "corrupt", detail=f"{why}: start-up refuses this shard"))
    checkpoints = verify_checkpoints(directory.parent)
    if listed and listed[0][0] > 0 and not any(r.status == "ok" for r in checkpoints):
        reports.append(FileReport(directory, "corrupt", detail=(
            f"the records before segment {listed[0][0]} were released up to a checkpoint, and no sound checkpoint "
            "is left: start-up refuses this shard (restore from a snapshot)")))
    return reports + checkpoints


def verify_checkpoints(directory: Path, config: CheckpointConfig = CheckpointConfig()) -> list[FileReport]:
    reports = []
    for rev, path in _list_checkpoints(directory):
        try:
            rows = sum(1 for _ in _load(path, rev, config).rows())
            reports.append(FileReport(path, "ok", rows, rev, rev, "checkpoint"))
        except JournalCorrupt as exc:
            reports.append(FileReport(path, "corrupt", detail=str(exc)))
    return reports


def repair(directory: Path, config: JournalConfig = JournalConfig()) -> None:
    """Cut a torn tail (raises JournalCorrupt for anything else); no journal, nothing to do."""
    if directory.is_dir():
        recover(directory, config)


def lost_revisions(shards: Iterable[tuple[Collection[int], int]], upto: int) -> list[int]:
    """Revisions 2..``upto`` of one revision space that no journal holds and no checkpoint can; per
    shard of it: (the revisions of the write records its journal holds, its newest checkpoint's
    revision, 0 for none). Each revision a writer makes is a write record in the journal of every
    shard it writes, so one in no journal was either released from one (records are released up to
    a checkpoint) or is older than its first record and in its checkpoint alone (a snapshot restore
    or a migration starts every shard that way); either way a checkpoint that reaches it, of a shard
    whose records start past it, keeps it. Which shard it was is gone with it: a revision some such
    checkpoint reaches counts as kept (the check never guesses)."""
    held: set[int] = set()
    reach = 1
    for revisions, checkpoint_rev in shards:
        held.update(revisions)
        reach = max(reach, min(min(revisions, default=upto + 1) - 1, checkpoint_rev))
    return [v for v in range(reach + 1, upto + 1) if v not in held]


def runs_text(revs: list[int], shown: int = 5) -> str:
    """Ascending revisions as runs: "3..5, 9" (the first ``shown`` runs, then how many more)."""
    runs: list[list[int]] = []
    for v in revs:
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    text = ", ".join(f"{a}..{b}" if a != b else f"{a}" for a, b in runs[:shown])
    return text + (f" and {len(runs) - shown} more runs" if len(runs) > shown else "")
