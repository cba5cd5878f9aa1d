"""python -m bench.stalls: how long one heavy operation holds every other client up, etcd and
shardetcd side by side.

A store's large operations — a range over every key, a hash of its history, a compaction, a
lease revoked with many keys — take time; what matters to a cluster's other clients
(kube-apiserver's lease renewals and watches among them) is whether they wait meanwhile.
etcd runs reads beside a long one and applies writes one after another; shardetcd serves on one
event loop, so each long operation must give the loop back in slices.

Against each server, etcd's benchmark tool first writes --keys keys (1 KiB values). Then each
operation below runs in a process of its own while two probe clients, each on a connection of
its own, send one-key Puts and one-key Ranges in a loop, 2 ms apart; reported per operation:
how long it took (its call, as its client saw it) and the slowest Put and the slowest Range
answered while its process ran.

  range-keys-only   Range over every key, keys_only (etcdctl get --prefix --keys-only)
  range-all         Range over every key with its value (~100 MB at 100,000 keys)
  txn-range-all     the same Range inside a Txn (etcdctl txn)
  hashkv            HashKV at the current revision (etcdctl endpoint hashkv)
  snapshot          Maintenance.Snapshot, the stream read to its end
  lease-revoke      LeaseRevoke of a lease --keys/2 keys are attached to
  delete-range      DeleteRange of --keys/2 keys
  delete-range+prev-kv   the same with prev_kv (etcdctl del --prefix --prev-kv): every deleted row answered
  lease-revoke+watch, delete-range+watch   the same with a watch on the keys' prefix, its client
                    reading every event: also how long until the watch had the last one
  compact-hot       Compact (physical) of --hot puts to 10 keys: a long history per key

    python -m bench.stalls                  # 100,000 keys, 300,000 hot puts (~5 min)
    python -m bench.stalls --tiny           # 2,000 keys, 5,000 hot puts (harness check)
    python -m bench.stalls --only txn-range-all,delete-range+prev-kv --servers shardetcd

On a 2-core machine the probes, the operation's client and the server share the cores, so
part of a slow answer is waiting for a core: read the two servers against each other.
"""
from __future__ import annotations

import argparse
import datetime as dt
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import etcdtool, runargs
from .scenarios import Point, Scenario
from .servers import STARTERS

REPO_ROOT = Path(__file__).resolve().parent.parent
OPS = ("range-keys-only", "range-all", "txn-range-all", "hashkv", "snapshot", "lease-revoke", "delete-range",
       "delete-range+prev-kv", "lease-revoke+watch", "delete-range+watch", "compact-hot")
POINT = Point(64, 8, (None, None, None))
PROBE_GAP_S = 0.002
BATCH = 128  # puts per Txn while attaching keys to a lease (etcd's --max-txn-ops)


def _stubs(endpoint: str):
    import grpc

    from proto import rpc_pb2_grpc as pbg

    ch = grpc.insecure_channel(endpoint, options=[("grpc.max_receive_message_length", (1 << 31) - 1)])
    return ch, pbg.KVStub(ch), pbg.LeaseStub(ch), pbg.MaintenanceStub(ch)


