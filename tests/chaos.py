"""Random faults against a JetStream deployment, with every round's history checked.

    python -m tests.chaos --minutes 20 --seed 7        # from the repository root

Three real NATS servers (JetStream, R3) and three shardetcd members on them: one
writer and two ``--follow --standby`` members, as a three-member etcd. Nine clients
(three per member, one of them only reading) run get / put / delete /
compare-and-swap on a few keys, on several shards, through whichever member they are on (a follower forwards writes
to the writer and reads through a read index). A tenth client, through a member chosen each
round, writes large transactions: 9 MiB of values on one shard and a small key on another, past
the largest record NATS takes, so that each is journaled as a split write (parts, then a last)
across two shards; it compacts behind itself to keep the members' stores small. Every member
also serves a watch stream on the round's keys, kept open through faults as a client library
keeps it (tests/chaos_watch.py), and a lease with keys on two shards kept alive through it; one
more lease is left to expire (tests/chaos_lease.py). Through every member a lock is taken and an
election won again and again, with that lease as session, and the election observed
(tests/chaos_lock.py).

Each round, one fault, at a random time, from:

* ``kill-writer``: SIGKILL the writer; a standby takes over; the killed member
  comes back as a following standby on the same data dir and port.
* ``pause-writer``: SIGSTOP the writer past its lease TTL, then SIGCONT: it must
  notice it was deposed (it exits) or, if nobody took over, go on.
* ``cut-writer``: the writer's connections to NATS cut for a while (each member
  reaches NATS through proxies of its own), while its clients still reach it.
* ``stall-writer``: the writer's connections to NATS become a black hole for a while: they
  stay open, nothing goes through (not even a close), then what was held is delivered, as
  after a partition that healed. Only timeouts tell either side.
* ``kill-member`` / ``pause-member`` / ``cut-member`` / ``stall-member``: the same to a member
  that is not the writer.
* ``kill-nats`` / ``pause-nats``: one NATS server gone or frozen for a while.
* ``kill-nats-quorum``: two of the three gone for a while: JetStream stores nothing meanwhile
  (no write may be acknowledged, none acknowledged before may be lost), then comes back.

With ``--cluster``, ``shardetcd cluster`` on the same NATS servers instead: two partitions, each two
processes on one URL (one serves, one stands by) and a follower, supervised, with faults of their
own (``CLUSTER_FAULTS``: its processes killed, paused or hung, the supervisor killed, all of them
cut off from NATS or stalled on it; tests/chaos_cluster.py); with ``--journal local`` too, the cluster on local journals.

With ``--auth``, auth on: every call made as a user that is not root, with a simple token taken
again when a member refuses it, and each round an auth change every member must hold to at its end
(tests/chaos_auth.py).

With ``--tls``, clients are served over TLS and must present a certificate of the run's CA
(``--client-cert-auth``); followers call their writer over TLS with a client certificate too.
With ``--nats-secure``, the NATS servers run as in production: TLS with client certificates
verified, and operator mode, the members' user a creds file (a JWT) allowed only what a journal
publishes and subscribes to.

With ``--journal local``, the default deployment instead: the writer on a local journal and
two followers of its data dir (``--follow-data-dir``), with the faults that apply to it
(``LOCAL_FAULTS``: a killed writer comes back on its journal, a paused one goes on).

At the end of each round the clients stop and the round's history must be
linearizable key by key (tests/lincheck.py); every member must take a write and a
linearizable read again within a minute, then serve the same values at the same
revisions, and exactly one member must be the writer; a last put on each key must reach every watcher,
and the watchers must tell one history of each key, no event missed outside what compaction
took, progress notifications true, ending where the members' values are; keep-alives must be
answered again, no kept lease found gone sooner than its TTL less 1 s after a renewal, every
lease kept alive through a member the fault did not strike still there, the dropped lease gone,
and every lease's keys on every member exactly while it is alive; the lock and the leadership held
by one at a time, and every Observe answer naming the leader at its revision;
and (JetStream) ``journal verify``, run as an operator would while the writer runs, must
find every stream and checkpoint sound and no acknowledged revision gone.
A failing history is saved beside the log for ``python -m tests.lincheck``.
All servers listen on 127.0.0.1 on free ports and are stopped by PID.
"""
from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import shlex
import signal
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
import zlib
from pathlib import Path

