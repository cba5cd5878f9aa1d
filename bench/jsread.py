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

They also fetch each shard's newest checkpoint from its bucket first: with --checkpoint-mb, an
object of M MB (random bytes) in a bucket of R replicas is fetched R rounds both ways, the way
shardetcd fetches it (``fetch_object``: pull fetches) and with nats-py's ``ObjectStore.get``, in
turn. Reported: seconds and MB/s of each.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from journal.jetstream import JetStreamConfig, JetStreamLog, fetch_object
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
    wall, cpu = time.monotonic(), time.process_time()
    await followed.catch_up()
    wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    count, records = followed.read_tail, sum(1 for _ in followed.records())
    await log.close()
    return count, records, wall, cpu


async def checkpoint_fetches(urls: str, replicas: int, scratch: Path, mb: float, rounds: int) -> list[tuple[float, float]]:
    """Seconds to fetch an object of ``mb`` MB with fetch_object and with nats-py's get, per round."""
    import os

    import nats
    from nats.js.api import ObjectStoreConfig

    nc = await nats.connect(servers=urls.split(","))
    try:
        js = nc.jetstream()
        bucket = await js.create_object_store("bench-ckpt", config=ObjectStoreConfig(bucket="bench-ckpt",
                                                                                       replicas=replicas))
        data = os.urandom(int(mb * 1e6))
        await bucket.put("checkpoint", data)
        out, times = scratch / "fetched", []
        for _ in range(rounds):
            took = []
            for how in (lambda f: fetch_object(js, bucket, "bench-ckpt", "checkpoint", f),
                        lambda f: bucket.get("checkpoint", writeinto=f)):
                started = time.monotonic()
                with open(out, "wb") as f:
                    await how(f)
                took.append(time.monotonic() - started)
                if out.read_bytes() != data:
                    raise SystemExit("bench.jsread: a checkpoint came back different from what was stored")
            times.append((took[0], took[1]))
        return times
    finally:
        await nc.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.jsread", description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=60000)
    p.add_argument("--records", type=int, default=1, help="records per message (default: %(default)s)")
    p.add_argument("--replicas", type=int, default=1, choices=(1, 3), help="NATS servers and stream replicas")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--checkpoint-mb", type=float, default=0.0,
                   help="also fetch a checkpoint of this many MB both ways (default: %(default)s, none)")
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
            fetches = asyncio.run(checkpoint_fetches(nats.urls, args.replicas, tmp, args.checkpoint_mb, args.rounds))
            for i, (ours, theirs) in enumerate(fetches):
                print(f"  checkpoint round {i + 1}: {args.checkpoint_mb:g} MB in {ours:.3f} s (fetch_object), "
                      f"{theirs:.3f} s (nats-py's get)", flush=True)
            ours, theirs = (statistics.median(f[k] for f in fetches) for k in (0, 1))
            print(f"checkpoint median: fetch_object {ours:.3f} s ({args.checkpoint_mb / ours:,.1f} MB/s), "
                  f"nats-py's get {theirs:.3f} s ({args.checkpoint_mb / theirs:,.1f} MB/s)", flush=True)
    finally:
        nats.stop()
    return 0


if __name__ == "__main__":
    runargs.run(main)
