"""Where the server's log lines go: etcd's --log-outputs, --enable-log-rotation, --logger.

``default`` and ``stderr`` are standard error, ``stdout`` standard output, ``systemd/journal``
the journal's native socket (one entry per line, its priority from the level), and anything
else a file appended to. As etcd, a target that cannot be opened stops the start in etcd's
words (exit 1), and several targets all get every line.

With --enable-log-rotation the one file target is rotated as etcd's lumberjack rotates it
(--log-rotation-config-json: maxsize in MiB, maxage in days, maxbackups, localtime, compress):
before a line would take the file past maxsize it is renamed ``NAME-<time>.EXT`` (the time of
the rotation, UTC unless localtime, to the millisecond; a millisecond later if a backup already has
that name, where lumberjack would replace it) and a new one is started; backups past
maxbackups or older than maxage days are deleted, and with compress gzipped, in a thread of their
own. The config is read as etcd reads it (Go's JSON, its error words); ``null`` is the defaults
(etcd crashes on it), and a maxsize of 0 or less is the default 100 MiB (etcd's would refuse
every line).
"""
from __future__ import annotations

import datetime
import gzip
import logging
import logging.handlers
import os
import shutil
import socket
import struct
import sys
import threading
from dataclasses import dataclass

from .gojson import GoJSONError, check_valid, kind_of, member_list

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


ROTATION_DEFAULT = '{"maxsize": 100, "maxage": 0, "maxbackups": 0, "localtime": false, "compress": false}'
_STREAMS = ("default", "stderr", "stdout")


@dataclass
class Rotation:
    """etcd's log rotation config (lumberjack's settings)."""

    max_mb: int = 100
    max_age_days: int = 0  # 0: backups are kept whatever their age
    max_backups: int = 0  # 0: every backup is kept
    local_time: bool = False
    compress: bool = False


_ROTATION_FIELDS = {"filename": "string", "maxsize": "int", "maxage": "int", "maxbackups": "int",
                    "localtime": "bool", "compress": "bool"}


def rotation(outputs: tuple[str, ...], config_json: str) -> Rotation:
    """--log-rotation-config-json for these --log-outputs, checked as etcd checks them (OutputError)."""
    targets = _targets(outputs)
    files = [t for t in targets if t not in _STREAMS]
    if (len(targets) == 1 and not files) or len(files) > 1:
        raise OutputError("--log-outputs requires a single file path when --log-rotate-config-json is defined")
    raw = config_json.encode()
    try:
        check_valid(raw)
    except GoJSONError as exc:
        raise OutputError(f"improperly formatted log rotation config: {exc}") from None
    raw = raw.strip(b" \t\r\n")
    kind = kind_of(raw)
    if kind == "null":
        return Rotation()
    if kind != "object":
        raise OutputError(f"invalid log rotation config: json: cannot unmarshal {kind} into Go value of type "
                          "embed.logRotationConfig")
    got: dict[str, object] = {}
    for key, value in member_list(raw):  # Go matches a field's name ignoring case; the first wrong type is told
        name = key.decode("utf-8", "replace").lower()
        want, have = _ROTATION_FIELDS.get(name), kind_of(value)
        if want is None or have == "null":
            continue
        text = value.decode()
        if want == "int" and have == "number" and text.lstrip("-").isdigit() and -2**63 <= int(text) < 2**63:
            got[name] = int(text)
        elif want == "bool" and have == "bool":
            got[name] = text == "true"
        elif want == "string" and have == "string":
            pass  # the file name is --log-outputs' (etcd sets it from there too)
        else:
            told = f"number {text}" if have == "number" and want == "int" else have
            raise OutputError(f"invalid log rotation config: json: cannot unmarshal {told} into Go struct field "
                              f"logRotationConfig.{name} of type {want}")
    r = Rotation()
    if got.get("maxsize", 0) > 0:
        r.max_mb = got["maxsize"]
    r.max_age_days = max(got.get("maxage", 0), 0)
    r.max_backups = max(got.get("maxbackups", 0), 0)
    r.local_time = bool(got.get("localtime", False))
    r.compress = bool(got.get("compress", False))
    return r


