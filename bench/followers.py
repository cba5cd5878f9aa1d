"""python -m bench.followers [--quick|--tiny]: reads, watches and keep-alives
served by 1, 2 and 4 processes per partition (issue 17), with etcd beside.

Deployments, one after the other, on 127.0.0.1 with free ports, stopped by PID:

  etcd          single etcd 3.5.1, data dir on disk
  shardetcd-1   shardetcd on JetStream R1 (one NATS server, to leave the CPU to the
                servers): the writer only
  shardetcd-2   the same writer + 1 follower (`--follow`)
  shardetcd-4   the same writer + 3 followers

The shardetcd rows share one NATS server and one writer: followers are added
(1, then 2 more) between the rows, so a row's processes are all that serve.

Each row gets the same load through etcd's own benchmark tool (--tool PATH,
$SHARDETCD_BENCHMARK_TOOL, else ../shared/bin), given every serving endpoint
in --endpoints: the tool dials connection i to endpoint i % n, so the same
total clients and connections are spread evenly over the serving processes:

  range-s          Range of one key, serializable (served from the process's own state)
  range-l          Range of one key, linearizable (a follower asks the writer's committed
                   revision, shared by every read waiting for it, and reads at it)
  watch-fanout     the tool's watch: 8 streams over 4 connections, 12 watchers each, of one
                   key; one client puts as fast as it can (a follower forwards its puts);
                   req/s = events received/s
  lease-keepalive  the tool's lease-keepalive: 64 clients over 8 connections, each grants a
                   lease and renews it with KeepAliveOnce in a loop (a follower coalesces:
                   it answers a lease it renewed recently at once and renews at the writer
                   every 0.5 s)

For watch-fanout with followers, the followers' own measure of how far behind
the writer they apply: each follower's /metrics histogram
shardetcd_follower_apply_lag_seconds (per journal message, from when JetStream
stored it to when the follower had applied every revision in it), the
difference over the run, summed over the followers: p50/p99 estimated within
the histogram's buckets (as Prometheus' histogram_quantile does).

Per row: req/s, p50/p99 (not for watch-fanout: the tool's watch times nothing), server CPU summed over the serving processes (µs per
request, and each process's % of one core), the NATS server's CPU per request
apart, other CPU %, and ratios × one process (shardetcd-1) and × etcd.

This machine has few cores (2 when written), shared by the load generator,
NATS and up to 4 server processes: more serving processes cannot add
throughput past the cores there are. Read the CPU µs per request to see what
one process costs per request; bench/README.md turns that into a model for
more cores.
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
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg

from . import etcdtool, machine, report, runargs, scenarios as sc
from .replicated import nats_version
from tests.etcd_fixture import free_ports

from .servers import _DefaultShardetcd, cpu_seconds, start_real_etcd, start_shardetcd_default

RESULTS = runargs.RESULTS
LATEST = "latest-followers"
CONFIGS = ("etcd", "shardetcd-1", "shardetcd-2", "shardetcd-4")
ONE = "shardetcd-1"
NOTE = ("Load generator, the NATS server and every serving process share this machine's cores (loopback only): "
        "with more processes than cores, more processes cannot add throughput; read the server CPU µs per request.")


def _point(clients: int, conns: int, tiny: int, quick: int, full: int, *flags: str) -> sc.Point:
    return sc.Point(clients, conns, (tiny, quick, full), flags)


# (scenario of bench/scenarios.py, point): connections are multiples of 4, so that every serving
# endpoint gets the same share
# (tiny range-s: enough requests that each of 4 processes runs for several of the kernel's 10 ms CPU
# ticks, which the smoke test reads to see that every process served)
POINTS = [("range-s", _point(64, 8, 5_000, 10_000, 50_000)),
          ("range-l", _point(64, 8, 500, 10_000, 50_000)),
          ("watch-fanout", _point(4, 4, 20, 1_000, 3_000, "--streams", "8", "--watch-per-stream", "12")),
          ("lease-keepalive", _point(64, 8, 500, 10_000, 50_000))]


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.followers", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10,000 requests (1,000 puts for watch-fanout) per run")
    ap.add_argument("--tiny", action="store_true",
                    help="smoke run: a few hundred requests per run; its figures mean nothing")
    runargs.add_tool(ap)
    runargs.add_quiet(ap)
    runargs.add_out(ap)
    return ap.parse_args(argv)


# ------------------------------------------------------------------ deployments


@dataclass
class Serving:
    """What serves one row: endpoints (the writer, or etcd, first) and the PIDs to charge."""
    name: str
    endpoints: list[str]
    serving_pids: dict[str, int]  # role -> pid of each serving process
    other_pids: dict[str, int]  # role -> pid of processes that do not serve clients (the NATS server)
    version: str
    describe: str
    follower_metrics: list[str] = field(default_factory=list)  # the followers' /metrics base URLs


class ShardetcdOnJetStream:
    """One NATS server (JetStream, R1), a writer, and followers added on demand."""

    def __init__(self, tmp: Path) -> None:
        from tests.nats_fixture import start_nats_cluster

        self.base = tmp / "shardetcd-js-r1"
        self.nats = start_nats_cluster(self.base / "nats", size=1)
        self.js_args = ("--journal-url", self.nats.urls, "--journal-replicas", "1")
        self.writer = None
        self.followers: list[_DefaultShardetcd] = []
        try:
            self.writer = start_shardetcd_default(self.base / "w", self.js_args, "journal on JetStream R1")
        except BaseException:
            self.nats.stop()
            raise
        self.version = f"shardetcd, journal on JetStream R1 (nats-server {nats_version()})"

    def grow(self, processes: int) -> None:
        """Start followers until `processes` serve (the writer + processes-1 followers)."""
        while 1 + len(self.followers) < processes:
            d = self.base / f"f{len(self.followers) + 1}"
            f = _DefaultShardetcd(data_dir=d / "data", state_dir=d / "unused", port=0,
                                  log_path=d / "shardetcd.log", extra_args=(*self.js_args, "--follow"), timeout=120)

            f.port, f.metrics_port = free_ports(2)
            self.followers.append(f)
            f.start()

    def serving(self, processes: int) -> Serving:
        self.grow(processes)
        procs = [self.writer.process, *self.followers[:processes - 1]]
        roles = ["writer"] + [f"follower {i + 1}" for i in range(processes - 1)]
        return Serving(f"shardetcd-{processes}", [p.endpoint for p in procs],
                       {r: p.pid for r, p in zip(roles, procs)},
                       {f"nats {s.name}": s.pid for s in self.nats.servers if s.running()}, self.version,
                       "shardetcd on JetStream R1 (one NATS server): the writer" +
                       (f" + {processes - 1} follower{'s' if processes > 2 else ''}" if processes > 1 else " only"),
                       [f"http://127.0.0.1:{f.metrics_port}" for f in self.followers[:processes - 1]])

    # WARNING lines every start logs (not problems)
    ROUTINE = ("msg=writer lease acquired", "msg=following the writer's journals")

    def problems(self) -> dict[str, list[str]]:
        """WARNING/ERROR lines of the writer and followers' logs (what they reported while serving),
        but for the routine start lines."""
        out = {}
        for role, p in [("writer", self.writer.process), *((f"follower {i + 1}", f) for i, f in enumerate(self.followers))]:
            text = p.log_tail(100_000)
            bad = [x for x in text.splitlines() if ("level=ERROR" in x or "level=WARNING" in x or "Traceback" in x)
                   and not any(m in x for m in self.ROUTINE)]
            if bad:
                out[role] = bad[-20:]
        return out

    def stop(self) -> None:
        try:
            for f in reversed(self.followers):
                f.stop(grace=15)
                shutil.rmtree(f.default_state_dir(), ignore_errors=True)
            if self.writer is not None:
                self.writer.stop()
        finally:
            self.nats.stop()


def wait_visible(endpoints: list[str], key: bytes, timeout: float = 60.0) -> None:
    """Until every endpoint serves `key` in a serializable Range (a follower may lag)."""
    deadline = time.monotonic() + timeout
    for ep in endpoints:
        with grpc.insecure_channel(ep) as ch:
            rng = pbg.KVStub(ch).Range
            while not rng(pb.RangeRequest(key=key, serializable=True), timeout=10).kvs:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{ep} does not serve {key!r} within {timeout:.0f} s of the put")
                time.sleep(0.05)


# ------------------------------------------------------------------ runs


LAG_METRIC = "shardetcd_follower_apply_lag_seconds"


def lag_histogram(metrics_urls: list[str]) -> dict[float, float]:
    """The followers' apply-lag histograms summed: upper bound (s) -> cumulative count."""
    import urllib.request

    total: dict[float, float] = {}
    for url in metrics_urls:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(LAG_METRIC + "_bucket{"):
                    le = line.split('le="', 1)[1].split('"', 1)[0]
                    bound = float("inf") if le == "+Inf" else float(le)
                    total[bound] = total.get(bound, 0.0) + float(line.rsplit(" ", 1)[1])
    return total


