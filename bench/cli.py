"""python -m bench [--quick|--tiny] [--only S1,S2] [--servers etcd,shardetcd,floor,ceiling] [--tool PATH]

Starts the servers (real etcd 3.5.1, shardetcd with its defaults, the floor
for the durable writes, the do-nothing ceiling server), runs every scenario
point on each in turn (etcd, shardetcd, floor, ceiling, then the next point:
the runs a ratio compares are seconds apart), stops them by PID, and reports
side by side in one table with ratios.  etcd's shapes are
driven by etcd's own benchmark tool (--tool PATH, $SHARDETCD_BENCHMARK_TOOL,
or ../shared/bin/etcd-benchmark.xz); the Python generator drives only what
the tool cannot (lease-keepalive-many, k8s-mix).
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import grpc

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from shim.config import GRPC_SERVERS, ServerConfig

from . import etcdtool, k8s, machine, report, runargs, scenarios as sc
from .checkperf import check_datascale, check_perf
from .loadgen import Pool
from .servers import STARTERS, sample, settled_fsync_count

RESULTS = runargs.RESULTS
LATEST = "latest-quick"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer points, fewer requests per run (≈ 3 min on a quiet machine)")
    ap.add_argument("--tiny", action="store_true",
                    help="smoke run (implies --quick): the 1-client point of each scenario (put-seq also at "
                         "1000/100) with a few hundred requests, a small k8s-mix; keeps the harness working, "
                         "its figures mean nothing")
    ap.add_argument("--only", default="", help="comma-separated scenario names: " + ",".join(s.name for s in sc.SCENARIOS))
    ap.add_argument("--servers", default="etcd,shardetcd,floor,ceiling", help="comma-separated: etcd,shardetcd,floor,ceiling")
    ap.add_argument("--grpc-server", choices=GRPC_SERVERS, default=ServerConfig.grpc_server,
                    help="the gRPC server of shardetcd and of the ceiling alike (default: %(default)s, shardetcd's)")
    runargs.add_tool(ap)
    ap.add_argument("--duration", type=float, help="override the measured seconds of the Python-driven runs")
    ap.add_argument("--total", type=int, help="override the requests per run of the tool-driven runs")
    ap.add_argument("--workers", type=int, default=sc.WORKERS, help="Python load-generator processes (default 2)")
    ap.add_argument("--check-perf", choices=("auto", "yes", "no"), default="auto",
                    help="run `etcdctl check perf` and `check datascale` (--load=s) per server (auto: full mode only)")
    runargs.add_quiet(ap)
    runargs.add_out(ap, "JSON and PNGs")
    return ap.parse_args(argv)


mode_of = runargs.mode_of


def plan(args) -> list[tuple[sc.Scenario, sc.Point]]:
    table = sc.by_name()
    names = [n for n in args.only.split(",") if n] or list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"unknown scenario(s) {unknown}; known: {list(table)}")
    return [(table[n], p) for n in names for p in table[n].points_for(mode_of(args))]


def prepare(s: sc.Scenario, target: str, mode: str) -> dict:
    """Set-up a Python-driven scenario needs on a fresh server (once per server)."""
    if s.kind == "k8s":
        return k8s.prepare(target, sc.in_mode(s.params, mode))
    if s.kind == "keepalive-pipelined":
        return {"lease_ids": grant_leases(target, sc.in_mode(s.params, mode)["leases"])}
    return {}


def make_job(s: sc.Scenario, point: sc.Point, target: str, timing: sc.Timing, mode: str, setup: dict) -> dict:
    """The Python generator's job for one point (loadgen.Pool.run)."""
    params = sc.in_mode(s.params, mode)
    job = {"kind": s.kind, "target": target, "warmup": timing.warmup, "duration": timing.duration,
           "clients": point.clients, "conns": point.conns, "val_size": sc.VAL_SIZE, **params, "setup": setup}
    if s.kind == "k8s":
        job["params"] = params
        job["duration"] = params["duration"]
    return job


def point_label(s: sc.Scenario, point: sc.Point, setup: dict) -> str:
    if s.kind == "keepalive-pipelined":
        return f"{len(setup['lease_ids']):,} leases/{point.clients} streams/{point.conns}"
    return point.name


def grant_leases(target: str, n: int, ttl: int = 3600, batch: int = 256) -> list[int]:
    """n leases, granted `batch` at a time in flight."""
    ids: list[int] = []
    with grpc.insecure_channel(target) as ch:
        grant = pbg.LeaseStub(ch).LeaseGrant
        for lo in range(0, n, batch):
            futs = [grant.future(pb.LeaseGrantRequest(TTL=ttl), timeout=60) for _ in range(min(batch, n - lo))]
            ids.extend(f.result().ID for f in futs)
    return ids


