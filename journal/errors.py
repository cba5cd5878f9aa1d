"""Exceptions raised by the journal package."""

from __future__ import annotations

from pathlib import Path


class JournalError(Exception):
    """Base class for every journal error."""


class JournalCorrupt(JournalError):
    """Bytes on disk that recovery refuses to interpret.

    Raised for damage that cannot be explained as a torn tail: a bad frame
    in a segment that is not the last one, a bad frame followed by a valid
    frame, revision tags going backwards, or a damaged checkpoint body.
    """

    def __init__(self, path: Path | str, offset: int, reason: str) -> None:
        self.path = Path(path)
        self.offset = offset
        self.reason = reason
        super().__init__(f"{self.path}: offset {offset}: {reason}")


class JournalHeadLost(JournalError):
    """A journal starts past where its writer's last release left it: records its writer never
    released were removed by something else (segments deleted or messages purged by hand)."""


class JournalFailed(JournalError):
    """The journal stopped accepting writes (a write or fsync failed, or it was closed)."""


class JournalUnreachable(JournalError):
    """The journal's home cannot be used at all (NATS unreachable, or set up too small)."""


class JournalFenced(JournalFailed):
    """Another process appended to the journal: this one must not write (or acknowledge) again."""


class JournalGone(JournalFailed):
    """A replicated journal's stream disappeared while in use (deleted by hand, or lost by NATS)."""


class JournalGap(JournalError):
    """A follower found messages missing before the next one it could read (they
    were released up to a checkpoint newer than the one it loaded)."""

    def __init__(self, name: str, expected: int, got: int, detail: str | None = None) -> None:
        self.expected = expected
        self.got = got
        super().__init__(f"journal {name}: {detail or f'expected message {expected} next, the stream gave {got}'}")
