"""The native gRPC server's connection bookkeeping, driven directly on an in-memory transport
(the test is the client, every byte of it counted):

* receive windows: what it credits back on a stream is exactly what the client sent on it,
  compressed messages included, so a client that keeps to its windows is never refused and
  one that does not is (the refusals themselves are compared with etcd's in
  tests/integration/test_http2_differential.py);
* the handshake timeout: a connection that never sends its preface is not held;
* unary calls started at once (``shim.handlers.eager``): run while their last frame is read,
  handed to a task where they first wait, cancelled and answered as a task's call is.
"""
from __future__ import annotations

import asyncio
import gzip
import random
from types import SimpleNamespace

import grpc
import hpack
import pytest

from journal.tasks import awaiting
from shim import grpcserver as gs
from shim.context import Member
from shim.handlers import eager
from tests.integration.h2kit import (
    DATA, END_HEADERS, END_STREAM, HEADERS, PREFACE, RST_STREAM, SETTINGS, WINDOW_UPDATE, frame, grpc_message,
    hpack_literals, split_frames,
)


class Transport:
    def __init__(self) -> None:
        self.out = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.out += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name, default=None):
        return default

    def get_write_buffer_size(self) -> int:
        return 0

    def can_write_eof(self) -> bool:
        return False


def frames(data: bytes) -> list[tuple[int, int, bytes]]:
    """(type, stream, payload) of each whole frame in ``data``."""
    return [(kind, sid, payload) for kind, _, sid, payload in split_frames(data)[0]]


def message(body: bytes, compressed: bool) -> bytes:
    return grpc_message(gzip.compress(body) if compressed else body, compressed)


def connected(method: grpc.RpcMethodHandler, extra_headers=()) -> tuple[gs.Server, gs.Connection, Transport, bytes]:
    """A server whose one method is ``method``, a connection to it on an in-memory transport (on
    the running loop), and the bytes that open a call of that method on stream 1."""
    server = gs.Server()
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("t.S", {"M": method})])
    server.loop = asyncio.get_running_loop()
    conn, transport = gs.Connection(server), Transport()
    conn.connection_made(transport)
    headers = [(":method", "POST"), (":scheme", "http"), (":path", "/t.S/M"), (":authority", "x"),
               ("content-type", "application/grpc"), ("te", "trailers"), *extra_headers]
    return server, conn, transport, PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, END_HEADERS, 1,
                                                                            hpack_literals(headers))


def open_call(handler, extra_headers=()) -> tuple[gs.Connection, Transport]:
    """A connection to a server whose one method (a bidi stream) is ``handler``, with that
    method's call opened on stream 1."""
    _, conn, transport, opening = connected(grpc.stream_stream_rpc_method_handler(handler), extra_headers)
    conn.data_received(opening)
    return conn, transport


