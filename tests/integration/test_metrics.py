"""/metrics, /health, /readyz, /version on --listen-metrics-urls."""
from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from grpc_health.v1 import health_pb2, health_pb2_grpc

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.etcd_fixture import free_port
from tests.shardetcd_fixture import start_shardetcd


@pytest.fixture
def server(tmp_path):
    port = free_port()
    s = start_shardetcd(tmp_path, extra_args=("--listen-metrics-urls", f"http://127.0.0.1:{port}"))
    try:
        yield s, f"http://127.0.0.1:{port}"
    finally:
        s.stop()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def scrape(base: str) -> dict[tuple[str, tuple], float]:
    status, text = get(base + "/metrics")
    assert status == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_metrics_follow_the_state(server):
    srv, base = server
    with grpc.insecure_channel(srv.endpoint) as ch:
        kv = pbg.KVStub(ch)
        for i in range(5):
            kv.Put(pb.PutRequest(key=b"/registry/pods/p%d" % i, value=b"v"))
        kv.Put(pb.PutRequest(key=b"/registry/leases/l", value=b"v"))
        kv.DeleteRange(pb.DeleteRangeRequest(key=b"/registry/pods/p0"))
    m = scrape(base)
    assert m[("etcd_server_has_leader", ())] == 1
    assert m[("etcd_debugging_mvcc_keys_total", ())] == 5
    assert m[("etcd_debugging_mvcc_current_revision", ())] == 8
    assert m[("etcd_mvcc_db_total_size_in_bytes", ())] >= m[("etcd_mvcc_db_total_size_in_use_in_bytes", ())] > 0
    assert m[("shardetcd_shard_keys", (("shard", "pods"),))] == 4
    assert m[("shardetcd_shard_writes_total", (("shard", "pods"),))] == 6
    assert not any(name.startswith(("shardetcd_journal_nats", "shardetcd_writer_lease")) for name, _ in m)  # local
    assert m[("shardetcd_shard_writes_total", (("shard", "leases"),))] == 1
    assert m[("etcd_disk_wal_fsync_duration_seconds_count", ())] >= 2
    assert m[("shardetcd_shard_journal_batch_bytes_count", (("shard", "pods"),))] >= 1
    assert m[("shardetcd_shard_journal_batch_bytes_sum", (("shard", "pods"),))] > 6 * 20  # six pod writes, framed
    assert m[("etcd_network_client_grpc_received_bytes_total", ())] > 100
    assert m[("etcd_network_client_grpc_sent_bytes_total", ())] > 50
    rss = int(next(line for line in open(f"/proc/{srv.pid}/status") if line.startswith("VmRSS:")).split()[1]) * 1024
    assert 0.5 < m[("process_resident_memory_bytes", ())] / rss < 2  # the server's own, as etcd exposes it


@pytest.mark.parametrize("failing", [False, True], ids=["written", "failing"])
def test_checkpoints_are_shown_per_shard(tmp_path, monkeypatch, failing):
    """shardetcd_shard_checkpoints_total, _checkpoint_failures_total and _checkpoint_revision: how an
    operator sees that the journal is checkpointed (and released), or that checkpoints fail and the
    journal is kept and grows until one is written."""
    if failing:
        monkeypatch.setenv("SHARDETCD_FAILPOINTS", "checkpoint.before_rename=raise")
    port = free_port()
    srv = start_shardetcd(tmp_path, extra_args=("--listen-metrics-urls", f"http://127.0.0.1:{port}",
                                                "--checkpoint-journal-bytes", "8192"))
    try:
        with grpc.insecure_channel(srv.endpoint) as ch:
            kv = pbg.KVStub(ch)
            for i in range(100):  # ~30 KB of pods journal: past the threshold several times
                kv.Put(pb.PutRequest(key=b"/registry/pods/p%d" % i, value=b"v" * 200))
        deadline = time.monotonic() + 20
        pods = (("shard", "pods"),)
        while True:  # checkpoints are written in the background
            m = scrape(f"http://127.0.0.1:{port}")
            done = m[("shardetcd_shard_checkpoint_failures_total" if failing else "shardetcd_shard_checkpoints_total",
                      pods)]
            if done >= 1 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert done >= 1, m
        assert m[("shardetcd_shard_checkpoints_total", (("shard", "leases"),))] == 0  # nothing written there
        if failing:
            assert m[("shardetcd_shard_checkpoints_total", pods)] == 0
            assert m[("shardetcd_shard_checkpoint_revision", pods)] == 0
            assert m[("shardetcd_shard_journal_bytes", pods)] > 100 * 200  # nothing released
            log = srv.log_tail(200)  # one line a failure, no traceback: it is tried again every 30 s
            assert "checkpoint failed shard=pods rev=" in log and "retry_in_s=30 error=OSError(5," in log, log
            assert "Traceback" not in log
        else:
            assert m[("shardetcd_shard_checkpoint_failures_total", pods)] == 0
            assert 1 < m[("shardetcd_shard_checkpoint_revision", pods)] <= 101
    finally:
        srv.stop()


