"""`shardetcd migrate` (issue 15.3): a live etcd 3.5.1's data into a new shardetcd
data dir over the Maintenance API, with every revision, the compaction, leases
and auth; the refusals are one line; a kube-apiserver that wrote to etcd sees the
same objects and resourceVersions on shardetcd after the migration."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from tests.etcd_fixture import free_port, start_etcd
from tests.integration.snapkit import ETCD35, load, token, view, watch_events
from tests.shardetcd_fixture import ShardetcdProcess

REPO = Path(__file__).resolve().parents[2]


def migrate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shim", "migrate", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


def shardetcd_on(data_dir: Path, tmp_path: Path) -> ShardetcdProcess:
    return ShardetcdProcess(data_dir=data_dir, state_dir=tmp_path / "state", port=free_port(),
                            log_path=tmp_path / "shardetcd.log").start()


@pytest.mark.parametrize("journal", ["local", "jetstream"])
def test_migrate_a_live_etcd_keeps_every_revision_lease_and_user(request, tmp_path, journal):
    """Into the local journal, or (--journal-url) into JetStream, the checkpoints in its buckets:
    the server on it serves the same view and history as the etcd did."""
    nats = request.getfixturevalue("nats") if journal == "jetstream" else None
    to_nats = ("--journal-url", nats.urls, "--journal-prefix", "migrated") if nats else ()
    etcd = start_etcd(tmp_path / "etcd", binary=ETCD35)
    try:
        with grpc.insecure_channel(etcd.endpoint) as ch:
            loaded = load(ch)  # leaves auth enabled: migrate logs in as root
            before = view(ch, loaded)
            events = watch_events(ch, loaded.compact + 1, loaded.latest)
        data_dir = tmp_path / "migrated" / "data"
        r = migrate("--from", etcd.client_url, "--data-dir", str(data_dir), "--user", "root:rootpw", *to_nats)
        assert r.returncode == 0, r.stderr
        assert f"migrated {etcd.endpoint} at revision {loaded.latest} into {data_dir}" in r.stdout
        assert f"start it with: shardetcd --data-dir {data_dir}{' ' if to_nats else ''}{' '.join(to_nats)}" \
            in r.stdout, r.stdout
        assert "SHA-256 checked" in r.stdout and not list(data_dir.parent.glob(".data.migrate-*"))
        again = migrate("--from", etcd.client_url, "--data-dir", str(data_dir), "--user", "root:rootpw")
        assert again.returncode == 2 and again.stderr.count("\n") == 1 and "is not empty" in again.stderr
    finally:
        etcd.stop()
    if nats:
        from tests.nats_fixture import shardetcd_on as on_nats

        server = on_nats(nats, data_dir.parent, "--journal-prefix", "migrated").start()
    else:
        server = shardetcd_on(data_dir, tmp_path)
    try:
        with grpc.insecure_channel(server.endpoint) as ch:
            assert view(ch, loaded) == before
            assert watch_events(ch, loaded.compact + 1, loaded.latest) == events
    finally:
        server.stop()


def test_migrate_refusals_are_one_line(tmp_path):
    unreachable = migrate("--from", f"http://127.0.0.1:{free_port()}", "--data-dir", str(tmp_path / "d"),
                          "--dial-timeout", "1")
    assert unreachable.returncode == 2 and unreachable.stderr.count("\n") == 1
    assert unreachable.stderr.startswith("shardetcd migrate: cannot reach etcd at http://127.0.0.1:")
    assert not (tmp_path / "d").exists()
    etcd = start_etcd(tmp_path / "etcd", binary=ETCD35)
    try:
        with grpc.insecure_channel(etcd.endpoint) as ch:
            load(ch)
            token(ch)
        denied = migrate("--from", etcd.client_url, "--data-dir", str(tmp_path / "d"), "--user", "root:wrong")
        assert denied.returncode == 2 and denied.stderr.count("\n") == 1
        assert "authentication as root failed: etcdserver: authentication failed" in denied.stderr
        no_user = migrate("--from", etcd.client_url, "--data-dir", str(tmp_path / "d"))
        assert no_user.returncode == 2 and no_user.stderr.count("\n") == 1
        assert "snapshot from" in no_user.stderr and "user name is empty" in no_user.stderr
        assert not (tmp_path / "d").exists()
    finally:
        etcd.stop()


def test_kube_apiserver_sees_the_same_objects_and_resource_versions_after_migrating(tmp_path):
    """The cut-over of the README: kube-apiserver writes to etcd 3.5.1 and is
    stopped; `shardetcd migrate`; kube-apiserver started against shardetcd
    serves the same objects with the same resourceVersions, a watch from an old
    resourceVersion replays the writes made on etcd, and writes go on."""
    from tests.kube_fixture import require_kube_apiserver, start_kube_apiserver

    require_kube_apiserver()
    ns, cms = "moved", "/api/v1/namespaces/moved/configmaps"
    etcd = start_etcd(tmp_path / "etcd", binary=ETCD35)
    try:
        api = start_kube_apiserver(tmp_path / "on-etcd", [etcd.client_url])
        try:
            kube = api.client
            kube.call("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
            first = kube.call("POST", cms, {"metadata": {"name": "a"}, "data": {"v": "1"}})
            for i in range(5):
                kube.call("POST", cms, {"metadata": {"name": f"c{i}"}, "data": {"v": str(i)}})
            updated = kube.call("PUT", f"{cms}/a", {**first, "data": {"v": "2"}})
            kube.call("DELETE", f"{cms}/c0")
            before = {o["metadata"]["name"]: (o["metadata"]["uid"], o["metadata"]["resourceVersion"], o["data"])
                      for o in kube.call("GET", cms)["items"]}
        finally:
            api.stop()  # the writers stop before the snapshot
        r = migrate("--from", etcd.client_url, "--data-dir", str(tmp_path / "migrated"))
        assert r.returncode == 0, r.stderr
    finally:
        etcd.stop()
    server = shardetcd_on(tmp_path / "migrated", tmp_path)
    try:
        # configmaps bypass the watch cache: the watch below reads the store's history
        api = start_kube_apiserver(tmp_path / "on-shardetcd", [server.client_url],
                                   extra_args=["--watch-cache-sizes=configmaps#0"])
        try:
            kube = api.client
            after = {o["metadata"]["name"]: (o["metadata"]["uid"], o["metadata"]["resourceVersion"], o["data"])
                     for o in kube.call("GET", cms)["items"]}
            assert after == before and set(after) == {"a", "c1", "c2", "c3", "c4"}
            with kube.watch(cms, first["metadata"]["resourceVersion"]) as watch:  # history from etcd's revisions
                seen = [watch.next_event(timeout=30) for _ in range(6)]
            assert [(e["type"], e["object"]["metadata"]["name"]) for e in seen] == \
                [("ADDED", f"c{i}") for i in range(5)] + [("MODIFIED", "a")]
            assert seen[-1]["object"]["metadata"]["resourceVersion"] == updated["metadata"]["resourceVersion"]
            again = kube.call("PUT", f"{cms}/a", {**updated, "data": {"v": "3"}})
            assert int(again["metadata"]["resourceVersion"]) > int(updated["metadata"]["resourceVersion"])
            assert api.bad_log_lines() == []
        finally:
            api.stop()
    finally:
        server.stop()


def test_kube_apiserver_sees_the_same_objects_on_partitions_after_migrating(tmp_path):
    """Migrating into a `shardetcd cluster` layout (leases, events, the rest): each partition gets
    its resources' keys at etcd's revision, and kube-apiserver pointed at the cluster's
    --etcd-servers and --etcd-servers-overrides serves the configmaps, the node Lease and the Event
    it wrote to etcd with their resourceVersions, and writes on to each partition."""
    from tests.integration.test_cluster import Cluster
    from tests.kube_fixture import require_kube_apiserver, start_kube_apiserver

    require_kube_apiserver()
    ns, cms = "moved", "/api/v1/namespaces/moved/configmaps"
    lease_path = "/apis/coordination.k8s.io/v1/namespaces/moved/leases"
    event_path = "/api/v1/namespaces/moved/events"
    etcd = start_etcd(tmp_path / "etcd", binary=ETCD35)
    cluster = Cluster(tmp_path)
    try:
        api = start_kube_apiserver(tmp_path / "on-etcd", [etcd.client_url])
        try:
            kube = api.client
            kube.call("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
            for i in range(3):
                kube.call("POST", cms, {"metadata": {"name": f"c{i}"}, "data": {"v": str(i)}})
            kube.call("POST", lease_path, {"metadata": {"name": "node-1"}, "spec": {"holderIdentity": "node-1"}})
            kube.call("POST", event_path, {"metadata": {"name": "e1"}, "involvedObject": {"kind": "ConfigMap",
                      "namespace": ns, "name": "c0"}, "reason": "Moved", "message": "before"})

            def seen(k):
                return {path: sorted((o["metadata"]["name"], o["metadata"]["resourceVersion"])
                                     for o in k.call("GET", path)["items"]) for path in (cms, lease_path, event_path)}

            before = seen(kube)
        finally:
            api.stop()
        r = migrate("--from", etcd.client_url, "--data-dir", str(cluster.data_dir), "--cluster-layout",
                    str(cluster.layout))
        assert r.returncode == 0, r.stderr
        assert f"start it with: shardetcd cluster --layout {cluster.layout}" in r.stdout, r.stdout
    finally:
        etcd.stop()
    try:
        cluster.start()
        flags = dict(f.lstrip("-").split("=", 1) for f in (cluster.data_dir / "kube-apiserver.flags").read_text().split())
        api = start_kube_apiserver(tmp_path / "on-cluster", flags["etcd-servers"].split(","),
                                   etcd_servers_overrides=flags["etcd-servers-overrides"].split(","),
                                   extra_args=["--watch-cache-sizes=configmaps#0"])
        try:
            kube = api.client
            assert seen(kube) == before
            assert all(before.values()), before
            for path, name in ((cms, "c1"), (lease_path, "node-1")):
                obj = kube.call("GET", f"{path}/{name}")
                obj["metadata"].setdefault("labels", {})["moved"] = "yes"
                again = kube.call("PUT", f"{path}/{name}", obj)
                assert int(again["metadata"]["resourceVersion"]) > int(obj["metadata"]["resourceVersion"])
            assert api.bad_log_lines() == []
        finally:
            api.stop()
        from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg

        def keys(partition: str) -> list[bytes]:
            with grpc.insecure_channel(cluster.endpoint(partition)) as ch:
                got = pbg.KVStub(ch).Range(pb.RangeRequest(key=b"/registry/", range_end=b"/registry0", keys_only=True),
                                           timeout=10)
            return [kv.key for kv in got.kvs]

        on_leases, on_main = keys("leases"), keys("main")  # each resource on its partition only
        assert b"/registry/leases/moved/node-1" in on_leases and b"/registry/configmaps/moved/c1" in on_main
        assert not any(k.startswith(b"/registry/configmaps/") for k in on_leases)
        assert not any(k.startswith((b"/registry/leases/", b"/registry/events/")) for k in on_main)
    finally:
        cluster.stop()