async def stream_through(bodies: list[bytes], compressed: bool, frame_bytes: int = 16384):
    """Send ``bodies`` on one bidi call as a client keeping to the stream window would (the
    server takes each message as it comes); return (bytes sent on the stream, bytes credited
    back, the messages the handler took, reset codes)."""
    taken: list[bytes] = []

    async def handler(requests, context):
        async for request in requests:
            taken.append(request)
        yield b"done"

    conn, transport = open_call(handler, [("grpc-encoding", "gzip")] if compressed else [])
    wire = b"".join(message(b, compressed) for b in bodies)
    window, sent, credited, seen, resets = gs.DEFAULT_WINDOW, 0, 0, 0, []
    while sent < len(wire) or len(taken) < len(bodies):
        for _ in range(3):
            await asyncio.sleep(0)  # the handler takes what arrived
        for kind, sid, payload in frames(bytes(transport.out[seen:])):
            seen += 9 + len(payload)
            if kind == SETTINGS and payload:
                settings = {int.from_bytes(payload[i:i + 2], "big"): int.from_bytes(payload[i + 2:i + 6], "big")
                            for i in range(0, len(payload), 6)}
                window += settings.get(gs.SETTINGS_INITIAL_WINDOW_SIZE, window) - gs.DEFAULT_WINDOW
            elif kind == WINDOW_UPDATE and sid == 1:
                credited += int.from_bytes(payload, "big")
                window += int.from_bytes(payload, "big")
            elif kind == RST_STREAM:
                resets.append(int.from_bytes(payload, "big"))
        if resets:
            break
        chunk = wire[sent:sent + min(frame_bytes, window)]
        if chunk:
            conn.data_received(frame(DATA, 0, 1, chunk))
            sent += len(chunk)
            window -= len(chunk)
    conn.data_received(frame(DATA, END_STREAM, 1))  # the stream stays open until all was taken
    for _ in range(5):
        await asyncio.sleep(0)
    conn.connection_lost(None)
    return sent, credited, taken, resets


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("content", ["random", "zeros"])
def test_credits_match_what_the_client_sent(compressed, content):
    """Three stream windows of requests pass through one call as the server takes them (the client
    is never left without window, nor reset), and what it credits back never exceeds what was sent
    (a compressed message is credited its size on the wire, not its size)."""
    rng = random.Random(3)
    size = 3 * gs.STREAM_WINDOW // 40
    bodies = [rng.randbytes(size) if content == "random" else bytes(size) for _ in range(40)]
    sent, credited, taken, resets = asyncio.run(stream_through(bodies, compressed))
    assert resets == [] and taken == bodies
    assert credited <= sent, (sent, credited)
    if not (compressed and content == "zeros"):  # (zeros compress to almost nothing)
        assert sent > 2 * gs.STREAM_WINDOW and credited > gs.STREAM_WINDOW, (sent, credited)