def test_garbage_collector_pauses_are_shown(server):
    """shardetcd_gc_pause_seconds: each collector run, by generation. The server runs one full
    collection (generation 2) as soon as its store is open (shards/collector.py), and the
    requests below make young ones."""
    srv, base = server
    with grpc.insecure_channel(srv.endpoint) as ch:
        kv = pbg.KVStub(ch)
        for i in range(300):
            kv.Put(pb.PutRequest(key=b"/registry/pods/gc%d" % i, value=b"v" * 100))
    m = scrape(base)
    count = {g: m[("shardetcd_gc_pause_seconds_count", (("generation", g),))] for g in "012"}
    assert count["2"] >= 1 and count["0"] >= 1, count
    assert m[("shardetcd_gc_pause_seconds_bucket", (("generation", "2"), ("le", "+Inf")))] == count["2"]
    assert 0 < m[("shardetcd_gc_pause_seconds_sum", (("generation", "2"),))] < 60


def test_health_readyz_version(server, real_etcd):
    """/health and /version are byte for byte etcd's (health checks grep for them), alarms included."""
    srv, base = server
    etcd_health = get(real_etcd.client_url + "/health")
    assert get(base + "/health") == etcd_health == (200, '{"health":"true","reason":""}')
    assert get(base + "/readyz") == (200, "ok")
    version = get(base + "/version")[1]
    etcd_version = get(real_etcd.client_url + "/version")[1]
    assert re.sub(r"3\.5\.\d+", "V", version) == re.sub(r"3\.5\.\d+", "V", etcd_version)
    assert json.loads(version)["etcdcluster"] == "3.5.0"
    assert get(base + "/nope")[0] == 404
    for endpoint in (srv.endpoint, real_etcd.endpoint):
        with grpc.insecure_channel(endpoint) as ch:
            member = pbg.ClusterStub(ch).MemberList(pb.MemberListRequest()).members[0].ID
            pbg.MaintenanceStub(ch).Alarm(pb.AlarmRequest(action=pb.AlarmRequest.ACTIVATE, memberID=member,
                                                          alarm=pb.NOSPACE))
    status, body = get(base + "/health")
    assert (status, body) == get(real_etcd.client_url + "/health")
    assert status == 503 and body == '{"health":"false","reason":"ALARM NOSPACE"}\n'
    assert get(base + "/readyz")[0] == 503


def test_disconnected_watch_streams_free_their_watchers(server):
    from tests.watch_client import WatchClient

    srv, base = server
    channels = [grpc.insecure_channel(srv.endpoint) for _ in range(4)]
    clients = [WatchClient(ch) for ch in channels]
    for c in clients:
        for i in range(25):
            c.create(b"/registry/pods/%d" % i, b"/registry/pods0")
        c.wait_for(lambda rs: sum(r.created for r in rs) == 25)
    assert scrape(base)[("etcd_debugging_mvcc_watcher_total", ())] == 100
    clients[0].close()  # the client cancels its call
    channels[1].close()  # the connection goes away under an open stream
    deadline = time.monotonic() + 10
    while scrape(base)[("etcd_debugging_mvcc_watcher_total", ())] != 50:
        assert time.monotonic() < deadline, "watchers of dead streams were not freed"
        time.sleep(0.1)
    assert scrape(base)[("shardetcd_shard_watchers", (("shard", "pods"),))] == 50
    for c in clients[2:]:
        c.close()
    for ch in channels:
        ch.close()


def test_grpc_server_metrics_count_as_etcds(server, real_etcd):
    """etcd's gRPC server metrics (grpc_server_started/handled/msg_received/msg_sent, go-grpc-prometheus):
    the same calls -- a put, a txn refused, a watch stream the client cancels, a malformed request --
    give the same counts, by method, type and status code, as on etcd (its client URL serves
    /metrics); the gRPC health service's calls are counted too. Every method is listed from the start, at 0, as etcd lists them."""
    s, base = server
    fresh = scrape(base)
    assert fresh[("grpc_server_handled_total", (("grpc_code", "Unauthenticated"), ("grpc_method", "Txn"),
                                                ("grpc_service", "etcdserverpb.KV"), ("grpc_type", "unary")))] == 0

    def drive(endpoint: str) -> None:
        with grpc.insecure_channel(endpoint) as ch:
            kv = pbg.KVStub(ch)
            kv.Put(pb.PutRequest(key=b"a", value=b"1"))
            with pytest.raises(grpc.RpcError):
                kv.Txn(pb.TxnRequest(success=[pb.RequestOp(request_put=pb.PutRequest(key=b""))]))
            with pytest.raises(grpc.RpcError):
                ch.unary_unary("/etcdserverpb.KV/DeleteRange")(b"\xff\xff", timeout=10)
            stream = pbg.WatchStub(ch).Watch(iter([pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"a"))]))
            next(stream)
            stream.cancel()
            health = health_pb2_grpc.HealthStub(ch)
            health.Check(health_pb2.HealthCheckRequest())
            with pytest.raises(grpc.RpcError):
                health.Check(health_pb2.HealthCheckRequest(service="nope"))
            as_clientv3 = (("client-api-version", "3.5"),)  # as etcd's Go client sends it
            kv.Range(pb.RangeRequest(key=b"a"), metadata=as_clientv3)
            b"".join(r.blob for r in pbg.MaintenanceStub(ch).Snapshot(pb.SnapshotRequest(), metadata=as_clientv3))
        time.sleep(0.5)

    def grpc_counts(url: str) -> dict:
        counts = {}
        for (name, labels), v in scrape(url).items():
            d = dict(labels)
            if name.startswith("grpc_server_") and d["grpc_method"] in ("Put", "Txn", "DeleteRange", "Watch", "Check") \
                    and d["grpc_service"] in ("etcdserverpb.KV", "etcdserverpb.Watch", "grpc.health.v1.Health"):
                counts[(name, labels)] = v
            elif name == "etcd_server_client_requests_total":  # by type and the client's API version
                counts[(name, labels)] = v
        return counts

    before = [grpc_counts(base), grpc_counts(real_etcd.client_url)]
    drive(s.endpoint)
    drive(real_etcd.endpoint)
    after = [grpc_counts(base), grpc_counts(real_etcd.client_url)]
    deltas = [{k: a[k] - b.get(k, 0) for k in a if a[k] - b.get(k, 0)} for a, b in zip(after, before)]
    assert deltas[0] == deltas[1]
    assert sum(v for (name, _), v in deltas[0].items() if name == "grpc_server_handled_total") == 5  # not the malformed one
    assert {labels: v for (name, labels), v in deltas[0].items() if name == "etcd_server_client_requests_total"} == {
        (("client_api_version", "unknown"), ("type", "unary")): 4, (("client_api_version", "unknown"), ("type", "stream")): 1,
        (("client_api_version", "3.5"), ("type", "unary")): 1, (("client_api_version", "3.5"), ("type", "stream")): 1}


