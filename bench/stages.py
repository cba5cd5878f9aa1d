"""python -m bench.stages: where a write's and a read's CPU goes inside the server, stage
by stage, measured exactly (issue 16.6), beside the ceiling's.

    python -m bench.stages            # ≈ 1 min: put, txn-put and range-l at 1/1 and 64/8, txn-put at 1000/100
    python -m bench.stages --tiny     # a few hundred requests per load; figures mean little

Three servers on 127.0.0.1, stopped by PID: shardetcd as it ships, the same shardetcd
with its stages timed (bench/stages_server.py: the loop thread's own CPU clock around
each stage a Put, a Txn or a Range passes through, nested stages counted once), and the
ceiling (bench/ceiling.py). Each load runs on the three in turn, seconds apart, driven
by etcd's benchmark tool. Per request:

  * each stage's own CPU on the event-loop thread (the handler's checks, conversion
    and response; the store's MVCC row and index, journal record and commit
    bookkeeping; the journal's loop callbacks; garbage collection);
  * the loop thread's CPU outside the stages: the gRPC server (the native one's
    framing, or grpc.aio's Cython and C work with --grpc-server grpcio; the
    request's parse) and the event loop itself;
  * the other threads (the journal's writer; grpc's poller and C-core threads), from
    /proc/<pid>/task/<tid>/schedstat;
  * the same totals for shardetcd uninstrumented and for the ceiling, so that
    "shardetcd − ceiling" is read against the stages that make it up.

The timers cost about a microsecond a stage: the instrumented total is shown beside
the uninstrumented one. Unlike a sampling profiler (bench.profile, which needs the
standard asyncio loop to tell grpc's callbacks from the handler), this runs on the
servers' default loop, uvloop.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import tempfile
import time
from pathlib import Path

from . import etcdtool, machine, runargs, scenarios as sc
from .profile import thread_cpu
from .servers import Server, _DefaultShardetcd, start_ceiling, start_shardetcd_default
from .stages_server import stage_names

OUTSIDE = "loop thread outside the stages (gRPC server, event loop)"


def loads() -> list[tuple[str, sc.Scenario, sc.Point]]:
    """(label, scenario, point with requests per mode (tiny, quick, full))."""
    by = sc.by_name()
    return [
        ("put 1/1", by["put-seq"], sc.Point(1, 1, (200, 3_000, 10_000))),
        ("put 64/8", by["put-seq"], sc.Point(64, 8, (300, 10_000, 40_000))),
        ("txn-put 1/1", by["txn-put"], sc.Point(1, 1, (200, 3_000, 10_000))),
        ("txn-put 64/8", by["txn-put"], sc.Point(64, 8, (300, 10_000, 40_000))),
        ("txn-put 1000/100", by["txn-put"], sc.Point(1000, 100, (None, 10_000, 40_000))),
        ("range-l 64/8", by["range-l"], sc.Point(64, 8, (300, 10_000, 40_000))),
    ]


class _StagedShardetcd(_DefaultShardetcd):
    """shardetcd's defaults, served by bench.stages_server (its stages timed)."""

    module = "bench.stages_server"


def start_staged(tmp: Path, out: Path) -> Server:
    os.environ["SHARDETCD_STAGES_OUT"] = str(out)  # inherited by the server process
    server = start_shardetcd_default(tmp, describe="defaults, stages timed", process=_StagedShardetcd)
    server.name = "shardetcd-staged"
    return server


def read_stages(pid: int, out: Path, timeout_s: float = 10.0) -> dict[str, list[int]]:
    """Ask the staged server for its stages since the last ask (SIGUSR2) and read them."""
    out.unlink(missing_ok=True)
    os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + timeout_s
    while not out.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the staged server (pid {pid}) wrote no stages to {out}")
        time.sleep(0.02)
    return json.loads(out.read_text())


def split_threads(pid: int, before: dict, after: dict) -> tuple[float, float]:
    """(loop thread CPU s, other threads' CPU s) between two thread_cpu() readings."""
    loop = other = 0.0
    for tid, (_, on_cpu, _) in after.items():
        spent = on_cpu - before.get(tid, (None, 0.0, 0.0))[1]
        if tid == pid:
            loop += spent
        else:
            other += spent
    return loop, other