def test_a_client_past_its_window_is_reset():
    """A client that sends more than the stream window before the server took any of it: the stream
    is reset FLOW_CONTROL_ERROR and nothing past the window is held."""

    async def overrun():
        never = asyncio.Event()

        async def handler(requests, context):
            await never.wait()  # takes nothing
            yield b""

        conn, transport = open_call(handler)
        chunk = frame(DATA, 0, 1, bytes(16384))
        for _ in range(gs.STREAM_WINDOW // 16384):
            conn.data_received(chunk)
        await asyncio.sleep(0)
        assert 1 in conn.calls and not [f for f in frames(bytes(transport.out)) if f[0] == RST_STREAM]
        held = len(conn.calls[1].messages)
        conn.data_received(frame(DATA, 0, 1, b"\0"))  # one byte over
        await asyncio.sleep(0)  # frames go out at the end of the loop turn
        resets = [(sid, int.from_bytes(p, "big")) for kind, sid, p in frames(bytes(transport.out))
                  if kind == RST_STREAM]
        assert resets == [(1, gs.FLOW_CONTROL_ERROR)] and 1 not in conn.calls
        assert held == gs.STREAM_WINDOW // 5  # empty messages of 5 bytes each, all within the window
        conn.connection_lost(None)

    asyncio.run(overrun())


def test_a_connection_without_a_preface_is_not_held():
    """A connection that sends nothing, or half the HTTP/2 preface, is closed after the handshake
    timeout (grpc-go's 120 s; 0.2 s here); one that sent its preface is not."""

    async def connections():
        server = gs.Server(gs.ServerOptions(handshake_timeout_s=0.2))
        server.loop = asyncio.get_running_loop()
        silent, half, whole = ((gs.Connection(server), Transport()) for _ in range(3))
        for conn, transport in (silent, half, whole):
            conn.connection_made(transport)
        half[0].data_received(PREFACE[:10])
        whole[0].data_received(PREFACE + frame(SETTINGS, 0, 0))
        await asyncio.sleep(0.4)
        assert (silent[1].closed, half[1].closed, whole[1].closed) == (True, True, False)
        for conn, _ in (silent, half, whole):
            conn.connection_lost(None)

    asyncio.run(connections())


# -- unary calls started at once (handlers.eager) -----------------------------------------------


async def unary_call(fn, then=None, more: bytes = b"") -> tuple[gs.Server, gs.Connection, Transport]:
    """A server whose one method is the unary ``fn``, with a call of it sent whole on stream 1
    (and ``more`` bytes in the same read), read as a transport delivers bytes: in a loop
    callback, outside any task (``then()`` runs right after, in the same callback)."""
    server, conn, transport, opening = connected(grpc.unary_unary_rpc_method_handler(fn))

    def deliver() -> None:
        conn.data_received(opening + frame(DATA, END_STREAM, 1, grpc_message(b"ask")) + more)
        if then is not None:
            then(server, conn)

    server.loop.call_soon(deliver)
    await asyncio.sleep(0)
    return server, conn, transport


def answer(transport: Transport) -> tuple[list[bytes], str | None, str | None]:
    """Stream 1's messages, grpc-status and grpc-message as written so far."""
    decoder, messages, status, details = hpack.Decoder(), [], None, None
    for kind, sid, payload in frames(bytes(transport.out)):
        if sid != 1:
            continue
        if kind == DATA and payload:
            messages.append(payload[5:])
        elif kind == HEADERS:
            fields = dict(decoder.decode(payload))
            status, details = fields.get("grpc-status", status), fields.get("grpc-message", details)
    return messages, status, details


async def turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


@pytest.mark.parametrize("marked", [True, False], ids=["eager", "task"])
def test_an_eager_call_runs_within_the_frame_that_completes_it(marked):
    """A unary method marked eager runs while the frame that completes its request is read, in no
    task; one not marked runs in a task of its own on a later loop turn. Both answer alike."""

    async def run():
        seen = []

        async def fn(request, context):
            seen.append((request, asyncio.current_task()))
            return request + b"!"

        right_after = []
        server, conn, transport = await unary_call(eager(fn) if marked else fn,
                                                   lambda server, conn: right_after.append((list(seen), 1 in conn.calls)))
        assert right_after == ([([(b"ask", None)], False)] if marked else [([], True)])
        await turns()
        assert len(seen) == 1 and (seen[0][1] is None) is marked
        assert answer(transport) == ([b"ask!"], "0", None) and not server.tasks and 1 not in conn.calls
        conn.connection_lost(None)

    asyncio.run(run())


def test_an_eager_call_starts_after_the_rest_of_the_read():
    """An eager call starts once every frame read with its request was handled, as a task would:
    DATA after its END_STREAM in the same read resets the stream (STREAM_CLOSED, as etcd's
    grpc-go), and the call never runs."""

    async def run():
        ran = []

        @eager
        async def fn(request, context):
            ran.append(request)
            return request

        server, conn, transport = await unary_call(fn, more=frame(DATA, 0, 1, grpc_message(b"more")))
        await turns()
        resets = [(sid, int.from_bytes(p, "big")) for kind, sid, p in frames(bytes(transport.out)) if kind == RST_STREAM]
        assert ran == [] and resets == [(1, gs.STREAM_CLOSED)] and answer(transport) == ([], None, None)
        conn.connection_lost(None)

    asyncio.run(run())


def test_an_eager_call_that_waits_is_finished_by_a_task():
    """An eager call that waits goes on in a task from where it waited: the task is the current
    one after the wait, the server counts it until the call is over, and the answer is the one
    the call makes."""

    async def run():
        ready = asyncio.get_running_loop().create_future()
        after = []

        @eager
        async def fn(request, context):
            value = await ready
            after.append(asyncio.current_task())
            return value

        server, conn, transport = await unary_call(fn)
        (task,) = server.tasks
        assert conn.calls[1].task is task
        where = awaiting(task)  # what a stuck stop reports: the task's awaits, the call's own
        assert "grpcserver.py" in where and "test_grpcserver_connection.py" in where and where.endswith(" fn"), where
        assert "coro=<Server.run()" in repr(task), repr(task)
        await turns()
        assert answer(transport) == ([], None, None) and not after
        ready.set_result(b"late")
        await turns()
        assert after == [task] and task.done() and not server.tasks
        assert answer(transport) == ([b"late"], "0", None)
        conn.connection_lost(None)

    asyncio.run(run())


@pytest.mark.parametrize("when", ["before the task ran", "while the task waits"])
def test_an_eager_call_reset_by_its_client_is_cancelled(when):
    """The client resets a call that waits, before its task first ran or after: the call sees the
    cancellation where it waits, what it waited for is cancelled (as a task cancels it), nothing
    is answered, and the server forgets the task."""

    async def run():
        waited = asyncio.get_running_loop().create_future()
        outcome = []

        @eager
        async def fn(request, context):
            try:
                await waited
            except asyncio.CancelledError:
                outcome.append("cancelled")
                raise
            return b"never"

        def reset(server, conn) -> None:  # in the same callback: before the task's first step
            conn.data_received(frame(RST_STREAM, 0, 1, (8).to_bytes(4, "big")))  # CANCEL

        if when == "before the task ran":
            server, conn, transport = await unary_call(fn, reset)
        else:
            server, conn, transport = await unary_call(fn)
            await turns()
            assert server.tasks and not outcome
            reset(server, conn)
        await turns()
        assert outcome == ["cancelled"] and waited.cancelled()
        assert not server.tasks and 1 not in conn.calls and answer(transport)[0] == []
        conn.connection_lost(None)

    asyncio.run(run())


@pytest.mark.parametrize("how", ["abort", "raise"])
def test_an_eager_call_that_fails_at_once_gets_its_status(how):
    """An eager call that aborts, or raises, before it ever waits: its status is sent as a task's
    would be, and the connection goes on serving."""

    async def run():
        @eager
        async def fn(request, context):
            if how == "abort":
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no")
            raise ValueError("bad")

        server, conn, transport = await unary_call(fn)
        await turns()
        expected = ("3", "no") if how == "abort" else ("2", "Unexpected <class 'ValueError'>: bad")
        assert answer(transport) == ([], *expected) and not server.tasks
        conn.connection_lost(None)

    asyncio.run(run())


def test_an_eager_reads_wait_for_a_sure_writer_lease_runs_in_a_task():
    """A linearizable Range starts outside any task (KVService.Range is eager), and a writer whose
    lease is not sure makes it wait for the lease's confirmation first, which times itself out
    with ``asyncio.timeout`` (it needs a current task): that wait runs in a task of its own."""
    async def run():
        inside = []

        class Lease:
            def sure(self) -> bool:
                return False

            async def confirm(self, timeout_s: float) -> None:
                async with asyncio.timeout(timeout_s):
                    inside.append(asyncio.current_task())
                    await asyncio.sleep(0)

        member = SimpleNamespace(lease=Lease(), store=SimpleNamespace(config=SimpleNamespace(request_timeout_s=5)))
        member._confirm = lambda lease: Member._confirm(member, lease)
        member.surely_writer = lambda: Member.surely_writer(member)

        @eager
        async def linearizable_read(request, context):  # KVService.range_at's first wait
            if (unsure := Member.unsure_writer(member)) is not None:
                await unsure
            return b"read"

        server, conn, transport = await unary_call(linearizable_read)
        await turns(10)
        assert len(inside) == 1 and inside[0] is not None
        assert answer(transport) == ([b"read"], "0", None)
        conn.connection_lost(None)

    asyncio.run(run())


# -- unary calls answered in batches (handlers.batched) ----------------------------------------


def requests_bytes(requests: dict[int, bytes], first: bool = True) -> bytes:
    """Whole unary calls of the test server's one method, one per stream: {stream id: request}
    (after the connection's preface if ``first``)."""
    headers = hpack_literals([(":method", "POST"), (":scheme", "http"), (":path", "/t.S/M"), (":authority", "x"),
                              ("content-type", "application/grpc"), ("te", "trailers")])
    out = PREFACE + frame(SETTINGS, 0, 0) if first else b""
    for sid, request in requests.items():
        out += frame(HEADERS, END_HEADERS, sid, headers) + frame(DATA, END_STREAM, sid, grpc_message(request))
    return out


def answers(transport: Transport) -> dict[int, tuple[list[bytes], str | None, str | None]]:
    """Each stream's messages, grpc-status and grpc-message as written so far."""
    decoder, out = hpack.Decoder(), {}
    for kind, sid, payload in frames(bytes(transport.out)):
        if sid == 0:
            continue
        messages, status, details = out.get(sid, ([], None, None))
        if kind == DATA and payload:
            messages.append(payload[5:])
        elif kind == HEADERS:
            fields = dict(decoder.decode(payload))
            status, details = fields.get("grpc-status", status), fields.get("grpc-message", details)
        out[sid] = messages, status, details
    return out


def batching_server(batch, alone=None) -> tuple[gs.Server, gs.Connection, Transport]:
    """A server whose one unary method is answered in batches by ``batch``, and a call on its own
    by ``alone`` (by default, never)."""
    async def never(request, context):
        raise AssertionError("a batched method's call was answered alone")

    alone = alone or never
    alone.batch = batch
    server, conn, transport, _ = connected(grpc.unary_unary_rpc_method_handler(alone))
    return server, conn, transport


def test_calls_completed_in_one_read_are_answered_as_one_batch():
    """Three calls completed by one read go to the batch together, at the end of that loop turn, in
    stream order, outside any task until the batch first waits; each gets its own answer: a
    response, the status it was ended with, or UNKNOWN for what the batch raised for it. Calls
    read on a later turn, while the first batch waits, make a batch of their own."""
    async def run():
        release = asyncio.get_running_loop().create_future()
        batches = []

        async def batch(requests, contexts):
            batches.append((list(requests), asyncio.current_task()))
            await release
            if len(requests) == 2:
                return [request + b"!" for request in requests]
            contexts[1].end(grpc.StatusCode.INVALID_ARGUMENT, "no")
            return [requests[0] + b"!", grpc.aio.AbortError(), ValueError("bad")]

        server, conn, transport = batching_server(batch)
        server.loop.call_soon(conn.data_received, requests_bytes({1: b"a", 3: b"b", 5: b"c"}))
        await asyncio.sleep(0)
        assert batches == []  # not within the read: at the end of its turn
        await asyncio.sleep(0)
        assert batches == [([b"a", b"b", b"c"], None)] and len(server.tasks) == 1
        conn.data_received(requests_bytes({7: b"d", 9: b"e"}, first=False))
        await turns()
        assert [requests for requests, _ in batches] == [[b"a", b"b", b"c"], [b"d", b"e"]]
        release.set_result(None)
        await turns()
        assert answers(transport) == {1: ([b"a!"], "0", None), 3: ([], "3", "no"),
                                      5: ([], "2", "Unexpected <class 'ValueError'>: bad"), 7: ([b"d!"], "0", None),
                                      9: ([b"e!"], "0", None)}
        assert not server.tasks and not conn.calls
        conn.connection_lost(None)

    asyncio.run(run())


def test_a_call_alone_in_its_turn_is_answered_by_its_method():
    """A batch of one would only add its lists to the call's own handler: a call whose turn
    completed no other is answered by the method itself, in a task of its own."""
    async def run():
        async def batch(requests, contexts):
            raise AssertionError("a lone call was batched")

        async def alone(request, context):
            await asyncio.sleep(0)
            return request + b" alone"

        server, conn, transport = batching_server(batch, alone)
        server.loop.call_soon(conn.data_received, requests_bytes({1: b"a"}))
        await turns(6)
        assert answers(transport) == {1: ([b"a alone"], "0", None)} and not server.tasks
        conn.connection_lost(None)

    asyncio.run(run())


@pytest.mark.parametrize("how", ["reset", "deadline"])
def test_a_batched_call_that_ends_early_leaves_the_others_be(how):
    """A call reset in the read that completed it never joins its batch; one reset (or past its
    deadline) while its batch waits is not answered, and the batch, which has no task per call,
    is not cancelled: the other calls are answered."""
    async def run():
        release = asyncio.get_running_loop().create_future()
        seen, cancelled = [], []

        async def batch(requests, contexts):
            seen.append(list(requests))
            try:
                await release
            except asyncio.CancelledError:
                cancelled.append(True)
                raise
            return [request + b"!" for request in requests]

        server, conn, transport = batching_server(batch)
        deadline = [("grpc-timeout", "50m")] if how == "deadline" else []
        headers = hpack_literals([(":method", "POST"), (":scheme", "http"), (":path", "/t.S/M"), (":authority", "x"),
                                  ("content-type", "application/grpc"), ("te", "trailers"), *deadline])
        reset_now = frame(RST_STREAM, 0, 1, (8).to_bytes(4, "big"))
        server.loop.call_soon(conn.data_received, requests_bytes({1: b"a", 3: b"c"}) + reset_now + frame(
            HEADERS, END_HEADERS, 5, headers) + frame(DATA, END_STREAM, 5, grpc_message(b"b")))
        await turns()
        assert seen == [[b"c", b"b"]]
        if how == "reset":
            conn.data_received(frame(RST_STREAM, 0, 5, (8).to_bytes(4, "big")))
        else:
            await asyncio.sleep(0.1)
        release.set_result(None)
        await turns()
        got = answers(transport)
        assert not cancelled and got[3] == ([b"c!"], "0", None) and 1 not in got
        assert got.get(5) == (None if how == "reset" else ([], "4", "Deadline Exceeded"))
        assert not server.tasks and not conn.calls
        conn.connection_lost(None)

    asyncio.run(run())


def test_a_stopping_server_ends_a_waiting_batch_as_it_ends_a_call():
    """The server stops while a batch waits: the batch is cancelled, and each of its calls is
    answered UNAVAILABLE "server is shutting down", as a call's own task would be."""
    async def run():
        async def batch(requests, contexts):
            await asyncio.Event().wait()

        server, conn, transport = batching_server(batch)
        server.loop.call_soon(conn.data_received, requests_bytes({1: b"a", 3: b"b"}))
        await turns()
        assert len(server.tasks) == 1
        stopping = asyncio.ensure_future(server.stop(0))
        await turns(5)
        got = answers(transport)
        assert {sid: got[sid] for sid in (1, 3)} == {sid: ([], "14", "server is shutting down") for sid in (1, 3)}
        conn.connection_lost(None)
        await stopping

    asyncio.run(run())


def test_a_batched_method_behind_a_gate_lets_each_call_through_it_in_a_task():
    """A follower's services sit behind a gate (its token catch-up, which times itself out with
    ``asyncio.timeout``, so it needs a current task) and are reached once it took over as the
    writer: each call of a batch passes the gate, in the batch's task, before the batch runs, and
    is counted once."""
    from shim import handlers

    async def run():
        class Servicer:
            async def put_batch(self, requests, contexts):
                return [request + b"!" for request in requests]

            @handlers.batched(put_batch)
            async def Put(self, request, context):
                return request + b" alone"

        gated = []

        async def gate(context):
            async with asyncio.timeout(5):
                gated.append((context.sid, asyncio.current_task() is not None))

        stats = handlers.RpcStats("t.S", "M", "unary")
        server, conn, transport, _ = connected(grpc.unary_unary_rpc_method_handler(
            handlers._unary(Servicer().Put, gate, stats)))
        server.loop.call_soon(conn.data_received, requests_bytes({1: b"a", 3: b"b"}))
        await turns(6)
        assert answers(transport) == {1: ([b"a!"], "0", None), 3: ([b"b!"], "0", None)}
        assert gated == [(1, True), (3, True)] and (stats.started, stats.handled[0]) == (2, 2)
        conn.connection_lost(None)

    asyncio.run(run())


def test_an_address_that_cannot_be_listened_on_whole_leaves_nothing_listening(monkeypatch):
    """A host name can stand for several addresses; when one of them is held, the call fails
    and none of the others is left listening, so that the same address can be tried again (a
    standby that took over retries its URL until the process it took over from lets go)."""
    import socket

    from tests.etcd_fixture import free_port

    port = free_port()
    two = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (host, port)) for host in ("127.0.0.1", "127.0.0.2")]
    monkeypatch.setattr(gs.socket, "getaddrinfo", lambda *args, **kwargs: two)
    server = gs.Server(gs.ServerOptions())
    with socket.socket() as held:
        held.bind(("127.0.0.2", port))
        held.listen()
        with pytest.raises(RuntimeError, match="cannot listen on both:"):
            server.add_insecure_port(f"both:{port}")
        assert server.sockets == []
        with socket.socket() as again:  # 127.0.0.1's socket was closed: the port is free there
            again.bind(("127.0.0.1", port))
            again.listen()
    assert server.add_insecure_port(f"both:{port}") == port and len(server.sockets) == 2
    for sock, _ in server.sockets:
        sock.close()
