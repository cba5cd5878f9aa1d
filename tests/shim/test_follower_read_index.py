"""A follower's read index request is shared by the calls that wait for it. When every one of
them is gone (cancelled by its client's deadline) and the request then fails, nobody hears the
failure: it is counted (etcd_server_read_indexes_failed_total), and asyncio must not log it as
"Task exception was never retrieved" (seen in chaos, a NATS connection closed under the request)."""
from __future__ import annotations

import asyncio
import gc
import logging
from types import SimpleNamespace

from shards.follow import FollowStats
from shim.follower import WriterLink


def test_a_shared_read_index_that_fails_after_its_callers_left_is_not_logged_as_unretrieved(caplog):
    async def go():
        link = WriterLink(log=None, role="default", store=SimpleNamespace(follow_stats=FollowStats()))
        asked = []

        async def unary(*args, **kwargs):
            asked.append(args[1])
            await asyncio.sleep(0.05)
            raise ConnectionError("nats: connection closed")

        link.unary = unary
        callers = [asyncio.ensure_future(link.read_index()) for _ in range(3)]  # the first asks, later ones share
        await asyncio.sleep(0.01)                                             # the request asked after it
        for c in callers:
            c.cancel()
        await asyncio.gather(*callers, return_exceptions=True)
        await asyncio.sleep(0.2)  # both requests failed meanwhile, heard by nobody
        gc.collect()
        return asked, link.store.follow_stats.read_index_failures

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asked, failures = asyncio.run(go())
        gc.collect()
    assert asked == ["Status", "Status"] and failures == 2
    assert "never retrieved" not in caplog.text, caplog.text