def test_etcd_info_and_proposal_metrics_as_etcd(server, real_etcd):
    """The info gauges and proposal counters etcd's dashboards read, with etcd's names, types and labels."""
    s, base = server
    def names(url):
        status, text = get(url + "/metrics")
        return {(f.name, f.type, tuple(sorted({k for smp in f.samples for k in smp.labels})))
                for f in text_string_to_metric_families(text)}
    wanted = {"etcd_server_id", "etcd_server_version", "etcd_cluster_version", "etcd_server_leader_changes_seen",
              "etcd_server_proposals_pending", "etcd_server_proposals_failed", "etcd_server_has_leader",
              "etcd_server_is_leader", "etcd_server_proposals_committed_total", "etcd_server_proposals_applied_total",
              # what etcd's own dashboard and alerts (etcd-mixin) read besides
              "etcd_server_is_learner", "etcd_disk_wal_fsync_duration_seconds", "etcd_disk_backend_commit_duration_seconds",
              "etcd_disk_wal_write_bytes_total", "etcd_mvcc_db_total_size_in_bytes", "etcd_mvcc_db_total_size_in_use_in_bytes",
              "etcd_server_quota_backend_bytes", "etcd_network_client_grpc_received_bytes",
              "etcd_network_client_grpc_sent_bytes", "etcd_debugging_mvcc_keys_total", "process_resident_memory_bytes"}
    ours, theirs = ({n for n in names(u) if n[0] in wanted} for u in (base, real_etcd.client_url))
    assert ours == theirs and len(ours) == len(wanted)
    with grpc.insecure_channel(s.endpoint) as ch:
        member_id = pbg.MaintenanceStub(ch).Status(pb.StatusRequest()).header.member_id
    m = scrape(base)
    assert m[("etcd_server_id", (("server_id", f"{member_id:x}"),))] == 1
    assert m[("etcd_cluster_version", (("cluster_version", "3.5"),))] == 1
    assert m[("etcd_server_leader_changes_seen_total", ())] == 1 and m[("etcd_server_proposals_failed_total", ())] == 0
    assert m[("etcd_server_is_learner", ())] == 0
    with grpc.insecure_channel(s.endpoint) as ch:  # a write: one more journal batch, its bytes written
        pbg.KVStub(ch).Put(pb.PutRequest(key=b"/registry/pods/m", value=b"v" * 100))
    after = scrape(base)
    assert after[("etcd_disk_wal_write_bytes_total", ())] >= m[("etcd_disk_wal_write_bytes_total", ())] + 100
    for name in ("etcd_disk_wal_fsync_duration_seconds_count", "etcd_disk_backend_commit_duration_seconds_count"):
        assert after[(name, ())] == m[(name, ())] + 1, name


def test_slow_requests_are_logged_and_counted(tmp_path):
    """A unary call slower than --experimental-warning-apply-duration is logged (method, time, key)
    and counted in etcd_server_slow_apply_total, as etcd warns of applies that took too long; at the
    default of 100 ms quick calls are not."""
    port = free_port()
    s = start_shardetcd(tmp_path, extra_args=("--listen-metrics-urls", f"http://127.0.0.1:{port}",
                                              "--experimental-warning-apply-duration", "1ms"))
    try:
        # the fixture's readiness Range can itself take a millisecond on a busy machine, and be the
        # second's one logged line: the puts start in the next second
        time.sleep(1.1)
        with grpc.insecure_channel(s.endpoint) as ch:
            for _ in range(20):  # 400 KB written and fsynced each: mostly over a millisecond
                pbg.KVStub(ch).Put(pb.PutRequest(key=b"/registry/pods/slow", value=b"v" * 400_000))
        slow = scrape(f"http://127.0.0.1:{port}")[("etcd_server_slow_apply_total", ())]
        lines = re.findall(r"level=WARNING .*request took too long method=etcdserverpb\.KV\.Put took_s=[\d.]+ "
                           r"expected_s=0\.001 key=b'/registry/pods/slow' more_since_last=\d+", s.log_path.read_text())
        assert slow >= 2 and 1 <= len(lines) < slow  # every one counted, at most a line a second logged
    finally:
        s.stop()
    quiet = start_shardetcd(tmp_path / "default")
    try:
        with grpc.insecure_channel(quiet.endpoint) as ch:
            pbg.KVStub(ch).Range(pb.RangeRequest(key=b"a"))
        assert "took too long" not in quiet.log_path.read_text()
    finally:
        quiet.stop()


