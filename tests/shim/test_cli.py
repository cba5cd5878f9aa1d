"""The shardetcd command: defaults, clean stops, one-line start-up failures."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.etcd_fixture import client_url_flags, free_port
from tests.shardetcd_fixture import start_shardetcd

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "shim", *args], cwd=cwd or REPO, capture_output=True, text=True, timeout=timeout
    )


def test_help_explains_every_flag():
    out = run_cli("--help").stdout
    for flag in (
        *client_url_flags("--advertise-client-urls"), "--data-dir", "--name", "--max-request-bytes",
        "--max-txn-ops", "--quota-backend-bytes", "--log-level", "--shard-layout", "--journal-fsync",
        "--journal-inline-writes",
    ):
        assert flag in out, flag


@pytest.mark.parametrize("argv, inline", [((), True), (("--journal-inline-writes", "off"), False),
                                           (("--journal-inline-writes", "on"), True)])
def test_journal_inline_writes_flag_reaches_the_journal(tmp_path, argv, inline):
    """On by default; off hands every batch to the writer thread (JournalConfig.inline_lone_writes)."""
    from shim.cli import build_parser, config_from_args
    from shim.server import store_config

    config = config_from_args(build_parser().parse_args(["--data-dir", str(tmp_path / "d"), *argv]))
    assert store_config(config).journal.inline_lone_writes is inline


def test_journal_inline_writes_flag_takes_on_or_off():
    p = run_cli("--journal-inline-writes", "sometimes")
    assert p.returncode == 2 and 'invalid value "sometimes" for flag -journal-inline-writes: want one of on, off' in p.stderr


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_serves_on_either_event_loop(tmp_path, loop):
    """--event-loop: uvloop (the default) or asyncio; either serves puts, reads and watches."""
    server = start_shardetcd(tmp_path, extra_args=("--event-loop", loop, "--log-level", "info"))
    try:
        with grpc.insecure_channel(server.endpoint) as ch:
            kv = pbg.KVStub(ch)
            watch = pbg.WatchStub(ch).Watch(iter([pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"k"))]),
                                            timeout=10)
            assert next(watch).created
            rev = kv.Put(pb.PutRequest(key=b"k", value=b"v"), timeout=10).header.revision
            assert [e.kv.mod_revision for e in next(watch).events] == [rev]
            assert kv.Range(pb.RangeRequest(key=b"k"), timeout=10).kvs[0].value == b"v"
            watch.cancel()
    finally:
        server.stop()
    assert f"serving event_loop={loop}" in server.log_path.read_text()


def test_event_loop_defaults_to_uvloop():
    from shim.cli import build_parser

    assert build_parser().parse_args([]).event_loop == "uvloop"


def start_raw(tmp_path: Path, *args: str, cwd: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "shim", "--state-dir", str(tmp_path / "state"), *args],
        cwd=cwd or tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_serves_defaults_and_stops_cleanly(tmp_path, sig):
    """No data dir flag: ./default.shardetcd; prints where it listens; exits 0 on a signal."""
    port = free_port()
    proc = start_raw(tmp_path, *client_url_flags(f"http://127.0.0.1:{port}"))
    try:
        line = proc.stdout.readline()
        assert f"http://127.0.0.1:{port}" in line and str(tmp_path / "default.shardetcd") in line
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            assert pbg.KVStub(ch).Put(pb.PutRequest(key=b"k", value=b"v"), timeout=5).header.revision == 2
        proc.send_signal(sig)
        assert proc.wait(15) == 0
    finally:
        proc.kill()
        proc.wait()
    assert (tmp_path / "default.shardetcd" / "meta.json").exists()


def test_port_in_use(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run_cli("--data-dir", str(tmp_path / "d"), "--state-dir", str(tmp_path / "s"),
                    *client_url_flags(f"http://127.0.0.1:{port}"))
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1] == f"shardetcd: cannot listen on http://127.0.0.1:{port}: address in use or not available"


def test_data_dir_not_writable(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    if os.access(ro, os.W_OK):  # root ignores modes: use a path under a file instead
        target = tmp_path / "file"
        target.write_text("")
        data_dir = target / "d"
    else:
        data_dir = ro / "d"
    r = run_cli("--data-dir", str(data_dir), *client_url_flags(f"http://127.0.0.1:{free_port()}"))
    assert r.returncode != 0
    assert "is not writable" in r.stderr.strip().splitlines()[-1]


def test_incompatible_data_dir(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "LOCK").write_text("")
    (d / "meta.json").write_text(json.dumps({"format": 99}))
    r = run_cli("--data-dir", str(d), *client_url_flags(f"http://127.0.0.1:{free_port()}"))
    assert r.returncode != 0
    assert "written by an incompatible version" in r.stderr.strip().splitlines()[-1]


def test_bad_layout_file(tmp_path):
    layout = tmp_path / "layout.toml"
    layout.write_text("[[shard]\nname = ")
    r = run_cli("--data-dir", str(tmp_path / "d"), "--shard-layout", str(layout),
                *client_url_flags(f"http://127.0.0.1:{free_port()}"))
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1].startswith(f"shardetcd: shard layout {layout} does not parse")


def test_changed_layout_is_refused(tmp_path):
    server = start_shardetcd(tmp_path)
    server.stop()
    layout = tmp_path / "layout.toml"
    layout.write_text('[[shard]]\nname = "pods"\nresources = ["pods"]\n')
    r = run_cli("--data-dir", str(server.data_dir), "--state-dir", str(tmp_path / "s2"),
                "--shard-layout", str(layout), *client_url_flags(f"http://127.0.0.1:{free_port()}"))
    assert r.returncode != 0 and "moving keys between shards is not supported" in r.stderr


def test_data_dir_in_use(shardetcd, tmp_path):
    r = run_cli("--data-dir", str(shardetcd.data_dir), "--state-dir", str(tmp_path / "s2"),
                *client_url_flags(f"http://127.0.0.1:{free_port()}"))
    assert r.returncode != 0 and "in use by another shardetcd process" in r.stderr


def test_state_dir_in_use(shardetcd, tmp_path):
    """A second server given the first's --state-dir (another data dir) is refused
    before it touches the state: the first keeps serving every key (issue 18.7)."""
    with grpc.insecure_channel(shardetcd.endpoint) as ch:
        kv = pbg.KVStub(ch)
        for i in range(50):
            kv.Put(pb.PutRequest(key=b"/registry/pods/ns/p%d" % i, value=b"v" * 100), timeout=10)
        r = run_cli("--data-dir", str(tmp_path / "other"), "--state-dir", str(shardetcd.state_dir),
                    *client_url_flags(f"http://127.0.0.1:{free_port()}"))
        assert r.returncode != 0
        assert r.stderr.strip().splitlines() == [
            f"shardetcd: state dir {shardetcd.state_dir.absolute()} is in use by another shardetcd process"]
        got = kv.Range(pb.RangeRequest(key=b"/registry/pods/", range_end=b"/registry/pods0"), timeout=10)
        assert [kv.value for kv in got.kvs] == [b"v" * 100] * 50


def test_client_keepalive_pings_every_5s_are_accepted(shardetcd):
    """etcd lets clients ping every 5 s; kube-apiserver pings every 30 s."""
    options = [
        ("grpc.keepalive_time_ms", 5000),
        ("grpc.keepalive_timeout_ms", 2000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    with grpc.insecure_channel(shardetcd.endpoint, options=options) as ch:
        kv = pbg.KVStub(ch)
        kv.Put(pb.PutRequest(key=b"ka", value=b"1"), timeout=5)
        state = []
        ch.subscribe(state.append, try_to_connect=False)
        time.sleep(16)  # three pings
        kv.Range(pb.RangeRequest(key=b"ka"), timeout=5)
        seen = list(state)
        assert seen == [grpc.ChannelConnectivity.READY], f"the connection was dropped: {seen}"


def test_max_concurrent_streams_limits_one_connection_only(tmp_path):
    """--max-concurrent-streams (etcd's flag) caps streams per connection: a
    third call on a connection holding two open watch streams waits, while a
    call on another connection is served."""
    server = start_shardetcd(tmp_path, extra_args=("--max-concurrent-streams", "2"))
    try:
        with grpc.insecure_channel(server.endpoint, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
            watch = pbg.WatchStub(ch)
            held = threading.Event()

            def requests():
                yield pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"w"))
                held.wait()

            streams = [watch.Watch(requests()) for _ in range(2)]
            for s in streams:  # both streams hold their slot before the third call
                assert next(s).created
            kv = pbg.KVStub(ch)
            with pytest.raises(grpc.RpcError) as err:
                kv.Range(pb.RangeRequest(key=b"x"), timeout=1.5, wait_for_ready=True)
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            with grpc.insecure_channel(server.endpoint, options=[("grpc.use_local_subchannel_pool", 1)]) as other:
                assert pbg.KVStub(other).Range(pb.RangeRequest(key=b"x"), timeout=5).header.revision >= 1
            for s in streams:
                s.cancel()
            held.set()
            assert kv.Range(pb.RangeRequest(key=b"x"), timeout=5).header.revision >= 1
    finally:
        server.stop()


def test_a_journal_that_fails_while_starting_is_one_line(tmp_path):
    """A journal error the start did not turn into a refusal of its own (e.g. JetStream that stops
    answering a request the start makes, for 30 s) ends the start with one line and exit 1, not a
    traceback."""
    said = "JetStream did not answer read stream for 30 s: TimeoutError()"
    code = ("import sys, shim.cli as cli\n"
            "from journal.errors import JournalFailed\n"
            "async def serve(config, ready):\n"
            f"    raise JournalFailed({said!r})\n"
            "cli.serve = serve\n"
            "sys.exit(cli.main(sys.argv[1:]))\n")
    r = subprocess.run([sys.executable, "-c", code, "--data-dir", str(tmp_path / "d"), "--state-dir",
                        str(tmp_path / "s"), *client_url_flags(f"http://127.0.0.1:{free_port()}")],
                       cwd=REPO, capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [f"shardetcd: the journal failed while starting: {said}"]