class RotatingFile(logging.handlers.BaseRotatingHandler):
    """A log file rotated as etcd's lumberjack rotates it (see the module's doc)."""

    def __init__(self, path: str, config: Rotation) -> None:
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, mode=0o744, exist_ok=True)  # lumberjack makes the file's dir (etcd's mode)
        super().__init__(path, "a", encoding="utf-8")
        self.config = config
        self.max_bytes = config.max_mb * 1024 * 1024
        self._mill = threading.Lock()

    def shouldRollover(self, record: logging.LogRecord) -> bool:  # noqa: N802 - logging's name
        if self.stream is None:
            self.stream = self._open()
        size = len((self.format(record) + self.terminator).encode("utf-8"))
        return self.stream.tell() > 0 and self.stream.tell() + size > self.max_bytes

    def doRollover(self) -> None:  # noqa: N802 - logging's name
        if self.stream is not None:
            self.stream.close()
            self.stream = None
        if os.path.exists(self.baseFilename):
            mode = os.stat(self.baseFilename).st_mode & 0o777
            os.rename(self.baseFilename, self.free_backup_name(self._now()))
        else:
            mode = None
        self.stream = self._open()
        if mode is not None:
            os.chmod(self.baseFilename, mode)
        threading.Thread(target=self.mill, name="log-rotation", daemon=True).start()

    def _now(self) -> datetime.datetime:
        return datetime.datetime.now() if self.config.local_time else datetime.datetime.now(datetime.timezone.utc)

    def backup_name(self, when: datetime.datetime) -> str:
        stem, ext = os.path.splitext(self.baseFilename)
        return f"{stem}-{when.strftime('%Y-%m-%dT%H-%M-%S')}.{when.microsecond // 1000:03d}{ext}"

    def free_backup_name(self, when: datetime.datetime) -> str:
        """The backup name for a rotation at ``when``, a millisecond later for each one a rotation in
        the same millisecond already took (gzipped or not): lumberjack would rename over that one."""
        while os.path.exists(name := self.backup_name(when)) or os.path.exists(name + ".gz"):
            when += datetime.timedelta(milliseconds=1)
        return name

    def backups(self) -> list[tuple[datetime.datetime, str]]:
        """The backups beside the file, newest first: (time in their name, path)."""
        directory = os.path.dirname(self.baseFilename)
        stem, ext = os.path.splitext(os.path.basename(self.baseFilename))
        found = []
        for name in os.listdir(directory):
            core = name[:-3] if name.endswith(".gz") else name
            if not (core.startswith(stem + "-") and core.endswith(ext)):
                continue
            stamp = core[len(stem) + 1: len(core) - len(ext)] if ext else core[len(stem) + 1:]
            try:
                when = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H-%M-%S.%f")
            except ValueError:
                continue
            found.append((when, os.path.join(directory, name)))
        return sorted(found, reverse=True)

    def mill(self) -> None:
        """Delete backups past maxbackups and maxage, then gzip the rest when compress is set."""
        with self._mill:
            try:
                cutoff = (self._now().replace(tzinfo=None) - datetime.timedelta(days=self.config.max_age_days)
                          if self.config.max_age_days else None)
                names: set[str] = set()  # a backup and its gzipped copy count once
                keep = []
                for when, path in self.backups():
                    names.add(path.removesuffix(".gz"))
                    if (self.config.max_backups and len(names) > self.config.max_backups) or \
                            (cutoff is not None and when < cutoff):
                        os.remove(path)
                    else:
                        keep.append(path)
                if self.config.compress:
                    for path in keep:
                        if not path.endswith(".gz"):
                            _gzip(path)
            except OSError as exc:
                sys.stderr.write(f"shardetcd: log rotation: {exc}\n")


def _gzip(path: str) -> None:
    """``path`` to ``path.gz`` (its mode kept), then ``path`` removed."""
    with open(path, "rb") as src, gzip.open(path + ".gz.tmp", "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.chmod(path + ".gz.tmp", os.stat(path).st_mode & 0o777)
    os.rename(path + ".gz.tmp", path + ".gz")
    os.remove(path)


def handlers(outputs: tuple[str, ...], rotate: Rotation | None = None) -> list[logging.Handler]:
    """A handler per target of --log-outputs (OutputError when one cannot be opened); with
    ``rotate``, the file target rotated."""
    made: list[logging.Handler] = []
    try:
        for target in _targets(outputs):
            if target in ("default", "stderr"):
                made.append(logging.StreamHandler(sys.stderr))
            elif target == "stdout":
                made.append(logging.StreamHandler(sys.stdout))
            elif target == "systemd/journal":
                made.append(JournalHandler())
            else:
                try:
                    made.append(RotatingFile(target, rotate) if rotate is not None
                                else logging.FileHandler(target, mode="a", encoding="utf-8"))
                except OSError as exc:
                    raise OutputError(f'couldn\'t open sink "{target}": open {target}: {_go_errno(exc)}') from None
    except BaseException:
        for h in made:
            h.close()
        raise
    return made


def _targets(outputs: tuple[str, ...]) -> list[str]:
    """--log-outputs' targets, each once, in order (none given: default)."""
    return list(dict.fromkeys(outputs or ("default",)))


def check_logger(name: str) -> None:
    """etcd 3.5's --logger: zap only."""
    if name == "capnslog":
        raise OutputError("--logger=capnslog is removed in v3.5")
    if name != "zap":
        raise OutputError(f'unknown logger option "{name}"')


QUIET_LIBRARIES = ("hpack",)  # at debug: a line per header field of every request the gRPC server reads


def _not_a_tls_eof(record: logging.LogRecord) -> bool:
    """asyncio warns of this each time a server closes a connection that was upgraded to TLS after
    it opened (as nats-py does with ``tls://`` NATS servers): noise; the disconnect is logged by
    whoever had the connection."""
    return record.getMessage() != "returning true from eof_received() has no effect when using ssl"


def setup(level: str, outputs: tuple[str, ...] = ("default",), rotate: Rotation | None = None) -> None:
    """The root logger at ``level`` (debug, info, warn, error) writing to ``outputs``."""
    made = handlers(outputs, rotate)
    formatter = logging.Formatter(FORMAT)
    for h in made:
        h.setFormatter(formatter)
    root = getattr(logging, level.upper().replace("WARN", "WARNING"))
    logging.basicConfig(level=root, handlers=made, force=True)
    for name in QUIET_LIBRARIES:  # their debug lines are about their own workings, not the server's
        logging.getLogger(name).setLevel(max(root, logging.INFO))
    logging.getLogger("asyncio").addFilter(_not_a_tls_eof)
