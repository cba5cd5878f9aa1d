"""The tests' port picker: ports no outgoing connection and no other test worker can take."""
from __future__ import annotations

import socket

from tests import etcd_fixture
from tests.etcd_fixture import free_port, free_ports


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range():
    ports = free_ports(50) + [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    low = etcd_fixture._ephemeral_low()
    assert all(etcd_fixture.PORT_LOW <= p < low for p in ports), (low, ports)
    for p in ports[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_port_something_listens_on_is_skipped():
    nxt = etcd_fixture._next
    with socket.socket() as s:
        s.bind(("127.0.0.1", nxt))
        s.listen()
        assert nxt not in free_ports(3)


def test_each_worker_has_a_slice_of_its_own(monkeypatch):
    slices = []
    for i in range(2):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{i}")
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
        slices.append(etcd_fixture._worker_slice())
    assert slices[0].stop <= slices[1].start and len(slices[0]) > 1000


def test_runs_with_neighbouring_pids_start_far_apart():
    ports = range(15000, 21000)
    starts = [etcd_fixture._first(pid, ports) for pid in range(4000, 4004)]
    assert all(p in ports for p in starts)
    assert min(abs(a - b) for i, a in enumerate(starts) for b in starts[i + 1:]) > 200, starts
