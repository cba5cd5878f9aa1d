"""python -m bench.gcpause: the stalls of a growing store, etcd and shardetcd side by side.

CPython's cyclic garbage collector stops the event loop while it runs; a *full*
collection walks every object it tracks, and a store of a million keys is a lot of
objects (shards/collector.py says what shardetcd does about it). etcd's Go collector
runs beside the program. What a client sees of either is the tail of its latencies.

Against each server, etcd's benchmark tool (64 clients on 8 connections) first puts
--keys new keys (sequential, 24-byte keys, 200-byte values: the fill), then --updates
puts to random keys among them. Per phase: requests/s, p99, p99.9 and the slowest
request from the tool; for shardetcd also its collector's runs in that phase, from
/metrics (shardetcd_gc_pause_seconds): how many full collections, how many took over
10 and over 100 ms, and the time they held the loop in all; and after the fill, the
resident memory of the server process (shardetcd's RocksDB state on tmpfs besides).

    python -m bench.gcpause                  # 1,000,000 keys, 500,000 updates (~8 min)
    python -m bench.gcpause --tiny           # a few thousand of each (harness check)
"""
from __future__ import annotations

import argparse
import datetime as dt
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from . import etcdtool, runargs
from .scale import rss_bytes, tree_bytes
from .scenarios import Point, Scenario
from .servers import STARTERS

PUT = ("put", "--key-size", "24", "--val-size", "200")
POINT = Point(64, 8, (None, None, None))
SLOW_S = (0.01, 0.1)  # full collections over these are counted apart


def gc_pauses(metrics_url: str) -> dict[str, dict]:
    """shardetcd_gc_pause_seconds per generation: {"count", "sum", "over": {bound: count}}."""
    with urllib.request.urlopen(metrics_url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    out: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "shardetcd_gc_pause_seconds":
            continue
        for s in family.samples:
            g = out.setdefault(s.labels["generation"], {"count": 0, "sum": 0.0, "le": {}})
            if s.name.endswith("_count"):
                g["count"] = s.value
            elif s.name.endswith("_sum"):
                g["sum"] = s.value
            elif s.name.endswith("_bucket"):
                g["le"][float(s.labels["le"])] = s.value
    return out


def full_collections(before: dict, after: dict) -> dict:
    """The full collections (generation 2) between two readings."""
    b, a = before.get("2", {"count": 0, "sum": 0.0, "le": {}}), after["2"]
    row = {"count": a["count"] - b["count"], "sum_s": a["sum"] - b["sum"]}
    for bound in SLOW_S:
        at_most = a["le"].get(bound, 0) - b["le"].get(bound, 0)
        row[f"over_{bound * 1000:g}ms"] = row["count"] - at_most
    longest = [le for le, n in sorted(a["le"].items()) if n - b["le"].get(le, 0) >= row["count"]]
    row["longest_at_most_s"] = longest[0] if longest and row["count"] else 0.0
    return row


def run_server(name: str, tool: Path, keys: int, updates: int, scratch: Path, log) -> list[dict]:
    server = STARTERS[name](scratch)
    rows = []
    try:
        phases = [("fill", Scenario("fill", "tool", [], (*PUT, "--sequential-keys", "--key-space-size", str(keys))),
                   keys),
                  ("updates", Scenario("updates", "tool", [], (*PUT, "--key-space-size", str(keys))), updates)]
        for phase, scenario, total in phases:
            before = gc_pauses(server.metrics_url) if name == "shardetcd" else None
            log(f"{name}: {phase}, {total:,} puts")
            row = etcdtool.run(tool, server.endpoint, scenario, POINT, total, [server.pid], timeout_s=7200)
            row.update(server=name, phase=phase)
            if before is not None:
                row["gc_full"] = full_collections(before, gc_pauses(server.metrics_url))
            if phase == "fill":
                row["rss_bytes"] = rss_bytes(server.pid)
                if server.state_dir is not None:
                    row["state_bytes"] = tree_bytes(server.state_dir)
            rows.append(row)
            log(f"{name}: {phase}: {row['req_s']:,.0f} req/s, p99 {row['p99_ms']:.1f} ms, "
                f"p99.9 {row['p999_ms']:.1f} ms, slowest {row['slowest_ms']:.0f} ms")
    finally:
        server.stop()
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| server | phase | req/s | p99 ms | p99.9 ms | slowest ms | full collections | over 10 ms | over 100 ms "
             "| in all ms | RSS after the fill |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        g = r.get("gc_full")
        gc_cells = (f"{g['count']:.0f} | {g['over_10ms']:.0f} | {g['over_100ms']:.0f} | {g['sum_s'] * 1000:.0f}"
                    if g else "- | - | - | -")
        rss = f"{r['rss_bytes'] / 2**20:,.0f} MiB" if "rss_bytes" in r else ""
        if "state_bytes" in r:
            rss += f" (+ {r['state_bytes'] / 2**20:,.0f} MiB state on tmpfs)"
        lines.append(f"| {r['server']} | {r['phase']} | {r['req_s']:,.0f} | {r['p99_ms']:.1f} | {r['p999_ms']:.1f} "
                     f"| {r['slowest_ms']:.0f} | {gc_cells} | {rss} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gcpause", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--updates", type=int, default=500_000)
    ap.add_argument("--servers", default="etcd,shardetcd")
    ap.add_argument("--tiny", action="store_true", help="5,000 keys and updates: a harness check, figures mean nothing")
    runargs.add_tool(ap)
    runargs.add_out(ap)
    args = ap.parse_args(argv)
    if args.tiny:
        args.keys = args.updates = 5_000
    tool = runargs.tool_or_exit(args, "python -m bench.gcpause")
    names = runargs.etcd_and_shardetcd(args.servers)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    log = runargs.progress(time.monotonic())
    rows = runargs.each_server(names, "shardetcd-gcpause-",
                               lambda name, scratch: run_server(name, tool, args.keys, args.updates, scratch, log))
    md = table(rows)
    print(md)
    runargs.save(args.out, stamp, "gcpause",
                 {"keys": args.keys, "updates": args.updates, "tool": etcdtool.describe(tool)}, rows,
                 f"{args.keys:,} keys, {args.updates:,} updates, 64 clients / 8 connections", md)
    return 0


if __name__ == "__main__":
    runargs.run(main)