def test_metrics_extensive_adds_the_handling_time_histogram_as_etcd(tmp_path):
    """--metrics=extensive (etcd's etcdGRPCRequestsSlow alert reads grpc_server_handling_seconds):
    every method listed with etcd's buckets from the start, and the same calls counted as etcd
    counts them, failed ones and a cancelled stream included; basic (the default) has no such family."""
    from tests.etcd_fixture import start_etcd

    port = free_port()
    with start_shardetcd(tmp_path, extra_args=("--listen-metrics-urls", f"http://127.0.0.1:{port}",
                                               "--metrics=extensive")) as ours, \
            start_etcd(tmp_path / "etcd", extra_args=("--metrics=extensive",)) as etcd:  # each stopped, whichever fails
        def handling(url: str) -> dict:
            return {(name, labels): v for (name, labels), v in scrape(url).items()
                    if name.startswith("grpc_server_handling_seconds") and not name.endswith("_sum")}

        fresh = [handling(f"http://127.0.0.1:{port}"), handling(etcd.client_url)]
        put_key = ("grpc_server_handling_seconds_bucket", (("grpc_method", "Put"), ("grpc_service", "etcdserverpb.KV"),
                                                          ("grpc_type", "unary"), ("le", "0.005")))
        assert fresh[0][put_key] == fresh[1][put_key] == 0
        kv_series = [{k for k in f if ("grpc_service", "etcdserverpb.KV") in k[1]} for f in fresh]
        assert kv_series[0] == kv_series[1] and len(kv_series[0]) == 5 * (11 + 2)  # 5 methods, 11 bounds, +Inf, count
        for endpoint in (ours.endpoint, etcd.endpoint):
            with grpc.insecure_channel(endpoint) as ch:
                kv = pbg.KVStub(ch)
                for _ in range(3):
                    kv.Put(pb.PutRequest(key=b"a", value=b"1"))
                with pytest.raises(grpc.RpcError):
                    kv.Range(pb.RangeRequest(key=b""))
                stream = pbg.WatchStub(ch).Watch(iter([pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"a"))]))
                next(stream)
                stream.cancel()
            time.sleep(0.5)
        after = [handling(f"http://127.0.0.1:{port}"), handling(etcd.client_url)]
        counts = [{k: v - f[k] for k, v in a.items() if k[0].endswith("_count") and v - f[k]}  # the readiness probes
                  for a, f in zip(after, fresh)]                                            # were calls too
        assert counts[0] == counts[1], counts
        assert {dict(k[1])["grpc_method"]: v for k, v in counts[0].items()} == {"Put": 3, "Range": 1, "Watch": 1}
    basic_port = free_port()
    basic = start_shardetcd(tmp_path, name="basic", extra_args=("--listen-metrics-urls", f"http://127.0.0.1:{basic_port}"))
    try:
        with grpc.insecure_channel(basic.endpoint) as ch:
            pbg.KVStub(ch).Put(pb.PutRequest(key=b"a", value=b"1"))
        assert not handling(f"http://127.0.0.1:{basic_port}")
    finally:
        basic.stop()


ETCD_COUNTS = ("etcd_mvcc_range_total", "etcd_mvcc_put_total", "etcd_mvcc_delete_total", "etcd_mvcc_txn_total",
               "etcd_debugging_mvcc_range_total", "etcd_debugging_mvcc_total_put_size_in_bytes",
               "etcd_debugging_mvcc_events_total", "etcd_debugging_mvcc_pending_events_total",
               "etcd_debugging_mvcc_slow_watcher_total", "etcd_debugging_mvcc_watch_stream_total",
               "etcd_debugging_mvcc_db_compaction_keys_total", "etcd_debugging_lease_granted_total",
               "etcd_debugging_lease_revoked_total", "etcd_debugging_server_lease_expired_total",
               "etcd_debugging_lease_ttl_total_count", "etcd_debugging_lease_ttl_total_sum",
               # etcd's two without _total (the parser adds it; the text has none, checked below)
               "etcd_server_health_success_total", "etcd_server_health_failures_total", "etcd_debugging_auth_revision")


