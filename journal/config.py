"""Tunables for journals and checkpoints (sizes in bytes, durations in seconds)."""

from __future__ import annotations

from dataclasses import dataclass

from journal.record import PAYLOAD_BYTES_LIMIT

MIB = 1024 * 1024
FSYNC_POLICIES = ("always", "batch", "off")


@dataclass(frozen=True)
class JournalConfig:
    """How a journal writes and reads its segments.

    fsync policies:
      "always": each batch is one write() plus one fdatasync().
      "batch":  like "always", but the writer lingers batch_linger_s before
                writing so more concurrent appends join the batch.
      "off":    write() only; nothing on the write path is fsynced
                (a process crash loses nothing, an OS crash may).

    inline_lone_writes: with "always" or "off", a lone writer's batches (one
    record, nothing else arriving, quick fsyncs) are written on the event loop
    instead of the writer thread (see Journal._write_inline).
    """

    segment_bytes_max: int = 64 * MIB
    batch_bytes_max: int = 4 * MIB
    record_bytes_max: int = 64 * MIB
    fsync: str = "always"
    batch_linger_s: float = 0.002
    inline_lone_writes: bool = True
    replay_progress_bytes: int = 64 * MIB
    read_chunk_bytes: int = 1 * MIB

    def __post_init__(self) -> None:
        if self.fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync must be one of {FSYNC_POLICIES}, got {self.fsync!r}")
        _require_positive(self, "segment_bytes_max", "batch_bytes_max", "record_bytes_max",
                          "replay_progress_bytes", "read_chunk_bytes")
        _require_record_limit(self.record_bytes_max)
        if self.batch_linger_s < 0:
            raise ValueError("batch_linger_s must be >= 0")

    @property
    def sync_writes(self) -> bool:
        return self.fsync != "off"


@dataclass(frozen=True)
class CheckpointConfig:
    """How checkpoint files are framed."""

    frame_bytes_target: int = 1 * MIB
    record_bytes_max: int = 64 * MIB
    read_chunk_bytes: int = 1 * MIB

    def __post_init__(self) -> None:
        _require_positive(self, "frame_bytes_target", "record_bytes_max", "read_chunk_bytes")
        _require_record_limit(self.record_bytes_max)


def _require_positive(config: object, *names: str) -> None:
    for name in names:
        if getattr(config, name) <= 0:
            raise ValueError(f"{name} must be > 0")


def _require_record_limit(record_bytes_max: int) -> None:
    if record_bytes_max > PAYLOAD_BYTES_LIMIT:
        raise ValueError(f"record_bytes_max must be <= {PAYLOAD_BYTES_LIMIT}")