import grpc

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests import chaos_auth, chaos_cluster
from tests.chaos_cluster import CLUSTER_FAULTS, CLUSTER_LOCAL_FAULTS, ClusterRun, endpoint_status
from tests.chaos_lease import RoundLeases
from tests.chaos_lock import Candidate, Locker, Observer, check_lockers, check_observers
from tests.chaos_reads import check_reads, serial_reads
from tests.chaos_watch import FENCE, MemberWatch, watch_report
from tests.etcd_fixture import free_port
from tests.integration.test_linearizability import KEYS, MIXED, check_linearizable, client
from tests.integration.test_metrics import scrape
from tests.nats_fixture import start_nats_cluster
from tests.shardetcd_fixture import ShardetcdProcess
from tests.tcp_proxy import TcpProxy, broken_for
from tests.tls_certs import journal_tls_access, journal_tls_flags, make_pki, member_tls_flags, nats_server_tls_flags

FAULTS = ("kill-writer", "pause-writer", "cut-writer", "stall-writer", "kill-member", "pause-member", "cut-member",
          "stall-member", "kill-nats", "pause-nats", "kill-nats-quorum")
LOCAL_FAULTS = ("kill-writer", "pause-writer", "kill-member", "pause-member")  # --journal local: no NATS
LEASE_TTL_S = 3.0  # the writer lease's default TTL
NATS_ACCESS = None  # --nats-secure: how every process here reaches NATS (journal.jetstream.NatsAccess)
READS = (1, 0, 0, 0)  # only gets (test_linearizability.MIXED: every kind of operation)
# the large transaction: BIG_KEYS values of BIG_VALUE_BYTES on one shard, over the ~8 MB record
# NATS takes (max_payload 8MB less room for headers), so its record is split; plus one small key
# on another shard, so that it is a cross-shard transaction too
BIG_KEYS, BIG_VALUE_BYTES = 9, 1 << 20
BIG_REQUEST_BYTES = 12 << 20  # every member's --max-request-bytes, room for it
BIG_CHANNEL = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]


def tls_flags(pki: dict[str, Path], tls_port: int, port: int) -> tuple[str, ...]:
    """``member_tls_flags``, clients served on https:// and followers calling the writer's https://
    URL (advertised first). The http:// port is only where the harness sees a start serve
    (ShardetcdProcess)."""
    urls = f"https://127.0.0.1:{tls_port},http://127.0.0.1:{port}"
    return ("--listen-client-urls", urls, "--advertise-client-urls", urls, *member_tls_flags(pki))


class Member:
    """One shardetcd process slot: its data dir and port outlive each process in it."""

    def __init__(self, nats, base: Path, name: str, *flags: str, server_args: tuple[str, ...] = (),
                 pki: dict[str, Path] | None = None) -> None:
        """With ``nats`` None, on a local journal: the writer, or a follower of its data dir. With
        ``pki`` (tests/tls_certs.py), clients are served over TLS with client certificates required
        (``tls_flags``), and a follower calls its writer so."""
        self.base, self.name, self.server_args = base / name, name, server_args
        self.tls_port = free_port() if pki else None
        self.proxies = [TcpProxy(server.client_port).start() for server in nats.servers] if nats else []
        self.journal = ("--journal-url", ",".join(f"nats://127.0.0.1:{p.port}" for p in self.proxies)) if nats else ()
        # what it comes back as after it ended: a standby on JetStream, what it was on a local journal
        self.revived_as = ("--follow", "--standby") if nats else flags
        self.port, self.metrics_port = free_port(), free_port()
        self.tls = tls_flags(pki, self.tls_port, self.port) if pki else ()
        self.proc = self._process(*flags).start(wait="--follow" in flags)

    @property
    def data_dir(self) -> Path:
        return self.base / "data"

    def _process(self, *flags: str) -> ShardetcdProcess:
        return ShardetcdProcess(data_dir=self.data_dir, state_dir=self.base / "state", port=self.port,
                                log_path=self.base / "shardetcd.log", timeout=120,  # a long run's catch-up reads grow
                                extra_args=(*self.journal,
                                            "--listen-metrics-urls", f"http://127.0.0.1:{self.metrics_port}",
                                            "--enable-pprof",  # /debug/tasks, for a look at one --hold kept
                                            "--max-request-bytes", str(BIG_REQUEST_BYTES),
                                            *self.tls, *self.server_args, *flags))

    @property
    def endpoint(self) -> str:
        """Where clients call it: its TLS port with --tls."""
        return f"127.0.0.1:{self.tls_port}" if self.tls_port else self.proc.endpoint

    def revive(self) -> None:
        """Back, if its process ended: as a following standby on JetStream; on a local journal,
        as what it was (the writer recovers its journal, a follower follows it again)."""
        if self.proc.running():
            return
        self.proc = self._process(*self.revived_as).start(wait="--follow" in self.revived_as)

    def follower_metrics(self) -> str:
        """Its follower gauges (applied and writer revisions, lag), for a report."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError as exc:
            return f"{self.name}: no metrics ({exc})"
        return f"{self.name}: " + "; ".join(line for line in text.splitlines() if line.startswith("shardetcd_follower_"))

    def checkpoints_stored(self) -> int | None:
        """Checkpoints its process stored since it started, every shard's (None: no metrics)."""
        try:
            m = scrape(f"http://127.0.0.1:{self.metrics_port}")
        except OSError:
            return None
        return int(sum(v for (name, _), v in m.items() if name == "shardetcd_shard_checkpoints_total"))

    def status(self) -> pb.StatusResponse | None:
        return endpoint_status(self.endpoint)


def the_writer(members: list[Member], timeout: float = 60.0) -> Member:
    """The one member whose Status names itself the leader (waits through a takeover)."""
    deadline = time.monotonic() + timeout
    while True:
        writers = []
        for m in members:
            s = m.status() if m.proc.running() else None
            if s is not None and s.leader and s.leader == s.header.member_id:
                writers.append(m)
        if len(writers) == 1:
            return writers[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"writers: {[w.name for w in writers]}; logs: " +
                                 " | ".join(m.proc.log_tail(15) for m in members))
        time.sleep(0.3)


def converged(members: list[Member], keys: list[bytes], log, timeout: float = 60.0) -> dict:
    """Every member serves the same (value, mod revision) for every key."""
    deadline = time.monotonic() + timeout
    while True:
        revive_ended(members, log)
        views = []
        for m in members:
            try:
                with chaos_auth.channel(m.endpoint, options=BIG_CHANNEL) as ch:
                    kv = pbg.KVStub(ch)
                    views.append({k: [(summary(x.value), x.mod_revision) for x in kv.Range(
                        pb.RangeRequest(key=k, serializable=True), timeout=5).kvs] for k in keys})
            except grpc.RpcError:
                views.append(None)
        if views[0] is not None and all(v == views[0] for v in views):
            return views[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"members disagree: {views}\n" + "\n".join(m.follower_metrics() for m in members)
                                 + "".join(f"\n{m.name} log: {m.proc.log_tail(15)}" for m, v in zip(members, views)
                                           if v is None))
        time.sleep(0.5)


def summary(value: bytes) -> bytes:
    """A value as compared and reported: a large one by its start, length and checksum."""
    return value if len(value) <= 64 else b"%s...(%d bytes, crc32 %08x)" % (value[:16], len(value), zlib.crc32(value))