def run_op(op: str, endpoint: str, arg: str) -> tuple[float, int]:
    """One operation, in this process (``--op``): what the bench times. Its seconds, and what
    it did: keys answered, rows deleted, snapshot bytes, the compaction's revision (1: done)."""
    from proto import rpc_pb2 as pb

    ch, kv, lease, maint = _stubs(endpoint)
    with ch:
        maint.Status(pb.StatusRequest(), timeout=60)  # connected before it is timed
        t0 = time.perf_counter()
        if op == "range-keys-only":
            did = len(kv.Range(pb.RangeRequest(key=b"\0", range_end=b"\0", keys_only=True), timeout=600).kvs)
        elif op == "range-all":
            did = len(kv.Range(pb.RangeRequest(key=b"\0", range_end=b"\0"), timeout=600).kvs)
        elif op == "txn-range-all":  # the same answer inside a TxnResponse (etcdctl txn)
            r = kv.Txn(pb.TxnRequest(success=[pb.RequestOp(request_range=pb.RangeRequest(key=b"\0", range_end=b"\0"))]),
                       timeout=600)
            did = len(r.responses[0].response_range.kvs)
        elif op == "hashkv":
            did = int(maint.HashKV(pb.HashKVRequest(revision=0), timeout=600).header.revision > 0)
        elif op == "snapshot":
            did = sum(len(r.blob) for r in maint.Snapshot(pb.SnapshotRequest(), timeout=600))
        elif op.startswith("lease-revoke"):
            lease.LeaseRevoke(pb.LeaseRevokeRequest(ID=int(arg)), timeout=600)
            did = 1
        elif op.startswith("delete-range"):
            prefix = arg.encode()
            r = kv.DeleteRange(pb.DeleteRangeRequest(key=prefix, range_end=_end(prefix), prev_kv=op.endswith("prev-kv")),
                               timeout=600)
            did = r.deleted if not r.prev_kvs else len(r.prev_kvs)
        elif op == "compact-hot":
            kv.Compact(pb.CompactionRequest(revision=int(arg), physical=True), timeout=600)
            did = 1
        else:
            raise SystemExit(f"unknown operation {op!r}")
        return time.perf_counter() - t0, did


class Probes:
    """Two clients on connections of their own, a one-key Put and a one-key Range in a loop."""

    def __init__(self, endpoint: str) -> None:
        from proto import rpc_pb2 as pb

        self.worst = {"put": 0.0, "range": 0.0}
        self.count = {"put": 0, "range": 0}
        self._stop = threading.Event()
        self._threads = []
        for name in ("put", "range"):
            ch, kv, _, _ = _stubs(endpoint)
            call = ((lambda kv=kv: kv.Put(pb.PutRequest(key=b"/probe", value=b"x"), timeout=600)) if name == "put"
                    else (lambda kv=kv: kv.Range(pb.RangeRequest(key=b"/probe"), timeout=600)))
            call()  # connected before anything is timed
            self._threads.append(threading.Thread(target=self._loop, args=(name, call, ch), daemon=True))

    def _loop(self, name: str, call, ch) -> None:
        with ch:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                call()
                took = time.perf_counter() - t0
                self.worst[name] = max(self.worst[name], took)
                self.count[name] += 1
                time.sleep(PROBE_GAP_S)

    def __enter__(self) -> Probes:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)


class PrefixWatch:
    """A watch on a prefix, its client reading every event on a thread: when it had the last of
    ``expect`` events."""

    def __init__(self, endpoint: str, prefix: bytes, expect: int) -> None:
        import queue

        from proto import rpc_pb2 as pb
        from proto import rpc_pb2_grpc as pbg

        self.expect, self.got, self.done_at = expect, 0, 0.0
        self._ch, _, _, _ = _stubs(endpoint)
        self._requests: queue.Queue = queue.Queue()
        self._requests.put(pb.WatchRequest(create_request=pb.WatchCreateRequest(key=prefix, range_end=_end(prefix))))
        self._call = pbg.WatchStub(self._ch).Watch(iter(self._requests.get, None), timeout=3600)
        next(self._call)  # created: it watches before anything is timed
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for response in self._call:
            self.got += len(response.events)
            if self.got >= self.expect:
                self.done_at = time.perf_counter()
                return

    def close(self, timeout: float) -> None:
        self._thread.join(timeout)
        self._call.cancel()
        self._ch.close()


def _end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


