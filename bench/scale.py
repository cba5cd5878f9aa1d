"""python -m bench.scale [--keys N --leases M]: behaviour at size, etcd vs shardetcd.

For each server in turn (real etcd 3.5.1, shardetcd with its defaults), on
127.0.0.1, stopped by PID:

1. grant M leases (TTL 1 h, 64 grants in flight)                → grants/s
2. write N event-shaped keys (/registry/events/ns-X/ev-Y, 300-byte values),
   key i attached to lease i mod M, 100 puts per Txn, 8 Txns in flight → keys/s
3. memory: server RSS, plus for shardetcd its tmpfs state (RocksDB on
   /dev/shm is memory too); bytes on disk (etcd's bbolt + WAL, shardetcd's
   journals + checkpoints)                                       → bytes/key
4. a paginated list of one 100k-key prefix (limit 500, count on each page,
   pinned to the first page's revision, as kube-apiserver lists) → seconds
5. lease keep-alive: 8 streams over 2 connections, cycling over all M leases
                                                                 → keep-alives/s
6. restart (SIGTERM, start again, until a Range is answered)      → seconds
   (shardetcd's replay logs progress in its log)

Defaults are the issue's scale target: 1,000,000 keys on 100,000 leases.
`--keys 100000 --leases 10000` is a 1-minute version.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import shutil
import tempfile
import time
from pathlib import Path

import grpc

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg

from . import report, runargs
from .servers import start_real_etcd, start_shardetcd_default

RESULTS = runargs.RESULTS
LIST_PREFIX = b"/registry/events/ns-0/"  # holds LIST_KEYS keys
LIST_KEYS = 100_000
VALUE = b"v" * 300
TXN_PUTS = 100


def key_of(i: int) -> bytes:
    # the first LIST_KEYS keys go to one namespace, the list target; the rest spread over 100 more
    ns = 0 if i < LIST_KEYS else 1 + i % 100
    return b"/registry/events/ns-%d/ev-%08d" % (ns, i)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


class Progress:
    def __init__(self, what: str, total: int) -> None:
        self.what, self.total, self.done, self.t0, self.last = what, total, 0, time.monotonic(), 0.0

    def add(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= 5 or self.done >= self.total:
            self.last = now
            rate = self.done / max(1e-9, now - self.t0)
            print(f"      {self.what}: {self.done:,}/{self.total:,} ({rate:,.0f}/s)", flush=True)


async def bounded(n_items: int, in_flight: int, make_call, progress: Progress, per_item: int = 1) -> float:
    """Run make_call(i) for i in range(n_items), `in_flight` at a time; seconds taken."""
    t0 = time.monotonic()
    it = iter(range(n_items))

    async def lane() -> None:
        for i in it:
            await make_call(i)
            progress.add(per_item)

    await asyncio.gather(*(lane() for _ in range(in_flight)))
    return time.monotonic() - t0


async def load(endpoint: str, n_keys: int, n_leases: int) -> dict:
    out = {}
    async with grpc.aio.insecure_channel(endpoint) as ch:
        lease, kv = pbg.LeaseStub(ch), pbg.KVStub(ch)
        ids: list[int] = [0] * n_leases

        async def grant(i: int) -> None:
            ids[i] = (await lease.LeaseGrant(pb.LeaseGrantRequest(TTL=3600), timeout=60)).ID

        s = await bounded(n_leases, 64, grant, Progress("lease grants", n_leases))
        out["grants_s"] = n_leases / s

        async def txn(t: int) -> None:
            first = t * TXN_PUTS
            ops = [pb.RequestOp(request_put=pb.PutRequest(key=key_of(i), value=VALUE, lease=ids[i % n_leases]))
                   for i in range(first, min(n_keys, first + TXN_PUTS))]
            await kv.Txn(pb.TxnRequest(success=ops), timeout=120)

        n_txns = -(-n_keys // TXN_PUTS)
        s = await bounded(n_txns, 8, txn, Progress("keys written", n_keys), per_item=TXN_PUTS)
        out["keys_s"] = n_keys / s
        out["lease_ids"] = ids
    return out


async def paginated_list(endpoint: str) -> dict:
    async with grpc.aio.insecure_channel(endpoint, options=[("grpc.max_receive_message_length", 64 << 20)]) as ch:
        kv = pbg.KVStub(ch)
        end = LIST_PREFIX[:-1] + bytes([LIST_PREFIX[-1] + 1])
        t0 = time.monotonic()
        key, rev, pages, items = LIST_PREFIX, 0, 0, 0
        while True:
            r = await kv.Range(pb.RangeRequest(key=key, range_end=end, limit=500, revision=rev), timeout=60)
            rev = rev or r.header.revision
            pages += 1
            items += len(r.kvs)
            if not r.more:
                break
            key = r.kvs[-1].key + b"\0"
        return {"list_s": time.monotonic() - t0, "list_pages": pages, "list_items": items}


async def keepalives(endpoint: str, ids: list[int], seconds: float, streams: int = 8, conns: int = 2) -> float:
    chans = [grpc.aio.insecure_channel(endpoint) for _ in range(conns)]
    count = 0
    deadline = time.monotonic() + seconds

    async def stream(j: int) -> None:
        nonlocal count
        call = pbg.LeaseStub(chans[j % conns]).LeaseKeepAlive()
        i = j
        while time.monotonic() < deadline:
            await call.write(pb.LeaseKeepAliveRequest(ID=ids[i % len(ids)]))
            r = await call.read()
            if r.TTL <= 0:
                raise RuntimeError(f"lease {ids[i % len(ids)]:x} is gone (TTL {r.TTL})")
            count += 1
            i += streams
        await call.done_writing()

    t0 = time.monotonic()
    await asyncio.gather(*(stream(j) for j in range(streams)))
    elapsed = time.monotonic() - t0
    for ch in chans:
        await ch.close()
    return count / elapsed


def measure(srv: str, tmp: Path, n_keys: int, n_leases: int) -> dict:
    start = start_real_etcd if srv == "etcd" else start_shardetcd_default
    server = start(tmp)
    row: dict = {"server": srv, "version": server.version, "keys": n_keys, "leases": n_leases}
    print(f"  started {srv}: {server.version} on {server.endpoint} (pid {server.pid})", flush=True)
    try:
        rss0 = rss_bytes(server.pid)
        loaded = asyncio.run(load(server.endpoint, n_keys, n_leases))
        ids = loaded.pop("lease_ids")
        row.update(loaded)
        time.sleep(2)  # let background work (checkpoints, compaction of nothing) settle
        row["rss_bytes"] = rss_bytes(server.pid)
        row["rss_start_bytes"] = rss0
        row["tmpfs_state_bytes"] = tree_bytes(server.state_dir) if server.state_dir else 0
        row["disk_bytes"] = tree_bytes(server.data_dir)
        row["memory_per_key_bytes"] = (row["rss_bytes"] - rss0 + row["tmpfs_state_bytes"]) / n_keys
        print(f"    memory: RSS {row['rss_bytes'] / 2**20:,.0f} MiB (+{(row['rss_bytes'] - rss0) / 2**20:,.0f}), "
              f"tmpfs state {row['tmpfs_state_bytes'] / 2**20:,.0f} MiB, disk {row['disk_bytes'] / 2**20:,.0f} MiB", flush=True)
        row.update(asyncio.run(paginated_list(server.endpoint)))
        print(f"    list of {row['list_items']:,} keys in {row['list_pages']} pages: {row['list_s']:.2f} s", flush=True)
        row["keepalive_s"] = asyncio.run(keepalives(server.endpoint, ids, 10.0))
        print(f"    keep-alive: {row['keepalive_s']:,.0f}/s over 8 streams", flush=True)
        row["restart_s"] = server.restart()
        print(f"    restart to first answer: {row['restart_s']:.1f} s", flush=True)
    finally:
        server.stop()
        print(f"  stopped {srv}", flush=True)
    return row


def table(rows: list[dict]) -> str:
    head = ["server", "keys", "leases", "grants/s", "keys/s (Txn of 100)", "RSS MiB", "tmpfs MiB", "memory B/key",
            "disk MiB", "list 100k s", "keep-alive/s", "restart s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        lines.append("| " + " | ".join([
            r["server"], f"{r['keys']:,}", f"{r['leases']:,}", f"{r['grants_s']:,.0f}", f"{r['keys_s']:,.0f}",
            f"{r['rss_bytes'] / 2**20:,.0f}", f"{r['tmpfs_state_bytes'] / 2**20:,.0f}", f"{r['memory_per_key_bytes']:,.0f}",
            f"{r['disk_bytes'] / 2**20:,.0f}", f"{r['list_s']:.2f}", f"{r['keepalive_s']:,.0f}", f"{r['restart_s']:.1f}"]) + " |")
    if len(rows) == 2:
        e, s = rows
        lines.append("| shardetcd/etcd | | | " + " | ".join(f"{s[k] / e[k]:.2f}" if e[k] else "" for k in (
            "grants_s", "keys_s", "rss_bytes", "tmpfs_state_bytes", "memory_per_key_bytes", "disk_bytes", "list_s", "keepalive_s", "restart_s")) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--leases", type=int, default=100_000)
    ap.add_argument("--servers", default="etcd,shardetcd")
    runargs.add_out(ap)
    args = ap.parse_args(argv)
    if args.keys < LIST_KEYS:
        ap.error(f"--keys must be at least {LIST_KEYS:,} (the listed prefix holds that many)")
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    tmp = Path(tempfile.mkdtemp(prefix="shardetcd-bench-scale-"))
    print(f"bench.scale: {args.keys:,} keys on {args.leases:,} leases; {os.cpu_count()} cores shared by client and server; data under {tmp}", flush=True)
    rows = []
    t0 = time.monotonic()
    try:
        for srv in [s for s in args.servers.split(",") if s]:
            rows.append(measure(srv, tmp, args.keys, args.leases))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    md = table(rows)
    print()
    print(md)
    print(f"\nNote: {report.NOTE}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{stamp}-scale.json"
    report.write_json(path, {"meta": {"timestamp": stamp, "cores": os.cpu_count()}, "rows": rows, "table_md": md})
    print(f"results: {path}  ({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    runargs.run(main)
