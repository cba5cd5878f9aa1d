"""A TCP forwarder on 127.0.0.1 whose connections a test can cut and restore.

    proxy = TcpProxy(target_port).start()   # listens on proxy.port
    proxy.cut()        # drop every connection and refuse new ones (the port is closed)
    proxy.restore()    # accept again on the same port
    proxy.stall()      # a black hole: connections stay open (new ones are accepted), nothing is
                       # forwarded, not even a close, until ...
    proxy.resume()     # ... what was held is delivered, as TCP delivers it once a partition heals
    proxy.close()
    broken_for(proxies, "cut" or "stall", seconds)   # several, for a while, then back

One thread accepts; each connection gets two threads, one per direction.
Only loopback addresses are used.
"""
from __future__ import annotations

import socket
import threading
import time

from tests.etcd_fixture import free_port

HOST = "127.0.0.1"


class TcpProxy:
    def __init__(self, target_port: int, port: int | None = None) -> None:
        self.target_port = target_port
        self.port = port or free_port()
        self.connections = 0  # accepted since start, for tests that want to see traffic went through
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._flowing = threading.Event()  # clear while stalled
        self._flowing.set()

    def start(self) -> TcpProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((HOST, self.port))
        listener.listen(64)
        self._listener = listener
        self._acceptor = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        self._acceptor.start()
        return self

    def cut(self) -> None:
        """Close the listening port and every forwarded connection (both ends see a reset or EOF)."""
        listener, self._listener = self._listener, None
        if listener is not None:
            _close(listener)
        if self._acceptor is not None:
            self._acceptor.join(timeout=10)
            self._acceptor = None
        with self._lock:
            dropped, self._open = list(self._open), set()
        for s in dropped:
            _close(s)
        self._flowing.set()  # a pump held by a stall finds its sockets closed

    def restore(self) -> None:
        self.start()

    def stall(self) -> None:
        """Forward nothing from now on, in either direction, until ``resume``: each side's
        data waits in the proxy and the kernel's buffers (a sender blocks once they are full),
        and a close by either side is not passed on. Nobody learns of it but by timeouts."""
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self.cut()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed by cut()
                return
            try:
                upstream = socket.create_connection((HOST, self.target_port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            with self._lock:
                if self._listener is not listener:  # cut meanwhile
                    _close(client)
                    _close(upstream)
                    return
                self._open.update((client, upstream))
                self.connections += 1
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                self._flowing.wait()
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        with self._lock:
            self._open.discard(src)
            self._open.discard(dst)
        _close(src)
        _close(dst)


def broken_for(proxies: list[TcpProxy], how: str, seconds: float) -> None:
    """Every one of ``proxies`` cut (``how`` "cut") or stalled ("stall") for ``seconds``, then
    restored or resumed."""
    for p in proxies:
        p.cut() if how == "cut" else p.stall()
    time.sleep(seconds)
    for p in proxies:
        p.restore() if how == "cut" else p.resume()


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass
