"""Every scenario and its parameters, in one table.

Shapes follow etcd's `benchmark` tool (tools/benchmark): put with a hot key or
sequential keys, range linearizable/serializable, txn-put, watch-latency,
lease-keepalive; plus a Kubernetes-shaped mix (see k8s.py).

Concurrency is written as clients; the number of gRPC connections (TCP
connections, one grpc.aio channel each) is min(clients, MAX_CONNS), spread
over the worker processes. The machine has 2 cores shared by client and server,
so "high concurrency" here is 8 connections / 64 clients (quick) up to
8 connections / 256 clients (full); full mode also runs etcd's documented
100 connections / 1000 clients point for put, range and txn.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

KEY_SIZE = 8  # bytes, raw (not text): the hot key is eight zero bytes
VAL_SIZE = 256
MAX_CONNS = 8
# etcd's documented high point (benchmark --conns=100 --clients=1000), run in full mode as it is
ETCD_STD_CLIENTS, ETCD_STD_CONNS = 1000, 100
WORKERS = 2  # load-generator processes (for clients > 1)


@dataclass(frozen=True)
class Timing:
    warmup: float  # seconds run before measuring
    duration: float  # seconds measured


QUICK = Timing(warmup=0.5, duration=2.5)
TINY = Timing(warmup=0.2, duration=0.5)  # --tiny: a smoke run of the harness
FULL = Timing(warmup=2.0, duration=15.0)


@dataclass
class Scenario:
    name: str
    kind: str  # "unary" | "watch" | "keepalive" | "keepalive-pipelined" | "k8s"
    quick: list[int]  # concurrency points (clients) in --quick
    full: list[int]  # concurrency points in full mode
    params: dict = field(default_factory=dict)
    servers: tuple[str, ...] = ("etcd", "shardetcd")
    describe: str = ""


SCENARIOS: list[Scenario] = [
    Scenario("put-hot", "unary", [1, 64], [1, 64, 256, 1000],
             dict(op="put", keys="hot"),
             describe="Put, one hot key (8 zero bytes), 256-byte value"),
    Scenario("put-seq", "unary", [1, 8, 64], [1, 8, 32, 64, 128, 256, 1000],
             dict(op="put", keys="seq", keyspace_quick=20_000, keyspace_full=200_000),
             servers=("etcd", "shardetcd", "ceiling"),
             describe="Put, sequential distinct 8-byte big-endian keys, 256-byte value"),
    Scenario("range-l", "unary", [1, 8, 64], [1, 8, 32, 64, 128, 256, 1000],
             dict(op="range", keys="hot", serializable=False),
             servers=("etcd", "shardetcd", "ceiling"),
             describe="Range one key (holding 256 bytes), linearizable"),
    Scenario("range-s", "unary", [1, 64], [1, 64, 256, 1000],
             dict(op="range", keys="hot", serializable=True),
             describe="Range one key, serializable"),
    Scenario("txn-put", "unary", [1, 64], [1, 8, 64, 256, 1000],
             dict(op="txn", keys="seq", keyspace_quick=20_000, keyspace_full=200_000),
             describe="Txn: compare mod(key) < 2^62 (always true) then Put, sequential keys"),
    Scenario("watch-latency", "watch", [100], [100, 1000],
             dict(streams=10, put_rate=100, writers=1),
             describe="1 writer at 100 puts/s, N watchers of that key over 10 streams; latency = put sent -> event received"),
    Scenario("watch-fanout", "watch", [100], [100, 1000],
             dict(streams=10, put_rate=0, writers=1),
             describe="1 writer as fast as it can (1 client), N watchers; req/s = events delivered/s"),
    Scenario("lease-keepalive", "keepalive", [8], [8, 64],
             dict(conns=2),
             servers=("etcd", "shardetcd", "ceiling"),
             describe="N LeaseKeepAlive streams over 2 connections, each keep-alive -> response in a loop"),
    Scenario("lease-keepalive-many", "keepalive-pipelined", [4], [4, 16],
             dict(conns=2, window=64, leases_quick=1_000, leases_full=10_000),
             servers=("etcd", "shardetcd", "ceiling"),
             describe="clientv3's shape: N LeaseKeepAlive streams over 2 connections renew 1,000 (full: 10,000) "
                      "granted leases, up to 64 keep-alives in flight per stream; req/s = keep-alives answered/s"),
    Scenario("k8s-mix", "k8s", [1], [1],
             dict(pods_quick=2_000, pods_full=100_000, nodes_quick=200, nodes_full=2_000,
                  clients=dict(heartbeat=16, pod=8, event=8, list=1, count=1),
                  duration_quick=6.0, duration_full=30.0,
                  pod_bytes=1_500, lease_bytes=300, event_bytes=600, list_limit=500,
                  progress_every_s=0.5, compact_every_s_quick=2.0, compact_every_s_full=15.0),
             describe="Kubernetes-shaped mix: heartbeats, pod create/update/delete, events with a lease, "
                      "paginated list + count, watches per resource prefix with prev_kv"),
]


# --tiny shrinks the Kubernetes mix's set-up and run (other scenarios only run shorter)
TINY_PARAMS = {"k8s-mix": dict(pods_quick=200, nodes_quick=20, duration_quick=1.0, compact_every_s_quick=0.3),
               "lease-keepalive-many": dict(leases_quick=100)}


def by_name(tiny: bool = False) -> dict[str, Scenario]:
    if not tiny:
        return {s.name: s for s in SCENARIOS}
    return {s.name: replace(s, params={**s.params, **TINY_PARAMS.get(s.name, {})}) for s in SCENARIOS}