def histogram_quantile(q: float, before: dict[float, float], after: dict[float, float]) -> float | None:
    """The q-quantile of what was observed between two scrapes, linear within a bucket
    (Prometheus' histogram_quantile); None if nothing was observed."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return None
    rank = q * counts[-1]
    lower, below = 0.0, 0.0
    for bound, cum in zip(bounds, counts):
        if cum >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * ((rank - below) / (cum - below) if cum > below else 0.0)
        lower, below = bound, cum
    return lower


def run_point(tool: Path, srv: Serving, name: str, p: sc.Point, mode: str) -> dict:
    s = sc.by_name()[name]
    pids = {**srv.serving_pids, **srv.other_pids}
    lag_urls = srv.follower_metrics if name == "watch-fanout" else []
    lag_before = lag_histogram(lag_urls) if lag_urls else {}
    row = etcdtool.run(tool, ",".join(srv.endpoints), s, p, p.requests(mode), list(srv.serving_pids.values()),
                       on_window=lambda: {role: cpu_seconds(pid) for role, pid in pids.items()})
    if lag_urls:
        lag_after = lag_histogram(lag_urls)
        row["follower_apply_lag"] = {
            "messages": lag_after.get(float("inf"), 0.0) - lag_before.get(float("inf"), 0.0),
            "p50_ms": _ms(histogram_quantile(0.5, lag_before, lag_after)),
            "p99_ms": _ms(histogram_quantile(0.99, lag_before, lag_after))}
    if not s.latency:
        row.update(p50_ms=None, p90_ms=None, p99_ms=None, p999_ms=None)
    a, b = row.pop("window")
    wall = row["wall_s"]
    by_proc = {r: (b[r] - a[r]) / wall * 100 for r in srv.serving_pids}
    other = sum(b[r] - a[r] for r in srv.other_pids)
    n = max(row["n"], 1)
    row.update(scenario=name, server=srv.name, processes=len(srv.endpoints), clients=p.clients, conns=p.conns,
               srv_cpu_pct_by_process=by_proc, nats_cpu_pct=other / wall * 100, nats_cpu_us=other / n * 1e6)
    row["other_cpu_pct"] = max(0.0, row["other_cpu_pct"] - other / wall * 100)  # NATS is not "the rest"
    if name == "watch-fanout":
        streams, per = p.flags[1], p.flags[3]
        row["clients_label"] = f"{int(streams) * int(per)} watchers/{streams} streams/{p.conns} conns"
    else:
        row["clients_label"] = f"{p.clients}/{p.conns} conns"
    return row


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def ratios(rows: list[dict]) -> None:
    """× one process (shardetcd-1) and × etcd, of the same scenario in this run."""
    ref = {(r["scenario"], r["server"]): r for r in rows}
    for r in rows:
        for key, name in (("x_one", ONE), ("x_etcd", "etcd")):
            base = ref.get((r["scenario"], name))
            own = key == "x_one" and r["server"] == "etcd"  # × one process: shardetcd's rows only
            r[key] = r["req_s"] / base["req_s"] if base and base["req_s"] and base is not r and not own else None


# ------------------------------------------------------------------ tables


def _x(v) -> str:
    return f"{v:.2f}×" if v is not None else ""


def table(rows: list[dict]) -> str:
    head = ["scenario", "clients", "server", "processes", "req/s", "p50 ms", "p99 ms", "srv CPU µs/req",
            "srv CPU % per process", "NATS CPU µs/req", "other CPU %", "× 1 process", "× etcd",
            "follower apply lag p50/p99 ms", "errors"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        per = " / ".join(f"{v:.0f}" for v in r["srv_cpu_pct_by_process"].values())
        errs = sum(r.get("errors", {}).values()) + (1 if r.get("timed_out") else 0)
        lines.append("| " + " | ".join([
            r["scenario"], r["clients_label"], r["server"], str(r["processes"]), report._thr(r["req_s"]),
            report._f(r.get("p50_ms")), report._f(r.get("p99_ms")), report._f(r.get("srv_cpu_us"), "{:.0f}"), per,
            report._f(r.get("nats_cpu_us"), "{:.0f}") if r["server"] != "etcd" else "", report._f(r.get("other_cpu_pct"), "{:.0f}"),
            _x(r.get("x_one")), _x(r.get("x_etcd")), _lag(r), str(errs) if errs else ""]) + " |")
    return "\n".join(lines)


def _lag(r: dict) -> str:
    lag = r.get("follower_apply_lag")
    if not lag or lag.get("p50_ms") is None:
        return ""
    return f"{lag['p50_ms']:.1f} / {lag['p99_ms']:.1f}"


def summary(rows: list[dict]) -> str:
    """One line per server; each scenario: req/s (× 1 process, × etcd), p99 ms, server CPU µs/req."""
    scen = list(dict.fromkeys(r["scenario"] for r in rows))
    index = {(r["scenario"], r["server"]): r for r in rows}
    head = ["server"] + scen
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for srv in CONFIGS:
        if not any(k[1] == srv for k in index):
            continue
        cells = [srv]
        for s in scen:
            r = index.get((s, srv))
            if not r:
                cells.append("")
                continue
            xs = [x for x in (_x(r.get("x_one")) if srv not in ("etcd", ONE) else "",
                              _x(r.get("x_etcd")) + " etcd" if srv != "etcd" else "") if x]
            cells.append(f"{report._thr(r['req_s'])}" + (f" ({', '.join(xs)})" if xs else "")
                         + (f"; p99 {report._f(r['p99_ms'], '{:.1f}')} ms" if r.get("p99_ms") is not None else "")
                         + f"; {report._f(r.get('srv_cpu_us'), '{:.0f}')} µs")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(meta: dict, rows: list[dict]) -> str:
    servers = "\n".join(f"- **{k}**: {v['describe']} ({v['version']})" for k, v in meta["servers"].items())
    tool = meta["tool"]["describe"]
    problems = meta.get("log_problems") or {}
    prob = ("\n".join(f"- {role}: {len(lines)} WARNING/ERROR lines, last: `{lines[-1][:300]}`" for role, lines in problems.items())
            if problems else "none")
    return "\n".join([
        f"# `python -m bench.followers{'' if meta['mode'] == 'full' else ' --' + meta['mode']}` ({meta['timestamp']})", "",
        f"Machine: {machine.one_line(meta['machine'])}; grpcio {meta['grpcio']}. Load: {tool}, the "
        f"requests per run in `meta.points`; other CPU while measuring (the rest of the machine, % of one core; the NATS "
        f"server not included): median {meta['other_cpu_pct_median']:.0f} %, max {meta['other_cpu_pct_max']:.0f} %.", "",
        servers, "", NOTE, "",
        "The same total clients in every row, spread evenly over the serving endpoints. *srv CPU* is summed over the "
        "serving processes (etcd; the writer and its followers) per request (watch-fanout: per delivered event); "
        "*srv CPU % per process* is each one's share of one core over the window (writer first); *NATS CPU* is the "
        "NATS server's, apart; *follower apply lag* (watch-fanout with followers): per journal message, from when "
        "JetStream stored it to when a follower had applied it, from the followers' /metrics histogram "
        "(bucket-interpolated).", "",
        "## Summary", "", "Each cell: req/s (× 1 process, × etcd); p99; server CPU µs per request.", "", summary(rows), "",
        "## Every row", "", table(rows), "",
        f"WARNING/ERROR lines in the shardetcd logs: {prob}", "",
        f"Reproduce: `python -m bench.followers{'' if meta['mode'] == 'full' else ' --' + meta['mode']}` from the "
        f"repository root (took {meta['elapsed_s']:.0f} s).", ""])


# ------------------------------------------------------------------ main


def main(argv=None) -> int:
    args = parse_args(argv)
    args.quick = args.quick or args.tiny
    mode = runargs.mode_of(args)
    tool = runargs.tool_or_exit(args, "python -m bench.followers")
    points = POINTS
    quiet_wait = runargs.quiet_wait_s(args, mode)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    tmp = Path(tempfile.mkdtemp(prefix="shardetcd-bench-followers-"))
    total = len(CONFIGS) * len(points)
    print(f"bench.followers: {mode} mode, {total} runs, {','.join(CONFIGS)}; {os.cpu_count()} cores shared by the "
          f"load generator, NATS and every serving process; data under {tmp}", flush=True)
    meta: dict = {"timestamp": stamp, "mode": mode, "cores": os.cpu_count(), "python": platform.python_version(),
                  "grpcio": grpc.__version__, "note": NOTE,
                  "tool": {"path": str(tool), "describe": etcdtool.describe(tool)}, "servers": {},
                  "points": [{"scenario": n, "clients": p.clients, "conns": p.conns, "flags": p.flags,
                              "requests": p.requests(mode)} for n, p in points],
                  "machine": machine.describe(tmp)}
    print(f"  machine: {machine.one_line(meta['machine'])}", flush=True)
    rows: list[dict] = []
    t_begin = time.monotonic()
    done = 0

    log = runargs.progress(t_begin)

    def wait_quiet() -> None:
        runargs.wait_quiet(quiet_wait, args.quiet_below)

    def run_all(srv: Serving) -> None:
        nonlocal done
        meta["servers"][srv.name] = {"version": srv.version, "describe": srv.describe, "endpoints": srv.endpoints}
        log(f"serving {srv.name}: {srv.endpoints} (pids {srv.serving_pids}, other {srv.other_pids})")
        etcdtool.seed_range_key(srv.endpoints[0], sc.RANGE_KEY, sc.VAL_SIZE)  # through the writer
        wait_visible(srv.endpoints, sc.RANGE_KEY.encode())
        for name, p in points:
            wait_quiet()
            r = run_point(tool, srv, name, p, mode)
            rows.append(r)
            done += 1
            errs = sum(r.get("errors", {}).values())
            log(f"{done:>2}/{total} {name:<16} {r['clients_label']:<34} {srv.name:<12} {report._thr(r['req_s']):>7} req/s  "
                f"p50 {report._f(r['p50_ms']):>6} ms  p99 {report._f(r['p99_ms']):>7} ms  "
                f"srv {report._f(r.get('srv_cpu_us'), '{:.0f}'):>5} µs/req  other CPU {report._f(r.get('other_cpu_pct'), '{:.0f}')}%"
                + (f"  follower apply lag p50/p99 {_lag(r)} ms" if _lag(r) else "")
                + (f"  errors {r['errors']}" if errs else "") + ("  TIMED OUT" if r.get("timed_out") else ""))

    try:
        etcd = start_real_etcd(tmp / "etcd")
        try:
            run_all(Serving("etcd", [etcd.endpoint], {"etcd": etcd.pid}, {}, etcd.version, "single etcd 3.5.1, data dir on disk"))
        finally:
            etcd.stop()
            log("stopped etcd")
        js = ShardetcdOnJetStream(tmp)
        try:
            for n in (1, 2, 4):
                run_all(js.serving(n))
            meta["log_problems"] = js.problems()
        finally:
            js.stop()
            log("stopped shardetcd (writer, followers) and NATS")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    ratios(rows)
    elapsed = time.monotonic() - t_begin
    other = [r["other_cpu_pct"] for r in rows if r.get("other_cpu_pct") is not None]
    meta.update(elapsed_s=elapsed, other_cpu_pct_median=statistics.median(other) if other else 0.0,
                other_cpu_pct_max=max(other) if other else 0.0)
    md = table(rows)
    print()
    print(md)
    print()
    print(summary(rows))
    for role, lines in (meta.get("log_problems") or {}).items():
        print(f"\n{role}: {len(lines)} WARNING/ERROR lines in its log, last:\n  " + "\n  ".join(x[:300] for x in lines[-3:]))
    print(f"\nNote: {NOTE}")
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"followers-{stamp}"
    report.write_json(stem.with_suffix(".json"), {"meta": meta, "rows": rows, "table_md": md, "summary_md": summary(rows)})
    stem.with_suffix(".md").write_text(markdown(meta, rows))
    print(f"results: {stem.with_suffix('.json')}, {stem.with_suffix('.md')}  ({elapsed:.0f} s)")
    if publishable(args):
        for ext in (".json", ".md"):
            shutil.copyfile(stem.with_suffix(ext), args.out / (LATEST + ext))
        print(f"kept as the latest quick followers run (tracked in git): {args.out / LATEST}.{{json,md}}")
    return 0


def publishable(args) -> bool:
    """Only a default quick run replaces the results kept in the repository."""
    return args.quick and not args.tiny and args.out.resolve() == RESULTS.resolve()


if __name__ == "__main__":
    runargs.run(main)