def big_writer(endpoint: str, stop: threading.Event, acked: list[int], unknown: list[int], keys: list[bytes]) -> None:
    """Large transactions until ``stop``: the n-th puts a value starting ``n:`` on every one of
    ``keys`` but the last, and ``n`` on the last, at once; ``acked`` gets each n acknowledged,
    ``unknown`` each n whose call failed (it may take effect, even after later ones). After each
    it compacts to its revision (so that the members' stores do not grow by 9 MiB a write)."""
    n = 0
    with chaos_auth.channel(endpoint, options=BIG_CHANNEL) as channel:
        kv = pbg.KVStub(channel)
        while not stop.is_set():
            n += 1
            value = (b"%d:" % n).ljust(BIG_VALUE_BYTES, b"x")
            puts = [pb.PutRequest(key=k, value=value) for k in keys[:-1]] + [pb.PutRequest(key=keys[-1], value=b"%d" % n)]
            try:
                try:
                    rev = kv.Txn(pb.TxnRequest(success=[pb.RequestOp(request_put=p) for p in puts]),
                                 timeout=20).header.revision
                except grpc.RpcError:
                    unknown.append(n)
                    raise
                acked.append(n)
                kv.Compact(pb.CompactionRequest(revision=rev), timeout=20)
            except grpc.RpcError:
                try:
                    grpc.channel_ready_future(channel).result(timeout=20)
                except grpc.FutureTimeoutError:
                    pass
            stop.wait(1.0)


def check_big(view: dict, keys: list[bytes], acked: list[int], unknown: list[int]) -> str:
    """The large transactions' keys in a converged ``view``: one transaction's values, all at one
    revision (none applied in part), no older than the last acknowledged unless its own outcome was
    unknown (a call that failed may still take effect after later ones)."""
    big, small = [view[k] for k in keys[:-1]], view[keys[-1]]
    assert all(b == big[0] for b in big), f"large transaction applied in part: {big}"
    if not big[0]:
        assert not acked and not small, f"no large transaction, but {acked} acknowledged; small key {small}"
        return "no large transaction (0 acknowledged this round)"
    (value, rev), = big[0]
    n = int(value.split(b":")[0])
    assert value == summary((b"%d:" % n).ljust(BIG_VALUE_BYTES, b"x")), f"large value damaged: {value}"
    assert small == [(b"%d" % n, rev)], f"large transaction {n} at {rev}, its small key {small}"
    assert n >= max(acked, default=0) or n in unknown, f"large transaction {n} kept, {max(acked)} was acknowledged"
    return f"large transaction {n} at revision {rev} ({len(acked)} acknowledged this round)"


def serving(members: list[Member], log, timeout: float = 60.0, prefix: bytes = b"/registry/pods/chaos/serving-",
            who: str = "every member") -> None:
    """Every member takes a write and answers a linearizable read that sees it, within ``timeout``
    of the fault healing: a fault that leaves the members consistent but unable to serve (a
    follower stuck on a writer that is gone, a writer that never takes writes again) is a finding
    too, and the clients' history alone, full of calls of unknown outcome, would not show it."""
    started = time.monotonic()
    for m in members:
        errors = []
        while True:
            revive_ended(members, log)
            try:
                with chaos_auth.channel(m.endpoint) as ch:
                    kv = pbg.KVStub(ch)
                    key = prefix + m.name.encode()
                    rev = kv.Put(pb.PutRequest(key=key, value=b"%d" % len(errors)), timeout=5).header.revision
                    got = kv.Range(pb.RangeRequest(key=key), timeout=5)
                    assert [x.mod_revision for x in got.kvs] == [rev], (m.name, rev, got)
                break
            except grpc.RpcError as exc:
                errors.append(f"{exc.code().name}: {exc.details()}")
                assert time.monotonic() < started + timeout, f"{m.name} serves no more: {errors[-3:]}; " + \
                    m.proc.log_tail(15)
                time.sleep(0.5)
    log(f"  {who} took a write and a linearizable read {time.monotonic() - started:.1f} s after the round")


