"""Crash at every named failpoint under concurrent load; restart; nothing acknowledged is lost.

Each case arms one failpoint to fire ("exit": the process dies on the spot)
after some hits, runs the crash test's writers until the process is gone,
restarts without failpoints and checks: every acknowledged write present
with its revision, no half-applied cross-shard txn, revisions never back.
"""
from __future__ import annotations

import time

import grpc
import pytest

from journal.failpoints import ENV_VAR, EXIT_CODE
from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.integration.test_crash import WRITERS, Writer, check_acknowledged, check_txns_whole
from tests.shardetcd_fixture import start_shardetcd

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


@pytest.mark.parametrize("failpoint", CASES)
def test_crash_at_failpoint_loses_nothing_acknowledged(tmp_path, monkeypatch, failpoint):
    monkeypatch.setenv(ENV_VAR, failpoint)
    server = start_shardetcd(tmp_path, extra_args=SMALL)
    try:
        writers = run_until_dead(server, 0)
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
            assert kv.Put(pb.PutRequest(key=b"after", value=b"x")).header.revision == rev + 1
    finally:
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