def _drive_counted_requests(endpoint: str, metrics_url: str) -> list:
    """Requests whose counting differs by shape (see shards/counts.py), each followed by the
    change it made to etcd's counters; with the status code of those refused."""
    def put(k, v=b"v", **kw):
        return pb.RequestOp(request_put=pb.PutRequest(key=k, value=v, **kw))

    def rng(k, **kw):
        return pb.RequestOp(request_range=pb.RangeRequest(key=k, **kw))

    def value_is(k, v):
        return pb.Compare(key=k, target=pb.Compare.VALUE, result=pb.Compare.EQUAL, value=v)

    def counts():
        m = scrape(metrics_url)
        return {name: m.get((name, ()), 0) for name in ETCD_COUNTS}

    steps = []
    with grpc.insecure_channel(endpoint) as ch:
        kv, lease = pbg.KVStub(ch), pbg.LeaseStub(ch)
        txn = lambda **kw: kv.Txn(pb.TxnRequest(**kw))  # noqa: E731
        calls = [
            lambda: kv.Put(pb.PutRequest(key=b"a", value=b"1")),
            lambda: kv.Put(pb.PutRequest(key=b"a", value=b"22", prev_kv=True)),
            lambda: kv.Put(pb.PutRequest(key=b"a", ignore_value=True)),
            lambda: kv.Put(pb.PutRequest(key=b"nokey", ignore_value=True)),
            lambda: kv.Put(pb.PutRequest(key=b"nokey", ignore_value=True, lease=999)),  # the lease is checked first
            lambda: kv.Range(pb.RangeRequest(key=b"a", range_end=b"b", count_only=True, serializable=True)),
            lambda: kv.Range(pb.RangeRequest(key=b"a", revision=10**6)),
            lambda: kv.DeleteRange(pb.DeleteRangeRequest(key=b"a", prev_kv=True)),
            lambda: kv.DeleteRange(pb.DeleteRangeRequest(key=b"missing")),
            lambda: txn(),
            lambda: txn(success=[put(b"x", b"12"), put(b"y", b"1"), rng(b"x")]),
            lambda: txn(success=[rng(b"x"), rng(b"y")]),
            lambda: txn(compare=[value_is(b"x", b"12"), value_is(b"y", b"1")], success=[put(b"z")]),
            lambda: txn(compare=[value_is(b"x", b"no"), value_is(b"y", b"1")], success=[put(b"z")],
                        failure=[rng(b"z")]),
            lambda: txn(success=[put(b"x", b"", ignore_value=True)]),
            lambda: txn(success=[put(b"nokey", b"", ignore_value=True, lease=999)]),
            lambda: txn(success=[pb.RequestOp(request_txn=pb.TxnRequest(success=[put(b"n1"), put(b"n2")]))]),
            lambda: txn(success=[pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=b"n", range_end=b"o",
                                                                                        prev_kv=True))]),
            lambda: lease.LeaseGrant(pb.LeaseGrantRequest(TTL=100, ID=7)),
            lambda: (kv.Put(pb.PutRequest(key=b"l1", lease=7)), kv.Put(pb.PutRequest(key=b"l2", lease=7))),
            lambda: lease.LeaseRevoke(pb.LeaseRevokeRequest(ID=7)),
            lambda: lease.LeaseRevoke(pb.LeaseRevokeRequest(ID=7)),
            lambda: kv.Compact(pb.CompactionRequest(revision=kv.Range(pb.RangeRequest(key=b"x")).header.revision,
                                                    physical=True)),
            lambda: get(metrics_url + "/health"),
        ]
        before = counts()
        for call in calls:
            code = None
            try:
                call()
            except grpc.RpcError as e:
                code = e.code()
            after = counts()
            steps.append((code, {k: after[k] - before[k] for k in after if after[k] != before[k]}))
            before = after

        # two watchers on one stream, a txn of three puts: four events sent
        from tests.watch_client import WatchClient
        watcher = WatchClient(ch)
        watcher.create(b"w")
        watcher.create(b"w", b"x")
        watcher.wait_for(lambda rs: sum(r.created for r in rs) == 2)
        txn(success=[put(b"w", b"1"), put(b"wa", b"2"), put(b"wb", b"3")])
        watcher.wait_for(lambda rs: sum(len(r.events) for r in rs) == 4)
        during = counts()
        watcher.close()
        steps.append(("watch", {k: during[k] - before[k] for k in during if during[k] != before[k]}))
        before = during

        lease.LeaseGrant(pb.LeaseGrantRequest(TTL=1, ID=8))  # expires
        deadline = time.monotonic() + 15
        while counts()["etcd_debugging_server_lease_expired_total"] == before["etcd_debugging_server_lease_expired_total"]:
            assert time.monotonic() < deadline, "the lease did not expire"
            time.sleep(0.1)
        after = counts()
        steps.append(("expiry", {k: after[k] - before[k] for k in after if after[k] != before[k]
                                 and k != "etcd_debugging_mvcc_watch_stream_total"}))  # the watch stream's end
    return steps


