"""Every scenario of `python -m bench` and its parameters, in one table.

Two load generators, one per kind of shape:

* **etcd's own benchmark tool** (`tools/benchmark`, a Go client; see
  etcdtool.py) for etcd's shapes: put with a hot key or sequential keys,
  range linearizable/serializable, txn-put, watch-latency, watch fan-out
  (its `watch` command) and lease-keepalive.  It is how etcd's published
  figures are made, and a Go client costs far less CPU per request than a
  Python one on the cores the server shares with it.
* **the Python generator** (loadgen.py, k8s.py) only for what the tool cannot
  produce: the Kubernetes-shaped mix, and clientv3's lease renewal shape
  (long-lived LeaseKeepAlive streams, many leases, keep-alives pipelined; the
  tool's lease-keepalive opens a stream per keep-alive).

A point is (clients, connections) and how many requests the tool sends in
each mode (tiny, quick, full; None: the point is not run in that mode).  For
the Python-driven scenarios a truthy entry only says the point runs; they
run for `Timing` seconds.  etcd's documented points are 1 client on
1 connection and 1,000 clients on 100 connections; 64 clients on
8 connections is the "high concurrency" scaled to this 2-core machine.
"""
from __future__ import annotations

from dataclasses import dataclass, field

VAL_SIZE = 256
WORKERS = 2  # Python load-generator processes (for clients > 1)
RANGE_KEY = "/bench/range-key"  # seeded with a 256-byte value before the range shapes


@dataclass(frozen=True)
class Timing:
    warmup: float  # seconds run before measuring
    duration: float  # seconds measured


QUICK = Timing(warmup=0.5, duration=2.5)
TINY = Timing(warmup=0.2, duration=0.5)  # --tiny: a smoke run of the harness
FULL = Timing(warmup=2.0, duration=15.0)
MODES = ("tiny", "quick", "full")


@dataclass(frozen=True)
class Point:
    clients: int
    conns: int
    total: tuple  # per mode (tiny, quick, full): requests (watch shapes: puts) the tool sends; None = not run
    flags: tuple[str, ...] = ()  # tool flags of this point only
    label: str = ""  # how the tables name the point (default "clients/conns")

    @property
    def name(self) -> str:
        return self.label or f"{self.clients}/{self.conns}"

    def requests(self, mode: str) -> int | None:
        return self.total[MODES.index(mode)]


@dataclass
class Scenario:
    name: str
    driver: str  # "tool" | "python"
    points: list[Point]
    args: tuple[str, ...] = ()  # tool: its command and flags, without the count
    count_flag: str = "--total"  # tool: the flag that takes Point.total
    kind: str = ""  # python: "keepalive-pipelined" | "k8s"
    params: dict = field(default_factory=dict)  # python: the generator's parameters
    servers: tuple[str, ...] = ("etcd", "shardetcd", "ceiling")
    describe: str = ""
    latency: bool = True  # False: the generator's latency figures time nothing (the tool's watch), none reported

    def points_for(self, mode: str) -> list[Point]:
        return [p for p in self.points if p.requests(mode)]


def _kv_points(*extra: Point, tiny_many: bool = False) -> list[Point]:
    """1/1 and 1000/100 (etcd's documented points), plus `extra`; `tiny_many`: 1000/100 runs in --tiny too."""
    return sorted([Point(1, 1, (100, 2_000, 10_000)), *extra,
                   Point(1000, 100, (1_000 if tiny_many else None, 20_000, 100_000))], key=lambda p: p.clients)


_PUT = ("put", "--key-size", "8", "--val-size", str(VAL_SIZE))
# durable writes run on the floor too (bench/ceiling.py --mvcc): the ceiling plus the least MVCC work
WRITE_SERVERS = ("etcd", "shardetcd", "floor", "ceiling")
_SEQ = ("--sequential-keys", "--key-space-size", "100000")

