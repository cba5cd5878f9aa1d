"""The aetcd Python client against shardetcd (and the same scenario against etcd 3.5.1).

aetcd bundles its own generated etcd protobufs under the same protobuf names
as our proto/ package, so it runs in a subprocess (aetcd_scenario.py) that
prints its results as JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

SCRIPT = Path(__file__).with_name("aetcd_scenario.py")


def run_scenario(endpoint: str) -> dict:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), endpoint], capture_output=True, text=True, timeout=90
    )
    assert proc.returncode == 0, f"aetcd scenario failed against {endpoint}:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout)


def kv(key, value, create, mod, version):
    return {"key": key, "value": value, "create_revision": create, "mod_revision": mod, "version": version, "lease": 0}


def test_aetcd_scenario(shardetcd, real_etcd):
    got = run_scenario(shardetcd.endpoint)

    # put / get
    assert got["put1_rev"] == 2
    assert got["put2"] == {"rev": 3, "prev_kv": kv("/registry/pods/default/a", "v1", 2, 2, 1)}
    assert got["get"] == {"rev": 11, **kv("/registry/pods/default/a", "v2", 2, 3, 2)}
    assert got["get_missing"] is None
    assert got["get_binary"] == kv("\x00" * 8, "\x00\xff", 11, 11, 1)
    # get_prefix / get_range / get_all
    assert got["get_prefix"] == {
        "count": 3,
        "more": False,
        "kvs": [
            kv("/registry/pods/default/a", "v2", 2, 3, 2),
            kv("/registry/pods/default/b", "pb", 4, 4, 1),
            kv("/registry/pods/kube-system/c", "pc", 5, 5, 1),
        ],
    }
    registry = [
        "/registry/configmaps/default/cm1",
        "/registry/events/default/e1",
        "/registry/leases/kube-node-lease/n1",
        "/registry/minions/node1",
        "/registry/pods/default/a",
        "/registry/pods/default/b",
        "/registry/pods/kube-system/c",
    ]
    assert got["get_prefix_desc_keys"] == [[k, ""] for k in reversed(registry)]
    assert got["get_prefix_by_mod"] == [
        "/registry/configmaps/default/cm1",  # mod 9
        "/registry/minions/node1",  # 8
        "/registry/events/default/e1",  # 7
        "/registry/leases/kube-node-lease/n1",  # 6
        "/registry/pods/kube-system/c",  # 5
        "/registry/pods/default/b",  # 4
        "/registry/pods/default/a",  # 3
    ]
    assert got["get_range"] == ["/registry/leases/kube-node-lease/n1", "/registry/minions/node1"]
    assert got["get_all"] == ["\x00" * 8, *registry, "plain"]
    # delete
    assert got["delete"] == {"deleted": 1, "prev_kv": kv("/registry/events/default/e1", "event", 7, 7, 1), "rev": 12}
    assert got["delete_missing"] is None
    assert got["delete_prefix"] == {"deleted": 1, "prev_kvs": [kv("/registry/configmaps/default/cm1", "cm", 9, 9, 1)]}
    # transactions
    ts = got["txn_success"]
    assert ts["succeeded"] is True
    assert ts["responses"][0] == {"put": {"revision": 14, "prev_kv": kv("/registry/pods/default/a", "v2", 2, 3, 2)}}
    assert [x["key"] for x in ts["responses"][1]["range"]] == registry[4:]
    assert ts["responses"][1]["range"][0] == kv("/registry/pods/default/a", "v3", 2, 14, 3)
    assert ts["responses"][2] == {"delete": {"deleted": 1, "prev_kvs": [kv("/registry/minions/node1", "node", 8, 8, 1)]}}
    assert ts["responses"][3] == {"txn": {"succeeded": True, "n": 1}}
    tf = got["txn_failure"]
    assert tf["succeeded"] is False
    assert tf["responses"] == [
        {"put": {"revision": 15, "prev_kv": kv("/registry/leases/kube-node-lease/n1", "lease", 6, 6, 1)}},
        {"range": [kv("/registry/leases/kube-node-lease/n1", "renewed", 6, 15, 2)]},
        {"delete": {"deleted": 3, "prev_kvs": []}},
    ]
    assert got["txn_dup_key"] == {"error": "InvalidArgumentError", "message": "etcdserver: duplicate key given in txn request"}
    assert got["after_txns"] == {"a": True, "plain": "p2"}
    # watch history from revision 2, with prev_kv on updates and deletes
    hist = got["watch_history"]
    assert [(e["kv"]["key"], e["kv"]["mod_revision"]) for e in hist[:2]] == [
        ("/registry/pods/default/a", 2), ("/registry/pods/default/a", 3)]
    assert hist[0]["prev"] is None and hist[1]["prev"] == kv("/registry/pods/default/a", "v1", 2, 2, 1)
    assert len(hist) == 7 and [e["kv"]["mod_revision"] for e in hist] == sorted(e["kv"]["mod_revision"] for e in hist)
    # compaction
    assert got["compacted_at"] == 13
    assert got["compact_again"]["message"] == "etcdserver: mvcc: required revision has been compacted"
    assert got["compact_future"]["message"] == "etcdserver: mvcc: required revision is a future revision"
    assert got["after_compact_get"] == "renewed"
    assert got["final_rev"] == 15
    # maintenance / cluster
    assert got["status"] == {"version_35": True, "raft_term": True, "leader": True}
    assert got["members"] == [{"name": True, "client_urls": [f"http://{shardetcd.endpoint}"]}]

    # and the very same answers from etcd 3.5.1 (but for its own client URL)
    want = run_scenario(real_etcd.endpoint)
    for doc in (want, got):
        doc.pop("members")
    assert got == want
