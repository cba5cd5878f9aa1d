"""The /v3 JSON gateway (served on --listen-metrics-urls, and on the client port as etcd serves it):
etcd3gw, and JSON equal to etcd's gateway."""
from __future__ import annotations

import json
import threading
import time
import urllib.request

import etcd3gw
import pytest

from tests.etcd_fixture import free_port
from tests.shardetcd_fixture import shardetcd_member, start_shardetcd


@pytest.fixture(params=["writer", "local-follower"])
def gateway(request, tmp_path):
    """The gateway's port (--listen-metrics-urls) of a shardetcd, or of a follower of one: etcd's
    gateway is a gRPC client of its member, so a follower's routes go where its gRPC calls go."""
    port = free_port()
    with shardetcd_member(tmp_path, request.param, called_args=("--listen-metrics-urls", f"http://127.0.0.1:{port}")):
        yield port


def post(base: str, path: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_etcd3gw_put_get_lease_watch(gateway):
    c = etcd3gw.client(host="127.0.0.1", port=gateway)
    assert c.status()["version"].startswith("3.5.")
    assert c.put("/registry/pods/a", "1") and c.get("/registry/pods/a") == [b"1"]
    lease = c.lease(ttl=60)
    assert 55 <= lease.ttl() <= 60
    assert c.put("/registry/events/e", "x", lease=lease)
    assert [m["key"] for _, m in c.get_prefix("/registry/")] == [b"/registry/events/e", b"/registry/pods/a"]
    # from the next revision: the watch sees both writes however late the gateway sets it up
    rev = int(c.status()["header"]["revision"])
    events, (stream, cancel) = [], c.watch_prefix("/registry/", start_revision=rev + 1)
    reader = threading.Thread(target=lambda: events.extend(stream), daemon=True)
    reader.start()
    c.put("/registry/pods/b", "2")
    c.delete("/registry/pods/a")
    deadline = time.monotonic() + 5
    while len(events) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    cancel()
    assert [(e.get("type", "PUT"), e["kv"]["key"]) for e in events] == [("PUT", b"/registry/pods/b"), ("DELETE", b"/registry/pods/a")]


def test_gateway_json_matches_etcd(gateway, real_etcd):
    ours, theirs = f"http://127.0.0.1:{gateway}", f"http://{real_etcd.endpoint}"
    script = [
        ("/v3/kv/put", {"key": "YQ==", "value": "MQ==", "prev_kv": True}),
        ("/v3/kv/put", {"key": "YQ==", "value": "Mg==", "prev_kv": True}),
        ("/v3/kv/range", {"key": "YQ==", "range_end": "Yg==", "count_only": False}),
        ("/v3/kv/txn", {"compare": [{"key": "YQ==", "target": "VERSION", "result": "EQUAL", "version": "2"}],
                        "success": [{"request_delete_range": {"key": "YQ==", "prev_kv": True}}]}),
        ("/v3/kv/range", {"key": ""}),  # empty key: etcd's error
        ("/v3/kv/range", {"key": "YQ==", "revision": "99"}),
    ]
    for path, body in script:  # the bytes, not only the parsed values: scripts compare them
        assert post_raw(ours, path, body) == post_raw(theirs, path, body), (path, body)


def test_the_client_port_serves_http_as_etcds_does(tmp_path, real_etcd):
    """HTTP/1.1 on the gRPC client port, as etcd serves it there (its cmux): the JSON gateway byte
    for byte as etcd's, /version, /health, a 404 for anything else; gRPC on the same port
    meanwhile (the native gRPC server hands an HTTP/1.1 connection to the HTTP endpoint)."""
    import grpc

    from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg

    s = start_shardetcd(tmp_path)
    try:
        ours, theirs = f"http://{s.endpoint}", f"http://{real_etcd.endpoint}"
        for path, body in [
            ("/v3/kv/put", {"key": "Yw==", "value": "MQ==", "prev_kv": True}),
            ("/v3/kv/range", {"key": "Yw=="}),
            ("/v3/kv/range", {"key": ""}),
        ]:
            assert post_raw(ours, path, body) == post_raw(theirs, path, body), (path, body)
        for path in ("/health", "/nothing"):
            assert get_raw(ours, path) == get_raw(theirs, path), path
        status, body = get_raw(ours, "/version")  # the version told differs (3.5.16, for kube-apiserver)
        assert status == 200 and json.loads(body).keys() == json.loads(get_raw(theirs, "/version")[1]).keys()
        with grpc.insecure_channel(s.endpoint) as ch:
            assert pbg.KVStub(ch).Range(pb.RangeRequest(key=b"c"), timeout=10).kvs[0].value == b"1"
    finally:
        s.stop()


def get_raw(base: str, path: str) -> tuple[int, str]:
    return _answer(base + path)


def post_raw(base: str, path: str, body: dict) -> tuple[int, str]:
    """Status and body, with the member identity (ids, term) masked."""
    import re

    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    status, raw = _answer(req)
    return status, re.sub(r'"(cluster_id|member_id|raft_term)":"\d+"', r'"\1":"N"', raw)


def _answer(request) -> tuple[int, str]:
    """Status and body of a request, an HTTP error's included."""
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_member_list_as_etcd(tmp_path, real_etcd):
    """MemberList names the member with its peer and client URLs as etcd does, over
    gRPC and byte for byte through the gateway (the ids aside): the default peer
    URL is etcd's, --initial-advertise-peer-urls sets it."""
    import re

    import grpc

    from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg

    port = free_port()
    with start_shardetcd(tmp_path, extra_args=("--listen-metrics-urls", f"http://127.0.0.1:{port}", "--name",
                                               real_etcd.name, "--initial-advertise-peer-urls", real_etcd.peer_url)) as s, \
            start_shardetcd(tmp_path / "plain") as plain:  # each stopped, whichever fails
        def members(endpoint: str) -> list:
            with grpc.insecure_channel(endpoint) as ch:
                return list(pbg.ClusterStub(ch).MemberList(pb.MemberListRequest(), timeout=10).members)

        ours, theirs = members(s.endpoint)[0], members(real_etcd.endpoint)[0]
        assert (ours.name, list(ours.peerURLs), ours.isLearner) == (theirs.name, list(theirs.peerURLs), theirs.isLearner)
        assert list(ours.clientURLs) == [s.client_url] and list(theirs.clientURLs) == [real_etcd.client_url]
        assert list(members(plain.endpoint)[0].peerURLs) == ["http://localhost:2380"]  # etcd's default

        def gateway_json(base: str, client_url: str) -> str:
            req = urllib.request.Request(base + "/v3/cluster/member/list", data=b"{}", method="POST")
            with urllib.request.urlopen(req, timeout=10) as r:
                body = r.read().decode()
            return re.sub(r'"\d+"', '"N"', body.replace(client_url, "CLIENT"))

        assert gateway_json(f"http://127.0.0.1:{port}", s.client_url) == gateway_json(real_etcd.client_url,
                                                                                    real_etcd.client_url)


def test_gateway_lock_and_election_json_matches_etcd(gateway, real_etcd):
    """/v3/lock/* and /v3/election/* as etcd's gateway answers them (a client-chosen lease id
    makes the keys the same on both servers)."""
    import base64

    b64 = lambda s: base64.b64encode(s.encode()).decode()  # noqa: E731
    ours, theirs = f"http://127.0.0.1:{gateway}", f"http://{real_etcd.endpoint}"

    def both(path: str, body: dict) -> dict:
        a, b = post(ours, path, body), post(theirs, path, body)
        for _, doc in (a, b):
            for k in ("cluster_id", "member_id", "raft_term"):
                doc.get("header", {}).pop(k, None)
        assert a == b, (path, body, a, b)
        return a[1]

    both("/v3/lease/grant", {"ID": "4660", "TTL": "60"})
    locked = both("/v3/lock/lock", {"name": b64("gl"), "lease": "4660"})
    assert base64.b64decode(locked["key"]) == b"gl/1234"
    both("/v3/lock/unlock", {"key": locked["key"]})
    both("/v3/lock/unlock", {})  # etcd's error for a missing key
    both("/v3/election/leader", {"name": b64("ge")})  # no leader yet: etcd's error
    won = both("/v3/election/campaign", {"name": b64("ge"), "lease": "4660", "value": b64("v1")})
    leader = won["leader"]
    both("/v3/election/proclaim", {"leader": leader, "value": b64("v2")})
    assert base64.b64decode(both("/v3/election/leader", {"name": b64("ge")})["kv"]["value"]) == b"v2"
    # /v3/election/observe streams {"result": LeaderResponse} lines: the current leader's value first
    firsts = []
    for base in (ours, theirs):
        req = urllib.request.Request(base + "/v3/election/observe", data=json.dumps({"name": b64("ge")}).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            doc = json.loads(r.readline())
        for k in ("cluster_id", "member_id", "raft_term"):
            doc["result"]["header"].pop(k, None)
        firsts.append(doc)
    assert firsts[0] == firsts[1] and base64.b64decode(firsts[0]["result"]["kv"]["value"]) == b"v2"
    both("/v3/election/resign", {"leader": leader})
    both("/v3/election/proclaim", {"leader": leader, "value": b64("v3")})  # not leader any more
    both("/v3/election/resign", {})


def test_a_gateway_lock_whose_client_gave_up_leaves_the_queue_as_on_etcd(gateway, real_etcd):
    """A client that closes its connection while its /v3/lock/lock waits: etcd's gateway cancels
    the call (Go cancels a request's context when its connection closes), so its key leaves the
    lock's queue; left there, the lock would be had, and held, by nobody once given up."""
    import base64
    import socket

    def queued(base: str) -> list[str]:
        listed = post(base, "/v3/kv/range", {"key": base64.b64encode(b"gq/").decode(),
                                             "range_end": base64.b64encode(b"gq0").decode()})[1]
        return sorted(base64.b64decode(kv["key"]).decode() for kv in listed.get("kvs", []))

    for base in (f"http://127.0.0.1:{gateway}", f"http://{real_etcd.endpoint}"):
        for lease in ("4660", "4661"):
            assert post(base, "/v3/lease/grant", {"ID": lease, "TTL": "60"})[0] == 200
        assert post(base, "/v3/lock/lock", {"name": base64.b64encode(b"gq").decode(), "lease": "4660"})[0] == 200
        host, port = base.removeprefix("http://").rsplit(":", 1)
        body = json.dumps({"name": base64.b64encode(b"gq").decode(), "lease": "4661"}).encode()
        with socket.create_connection((host, int(port)), timeout=10) as waiting:
            waiting.sendall(b"POST /v3/lock/lock HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                            b"Content-Length: %d\r\n\r\n%s" % (base.encode()[7:], len(body), body))
            deadline = time.monotonic() + 10
            while queued(base) != ["gq/1234", "gq/1235"]:  # it waits in the queue
                assert time.monotonic() < deadline, queued(base)
                time.sleep(0.1)
        deadline = time.monotonic() + 10
        while (left := queued(base)) != ["gq/1234"]:  # and leaves it with its client
            assert time.monotonic() < deadline, (base, left)
            time.sleep(0.1)
