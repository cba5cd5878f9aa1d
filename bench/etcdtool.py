"""etcd's own load generator, ``tools/benchmark``, for etcd's shapes.

    python -m bench.etcdtool --quick          # ≈ 4 min: every shape, etcd, shardetcd and the ceiling
    python -m bench.etcdtool --tiny           # a smoke run (the tests run it)
    python -m bench.etcdtool --tool PATH      # or $SHARDETCD_BENCHMARK_TOOL

The tool is etcd's Go client: it is how etcd's own performance figures are
made, and how users will compare.  Where to find it, in order: ``--tool``,
``$SHARDETCD_BENCHMARK_TOOL``, or ``../shared/bin/etcd-benchmark.xz`` beside
the repository (unpacked once into ``~/.cache/shardetcd``).  Elsewhere: build
it from etcd's source tree (``go build ./tools/benchmark`` in a checkout of
etcd v3.4 or v3.5).

Each server (real etcd 3.5.1, shardetcd with its defaults, the ceiling) is
started in turn on 127.0.0.1, gets every shape, and is stopped by PID.  A row
records the tool's Requests/sec and latency percentiles, and the server's
CPU per request (from /proc over the tool's run).  The tool and the server
share the machine's cores.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench import servers

TOOL_ENV = "SHARDETCD_BENCHMARK_TOOL"
SHIPPED = servers.REPO_ROOT.parent / "shared" / "bin" / "etcd-benchmark.xz"
RANGE_KEY = "/bench/range-key"


class ToolMissing(RuntimeError):
    pass


def tool_path(explicit: str | None = None) -> Path:
    """The benchmark binary (unpacked from the shipped .xz when that is what there is)."""
    given = explicit or os.environ.get(TOOL_ENV)
    if given:
        path = Path(given)
        if not path.is_file():
            raise ToolMissing(f"no benchmark tool at {path}")
        return path
    if not SHIPPED.is_file():
        raise ToolMissing(
            "etcd's benchmark tool was not found: pass --tool PATH or set $SHARDETCD_BENCHMARK_TOOL "
            f"(expected {SHIPPED}; build it with `go build ./tools/benchmark` in a checkout of etcd v3.4 or v3.5)")
    digest = hashlib.sha256(SHIPPED.read_bytes()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "shardetcd"
    path = cache / f"benchmark-{digest}"
    if not path.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=cache, delete=False) as tmp:
            tmp.write(lzma.decompress(SHIPPED.read_bytes()))
        os.chmod(tmp.name, 0o755)
        os.replace(tmp.name, path)
    return path


@dataclass(frozen=True)
class Shape:
    name: str
    args: tuple[str, ...]  # the tool's command and its flags, without --total
    clients: int
    conns: int
    totals: tuple[int, int, int]  # requests in tiny, quick and full mode
    ceiling: bool = True  # the ceiling answers it

    @property
    def label(self) -> str:
        return f"{self.clients}/{self.conns}"


def _shapes() -> list[Shape]:
    put = ("put", "--key-size", "8", "--val-size", "256")
    seq = (*put, "--sequential-keys", "--key-space-size", "100000")
    txn = ("txn-put", "--key-size", "8", "--val-size", "256", "--key-space-size", "100000")
    one, many = (1, 1), (1000, 100)  # etcd's documented points: 1 client, and 1000 clients on 100 connections
    out = []
    for name, args, points in (
        ("put-hot", put, (one, many)),
        ("put-seq", seq, (one, many)),
        ("range-l", ("range", RANGE_KEY, "--consistency", "l"), (one, many)),
        ("range-s", ("range", RANGE_KEY, "--consistency", "s"), (one, many)),
        ("txn-put", txn, (one, many)),
    ):
        for clients, conns in points:
            totals = (200, 3000, 20000) if clients == 1 else (2000, 20000, 100000)
            out.append(Shape(name, args, clients, conns, totals))
    for rate in (100, 1000):  # puts/s; events are delivered to every watcher (--clients of them)
        out.append(Shape(f"watch-latency@{rate}", ("watch-latency", "--put-rate", str(rate)), 100, 10,
                         (rate, 5 * rate, 15 * rate)))
    out.append(Shape("lease-keepalive", ("lease-keepalive",), 100, 10, (2000, 20000, 100000)))
    return out


SHAPES = _shapes()
_FIELD = re.compile(r"^\s*(Requests/sec|Total|Slowest|Average):\s+([0-9.]+)", re.M)
_PCT = re.compile(r"^\s*([0-9.]+)% in ([0-9.]+) secs", re.M)


def parse(output: str) -> dict:
    """Requests/sec, latency percentiles (ms) and the count from the tool's summary."""
    fields = {k: float(v) for k, v in _FIELD.findall(output)}
    pcts = {float(p): float(s) * 1000 for p, s in _PCT.findall(output)}
    counts = [int(n) for n in re.findall(r"^\s+[0-9.]+ \[(\d+)\]", output, re.M)]
    if "Requests/sec" not in fields or 50.0 not in pcts:
        raise ValueError(f"no summary in the benchmark tool's output:\n{output[-2000:]}")
    return {"req_s": fields["Requests/sec"], "total_s": fields.get("Total", 0.0), "n": sum(counts),
            "p50_ms": pcts[50.0], "p90_ms": pcts.get(90.0), "p99_ms": pcts.get(99.0, pcts[50.0]),
            "p999_ms": pcts.get(99.9)}


