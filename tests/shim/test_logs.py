"""--log-outputs targets: the journal's native protocol, files, refusals in etcd's words."""
from __future__ import annotations

import logging
import socket
import struct

import pytest

from shim import logs


def test_journal_entries_carry_the_line_and_its_priority(tmp_path):
    path = str(tmp_path / "journal.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as journal:
        journal.bind(path)
        handler = logs.JournalHandler(path)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log = logging.getLogger("test_logs.journal")
        log.propagate, log.level = False, logging.DEBUG
        log.addHandler(handler)
        try:
            log.warning("disk slow shard=%s", "pods")
            log.error("two\nlines")
            first, second = journal.recv(65536), journal.recv(65536)
        finally:
            log.removeHandler(handler)
            handler.close()
    assert first.splitlines() == [b"MESSAGE=disk slow shard=pods", b"PRIORITY=4", b"SYSLOG_IDENTIFIER=shardetcd",
                                  b"LOGGER=test_logs.journal"]
    # a value holding a newline: NAME, newline, its length as a little-endian u64, the value, newline
    assert second.startswith(b"MESSAGE\n" + struct.pack("<Q", 9) + b"two\nlines\nPRIORITY=3\n")


def test_targets_that_cannot_be_opened_are_refused_in_etcds_words(tmp_path):
    with pytest.raises(logs.OutputError) as missing:
        logs.JournalHandler(str(tmp_path / "no-journal"))
    assert str(missing.value) == f"can't find journal (dial unixgram {tmp_path / 'no-journal'}: connect: no such file " \
                                 "or directory)"
    target = str(tmp_path / "no-dir" / "x.log")
    with pytest.raises(logs.OutputError) as sink:
        logs.handlers(("stderr", target))
    assert str(sink.value) == f'couldn\'t open sink "{target}": open {target}: no such file or directory'


def test_every_target_gets_every_line(tmp_path):
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    made = logs.handlers(("default", str(a), str(b), str(a)))  # a target named twice is one target
    assert [type(h).__name__ for h in made] == ["StreamHandler", "FileHandler", "FileHandler"]
    log = logging.getLogger("test_logs.files")
    log.propagate, log.level = False, logging.INFO
    for h in made[1:]:
        log.addHandler(h)
    try:
        log.info("one")
        log.debug("not at info")
    finally:
        for h in made:
            log.removeHandler(h)
            h.close()
    assert a.read_text() == b.read_text() == "one\n"
