"""python -m bench.profile: where a server's CPU goes, per request (issue 16.6).

    python -m bench.profile                 # ≈ 2 min: shardetcd and the ceiling, each load twice
    python -m bench.profile --tiny          # a few seconds per load; figures mean little
    python -m bench.profile --servers shardetcd --rate 100

Runs a fixed load with etcd's benchmark tool (see etcdtool.py) against a
freshly started server (on asyncio's own event loop, ``--event-loop asyncio``: the split
below needs its Python frames; the servers' default, uvloop, hides grpc's callbacks under
the handler's frame), once plain (req/s and server CPU without a profiler
attached) and once under ``py-spy record --idle --nonblocking --threads
--format raw`` on the server's PID, and splits the server's CPU into:

  gRPC            the gRPC server: the native one's frames (shim/grpcserver.py,
                  the default) or grpcio's aio machinery: Python frames under grpc/, samples
                  whose innermost Python frame is asyncio's ``Handle._run``
                  (a C callback: grpc's Cython coroutines and completion-queue
                  callbacks, and the C part of asyncio's task steps), the
                  poller thread (``_poll_wrapper``) and grpc's native threads
                  (event_engine, lifeguard, timers)
  protobuf        request parsing and response encoding (shim/handlers.py's
                  (de)serializer, shim/wire.py, proto/, google/protobuf)
  event loop      asyncio's own Python code with no project frame above it
                  (``_run_once``, ``call_soon``, the self-pipe read after a
                  thread hop, timers)
  handler         shim/ (the etcd API layer), bench/ for the ceiling
  store           shards/ (MVCC, RocksDB calls, watch fan-out), RocksDB's threads
  journal         journal/, on the event loop and in its writer threads (the
                  default executor's ``asyncio_N`` threads: write + fdatasync)
  other           anything else (gc, stdlib not called from project code)

A sample goes to the category of its innermost frame that belongs to one of
them (so asyncio calls made by the store count as the store's).  Per thread,
the CPU the kernel counted over the load (/proc/<pid>/task/<tid>/schedstat) is
split over that thread's on-CPU samples in those proportions; samples that
wait (epoll in the event loop, a pool worker waiting for work, fdatasync) are
left out.  A worker thread's CPU goes to the owners of the code it runs
(the default executor's threads run the journal's writes).  Threads py-spy
does not see (native) are put in a category by name.  µs per request =
category CPU / requests the tool counted (watch-latency: events received).
The event-loop thread's wall time is split by schedstat too: on CPU, waiting
for a core (runnable), asleep (in epoll with nothing to do, or waiting for the
GIL).

Samples are not trusted for the idle share: on 2 shared cores py-spy tends to
get a core when the server gives one up, so its samples over-represent the
moments the event loop sleeps (at put 1/1, 77-88 % of the loop's samples were
in epoll while schedstat had it on CPU half the time).  That is why the
kernel's counters give the totals and the samples only split them.

py-spy attaches with ptrace (root or CAP_SYS_PTRACE); ``pip install py-spy``.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from . import etcdtool, machine, runargs, scenarios as sc
from .servers import busy_seconds, start_ceiling, start_shardetcd_default

ASYNCIO = ("--event-loop", "asyncio")  # see main()
STARTERS = {  # on asyncio's own loop, see main()
    "shardetcd": lambda where: start_shardetcd_default(where, ASYNCIO, "defaults, --event-loop asyncio"),
    "ceiling": lambda where: start_ceiling(where, ASYNCIO),
}

RESULTS = runargs.RESULTS
CATEGORIES = ("gRPC", "protobuf", "event loop", "handler", "store", "journal", "other")
LABELS = {"gRPC": "gRPC (shim/grpcserver.py; with --grpc-server grpcio its aio machinery, poller, C-core threads)",
          "protobuf": "protobuf (parse requests, encode responses)", "event loop": "event loop (asyncio)",
          "handler": "handler (shim/)", "store": "store (shards/)", "journal": "journal (journal/, writer threads)",
          "other": "other"}
WAITING = "waiting"


# ------------------------------------------------------------------ loads


def loads() -> list[tuple[str, sc.Scenario, sc.Point]]:
    """The fixed loads: put at 1 and 64 clients, range-l at 64, watch-latency; requests per (tiny, quick, full)."""
    by = sc.by_name()
    return [
        ("put 1/1", by["put-seq"], sc.Point(1, 1, (300, 3_000, 10_000))),
        ("put 64/8", by["put-seq"], sc.Point(64, 8, (1_000, 10_000, 40_000))),
        ("range-l 64/8", by["range-l"], sc.Point(64, 8, (1_000, 10_000, 40_000))),
        ("watch-latency 100 watchers", by["watch-latency"], by["watch-latency"].points[0]),
    ]


# --------------------------------------------------------------- threads


def thread_cpu(pid: int) -> dict[int, tuple[str, float, float]]:
    """{tid: (name, seconds on CPU, seconds runnable but waiting for a core)} of every thread of `pid`,
    from /proc/<pid>/task/<tid>/schedstat (exact, unlike tick-sampled utime/stime)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                on_cpu, run_wait, _ = (int(x) for x in f.read().split())
        except (OSError, ValueError):
            continue
        out[int(tid)] = (name, on_cpu / 1e9, run_wait / 1e9)
    return out