def inject(fault: str, members: list[Member], nats, rng: random.Random, log, run: ClusterRun | None = None) -> str | None:
    """The fault, until it healed; the member it struck (None: NATS)."""
    if run is not None and "nats" not in fault:
        struck = chaos_cluster.inject(fault, run, rng, log, LEASE_TTL_S)
        revive_ended(members, log)
        return struck
    writer = the_writer(members)
    victim = None
    others = [m for m in members if m is not writer]
    if fault in ("kill-writer", "kill-member"):
        victim = writer if fault == "kill-writer" else rng.choice(others)
        log(f"  SIGKILL {victim.name} (pid {victim.proc.pid})")
        victim.proc.kill()
        time.sleep(rng.uniform(0.5, 2 * LEASE_TTL_S))
    elif fault in ("pause-writer", "pause-member", "cut-writer", "cut-member", "stall-writer", "stall-member"):
        victim = writer if fault.endswith("-writer") else rng.choice(others)
        # a cut or stall may last long past a takeover: a deposed writer keeps serving its readers meanwhile
        held = rng.uniform(0.5, 2.5 if fault.startswith("pause") else 5.0) * LEASE_TTL_S
        if fault.startswith("pause"):
            log(f"  SIGSTOP {victim.name} (pid {victim.proc.pid}) for {held:.1f} s")
            os.kill(victim.proc.pid, signal.SIGSTOP)
            time.sleep(held)
            os.kill(victim.proc.pid, signal.SIGCONT)
        else:
            how = fault.partition("-")[0]
            log(f"  {victim.name} (pid {victim.proc.pid}) {'cut off from' if how == 'cut' else 'stalled on'} NATS "
                f"for {held:.1f} s")
            broken_for(victim.proxies, how, held)
        time.sleep(LEASE_TTL_S)
    elif fault == "kill-nats-quorum":
        gone = sorted(rng.sample(range(3), 2))
        held = rng.uniform(1.0, 3.0) * LEASE_TTL_S
        log(f"  NATS servers {gone} killed for {held:.1f} s: JetStream has no quorum")
        for i in gone:
            nats.kill(i)
        time.sleep(held)
        for i in gone:
            nats.start(i)
    else:
        i = rng.randrange(3)
        held = rng.uniform(1.0, 3.0) * LEASE_TTL_S
        if fault == "kill-nats":
            log(f"  NATS server {i} killed for {held:.1f} s")
            nats.kill(i)
            time.sleep(held)
            nats.start(i)
        else:
            log(f"  NATS server {i} paused for {held:.1f} s")
            nats.pause(i)
            time.sleep(held)
            nats.resume(i)
    revive_ended(members, log)
    return victim.name if victim is not None else None


def revive_ended(members: list[Member], log) -> None:
    """A writer deposed by a fault stops (exit 1), maybe a while after it: back as a standby."""
    for m in members:
        if not m.proc.running():
            if m.proc.returncode != -signal.SIGKILL:
                tail = m.proc.log_tail(40)
                stuck = [line for line in tail.splitlines() if "stop did not end" in line]
                assert not stuck, f"{m.name} hung stopping: {stuck}"  # exited by its watchdog: a finding
                log(f"  {m.name} exited (rc {m.proc.returncode}): {tail.splitlines()[-1:]}")
            m.revive()


def verify_journals(nats) -> str:
    """``journal verify`` against the NATS servers themselves (not through a member's proxies):
    every stream and checkpoint sound, no acknowledged revision gone; its acknowledged line."""
    from journal.verify_jetstream import acknowledged_lines, report_lines, verify_jetstream

    found = asyncio.run(verify_jetstream(tuple(nats.urls.split(",")), "shardetcd", access=NATS_ACCESS))
    lines, gone = acknowledged_lines(found.streams, found.acknowledged, "shardetcd", found.spans)
    assert all(r.sound for r in found.streams) and found.acknowledged is not None and not gone, "journal verify: " + "\n".join(
        report_lines(found.streams) + lines)
    return "; ".join(lines)


def one_round(r: int, fault: str, members: list[Member], nats, rng: random.Random, out: Path, log,
              run: ClusterRun | None = None, others: list = ()) -> None:
    log(f"round {r}: {fault}")
    keys = [k + b"/round%d" % r for k in KEYS]  # each round's register starts absent
    writer = the_writer(members).endpoint
    with chaos_auth.channel(writer) as ch:
        start_rev = pbg.KVStub(ch).Range(pb.RangeRequest(key=keys[0]), timeout=10).header.revision + 1
    watches = [MemberWatch(m.name, m.endpoint, keys, start_rev) for m in members]
    leases, lockers, observers = None, [], []
    try:
        leases = RoundLeases({m.name: m.endpoint for m in members}, writer, r)
        lockers = [kind(m.name, m.endpoint, b"/chaos/%s/round%d" % (kind.noun.encode(), r), leases.keepers[m.name].id)
                   for kind in (Locker, Candidate) for m in members]
        observers = [Observer(m.name, m.endpoint, b"/chaos/%s/round%d" % (Candidate.noun.encode(), r)) for m in members]
        _round(r, fault, members, nats, rng, out, log, keys, watches, start_rev, leases, lockers + observers, run,
               list(others))
    finally:
        for w in watches:
            w.close()
        for lk in lockers + observers:
            lk.stop()
        if leases is not None:
            leases.stop()


