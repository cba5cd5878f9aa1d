"""Who serves a replicated journal: the writer and its followers, as etcd members.

Each serving process announces itself every ``ANNOUNCE_S`` in the journal's
``<prefix>-members`` bucket (key ``<role>.<member id>``; an entry lapses
``TTL_S`` after its process stops announcing), and MemberList answers with
every live entry of its role, sorted by id as etcd lists members.  A standby
does not serve, so it is not a member until it takes over.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time

from journal.tasks import cancel_and_wait
from proto import rpc_pb2 as pb

logger = logging.getLogger(__name__)

ANNOUNCE_S = 2.0
TTL_S = 10.0
CACHE_S = 1.0


class Registry:
    def __init__(self, log, role: str, me: pb.Member) -> None:
        self.log = log
        self.prefix = f"{role}."
        self.me = me
        self._cache: tuple[float, list[pb.Member]] = (0.0, [])
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        """Announce this member once now (its bucket is made while NATS is known to
        answer, at start), then every ANNOUNCE_S."""
        await self.log.announce(f"{self.prefix}{self.me.ID:x}", self._record(), TTL_S)
        self._task = asyncio.ensure_future(self._announce())

    def _record(self) -> str:
        return json.dumps({"ID": self.me.ID, "name": self.me.name, "peerURLs": list(self.me.peerURLs),
                           "clientURLs": list(self.me.clientURLs)})

    async def stop(self) -> None:
        await cancel_and_wait(self._task)  # a cancel can be lost in NATS's wait_for (journal/tasks.py)
        if withdraw := getattr(self.log, "withdraw", None):  # a local journal's members: a file each in tmpfs
            withdraw(f"{self.prefix}{self.me.ID:x}")  # (in NATS's bucket the entry lapses after TTL_S)

    async def _announce(self) -> None:
        record = self._record()
        while True:
            await asyncio.sleep(ANNOUNCE_S)
            try:
                await self.log.announce(f"{self.prefix}{self.me.ID:x}", record, TTL_S)
            except Exception as exc:  # noqa: BLE001 - NATS unreachable: try again next round
                logger.info("member not announced error=%r", exc)

    async def members(self) -> list[pb.Member]:
        """Every member that announced itself lately (this one always), by id."""
        at, cached = self._cache
        if time.monotonic() - at < CACHE_S:
            return cached
        try:
            found = [json.loads(v) for v in await self.log.announced(self.prefix, TTL_S)]
        except Exception as exc:  # noqa: BLE001 - NATS unreachable: this member alone
            logger.info("members not listed error=%r", exc)
            found = []
        by_id = {m["ID"]: pb.Member(**m) for m in found}
        by_id[self.me.ID] = self.me
        members = [by_id[i] for i in sorted(by_id)]
        self._cache = (time.monotonic(), members)
        return members
