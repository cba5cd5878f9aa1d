"""``shardetcd cluster``: one shardetcd process per partition, supervised.

Each partition of the cluster layout (see ``shards/partition.py``) runs as
its own ``shardetcd --cluster-layout L --partition NAME`` process with its own
client URL, data dir (``DIR/<name>``) and log (``DIR/<name>.log``).  The
supervisor restarts a process that dies (saying why, with the last line of
its log), backing off while one keeps crashing; it stops them all on
SIGINT/SIGTERM.  Once every partition serves it prints, and writes to
``DIR/kube-apiserver.flags``, the ``--etcd-servers`` and
``--etcd-servers-overrides`` flags that point kube-apiserver at them.

With ``--enable-log-rotation`` (and etcd's ``--log-rotation-config-json``), each
process writes its log lines to ``DIR/<name>.log`` itself (``--log-outputs``) and
rotates that file as a single server does; what it prints (the line saying it
serves, why it could not start, a traceback) then goes to ``DIR/<name>.out``.
Without it, both go to ``DIR/<name>.log``, which only an outside tool can rotate
(copy and truncate: the processes hold it open).

With a replicated journal (``--journal-url``) and ``--standbys``, each
partition runs two processes on the same client URL, both started
``--standby``: the one that takes the partition's writer lease serves, the
other follows its journals and takes over when it dies (binding the URL the
dead one held); the supervisor restarts the dead one, which then stands by in
turn. When the one serving hangs instead and keeps the URL, the standby takes
over and says it finds the URL held (``supervised.URL_HELD``): the supervisor
kills the hung, deposed process, and the standby binds the URL.  The second one keeps its data in ``DIR/<name>.2`` and logs to
``DIR/<name>.2.log``.

Every process, once it serves, writes a byte down a pipe to the supervisor each second from its
event loop (shim/supervised.py). One that falls silent for ``--liveness-timeout`` (60 s) while it
runs, hung or stopped, is killed and restarted as one that died: on a local journal nothing else
can end it (it holds the data dir), and until it ends its partition serves nobody. Beats wait in
the pipe while the supervisor reads nothing (stopped itself): they are heard when it goes on.

With ``--followers N``, each partition also gets N followers (``--follow``),
each on a client URL of its own, listed after the writer in
``--etcd-servers``: they follow the JetStream journals, or with the local
journal the writer's data dir ``DIR/<name>`` (``--follow-data-dir``).

With ``--cert-file`` (and etcd's other TLS flags) among the flags passed on,
every process serves TLS: its client URL, and so the kube-apiserver flags, are
``https://``; followers call their writer over TLS (``--client-cert-file``, else
``--cert-file``, is what they present).
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from shards.errors import LayoutError
from shards.partition import ClusterLayout, Partition, load_cluster_layout

from . import supervised

logger = logging.getLogger("shardetcd.cluster")

READY_LINE = b"shardetcd serving the etcd v3 API"
START_TIMEOUT_S = 60.0
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.5, 10.0
HEALTHY_AFTER_S = 30.0  # a process up this long has its restart backoff reset
LIVENESS_TIMEOUT_S = 60.0  # a serving process whose event loop is silent this long is killed and restarted
STOP_GRACE_S = 15.0
POLL_S = 0.1
FOLLOWER_PORT_MOVES = 5  # a follower whose port another process took while it started moves on this often
LISTEN_FAILED = b"cannot listen on "
URL_HELD = supervised.URL_HELD.encode()
UNSPECIFIED_HOSTS = ("0.0.0.0", "::", "[::]")
# server flags the supervisor sets for each partition, which a user may not pass to all
PER_PARTITION_FLAGS = frozenset({
    "--name", "--listen-client-urls", "--advertise-client-urls", "--listen-metrics-urls",
    "--cluster-layout", "--partition", "--shard-layout", "--state-dir", "--wal-dir",
})


@dataclass
class Child:
    partition: Partition
    url: str
    data_dir: Path
    log_path: Path
    argv: list[str]
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    log_offset: int = 0
    rotated: bool = False  # the process writes (and rotates) log_path itself; its output goes to out_path
    ready: bool = False
    held_up: bool = False  # it took over, found its URL held, and the holder was killed (--standbys)
    restarts: int = 0
    backoff_s: float = BACKOFF_MIN_S
    restart_at: float | None = None
    replica: int = 1  # 2: a partition's second process (--standbys)
    follower: int = 0  # n > 0: the partition's n-th follower (--followers), on a client URL of its own
    beats: int | None = None  # the read end of the pipe its event loop beats down (shim/supervised.py)
    heard_at: float = 0.0  # when it last beat, or became ready

    @property
    def name(self) -> str:
        return self.partition.name

    @property
    def label(self) -> str:
        """The partition's name, and which of its processes this is when it has more."""
        if self.follower:
            return f"{self.name}.f{self.follower}"
        return self.name if self.replica == 1 else f"{self.name}.{self.replica}"

    @property
    def out_path(self) -> Path:
        """Where the process's standard output and error go."""
        return self.log_path.with_suffix(".out") if self.rotated else self.log_path

    def spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.close_beats()
        self.beats, beat = os.pipe()
        os.set_blocking(self.beats, False)
        try:
            with self.out_path.open("ab") as out:
                self.log_offset = out.tell()
                # own session: a Ctrl-C reaches the supervisor, which stops the partitions in order; no
                # preexec_fn: the process sets up its niceness and parent-death signal itself (shim/supervised.py)
                self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                             start_new_session=True, pass_fds=(beat,),
                                             env=supervised.environment(self.partition.nice, beat))
        finally:
            os.close(beat)
        self.started_at, self.ready, self.restart_at, self.held_up = time.monotonic(), False, None, False

    def close_beats(self) -> None:
        if self.beats is not None:
            os.close(self.beats)
            self.beats = None

    def silent_for(self, now: float) -> float:
        """Seconds since it last beat (or became ready); 0 until it serves."""
        if not self.ready:
            return 0.0
        try:
            if os.read(self.beats, 4096):
                self.heard_at = now
        except BlockingIOError:
            pass
        return now - self.heard_at

    def move_to(self, listen: str, url: str) -> None:
        """Listen on ``listen`` and advertise ``url`` from the next spawn on."""
        for flag, value in (("--listen-client-urls", listen), ("--advertise-client-urls", url)):
            self.argv[self.argv.index(flag) + 1] = value
        self.url = url

    def new_log(self) -> bytes:
        """What the process printed since it was started (with its log lines unless rotated)."""
        try:
            with self.out_path.open("rb") as f:
                f.seek(self.log_offset)
                return f.read()
        except OSError:
            return b""

    def last_log_line(self) -> str:
        """The last line the process printed or logged: from its output or, when it rotates its
        log and wrote that last, from the end of its log file."""
        said = self.new_log()
        if self.rotated and _mtime(self.log_path) > _mtime(self.out_path):
            said = _tail(self.log_path)
        lines = [ln for ln in said.decode("utf-8", "replace").splitlines() if ln.strip()]
        return lines[-1] if lines else "(no output)"

    def check_ready(self, said: bytes | None = None) -> bool:
        """Whether it serves; ``said``: its new_log() when the caller read it already."""
        if not self.ready and READY_LINE in (self.new_log() if said is None else said):
            self.ready, self.heard_at = True, time.monotonic()
        return self.ready