def _round(r: int, fault: str, members: list[Member], nats, rng: random.Random, out: Path, log,
           keys: list[bytes], watches: list[MemberWatch], start_rev: int, leases: RoundLeases,
           lockers: list, run: ClusterRun | None, others: list) -> None:
    history: list = []
    stop = threading.Event()
    # per member: two clients doing everything, one only reading (a write to a member cut off
    # from the writer blocks its client, so only a reader goes on asking it while it is cut off);
    # a cluster's other partition: one client through each of its endpoints, on a key of its own
    clients = [(m.endpoint, weights, keys) for m in members for weights in (MIXED, MIXED, READS)]
    other_keys = [chaos_cluster.OTHER_KEY + b"/round%d" % r] if others else []
    clients += [(m.endpoint, MIXED, other_keys) for m in others]
    linear: list = []  # the gets' answers, and serializable reads' (tests/chaos_reads.py)
    serial: list = []
    threads = [threading.Thread(target=client, args=(ep, c, stop, history, 10, ks, weights, chaos_auth.channel,
                                                     linear if ks is keys else None), daemon=True)
               for c, (ep, weights, ks) in enumerate(clients)]
    threads += [threading.Thread(target=serial_reads, args=(m.endpoint, stop, keys, serial, r * 100 + i), daemon=True)
                for i, m in enumerate(members)]
    big_keys = [b"/registry/pods/chaos/big-%d/round%d" % (i, r) for i in range(BIG_KEYS)] + [
        b"/registry/configmaps/chaos/big/round%d" % r]
    acked: list[int] = []
    unknown: list[int] = []
    threads.append(threading.Thread(target=big_writer, args=(rng.choice(members).endpoint, stop, acked, unknown,
                                                             big_keys), daemon=True))
    for t in threads:
        t.start()
    auth = chaos_auth.ACTIVE
    change = auth.change(r, [m.endpoint for m in members], rng) if auth else None
    time.sleep(rng.uniform(1.0, 4.0))
    struck = inject(fault, members, nats, rng, log, run)
    time.sleep(3.0)  # traffic after the fault healed
    stop.set()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a client is stuck"
    if change is not None:
        change.end()
    for lk in lockers:
        lk.stop()
    done = sum(1 for _, op in history if not math.isinf(op.ret))
    unknown = len(history) - done
    log(f"  {done} operations answered, {unknown} of unknown outcome")
    check_linearizable(history, out, f"round{r}-{fault}", keys + other_keys)
    log(f"  {check_reads(serial, linear)}")
    serving(members, log)
    if others:
        serving(others, log, prefix=chaos_cluster.OTHER_KEY + b"/serving-", who="the other partition's members each")
        log(f"  the other partition's members agree: {converged(others, other_keys, log)}")
    leases.answered()
    leases.stop()
    writer = the_writer(members)
    alive = leases.alive(writer.endpoint)
    view = converged(members, keys + big_keys + leases.all_keys, log)
    alive_after = leases.alive(writer.endpoint)
    log(f"  linearizable; writer {writer.name}; members agree on {sum(len(v) for v in view.values())} keys; "
        f"the writer stored {writer.checkpoints_stored()} checkpoints since it started")
    log(f"  {check_big(view, big_keys, acked, unknown)}")
    if change is not None:
        log(f"  {auth.check(change, {m.name: m.endpoint for m in members})}")
    fences = {}
    with chaos_auth.channel(writer.endpoint) as ch:
        for k in keys:
            fences[k] = pbg.KVStub(ch).Put(pb.PutRequest(key=k, value=FENCE), timeout=10).header.revision
    for w in watches:
        for k in keys:
            assert w.wait_through(k, fences[k], 60), f"{w.member}'s watcher on {k!r} did not see the fence at " \
                f"{fences[k]} in 60 s (it is at {w.next[k]}, streams opened {w.opened} times)"
    log(f"  {watch_report(watches, keys, start_rev, fences, view, history)}")
    log(f"  {leases.report(alive, alive_after, view, struck)}")
    for kind in (Locker, Candidate):
        log(f"  {check_lockers([lk for lk in lockers if type(lk) is kind], alive, struck)}")
    log(f"  {check_observers([o for o in lockers if type(o) is Observer], struck)}")
    leases.revoke(writer.endpoint, alive_after)
    with chaos_auth.channel(writer.endpoint) as ch:  # gone, so that a long run's state does not grow 9 MiB a round
        pbg.KVStub(ch).Txn(pb.TxnRequest(success=[pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=k))
                                                  for k in big_keys]), timeout=30)
    if nats is not None:  # a local journal is verified offline only (its writer appends all along)
        log(f"  journal verify: all sound; {verify_journals(nats)}")


