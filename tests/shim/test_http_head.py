"""The HTTP endpoint's request head is read within one deadline as a whole: a client that
trickles header lines, each in time, does not hold the connection past it (shim/http.py)."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from shim import http
from shim.http import HttpEndpoint


def test_a_trickled_head_is_cut_at_the_deadline(monkeypatch):
    monkeypatch.setattr(http, "IDLE_READ_S", 0.5)
    member = SimpleNamespace(config=SimpleNamespace(receive_cap_bytes=1 << 20, enable_pprof=False))
    endpoint = HttpEndpoint(member, None, None)

    async def trickle() -> tuple[float, bytes]:
        server = await asyncio.start_server(endpoint.handle, "127.0.0.1", 0)
        try:
            reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
            loop = asyncio.get_running_loop()
            start = loop.time()
            writer.write(b"GET /nothing HTTP/1.1\r\nHost: x\r\n")
            for i in range(20):  # a line every 0.2 s, each within the per-line wait, for 4 s
                await asyncio.sleep(0.2)
                if reader.at_eof():
                    break
                try:
                    writer.write(b"X-Slow-%d: 1\r\n" % i)
                    await writer.drain()
                except ConnectionError:
                    break
            answer = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            return loop.time() - start, answer
        finally:
            server.close()
            await server.wait_closed()

    took, answer = asyncio.run(trickle())
    assert answer == b"" and took < 2.0, (took, answer)  # closed unanswered at ~0.5 s, not served after 4 s