WRITE_COMMANDS = ("put", "txn-put")  # the tool's commands whose requests are all durable writes


def run_tool_point(tool: Path, server, s: sc.Scenario, point: sc.Point, total: int) -> dict:
    writes = s.args[0] in WRITE_COMMANDS
    row = etcdtool.run(tool, server.endpoint, s, point, total, [server.pid],
                       on_window=(lambda: settled_fsync_count(server.metrics_url)) if writes else None)
    f0, f1 = row.pop("window", (None, None))
    if f0 is not None and f1 is not None and f1 > f0:
        row["writes_per_fsync"] = row["n"] / (f1 - f0)  # how many writes each fdatasync covered (group commit)
    if not s.latency:
        row.update(p50_ms=None, p90_ms=None, p99_ms=None, p999_ms=None)
    return row


def main(argv=None) -> int:
    args = parse_args(argv)
    args.quick = args.quick or args.tiny
    mode = mode_of(args)
    timing = sc.TINY if args.tiny else sc.QUICK if args.quick else sc.FULL
    if args.duration:
        timing = sc.Timing(timing.warmup, args.duration)
    servers = [s for s in args.servers.split(",") if s]
    bad = [s for s in servers if s not in STARTERS]
    if bad:
        raise SystemExit(f"unknown server(s) {bad}; known: {list(STARTERS)}")
    servers = [s for s in report.SERVER_ORDER if s in servers]
    runs = plan(args)
    tool = None
    if any(s.driver == "tool" for s, _ in runs):
        tool = runargs.tool_or_exit(args, "python -m bench")
    do_check_perf = args.check_perf == "yes" or (args.check_perf == "auto" and not args.quick)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    tmp = Path(tempfile.mkdtemp(prefix="shardetcd-bench-"))
    total_runs = sum(1 for srv in servers for s, _ in runs if srv in s.servers)
    print(f"bench: {mode} mode, {total_runs} runs, servers {','.join(servers)}; "
          f"{os.cpu_count()} cores shared by client and server; data under {tmp}", flush=True)
    if tool:
        print(f"  etcd's benchmark tool: {tool}", flush=True)

    rows: list[dict] = []
    meta: dict = {"timestamp": stamp, "mode": mode, "cores": os.cpu_count(),
                  "python": platform.python_version(), "grpcio": grpc.__version__, "note": report.NOTE,
                  "timing": {"warmup_s": timing.warmup, "duration_s": timing.duration}, "workers": args.workers,
                  "tool": {"path": str(tool), "describe": etcdtool.describe(tool)} if tool else None,
                  "servers": {}, "scenarios": {s.name: {"describe": s.describe, "generator": s.driver, "args": s.args,
                                                        "params": s.params} for s in sc.SCENARIOS},
                  "machine": machine.describe(tmp)}
    print(f"  machine: {machine.one_line(meta['machine'])}", flush=True)
    perf: dict = {}
    t_begin = time.monotonic()
    done = 0
    pool = Pool(args.workers) if any(s.driver == "python" for s, _ in runs) else None
    quiet_wait = runargs.quiet_wait_s(args, mode)

    def wait_quiet() -> float:
        """Wait (bounded) until the machine is idle apart from the server; return the last busy %."""
        return runargs.wait_quiet(quiet_wait, args.quiet_below)
    # Every server is started first and the scenarios' points are run in turn on each (etcd, shardetcd,
    # floor, ceiling, then the next point): the ratios compare runs seconds apart, not minutes, so this VM's
    # drifting speed moves them less. Each server still sees the same scenarios in the same order.
    started: dict[str, object] = {}
    prepared: dict[str, dict[str, dict]] = {}
    try:
        for srv in servers:
            if not any(srv in s.servers for s, _ in runs) and not (do_check_perf and srv in ("etcd", "shardetcd")):
                continue
            transport = ("--grpc-server", args.grpc_server)  # shardetcd's, the floor's and the ceiling's alike
            if srv == "etcd":
                server = STARTERS[srv](tmp)
            elif srv in ("ceiling", "floor"):
                server = STARTERS[srv](tmp, transport)
            else:
                server = STARTERS[srv](tmp, transport, " ".join(transport))
            started[srv] = server
            meta["servers"][srv] = {"version": server.version, "endpoint": server.endpoint}
            print(f"  started {srv}: {server.version} on {server.endpoint} (pid {server.pid})", flush=True)
            etcdtool.seed_range_key(server.endpoint, sc.RANGE_KEY, sc.VAL_SIZE)
            prepared[srv] = {}
        for s, point in runs:
            for srv, server in started.items():
                if srv not in s.servers:
                    continue
                idle_busy = wait_quiet()
                if s.driver == "tool":
                    new = [run_tool_point(tool, server, s, point, args.total or point.requests(mode))]
                    workers = 0
                else:
                    if s.name not in prepared[srv]:
                        prepared[srv][s.name] = prepare(s, server.endpoint, mode)
                    job = make_job(s, point, server.endpoint, timing, mode, prepared[srv][s.name])
                    workers = 1 if point.clients == 1 else args.workers
                    results = pool.run(job, workers, on_window=lambda pids, pid=server.pid: sample(pid, pids))
                    new = report.summarize(s.kind, results, job["duration"])
                label = point_label(s, point, prepared[srv].get(s.name, {}))
                for r in new:
                    r.update(scenario=s.name, server=srv, point=label, clients=point.clients, conns=point.conns,
                             generator=s.driver, workers=workers, busy_before_pct=idle_busy)
                rows += new
                done += 1
                main_row = new[0]
                errs = sum(main_row.get("errors", {}).values())
                print(f"  [{done:>2}/{total_runs} {time.monotonic() - t_begin:5.0f}s] {s.name:<20} {label:<26.26} "
                      f"{srv:<9} {report._thr(main_row['req_s']):>8} req/s  p50 {report._f(main_row['p50_ms']):>7} ms  "
                      f"p99 {report._f(main_row['p99_ms']):>7} ms  srv {report._f(main_row.get('srv_cpu_us'), '{:.0f}'):>5} "
                      f"µs/req  other CPU {report._f(main_row.get('other_cpu_pct'), '{:.0f}')}%"
                      + (f"  errors {errs}" if errs else ""), flush=True)
        for srv, server in started.items():
            if do_check_perf and srv in ("etcd", "shardetcd"):
                print(f"  etcdctl check perf --load=s against {srv} (~60 s) ...", flush=True)
                perf[srv] = check_perf(server.endpoint)
                print(f"  etcdctl check datascale --load=s against {srv} ...", flush=True)
                perf[srv + " datascale"] = check_datascale(server.endpoint, server.metrics_url)
                for name in (srv, srv + " datascale"):
                    for line in perf[name]["summary"]:
                        print(f"    {line}", flush=True)
    finally:
        try:
            for srv, server in started.items():
                server.stop()
                print(f"  stopped {srv} (pid {server.pid})", flush=True)
        finally:
            if pool:
                pool.close()
            shutil.rmtree(tmp, ignore_errors=True)

    elapsed = time.monotonic() - t_begin
    other = [r["other_cpu_pct"] for r in rows if r.get("other_cpu_pct") is not None]
    meta.update(elapsed_s=elapsed, other_cpu_pct_median=statistics.median(other) if other else 0.0,
                other_cpu_pct_max=max(other) if other else 0.0)
    md = report.table(rows)
    print()
    print(report.summary(rows))
    print()
    print(f"Note: {report.NOTE} 'other CPU %' is what the rest of the machine used during the measured "
          f"window (percent of one core; 200 = both cores): median {meta['other_cpu_pct_median']:.0f} %, "
          f"max {meta['other_cpu_pct_max']:.0f} %. Every row: the JSON's table_md.")
    for srv, p in perf.items():
        print(f"etcdctl check {'datascale' if srv.endswith('datascale') else 'perf'} --load=s, "
              f"{srv.split()[0]}: " + " | ".join(p["summary"]))
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / stamp
    report.write_json(stem.with_suffix(".json"), {"meta": meta, "rows": rows, "check_perf": perf, "table_md": md,
                                                  "summary_md": report.summary(rows)})
    pngs = report.plots(rows, stem)
    print(f"results: {stem.with_suffix('.json')}" + "".join(f", {p}" for p in pngs) + f"  ({elapsed:.0f} s)")
    if publishable(args, servers):
        kept = report.publish(stem, pngs, args.out / LATEST, meta, md, perf, rows)
        print(f"kept as the latest quick run (tracked in git): {', '.join(str(p) for p in kept)}")
    return 0


def publishable(args, servers: list[str]) -> bool:
    """Only a complete, default quick run replaces the results kept in the repository."""
    return (args.quick and not args.tiny and not args.only and not args.duration and not args.total
            and args.grpc_server == ServerConfig.grpc_server
            and servers == list(report.SERVER_ORDER) and args.out.resolve() == RESULTS.resolve())