def secure_nats(out: Path) -> tuple[tuple[str, ...], str, tuple[str, ...], object]:
    """NATS servers that require TLS with client certificates of a CA of their own, in operator
    mode with one JetStream account: their flags, their configuration lines, the flags that make a
    member their user, with the journal's permissions only (tests/integration/test_nats_auth.py),
    and the same access for this process (a NatsAccess, for ``journal verify``)."""
    from tests.integration.test_nats_auth import JOURNAL_PERMISSIONS
    from tests.nats_auth import OperatorMode

    pki, op = make_pki(out / "nats-pki", name="nats"), OperatorMode(out / "nats-operator")
    creds = op.account("etcd").user("shardetcd", JOURNAL_PERMISSIONS)
    return (nats_server_tls_flags(pki), op.config(), (*journal_tls_flags(pki), "--journal-creds-file", str(creds)),
            journal_tls_access(pki, creds))


def main(argv: list[str] | None = None) -> int:
    global NATS_ACCESS
    ap = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=0, help="stop after this many rounds (0: by --minutes)")
    ap.add_argument("--faults", default="", help="comma-separated: one round each, in this order, then stop "
                    f"(default: a random one per round, of {','.join(FAULTS)})")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--dir", type=Path, default=None, help="where data, logs and failing histories go")
    ap.add_argument("--hold", action="store_true", help="on a failure, leave every server running for a look "
                    "(their PIDs, ports and metrics ports are printed) until this process gets SIGINT or SIGTERM")
    ap.add_argument("--server-args", default="", help="more shardetcd flags for every member, e.g. "
                    "'--checkpoint-journal-bytes 20000' for a checkpoint stored and the journal released every few writes")
    ap.add_argument("--journal", choices=("jetstream", "local"), default="jetstream",
                    help="local: the writer on a local journal (the default deployment) and two followers of its "
                    f"data dir (--follow-data-dir), with the faults {', '.join(LOCAL_FAULTS)}")
    ap.add_argument("--cluster", action="store_true", help="shardetcd cluster, two partitions, each with a follower: "
                    f"on JetStream with --standbys, with the faults {', '.join(CLUSTER_FAULTS)}; with --journal local, "
                    f"{', '.join(CLUSTER_LOCAL_FAULTS)} (tests/chaos_cluster.py)")
    ap.add_argument("--auth", action="store_true", help="auth on: every call as a user that is not root, "
                    "with a simple token; an auth change each round that every member must hold to (tests/chaos_auth.py)")
    ap.add_argument("--tls", action="store_true", help="clients served over TLS with client certificates required "
                    "(--client-cert-auth), followers calling their writer so")
    ap.add_argument("--nats-secure", action="store_true", help="NATS as production runs it: TLS with client "
                    "certificates verified, and operator mode: the members' NATS user a creds file (a JWT) allowed "
                    "only what a journal publishes and subscribes to")
    args = ap.parse_args(argv)
    if args.nats_secure and args.journal == "local":
        ap.error("--nats-secure is for a JetStream journal")
    server_args = tuple(shlex.split(args.server_args))
    local = args.journal == "local"
    faults = (CLUSTER_LOCAL_FAULTS if local else CLUSTER_FAULTS) if args.cluster else LOCAL_FAULTS if local else FAULTS
    listed = [f for f in args.faults.split(",") if f]
    if unknown := set(listed) - set(faults):
        ap.error(f"unknown faults: {sorted(unknown)}")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    out = args.dir or Path(tempfile.mkdtemp(prefix="shardetcd-chaos-"))
    out.mkdir(parents=True, exist_ok=True)

    def log(line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)

    log(f"chaos seed {seed}, {'a cluster on ' if args.cluster else ''}{args.journal} journal"
        f"{', auth on' if args.auth else ''}{', TLS' if args.tls else ''}"
        f"{', NATS over TLS with a JWT user' if args.nats_secure else ''}, data and logs under {out}")
    pki = make_pki(out / "pki") if args.tls else None
    # stopped by PID: the finally below stops every server (the caller's handler back after)
    before = signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    members: list[Member] = []
    run, others, nats = None, [], None
    try:  # (the finally below also resets the module state set here: a test's run leaves none behind)
        chaos_auth.use_tls(pki)
        nats_flags, nats_config, nats_access, NATS_ACCESS = secure_nats(out) if args.nats_secure else ((), "", (), None)
        if args.journal != "local":  # members go through their proxies
            nats = start_nats_cluster(out / "nats", size=3, extra=("--no_advertise", *nats_flags), config=nats_config)
        server_args = (*nats_access, *server_args)
        if args.cluster:
            run = ClusterRun(nats, out, ("--max-request-bytes", str(BIG_REQUEST_BYTES), "--enable-pprof",
                                         *(member_tls_flags(pki) if pki else ()), *server_args))
            run.start()
            members, others = chaos_cluster.members(run, "main"), chaos_cluster.members(run, "nodes")
        else:
            members.append(Member(nats, out, "m0", server_args=server_args, pki=pki))
            following = ("--follow", "--standby") if nats else ("--follow", "--follow-data-dir", str(members[0].data_dir))
            for i in (1, 2):  # one by one: the finally below stops those that started if one does not
                members.append(Member(nats, out, f"m{i}", *following, server_args=server_args, pki=pki))
        if args.auth:
            auth = chaos_auth.Auth()
            for endpoint in [run.urls[p] for p in run.ports] if run is not None else [the_writer(members).endpoint]:
                auth.enable(endpoint)
            auth.separate([m.endpoint for m in others])  # the cluster's other partition
            chaos_auth.ACTIVE = auth
            log("auth enabled: every call as the user chaos, with a simple token")
        ends = time.monotonic() + args.minutes * 60
        r = 0
        while (r < len(listed) if listed else r < args.rounds if args.rounds else time.monotonic() < ends):
            r += 1
            one_round(r, listed[r - 1] if listed else rng.choice(faults), members, nats, rng, out, log, run, others)
        log(f"{r} rounds, no fault found (seed {seed})")
        return 0
    except Exception:  # a finding (an interrupt ends the run as ever)
        if args.hold:
            traceback.print_exc()
            log("held for a look (/debug/tasks on each metrics port): " + "; ".join(
                f"{m.name} pid {m.proc.pid} {m.endpoint} metrics :{m.metrics_port}" for m in members if m.proc.running()))
            try:
                while True:
                    time.sleep(3600)
            except (KeyboardInterrupt, SystemExit):
                pass
        raise
    finally:
        NATS_ACCESS = None
        chaos_auth.ACTIVE = None
        chaos_auth.use_tls(None)
        signal.signal(signal.SIGTERM, before)
        if run is not None:
            run.stop()
        for m in members if run is None else ():
            if m.proc.running():
                os.kill(m.proc.pid, signal.SIGCONT)
                m.proc.kill()
            for p in m.proxies:
                p.close()
        if nats is not None:
            nats.stop()


if __name__ == "__main__":
    sys.exit(main())