def timed_op(op: str, endpoint: str, arg: str = "", watch: tuple[bytes, int] | None = None) -> dict:
    """``op`` timed with the probes running; ``watch``: (prefix, events) a watch must get meanwhile."""
    watcher = None if watch is None else PrefixWatch(endpoint, *watch)
    with Probes(endpoint) as probes:
        time.sleep(0.2)  # the probes' own pace first
        started = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "bench.stalls", "--op", op, "--endpoint", endpoint, "--arg", arg],
                             cwd=REPO_ROOT, check=True, timeout=3600, capture_output=True, text=True).stdout
        took, did = out.split()[-2:]
        if watcher is not None:
            watcher.close(600)
        time.sleep(0.1)
    row = {"op": op, "took_s": float(took), "did": int(did), "slowest_put_ms": probes.worst["put"] * 1000,
           "slowest_range_ms": probes.worst["range"] * 1000, "probes": sum(probes.count.values())}
    if watcher is not None:  # from the operation's process started (its own start included) to the last event
        row.update(watch_events=watcher.got, watch_last_event_s=watcher.done_at - started if watcher.done_at else None)
    return row


def _count(endpoint: str, prefix: bytes) -> int:
    from proto import rpc_pb2 as pb

    ch, kv, _, _ = _stubs(endpoint)
    with ch:
        return kv.Range(pb.RangeRequest(key=prefix, range_end=_end(prefix), count_only=True), timeout=60).count


def _revision(endpoint: str) -> int:
    from proto import rpc_pb2 as pb

    ch, kv, _, _ = _stubs(endpoint)
    with ch:
        return kv.Range(pb.RangeRequest(key=b"/probe"), timeout=60).header.revision


def _attach(endpoint: str, n: int, prefix: bytes, lease_ttl: int = 0) -> int:
    """``n`` keys under ``prefix`` (on a new lease if ``lease_ttl``); the lease's id or 0."""
    from proto import rpc_pb2 as pb

    ch, kv, lease, _ = _stubs(endpoint)
    with ch:
        lid = lease.LeaseGrant(pb.LeaseGrantRequest(TTL=lease_ttl), timeout=60).ID if lease_ttl else 0
        futures = []
        for i in range(0, n, BATCH):
            ops = [pb.RequestOp(request_put=pb.PutRequest(key=prefix + b"%08d" % j, value=b"v" * 200, lease=lid))
                   for j in range(i, min(n, i + BATCH))]
            futures.append(kv.Txn.future(pb.TxnRequest(success=ops), timeout=600))
            if len(futures) >= 32:
                futures.pop(0).result()
        for f in futures:
            f.result()
    return lid


