"""python -m bench.jsread [--messages N] [--records K] [--replicas R] [--checkpoint-mb M]: how fast a
journal on JetStream, and a checkpoint, are read back.

A following standby starting, and a writer recovering after the loss of its machine, read every
message stored since the newest checkpoint (up to --checkpoint-journal-bytes per shard) before
they serve; this times that read. One journal gets N messages of K records each (150-byte
payloads, one publish per message, as a writer at one client stores them); then a journal
opened to follow reads them all (``catch_up``, the read a starting follower does), R rounds of
it. Reported: messages/s and the reader's CPU µs per message (its process, the load being
nats-server's). etcd has no counterpart (a member restarts from its own bbolt file and WAL):
compare with bench.scale's restart for the local journal.

They also fetch each shard's newest checkpoint from its bucket first, which a writer stored there:
with --checkpoint-mb, an object of M MB (random bytes) in a bucket of R replicas is stored R rounds
each way: as shardetcd stores it (``store_object``, a restore's STORE_CHUNKS chunks in flight and a
serving writer's one), timing a journal's writes on the same connection meanwhile, and with
nats-py's ``ObjectStore.put``; then fetched both ways, the way shardetcd fetches it (``fetch_object``: pull
fetches) and with nats-py's ``ObjectStore.get``, in turn. Reported: seconds and MB/s of each.
"""
from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from journal.jetstream import STORE_CHUNKS, JetStreamConfig, JetStreamLog, fetch_object, store_object
from tests.nats_fixture import start_nats_cluster

from . import runargs

async def write(config: JetStreamConfig, scratch: Path, messages: int, records: int) -> None:
    log = await JetStreamLog(config).connect()
    journal = await log.open_journal("j", scratch / "writer")
    await journal.start()
    rev, started = 0, time.monotonic()
    for i in range(messages):
        for _ in range(records):
            rev += 1
            journal.append(1, rev, b"x" * 150)
        await journal.sync()  # one message each
        if (i + 1) % 20000 == 0:
            print(f"  written {i + 1:,}/{messages:,} messages ({time.monotonic() - started:.0f} s)", flush=True)
    await journal.close()
    await log.close()


async def read(config: JetStreamConfig, scratch: Path) -> tuple[int, int, float, float]:
    log = await JetStreamLog(config).connect()
    followed = await log.open_journal("j", scratch / "reader", follow=True)
    followed.hold_unacknowledged = False  # its writer is gone: every message counts
    wall, cpu = time.monotonic(), time.process_time()
    await followed.catch_up()
    wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    count, records = followed.read_tail, sum(1 for _ in followed.records())
    await log.close()
    return count, records, wall, cpu


