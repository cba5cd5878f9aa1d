"""shim.server.bounded: a stop that hangs ends the process, saying where it hung; and what a start
has bound by the time the client port serves."""
import asyncio
import logging

import pytest

from shim.server import bounded, stop_then_the_rest


def test_a_stop_that_does_not_end_logs_where_it_waits_and_exits_1(caplog):
    exits = []

    async def main():
        never = asyncio.Event()

        async def release_the_lease():
            await never.wait()

        async def stop():
            await release_the_lease()

        await bounded(stop(), 0.2, exit=exits.append)

    with caplog.at_level(logging.CRITICAL, logger="shim.server"):
        asyncio.run(asyncio.wait_for(main(), 10))
    assert exits == [1]
    assert "stop did not end within" in caplog.text and "release_the_lease" in caplog.text, caplog.text


def test_a_stop_waiting_for_work_in_progress_is_not_cut_short():
    exits, asked = [], []

    async def main():
        checkpoint = asyncio.create_task(asyncio.sleep(0.5))  # a checkpoint being written, longer than the bound

        async def stop():
            await checkpoint
            return "stopped"

        def working() -> bool:
            asked.append(1)
            return not checkpoint.done()

        assert await bounded(stop(), 0.1, working=working, exit=exits.append) == "stopped"

    asyncio.run(asyncio.wait_for(main(), 10))
    assert exits == [] and len(asked) >= 2  # asked each time the bound passed


def test_a_stop_that_still_runs_on_after_the_work_it_waited_for_gets_a_whole_bound():
    """The stop waits for a checkpoint, then has a little more to do. The watchdog's check that
    falls between the two sees no work in progress and a stop not yet ended: it must give the stop
    another bound, not end the process (seen once in CI as the test above)."""
    exits = []

    async def main():
        checkpoint = asyncio.create_task(asyncio.sleep(0.9))  # checks at 0.2 .. 0.8 see it running

        async def stop():
            await checkpoint
            await asyncio.sleep(0.15)  # the check at 1.0 falls here: work done, stop not yet
            return "stopped"

        assert await bounded(stop(), 0.2, working=lambda: not checkpoint.done(), exit=exits.append) == "stopped"

    asyncio.run(asyncio.wait_for(main(), 10))
    assert exits == []


def test_a_stop_that_ends_in_time_returns_what_it_returned_or_raised():
    exits = []

    async def stop(fail: bool):
        await asyncio.sleep(0.01)
        if fail:
            raise OSError("closing")
        return "stopped"

    async def main():
        assert await bounded(stop(False), 5, exit=exits.append) == "stopped"
        with pytest.raises(OSError):
            await bounded(stop(True), 5, exit=exits.append)

    asyncio.run(main())
    assert exits == []


def test_after_the_stop_every_task_left_is_ended_even_one_that_loses_a_cancel():
    async def main():
        lost, ended = [], asyncio.Event()

        async def loses_its_first_cancel():  # as a loop over NATS's wait_for can on Python 3.11
            try:
                while True:
                    try:
                        await asyncio.sleep(30)
                    except asyncio.CancelledError:
                        if lost:
                            raise
                        lost.append(1)
            finally:
                ended.set()

        async def stop():
            await asyncio.sleep(0)

        spared = asyncio.all_tasks()  # this test's own (serve() spares its task)
        left = asyncio.create_task(loses_its_first_cancel())
        await asyncio.sleep(0)
        await stop_then_the_rest(stop(), *spared)
        assert left.cancelled() and lost == [1] and ended.is_set()

    asyncio.run(asyncio.wait_for(main(), 10))  # a deadline for a hang, not a timing


def test_the_metrics_urls_are_bound_before_the_client_port_serves(tmp_path, monkeypatch):
    """Whoever finds the client port serving finds the metrics URLs too (a probe of /health, or a
    test's scrape right after a start): they are listening when the gRPC server starts."""
    import socket

    from shim import grpcserver, server
    from shim.config import ServerConfig
    from tests.etcd_fixture import free_port

    client, metrics = free_port(), free_port()
    config = ServerConfig(data_dir=tmp_path / "data", state_dir=tmp_path / "state",
                          listen_client_urls=(f"http://127.0.0.1:{client}",),
                          listen_metrics_urls=(f"http://127.0.0.1:{metrics}",))
    listening = []
    real_start = grpcserver.Server.start

    async def start(self):
        try:
            socket.create_connection(("127.0.0.1", metrics), timeout=2).close()
            listening.append(True)
        except OSError:
            listening.append(False)
        return await real_start(self)

    monkeypatch.setattr(grpcserver.Server, "start", start)

    async def main():
        running = await server.start(config)
        await server.stop(running)

    asyncio.run(asyncio.wait_for(main(), 60))
    assert listening == [True]
