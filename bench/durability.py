"""python -m bench.durability [--quick|--tiny]: what durability costs, in one run.

The same scenarios and load generators as `python -m bench` (put-seq and
txn-put at 1 client on 1 connection and 64 clients on 8, driven by etcd's
benchmark tool; the k8s mix, driven by the Python generator) against every
way of making a write durable, all on 127.0.0.1 (see bench/replicated.py):

  etcd                  single etcd 3.5.1
  etcd-3                a 3-member etcd 3.5.1 cluster, load on the leader: the reference for
                        replicated durability
  shardetcd-local       shardetcd, local journal, fdatasync per group commit (its default)
  shardetcd-js-r1       shardetcd, journals on JetStream, one NATS server
  shardetcd-js-r3       shardetcd, journals on JetStream, three NATS servers (R3)
  shardetcd-js-r3-sync  the same with NATS fsyncing before each ack (not JetStream's default)

Per run: req/s, p50/p99, server-side CPU per request (summed over every
server process: etcd members, shardetcd, NATS servers), and the bytes
written to disk per write: /proc/<pid>/io write_bytes of every process that
persists, over the measured window, divided by the writes acknowledged in it.
Ratios are to etcd-3 and to single etcd of the same run. Then the takeover
time, kill -9 to the first acknowledged write: etcd-3's leader, and
shardetcd-js-r3's writer with a --standby waiting.

Every process here (load generator, 3 etcd members, 3 NATS servers,
shardetcd) shares this machine's cores: replication on loopback costs CPU
the servers would otherwise use, unlike members on machines of their own.
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

from . import etcdtool, machine, report, runargs, scenarios as sc
from .cli import make_job, point_label, prepare
from .loadgen import Pool
from .replicated import DEPLOYMENTS, LEASE_TTL_S, Deployment, io_bytes
from .servers import busy_seconds, cpu_seconds

RESULTS = runargs.RESULTS
LATEST = "latest-durability"
SERVER_ORDER = tuple(DEPLOYMENTS)
TINY_SERVERS = ("etcd", "etcd-3", "shardetcd-local", "shardetcd-js-r1", "shardetcd-js-r3")
REFS = ("etcd-3", "etcd")  # ratios are to these
ONE = sc.Point(1, 1, (100, 2_000, 10_000))  # requests the tool sends per mode (tiny, quick, full)
MANY = sc.Point(64, 8, (None, 5_000, 50_000))
K8S = sc.Point(34, 4, (1, 1, 1), label="34 clients/4 conns")
POINTS = [("put-seq", ONE), ("put-seq", MANY), ("txn-put", ONE), ("txn-put", MANY), ("k8s-mix", K8S)]
TINY_POINTS = [(name, p) for name, p in POINTS if p.requests("tiny")]
K8S_WRITES = ("heartbeat", "pod-create", "pod-update", "pod-delete", "event")  # the mix's write calls
TAKEOVER_WRITE_S = {"tiny": 0.5, "quick": 1.5, "full": 3.0}  # writing before the kill
NOTE = ("Load generator and every server process (etcd members, NATS servers, shardetcd) share the same "
        "cores, loopback only: replication here costs CPU the writer would otherwise have, and all members fsync "
        "to the same disk.")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.durability", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2.5 s runs, 3 takeovers each (≈ 5 min)")
    ap.add_argument("--tiny", action="store_true",
                    help="smoke run: 1 client points only, 0.5 s runs, a small k8s mix, one takeover each, "
                         f"servers {','.join(TINY_SERVERS)}; its figures mean nothing")
    ap.add_argument("--servers", default=None, help=f"comma-separated, of {','.join(SERVER_ORDER)} (default: all; --tiny: "
                                                    f"{','.join(TINY_SERVERS)})")
    ap.add_argument("--takeovers", type=int, default=None, help="kill -9 repeats per replicated server (default 1 tiny, 3 quick, 5 full)")
    ap.add_argument("--workers", type=int, default=sc.WORKERS, help="Python load-generator processes (default 2)")
    runargs.add_tool(ap)
    runargs.add_quiet(ap)
    runargs.add_out(ap)
    return ap.parse_args(argv)


def write_count(kind: str, rows: list[dict]) -> int:
    """Writes acknowledged in the window: every request of a put/txn run, the write calls of the k8s mix."""
    if kind == "k8s":
        return sum(r["n"] for r in rows if r.get("op") in K8S_WRITES)
    return rows[0]["n"]


def run_point(pool: Pool, tool, dep: Deployment, s: sc.Scenario, point: sc.Point, timing: sc.Timing, mode: str,
              setup: dict, workers: int) -> list[dict]:
    io: list[dict[str, tuple[int, int]]] = []

    def on_window(worker_pids: list[int] = ()) -> tuple[float, float, float]:
        pids = dep.pids()
        io.append({role: io_bytes(pid) for role, pid in pids.items()})
        return sum(cpu_seconds(p) for p in pids.values()), sum(cpu_seconds(p) for p in worker_pids), busy_seconds()

    if s.driver == "tool":
        rows = [etcdtool.run(tool, dep.endpoint, s, point, point.requests(mode), list(dep.pids().values()),
                             on_window=on_window)]
        rows[0].pop("window")
        n_workers = 0
    else:
        job = make_job(s, point, dep.endpoint, timing, mode, setup)
        n_workers = 1 if point.clients == 1 else workers
        results = pool.run(job, n_workers, on_window=on_window)
        rows = report.summarize(s.kind, results, job["duration"])
    label = point_label(s, point, setup)
    writes = write_count(s.kind, rows)
    (a, b) = io
    per_role = {role: b[role][0] - a[role][0] for role in b if role in a}
    cancelled = sum(b[role][1] - a[role][1] for role in b if role in a)
    for r in rows:
        r.update(scenario=s.name, server=dep.name, point=label, clients=point.clients, conns=point.conns,
                 generator=s.driver, workers=n_workers)
    main = rows[0]  # put/txn: the only row; k8s: "all writes+reads"
    main.update(writes=writes, disk_bytes=sum(per_role.values()), disk_bytes_by_process=per_role,
                disk_cancelled_bytes=cancelled,
                disk_bytes_per_write=sum(per_role.values()) / writes if writes else None)
    return rows


def takeover_summary(name: str, runs: list[dict]) -> dict:
    counted = [r for r in runs if r.get("valid", True)]
    took = [r["took_s"] for r in counted]
    out = {"server": name, "repeats": len(runs), "counted": len(counted),
           "median_s": statistics.median(took) if took else None, "max_s": max(took) if took else None,
           "each_s": [r["took_s"] for r in runs], "each_counted": [r.get("valid", True) for r in runs], "runs": runs}
    for r in runs:  # a standby's phases, from its log
        if "lease_s" in r and "recovered_s" in r:
            r["recovery_s"] = r["recovered_s"] - r["lease_s"]
    for key in ("lease_s", "recovery_s", "records_replayed"):
        vals = [r[key] for r in counted if r.get(key) is not None]
        if vals:
            out[f"{key}_median"] = statistics.median(vals)
    return out


# ------------------------------------------------------------------ tables


def _ratio(a, b, key: str) -> str:
    return f"{a[key] / b[key]:.2f}" if a and b and a.get(key) and b.get(key) and a is not b else ""


def table(rows: list[dict]) -> str:
    """One line per scenario point × server (the k8s mix: its total), with ratios to etcd-3 and etcd."""
    main = [r for r in rows if r.get("op") in (None, "all writes+reads")]
    index = {(r["scenario"], r["point"], r["server"]): r for r in main}
    points = list(dict.fromkeys((r["scenario"], r["point"]) for r in main))
    head = ["scenario", "clients/conns", "server", "req/s", "p50 ms", "p99 ms", "srv CPU µs/req", "disk B/write",
            "other CPU %", "vs etcd-3 req/s", "vs etcd-3 p99", "vs etcd req/s", "vs etcd p99"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for scen, point in points:
        refs = [index.get((scen, point, ref)) for ref in REFS]
        for srv in SERVER_ORDER:
            r = index.get((scen, point, srv))
            if not r:
                continue
            cells = [scen, point, srv, report._thr(r["req_s"]), report._f(r.get("p50_ms")), report._f(r.get("p99_ms")),
                     report._f(r.get("srv_cpu_us"), "{:.0f}"), report._f(r.get("disk_bytes_per_write"), "{:,.0f}"),
                     report._f(r.get("other_cpu_pct"), "{:.0f}")]
            for ref in refs:
                cells += [_ratio(r, ref, "req_s"), _ratio(r, ref, "p99_ms")]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(rows: list[dict]) -> str:
    """One line per server: each scenario point's req/s (× etcd-3's) and p99, and disk bytes per put.
    The bench README's durability table is this table."""
    main = [r for r in rows if r.get("op") in (None, "all writes+reads")]
    index = {(r["scenario"], r["point"], r["server"]): r for r in main}
    points = list(dict.fromkeys((r["scenario"], r["point"]) for r in main))
    servers = [s for s in SERVER_ORDER if any(k[2] == s for k in index)]
    def name(scen: str, point: str) -> str:
        n = point.split("/")[0]
        return scen if scen == "k8s-mix" else f"{scen}, {n} client{'s' if n != '1' else ''}"

    head = ["server"] + [name(scen, point) for scen, point in points] + ["disk B/put (put-seq)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for srv in servers:
        cells = [srv]
        for scen, point in points:
            r, ref = index.get((scen, point, srv)), index.get((scen, point, "etcd-3"))
            if not r:
                cells.append("")
                continue
            ratio = f" ({r['req_s'] / ref['req_s']:.2f}×)" if ref and ref["req_s"] and srv != "etcd-3" else ""
            cells.append(f"{report._thr(r['req_s'])}{ratio}, {report._f(r.get('p99_ms'), '{:.1f}')}")
        disk = [report._f(index[k].get("disk_bytes_per_write"), "{:,.0f}") for k in index if k[0] == "put-seq" and k[2] == srv]
        cells.append(" / ".join(disk))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def takeover_table(takeovers: list[dict]) -> str:
    head = ["server", "killed (kill -9)", "first acknowledged write via", "repeats", "median s", "max s", "each s",
            "standby: lease taken at s", "standby: recovery s", "records replayed"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    what = {"etcd-3": ("the leader", "the 2 surviving members"), "shardetcd-js-r3": ("the writer", "the --standby")}
    flagged = False
    for t in takeovers:
        killed, via = what.get(t["server"], ("?", "?"))
        each = ", ".join(f"{x:.2f}" + ("" if ok else "*") for x, ok in zip(t["each_s"], t["each_counted"]))
        flagged |= not all(t["each_counted"])
        phases = [report._f(t.get("lease_s_median")), report._f(t.get("recovery_s_median")),
                  report._f(t.get("records_replayed_median"), "{:,.0f}")]
        lines.append("| " + " | ".join([t["server"], killed, via, str(t["repeats"]), report._f(t["median_s"]),
                                        report._f(t["max_s"]), each, *phases]) + " |")
    if flagged:
        lines += ["", "\\* not counted in median/max: the standby held the writer lease before the kill (the writer "
                      "had lost it), so this was no takeover from the kill."]
    return "\n".join(lines)


def markdown(meta: dict, rows: list[dict], md: str, tk: str) -> str:
    servers = "\n".join(f"- **{k}**: {v['describe']} ({v['version']})" for k, v in meta["servers"].items())
    t = meta["timing"]
    return "\n".join([
        f"# `python -m bench.durability{'' if meta['mode'] == 'full' else ' --' + meta['mode']}` ({meta['timestamp']})", "",
        f"Machine: {machine.one_line(meta['machine'])}; grpcio {meta['grpcio']}. "
        f"Runs: {t['warmup_s']} s warm-up + {t['duration_s']} s measured; other CPU while measuring "
        f"(the rest of the machine, % of one core): median {meta['other_cpu_pct_median']:.0f} %, max {meta['other_cpu_pct_max']:.0f} %.", "",
        servers, "", NOTE, "",
        "*srv CPU* is summed over every server process (etcd members, NATS servers, shardetcd). *disk B/write* is "
        "/proc/<pid>/io write_bytes of those processes over the measured window divided by the writes acknowledged "
        "in it (k8s-mix: its heartbeat, pod and event writes): page-granular (a 256-byte append fsync'd alone costs "
        "4 KiB), tmpfs not counted, the filesystem's own journal not included.", "",
        "## Summary", "", "Each cell: req/s (× etcd-3's req/s), p99 ms; the last column: disk bytes per put at 1 / 64 "
        "clients.", "", summary(rows), "",
        "## Throughput, latency, bytes written", "", md, "",
        "## Takeover: kill -9 to the first acknowledged write", "", tk, "",
        f"Each repeat kills under 8 writing clients ({meta['takeover_write_s']} s of writes first) and probes with a Put "
        "every 20 ms per probed endpoint. etcd-3: the leader (Maintenance.Status), restarted on its data dir before the "
        f"next repeat. shardetcd-js-r3: the writer, with a --standby waiting on the writer lease (TTL "
        f"{meta['shardetcd_lease_ttl_s']:.0f} s, renewed every TTL/3); the standby follows the streams while it waits, so at "
        "takeover it only fences them and applies what came meanwhile (*records replayed*: read at takeover), and it is "
        "the writer of the next repeat.", "",
        f"Reproduce: `python -m bench.durability{'' if meta['mode'] == 'full' else ' --' + meta['mode']}` from the "
        f"repository root (took {meta['elapsed_s']:.0f} s).", ""])


# ------------------------------------------------------------------ main


def main(argv=None) -> int:
    args = parse_args(argv)
    args.quick = args.quick or args.tiny
    mode = runargs.mode_of(args)
    timing = sc.TINY if args.tiny else sc.QUICK if args.quick else sc.FULL
    servers = [s for s in (args.servers or ",".join(TINY_SERVERS if args.tiny else SERVER_ORDER)).split(",") if s]
    bad = [s for s in servers if s not in DEPLOYMENTS]
    if bad:
        raise SystemExit(f"unknown server(s) {bad}; known: {list(DEPLOYMENTS)}")
    servers = [s for s in SERVER_ORDER if s in servers]
    table_of = sc.by_name()
    points = [(table_of[name], p) for name, p in (TINY_POINTS if args.tiny else POINTS)]
    tool = runargs.tool_or_exit(args, "python -m bench.durability")
    repeats = args.takeovers if args.takeovers is not None else {"tiny": 1, "quick": 3, "full": 5}[mode]
    quiet_wait = runargs.quiet_wait_s(args, mode)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    tmp = Path(tempfile.mkdtemp(prefix="shardetcd-bench-durability-"))
    total = len(servers) * len(points)
    print(f"bench.durability: {mode} mode, {total} runs + takeovers ({repeats} each), servers {','.join(servers)}; "
          f"{os.cpu_count()} cores shared by the load generator and every server process; data under {tmp}", flush=True)
    meta: dict = {"timestamp": stamp, "mode": mode, "cores": os.cpu_count(), "python": platform.python_version(),
                  "grpcio": grpc.__version__, "note": NOTE, "workers": args.workers,
                  "timing": {"warmup_s": timing.warmup, "duration_s": timing.duration}, "takeover_repeats": repeats,
                  "takeover_write_s": TAKEOVER_WRITE_S[mode], "shardetcd_lease_ttl_s": LEASE_TTL_S, "servers": {},
                  "machine": machine.describe(tmp)}
    print(f"  machine: {machine.one_line(meta['machine'])}", flush=True)
    rows: list[dict] = []
    takeovers: list[dict] = []
    pool = Pool(args.workers)
    t_begin = time.monotonic()
    done = 0

    log = runargs.progress(t_begin)

    def wait_quiet() -> None:
        runargs.wait_quiet(quiet_wait, args.quiet_below)

    try:
        for name in servers:
            dep = DEPLOYMENTS[name](tmp)
            meta["servers"][name] = {"version": dep.version, "describe": dep.describe, "endpoint": dep.endpoint, **dep.meta}
            log(f"started {name}: {dep.version} on {dep.endpoint} (pids {dep.pids()})")
            try:
                prepared: dict[str, dict] = {}
                for s, point in points:
                    if s.name not in prepared:
                        prepared[s.name] = prepare(s, dep.endpoint, mode)
                    wait_quiet()
                    new = run_point(pool, tool, dep, s, point, timing, mode, prepared[s.name], args.workers)
                    rows += new
                    done += 1
                    r = new[0]
                    errs = sum(r.get("errors", {}).values())
                    log(f"{done:>2}/{total} {s.name:<8} {r['point']:<16.16} {name:<20} {report._thr(r['req_s']):>7} req/s  "
                        f"p50 {report._f(r['p50_ms']):>6} ms  p99 {report._f(r['p99_ms']):>7} ms  "
                        f"disk {report._f(r.get('disk_bytes_per_write'), '{:,.0f}'):>6} B/write  "
                        f"other CPU {report._f(r.get('other_cpu_pct'), '{:.0f}')}%" + (f"  errors {errs}" if errs else ""))
                if dep.takeover and repeats > 0:
                    takeovers.append(takeover_summary(name, dep.takeover(repeats, TAKEOVER_WRITE_S[mode], log)))
            finally:
                dep.stop()
                log(f"stopped {name}")
    finally:
        pool.close()
        shutil.rmtree(tmp, ignore_errors=True)

    elapsed = time.monotonic() - t_begin
    other = [r["other_cpu_pct"] for r in rows if r.get("other_cpu_pct") is not None]
    meta.update(elapsed_s=elapsed, other_cpu_pct_median=statistics.median(other) if other else 0.0,
                other_cpu_pct_max=max(other) if other else 0.0)
    md, tk = table(rows), takeover_table(takeovers)
    print()
    print(md)
    print()
    print(tk)
    print(f"\nNote: {NOTE}")
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"durability-{stamp}"
    report.write_json(stem.with_suffix(".json"), {"meta": meta, "rows": rows, "takeovers": takeovers,
                                                  "table_md": md, "takeover_md": tk})
    stem.with_suffix(".md").write_text(markdown(meta, rows, md, tk))
    print(f"results: {stem.with_suffix('.json')}, {stem.with_suffix('.md')}  ({elapsed:.0f} s)")
    if publishable(args, servers):
        for ext in (".json", ".md"):
            shutil.copyfile(stem.with_suffix(ext), args.out / (LATEST + ext))
        print(f"kept as the latest quick durability run (tracked in git): {args.out / LATEST}.{{json,md}}")
    return 0


def publishable(args, servers: list[str]) -> bool:
    """Only a complete, default quick run replaces the results kept in the repository."""
    return (args.quick and not args.tiny and args.takeovers is None and servers == list(SERVER_ORDER)
            and args.out.resolve() == RESULTS.resolve())


if __name__ == "__main__":
    runargs.run(main)