SCENARIOS: list[Scenario] = [
    Scenario("put-hot", "tool", _kv_points(), _PUT, servers=WRITE_SERVERS,
             describe="Put, one hot key (8 zero bytes: the tool's default key space of 1), 256-byte value"),
    Scenario("put-seq", "tool",
             _kv_points(Point(64, 8, (None, 10_000, 50_000)), Point(256, 32, (None, None, 50_000)),
                        tiny_many=True),  # --tiny: one run of the many-connections path
             (*_PUT, *_SEQ), servers=WRITE_SERVERS,
             describe="Put, sequential distinct 8-byte keys (varints of 0..99,999), 256-byte value"),
    Scenario("range-l", "tool",
             _kv_points(Point(64, 8, (None, 10_000, 50_000)), Point(256, 32, (None, None, 50_000))),
             ("range", RANGE_KEY, "--consistency", "l"),
             describe="Range one key (holding 256 bytes), linearizable"),
    Scenario("range-s", "tool", _kv_points(), ("range", RANGE_KEY, "--consistency", "s"),
             describe="Range one key, serializable"),
    Scenario("txn-put", "tool", _kv_points(), ("txn-put", "--key-size", "8", "--val-size", str(VAL_SIZE), *_SEQ[1:]),
             servers=WRITE_SERVERS,
             describe="Txn with no compare, success = one Put (the tool's txn-put), keys varints of i mod 100,000"),
    Scenario("watch-latency", "tool",
             [Point(100, 10, (20, 300, 1_500), ("--put-rate", "100"), "100 watchers/10 conns, 100 put/s"),
              Point(100, 10, (None, None, 3_000), ("--put-rate", "1000"), "100 watchers/10 conns, ≤1000 put/s")],
             ("watch-latency",),
             describe="100 watchers of one key over 10 connections (one stream each); one put at a time, the next "
                      "after every watcher got the event (so ≤ put-rate); latency = put acknowledged -> event "
                      "received, per watcher; req/s = events received/s"),
    Scenario("watch-fanout", "tool",
             [Point(1, 1, (20, 1_000, 3_000), ("--streams", "10", "--watch-per-stream", "10"), "100 watchers/10 streams"),
              Point(1, 1, (None, None, 300), ("--streams", "10", "--watch-per-stream", "100"), "1000 watchers/10 streams")],
             ("watch", "--put-rate", "1000000"), count_flag="--put-total", latency=False,
             describe="the tool's watch: N watchers of one key over 10 streams on one connection, one client putting "
                      "as fast as it can; req/s = events received/s (its latency figures time nothing, so none shown)"),
    Scenario("lease-keepalive", "tool", [Point(100, 10, (500, 10_000, 50_000))], ("lease-keepalive",),
             describe="the tool's lease-keepalive: each client grants a lease, then KeepAliveOnce in a loop "
                      "(a LeaseKeepAlive stream opened per keep-alive)"),
    Scenario("lease-keepalive-many", "python",
             [Point(4, 2, (1, 1, 1)), Point(16, 2, (None, None, 1))],
             kind="keepalive-pipelined",
             params=dict(window=64, leases=(100, 1_000, 10_000)),
             describe="clientv3's shape (Python generator): N long-lived LeaseKeepAlive streams over 2 connections "
                      "renew 1,000 (full: 10,000) granted leases, up to 64 keep-alives in flight per stream; "
                      "req/s = keep-alives answered/s"),
    Scenario("k8s-mix", "python", [Point(34, 4, (1, 1, 1), label="34 clients/4 conns")], kind="k8s",
             params=dict(pods=(200, 2_000, 100_000), nodes=(20, 200, 2_000),
                         clients=dict(heartbeat=16, pod=8, event=8, list=1, count=1),
                         duration=(1.0, 6.0, 30.0), compact_every_s=(0.3, 2.0, 15.0),
                         pod_bytes=1_500, lease_bytes=300, event_bytes=600, list_limit=500, progress_every_s=0.5),
             servers=("etcd", "shardetcd"),
             describe="Kubernetes-shaped mix (Python generator): heartbeats, pod create/update/delete, events with "
                      "a lease, paginated list + count, watches per resource prefix with prev_kv"),
]


def by_name() -> dict[str, Scenario]:
    return {s.name: s for s in SCENARIOS}


def in_mode(params: dict, mode: str) -> dict:
    """A Python scenario's parameters with every (tiny, quick, full) triple resolved for `mode`."""
    i = MODES.index(mode)
    return {k: (v[i] if isinstance(v, tuple) and len(v) == 3 else v) for k, v in params.items()}
