"""Debian's etcdctl (3.4, ETCDCTL_API=3) against shardetcd.

Most scenarios run the same etcdctl commands against a real etcd 3.5.1 too and
require the same output (JSON output with the member identity — cluster_id,
member_id, raft_term — taken out); some output is also checked field by field.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess

import grpc
import pytest

from proto import rpc_pb2 as pb, rpc_pb2_grpc

pytestmark = pytest.mark.timeout(120)

ETCDCTL = "/usr/bin/etcdctl"

# Keys over every shard of the default layout, plus plain keys.
SEED = [
    ("/registry/pods/default/a", "pod-a"),
    ("/registry/pods/default/b", "pod-b"),
    ("/registry/pods/kube-system/c", "pod-c"),
    ("/registry/leases/kube-node-lease/n1", "lease-1"),
    ("/registry/events/default/e1", "event-1"),
    ("/registry/minions/node1", "node-1"),
    ("/registry/configmaps/default/cm1", "cm-1"),
    ("/registry/apps/deployments/default/d1", "deploy-1"),
    ("alpha", "1"),
    ("beta", "2"),
    ("gamma", "3"),
]


@pytest.fixture(scope="module")
def etcdctl_bin() -> str:
    path = shutil.which("etcdctl") if not os.path.exists(ETCDCTL) else ETCDCTL
    if path is None:
        pytest.fail("etcdctl not installed (Debian package etcd-client)")
    return path


def ctl(binary: str, endpoint: str, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCDCTL")}
    env["ETCDCTL_API"] = "3"
    proc = subprocess.run(
        [binary, f"--endpoints={endpoint}", "--command-timeout=10s", "--dial-timeout=5s", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    if check:
        assert proc.returncode == 0, f"etcdctl {' '.join(args)} failed ({proc.returncode}): {proc.stderr}"
    return proc


def _strip_identity(obj):
    if isinstance(obj, dict):
        return {
            k: _strip_identity(v)
            for k, v in obj.items()
            if k not in ("cluster_id", "member_id", "raft_term")
        }
    if isinstance(obj, list):
        return [_strip_identity(v) for v in obj]
    return obj


def comparable(out: str) -> object:
    """JSON output without the member identity; other output as is."""
    try:
        return _strip_identity(json.loads(out))
    except ValueError:
        return out


def seed_both(binary, *endpoints):
    for ep in endpoints:
        for k, v in SEED:
            assert ctl(binary, ep, "put", k, v).stdout == "OK\n"


def b64(s: str | bytes) -> str:
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


GET_COMMANDS = [
    ("get", "/registry/pods/default/a"),
    ("get", "/registry/", "--prefix"),
    ("get", "/registry/", "--prefix", "--keys-only"),
    ("get", "/registry/", "--prefix", "--print-value-only"),
    ("get", "/registry/", "--prefix", "--limit=3"),
    ("get", "/registry/", "--prefix", "--limit=3", "-w", "json"),
    ("get", "/registry/", "--prefix", "--limit=1", "--keys-only", "-w", "json"),
    ("get", "/registry/pods/", "--prefix", "--rev=3"),
    ("get", "/registry/pods/", "--prefix", "--rev=3", "-w", "json"),
    ("get", "/registry/leases/", "--from-key"),
    ("get", "/registry/leases/", "--from-key", "--keys-only", "--limit=4"),
    ("get", "", "--from-key", "-w", "json"),
    ("get", "/registry/", "--prefix", "--sort-by=MODIFY", "--order=DESCEND"),
    ("get", "/registry/", "--prefix", "--sort-by=CREATE", "--order=ASCEND", "--limit=2", "-w", "json"),
    ("get", "/registry/", "--prefix", "--sort-by=VALUE", "--order=DESCEND", "--print-value-only"),
    ("get", "/registry/", "/registry/minions/"),  # [key, range_end)
    ("get", "nope"),
    ("get", "nope", "-w", "json"),
    ("get", "alpha", "-w", "fields"),
]


def test_get_variants_match_etcd(etcdctl_bin, real_etcd, shardetcd_or_follower):
    seed_both(etcdctl_bin, real_etcd.endpoint, shardetcd_or_follower.endpoint)
    for args in GET_COMMANDS:
        want = ctl(etcdctl_bin, real_etcd.endpoint, *args).stdout
        got = ctl(etcdctl_bin, shardetcd_or_follower.endpoint, *args).stdout
        if "fields" in args:  # "fields" prints the member identity too
            want = "\n".join(l for l in want.splitlines() if not l.startswith(('"ClusterID"', '"MemberID"', '"RaftTerm"')))
            got = "\n".join(l for l in got.splitlines() if not l.startswith(('"ClusterID"', '"MemberID"', '"RaftTerm"')))
        assert comparable(got) == comparable(want), f"etcdctl {' '.join(args)}\netcd:\n{want}\nshardetcd:\n{got}"


def test_get_output_fields(etcdctl_bin, shardetcd):
    ep = shardetcd.endpoint
    seed_both(etcdctl_bin, ep)  # revisions 2..12
    ctl(etcdctl_bin, ep, "put", "/registry/pods/default/a", "pod-a2")  # rev 13, version 2

    out = ctl(etcdctl_bin, ep, "get", "/registry/pods/", "--prefix").stdout
    assert out.splitlines() == [
        "/registry/pods/default/a", "pod-a2",
        "/registry/pods/default/b", "pod-b",
        "/registry/pods/kube-system/c", "pod-c",
    ]
    assert ctl(etcdctl_bin, ep, "get", "/registry/pods/", "--prefix", "--keys-only").stdout.split() == [
        "/registry/pods/default/a", "/registry/pods/default/b", "/registry/pods/kube-system/c",
    ]
    assert ctl(etcdctl_bin, ep, "get", "/registry/pods/", "--prefix", "--print-value-only").stdout.split() == [
        "pod-a2", "pod-b", "pod-c",
    ]
    assert ctl(etcdctl_bin, ep, "get", "/registry/pods/default/a", "--rev=2", "--print-value-only").stdout == "pod-a\n"
    assert ctl(etcdctl_bin, ep, "get", "alpha", "--from-key", "--keys-only").stdout.split() == ["alpha", "beta", "gamma"]

    doc = json.loads(ctl(etcdctl_bin, ep, "get", "/registry/", "--prefix", "--limit=2", "-w", "json").stdout)
    assert doc["header"]["revision"] == 13
    assert doc["count"] == 8 and doc["more"] is True
    assert [kv["key"] for kv in doc["kvs"]] == [b64("/registry/apps/deployments/default/d1"), b64("/registry/configmaps/default/cm1")]
    a = json.loads(ctl(etcdctl_bin, ep, "get", "/registry/pods/default/a", "-w", "json").stdout)["kvs"][0]
    assert a == {
        "key": b64("/registry/pods/default/a"),
        "create_revision": 2,
        "mod_revision": 13,
        "version": 2,
        "value": b64("pod-a2"),
    }
    empty = json.loads(ctl(etcdctl_bin, ep, "get", "nope", "-w", "json").stdout)
    assert "kvs" not in empty and "count" not in empty and empty["header"]["revision"] == 13


def test_delete_variants_match_etcd(etcdctl_bin, real_etcd, shardetcd_or_follower):
    seed_both(etcdctl_bin, real_etcd.endpoint, shardetcd_or_follower.endpoint)
    cmds = [
        ("del", "/registry/pods/", "--prefix"),
        ("del", "/registry/pods/", "--prefix"),  # nothing left: 0
        ("del", "alpha", "--prev-kv"),
        ("del", "beta", "--from-key", "--prev-kv", "-w", "json"),
        ("del", "/registry/events/default/e1", "-w", "json"),
        ("get", "", "--from-key", "--keys-only"),
        ("del", "", "--from-key"),
        ("get", "", "--from-key", "-w", "json"),
    ]
    for args in cmds:
        want = ctl(etcdctl_bin, real_etcd.endpoint, *args).stdout
        got = ctl(etcdctl_bin, shardetcd_or_follower.endpoint, *args).stdout
        assert comparable(got) == comparable(want), f"etcdctl {' '.join(args)}\netcd:\n{want}\nshardetcd:\n{got}"
    out = ctl(etcdctl_bin, shardetcd_or_follower.endpoint, "get", "", "--from-key", "-w", "json").stdout
    assert "count" not in json.loads(out) and "kvs" not in json.loads(out)


TXN_SUCCESS = """\
value("/registry/pods/default/a") = "pod-a"
mod("/registry/leases/kube-node-lease/n1") > "0"