def measure(tool: Path, server: Server, s: sc.Scenario, point: sc.Point, total: int,
            stages_out: Path | None) -> dict:
    etcdtool.run(tool, server.endpoint, s, point, max(total // 5, 100), [server.pid])  # warm-up
    if stages_out is not None:
        read_stages(server.pid, stages_out)  # forget the warm-up
    before = thread_cpu(server.pid)
    row = etcdtool.run(tool, server.endpoint, s, point, total, [server.pid])
    after = thread_cpu(server.pid)
    n = max(row["n"], 1)
    loop, other = split_threads(server.pid, before, after)
    result = {"server": server.name, "req_s": row["req_s"], "requests": row["n"], "loop_us": loop / n * 1e6,
              "other_threads_us": other / n * 1e6, "total_us": (loop + other) / n * 1e6,
              "other_cpu_pct": row["other_cpu_pct"]}
    if stages_out is not None:
        stages = read_stages(server.pid, stages_out)
        result["stages_us"] = {name: ns / n / 1e3 for name, (ns, _) in stages.items()}
        result["stage_calls"] = {name: calls / n for name, (_, calls) in stages.items()}
        result["stages_us"][OUTSIDE] = result["loop_us"] - sum(ns for ns, _ in stages.values()) / n / 1e3
    return result


def table(rows: list[dict]) -> str:
    """Rows: stages and totals; columns: loads. Cells: µs of CPU per request."""
    labels = list(dict.fromkeys(r["load"] for r in rows))
    by = {(r["load"], r["server"]): r for r in rows}
    head = ["µs of server CPU per request"] + labels
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]

    def line(name: str, cell) -> None:
        lines.append("| " + " | ".join([name] + [cell(label) for label in labels]) + " |")

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:,.1f}"

    for stage in stage_names() + [OUTSIDE]:
        values = [by[(label, "shardetcd-staged")]["stages_us"].get(stage) for label in labels]
        if all(v is None or abs(v) < 0.05 for v in values):
            continue
        line(stage, lambda label: fmt(by[(label, "shardetcd-staged")]["stages_us"].get(stage)))
    line("**loop thread, stages timed**", lambda label: f"**{by[(label, 'shardetcd-staged')]['loop_us']:,.0f}**")
    line("other threads (journal writer; grpcio: poller and C core)",
         lambda label: f"{by[(label, 'shardetcd-staged')]['other_threads_us']:,.0f}")
    line("**shardetcd, stages timed: total** (req/s)",
         lambda label: f"**{by[(label, 'shardetcd-staged')]['total_us']:,.0f}** ({by[(label, 'shardetcd-staged')]['req_s']:,.0f})")
    line("**shardetcd as shipped: total** (req/s)",
         lambda label: f"**{by[(label, 'shardetcd')]['total_us']:,.0f}** ({by[(label, 'shardetcd')]['req_s']:,.0f})")
    line("shardetcd as shipped: loop thread / other threads",
         lambda label: f"{by[(label, 'shardetcd')]['loop_us']:,.0f} / {by[(label, 'shardetcd')]['other_threads_us']:,.0f}")
    line("**ceiling: total** (req/s)",
         lambda label: f"**{by[(label, 'ceiling')]['total_us']:,.0f}** ({by[(label, 'ceiling')]['req_s']:,.0f})")
    line("ceiling: loop thread / other threads",
         lambda label: f"{by[(label, 'ceiling')]['loop_us']:,.0f} / {by[(label, 'ceiling')]['other_threads_us']:,.0f}")
    line("shardetcd − ceiling (as shipped)",
         lambda label: f"{by[(label, 'shardetcd')]['total_us'] - by[(label, 'ceiling')]['total_us']:,.0f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.stages", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="a few hundred requests per load (harness check)")
    ap.add_argument("--full", action="store_true", help="4× the requests per load")
    runargs.add_tool(ap)
    runargs.add_out(ap)
    args = ap.parse_args(argv)
    mode = "tiny" if args.tiny else "full" if args.full else "quick"
    tool = runargs.tool_or_exit(args, "python -m bench.stages")
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    log = runargs.progress(time.monotonic())
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="shardetcd-stages-") as tmp_s:
        tmp = Path(tmp_s)
        meta = {"timestamp": stamp, "mode": mode, "tool": etcdtool.describe(tool), "machine": machine.describe(tmp)}
        print(f"bench.stages: {mode}; machine: {machine.one_line(meta['machine'])}", flush=True)
        stages_out = tmp / "stages.json"
        servers: list[tuple[Server, Path | None]] = []
        try:
            for name in ("shardetcd", "shardetcd-staged", "ceiling"):
                where = tmp / name
                where.mkdir()
                server = (start_shardetcd_default(where) if name == "shardetcd" else
                          start_staged(where, stages_out) if name == "shardetcd-staged" else start_ceiling(where))
                servers.append((server, stages_out if name == "shardetcd-staged" else None))
                etcdtool.seed_range_key(server.endpoint, sc.RANGE_KEY, sc.VAL_SIZE)
                log(f"started {server.name} on {server.endpoint} (pid {server.pid})")
            for label, s, point in loads():
                total = point.requests(mode)
                if not total:
                    continue
                for server, out in servers:
                    r = measure(tool, server, s, point, total, out)
                    r["load"] = label
                    rows.append(r)
                    log(f"{label:<17} {server.name:<17} {r['req_s']:>7,.0f} req/s  {r['total_us']:5,.0f} µs/req "
                        f"(loop thread {r['loop_us']:,.0f}, other threads {r['other_threads_us']:,.0f})")
        finally:
            for server, _ in servers:
                server.stop()
                log(f"stopped {server.name} (pid {server.pid})")
    md = table(rows)
    print()
    print(md)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{stamp}-stages.json"
    path.write_text(json.dumps({"meta": meta, "results": rows, "table_md": md}, indent=1))
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    runargs.run(main)
