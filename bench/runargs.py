"""What every bench entry point shares: its mode flags, etcd's tool, waiting for a
quiet machine before a run, where results go, and the elapsed-time progress line."""
from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from . import etcdtool
from .servers import machine_busy

RESULTS = Path(__file__).resolve().parent / "results"
QUIET_WAIT_S = {"tiny": 0.0, "quick": 10.0, "full": 60.0}  # the longest wait for a quiet machine, per mode


def add_tool(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--tool", default=None,
                    help=f"etcd's benchmark binary (default: ${etcdtool.TOOL_ENV}, else {etcdtool.SHIPPED})")


def tool_or_exit(args: argparse.Namespace, prog: str) -> str:
    """etcd's tool from --tool, the environment or beside the checkout; else say how to get it, exit 2."""
    try:
        return etcdtool.tool_path(args.tool)
    except etcdtool.ToolMissing as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def add_quiet(ap: argparse.ArgumentParser, waits: dict[str, float] = QUIET_WAIT_S, before: str = "each run") -> None:
    defaults = ", ".join(f"{s:g} s {m}" if s else f"0 {m}" for m, s in waits.items())
    ap.add_argument("--quiet-wait", type=float, default=None,
                    help=f"before {before}, wait up to this many seconds for other CPU load on the machine to drop "
                         f"below --quiet-below (default {defaults})")
    ap.add_argument("--quiet-below", type=float, default=25.0, help="percent of one core (default 25)")


def add_out(ap: argparse.ArgumentParser, what: str = "the JSON and Markdown") -> None:
    ap.add_argument("--out", type=Path, default=RESULTS, help=f"where {what} go (default bench/results)")


def mode_of(args: argparse.Namespace) -> str:
    return "tiny" if args.tiny else "quick" if args.quick else "full"


def quiet_wait_s(args: argparse.Namespace, mode: str, waits: dict[str, float] = QUIET_WAIT_S) -> float:
    return args.quiet_wait if args.quiet_wait is not None else waits[mode]


def wait_quiet(seconds: float, below: float) -> float:
    """Wait up to ``seconds`` until the rest of the machine uses less than ``below`` % of a
    core; return the last reading (0 without waiting when ``seconds`` is 0)."""
    if not seconds:
        return 0.0
    deadline = time.monotonic() + seconds
    while True:
        busy = machine_busy(0.5)
        if busy < below or time.monotonic() > deadline:
            return busy


def etcd_and_shardetcd(servers: str) -> list[str]:
    """--servers of a bench that runs etcd and shardetcd in turn: the names given; others refused."""
    names = [s for s in servers.split(",") if s]
    if unknown := [n for n in names if n not in ("etcd", "shardetcd")]:
        raise SystemExit(f"unknown server(s) {unknown}: etcd, shardetcd")
    return names


def each_server(names: list[str], prefix: str, run: Callable[[str, Path], list[dict]]) -> list[dict]:
    """``run(name, scratch)`` for each server in turn, each in a scratch directory of its own
    under /var/tmp (all removed at the end); their rows, in order."""
    scratch = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    rows: list[dict] = []
    try:
        for name in names:
            (scratch / name).mkdir()
            rows += run(name, scratch / name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return rows


def save(out: Path, stamp: str, bench: str, meta: dict, rows: list[dict], title: str, md: str) -> None:
    """A run's ``<stamp>-<bench>.json`` (``meta`` and its rows) and ``.md`` (``title``, the table) in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stamp}-{bench}.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    (out / f"{stamp}-{bench}.md").write_text(f"# bench.{bench} {stamp}: {title}\n\n{md}\n")


def progress(t_begin: float) -> Callable[[str], None]:
    """A printer of progress lines stamped with the seconds since ``t_begin``."""
    def log(line: str) -> None:
        print(f"  [{time.monotonic() - t_begin:5.0f}s] {line}", flush=True)

    return log


def _terminated(signum, frame) -> None:
    raise SystemExit(128 + signum)


def run(main: Callable[[], int | None]) -> None:
    """Run a bench entry point as a program. SIGTERM ends it as an exception in the main thread,
    so the finally blocks that started its servers stop them (by PID) instead of leaving them
    running, e.g. when a test that ran the bench times out."""
    signal.signal(signal.SIGTERM, _terminated)
    sys.exit(main())
