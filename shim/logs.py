"""Where the server's log lines go: etcd's --log-outputs.

``default`` and ``stderr`` are standard error, ``stdout`` standard output, ``systemd/journal``
the journal's native socket (one entry per line, its priority from the level), and anything
else a file appended to. As etcd, a target that cannot be opened stops the start in etcd's
words (exit 1), and several targets all get every line.
"""
from __future__ import annotations

import logging
import socket
import struct
import sys

FORMAT = "%(asctime)s level=%(levelname)s logger=%(name)s msg=%(message)s"
JOURNAL_SOCKET = "/run/systemd/journal/socket"
_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}


class OutputError(Exception):
    """A --log-outputs target that cannot be used, in etcd's words."""


class JournalHandler(logging.Handler):
    """Entries to systemd's journal over its native protocol (a datagram per entry)."""

    def __init__(self, path: str = JOURNAL_SOCKET) -> None:
        super().__init__()
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self.sock.connect(path)
        except OSError as exc:
            self.sock.close()
            raise OutputError(f"can't find journal (dial unixgram {path}: connect: {_go_errno(exc)})") from None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields = {"MESSAGE": self.format(record), "PRIORITY": str(_PRIORITY.get(record.levelno, 6)),
                      "SYSLOG_IDENTIFIER": "shardetcd", "LOGGER": record.name}
            self.sock.send(b"".join(_field(k, v) for k, v in fields.items()))
        except Exception:  # noqa: BLE001 - logging must not take the server down
            self.handleError(record)

    def close(self) -> None:
        self.sock.close()
        super().close()


def _field(name: str, value: str) -> bytes:
    """One field of the native protocol: ``NAME=value\\n``, or for a value with a newline
    ``NAME\\n`` + its length (u64 little-endian) + the value + ``\\n``."""
    data = value.encode("utf-8", "replace")
    if b"\n" not in data:
        return name.encode() + b"=" + data + b"\n"
    return name.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"


def _go_errno(exc: OSError) -> str:
    """An OS error as Go's syscall package words it ("no such file or directory")."""
    text = exc.strerror or str(exc)
    return text[:1].lower() + text[1:]


def handlers(outputs: tuple[str, ...]) -> list[logging.Handler]:
    """A handler per target of --log-outputs (OutputError when one cannot be opened)."""
    made: list[logging.Handler] = []
    try:
        for target in dict.fromkeys(outputs or ("default",)):
            if target in ("default", "stderr"):
                made.append(logging.StreamHandler(sys.stderr))
            elif target == "stdout":
                made.append(logging.StreamHandler(sys.stdout))
            elif target == "systemd/journal":
                made.append(JournalHandler())
            else:
                try:
                    made.append(logging.FileHandler(target, mode="a", encoding="utf-8"))
                except OSError as exc:
                    raise OutputError(f'couldn\'t open sink "{target}": open {target}: {_go_errno(exc)}') from None
    except BaseException:
        for h in made:
            h.close()
        raise
    return made


def setup(level: str, outputs: tuple[str, ...] = ("default",)) -> None:
    """The root logger at ``level`` (debug, info, warn, error) writing to ``outputs``."""
    made = handlers(outputs)
    formatter = logging.Formatter(FORMAT)
    for h in made:
        h.setFormatter(formatter)
    logging.basicConfig(level=getattr(logging, level.upper().replace("WARN", "WARNING")), handlers=made, force=True)
