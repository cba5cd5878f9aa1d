"""Append-only segmented journal and atomic checkpoints (bytes on disk only).

This package knows nothing of etcd, keys or protobuf: records are
(type, revision tag, payload bytes) and checkpoint rows are opaque blobs.
The on-disk frame format is documented in journal/record.py.
"""

from __future__ import annotations

from journal.checkpoint import Checkpoint, load_latest_checkpoint, write_checkpoint
from journal.config import CheckpointConfig, JournalConfig
from journal.errors import JournalCorrupt, JournalError, JournalFailed, JournalFenced, JournalUnreachable
from journal.journal import Journal
from journal.record import Record

__all__ = [
    "Checkpoint",
    "CheckpointConfig",
    "Journal",
    "JournalConfig",
    "JournalCorrupt",
    "JournalError",
    "JournalFailed",
    "JournalFenced",
    "JournalUnreachable",
    "Record",
    "load_latest_checkpoint",
    "write_checkpoint",
]