def run(tool: Path, endpoint: str, shape: Shape, total: int, timeout_s: float = 900) -> dict:
    argv = [str(tool), f"--endpoints={endpoint}", f"--clients={shape.clients}", f"--conns={shape.conns}",
            *shape.args, f"--total={total}"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                          env={k: v for k, v in os.environ.items() if not k.startswith("ETCD")})
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return parse(proc.stdout)


def measure(tool: Path, server: servers.Server, shape: Shape, total: int) -> dict:
    cpu0 = servers.cpu_seconds(server.pid)
    row = run(tool, server.endpoint, shape, total)
    cpu = servers.cpu_seconds(server.pid) - cpu0
    row.update(shape=shape.name, point=shape.label, server=server.name, total=total,
               server_cpu_us=round(cpu / max(row["n"], 1) * 1e6, 1))
    return row


def _seed(endpoint: str) -> None:
    import grpc

    from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg

    with grpc.insecure_channel(endpoint) as ch:
        pbg.KVStub(ch).Put(pb.PutRequest(key=RANGE_KEY.encode(), value=b"v" * 256), timeout=30)


def table(rows: list[dict]) -> str:
    by = {(r["shape"], r["point"], r["server"]): r for r in rows}
    out = ["| shape | clients/conns | etcd req/s | shardetcd req/s | ceiling req/s | shardetcd/etcd | "
           "shardetcd/ceiling | p50 ms etcd / shardetcd | p99 ms etcd / shardetcd | server CPU µs/req etcd / shardetcd |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    seen = []
    for r in rows:
        if (r["shape"], r["point"]) not in seen:
            seen.append((r["shape"], r["point"]))
    for shape, point in seen:
        e, s, c = (by.get((shape, point, n)) for n in ("etcd", "shardetcd", "ceiling"))

        def rate(r):
            return f"{r['req_s']:,.0f}" if r else ""

        def ratio(a, b):
            return f"{a['req_s'] / b['req_s']:.2f}×" if a and b and b["req_s"] else ""

        def pair(key, fmt="{:.1f}"):
            return " / ".join(fmt.format(r[key]) if r and r.get(key) is not None else "–" for r in (e, s))

        out.append(f"| {shape} | {point} | {rate(e)} | {rate(s)} | {rate(c)} | {ratio(s, e)} | {ratio(s, c)} | "
                   f"{pair('p50_ms', '{:.2f}')} | {pair('p99_ms', '{:.2f}')} | {pair('server_cpu_us', '{:.0f}')} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.etcdtool", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true")
    mode.add_argument("--tiny", action="store_true")
    ap.add_argument("--tool", default=None, help=f"the benchmark binary (default: ${TOOL_ENV}, or {SHIPPED})")
    ap.add_argument("--servers", default="etcd,shardetcd,ceiling")
    ap.add_argument("--only", default=None, help="comma-separated shape names")
    ap.add_argument("--out", type=Path, default=servers.REPO_ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    try:
        tool = tool_path(args.tool)
    except ToolMissing as exc:
        print(f"bench.etcdtool: {exc}", file=sys.stderr)
        return 2
    level = 0 if args.tiny else 1 if args.quick else 2
    shapes = [s for s in SHAPES if args.only is None or s.name in args.only.split(",")]
    names = args.servers.split(",")
    rows: list[dict] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="shardetcd-etcdtool-") as tmp:
        for name in names:
            where = Path(tmp) / name
            where.mkdir()
            server = servers.STARTERS[name](where)
            print(f"{name}: {server.version} on {server.endpoint} pid {server.pid}", flush=True)
            try:
                _seed(server.endpoint)
                for shape in shapes:
                    if name == "ceiling" and not shape.ceiling:
                        continue
                    row = measure(tool, server, shape, shape.totals[level])
                    rows.append(row)
                    print(f"  {shape.name:<20} {shape.label:>8}  {row['req_s']:>9,.0f} req/s  p50 {row['p50_ms']:.2f} ms"
                          f"  p99 {row['p99_ms']:.2f} ms  server {row['server_cpu_us']:.0f} µs/req", flush=True)
            finally:
                server.stop()
                print(f"  stopped {name} (pid {server.pid})", flush=True)
    md = table(rows)
    print(md)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"meta": {"timestamp": stamp, "mode": ["tiny", "quick", "full"][level], "tool": str(tool),
                    "elapsed_s": round(time.monotonic() - started, 1)}, "rows": rows, "table_md": md}
    path = args.out / f"{stamp}-etcdtool.json"
    path.write_text(json.dumps(doc, indent=1))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
