"""Offline checks of a journal directory: what each segment and checkpoint holds.

``verify`` never changes a file.  ``repair`` is what opening a journal does
anyway: cut a torn tail of the last segment (keeping a ``.broken-<offset>``
copy); corruption anywhere else is reported, never "repaired".
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from journal.checkpoint import _list_checkpoints, _load
from journal.config import CheckpointConfig, JournalConfig
from journal.errors import JournalCorrupt
from journal.reader import corrupt_unless_torn
from journal.recovery import recover, scan_segment, sequence_gaps
from journal.segment import list_segments


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