put /registry/pods/default/a "pod-a-2"
del /registry/events/default/e1
get /registry/minions/node1

put /registry/pods/default/a "should-not-happen"

"""

TXN_FAILURE = """\
version("/registry/pods/default/a") = "1"
create("/registry/configmaps/default/cm1") > "0"

put /registry/pods/default/a "should-not-happen"

put /registry/configmaps/default/cm1 "cm-from-failure"
put fresh "new-key"
get /registry/pods/default/a

"""


def test_txn_stdin_both_branches(etcdctl_bin, real_etcd, shardetcd_or_follower):
    seed_both(etcdctl_bin, real_etcd.endpoint, shardetcd_or_follower.endpoint)
    ep = shardetcd_or_follower.endpoint

    first = ctl(etcdctl_bin, ep, "txn", stdin=TXN_SUCCESS).stdout
    assert first.splitlines() == ["SUCCESS", "", "OK", "", "1", "", "/registry/minions/node1", "node-1"]
    assert ctl(etcdctl_bin, ep, "get", "/registry/pods/default/a", "--print-value-only").stdout == "pod-a-2\n"
    assert ctl(etcdctl_bin, ep, "get", "/registry/events/default/e1").stdout == ""

    second = ctl(etcdctl_bin, ep, "txn", stdin=TXN_FAILURE).stdout  # version of a is 2 now
    assert second.splitlines() == ["FAILURE", "", "OK", "", "OK", "", "/registry/pods/default/a", "pod-a-2"]
    assert ctl(etcdctl_bin, ep, "get", "/registry/configmaps/default/cm1", "--print-value-only").stdout == "cm-from-failure\n"
    assert ctl(etcdctl_bin, ep, "get", "fresh", "--print-value-only").stdout == "new-key\n"

    # the same two txns on etcd, and their JSON form, must agree
    assert ctl(etcdctl_bin, real_etcd.endpoint, "txn", stdin=TXN_SUCCESS).stdout == first
    assert ctl(etcdctl_bin, real_etcd.endpoint, "txn", stdin=TXN_FAILURE).stdout == second
    for stdin in (TXN_SUCCESS, TXN_FAILURE):
        want = ctl(etcdctl_bin, real_etcd.endpoint, "txn", "-w", "json", stdin=stdin).stdout
        got = ctl(etcdctl_bin, ep, "txn", "-w", "json", stdin=stdin).stdout
        assert comparable(got) == comparable(want), f"etcd:\n{want}\nshardetcd:\n{got}"


def test_compaction(etcdctl_bin, real_etcd, shardetcd_or_follower):
    seed_both(etcdctl_bin, real_etcd.endpoint, shardetcd_or_follower.endpoint)  # revisions 2..12
    for ep in (real_etcd.endpoint, shardetcd_or_follower.endpoint):
        ctl(etcdctl_bin, ep, "put", "alpha", "1b")  # 13
        assert ctl(etcdctl_bin, ep, "compaction", "10").stdout == "compacted revision 10\n"
        bad = ctl(etcdctl_bin, ep, "get", "alpha", "--rev=9", check=False)
        assert bad.returncode != 0
        assert "Error: etcdserver: mvcc: required revision has been compacted" in bad.stderr
        assert ctl(etcdctl_bin, ep, "get", "alpha", "--rev=10", "--print-value-only").stdout == "1\n"
        assert ctl(etcdctl_bin, ep, "get", "alpha", "--print-value-only").stdout == "1b\n"
        again = ctl(etcdctl_bin, ep, "compaction", "10", check=False)
        assert again.returncode != 0 and "required revision has been compacted" in again.stderr
        future = ctl(etcdctl_bin, ep, "compaction", "100", check=False)
        assert future.returncode != 0 and "required revision is a future revision" in future.stderr
        assert ctl(etcdctl_bin, ep, "compaction", "--physical", "12").stdout == "compacted revision 12\n"
        assert ctl(etcdctl_bin, ep, "get", "/registry/", "--prefix", "--keys-only").stdout.split()[0] == "/registry/apps/deployments/default/d1"


def test_endpoint_status(etcdctl_bin, shardetcd):
    ep = shardetcd.endpoint
    seed_both(etcdctl_bin, ep)
    table = ctl(etcdctl_bin, ep, "endpoint", "status").stdout.strip()
    cells = [c.strip() for c in table.split(",")]
    assert cells[0] == ep
    assert cells[2].startswith("3.5."), cells
    assert cells[4] == "true"  # is leader
    assert cells[5] == "false"  # is learner
    status = json.loads(ctl(etcdctl_bin, ep, "endpoint", "status", "-w", "json").stdout)[0]
    assert status["Endpoint"] == ep
    s = status["Status"]
    assert s["header"]["revision"] == 1 + len(SEED)
    assert s["leader"] == s["header"]["member_id"] != 0
    assert int(cells[1], 16) == s["header"]["member_id"]
    assert s["version"].startswith("3.5.")
    assert s["dbSize"] > 0
    assert s["raftIndex"] >= s["header"]["revision"] - 1
    assert s["raftAppliedIndex"] == s["raftIndex"]
    health = ctl(etcdctl_bin, ep, "endpoint", "health", check=False)
    assert health.returncode == 0 and "is healthy" in health.stderr + health.stdout


def test_member_list(etcdctl_bin, real_etcd, shardetcd):
    ep = shardetcd.endpoint
    row = ctl(etcdctl_bin, ep, "member", "list").stdout.strip()
    cells = [c.strip() for c in row.split(",")]
    assert cells[1] == "started"
    assert cells[4] == f"http://{ep}"
    assert cells[5] == "false"
    doc = json.loads(ctl(etcdctl_bin, ep, "member", "list", "-w", "json").stdout)
    assert len(doc["members"]) == 1
    me = doc["members"][0]
    assert me["ID"] == doc["header"]["member_id"] == int(cells[0], 16)
    assert me["clientURLs"] == [f"http://{ep}"]
    # etcd's Cluster service fills only cluster_id, member_id and raft_term in
    # its header: no revision.
    want = json.loads(ctl(etcdctl_bin, real_etcd.endpoint, "member", "list", "-w", "json").stdout)
    assert set(doc["header"]) == set(want["header"]), f"etcd header {want['header']}, shardetcd header {doc['header']}"


def test_binary_key(etcdctl_bin, real_etcd, shardetcd_or_follower):
    """etcd's benchmark tool writes keys of eight zero bytes; etcdctl cannot type
    them, so they are written over gRPC and read back with etcdctl (base64 JSON)."""
    key = b"\x00" * 8
    for ep in (real_etcd.endpoint, shardetcd_or_follower.endpoint):
        with grpc.insecure_channel(ep) as ch:
            kv = rpc_pb2_grpc.KVStub(ch)
            kv.Put(pb.PutRequest(key=key, value=b"\x00\x01\xfe\xff"), timeout=10)
            kv.Put(pb.PutRequest(key=b"\x00" * 7 + b"\x01", value=b"next"), timeout=10)
            kv.Put(pb.PutRequest(key=b"\x00", value=b"short"), timeout=10)
            got = kv.Range(pb.RangeRequest(key=key), timeout=10)
            assert [(x.key, x.value) for x in got.kvs] == [(key, b"\x00\x01\xfe\xff")]
        ctl(etcdctl_bin, ep, "put", "plain", "p")
    want = ctl(etcdctl_bin, real_etcd.endpoint, "get", "", "--from-key", "-w", "json").stdout
    got = ctl(etcdctl_bin, shardetcd_or_follower.endpoint, "get", "", "--from-key", "-w", "json").stdout
    assert comparable(got) == comparable(want)
    doc = json.loads(got)
    assert [base64.b64decode(kv["key"]) for kv in doc["kvs"]] == [b"\x00", key, b"\x00" * 7 + b"\x01", b"plain"]
    assert base64.b64decode(doc["kvs"][1]["value"]) == b"\x00\x01\xfe\xff"
    # deleting "from the empty key" removes the binary keys too
    assert ctl(etcdctl_bin, shardetcd_or_follower.endpoint, "del", "", "--from-key").stdout == "4\n"


def test_check_datascale(etcdctl_bin, tmp_path):
    """`etcdctl check datascale` writes 10,000 1 KiB keys with 50 clients and
    reads the server's process_resident_memory_bytes over HTTP at the first
    endpoint. etcd serves /metrics on its client URL; shardetcd on
    --listen-metrics-urls, so that URL goes first and the gRPC client
    balances the puts to the client URL (the README says so)."""
    from tests.etcd_fixture import free_port
    from tests.shardetcd_fixture import start_shardetcd

    metrics = f"http://127.0.0.1:{free_port()}"
    server = start_shardetcd(tmp_path, extra_args=("--listen-metrics-urls", metrics))
    try:
        p = ctl(etcdctl_bin, f"{metrics},http://{server.endpoint}", "check", "datascale", "--load=s", "--auto-compact")
        assert "PASS: Approximate system memory used" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
        with grpc.insecure_channel(server.endpoint) as ch:
            r = rpc_pb2_grpc.KVStub(ch).Range(pb.RangeRequest(key=b"\x00", range_end=b"\x00", count_only=True))
        assert r.count == 0 and r.header.revision == 10_002  # cleaned up after itself: 10,000 puts and one delete
    finally:
        server.stop()