def native_category(name: str) -> str:
    """A thread py-spy does not sample, by its kernel name (comm)."""
    if name.startswith(("grpc", "event_engine", "lifeguard", "default-execut", "resolver-execu", "timer_manager")):
        return "gRPC"
    if name.startswith("rocksdb"):
        return "store"
    return "other"


# ------------------------------------------------------------ classification


_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
_THREAD = re.compile(r"^thread \((?P<tid>0x[0-9a-fA-F]+|\d+)\)(?:: (?P<name>.*))?$")
SERDES = {("shim/handlers.py", "_deserializer.<locals>.deserialize"), ("shim/handlers.py", "_serialize")}
# innermost frames that wait rather than run: (file, function)
WAITS = {("selectors.py", "EpollSelector.select"), ("selectors.py", "PollSelector.select"),
         ("selectors.py", "SelectSelector.select"), ("concurrent/futures/thread.py", "_worker"),
         ("threading.py", "Condition.wait"), ("threading.py", "Event.wait"), ("threading.py", "Thread.join"),
         ("threading.py", "Semaphore.acquire"), ("queue.py", "Queue.get"), ("journal/fsutil.py", "fdatasync"),
         ("time.py", "sleep")}


def frame(text: str) -> tuple[str, str]:
    """(file, function) of one py-spy frame, e.g. 'Store.put (shards/store.py:291)'."""
    m = _FRAME.match(text)
    return (m["file"], m["func"]) if m else ("", text)


def owner(file: str, func: str) -> str | None:
    if file.startswith("journal/"):
        return "journal"
    if file.startswith("shards/"):
        return "store"
    if file == "shim/wire.py" or (file, func) in SERDES or file.startswith(("google/protobuf/", "proto/")):
        return "protobuf"
    if file.startswith("grpc/") or file == "shim/grpcserver.py":
        return "gRPC"
    if file.startswith(("shim/", "bench/")):
        return "handler"
    return None


DISPATCH = {("asyncio/events.py", "Handle._run"), ("asyncio/base_events.py", "BaseEventLoop._run_once")}