def _given(flag: str, args: list[str]) -> bool:
    """Whether ``args`` (the flags passed on to the partitions) hold ``flag``, alone or as flag=value."""
    return any(a.split("=")[0] == flag for a in args)


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return -1


def _tail(path: Path, size: int = 4096) -> bytes:
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - size))
            return f.read()
    except OSError:
        return b""


def exit_reason(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _child(partition: Partition, url: str, data_dir: Path, label: str, argv: list[str], rotated: bool,
           **which: int) -> Child:
    """The process ``label`` of ``partition``: data in DIR/label, log in DIR/label.log (written and rotated by the
    process itself when ``rotated``)."""
    log = data_dir / f"{label}.log"
    if rotated:
        argv = [*argv, "--log-outputs", str(log)]
    return Child(partition, url, data_dir / label, log, argv, rotated=rotated, **which)


class Supervisor:
    def __init__(self, layout: ClusterLayout, layout_path: Path, data_dir: Path, host: str, base_port: int,
                 server_args: list[str], state_dir: Path | None = None, quota_backend_bytes: int | None = None,
                 standbys: bool = False, followers: int = 0, local_journal: bool = True,
                 wal_dir: Path | None = None, advertise_host: str | None = None,
                 liveness_timeout_s: float = LIVENESS_TIMEOUT_S) -> None:
        rotated = _given("--enable-log-rotation", server_args)
        self.liveness_timeout_s = liveness_timeout_s
        # with a certificate among the flags passed on, every process serves TLS on its client URL
        self.scheme = "https" if _given("--cert-file", server_args) else "http"
        self.host, self.advertise_host = host, advertise_host or host
        self.layout = layout
        self.data_dir = data_dir
        self.stopping = False
        ports = layout.ports(base_port)
        self.children = []
        for p in layout.partitions:
            listen, url = self._urls(ports[p.name])
            for replica in (1, 2) if standbys else (1,):
                label = p.name if replica == 1 else f"{p.name}.{replica}"
                argv = [sys.executable, "-m", "shim", "--name", label, "--data-dir", str(data_dir / label),
                        "--listen-client-urls", listen, "--advertise-client-urls", url, "--cluster-layout", str(layout_path.absolute()),
                        "--partition", p.name]
                if standbys:  # whichever holds the partition's writer lease serves; the other follows
                    argv.append("--standby")
                if state_dir is not None:
                    argv += ["--state-dir", str(state_dir / label)]
                if wal_dir is not None:
                    argv += ["--wal-dir", str(wal_dir / label)]
                quota = p.quota_backend_bytes if p.quota_backend_bytes is not None else quota_backend_bytes
                if quota is not None:
                    argv += ["--quota-backend-bytes", str(quota)]
                self.children.append(_child(p, url, data_dir, label, argv + server_args, rotated, replica=replica))
        self.next_port = max(ports.values()) + 1
        for p in layout.partitions:
            for n in range(1, followers + 1):
                listen, url = self._urls(self._next_free_port())
                label = f"{p.name}.f{n}"
                argv = [sys.executable, "-m", "shim", "--name", label, "--data-dir", str(data_dir / label),
                        "--listen-client-urls", listen, "--advertise-client-urls", url, "--cluster-layout", str(layout_path.absolute()),
                        "--partition", p.name, "--follow"]
                if local_journal:  # the partition's writer's journal, read in its data dir
                    argv += ["--follow-data-dir", str(data_dir / p.name)]
                if state_dir is not None:
                    argv += ["--state-dir", str(state_dir / label)]
                self.children.append(_child(p, url, data_dir, label, argv + server_args, rotated, follower=n))

    def _urls(self, port: int) -> tuple[str, str]:
        """The client URL a process on ``port`` listens on, and the one it advertises."""
        def url(host: str) -> str:
            return f"{self.scheme}://{'[' + host + ']' if ':' in host else host}:{port}"

        return url(self.host), url(self.advertise_host)

    def _next_free_port(self) -> int:
        """The first port after the last one handed out that nothing listens on or is bound to now.
        Bound as the server binds it (SO_REUSEADDR): a port whose connections are in TIME_WAIT is
        free to it, so a cluster started again gives its followers the ports, and kube-apiserver
        the flags, it had."""
        while True:
            port, self.next_port = self.next_port, self.next_port + 1
            if port > 65535:
                raise LayoutError("no free port left after the partitions' for the followers")
            with socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind((self.host, port))
                except OSError:
                    logger.info("port taken, follower moves on port=%d", port)
                    continue
            return port

    def serving(self) -> dict[str, Child]:
        """Per partition, the process that writes it (its first while none does)."""
        out: dict[str, Child] = {}
        for c in self.children:
            if c.follower:
                continue
            if c.check_ready() or c.name not in out:
                out[c.name] = c
        return out

    @property
    def flags(self) -> list[str]:
        urls: dict[str, list[str]] = {}
        for c in self.children:  # the writer's URL, then its followers'
            if c.replica == 1:
                urls.setdefault(c.name, []).append(c.url)
        return self.layout.apiserver_flags(urls)

    def start_all(self) -> str | None:
        """Start every partition and wait until each serves; the reason if one cannot."""
        for c in self.children:
            c.spawn()
        deadline = time.monotonic() + START_TIMEOUT_S
        moves = 0
        while not all(c.ready for c in self.serving().values()) or \
                not all(c.check_ready() for c in self.children if c.follower):
            for c in self.children:
                if c.proc.poll() is not None and not c.check_ready():
                    # a follower's port is ours to choose: if another process bound it between our check and
                    # the follower's listen, the follower takes the next free one (the flags are printed later)
                    if c.follower and LISTEN_FAILED in c.new_log() and moves < FOLLOWER_PORT_MOVES:
                        moves += 1
                        old = c.url
                        c.move_to(*self._urls(self._next_free_port()))
                        logger.warning("follower's port taken, moving partition=%s from=%s to=%s", c.label, old, c.url)
                        c.spawn()
                        continue
                    return f"partition {c.label} {exit_reason(c.proc.returncode)}: {c.last_log_line()}"
            if self.stopping:
                return "stopped while starting"
            if time.monotonic() > deadline:
                late = [c.label for c in (*self.serving().values(), *(c for c in self.children if c.follower))
                        if not c.ready]
                return f"partitions {', '.join(late)} did not start within {START_TIMEOUT_S:.0f}s (see their logs in {self.data_dir})"
            time.sleep(POLL_S)
        return None

    def tend(self) -> None:
        """One supervision step: notice deaths, restart when their backoff is over, kill a process
        that serves but whose event loop fell silent for --liveness-timeout (hung, or stopped)."""
        now = time.monotonic()
        for c in self.children:
            if c.restart_at is not None:
                if now >= c.restart_at:
                    c.restarts += 1
                    c.spawn()
                    logger.warning("restarted partition=%s pid=%d restarts=%d", c.label, c.proc.pid, c.restarts)
                continue
            code = c.proc.poll()
            if code is None:
                if not c.ready:
                    said = c.new_log()
                    if URL_HELD in said and not (c.held_up or c.follower):
                        self._kill_deposed(c)
                    if c.check_ready(said):
                        logger.warning("serving again partition=%s url=%s pid=%d", c.label, c.url, c.proc.pid)
                elif self.liveness_timeout_s and (silent := c.silent_for(now)) > self.liveness_timeout_s:
                    logger.warning("partition not answering, killing it partition=%s pid=%d silent_s=%.1f "
                                   "last_log=%r", c.label, c.proc.pid, silent, c.last_log_line())
                    c.proc.kill()
                continue
            up_s = now - c.started_at
            if up_s >= HEALTHY_AFTER_S:
                c.backoff_s = BACKOFF_MIN_S
            c.restart_at = now + c.backoff_s
            c.backoff_s = min(BACKOFF_MAX_S, c.backoff_s * 2)
            logger.warning("partition died partition=%s pid=%d reason=%r up_s=%.1f last_log=%r restart_in_s=%.1f",
                           c.label, c.proc.pid, exit_reason(code), up_s, c.last_log_line(), c.restart_at - now)

    def _kill_deposed(self, c: Child) -> None:
        """``c``, one of a partition's two processes (--standbys), took the partition over but finds
        its URL held: by the other one, deposed (the writer lease and the journals are ``c``'s now)
        but not gone, stopped or hung where it would notice. Nothing else can end it, and until it
        ends the partition serves nobody: SIGKILL it (it is restarted as a standby in turn)."""
        c.held_up = True
        for other in self.children:
            if other is not c and other.name == c.name and not other.follower and other.proc.poll() is None:
                logger.warning("took over but its URL is held: killing the process it took over from partition=%s "
                               "pid=%d by=%s", other.label, other.proc.pid, c.label)
                other.proc.kill()

    def stop_all(self) -> None:
        for c in self.children:
            c.close_beats()
        live = [c.proc for c in self.children if c.proc is not None and c.proc.poll() is None]
        for p in live:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for p in live:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="shardetcd cluster",
        description="Run one shardetcd process per partition of a cluster layout, supervised, and print the "
                    "kube-apiserver flags that use them. Unrecognised flags (e.g. --journal-fsync) go to every partition.")
    p.add_argument("--layout", type=Path, required=True, help="cluster layout TOML: [[partition]] tables naming Kubernetes group/resources")
    p.add_argument("--data-dir", type=Path, required=True,
                   help="each partition keeps its data in DIR/<name> and logs to DIR/<name>.log (with "
                        "--enable-log-rotation, rotated by the partition, and what it prints in DIR/<name>.out)")
    p.add_argument("--host", default="127.0.0.1", help="IP address every partition listens on (default: %(default)s)")
    p.add_argument("--advertise-host", default=None,
                   help="host in the client URLs the partitions advertise and the kube-apiserver flags name "
                        "(default: --host; required when --host is 0.0.0.0 or ::, as etcd requires "
                        "--advertise-client-urls)")
    p.add_argument("--base-port", type=int, default=2379, help="the default partition's port; the others take base+2, base+3, … unless the layout sets port (default: %(default)s)")
    p.add_argument("--state-dir", type=Path, default=None, help="each partition keeps its in-memory state in STATE_DIR/<name> (default: under /dev/shm)")
    p.add_argument("--wal-dir", type=Path, default=None,
                   help="each partition keeps its local journal in WAL_DIR/<name> (e.g. a disk of its own; default: in its data dir)")
    p.add_argument("--quota-backend-bytes", type=int, default=None, help="quota of partitions whose layout entry sets none (default: etcd's 2 GiB)")
    p.add_argument("--flags-file", type=Path, default=None, help="where to write the kube-apiserver flags (default: DIR/kube-apiserver.flags)")
    p.add_argument("--standbys", action="store_true",
                   help="with --journal-url: two processes per partition on the same client URL; one serves, the "
                        "other follows its journals and takes over when it dies")
    p.add_argument("--followers", type=int, default=0, metavar="N",
                   help="N followers per partition, each on a client URL of its own (the free ports after "
                        "the partitions'), serving reads and watches; all are in the kube-apiserver flags. They follow "
                        "the JetStream journals of --journal-url, or else the writer's local journal in DIR/<name>")
    p.add_argument("--liveness-timeout", type=float, default=LIVENESS_TIMEOUT_S, metavar="SECONDS",
                   help="kill and restart a process that serves but whose event loop has been silent this long: "
                        "hung, or stopped (each beats down a pipe every second; default: %(default)s; 0: never)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warn", "error"])
    return p


