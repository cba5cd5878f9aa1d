"""python -m bench.ab: two builds side by side, to decide whether a change is kept.

    python -m bench.ab --a 6c38c85                      # that revision against this working tree
    python -m bench.ab --a HEAD~1 --b HEAD --loads range-l:1/1,put-seq:64/8 --rounds 8
    python -m bench.ab --a /some/checkout --servers shardetcd     # a directory is taken as it is
    python -m bench.ab --tiny --a . --b .               # a few hundred requests (harness check)

Each of --a and --b is a source tree: a directory, or a git revision of this repository
(checked out into a temporary worktree, removed at the end). Every round starts fresh
processes of each server (shardetcd with its defaults, and the ceiling, which shares
shardetcd's gRPC server and so moves with it) from both trees, then runs each load on A
and B one after the other with etcd's benchmark tool, the order alternating from round to
round, and stops them by PID. Fresh processes each round matter: on a noisy VM two
processes of the same code have differed by ~15 % in CPU per request for their whole life.

Per load and server: req/s and the server's CPU µs per request (from /proc), the medians
over the rounds and every round's value, and in how many rounds B used less CPU than A.
Read a change as real only when the difference is beyond what A against A shows, or holds
in (nearly) every round. Loads are `scenario:clients/conns` of bench/scenarios.py.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from . import etcdtool, runargs, scenarios as sc
from .servers import REPO_ROOT, Server, start_ceiling, start_floor, start_shardetcd_default

STARTERS = {"shardetcd": start_shardetcd_default, "ceiling": start_ceiling, "floor": start_floor}
DEFAULT_LOADS = "put-seq:1/1,put-seq:64/8,txn-put:64/8,range-l:1/1,range-l:64/8"


def load_of(spec: str) -> tuple[sc.Scenario, sc.Point]:
    """``scenario:clients/conns`` as a scenario of bench/scenarios.py and one of its points (or a
    point of that shape)."""
    name, _, shape = spec.partition(":")
    scenario = next((s for s in sc.SCENARIOS if s.name == name and s.driver == "tool"), None)
    if scenario is None:
        raise SystemExit(f"python -m bench.ab: no scenario {name!r} driven by etcd's tool")
    clients, conns = (int(x) for x in shape.split("/"))
    point = next((p for p in scenario.points if (p.clients, p.conns) == (clients, conns)), None)
    return scenario, point or sc.Point(clients, conns, (None, None, None))


def source_tree(given: str, where: Path, worktrees: list[Path]) -> Path:
    """A directory as it is; else a revision of this repository, checked out under ``where``."""
    if Path(given).is_dir():
        return Path(given).resolve()
    subprocess.run(["git", "-C", str(REPO_ROOT), "worktree", "add", "--detach", "-q", str(where), given], check=True)
    worktrees.append(where)
    return where


def requests_for(point: sc.Point, tiny: bool) -> tuple[int, int]:
    """(warm-up, measured) requests of one run."""
    if tiny:
        return 50, 200
    return (1_000, 20_000) if point.clients > 1 else (500, 5_000)


def _median(runs: list[dict], field: str) -> float:
    return statistics.median(r[field] for r in runs)


def _each(runs: list[dict]) -> str:
    return ", ".join(f"{r['cpu_us']:.0f}" for r in runs)


def table(runs: list[dict], loads: list[str], servers: list[str]) -> str:
    lines = ["| load | server | A req/s | B req/s | A µs/req (every round) | B µs/req (every round) | rounds B < A |",
             "|---|---|---|---|---|---|---|"]
    for load in loads:
        for server in servers:
            a = [r for r in runs if (r["load"], r["server"], r["side"]) == (load, server, "A")]
            b = [r for r in runs if (r["load"], r["server"], r["side"]) == (load, server, "B")]
            if not a or not b:
                continue
            fewer = sum(rb["cpu_us"] < ra["cpu_us"] for ra, rb in zip(a, b))
            lines.append(f"| {load} | {server} | {_median(a, 'req_s'):,.0f} | {_median(b, 'req_s'):,.0f} | "
                         f"{_median(a, 'cpu_us'):.1f} ({_each(a)}) | {_median(b, 'cpu_us'):.1f} ({_each(b)}) | "
                         f"{fewer} of {len(a)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="the build before: a directory or a git revision")
    ap.add_argument("--b", default=str(REPO_ROOT), help="the build after (default: this working tree)")
    ap.add_argument("--loads", default=DEFAULT_LOADS, help="comma-separated scenario:clients/conns (default: %(default)s)")
    ap.add_argument("--servers", default="shardetcd,ceiling", help="comma-separated: shardetcd,ceiling,floor (the floor needs both trees to have it)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--tiny", action="store_true", help="one round of a few hundred requests per load (harness check)")
    runargs.add_tool(ap)
    runargs.add_out(ap, "the JSON")
    args = ap.parse_args(argv)
    tool = runargs.tool_or_exit(args, "python -m bench.ab")
    loads = args.loads.split(",")
    points = {spec: load_of(spec) for spec in loads}
    servers = args.servers.split(",")
    if unknown := set(servers) - set(STARTERS):
        raise SystemExit(f"python -m bench.ab: unknown servers {sorted(unknown)}")
    rounds = 1 if args.tiny else args.rounds
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    log = runargs.progress(time.monotonic())
    runs: list[dict] = []
    worktrees: list[Path] = []
    base = Path(tempfile.mkdtemp(prefix="shardetcd-ab-"))
    try:
        trees = {"A": source_tree(args.a, base / "tree-a", worktrees), "B": source_tree(args.b, base / "tree-b", worktrees)}
        log(f"A: {trees['A']}  B: {trees['B']}")
        for r in range(rounds):
            by: dict[tuple[str, str], Server] = {}
            try:
                for server in servers:
                    for side, tree in trees.items():
                        where = base / f"{r}-{server}-{side}"
                        where.mkdir()
                        srv = by[(server, side)] = STARTERS[server](where, source=tree)
                        etcdtool.seed_range_key(srv.endpoint, sc.RANGE_KEY, sc.VAL_SIZE)
                order = ("A", "B") if r % 2 == 0 else ("B", "A")
                for spec in loads:
                    scenario, point = points[spec]
                    warm, total = requests_for(point, args.tiny)
                    for server in servers:
                        for side in order:
                            srv = by[(server, side)]
                            etcdtool.run(tool, srv.endpoint, scenario, point, warm, [srv.pid])
                            row = etcdtool.run(tool, srv.endpoint, scenario, point, total, [srv.pid])
                            runs.append({"round": r + 1, "load": spec, "server": server, "side": side,
                                         "req_s": row["req_s"], "cpu_us": row["srv_cpu_us"], "requests": row["n"],
                                         "other_cpu_pct": row["other_cpu_pct"]})
                            log(f"round {r + 1}/{rounds} {spec:<16} {server:<9} {side} {row['req_s']:>8,.0f} req/s "
                                f"{row['srv_cpu_us']:6.1f} µs/req")
            finally:
                for srv in by.values():
                    srv.stop()
    finally:
        for tree in worktrees:
            subprocess.run(["git", "-C", str(REPO_ROOT), "worktree", "remove", "--force", str(tree)], check=False)
        shutil.rmtree(base, ignore_errors=True)
    md = table(runs, loads, servers)
    print()
    print(md)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{stamp}-ab.json"
    path.write_text(json.dumps({"a": args.a, "b": args.b, "rounds": rounds, "runs": runs, "table_md": md}, indent=1))
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    runargs.run(main)
