"""etcd's client-side concurrency recipes, as `etcdctl lock` and `etcdctl elect` run them
(sessions on leases with keep-alive, Txn on create_revision, Range sorted by create
revision with max_create_revision, watches for the predecessor's delete), against
shardetcd and, to show the test itself right, against etcd 3.5.1."""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time

import pytest

pytestmark = pytest.mark.timeout(120)

ETCDCTL = "/usr/bin/etcdctl"


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCDCTL")}
    env["ETCDCTL_API"] = "3"
    return env


def _ctl(endpoint: str, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([ETCDCTL, f"--endpoints={endpoint}", "--dial-timeout=5s", *args], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _stop(proc: subprocess.Popen, sig=signal.SIGKILL) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(params=["etcd", "shardetcd"])
def endpoint(request, tmp_path):
    server = request.getfixturevalue("real_etcd" if request.param == "etcd" else "shardetcd")
    return server.endpoint


def test_lock_holders_never_overlap(endpoint, tmp_path):
    """Four `etcdctl lock L cmd` at once: each command runs alone, one after another, and all run."""
    holders = []
    for i in range(4):
        log = tmp_path / f"holder-{i}"
        script = f'date +%s.%N > {log}; echo "$ETCD_LOCK_KEY" >> {log}; sleep 0.3; date +%s.%N >> {log}'
        holders.append(_ctl(endpoint, "lock", "--ttl=10", "test-lock", "--", "sh", "-c", script))
    try:
        for p in holders:
            p.wait(60)
    finally:
        for p in holders:
            _stop(p)
    assert [p.returncode for p in holders] == [0] * 4, [p.stderr.read() for p in holders]
    spans, keys = [], set()
    for i in range(4):
        start, key, end = (tmp_path / f"holder-{i}").read_text().split()
        spans.append((float(start), float(end)))
        keys.add(key)
    spans.sort()
    for (_, end_a), (start_b, _) in zip(spans, spans[1:]):
        assert end_a <= start_b, spans  # the next holder started only after the previous one finished
    assert len(keys) == 4 and all(k.startswith("test-lock/") for k in keys)  # one lock key per session


class Lines:
    """Lines a process prints, collected by a thread, waited for with a deadline."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.queue.put(line.rstrip("\n"))
        self.queue.put(None)

    def take(self, count: int, timeout: float = 30.0) -> list[str]:
        lines: list[str] = []
        deadline = time.monotonic() + timeout
        while len(lines) < count:
            try:
                line = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"got only {lines} from {self.proc.args}") from None
            if line is None:
                raise AssertionError(f"{self.proc.args} ended after {lines}: {self.proc.stderr.read()}")
            lines.append(line)
        return lines


def test_election_leadership_passes_in_order(endpoint):
    """Candidates a then b campaign; an observer sees a lead, then b once a resigns."""
    observer = _ctl(endpoint, "elect", "-l", "test-election")
    a = _ctl(endpoint, "elect", "test-election", "a")
    procs = [observer, a]
    seen, out_a = Lines(observer), Lines(a)
    try:
        key_a, value_a = out_a.take(2)  # a is elected: it prints its key and proposal
        assert key_a.startswith("test-election/") and value_a == "a"
        assert seen.take(2) == [key_a, "a"]  # the observer is watching before anything changes
        b = _ctl(endpoint, "elect", "test-election", "b")
        procs.append(b)
        out_b = Lines(b)
        time.sleep(1.0)
        assert b.poll() is None  # b waits behind a
        _stop(a, signal.SIGINT)  # a resigns (its session's lease is revoked)
        key_b, value_b = out_b.take(2)
        assert value_b == "b" and key_b != key_a
        assert seen.take(2) == [key_b, "b"]
    finally:
        for p in procs:
            _stop(p, signal.SIGINT)
