"""python -m bench [--quick] [--only S1,S2] [--servers etcd,shardetcd,ceiling]

Starts each server in turn (real etcd 3.5.1, shardetcd with its defaults, the
do-nothing ceiling server), runs the same scenarios against it with the same
load generator, stops it by PID, and reports side by side.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

import grpc

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg

from . import k8s, machine, report, scenarios as sc
from .checkperf import check_datascale, check_perf
from .loadgen import HOT_KEY, Pool, value_bytes
from .servers import STARTERS, machine_busy, sample

RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short runs, fewer concurrency points (<= 5 min)")
    ap.add_argument("--tiny", action="store_true",
                    help="smoke run (implies --quick): the lowest concurrency point of each scenario, 0.5 s runs, "
                         "a small k8s-mix; keeps the harness working, its figures mean nothing")
    ap.add_argument("--only", default="", help="comma-separated scenario names: " + ",".join(s.name for s in sc.SCENARIOS))
    ap.add_argument("--servers", default="etcd,shardetcd,ceiling", help="comma-separated: etcd,shardetcd,ceiling")
    ap.add_argument("--duration", type=float, help="override the measured seconds per run")
    ap.add_argument("--workers", type=int, default=sc.WORKERS, help="load-generator processes (default 2)")
    ap.add_argument("--check-perf", choices=("auto", "yes", "no"), default="auto",
                    help="run `etcdctl check perf` and `check datascale` (--load=s) per server (auto: full mode only)")
    ap.add_argument("--quiet-wait", type=float, default=None,
                    help="before each run, wait up to this many seconds for other CPU load on the machine to drop "
                         "below --quiet-below (default 10 s quick, 60 s full)")
    ap.add_argument("--quiet-below", type=float, default=25.0, help="percent of one core (default 25)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="where JSON and PNGs go (default bench/results)")
    return ap.parse_args(argv)


def plan(args) -> list[tuple[sc.Scenario, int]]:
    table = sc.by_name(tiny=args.tiny)
    names = [n for n in args.only.split(",") if n] or list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"unknown scenario(s) {unknown}; known: {list(table)}")
    if args.tiny:
        return [(table[n], table[n].quick[0]) for n in names]
    return [(table[n], c) for n in names for c in (table[n].quick if args.quick else table[n].full)]


def make_job(s: sc.Scenario, clients: int, target: str, timing: sc.Timing, quick: bool, setup: dict) -> dict:
    job = {"kind": s.kind, "target": target, "warmup": timing.warmup, "duration": timing.duration,
           "clients": clients, "val_size": sc.VAL_SIZE, **s.params}
    if s.kind == "unary":
        job["conns"] = sc.ETCD_STD_CONNS if clients == sc.ETCD_STD_CLIENTS else min(clients, sc.MAX_CONNS)
        if "keyspace_quick" in s.params:
            job["keyspace"] = s.params["keyspace_quick" if quick else "keyspace_full"]
    elif s.kind == "watch":
        job["conns"] = 2
    elif s.kind == "keepalive-pipelined":
        job["setup"] = setup
    elif s.kind == "k8s":
        job["params"] = {**s.params, "compact_every_s": s.params["compact_every_s_quick" if quick else "compact_every_s_full"]}
        job["setup"] = setup
        job["duration"] = s.params["duration_quick" if quick else "duration_full"]
    return job


def point_label(s: sc.Scenario, job: dict) -> str:
    if s.kind == "watch":
        return f"{job['clients']} watchers/{job['streams']} streams" + (f", {job['put_rate']} put/s" if job["put_rate"] else "")
    if s.kind == "keepalive":
        return f"{job['clients']} streams/{job['conns']}"
    if s.kind == "keepalive-pipelined":
        return f"{len(job['setup']['lease_ids']):,} leases/{job['clients']} streams/{job['conns']}"
    if s.kind == "k8s":
        c = s.params["clients"]
        return f"{sum(c.values())} clients/4 conns"
    return f"{job['clients']}/{job['conns']}"


def prepare(s: sc.Scenario, target: str, quick: bool) -> dict:
    if s.kind == "unary" and s.params["op"] == "range":
        with grpc.insecure_channel(target) as ch:
            pbg.KVStub(ch).Put(pb.PutRequest(key=HOT_KEY, value=value_bytes(sc.VAL_SIZE)), timeout=30)
    if s.kind == "k8s":
        return k8s.prepare(target, s.params, quick)
    if s.kind == "keepalive-pipelined":
        return {"lease_ids": grant_leases(target, s.params["leases_quick" if quick else "leases_full"])}
    return {}


def grant_leases(target: str, n: int, ttl: int = 3600, batch: int = 256) -> list[int]:
    """n leases, granted `batch` at a time in flight."""
    ids: list[int] = []
    with grpc.insecure_channel(target) as ch:
        grant = pbg.LeaseStub(ch).LeaseGrant
        for lo in range(0, n, batch):
            futs = [grant.future(pb.LeaseGrantRequest(TTL=ttl), timeout=60) for _ in range(min(batch, n - lo))]
            ids.extend(f.result().ID for f in futs)
    return ids


def main(argv=None) -> int:
    args = parse_args(argv)
    args.quick = args.quick or args.tiny
    timing = sc.TINY if args.tiny else sc.QUICK if args.quick else sc.FULL
    if args.duration:
        timing = sc.Timing(timing.warmup, args.duration)
    servers = [s for s in args.servers.split(",") if s]
    bad = [s for s in servers if s not in STARTERS]
    if bad:
        raise SystemExit(f"unknown server(s) {bad}; known: {list(STARTERS)}")
    servers = [s for s in report.SERVER_ORDER if s in servers]
    runs = plan(args)
    do_check_perf = args.check_perf == "yes" or (args.check_perf == "auto" and not args.quick)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    tmp = Path(tempfile.mkdtemp(prefix="shardetcd-bench-"))
    total_runs = sum(1 for srv in servers for s, _ in runs if srv in s.servers)
    print(f"bench: {'tiny' if args.tiny else 'quick' if args.quick else 'full'} mode, {total_runs} runs, servers {','.join(servers)}; "
          f"{os.cpu_count()} cores shared by client and server; data under {tmp}", flush=True)

    rows: list[dict] = []
    meta: dict = {"timestamp": stamp, "mode": "tiny" if args.tiny else "quick" if args.quick else "full", "cores": os.cpu_count(),
                  "python": platform.python_version(), "grpcio": grpc.__version__, "note": report.NOTE,
                  "timing": {"warmup_s": timing.warmup, "duration_s": timing.duration}, "workers": args.workers,
                  "servers": {}, "scenarios": {s.name: {"describe": s.describe, "params": s.params} for s in sc.SCENARIOS},
                  "machine": machine.describe(tmp)}
    print(f"  machine: {machine.one_line(meta['machine'])}", flush=True)
    perf: dict = {}
    t_begin = time.monotonic()
    done = 0
    pool = Pool(args.workers + 1)  # +1: the watch scenarios' writer gets its own process
    quiet_wait = args.quiet_wait if args.quiet_wait is not None else (0.0 if args.tiny else 10.0 if args.quick else 60.0)

    def wait_quiet() -> float:
        """Wait (bounded) until the machine is idle apart from the server; return the last busy %."""
        deadline = time.monotonic() + quiet_wait
        while True:
            busy = machine_busy(0.5)
            if busy < args.quiet_below or time.monotonic() > deadline:
                return busy
    try:
        for srv in servers:
            todo = [(s, c) for s, c in runs if srv in s.servers]
            if not todo and not (do_check_perf and srv != "ceiling"):
                continue
            server = STARTERS[srv](tmp)
            meta["servers"][srv] = {"version": server.version, "endpoint": server.endpoint}
            print(f"  started {srv}: {server.version} on {server.endpoint} (pid {server.pid})", flush=True)
            try:
                prepared: dict[str, dict] = {}
                for s, clients in todo:
                    if s.name not in prepared:
                        prepared[s.name] = prepare(s, server.endpoint, args.quick)
                    job = make_job(s, clients, server.endpoint, timing, args.quick, prepared[s.name])
                    workers = 1 if (s.kind == "unary" and clients == 1) else args.workers
                    if s.kind == "watch":
                        workers += 1
                    idle_busy = wait_quiet()
                    results = pool.run(job, workers, on_window=lambda pids: sample(server.pid, pids))
                    label = point_label(s, job)
                    done += 1
                    for r in report.summarize(s.kind, results, job["duration"]):
                        r.update(scenario=s.name, server=srv, point=label, clients=clients,
                                 conns=job.get("conns"), workers=workers, busy_before_pct=idle_busy)
                        rows.append(r)
                    main_row = rows[-1] if s.kind != "k8s" else next(r for r in rows[::-1] if r.get("op") == "all writes+reads")
                    errs = sum(main_row.get("errors", {}).values())
                    print(f"  [{done:>2}/{total_runs} {time.monotonic() - t_begin:5.0f}s] {s.name:<15} {label:<24.24} {srv:<9} "
                          f"{report._thr(main_row['req_s']):>8} req/s  p50 {report._f(main_row['p50_ms']):>7} ms  "
                          f"p99 {report._f(main_row['p99_ms']):>7} ms  other CPU {report._f(main_row.get('other_cpu_pct'), '{:.0f}')}%"
                          + (f"  errors {errs}" if errs else ""), flush=True)
                if do_check_perf and srv != "ceiling":
                    print(f"  etcdctl check perf --load=s against {srv} (~60 s) ...", flush=True)
                    perf[srv] = check_perf(server.endpoint)
                    print(f"  etcdctl check datascale --load=s against {srv} ...", flush=True)
                    perf[srv + " datascale"] = check_datascale(server.endpoint, server.metrics_url)
                    for name in (srv, srv + " datascale"):
                        for line in perf[name]["summary"]:
                            print(f"    {line}", flush=True)
            finally:
                server.stop()
                print(f"  stopped {srv} (pid {server.pid})", flush=True)
    finally:
        pool.close()
        shutil.rmtree(tmp, ignore_errors=True)

    elapsed = time.monotonic() - t_begin
    meta["elapsed_s"] = elapsed
    md = report.table(rows)
    print()
    print(md)
    print()
    print(f"Note: {report.NOTE} 'other CPU %' is what the rest of the machine used during the measured "
          f"window (percent of one core; 200 = both cores).")
    for srv, p in perf.items():
        print(f"etcdctl check {'datascale' if srv.endswith('datascale') else 'perf'} --load=s, "
              f"{srv.split()[0]}: " + " | ".join(p["summary"]))
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / stamp
    report.write_json(stem.with_suffix(".json"), {"meta": meta, "rows": rows, "check_perf": perf, "table_md": md})
    pngs = report.plots(rows, stem)
    print(f"results: {stem.with_suffix('.json')}" + "".join(f", {p}" for p in pngs) + f"  ({elapsed:.0f} s)")
    if publishable(args, servers):
        kept = report.publish(stem, pngs, args.out / LATEST, meta, md, perf, rows)
        print(f"kept as the latest quick run (tracked in git): {', '.join(str(p) for p in kept)}")
    return 0


LATEST = "latest-quick"


def publishable(args, servers: list[str]) -> bool:
    """Only a complete, default quick run replaces the results kept in the repository."""
    return (args.quick and not args.tiny and not args.only and not args.duration
            and servers == list(report.SERVER_ORDER) and args.out.resolve() == RESULTS.resolve())
