"""The chaos harness's TCP proxy (tests/tcp_proxy.py): cut and restore, stall and resume."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from tests.tcp_proxy import HOST, TcpProxy


@pytest.fixture
def echo():
    """An echo server on 127.0.0.1; yields its port. Each connection echoes until EOF, then
    records that it saw the EOF."""
    listener = socket.create_server((HOST, 0))
    eofs: list[int] = []

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)
            eofs.append(1)

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield listener.getsockname()[1], eofs
    listener.close()


def _connect(proxy: TcpProxy) -> socket.socket:
    s = socket.create_connection((HOST, proxy.port), timeout=5)
    s.settimeout(5)
    return s


def _ended(s: socket.socket) -> bool:
    """The peer closed or reset the connection."""
    try:
        return s.recv(100) == b""
    except ConnectionResetError:
        return True


def test_a_stalled_proxy_holds_data_and_closes_until_resumed(echo):
    port, eofs = echo
    proxy = TcpProxy(port).start()
    try:
        a = _connect(proxy)
        a.sendall(b"before")
        assert a.recv(100) == b"before"
        proxy.stall()
        a.sendall(b"held")
        b = _connect(proxy)  # a new connection is accepted while stalled, and held too
        b.sendall(b"also held")
        b.close()  # the echo server does not see this close while stalled
        a.settimeout(0.5)
        with pytest.raises(socket.timeout):
            a.recv(100)
        assert eofs == []
        proxy.resume()
        a.settimeout(5)
        assert a.recv(100) == b"held"
        deadline = time.monotonic() + 5
        while not eofs and time.monotonic() < deadline:  # b's close is delivered once resumed
            time.sleep(0.05)
        assert eofs == [1]
        a.sendall(b"after")
        assert a.recv(100) == b"after"
        a.close()
    finally:
        proxy.close()


def test_cut_while_stalled_drops_the_held_connections(echo):
    port, _ = echo
    proxy = TcpProxy(port).start()
    try:
        a = _connect(proxy)
        proxy.stall()
        a.sendall(b"held")
        proxy.cut()
        assert _ended(a)
        with pytest.raises(OSError):
            _connect(proxy)
        proxy.restore()  # flowing again after a cut: a stall ends with it
        c = _connect(proxy)
        c.sendall(b"x")
        assert c.recv(100) == b"x"
        a.close()
        c.close()
    finally:
        proxy.close()
