"""etcd's own load generator, ``tools/benchmark``, for etcd's shapes.

The tool is etcd's Go client: it is how etcd's own performance figures are
made, and how users will compare.  Where to find it, in order: ``--tool``,
``$SHARDETCD_BENCHMARK_TOOL``, or ``../shared/bin/etcd-benchmark.xz`` beside
the repository (unpacked once into ``~/.cache/shardetcd``).  Elsewhere: build
it from etcd's source tree (``go build ./tools/benchmark`` in a checkout of
etcd v3.4 or v3.5) and pass its path.

`run` starts the tool once against one server for one scenario point and
reads its summary: Requests/sec, the latency percentiles and the count, plus
the server's CPU over the tool's run (from /proc), the tool's own CPU (its
rusage) and what the rest of the machine used meanwhile.
"""
from __future__ import annotations

import hashlib
import lzma
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from bench import servers

TOOL_ENV = "SHARDETCD_BENCHMARK_TOOL"
SHIPPED = servers.REPO_ROOT.parent / "shared" / "bin" / "etcd-benchmark.xz"
HOW_TO_GET = (f"pass --tool PATH or set ${TOOL_ENV} to etcd's tools/benchmark binary; build it with "
              "`go build ./tools/benchmark` in a checkout of etcd v3.4 or v3.5 "
              f"(this repository's CI finds it at {SHIPPED})")


SHIPPED_VERSION = "v3.4.23"  # shared/bin/README.md


class ToolMissing(RuntimeError):
    pass


def tool_path(explicit: str | None = None) -> Path:
    """The benchmark binary (unpacked from the shipped .xz when that is what there is)."""
    given = explicit or os.environ.get(TOOL_ENV)
    if given:
        path = Path(given)
        if not path.is_file() or not os.access(path, os.X_OK):
            raise ToolMissing(f"etcd's benchmark tool: no executable at {path} "
                              f"({'--tool' if explicit else '$' + TOOL_ENV}); {HOW_TO_GET}")
        return path
    if not SHIPPED.is_file():
        raise ToolMissing(f"etcd's benchmark tool was not found: {HOW_TO_GET}")
    digest = hashlib.sha256(SHIPPED.read_bytes()).hexdigest()[:16]
    cache = _cache_dir()
    path = cache / f"benchmark-{digest}"
    if not path.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=cache, delete=False) as tmp:
            tmp.write(lzma.decompress(SHIPPED.read_bytes()))
        os.chmod(tmp.name, 0o755)
        os.replace(tmp.name, path)
    return path


def describe(tool: Path) -> str:
    """What the tables say drove etcd's shapes (the tool has no --version flag)."""
    if tool.parent == _cache_dir() and tool.name.startswith("benchmark-"):
        return f"etcd's tools/benchmark {SHIPPED_VERSION} (shared/bin/etcd-benchmark.xz)"
    return f"etcd's tools/benchmark ({tool})"


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "shardetcd"


_NUM = r"[0-9][0-9.]*(?:[eE][-+]?[0-9]+)?"  # --precise prints e.g. 4.9e-08
_FIELD = re.compile(rf"^\s*(Requests/sec|Total|Slowest|Average):\s+({_NUM})", re.M)
_PCT = re.compile(rf"^\s*({_NUM})% in ({_NUM}) secs", re.M)
_COUNT = re.compile(rf"^\s+{_NUM} \[(\d+)\]", re.M)
_ERRORS = re.compile(r"^\s+\[(\d+)\]\s+(.+)$", re.M)
WATCH_EVENTS = "Watch events received summary:"


def parse(output: str) -> dict:
    """Requests/sec, latency percentiles (ms), the count and the errors from the tool's summary.
    The watch command prints two summaries (watch creation, then events received): the second counts."""
    if WATCH_EVENTS in output:
        output = output.split(WATCH_EVENTS, 1)[1]
    body, _, errs = output.partition("Error distribution:")
    fields = {k: float(v) for k, v in _FIELD.findall(body)}
    pcts = {float(p): float(s) * 1000 for p, s in _PCT.findall(body)}
    if "Requests/sec" not in fields or 50.0 not in pcts:
        raise ValueError(f"no summary in the benchmark tool's output:\n{output[-2000:]}")
    errors = {text.strip()[:200]: int(n) for n, text in _ERRORS.findall(errs)}
    return {"req_s": fields["Requests/sec"], "total_s": fields.get("Total", 0.0),
            "n": sum(int(n) for n in _COUNT.findall(body)),
            "p50_ms": pcts[50.0], "p90_ms": pcts.get(90.0), "p99_ms": pcts.get(99.0, pcts[50.0]),
            "p999_ms": pcts.get(99.9), "slowest_ms": fields.get("Slowest", 0.0) * 1000, "errors": errors}


def argv(tool: Path, endpoint: str, scenario, point, total: int) -> list[str]:
    """The tool's command line for one scenario point (scenarios.Scenario, scenarios.Point)."""
    return [str(tool), f"--endpoints={endpoint}", f"--clients={point.clients}", f"--conns={point.conns}", "--precise",
            *scenario.args, *point.flags, f"{scenario.count_flag}={total}"]


def run(tool: Path, endpoint: str, scenario, point, total: int, server_pids: list[int],
        timeout_s: float = 1800, on_window=None) -> dict:
    """Run the tool once; the row carries its summary and, per request, the CPU of the server
    processes (`server_pids`, summed) and of the tool, and the rest of the machine's CPU %.
    `on_window()` is called right before the tool starts and right after it exits (e.g. to read
    disk counters); its two results are returned under "window"."""
    cmd = argv(tool, endpoint, scenario, point, total)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
    extra0 = on_window() if on_window else None
    srv0, busy0, t0 = sum(servers.cpu_seconds(p) for p in server_pids), servers.busy_seconds(), time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env)
        deadline = t0 + timeout_s
        while True:  # wait4 gives the tool's own CPU time (rusage) as it is reaped
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"{' '.join(cmd)} did not finish within {timeout_s:.0f} s")
            time.sleep(0.02)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - t0
        srv = sum(servers.cpu_seconds(p) for p in server_pids) - srv0
        busy = servers.busy_seconds() - busy0
        extra1 = on_window() if on_window else None
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {stderr[-2000:]}{stdout[-1000:]}")
    row = parse(stdout)
    cli = usage.ru_utime + usage.ru_stime
    n = max(row["n"], 1)
    row.update(srv_cpu_us=srv / n * 1e6, cli_cpu_us=cli / n * 1e6, srv_cpu_pct=srv / wall * 100,
               cli_cpu_pct=cli / wall * 100, other_cpu_pct=max(0.0, (busy - srv - cli) / wall * 100),
               wall_s=wall, total=total, command=" ".join(cmd[2:]))
    if on_window:
        row["window"] = (extra0, extra1)
    return row


def seed_range_key(endpoint: str, key: str, size: int) -> None:
    """The key the range shapes read, holding `size` bytes."""
    import grpc

    from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg

    with grpc.insecure_channel(endpoint) as ch:
        pbg.KVStub(ch).Put(pb.PutRequest(key=key.encode(), value=b"v" * size), timeout=30)
