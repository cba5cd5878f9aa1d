"""A journal's NATS connection over TLS leaves a server that stopped answering as soon as a
plain one does.

Seen in chaos (--nats-secure, pause-nats): the writer's NATS server was frozen for 8.6 s, and
the writer reconnected to another server only when it came back, by which time a standby had
taken its lease. nats-py found the connection stale after its pings (1.5 s), but before it
tried another server it closed the old connection gracefully: over TLS that waits for the
server's close_notify (asyncio's SSL shutdown, up to 30 s), which a frozen server, or a
partition that holds packets, never sends. Closing the journal (a shutdown) waited the same way.
"""
from __future__ import annotations

import asyncio
import time

from journal.jetstream import JetStreamConfig, JetStreamLog
from tests.nats_fixture import start_nats_cluster
from tests.tcp_proxy import TcpProxy
from tests.tls_certs import journal_tls_access, make_pki, nats_server_tls_flags

SEEN_WITHIN_S = 15.0  # a bound on waiting, far above the 1.5 s to find it stale, below TLS's 30 s shutdown
CLOSED_WITHIN_S = 15.0  # far above the client's 2 s grace for a goodbye, below TLS's 30 s shutdown


def test_a_stalled_tls_server_is_left_for_another_one_while_it_stays_stalled(tmp_path):
    pki = make_pki(tmp_path / "pki")
    nats = start_nats_cluster(tmp_path / "nats", size=3, extra=nats_server_tls_flags(pki))
    proxies = [TcpProxy(s.client_port).start() for s in nats.servers]

    async def go() -> tuple[int, int, int]:
        config = JetStreamConfig(urls=tuple(f"tls://127.0.0.1:{p.port}" for p in proxies), prefix="stall",
                                 access=journal_tls_access(pki))
        log = await JetStreamLog(config).connect()
        try:
            first = log.nc.connected_url.port
            reconnects = log.reconnects
            stalled = next(p for p in proxies if p.port == first)
            stalled.stall()
            deadline = time.monotonic() + SEEN_WITHIN_S
            while log.reconnects == reconnects or not log.connected:
                assert time.monotonic() < deadline, "still on the stalled server"
                await asyncio.sleep(0.1)
            now = log.nc.connected_url.port
            await log.nc.flush(timeout=5)  # the new server answers
            stalled.resume()
            return first, now, log.reconnects - reconnects
        finally:
            for p in proxies:
                p.resume()
            await log.close()

    try:
        first, now, reconnects = asyncio.run(go())
        assert now != first and reconnects == 1
    finally:
        for p in proxies:
            p.close()
        nats.stop()


def test_closing_a_journal_whose_tls_server_stalled_does_not_wait_for_its_goodbye(tmp_path):
    pki = make_pki(tmp_path / "pki")
    nats = start_nats_cluster(tmp_path / "nats", size=1, extra=nats_server_tls_flags(pki))
    proxy = TcpProxy(nats.servers[0].client_port).start()

    async def go() -> float:
        config = JetStreamConfig(urls=(f"tls://127.0.0.1:{proxy.port}",), prefix="stall",
                                 access=journal_tls_access(pki))
        log = await JetStreamLog(config).connect()
        await log.nc.flush(timeout=5)
        proxy.stall()
        started = time.monotonic()
        try:
            await asyncio.wait_for(log.close(), 2 * CLOSED_WITHIN_S)
        except asyncio.TimeoutError:
            pass
        return time.monotonic() - started

    try:
        took = asyncio.run(go())
        assert took < CLOSED_WITHIN_S, f"closing took {took:.1f} s"
    finally:
        proxy.resume()
        proxy.close()
        nats.stop()
