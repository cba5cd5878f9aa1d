"""Bad snapshots are refused before anything is written (issue 15.2).

A snapshot saved from a real shardetcd by etcd 3.5.1's ``etcdctl snapshot
save`` is cut short at any offset or has any byte flipped: the restore is
refused with a one-line message and leaves no data dir (nor a half-built one)
behind.  Only one cut gives a valid file: dropping exactly the 32-byte hash
leaves a bare bbolt database, which is what a copy of ``member/snap/db`` is.
The CLI says it in one line with exit code 2.
"""
from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import grpc
import pytest
from hypothesis import given, settings, strategies as st

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from shards.errors import SnapshotError
from shards.layout import load_layout
from shards.snapshot import restore_snapshot
from tests.integration.snapkit import ETCDCTL35, ROOT_PW, etcdctl_save
from tests.shardetcd_fixture import start_shardetcd

REPO = Path(__file__).resolve().parents[2]
REASONS = ("the SHA-256 at its end does not match", "is not an etcd snapshot", "was cut short or is damaged",
           "is empty, not an etcd snapshot")


class Saved(bytes):
    def __repr__(self) -> str:  # what Hypothesis prints for a failing example
        return f"<snapshot of {len(self)} bytes>"


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> bytes:
    tmp = tmp_path_factory.mktemp("saved")
    server = start_shardetcd(tmp)
    try:
        with grpc.insecure_channel(server.endpoint) as ch:
            kv, auth = pbg.KVStub(ch), pbg.AuthStub(ch)
            lid = pbg.LeaseStub(ch).LeaseGrant(pb.LeaseGrantRequest(TTL=600)).ID
            for i in range(150):
                kv.Put(pb.PutRequest(key=b"/registry/pods/ns/p%d" % (i % 60), value=b"v" * (i * 7), lease=lid))
                kv.Put(pb.PutRequest(key=b"/other/%d" % i, value=b"x" * 40))
            auth.UserAdd(pb.AuthUserAddRequest(name="root", password=ROOT_PW))
            auth.UserGrantRole(pb.AuthUserGrantRoleRequest(user="root", role="root"))
            auth.AuthEnable(pb.AuthEnableRequest())
        etcdctl_save(ETCDCTL35, server.endpoint, tmp / "snap.db")
    finally:
        server.stop()
    data = Saved((tmp / "snap.db").read_bytes())
    assert len(data) % 512 == 32 and len(data) > 5 * 4096  # pages, branch pages, the hash
    return data


def refused(data: bytes) -> str:
    """Restore ``data``: the message it is refused with; checks nothing was written."""
    with tempfile.TemporaryDirectory() as tmp:
        snap = Path(tmp) / "snap.db"
        snap.write_bytes(data)
        with pytest.raises(SnapshotError) as err:
            restore_snapshot(snap, Path(tmp) / "restored", load_layout(None))
        assert [p.name for p in Path(tmp).iterdir()] == ["snap.db"]  # no data dir, no .restored.restoring-*
    message = str(err.value)
    assert "\n" not in message and message.startswith(str(snap)) and any(r in message for r in REASONS), message
    return message


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_a_cut_or_flipped_snapshot_is_refused(saved, data):
    size = len(saved)
    if data.draw(st.booleans(), label="cut"):
        cut = data.draw(st.integers(0, size - 1), label="length")
        damaged = saved[:cut]
        if cut == size - 32:
            return  # the database without its hash: a valid member/snap/db (restored in the next test)
    else:
        at = data.draw(st.integers(0, size - 1), label="offset")
        damaged = saved[:at] + bytes([saved[at] ^ data.draw(st.integers(1, 255), label="xor")]) + saved[at + 1 :]
    refused(damaged)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_a_damaged_bare_database_is_refused_or_read_never_a_crash(saved, data):
    """A copy of member/snap/db has no hash, and bbolt pages no checksums: a
    flipped byte inside a value cannot be seen (etcd would read it too), but
    damage to the structure is refused in one line, never a traceback."""
    bare = saved[:-32]
    at = data.draw(st.integers(0, len(bare) - 1), label="offset")
    damaged = bare[:at] + bytes([bare[at] ^ data.draw(st.integers(1, 255), label="xor")]) + bare[at + 1 :]
    with tempfile.TemporaryDirectory() as tmp:
        snap = Path(tmp) / "db"
        snap.write_bytes(damaged)
        try:
            restore_snapshot(snap, Path(tmp) / "restored", load_layout(None))
        except SnapshotError as exc:
            assert "\n" not in str(exc) and str(exc).startswith(str(snap)), str(exc)
            assert [p.name for p in Path(tmp).iterdir()] == ["db"]


@pytest.mark.parametrize("damage, reason", [
    (lambda d: d[:0], "is empty"),
    (lambda d: d[:20], "not a bbolt file"),
    (lambda d: d[:4096], "truncated"),  # meta page 0 alone
    (lambda d: d[:-33], "truncated"),  # one byte short of its pages
    (lambda d: d[:-31], "cut short"),  # its pages and one byte of the hash
    (lambda d: d[:-4096 - 32] + d[-32:], "truncated"),  # one page lost, hash kept
    (lambda d: d[:16] + b"\xff" + d[17:], "SHA-256"),  # meta 0 damaged: meta 1 is read, the hash says no
    (lambda d: d[:-1] + bytes([d[-1] ^ 1]), "SHA-256"),
    (lambda d: bytes(len(d)), "not a bbolt file"),
])
def test_damage_at_telling_places(saved, damage, reason):
    assert reason in refused(damage(saved))


def test_the_database_without_its_hash_is_a_valid_bare_database(saved, tmp_path):
    (tmp_path / "db").write_bytes(saved[:-32])
    got = restore_snapshot(tmp_path / "db", tmp_path / "restored", load_layout(None))
    assert not got["hashed"] and got["keys"] == 210 and got["users"] == 1


def _cli(snap: Path, target: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shim", "snapshot", "restore", str(snap), "--data-dir", str(target)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)


def test_the_cli_refuses_in_one_line_with_exit_code_2(saved, tmp_path):
    cases = {
        "text.db": (b"hello, not a database\n" * 100, "is not an etcd snapshot: not a bbolt file"),
        "cut.db": (saved[: len(saved) // 2], "is not an etcd snapshot: truncated"),
        "flipped.db": (saved[:9000] + bytes([saved[9000] ^ 0x40]) + saved[9001:], "the SHA-256 at its end does not match"),
    }
    tar_path = tmp_path / "old.tar"
    with tarfile.open(tar_path, "w") as tar:
        tar.add(__file__, arcname="meta.json")
    cases["old.tar"] = (tar_path.read_bytes() + bytes(32), "shardetcd's former format")
    for name, (content, says) in cases.items():
        snap = tmp_path / name
        snap.write_bytes(content)
        target = tmp_path / f"restored-{name}"
        r = _cli(snap, target)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and says in lines[0] and not r.stdout, (name, r.stderr)
        assert not target.exists() and not list(tmp_path.glob(f".restored-{name}.restoring-*"))
