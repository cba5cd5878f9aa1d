"""The writer lease across the loss of the NATS server that leads its bucket (JetStream, R3).

When the NATS server leading the lease bucket's stream is lost, the other two wait 4-9 s
(nats-server's Raft election timeout) before they elect a new leader: longer than the
lease's 3 s TTL. Nobody can renew or take the lease meanwhile, and the journals take no
writes either. When the new leader expires the entry, the writer and a standby both
find it free. Before the standby deferred to the writer, the standby usually took it
first: the writer was deposed, its watches ended, and kube-apiserver re-listed, all
for a NATS fault the writer had already come through.
"""
from __future__ import annotations

import time

import grpc

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.integration.followkit import wait_until
from tests.nats_fixture import shardetcd_on as server_on, start_nats_cluster, wait_standing_by

LEASE_STREAM = "KV_shardetcd-writer"  # the writer lease bucket of the default --journal-prefix
TTL_S = 3.0  # --journal-lease-ttl's default


def put(endpoint: str, key: bytes, value: bytes, timeout: float = 3.0) -> bool:
    with grpc.insecure_channel(endpoint) as ch:
        try:
            pbg.KVStub(ch).Put(pb.PutRequest(key=key, value=value), timeout=timeout)
            return True
        except grpc.RpcError:
            return False


def test_losing_the_nats_server_that_leads_the_lease_bucket_costs_no_takeover(tmp_path):
    nats = start_nats_cluster(tmp_path / "nats", size=3)
    writer = server_on(nats, tmp_path / "writer")
    standby = server_on(nats, tmp_path / "standby", "--standby")
    try:
        writer.start()
        standby.start(wait=False)
        wait_standing_by(standby)
        assert put(writer.endpoint, b"/registry/leases/before", b"1")
        names = [s.name for s in nats.servers]
        leader = wait_until("the lease bucket has a leader", lambda: nats.stream_leader(LEASE_STREAM))
        lost = names.index(leader)
        live = [i for i in range(3) if i != lost]
        nats.kill(lost)
        lost_at = time.monotonic()
        nats.wait_stream_leaders(live)
        elected_after = time.monotonic() - lost_at

        def logs() -> str:
            return (f"{elected_after:.1f} s to elect {LEASE_STREAM}'s leader after {leader} was lost\n"
                    f"writer:\n{writer.log_tail(30)}\nstandby:\n{standby.log_tail(30)}")

        def acknowledged() -> bool:
            assert writer.running(), f"writer exited; {logs()}"
            return put(writer.endpoint, b"/registry/leases/after", b"2")

        # the writer renews (or takes its lapsed lease again and fences the journals) and writes on
        wait_until("a write acknowledged by the writer after the election", acknowledged, timeout=30)
        time.sleep(2 * TTL_S)  # long enough for a standby that does not defer to take the lease
        assert writer.running(), f"writer exited; {logs()}"
        assert put(writer.endpoint, b"/registry/leases/later", b"3"), logs()
        assert standby.running() and "writer lease acquired" not in standby.log_tail(200), logs()
        nats.start(lost)
        assert writer.stop() == 0
        # the standby takes over at once from a writer that stopped while NATS answered all along
        wait_until("the standby took over", lambda: standby.answers_range(), timeout=30)
        with grpc.insecure_channel(standby.endpoint) as ch:
            got = pbg.KVStub(ch).Range(pb.RangeRequest(key=b"/registry/leases/", range_end=b"/registry/leases0"),
                                       timeout=10)
        assert [(kv.key, kv.value) for kv in got.kvs] == [
            (b"/registry/leases/after", b"2"), (b"/registry/leases/before", b"1"), (b"/registry/leases/later", b"3")]
        assert standby.stop() == 0
    finally:
        writer.kill()
        standby.kill()
        nats.stop()