def _dispatched(parsed: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The frames the event loop is running now: those from its innermost dispatch frame on (the
    frames below it are the program's entry, e.g. shim/cli.py's main, which owns nothing)."""
    cut = max((i for i, f in enumerate(parsed) if f in DISPATCH), default=0)
    return parsed[cut:]


def project_owner(frames: list[str]) -> str | None:
    """The category of the innermost frame that belongs to one, waiting or not."""
    for file, func in reversed(_dispatched([frame(f) for f in frames])):
        cat = owner(file, func)
        if cat:
            return cat
    return None


def classify(frames: list[str]) -> str:
    """The category of one sample (frames root first, as py-spy writes them), or WAITING."""
    parsed = _dispatched([frame(f) for f in frames])
    if not parsed:
        return "other"
    leaf = parsed[-1]
    if leaf in WAITS:
        return WAITING
    for file, func in reversed(parsed):
        cat = owner(file, func)
        if cat:
            return cat
    if leaf == ("asyncio/events.py", "Handle._run"):  # a C callback: grpc's Cython, or asyncio's C task step
        return "gRPC"
    if leaf == ("threading.py", "Thread.run"):  # a thread running a C target (grpc's poller)
        return WAITING
    if any(file.startswith("asyncio/") for file, _ in parsed):
        return "event loop"
    return "other"


def read_samples(path: Path) -> dict[int, dict]:
    """py-spy's raw output -> {tid: {"name": str, "counts": Counter(category), "leaves": Counter(leaf)}}."""
    threads: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = stack.split(";")
        m = _THREAD.match(frames[0])
        if m:
            tid = int(m["tid"], 0)
            name, frames = m["name"] or "", frames[1:]
        else:
            tid, name = 0, "?"
        t = threads.setdefault(tid, {"name": name, "counts": Counter(), "waits": Counter(), "owners": Counter()})
        cat = classify(frames)
        t["counts"][cat] += int(n)
        own = project_owner(frames)
        if own:
            t["owners"][own] += int(n)
        if cat == WAITING and frames:
            t["waits"][frame(frames[-1])[1]] += int(n)
    return threads


def breakdown(samples: dict[int, dict], cpu: dict[int, tuple], wall: float) -> dict:
    """Split each thread's CPU over its categories: {"cpu_s": {category: s}, "threads": [...]}.
    `cpu`: {tid: (name, seconds on CPU[, seconds waiting for a core])} over `wall` seconds."""
    cpu_s: dict[str, float] = defaultdict(float)
    rows = []
    for tid, (kname, secs, *rest) in sorted(cpu.items(), key=lambda kv: -kv[1][1]):
        queued = rest[0] if rest else None
        t = samples.get(tid)
        running = {c: n for c, n in (t["counts"].items() if t else ()) if c != WAITING}
        name = t["name"] if t else kname
        if t and "_poll_wrapper" in name:  # grpc's poller: C code under Thread.run
            split = {"gRPC": secs}
        elif t and name != "MainThread" and t["owners"]:
            # a worker thread (the journal's writes and fdatasyncs in the default executor) is there for the
            # code it runs, waiting or not: its CPU goes to that code's owners
            total = sum(t["owners"].values())
            split = {c: secs * n / total for c, n in t["owners"].items()}
        elif running:
            total = sum(running.values())
            split = {c: secs * n / total for c, n in running.items()}
        else:
            split = {native_category(kname): secs}
        for c, s in split.items():
            cpu_s[c] += s
        n_all = sum(t["counts"].values()) if t else 0
        rows.append({"tid": tid, "name": name, "comm": kname, "cpu_s": secs, "busy_pct": secs / wall * 100,
                     "queued_pct": queued / wall * 100 if queued is not None else None,
                     "samples": n_all, "waiting_samples_pct": (t["counts"][WAITING] / n_all * 100) if n_all else None,
                     "waits": dict(t["waits"].most_common(4)) if t else {}, "split_s": split})
    return {"cpu_s": dict(cpu_s), "threads": rows}


# ------------------------------------------------------------------ running


def start_pyspy(pid: int, rate: int, out: Path) -> subprocess.Popen:
    exe = shutil.which("py-spy")
    if not exe:
        raise SystemExit("python -m bench.profile: py-spy not found; pip install py-spy")
    proc = subprocess.Popen([exe, "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw", "--threads",
                             "--idle", "--nonblocking", "--output", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline()  # "py-spy> Sampling process 200 times a second. ..."
    if "Sampling process" not in line:
        proc.kill()
        raise SystemExit(f"python -m bench.profile: py-spy did not attach to pid {pid}: {line}{proc.stdout.read()}")
    return proc


def stop_pyspy(proc: subprocess.Popen) -> tuple[str, float]:
    """Stop py-spy (SIGINT: it writes its file); its output and its own CPU seconds."""
    proc.send_signal(signal.SIGINT)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return out, usage.ru_utime + usage.ru_stime


def profile_one(tool: Path, server, label: str, s: sc.Scenario, point: sc.Point, total: int, rate: int,
                tmp: Path) -> dict:
    plain = etcdtool.run(tool, server.endpoint, s, point, total, [server.pid])
    raw = tmp / f"{server.name}-{label.replace(' ', '_').replace('/', '-')}.txt"
    # threads' CPU over the whole py-spy window, so that their time on CPU and the samples' idle share
    # describe the same seconds (the tool's own window is inside it)
    before, t0, busy0 = thread_cpu(server.pid), time.monotonic(), busy_seconds()
    spy = start_pyspy(server.pid, rate, raw)
    try:
        row = etcdtool.run(tool, server.endpoint, s, point, total, [server.pid])
    finally:
        spy_out, spy_cpu = stop_pyspy(spy)
    after, wall, busy = thread_cpu(server.pid), time.monotonic() - t0, busy_seconds() - busy0
    cpu = {tid: (name, on - before.get(tid, (None, 0.0, 0.0))[1], queued - before.get(tid, (None, 0.0, 0.0))[2])
           for tid, (name, on, queued) in after.items()}
    m = re.search(r"Samples: (\d+) Errors: (\d+)", spy_out)
    result = {"load": label, "server": server.name, "command": row["command"], "requests": row["n"],
              "req_s": row["req_s"], "p50_ms": row["p50_ms"], "p99_ms": row["p99_ms"], "wall_s": wall,
              "plain": {"req_s": plain["req_s"], "srv_cpu_us": plain["srv_cpu_us"], "p99_ms": plain["p99_ms"]},
              "other_cpu_pct": row["other_cpu_pct"], "machine_busy_pct": busy / wall * 100, "raw": raw.name,
              "pyspy": {"samples": int(m[1]) if m else None, "errors": int(m[2]) if m else None,
                        "rate_hz": rate, "cpu_pct": spy_cpu / wall * 100}}
    return analyze(result, read_samples(raw), cpu)


def analyze(result: dict, samples: dict[int, dict], cpu: dict[int, tuple]) -> dict:
    """Fill in `result`'s breakdown from the samples and the threads' CPU (also used by --reread)."""
    wall, n = result["wall_s"], max(result["requests"], 1)
    b = breakdown(samples, cpu, wall)
    total_cpu = sum(c[1] for c in cpu.values())
    main = next((t for t in b["threads"] if t["name"] == "MainThread"), None)
    result.update(
        srv_cpu_us=total_cpu / n * 1e6, srv_cpu_pct=total_cpu / wall * 100,
        categories_us={c: b["cpu_s"].get(c, 0.0) / n * 1e6 for c in CATEGORIES},
        categories_pct={c: b["cpu_s"].get(c, 0.0) / total_cpu * 100 if total_cpu else 0.0 for c in CATEGORIES},
        main_thread_busy_pct=main["busy_pct"] if main else None,
        main_thread_queued_pct=main["queued_pct"] if main else None,
        main_thread_sleep_pct=max(0.0, 100 - main["busy_pct"] - main["queued_pct"]) if main else None,
        main_thread_sleep_us=max(0.0, 1 - (main["busy_pct"] + main["queued_pct"]) / 100) * wall / n * 1e6
        if main else None,
        main_thread_idle_samples_pct=main["waiting_samples_pct"] if main else None,
        threads=b["threads"])
    return result


def reread(path: Path) -> dict:
    """Recompute a saved run's breakdown from its folded stacks (saved beside it) and threads' CPU."""
    doc = json.loads(path.read_text())
    stamp = doc["meta"]["timestamp"]
    for r in doc["results"]:
        raw = path.with_name(f"{stamp}-profile-{r['raw']}")
        cpu = {t["tid"]: (t["comm"], t["cpu_s"], t["queued_pct"] * r["wall_s"] / 100 if t.get("queued_pct") is not None
                          else 0.0) for t in r["threads"]}
        analyze(r, read_samples(raw), cpu)
    doc["table_md"], doc["threads_md"] = table(doc["results"]), threads_table(doc["results"])
    return doc


def table(results: list[dict]) -> str:
    """Rows: categories; columns: loads. Cells: µs per request (% of the server's CPU)."""
    head = ["server CPU per request"] + [f"{r['server']}: {r['load']}" for r in results]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for c in CATEGORIES:
        lines.append("| " + " | ".join([LABELS[c]] + [f"{r['categories_us'][c]:,.0f} µs ({r['categories_pct'][c]:.0f} %)"
                                              for r in results]) + " |")
    lines.append("| **total** (kernel: schedstat) | " + " | ".join(f"**{r['srv_cpu_us']:,.0f} µs** ({r['srv_cpu_pct']:.0f} % of a core)"
                                                      for r in results) + " |")
    lines.append("| event-loop thread asleep: epoll, GIL (wall, not CPU) | " + " | ".join(
        f"{r['main_thread_sleep_us']:,.0f} µs ({r['main_thread_sleep_pct']:.0f} % of the time)"
        if r["main_thread_sleep_pct"] is not None else "-" for r in results) + " |")
    lines.append("| event-loop thread on CPU / waiting for a core / asleep (% of wall) | " + " | ".join(
        f"{r['main_thread_busy_pct']:.0f} / {r['main_thread_queued_pct']:.0f} / {r['main_thread_sleep_pct']:.0f}"
        if r["main_thread_sleep_pct"] is not None else "-" for r in results) + " |")
    lines.append("| req/s with py-spy / without | " + " | ".join(
        f"{r['req_s']:,.0f} / {r['plain']['req_s']:,.0f}" for r in results) + " |")
    lines.append("| server CPU µs/req without py-spy | " + " | ".join(
        f"{r['plain']['srv_cpu_us']:,.0f}" for r in results) + " |")
    lines.append("| py-spy's own CPU (% of a core) | " + " | ".join(f"{r['pyspy']['cpu_pct']:.0f}" for r in results) + " |")
    lines.append("| other CPU % (rest of the machine, py-spy included) | " + " | ".join(
        f"{r['other_cpu_pct']:.0f}" for r in results) + " |")
    return "\n".join(lines)


def threads_table(results: list[dict]) -> str:
    head = ["load", "thread", "CPU µs/req", "on CPU % of wall", "waiting for a core %", "idle samples in"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in results:
        n = max(r["requests"], 1)
        for t in r["threads"]:
            if t["cpu_s"] / n * 1e6 < 1 and not t["samples"]:
                continue
            waits = ", ".join(f"{k} {v}" for k, v in t["waits"].items())
            queued = "-" if t.get("queued_pct") is None else f"{t['queued_pct']:.0f}"
            lines.append(f"| {r['server']}: {r['load']} | {t['name']} | {t['cpu_s'] / n * 1e6:,.0f} | "
                         f"{t['busy_pct']:.0f} | {queued} | {waits} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="a few hundred requests per load (harness check)")
    ap.add_argument("--full", action="store_true", help="longer loads (≈ 4× the default)")
    ap.add_argument("--servers", default="shardetcd,ceiling", help="comma-separated: shardetcd,ceiling,etcd "
                    "(etcd: totals only, py-spy does not read Go)")
    ap.add_argument("--rate", type=int, default=200, help="py-spy samples per second (default 200)")
    runargs.add_tool(ap)
    runargs.add_out(ap)
    ap.add_argument("--reread", type=Path, default=None,
                    help="recompute the tables of a saved <timestamp>-profile.json from its folded stacks (no run)")
    args = ap.parse_args(argv)
    if args.reread:
        doc = reread(args.reread)
        args.reread.write_text(json.dumps(doc, indent=1))
        print(doc["table_md"] + "\n\n" + doc["threads_md"])
        return 0
    mode = "tiny" if args.tiny else "full" if args.full else "quick"
    tool = runargs.tool_or_exit(args, "python -m bench.profile")
    names = [n for n in args.servers.split(",") if n]
    if "etcd" in names:
        raise SystemExit("python -m bench.profile: py-spy profiles Python servers only (shardetcd, ceiling)")
    if unknown := [n for n in names if n not in STARTERS]:
        raise SystemExit(f"python -m bench.profile: unknown server(s) {unknown}; known: shardetcd, ceiling")
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    results: list[dict] = []
    t_begin = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="shardetcd-profile-") as tmp_s:
        tmp = Path(tmp_s)
        meta = {"timestamp": stamp, "mode": mode, "rate_hz": args.rate, "tool": etcdtool.describe(tool),
                "machine": machine.describe(tmp)}
        print(f"bench.profile: {mode}, servers {','.join(names)}, py-spy at {args.rate} Hz; "
              f"machine: {machine.one_line(meta['machine'])}", flush=True)
        for name in names:
            where = tmp / name
            where.mkdir()
            # on asyncio's own loop: a sample of grpc's C callbacks then has asyncio's Handle._run as its
            # innermost Python frame, which is how the split tells them apart; under uvloop (the servers'
            # default) they sit below the handler's frame and would be counted as the handler's
            server = STARTERS[name](where)
            print(f"  started {name}: {server.version} on {server.endpoint} (pid {server.pid})", flush=True)
            try:
                etcdtool.seed_range_key(server.endpoint, sc.RANGE_KEY, sc.VAL_SIZE)
                for label, s, point in loads():
                    r = profile_one(tool, server, label, s, point, point.requests(mode), args.rate, tmp)
                    results.append(r)
                    cats = ", ".join(f"{c} {r['categories_us'][c]:.0f}" for c in CATEGORIES)
                    print(f"  [{time.monotonic() - t_begin:4.0f}s] {name:<9} {label:<27} {r['req_s']:>7,.0f} req/s "
                          f"(plain {r['plain']['req_s']:,.0f}), {r['srv_cpu_us']:,.0f} µs/req: {cats}", flush=True)
                raws = sorted(tmp.glob(f"{name}-*.txt"))
                args.out.mkdir(parents=True, exist_ok=True)
                for raw in raws:  # the folded stacks, for a flame graph (flamegraph.pl, speedscope)
                    shutil.copyfile(raw, args.out / f"{stamp}-profile-{raw.name}")
            finally:
                server.stop()
                print(f"  stopped {name} (pid {server.pid})", flush=True)
    meta["elapsed_s"] = time.monotonic() - t_begin
    md, tt = table(results), threads_table(results)
    print()
    print(md)
    print()
    print(tt)
    path = args.out / f"{stamp}-profile.json"
    path.write_text(json.dumps({"meta": meta, "results": results, "table_md": md, "threads_md": tt}, indent=1))
    print(f"\nresults: {path} (+ the folded stacks: {stamp}-profile-*.txt)")
    return 0


if __name__ == "__main__":
    runargs.run(main)
