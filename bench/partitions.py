"""python -m bench.partitions [--quick]: one process vs a partitioned cluster.

Two scenarios, each run against real etcd 3.5.1, shardetcd as one process
with every key in one shard (*shardetcd-1shard*) and with its default five
shards (one revision space), `shardetcd cluster` with two partition processes
(*cluster-2*: node leases + events, everything else) and with four (*cluster*:
leases, events, pods, everything else) — also as *cluster-nice*, with the
events partition at `nice = 10` — in the same run, so the spread-put rows show
throughput going from 1 to 5 shards in one process and from 1 to 2 and 4
processes:

* **spread-put** — writes spread evenly over four resource types (node
  leases, events, pods, configmaps), C clients per resource, each putting
  sequential keys under its resource with a 256-byte value, as fast as it
  can. Against the cluster each client talks to its resource's partition.
* **isolation** — node-lease heartbeats (kube-apiserver's update shape:
  Txn{mod(key) < 2^62 then Put}, 16 nodes-clients each paced at 10/s) alone,
  then again while 32 clients flood events (Puts of 1 KiB) as fast as they can.
  Reported: heartbeat p50/p99 with and without the flood, and the flood rate.
  The heartbeats run in a load-generator process of their own, the flood in two
  others, so that client-side queueing does not count as server latency.

Client and server share this machine's cores: a partitioned cluster uses
more server processes than there are cores here, so it shows what the
design does when cores are scarce; README's Performance section models more
cores from the per-process figures.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from array import array
from collections import Counter
from pathlib import Path

import grpc
import numpy as np

from proto import rpc_pb2 as pb

from . import report, runargs
from .loadgen import BIG_REV, KV_PUT, KV_TXN, Pool, Window, my_share, now, open_channels, ready, value_bytes, wait_until
from .servers import Server, start_real_etcd, start_shardetcd_default, stop_by_pid
from tests.etcd_fixture import free_port

RESULTS = runargs.RESULTS
RESOURCES = {  # resource → key prefix; each gets its own partition in the cluster
    "leases": b"/registry/leases/kube-node-lease/",
    "events": b"/registry/events/default/",
    "pods": b"/registry/pods/default/",
    "configmaps": b"/registry/configmaps/default/",
}
CLUSTER_LAYOUT = """
[[partition]]
name = "leases"
resources = ["coordination.k8s.io/leases"]

[[partition]]
name = "events"
resources = ["events"]
nice = {events_nice}

[[partition]]
name = "pods"
resources = ["pods"]

[[partition]]
name = "main"
default = true
"""
PARTITION_OF = {"leases": "leases", "events": "events", "pods": "pods", "configmaps": "main"}
# two partitions: node leases and events in one process, everything else in the other
CLUSTER2_LAYOUT = """
[[partition]]
name = "nodes"
resources = ["coordination.k8s.io/leases", "events"]

