"""A follower answers a keep-alive itself only while the lease's latest renewal at the writer is
recent (shim/follower.py KeepAlives): its answer says the lease has its whole TTL, and the writer
only promised that from the renewal on, so the answer may be at most two batch intervals (1 s)
late, where etcd's leader answers from the renewal itself."""
from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from shim.follower import KeepAlives


async def answered_at_once(ttl: int, renewed_s_ago: float) -> bool:
    link = SimpleNamespace(timeout_s=5.0, store=SimpleNamespace(leases={7: object()}))
    keepalives = KeepAlives(link, interval_s=0.5)
    keepalives._task = asyncio.get_running_loop().create_future()  # no stream to the writer in this test
    keepalives.renewed[7] = (time.monotonic() - renewed_s_ago, ttl)
    try:
        return await asyncio.wait_for(keepalives.keepalive(7), 0.2) == ttl
    except TimeoutError:
        assert 7 in keepalives.waiting and 7 in keepalives.pending  # waits for the writer's answer
        return False
    finally:
        keepalives._task.cancel()


@pytest.mark.parametrize("ttl, renewed_s_ago, at_once", [
    (60, 0.1, True), (60, 0.9, True),
    (60, 1.1, False), (60, 30.0, False),  # long within its TTL, but the answer would promise 1.1 s too much
    (2, 0.4, True), (2, 0.6, False),  # a short lease: not within 3 intervals of its deadline
])
def test_a_keep_alive_is_answered_by_the_follower_only_just_after_a_renewal(ttl, renewed_s_ago, at_once):
    assert asyncio.run(answered_at_once(ttl, renewed_s_ago)) is at_once


class EndedCall:
    """A keep-alive stream the writer ended (it died): writes refused as grpc.aio refuses them,
    the answers ending with the call's error."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def write(self, _):
        raise asyncio.InvalidStateError("RPC already finished.")

    def __aiter__(self):
        return self

    async def __anext__(self):
        await asyncio.sleep(0.05)
        raise self.error

    def cancel(self) -> None:
        pass


def test_a_stream_the_writer_ended_says_why_not_that_a_write_came_too_late():
    """The stream ends with the call's own error (what the log line names), not with the
    InvalidStateError a renewal written to the finished call meets."""
    async def main():
        gone = ConnectionResetError("writer gone")
        link = SimpleNamespace(timeout_s=5.0, leads_to=lambda channel: True)
        keepalives = KeepAlives(link, interval_s=0.01)
        keepalives.pending.add(7)
        channel = SimpleNamespace(stream_stream=lambda *a, **kw: lambda metadata: EndedCall(gone))
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(keepalives._stream_on(channel), 5)

    asyncio.run(main())