def test_mvcc_lease_watch_and_health_counters_count_as_etcds(server, real_etcd):
    """etcd's mvcc counters (ranges, puts, deletes, txns and put bytes, counted per metrics
    transaction: a compare, a prev_kv and an ignore_value each read), the lessor's, the watch
    gauges, compaction and /health: the same requests change them by the same amounts as on etcd,
    and their families have etcd's names, types and buckets."""
    s, base = server
    start = time.time()
    ours = _drive_counted_requests(s.endpoint, base)
    theirs = _drive_counted_requests(real_etcd.endpoint, real_etcd.client_url)
    assert ours == theirs
    changed = {name for _, delta in ours for name in delta}
    assert changed >= set(ETCD_COUNTS) - {"etcd_server_health_failures_total", "etcd_debugging_auth_revision",
                                          "etcd_debugging_mvcc_pending_events_total",
                                          "etcd_debugging_mvcc_slow_watcher_total"}
    m = scrape(base)
    assert start - 1 <= m[("etcd_debugging_mvcc_db_compaction_last", ())] <= time.time()
    assert m[("os_fd_used", ())] == pytest.approx(len(__import__("os").listdir(f"/proc/{s.pid}/fd")), abs=10)

    def families(url):
        status, text = get(url + "/metrics")
        return {(f.name, f.type, tuple(sorted({(k, v if k == "le" else "") for smp in f.samples
                                               for k, v in smp.labels.items()})))
                for f in text_string_to_metric_families(text)
                if f.name.startswith(("etcd_mvcc_", "etcd_debugging_mvcc_", "etcd_debugging_lease_", "etcd_disk_backend_defrag",
                                      "etcd_disk_backend_snapshot", "etcd_disk_defrag",
                                      "etcd_debugging_server_lease_", "etcd_server_health_", "os_fd_",
                                      "etcd_debugging_auth_", "process_virtual_memory_max"))
                and not f.name.startswith("etcd_mvcc_db_open")}
    assert families(base) == families(real_etcd.client_url)
    status, text = get(base + "/metrics")
    assert "\n# TYPE etcd_server_health_success counter\netcd_server_health_success " in text  # no _total, as etcd


def test_the_differential_streams_requests_count_as_on_etcd(server, real_etcd):
    """The differential test's seeded request stream (puts, deletes, ranges, nested txns, compactions,
    refused requests of every kind) sent to both: etcd's mvcc counters end up the same."""
    from tests.integration.diffkit import counters, has_bad_sort, run_differential, same_counts

    s, base = server
    urls = (base, real_etcd.client_url)
    before = [counters(u) for u in urls]
    run_differential(real_etcd.endpoint, s.endpoint, 20261128, 2000, skip=has_bad_sort)
    deltas = same_counts(urls, before)
    assert deltas[0] == deltas[1]
    assert all(v > 0 for v in deltas[0].values()), deltas[0]


def test_maintenance_and_compaction_timings_count_as_etcds(server, real_etcd):
    """Hash, HashKV, Defragment and Snapshot are timed in etcd's histograms (a refused HashKV is not),
    and so is a compaction: its index pause and its total once, a db pause per full batch of 1,000
    revisions (none for a few): the same calls add the same counts on both."""
    s, base = server
    from tests.integration.diffkit import counters, same_counts

    names = tuple(f"{n}_count" for n in ("etcd_mvcc_hash_duration_seconds", "etcd_mvcc_hash_rev_duration_seconds",
                                         "etcd_disk_backend_defrag_duration_seconds",
                                         "etcd_disk_backend_snapshot_duration_seconds",
                                         "etcd_debugging_mvcc_index_compaction_pause_duration_milliseconds",
                                         "etcd_debugging_mvcc_db_compaction_total_duration_milliseconds",
                                         "etcd_debugging_mvcc_db_compaction_pause_duration_milliseconds"))
    names += ("etcd_disk_defrag_inflight",)
    urls = (base, real_etcd.client_url)
    before = [counters(u, names) for u in urls]
    for endpoint in (s.endpoint, real_etcd.endpoint):
        with grpc.insecure_channel(endpoint) as ch:
            m = pbg.MaintenanceStub(ch)
            m.Hash(pb.HashRequest())
            m.HashKV(pb.HashKVRequest())
            with pytest.raises(grpc.RpcError):
                m.HashKV(pb.HashKVRequest(revision=10**6))
            m.Defragment(pb.DefragmentRequest())
            b"".join(r.blob for r in m.Snapshot(pb.SnapshotRequest()))
            kv = pbg.KVStub(ch)
            rev = max(kv.Put(pb.PutRequest(key=b"timed/%d" % (i % 3), value=b"v")).header.revision for i in range(5))
            kv.Compact(pb.CompactionRequest(revision=rev - 1, physical=True))
    deltas = same_counts(urls, before)
    assert deltas[0] == deltas[1] == {**{n: 1 for n in names[:6]}, names[6]: 0, "etcd_disk_defrag_inflight": 0}, deltas
