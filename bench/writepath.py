"""python -m bench.writepath: what the store and its journal add to a durable write,
without gRPC (issue 16.1).

In one process, on this machine's disk (the directory given, default a temp dir
under /var/tmp), N coroutines each write in a closed loop:

  group-commit   the ceiling's GroupCommit (bench/ceiling.py): append the request's
                 bytes to a file, answered once a write + fdatasync covering them
                 returned; nothing else. What any durable Python server must do.
  store          shardetcd's Store.put (the default layout, journal fsync=always):
                 the MVCC state on /dev/shm, the journal record, the group commit
                 in the journal's writer thread, the committed watermark.
  store-nosync   the same with journal fsync=off: the store's own cost, no disk.

Per variant and number of writers: puts/s and CPU µs per put (the process's CPU,
every thread, from the kernel), the median of --rounds interleaved rounds, on the
server's default event loop (uvloop; --event-loop asyncio for the standard one). The
difference store − group-commit is what shardetcd adds to a durable write beyond
the disk; bench/README.md compares it with a whole put over gRPC.

    python -m bench.writepath                 # 1, 8, 64 writers, 5 rounds of 3,000 puts
    python -m bench.writepath --puts 500 --rounds 1     # a smoke run
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from journal import JournalConfig
from shards.layout import load_layout
from shards.store import Store, StoreConfig
from shards.types import PutReq
from shim.loop import EVENT_LOOPS, default_event_loop, run as run_on_loop

from . import runargs
from .ceiling import GroupCommit

VALUE = b"v" * 256
VARIANTS = ("group-commit", "store", "store-nosync")


def _key(i: int) -> bytes:
    return i.to_bytes(8, "big")


async def _drive(put, writers: int, puts: int) -> tuple[float, float]:
    """`writers` closed loops share `puts` writes; (wall seconds, CPU seconds)."""
    counter = iter(range(puts))

    async def one() -> None:
        for i in counter:
            await put(i)

    cpu0, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one() for _ in range(writers)))
    return time.perf_counter() - t0, time.process_time() - cpu0


async def run_variant(variant: str, directory: Path, writers: int, puts: int) -> dict:
    directory.mkdir(parents=True)
    if variant == "group-commit":
        gc = GroupCommit(str(directory), "hybrid")  # shardetcd's journal's policy
        request = b"\x0a\x08" + _key(0) + b"\x12\x80\x02" + VALUE  # a PutRequest's size

        async def put(i: int) -> None:
            await gc.append(request)

        await _drive(put, writers, min(puts, 200))  # warm-up
        wall, cpu = await _drive(put, writers, puts)
        gc.close()
    else:
        fsync = "off" if variant == "store-nosync" else "always"
        state = Path(tempfile.mkdtemp(prefix="shardetcd-writepath-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
        store = await Store.open(StoreConfig(data_dir=directory / "data", layout=load_layout(None), state_dir=state,
                                             journal=JournalConfig(fsync=fsync)))
        try:
            async def put(i: int) -> None:
                await store.put(PutReq(key=_key(i), value=VALUE))

            await _drive(put, writers, min(puts, 200))
            wall, cpu = await _drive(put, writers, puts)
        finally:
            await store.close()
            shutil.rmtree(state, ignore_errors=True)
    return {"variant": variant, "writers": writers, "puts": puts, "puts_s": puts / wall, "cpu_us": cpu / puts * 1e6}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.writepath", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--writers", default="1,8,64", help="comma-separated numbers of concurrent writers")
    ap.add_argument("--puts", type=int, default=3_000, help="puts per run")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds; medians are reported")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--dir", type=Path, default=None, help="where the journals go (default: a temp dir under /var/tmp)")
    ap.add_argument("--json", type=Path, default=None, help="also write every run here")
    ap.add_argument("--event-loop", choices=EVENT_LOOPS, default=default_event_loop(),
                    help="the loop every run uses (default: the server's default, %(default)s)")
    args = ap.parse_args(argv)
    writers = [int(w) for w in args.writers.split(",")]
    variants = args.variants.split(",")
    base = Path(tempfile.mkdtemp(prefix="shardetcd-writepath-", dir=args.dir or "/var/tmp"))
    runs: list[dict] = []
    try:
        for r in range(args.rounds):
            for w in writers:
                for v in variants:
                    row = run_on_loop(run_variant(v, base / f"{r}-{w}-{v}", w, args.puts), args.event_loop)
                    runs.append(row)
                    print(f"  round {r + 1}/{args.rounds} {v:<13} {w:>3} writers {row['puts_s']:8,.0f} puts/s "
                          f"{row['cpu_us']:6.0f} µs CPU/put", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print()
    print("| writers | " + " | ".join(f"{v} puts/s | {v} CPU µs/put" for v in variants) + " | store − group-commit µs/put |")
    print("|---|" + "---|---|" * len(variants) + "---|")
    for w in writers:
        med = {v: (statistics.median(x["puts_s"] for x in runs if x["variant"] == v and x["writers"] == w),
                   statistics.median(x["cpu_us"] for x in runs if x["variant"] == v and x["writers"] == w))
               for v in variants}
        extra = (f"{med['store'][1] - med['group-commit'][1]:.0f}" if {"store", "group-commit"} <= set(med) else "")
        print(f"| {w} | " + " | ".join(f"{med[v][0]:,.0f} | {med[v][1]:.0f}" for v in variants) + f" | {extra} |")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "cores": os.cpu_count(), "event_loop": args.event_loop},
                                        indent=1))
    return 0


if __name__ == "__main__":
    runargs.run(main)