async def checkpoint_rounds(config: JetStreamConfig, scratch: Path, mb: float, rounds: int) -> list[dict[str, tuple]]:
    """Per round and way: seconds to store an object of ``mb`` MB (store_object with STORE_CHUNKS
    and with one chunk in flight, nats-py's put), with the latencies of a journal's writes on the
    same connection meanwhile, and seconds to fetch it (fetch_object, nats-py's get); each way
    checked byte for byte (what was stored read back by nats-py's get)."""
    import os

    from nats.js.api import ObjectStoreConfig

    log = await JetStreamLog(config).connect()
    try:
        js = log.js
        journal = await log.open_journal("writes", scratch / "writes")
        await journal.start()
        bucket = await js.create_object_store("bench-ckpt", config=ObjectStoreConfig(bucket="bench-ckpt",
                                                                                       replicas=config.replicas))
        data = os.urandom(int(mb * 1e6))
        source, out, times = scratch / "stored", scratch / "fetched", []
        source.write_bytes(data)
        get = lambda: _into(out, lambda f: bucket.get("checkpoint", writeinto=f))  # noqa: E731

        def ours(in_flight: int):
            return lambda: _from(source, lambda f: store_object(log.nc, js, bucket, "bench-ckpt", "checkpoint", f, 10.0,
                                                                in_flight))

        stores = {
            f"store_object, {STORE_CHUNKS} in flight (a restore)": ours(STORE_CHUNKS),
            "store_object, 1 in flight (a serving writer)": ours(1),
            "nats-py's put": lambda: _from(source, lambda f: bucket.put("checkpoint", f)),
        }
        fetches = {
            "fetch_object": lambda: _into(out, lambda f: fetch_object(js, bucket, "bench-ckpt", "checkpoint", f)),
            "nats-py's get": get,
        }
        rev = 0
        for _ in range(rounds):
            took = {}
            for way, run in {**stores, **fetches}.items():
                done, latencies = asyncio.Event(), []

                async def writes():  # one durable write at a time, as a writer at one client
                    nonlocal rev
                    while not done.is_set():
                        rev += 1
                        journal.append(1, rev, b"x" * 300)
                        started = time.perf_counter()
                        await journal.sync()
                        latencies.append(time.perf_counter() - started)

                writer = asyncio.create_task(writes()) if way in stores else None
                started = time.monotonic()
                await run()
                seconds = time.monotonic() - started
                done.set()
                if writer is not None:
                    await writer
                    latencies.sort()
                    took[way] = (seconds, len(latencies), latencies[len(latencies) // 2],
                                 latencies[min(len(latencies) - 1, len(latencies) * 99 // 100)])
                    await get()  # what was stored, as nats-py reads it back
                else:
                    took[way] = (seconds,)
                if out.read_bytes() != data:
                    raise SystemExit(f"bench.jsread: a checkpoint came back different ({way})")
            times.append(took)
        await journal.close()
        return times
    finally:
        await log.close()


def _median(rounds: list[dict[str, tuple]], way: str, i: int) -> float:
    return statistics.median(took[way][i] for took in rounds)


async def _from(path: Path, op) -> None:
    with open(path, "rb") as f:
        await op(f)


async def _into(path: Path, op) -> None:
    with open(path, "wb") as f:
        await op(f)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.jsread", description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=60000)
    p.add_argument("--records", type=int, default=1, help="records per message (default: %(default)s)")
    p.add_argument("--replicas", type=int, default=1, choices=(1, 3), help="NATS servers and stream replicas")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--checkpoint-mb", type=float, default=0.0,
                   help="also store and fetch a checkpoint of this many MB each way (default: %(default)s, none)")
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="shardetcd-bench-jsread-"))
    nats = start_nats_cluster(tmp / "nats", size=args.replicas)
    try:
        config = JetStreamConfig(urls=tuple(nats.urls.split(",")), prefix="bench", replicas=args.replicas)
        print(f"bench.jsread: {args.messages:,} messages of {args.records} record(s), JetStream R{args.replicas}; "
              f"data under {tmp}", flush=True)
        asyncio.run(write(config, tmp, args.messages, args.records))
        rows = []
        for i in range(args.rounds):
            count, records, wall, cpu = asyncio.run(read(config, tmp))
            rows.append((count / wall, cpu / count * 1e6))
            print(f"  round {i + 1}: {count:,} messages ({records:,} records) in {wall:.2f} s: "
                  f"{count / wall:,.0f} messages/s, reader CPU {cpu / count * 1e6:.0f} µs/message", flush=True)
        print(f"median: {statistics.median(r[0] for r in rows):,.0f} messages/s, "
              f"{statistics.median(r[1] for r in rows):.0f} µs/message of reader CPU", flush=True)
        if args.checkpoint_mb:
            mb = args.checkpoint_mb
            rounds = asyncio.run(checkpoint_rounds(replace(config, prefix="bench-ckpt"), tmp, mb, args.rounds))
            for i, took in enumerate(rounds):
                print(f"  checkpoint round {i + 1}, {mb:g} MB: " + ", ".join(f"{way} {t[0]:.3f} s" for way, t in took.items()),
                      flush=True)
            print(f"checkpoint medians of {args.rounds} rounds, {mb:g} MB:", flush=True)
            for way, first in rounds[0].items():
                line = f"  {way}: {_median(rounds, way, 0):.3f} s ({mb / _median(rounds, way, 0):,.1f} MB/s)"
                if len(first) > 1:
                    line += (f"; a journal's writes meanwhile on the same connection: p50 {_median(rounds, way, 2) * 1e3:.1f} ms, "
                             f"p99 {_median(rounds, way, 3) * 1e3:.1f} ms ({_median(rounds, way, 1):,.0f} writes)")
                print(line, flush=True)
    finally:
        nats.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    runargs.run(main)
