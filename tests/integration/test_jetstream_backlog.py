"""A reader far behind on a JetStream journal of large messages is not cut off as a slow consumer.

A NATS server closes a client connection that has more than max_pending (64 MB by default) sent
to it and not yet read. nats-py's pull fetch asks for a number of messages only (256 here), and
the server sends them as fast as it can: a follower behind by 256 messages of 1.5 MB objects was
sent 384 MB at once. Its connection was closed (and with it every subscription of the process),
it fell back to a resync; ``journal verify``, which reads every stream from its start, stopped
with "NATS ... stopped answering" (seen in chaos, where split writes are 8 MB messages). Reads
now ask for at most twice the largest message NATS takes per request (journal.jetstream.PullReader).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import grpc

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.nats_fixture import shardetcd_on as server_on
from tests.shardetcd_fixture import REPO_ROOT

VALUE = b"v" * 1_400_000  # one put, one journal message of about that size
BACKLOG = 120  # ~168 MB: well past the 64 MB a NATS connection may have pending


def slow_consumers(nats) -> list[str]:
    lines = []
    for s in nats.servers:
        lines += [line for line in s.log_tail(100_000).splitlines() if "Slow Consumer" in line]
    return lines


def test_a_follower_and_journal_verify_read_a_backlog_of_large_messages_without_being_cut_off(nats, tmp_path):
    writer = server_on(nats, tmp_path / "w").start()
    follower = server_on(nats, tmp_path / "f", "--follow").start()
    try:
        with grpc.insecure_channel(writer.endpoint) as wch, grpc.insecure_channel(follower.endpoint) as fch:
            kv, fkv = pbg.KVStub(wch), pbg.KVStub(fch)
            kv.Put(pb.PutRequest(key=b"/registry/configmaps/ns/first", value=b"v"), timeout=10)
            os.kill(follower.pid, signal.SIGSTOP)
            try:
                for i in range(BACKLOG):
                    last = kv.Put(pb.PutRequest(key=b"/registry/configmaps/ns/c%d" % (i % 10), value=VALUE),
                                  timeout=30).header.revision
            finally:
                os.kill(follower.pid, signal.SIGCONT)
            deadline = time.monotonic() + 60
            while fkv.Range(pb.RangeRequest(key=b"/registry/configmaps/ns/c0", serializable=True),
                            timeout=10).header.revision < last:
                assert time.monotonic() < deadline, "the follower did not catch up in 60 s"
                time.sleep(0.2)
        assert slow_consumers(nats) == []
        log = follower.log_tail(400)
        assert "nats connection error" not in log and "resynchronised" not in log, log

        verify = subprocess.run([sys.executable, "-m", "shim", "journal", "verify", "--journal-url", nats.urls],
                                cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
        assert verify.returncode == 0, f"{verify.stdout}\n{verify.stderr}"
        assert verify.stdout.strip().splitlines()[-1].endswith(": all sound"), verify.stdout
        assert slow_consumers(nats) == []
    finally:
        follower.stop()
        writer.stop()