def cluster_main(argv: list[str]) -> int:
    parser = build_parser()
    args, server_args = parser.parse_known_args(argv)
    clash = sorted({a.split("=")[0] for a in server_args} & PER_PARTITION_FLAGS)
    if clash:
        parser.error(f"the cluster sets {', '.join(clash)} for each partition itself (see --base-port, --data-dir, --state-dir and the layout)")
    if args.host in UNSPECIFIED_HOSTS and not args.advertise_host:
        parser.error(f"--host {args.host} listens on every address: give --advertise-host, the name or address "
                     "kube-apiserver and followers reach the partitions at")
    jetstream = _given("--journal-url", server_args)
    if args.standbys and not jetstream:
        parser.error("--standbys needs --journal-url: a standby takes over a replicated journal")
    if _given("--enable-log-rotation", server_args) and _given("--log-outputs", server_args):
        parser.error("with --enable-log-rotation each partition writes and rotates its own log, DIR/<name>.log: "
                     "no --log-outputs")
    if args.wal_dir is not None and jetstream:
        parser.error("--wal-dir places local journals: not with --journal-url (the journals are in JetStream)")
    from . import logs

    logs.setup(args.log_level)
    try:
        layout = load_cluster_layout(args.layout)
        args.data_dir.mkdir(parents=True, exist_ok=True)
        _no_partition_left_out(layout, args.data_dir, args.wal_dir)
        if jetstream:
            _no_jetstream_partition_left_out(layout, server_args)
        sup = Supervisor(layout, args.layout, args.data_dir, args.host, args.base_port, server_args, args.state_dir,
                         args.quota_backend_bytes, args.standbys, args.followers, local_journal=not jetstream,
                         wal_dir=args.wal_dir, advertise_host=args.advertise_host,
                         liveness_timeout_s=args.liveness_timeout)
    except LayoutError as exc:
        print(f"shardetcd cluster: {exc}", file=sys.stderr)
        return 2

    def on_signal(signum, frame) -> None:
        sup.stopping = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    try:
        failure = sup.start_all()
        if failure is not None:
            print(f"shardetcd cluster: {failure}", file=sys.stderr)
            return 2
        _announce(sup, args.flags_file or args.data_dir / "kube-apiserver.flags")
        while not sup.stopping:
            sup.tend()
            time.sleep(POLL_S)
        return 0
    finally:
        sup.stop_all()