def run_server(name: str, tool: str, keys: int, hot: int, scratch: Path, log, only: tuple[str, ...] = OPS) -> list[dict]:
    server = STARTERS[name](scratch)
    rows: list[dict] = []

    def record(row: dict) -> None:
        row["server"] = name
        rows.append(row)
        watched = "" if "watch_events" not in row else (
            f"; the watch had {row['watch_events']:,} events" + (
                f", the last {row['watch_last_event_s']:.2f} s after the start" if row["watch_last_event_s"] else ""))
        log(f"{name}: {row['op']}: {row['took_s']:.2f} s; slowest put {row['slowest_put_ms']:.0f} ms, "
            f"range {row['slowest_range_ms']:.0f} ms{watched}")

    try:
        log(f"{name}: writing {keys:,} keys")
        etcdtool.run(tool, server.endpoint, Scenario("fill", "tool", [], (
            "put", "--sequential-keys", "--key-space-size", str(keys), "--val-size", "1024")), POINT, keys,
            [server.pid], timeout_s=3600)
        for op in ("range-keys-only", "range-all", "txn-range-all", "hashkv", "snapshot"):
            if op in only:
                record(timed_op(op, server.endpoint))
        if "lease-revoke" in only:
            lid = _attach(server.endpoint, keys // 2, b"/leased/", lease_ttl=3600)
            record(timed_op("lease-revoke", server.endpoint, str(lid)))
            rows[-1]["keys_left"] = _count(server.endpoint, b"/leased/")
        for op, prefix in (("delete-range", b"/gone/"), ("delete-range+prev-kv", b"/gonep/")):
            if op in only:
                _attach(server.endpoint, keys // 2, prefix)
                record(timed_op(op, server.endpoint, prefix.decode()))
        if "lease-revoke+watch" in only:
            lid = _attach(server.endpoint, keys // 2, b"/leasedw/", lease_ttl=3600)
            record(timed_op("lease-revoke+watch", server.endpoint, str(lid), watch=(b"/leasedw/", keys // 2)))
            rows[-1]["keys_left"] = _count(server.endpoint, b"/leasedw/")
        if "delete-range+watch" in only:
            _attach(server.endpoint, keys // 2, b"/gonew/")
            record(timed_op("delete-range+watch", server.endpoint, "/gonew/", watch=(b"/gonew/", keys // 2)))
        if "compact-hot" in only:
            log(f"{name}: {hot:,} puts to 10 keys")
            etcdtool.run(tool, server.endpoint, Scenario("hot", "tool", [], (
                "put", "--key-space-size", "10", "--val-size", "256")), POINT, hot, [server.pid], timeout_s=3600)
            record(timed_op("compact-hot", server.endpoint, str(_revision(server.endpoint))))
    finally:
        server.stop()
    return rows


def table(rows: list[dict], names: list[str], ops: tuple[str, ...] = OPS) -> str:
    by = {(r["server"], r["op"]): r for r in rows}
    head = "| operation |" + "".join(f" {n} took s | {n} slowest put ms | {n} slowest range ms | {n} last event s |"
                                     for n in names)
    lines = [head, "|---|" + "---|---|---|---|" * len(names)]
    for op in ops:
        cells = []
        for n in names:
            r = by.get((n, op))
            last = r and r.get("watch_last_event_s")
            cells.append(f" {r['took_s']:.2f} | {r['slowest_put_ms']:.0f} | {r['slowest_range_ms']:.0f} | "
                         f"{f'{last:.2f}' if last else '-'} |" if r else " - | - | - | - |")
        lines.append(f"| {op} |" + "".join(cells))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.stalls", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--hot", type=int, default=300_000, help="puts to 10 keys before compact-hot")
    ap.add_argument("--servers", default="etcd,shardetcd")
    ap.add_argument("--tiny", action="store_true", help="2,000 keys, 5,000 hot puts: a harness check")
    ap.add_argument("--only", default=",".join(OPS), help="comma-separated operations (default: all: %(default)s)")
    ap.add_argument("--op", help=argparse.SUPPRESS)  # one operation, run by the bench in a process of its own
    ap.add_argument("--endpoint", help=argparse.SUPPRESS)
    ap.add_argument("--arg", default="", help=argparse.SUPPRESS)
    runargs.add_tool(ap)
    runargs.add_out(ap)
    args = ap.parse_args(argv)
    if args.op:
        took, did = run_op(args.op, args.endpoint, args.arg)
        print(f"{took:.6f} {did}")
        return 0
    if args.tiny:
        args.keys, args.hot = 2_000, 5_000
    only = tuple(o for o in args.only.split(",") if o)
    if unknown := set(only) - set(OPS):
        ap.error(f"unknown operations: {sorted(unknown)}")
    tool = runargs.tool_or_exit(args, "python -m bench.stalls")
    names = runargs.etcd_and_shardetcd(args.servers)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    log = runargs.progress(time.monotonic())
    rows = runargs.each_server(names, "shardetcd-stalls-",
                               lambda name, scratch: run_server(name, tool, args.keys, args.hot, scratch, log, only))
    md = table(rows, names, only)
    print(md)
    runargs.save(args.out, stamp, "stalls", {"keys": args.keys, "hot": args.hot, "tool": etcdtool.describe(tool)},
                 rows, f"{args.keys:,} keys, {args.hot:,} hot puts", md)
    return 0


if __name__ == "__main__":
    runargs.run(main)
