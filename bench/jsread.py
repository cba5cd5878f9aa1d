"""python -m bench.jsread [--messages N] [--records K] [--replicas R]: how fast a journal on
JetStream is read back.

A following standby starting, and a writer recovering after the loss of its machine, read every
message stored since the newest checkpoint (up to --checkpoint-journal-bytes per shard) before
they serve; this times that read. One journal gets N messages of K records each (150-byte
payloads, one publish per message, as a writer at one client stores them); then a journal
opened to follow reads them all (``catch_up``, the read a starting follower does), R rounds of
it. Reported: messages/s and the reader's CPU µs per message (its process, the load being
nats-server's). etcd has no counterpart (a member restarts from its own bbolt file and WAL):
compare with bench.scale's restart for the local journal.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from journal.jetstream import JetStreamConfig, JetStreamLog
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.jsread", description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=60000)
    p.add_argument("--records", type=int, default=1, help="records per message (default: %(default)s)")
    p.add_argument("--replicas", type=int, default=1, choices=(1, 3), help="NATS servers and stream replicas")
    p.add_argument("--rounds", type=int, default=3)
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
    finally:
        nats.stop()
    return 0


if __name__ == "__main__":
    runargs.run(main)
