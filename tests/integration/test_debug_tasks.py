"""--enable-pprof: /debug/tasks, what every task and thread of a server is doing (shim/debug.py).

etcd's flag serves the Go runtime's goroutine stacks, what an operator reads first when a server
hangs; shardetcd's work is asyncio tasks, each shown down to what it waits on."""
from __future__ import annotations

import threading

import grpc

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.integration.test_metrics import get as _get
from tests.shardetcd_fixture import start_shardetcd


def test_debug_tasks_shows_each_task_down_to_what_it_waits_on_and_every_thread(tmp_path):
    server = start_shardetcd(tmp_path, extra_args=("--enable-pprof",))
    try:
        done = threading.Event()

        def requests():
            yield pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"k"))
            done.wait(30)

        with grpc.insecure_channel(server.endpoint) as channel:
            watching = pbg.WatchStub(channel).Watch(requests())
            assert next(watching).created  # a Watch stream open: a task serving it, waiting for events
            status, text = _get(f"{server.client_url}/debug/tasks")
            done.set()
            watching.cancel()
        assert status == 200, text
        tasks = text.split("\ntask ")
        expiry = next(t for t in tasks if t.startswith("Task") and "Store._expire_leases" in t.splitlines()[0])
        # the chain of awaits, from the task's coroutine down to the sleep it waits in
        assert "in _expire_leases" in expiry and "in sleep" in expiry and "waiting on a future" in expiry
        assert any("shim/watch.py" in t for t in tasks), text
        assert "\nthread MainThread\n" in text and " threads\n" in text
        assert _get(f"{server.client_url}/debug/pprof/")[0] == 404  # Go's profiles: not a Python server's
    finally:
        server.stop()


def test_without_the_flag_there_is_no_debug_path(shardetcd):
    assert _get(f"{shardetcd.client_url}/debug/tasks") == (404, "404 page not found\n")


def test_a_standby_serves_debug_tasks_on_its_metrics_urls_too():
    """A standby's metrics URLs have an endpoint of their own (no member, no store yet)."""
    import asyncio

    from shim.config import ServerConfig
    from shim.server import StandbyStatus

    async def ask(enabled: bool):
        return StandbyStatus(ServerConfig(enable_pprof=enabled)).route("GET", "/debug/tasks")

    status, _, body = asyncio.run(ask(True))
    assert status == 200 and b"ask" in body and b"\nthread MainThread\n" in body
    assert asyncio.run(ask(False))[0] == 404