[[partition]]
name = "main"
default = true
"""
PARTITION2_OF = {"leases": "nodes", "events": "nodes", "pods": "main", "configmaps": "main"}
ONE_SHARD_LAYOUT = 'default = "default"\n'  # every key in one shard: one journal, one state


# ------------------------------------------------------------ load (in workers)


def _requests(group: dict, g: int) -> tuple[str, list[bytes]]:
    value = value_bytes(group["val_size"])
    keys = [group["prefix"] + b"k%07d" % k for k in range(g, group["keyspace"], group["clients"])]
    if group["op"] == "put":
        return KV_PUT, [pb.PutRequest(key=k, value=value).SerializeToString() for k in keys]
    return KV_TXN, [pb.TxnRequest(
        compare=[pb.Compare(key=k, target=pb.Compare.MOD, result=pb.Compare.LESS, mod_revision=BIG_REV)],
        success=[pb.RequestOp(request_put=pb.PutRequest(key=k, value=value))]).SerializeToString() for k in keys]


async def _client(call, reqs: list[bytes], rate: float, phase: float, win: Window, lat: list, errors: Counter) -> None:
    """Closed loop; with ``rate`` > 0, paced at that many requests per second,
    starting ``phase`` (0..1) of a period late so that paced clients do not fire together."""
    gap = 1.0 / rate if rate else 0.0
    await wait_until(win.t0)
    i, next_at = 0, win.t0 + phase * gap
    while True:
        if gap:
            await wait_until(next_at)
            next_at += gap
        t0 = now()
        if t0 >= win.end:
            return
        try:
            await call(reqs[i % len(reqs)])
        except grpc.aio.AioRpcError as exc:
            errors[exc.code().name] += 1
            await asyncio.sleep(0.01)
            continue
        if t0 >= win.start:
            lat.append(now() - t0)
        i += 1


async def run_groups(job: dict, wi: int, wn: int, conn) -> dict:
    """Several client groups (own target, op, key prefix, pace) in one run."""
    work, chans_all = [], []
    for group in job["groups"]:
        pinned = group.get("workers") or list(range(wn))  # the worker processes this group runs in
        mine = my_share(group["clients"], pinned.index(wi), len(pinned)) if wi in pinned else []
        if not mine:
            continue
        chans = await open_channels(group["target"], max(1, min(len(mine), group["conns"])))
        chans_all += chans
        for j, g in enumerate(mine):
            method, reqs = _requests(group, g)
            work.append((group["name"], chans[j % len(chans)].unary_unary(method), reqs, group["rate"], g / group["clients"]))
    lat = {name: [] for name, *_ in work}
    errors: Counter = Counter()
    win = Window(await ready(conn), job["warmup"], job["duration"])
    await asyncio.gather(*(_client(call, reqs, rate, phase, win, lat[name], errors) for name, call, reqs, rate, phase in work))
    for ch in chans_all:
        await ch.close()
    return {"lat": {k: array("d", v).tobytes() for k, v in lat.items()}, "errors": dict(errors)}


# ------------------------------------------------------------ servers


def start_cluster(tmp: Path, events_nice: int = 0, template: str = CLUSTER_LAYOUT) -> tuple[Server, dict[str, str]]:
    """`shardetcd cluster` with the partitions of `template`; (server, partition → endpoint)."""
    tmp.mkdir(parents=True, exist_ok=True)
    layout = tmp / "cluster.toml"
    # every partition on a port known to be free (rather than base+2, base+3, ...)
    text = template.format(events_nice=events_nice)
    layout.write_text(re.sub(r'^(name = "\w+")$', lambda m: f"{m[1]}\nport = {free_port()}", text, flags=re.M))
    base = free_port()
    out_path = tmp / "cluster.out"
    out = out_path.open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "shim", "cluster", "--layout", str(layout), "--data-dir", str(tmp / "cluster"),
                             "--base-port", str(base), "--log-level", "warn"], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 90
    while "--etcd-servers=" not in out_path.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"shardetcd cluster did not start:\n{out_path.read_text()}")
        time.sleep(0.1)
    text = out_path.read_text()
    endpoints = {m[0]: m[1] for m in re.findall(r"^  (\w+)\s+http://(\S+)\s+pid", text, re.M)}

    def stop() -> None:
        stop_by_pid(proc)
        out.close()

    return Server("cluster", endpoints["main"], proc.pid, f"shardetcd cluster ({len(endpoints)} processes)", stop), endpoints


# ------------------------------------------------------------ scenarios


def spread_job(targets: dict[str, str], clients: int, timing) -> dict:
    return {"kind": "groups", "warmup": timing[0], "duration": timing[1], "groups": [
        {"name": res, "target": targets[res], "clients": clients, "conns": 2, "op": "put", "prefix": prefix,
         "keyspace": 200_000, "val_size": 256, "rate": 0} for res, prefix in RESOURCES.items()]}


def isolation_job(targets: dict[str, str], flood: bool, timing) -> dict:
    groups = [{"name": "heartbeat", "target": targets["leases"], "clients": 16, "conns": 2, "op": "txn",
               "prefix": RESOURCES["leases"], "keyspace": 16, "val_size": 300, "rate": 10.0, "workers": [0]}]
    if flood:
        groups.append({"name": "event flood", "target": targets["events"], "clients": 32, "conns": 4, "op": "put",
                       "prefix": RESOURCES["events"], "keyspace": 500_000, "val_size": 1024, "rate": 0, "workers": [1, 2]})
    return {"kind": "groups", "warmup": timing[0], "duration": timing[1], "groups": groups}


def rows_of(results: list[dict], duration: float, **labels) -> list[dict]:
    out = []
    names = sorted({k for r in results for k in r["lat"]})
    errors = report._errors(results)
    for name in names:
        lat = np.concatenate([report._arr(r["lat"][name]) for r in results if name in r["lat"]])
        out.append({**labels, "op": name, "req_s": lat.size / duration, "n": int(lat.size), **report._pcts(lat), "errors": errors})
    if len(names) > 1:
        total = sum(o["n"] for o in out)
        out.insert(0, {**labels, "op": "all", "req_s": total / duration, "n": total, "p50_ms": None, "p99_ms": None, "errors": errors})
    return out


def table(rows: list[dict]) -> str:
    head = ["scenario", "load", "server", "op", "req/s", "p50 ms", "p99 ms", "errors", "vs etcd req/s", "vs etcd p99"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    etcd = {(r["scenario"], r["point"], r["op"]): r for r in rows if r["server"] == "etcd"}
    for r in rows:
        e = etcd.get((r["scenario"], r["point"], r["op"]))
        rt = f"{r['req_s'] / e['req_s']:.2f}" if e and e["req_s"] and r["server"] != "etcd" else ""
        rp = f"{r['p99_ms'] / e['p99_ms']:.2f}" if e and e.get("p99_ms") and r.get("p99_ms") and r["server"] != "etcd" else ""
        errs = sum(r["errors"].values()) if r["errors"] else 0
        lines.append("| " + " | ".join([r["scenario"], r["point"], r["server"], r["op"], report._thr(r["req_s"]),
                                          report._f(r.get("p50_ms")), report._f(r.get("p99_ms")), str(errs), rt, rp]) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.partitions", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2.5 s runs, fewer points (≈ 3 min)")
    ap.add_argument("--tiny", action="store_true", help="smoke run: 0.5 s runs, one spread point; its figures mean nothing")
    ap.add_argument("--servers", default="etcd,shardetcd-1shard,shardetcd,cluster-2,cluster,cluster-nice",
                    help="shardetcd-1shard: one process, every key in one shard; shardetcd: one process, the default "
                         "5 shards; cluster-2: two partition processes; cluster: four; cluster-nice: four, the events "
                         "partition at nice 10 (default: %(default)s)")
    ap.add_argument("--workers", type=int, default=2)
    runargs.add_out(ap)
    args = ap.parse_args(argv)
    timing = (0.2, 0.5) if args.tiny else (0.5, 2.5) if args.quick else (2.0, 15.0)
    spread_points = [2] if args.tiny else [2, 16] if args.quick else [1, 4, 16, 32]
    servers = [s for s in args.servers.split(",") if s]
    tmp = Path(tempfile.mkdtemp(prefix="shardetcd-bench-partitions-"))
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    runs = len(servers) * (len(spread_points) + 2)
    print(f"bench.partitions: {'tiny' if args.tiny else 'quick' if args.quick else 'full'} mode, {runs} runs, servers {','.join(servers)}; "
          f"{os.cpu_count()} cores shared by client and server; data under {tmp}", flush=True)
    pool = Pool(max(3, args.workers))
    rows: list[dict] = []
    done, t_begin = 0, time.monotonic()
    try:
        for srv in servers:
            if srv == "cluster-2":
                server, parts = start_cluster(tmp / srv, template=CLUSTER2_LAYOUT)
                targets = {res: parts[PARTITION2_OF[res]] for res in RESOURCES}
            elif srv.startswith("cluster"):
                server, parts = start_cluster(tmp / srv, events_nice=10 if srv == "cluster-nice" else 0)
                targets = {res: parts[PARTITION_OF[res]] for res in RESOURCES}
            else:
                (tmp / srv).mkdir(parents=True, exist_ok=True)
                if srv == "etcd":
                    server = start_real_etcd(tmp / srv)
                elif srv == "shardetcd-1shard":
                    layout = tmp / srv / "one-shard.toml"
                    layout.write_text(ONE_SHARD_LAYOUT)
                    server = start_shardetcd_default(tmp / srv, ("--shard-layout", str(layout)), "one shard")
                else:
                    server = start_shardetcd_default(tmp / srv)
                targets = {res: server.endpoint for res in RESOURCES}
            print(f"  started {srv}: {server.version} (pid {server.pid})", flush=True)
            try:
                plan = [("spread-put", f"{c} clients × 4 resources", spread_job(targets, c, timing)) for c in spread_points]
                plan += [("isolation", "heartbeats alone", isolation_job(targets, False, timing)),
                         ("isolation", "heartbeats + event flood", isolation_job(targets, True, timing))]
                for scenario, point, job in plan:
                    # isolation: heartbeats get a load-generator process of their own, the flood two others
                    results = pool.run(job, 3 if scenario == "isolation" else args.workers)
                    new = rows_of(results, job["duration"], scenario=scenario, point=point, server=srv)
                    rows += new
                    done += 1
                    summary = "  ".join(f"{r['op']} {report._thr(r['req_s'])}/s p99 {report._f(r.get('p99_ms'))} ms" for r in new)
                    print(f"  [{done:>2}/{runs} {time.monotonic() - t_begin:4.0f}s] {scenario:<10} {point:<26} {srv:<9} {summary}", flush=True)
            finally:
                server.stop()
                print(f"  stopped {srv} (pid {server.pid})", flush=True)
    finally:
        pool.close()
        shutil.rmtree(tmp, ignore_errors=True)
    md = table(rows)
    print()
    print(md)
    print(f"\nNote: {report.NOTE}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{stamp}-partitions.json"
    report.write_json(path, {"meta": {"timestamp": stamp, "quick": args.quick, "cores": os.cpu_count(), "timing": timing}, "rows": rows, "table_md": md})
    print(f"results: {path}  ({time.monotonic() - t_begin:.0f} s)")
    return 0


if __name__ == "__main__":
    runargs.run(main)
