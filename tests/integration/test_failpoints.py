"""Crash at every named failpoint under concurrent load; restart; nothing acknowledged is lost.

Each case arms one failpoint to fire ("exit": the process dies on the spot)
after some hits, runs the crash test's writers until the process is gone,
restarts without failpoints and checks: every acknowledged write present
with its revision, no half-applied cross-shard txn, revisions never back, and
watch: every event a watcher got before the crash is still history after it,
and a watch from the last revision it saw continues with nothing missed.
"""
from __future__ import annotations

import time

import grpc
import pytest

from journal.failpoints import ENV_VAR, EXIT_CODE
from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.integration.test_crash import WRITERS, Writer, check_acknowledged, check_txns_whole
from tests.shardetcd_fixture import start_shardetcd
from tests.watch_client import WatchClient

SMALL = ("--journal-segment-bytes", "65536", "--checkpoint-journal-bytes", "131072")

CASES = [
    "journal.before_write=exit@40",
    "journal.after_write_before_fsync=exit@40",
    "journal.after_fsync_before_ack=exit@40",
    "store.between_txn_parts=exit@60",
    "segment.after_create_before_dirsync=exit@9",  # 5 shards create their first segment, then rollovers
    "checkpoint.before_rename=exit@2",
    "checkpoint.after_rename_before_dirsync=exit@2",
]


def run_until_dead(server, round_no: int, timeout_s: float = 30.0) -> list[Writer]:
    writers = [Writer(server.endpoint, w, round_no) for w in range(WRITERS)]
    for w in writers:
        w.start()
    deadline = time.monotonic() + timeout_s
    while server.running() and time.monotonic() < deadline:
        time.sleep(0.05)
    for w in writers:
        w.join(10)
    return writers


def event_tuples(events) -> list[tuple]:
    return [(e.kv.mod_revision, e.type, e.kv.key, e.kv.value) for e in events]


def watch_all(endpoint: str, start_revision: int, through_rev: int) -> list[tuple]:
    """Every event of every key from ``start_revision`` up to ``through_rev``."""
    with grpc.insecure_channel(endpoint) as ch:
        w = WatchClient(ch)
        try:
            w.create(b"\0", b"\0", start_revision=start_revision)
            w.wait_for(lambda rs: any(e.kv.mod_revision >= through_rev for r in rs for e in r.events), timeout=30)
            return event_tuples(w.events())
        finally:
            w.close()


def check_watch_resumes(endpoint: str, before_crash: list[tuple], acked: list, rev: int) -> None:
    """``rev``: the revision after restart; a marker written now ends both watches."""
    with grpc.insecure_channel(endpoint) as ch:
        assert pbg.KVStub(ch).Put(pb.PutRequest(key=b"after", value=b"x")).header.revision == rev + 1
    rev += 1
    history = watch_all(endpoint, 1, rev)
    assert history[: len(before_crash)] == before_crash, "an event delivered before the crash is not history after it"
    revs = sorted({r for r, *_ in history})
    assert revs == list(range(2, rev + 1)), "the history has a gap"
    events = {(key, value, r) for r, _, key, value in history}
    assert all(a in events for a in acked), "an acknowledged write has no event"
    last_seen = before_crash[-1][0] if before_crash else 1
    resumed = watch_all(endpoint, last_seen + 1, rev)
    assert resumed == history[len(before_crash):], "resuming from the last seen revision missed or repeated events"


@pytest.mark.parametrize("failpoint", CASES)
def test_crash_at_failpoint_loses_nothing_acknowledged(tmp_path, monkeypatch, failpoint):
    monkeypatch.setenv(ENV_VAR, failpoint)
    server = start_shardetcd(tmp_path, extra_args=SMALL)
    watch_channel = grpc.insecure_channel(server.endpoint)
    try:
        watcher = WatchClient(watch_channel)
        watcher.create(b"\0", b"\0", start_revision=1)
        watcher.wait_for(lambda rs: rs and rs[0].created)
        writers = run_until_dead(server, 0)
        watcher.wait_for(lambda rs: watcher.error is not None, timeout=10)  # the stream broke at the crash
        before_crash = event_tuples(watcher.events())
        assert server.returncode == EXIT_CODE, f"the failpoint never fired: {server.log_tail()}"
        acked = [a for w in writers for a in w.acked]
        print(f"{failpoint}: {len(acked)} acknowledged, {sum(len(w.txns) for w in writers)} txns sent")
        monkeypatch.delenv(ENV_VAR)
        server.restart()
        with grpc.insecure_channel(server.endpoint) as ch:
            kv = pbg.KVStub(ch)
            rev = kv.Range(pb.RangeRequest(key=b"any")).header.revision
            assert rev >= max([r for _, _, r in acked], default=1), "revision went backwards"
            check_acknowledged(kv, acked)
            check_txns_whole(kv, [t for w in writers for t in w.txns])
        check_watch_resumes(server.endpoint, before_crash, acked, rev)
    finally:
        watch_channel.close()
        server.stop()


def test_fsync_error_stops_acknowledging_and_exits(tmp_path, monkeypatch):
    """A failed fsync is never retried or ignored: clients get an error (not a
    hang), the process exits non-zero, and a restart has everything acknowledged."""
    monkeypatch.setenv(ENV_VAR, "journal.after_write_before_fsync=raise@30")
    server = start_shardetcd(tmp_path)
    try:
        writers = run_until_dead(server, 0)
        assert server.returncode == 1, server.log_tail()
        errors = [w.error for w in writers if w.error is not None]
        assert any(e.code() == grpc.StatusCode.UNAVAILABLE and e.details() == "etcdserver: server stopped"
                   for e in errors), [(e.code(), e.details()) for e in errors]
        acked = [a for w in writers for a in w.acked]
        monkeypatch.delenv(ENV_VAR)
        server.restart()
        with grpc.insecure_channel(server.endpoint) as ch:
            check_acknowledged(pbg.KVStub(ch), acked)
    finally:
        server.stop()