def _no_partition_left_out(layout: ClusterLayout, data_dir: Path, wal_dir: Path | None) -> None:
    """LayoutError if ``data_dir`` holds the data of a partition (``DIR/<name>``, ``<name>.2``, ``<name>.f<n>``)
    that the layout no longer has: nothing would serve its keys (each partition also refuses to start on
    keys the layout gives to another; shim/server.py). Data is a local journal's segments or a checkpoint,
    in the dir or its wal dir: a partition that never took a write (one a refused start added) is not
    counted, and neither is a JetStream partition's (``_no_jetstream_partition_left_out``)."""
    for d in sorted(data_dir.iterdir()):
        name = d.name.split(".")[0]
        if name in layout.names or not d.is_dir() or not (d / "meta.json").is_file():
            continue
        places = [d] if wal_dir is None else [d, wal_dir / d.name]
        if any(next(p.rglob(pattern), None) for p in places for pattern in ("*.wal", "*.ckpt")):
            raise LayoutError(f"{d} holds the data of partition {name}, which the cluster layout no longer has: "
                              f"nothing would serve its keys (the resources it had would be answered without them). "
                              f"Moving a resource between partitions is not supported: put {name} back in the layout, "
                              "or move that dir away if its data is not wanted")


def _no_jetstream_partition_left_out(layout: ClusterLayout, server_args: list[str]) -> None:
    """LayoutError if the JetStream journals of the partitions' --journal-url and --journal-prefix hold
    a partition that the layout no longer has (its stream holds a record, or its checkpoint bucket an
    object), as ``_no_partition_left_out`` for local journals; or if NATS does not answer (each
    partition would stop on it too)."""
    import asyncio

    from journal.errors import JournalUnreachable
    from journal.verify_jetstream import shards_holding_data

    from .cli import build_parser, journal_access

    p = build_parser()  # read as each partition will read them
    given, _ = p.parse_known_args(server_args)
    try:
        held = asyncio.run(shards_holding_data(given.journal_urls, given.journal_prefix, set(layout.names),
                                               journal_access(p, given)))
    except JournalUnreachable as exc:
        raise LayoutError(f"{exc} (needed to check that the layout leaves no partition's journal out)") from None
    if held:
        name = held[0]
        raise LayoutError(f"JetStream stream {given.journal_prefix}_{name} holds the data of partition {name}, which the "
                          "cluster layout no longer has: nothing would serve its keys (the resources it had would be "
                          f"answered without them). Moving a resource between partitions is not supported: put {name} "
                          "back in the layout, or delete its stream and checkpoint bucket if its data is not wanted")


def _announce(sup: Supervisor, flags_file: Path) -> None:
    flags_file.write_text("\n".join(sup.flags) + "\n")
    serving = list(sup.serving().values())
    width = max(len(c.name) for c in serving)
    print(f"shardetcd cluster: {len(serving)} partitions serving", flush=True)
    for c in serving:
        what = "everything else" if c.partition.default else ", ".join(r.override_name for r in c.partition.resources)
        print(f"  {c.name:<{width}}  {c.url}  pid {c.proc.pid}  ({what}; data {c.data_dir})", flush=True)
    for c in sup.children:
        if c.follower:
            print(f"  {c.label:<{width}}  follower at {c.url}  pid {c.proc.pid}  (data {c.data_dir})", flush=True)
        elif c not in serving:
            print(f"  {c.label:<{width}}  standby for {c.url}  pid {c.proc.pid}  (data {c.data_dir})", flush=True)
    print(f"kube-apiserver flags (also in {flags_file}):", flush=True)
    for f in sup.flags:
        print(f"  {f}", flush=True)
