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


def test_rotation_keeps_maxbackups_drops_old_ones_and_gzips(tmp_path):
    """maxsize 1 MiB, maxbackups 2, maxage 1 day, compress: four rotations leave the two newest
    backups, gzipped with their lines whole; a backup named older than a day goes; files that are
    not this log's backups stay."""
    import gzip
    import os
    import time

    path = tmp_path / "logs" / "server.log"  # the dir is made, as etcd's rotating sink makes it
    config = logs.rotation((str(path),), '{"maxsize": 1, "maxbackups": 2, "maxage": 1, "compress": true}')
    assert config == logs.Rotation(max_mb=1, max_age_days=1, max_backups=2, compress=True)
    handler = logs.RotatingFile(str(path), config)
    handler.setFormatter(logging.Formatter("%(message)s"))
    old = path.parent / "server-2001-02-03T04-05-06.789.log"  # named two decades ago
    old.write_text("old\n")
    other = path.parent / "server-notes.log"
    other.write_text("not a backup\n")
    log = logging.getLogger("test_logs.rotation")
    log.propagate, log.level = False, logging.INFO
    log.addHandler(handler)
    line = "x" * 1000
    try:
        for i in range(4 * 1048 + 10):  # a rotation about every 1,048 lines
            log.info("%d %s", i, line)
    finally:
        log.removeHandler(handler)
        handler.close()
    deadline = time.monotonic() + 10
    while True:  # the mill runs in a thread of its own
        names = sorted(os.listdir(path.parent))
        backups = [n for n in names if n.startswith("server-2") or n.startswith("server-1")]
        if len(backups) == 2 and all(n.endswith(".log.gz") for n in backups) and not old.exists():
            break
        assert time.monotonic() < deadline, names
        time.sleep(0.05)
    assert other.exists() and path.exists() and path.stat().st_size < 1024 * 1024
    numbers = []
    for name in backups:
        lines = gzip.decompress((path.parent / name).read_bytes()).decode().splitlines()
        assert all(len(x.split(" ")[1]) == 1000 for x in lines)  # whole lines
        numbers.append([int(x.split(" ")[0]) for x in lines])
    first = min(n[0] for n in numbers)
    assert first > 1000 and sorted(sum(numbers, [])) == list(range(first, first + sum(map(len, numbers))))


def test_rotations_in_the_same_millisecond_keep_every_backup(tmp_path, monkeypatch):
    """Three rotations stamped with one time (a clock that does not move): each backup gets its own
    name, a millisecond apart, rather than the next rename replacing the one before (lumberjack's
    os.Rename would), and every line is in one of them."""
    import datetime
    import os

    path = tmp_path / "server.log"
    handler = logs.RotatingFile(str(path), logs.rotation((str(path),), '{"maxsize": 1}'))
    handler.setFormatter(logging.Formatter("%(message)s"))
    when = datetime.datetime(2026, 11, 30, 1, 2, 3, 456000, tzinfo=datetime.timezone.utc)
    monkeypatch.setattr(handler, "_now", lambda: when)
    log = logging.getLogger("test_logs.same_ms")
    log.propagate, log.level = False, logging.INFO
    log.addHandler(handler)
    try:
        for i in range(3 * 1048 + 10):  # a rotation about every 1,048 lines of ~1 KB
            log.info("%d %s", i, "x" * 1000)
    finally:
        log.removeHandler(handler)
        handler.close()
    names = sorted(os.listdir(tmp_path))
    assert names == ["server-2026-11-30T01-02-03.456.log", "server-2026-11-30T01-02-03.457.log",
                     "server-2026-11-30T01-02-03.458.log", "server.log"], names
    numbers = [int(line.split(" ")[0]) for name in names for line in (tmp_path / name).read_text().splitlines()]
    assert numbers == list(range(3 * 1048 + 10))


def test_rotation_config_is_read_as_etcd_reads_it():
    assert logs.rotation(("stderr", "a.log"), logs.ROTATION_DEFAULT) == logs.Rotation()  # one file among streams
    assert logs.rotation(("a.log",), "null") == logs.Rotation()  # etcd crashes on it; the defaults here
    assert logs.rotation(("a.log",), '{"maxsize": 0, "MaxBackups": 3, "LOCALTIME": true, "other": [1]}') == \
        logs.Rotation(max_backups=3, local_time=True)
    for outputs in (("default",), ("stdout",), ("a.log", "b.log")):
        with pytest.raises(logs.OutputError, match="requires a single file path"):
            logs.rotation(outputs, logs.ROTATION_DEFAULT)


def test_a_server_at_debug_logs_its_own_debug_lines_and_not_the_header_decoders(tmp_path):
    """hpack logs each header field it decodes at debug: a dozen lines a request, drowning the
    server's own debug lines. At --log-level debug the server's are there and hpack's are not."""
    import re

    import grpc

    from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
    from tests.shardetcd_fixture import start_shardetcd

    server = start_shardetcd(tmp_path, extra_args=("--log-level", "debug"))
    try:
        with grpc.insecure_channel(server.endpoint) as ch:
            pbg.KVStub(ch).Put(pb.PutRequest(key=b"k", value=b"v"), timeout=10)
    finally:
        server.stop()
    loggers = set(re.findall(r"level=DEBUG logger=([\w.]+)", server.log_path.read_text()))
    assert any(name.startswith("journal.") for name in loggers), loggers
    assert not any(name.startswith("hpack") for name in loggers), loggers


TLS_EOF = """
import asyncio, logging, ssl, sys
from pathlib import Path
from shim import logs
from tests.tls_certs import make_pki

pki = make_pki(Path(sys.argv[1]) / "pki")
logs.setup("warn", (sys.argv[1] + "/out.log",))

async def main():
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(pki["server"], pki["server-key"])

    async def close_after_tls(reader, writer):
        await writer.start_tls(served)
        writer.close()

    server = await asyncio.start_server(close_after_tls, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    # upgraded once open, as nats-py upgrades it: the loop's start_tls under the stream's protocol
    await asyncio.get_running_loop().start_tls(writer.transport, writer.transport.get_protocol(),
                                               ssl.create_default_context(cafile=pki["ca"]))
    assert await reader.read() == b""
    await asyncio.sleep(0.1)
    logging.getLogger("asyncio").warning("another asyncio warning")
    server.close()

asyncio.run(main())
"""


def test_asyncios_warning_when_a_tls_peer_closes_is_not_logged(tmp_path):
    """A NATS server over TLS that closes its connection (killed, restarted) made asyncio log a
    warning that says nothing to an operator; its other warnings are still logged."""
    import subprocess
    import sys
    from pathlib import Path

    r = subprocess.run([sys.executable, "-c", TLS_EOF, str(tmp_path)], capture_output=True, text=True, timeout=60,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0, r.stderr
    logged = (tmp_path / "out.log").read_text()
    assert "another asyncio warning" in logged and "eof_received" not in logged, logged
