"""Issue 14: kube-apiserver given both endpoints keeps serving through a takeover:
objects created before the kill are there after it, a watch resumes.

Three real NATS servers; a shardetcd writer and a shardetcd --standby on the same
--journal-url (each with its own data dir, state dir and client port); a real
kube-apiserver with --etcd-servers=http://writer,http://standby. Objects on
three of shardetcd's shards (configmaps: default, pods, leases), HTTP watches on
configmaps (which bypass kube-apiserver's watch cache here, so the watch is an
etcd watch resumed by kube-apiserver's etcd client) and on pods (served from the
watch cache, whose own etcd watch is what must resume). kill -9 of the writer;
once the standby serves: every object is there with the same resourceVersion,
writes work again (an update carrying a pre-kill resourceVersion succeeds, a
stale one is 409), and each watch delivers exactly the writes made, in order,
before and after the kill (an open stream that ends is resumed from the last
resourceVersion seen, which must not be 410 Gone). Nothing in kube-apiserver's
log says the endpoint answered differently from etcd.

Run twice: with a plain --standby (its client port closed until it takes over, so
kube-apiserver must reconnect to it) and with --follow --standby (a follower until
then: kube-apiserver is connected to it all along and its writes go through it as
soon as it has taken over); and with --follow --standby and the writer not killed but cut off
from NATS, alive and reachable by kube-apiserver: its connections to NATS closed, or stalled
(held open with nothing going through, as in a partition only timeouts tell). A cut-off writer
answers no stale read, and stops once the partition heals.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from tests.kube_fixture import KubeClient, WatchEnded, WatchStream, require_kube_apiserver, start_kube_apiserver
from tests.nats_fixture import shardetcd_on as server_on, start_nats_cluster
from tests.shardetcd_fixture import ShardetcdProcess
from tests.tcp_proxy import TcpProxy

NS = "takeover"
CM = f"/api/v1/namespaces/{NS}/configmaps"
PODS = f"/api/v1/namespaces/{NS}/pods"
CUT_NS = f"{NS}-cut"
NO_LEADER = "etcdserver: no leader"
CUT_CM = f"/api/v1/namespaces/{CUT_NS}/configmaps"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"
WAIT = 60.0  # bound on waiting for one watch event
TAKEOVER_BOUND = 180.0  # bound on waiting for the standby, then for kube-apiserver to write through it



def rv(obj: dict) -> int:
    return int(obj["metadata"]["resourceVersion"])


class Follower:
    """Follows one watch across a takeover: reads events; when the stream ends,
    opens a new watch from the last resourceVersion seen (an ERROR event, e.g. 410
    Gone, fails the test). Records every event and every reopen."""

    def __init__(self, client: KubeClient, path: str, resource_version: str) -> None:
        self.client = client
        self.path = path
        self.last_rv = resource_version
        self.seen: list[tuple[str, str, int]] = []
        self.reopened: list[str] = []  # why each stream ended
        self.stream: WatchStream = client.watch(path, resource_version)

    def take(self, count: int) -> list[tuple[str, str, int]]:
        got = []
        deadline = time.monotonic() + TAKEOVER_BOUND
        while len(got) < count:
            try:
                ev = self.stream.next_event(timeout=WAIT)
            except WatchEnded as ended:
                assert time.monotonic() < deadline, f"{self.path}: kept ending: {self.reopened}"
                self.reopened.append(ended.reason)
                self.stream.close()
                time.sleep(0.5)
                self.stream = self.client.watch(self.path, self.last_rv)  # resume where we were
                continue
            except TimeoutError as exc:
                raise AssertionError(f"{self.path}: after {got}: {exc}") from None
            if ev["type"] == "ERROR" and NO_LEADER in ev["object"].get("message", ""):
                # kube-apiserver passes etcd's ending of a watch that requires a leader on as an ERROR
                # event (500): a client such as an informer watches again from where it was
                self.reopened.append(NO_LEADER)
                self.stream.close()
                self.stream = self.client.watch(self.path, self.last_rv)
                continue
            assert ev["type"] != "ERROR", f"{self.path} from resourceVersion {self.last_rv}: {ev['object']}"
            meta = ev["object"]["metadata"]
            event = (ev["type"], meta["name"], int(meta["resourceVersion"]))
            got.append(event)
            self.last_rv = meta["resourceVersion"]
        self.seen += got
        return got

    def nothing_more(self, wait: float = 2.0) -> None:
        try:
            ev = self.stream.next_event(timeout=wait)
        except (TimeoutError, WatchEnded):
            return
        raise AssertionError(f"{self.path}: an event no write made: {ev['type']} {ev['object']['metadata']}")

    def close(self) -> None:
        self.stream.close()


@pytest.mark.timeout(900)  # the bounds on waiting below, not an expected duration (~25 s)
@pytest.mark.parametrize("standby_flags,fault", [(("--standby",), "kill"), (("--follow", "--standby"), "kill"),
                                                 (("--follow", "--standby"), "cut-off"),
                                                 (("--follow", "--standby"), "stalled")],
                         ids=["standby", "following-standby", "following-standby-writer-cut-off",
                              "following-standby-writer-stalled"])
def test_kube_apiserver_keeps_serving_through_a_takeover(tmp_path, standby_flags, fault):
    require_kube_apiserver()
    # the writer is cut off from NATS, alive and reachable, instead of killed: its connections closed
    # (cut-off), or held open with nothing going through, as in a partition only timeouts tell (stalled)
    cut_off, stalled = fault in ("cut-off", "stalled"), fault == "stalled"
    nats = start_nats_cluster(tmp_path / "nats", size=3, extra=("--no_advertise",) if cut_off else ())
    proxies = [TcpProxy(s.client_port).start() for s in nats.servers] if cut_off else []
    servers: list[ShardetcdProcess] = []
    api = None
    followers: list[Follower] = []
    try:
        writer_nats = SimpleNamespace(urls=",".join(f"nats://127.0.0.1:{p.port}" for p in proxies)) if cut_off else nats
        writer = server_on(writer_nats, tmp_path / "writer").start()
        servers.append(writer)
        following = "--follow" in standby_flags  # serves as a follower until it takes over
        standby = server_on(nats, tmp_path / "standby", *standby_flags).start(wait=following)
        servers.append(standby)
        # configmaps bypass the watch cache: their watch is an etcd watch that kube-apiserver's
        # etcd client must resume on the other endpoint; pods go through the cache
        api = start_kube_apiserver(tmp_path, [writer.client_url, standby.client_url],
                                   extra_args=["--watch-cache-sizes=configmaps#0"])
        assert standby.running() and standby.answers_range(timeout=5 if following else 0.5) == following, \
            "a standby serves only as a follower"
        c = api.client

        c.call("POST", "/api/v1/namespaces", {"metadata": {"name": NS}}, expect=201)
        cm_start = c.call("GET", CM, expect=200)["metadata"]["resourceVersion"]
        pod_start = c.call("GET", PODS, expect=200)["metadata"]["resourceVersion"]
        cm_watch = Follower(c, CM, cm_start)
        pod_watch = Follower(c, PODS, pod_start)
        followers += [cm_watch, pod_watch]
        cm_writes: list[tuple[str, str, int]] = []
        pod_writes: list[tuple[str, str, int]] = []
        current: dict[str, dict] = {}  # path -> the object as last written

        def create(path: str, body: dict, log: list | None) -> dict:
            obj = c.call("POST", path, body, expect=201)
            current[f"{path}/{obj['metadata']['name']}"] = obj
            if log is not None:
                log.append(("ADDED", obj["metadata"]["name"], rv(obj)))
            return obj

        def update(path: str, obj: dict, log: list | None, **changes) -> dict:
            new = c.call("PUT", f"{path}/{obj['metadata']['name']}", {**obj, **changes}, expect=200)
            assert rv(new) > rv(obj)
            current[f"{path}/{new['metadata']['name']}"] = new
            if log is not None:
                log.append(("MODIFIED", new["metadata"]["name"], rv(new)))
            return new

        def pod(i: int, node: str | None) -> dict:
            spec = {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
            if node:
                spec["nodeName"] = node
            return {"metadata": {"name": f"pod-{i}"}, "spec": spec}

        # -- before the kill --
        for i in range(4):
            create(CM, {"metadata": {"name": f"cm-{i}"}, "data": {"i": str(i)}}, cm_writes)
        cm1_before = current[f"{CM}/cm-1"]
        update(CM, cm1_before, cm_writes, data={"i": "1", "updated": "before"})
        for i, node in enumerate(["node-1", "node-1", None]):
            create(PODS, pod(i, node), pod_writes)
        lease = create(LEASES, {"metadata": {"name": "node-1"},
                                "spec": {"holderIdentity": "node-1", "leaseDurationSeconds": 40}}, None)
        for n in range(2):
            lease = update(LEASES, lease, None, spec={**lease["spec"], "leaseDurationSeconds": 41 + n})
        assert cm_watch.take(len(cm_writes)) == cm_writes
        assert pod_watch.take(len(pod_writes)) == pod_writes
        before_kill = dict(current)

        if cut_off:  # a ConfigMap outside the namespace the watches and lists look at, for the reads below
            c.call("POST", "/api/v1/namespaces", {"metadata": {"name": CUT_NS}}, expect=201)
            c.call("POST", CUT_CM, {"metadata": {"name": "probe"}, "data": {"updated": "before"}}, expect=201)

        # -- kill -9 the writer (or cut it off from NATS); the standby takes over --
        if cut_off:
            for proxy in proxies:
                proxy.stall() if stalled else proxy.cut()
        else:
            writer.kill()
        killed = time.monotonic()
        deadline = killed + TAKEOVER_BOUND
        while not standby.answers_range(timeout=1.0) or (following and "took over as the writer" not in standby.log_tail(200)):
            assert standby.running(), f"the standby exited ({standby.returncode}):\n{standby.log_tail()}"
            assert time.monotonic() < deadline, f"the standby did not serve within {TAKEOVER_BOUND}s:\n{standby.log_tail()}"
            time.sleep(0.2)
        serving = time.monotonic() - killed
        # kube-apiserver's etcd client finds the standby: a write nobody watches, retried
        # until it lands (409 AlreadyExists: an earlier attempt landed although unanswered)
        attempts = []
        while True:
            try:  # kube-apiserver answers 504 after its own request timeout (60 s) at most
                status, body = c.request("POST", "/api/v1/namespaces", {"metadata": {"name": f"{NS}-after"}},
                                         timeout=120)
            except OSError as exc:
                status, body = 0, repr(exc)
            attempts.append(status)
            if status in (201, 409):
                break
            assert status == 0 or status >= 500, (status, body)
            assert time.monotonic() < deadline, f"no write through kube-apiserver within {TAKEOVER_BOUND}s: {attempts}"
            time.sleep(0.5)
        writing = time.monotonic() - killed
        if cut_off:
            deposed_writer_answers_no_stale_read(c, standby.endpoint)
            for proxy in proxies:  # the partition heals: the old writer learns it was deposed and stops
                proxy.resume() if stalled else proxy.restore()
            while writer.running():
                assert time.monotonic() < deadline, "the deposed writer did not stop"
                time.sleep(0.2)
            # fail-stop, by whichever it finds first: the lease held by the new writer, or a write it
            # had queued while cut off refused by the journals' fence
            log = writer.log_path.read_text(errors="replace")
            assert writer.returncode == 1 and ("lost the writer lease" in log or
                                               "another writer appended to the stream" in log), writer.log_tail(50)

        # -- every object written before the kill is there, with the same resourceVersion --
        for path, obj in before_kill.items():
            got = c.call("GET", path, expect=200)
            assert (got["metadata"]["uid"], rv(got)) == (obj["metadata"]["uid"], rv(obj)), path
        listed = c.call("GET", CM, expect=200)["items"]
        assert {o["metadata"]["name"]: rv(o) for o in listed} == \
            {o["metadata"]["name"]: rv(o) for p, o in before_kill.items() if p.startswith(CM + "/")}
        listed = c.call("GET", PODS, expect=200)["items"]
        assert {o["metadata"]["name"]: rv(o) for o in listed} == \
            {o["metadata"]["name"]: rv(o) for p, o in before_kill.items() if p.startswith(PODS + "/")}

        # -- writes work again: creates, updates with a pre-kill resourceVersion, deletes --
        status, body = c.request("PUT", f"{CM}/cm-1", {**cm1_before, "data": {"stale": "yes"}})
        assert (status, body["reason"]) == (409, "Conflict"), body
        update(CM, current[f"{CM}/cm-0"], cm_writes, data={"i": "0", "updated": "after"})
        for i in range(4, 6):
            create(CM, {"metadata": {"name": f"cm-{i}"}, "data": {"i": str(i)}}, cm_writes)
        c.call("DELETE", f"{CM}/cm-2", expect=200)
        create(PODS, pod(3, "node-2"), pod_writes)
        update(PODS, current[f"{PODS}/pod-1"], pod_writes,
               metadata={**current[f"{PODS}/pod-1"]["metadata"], "labels": {"after": "takeover"}})
        lease = update(LEASES, lease, None, spec={**lease["spec"], "holderIdentity": "node-1-after"})

        # -- each watch delivers exactly the writes, in order, none missing --
        *_, deleted = cm_watch.take(len(cm_writes) - len(cm_watch.seen) + 1)  # + cm-2's DELETED
        assert deleted[:2] == ("DELETED", "cm-2") and deleted[2] > cm_writes[-1][2], deleted
        cm_writes.append(deleted)  # its resourceVersion is the delete's, which only the watch tells
        pod_watch.take(len(pod_writes) - len(pod_watch.seen))
        assert cm_watch.seen == cm_writes
        assert pod_watch.seen == pod_writes
        for seen in (cm_watch.seen, pod_watch.seen):  # one revision sequence across the takeover
            assert all(a[2] < b[2] for a, b in zip(seen, seen[1:])), seen
        cm_watch.nothing_more()
        pod_watch.nothing_more()
        # ... and a new watch from before all of it replays the same history from the standby
        for path, start, writes in ((CM, cm_start, cm_writes), (PODS, pod_start, pod_writes)):
            replay = Follower(c, path, start)
            followers.append(replay)
            assert replay.take(len(writes)) == writes
            replay.nothing_more()

        assert c.call("GET", f"{LEASES}/node-1", expect=200)["spec"]["holderIdentity"] == "node-1-after"
        print(f"takeover: kill -9 to the standby serving {serving:.1f} s, to a write through kube-apiserver "
              f"{writing:.1f} s ({len(attempts)} attempt(s) {attempts}); "
              f"watch streams reopened: configmaps {cm_watch.reopened}, pods {pod_watch.reopened}")
        assert api.running()
        bad = api.bad_log_lines()
        if cut_off:  # every watch of its cache on the old writer ended with "no leader" (as with etcd), and resumed
            bad = [line for line in bad if not line.endswith(f"watch chan error: {NO_LEADER}")]
        assert bad == [], f"kube-apiserver log {api.log_path}"
    finally:
        for f in followers:
            f.close()
        if api is not None:
            api.stop()
        for s in servers:
            s.kill()
        for proxy in proxies:
            proxy.close()
        nats.stop()


def deposed_writer_answers_no_stale_read(c: KubeClient, new_writer_endpoint: str) -> None:
    """While the old writer is cut off from NATS but still reachable by kube-apiserver: change a
    ConfigMap on the new writer, then read it through kube-apiserver again and again. ConfigMaps
    bypass the watch cache, so each GET is a linearizable read from whichever backend
    kube-apiserver's etcd client picks, the old writer included: it must never answer the
    version from before the change. (The change is made on the new writer directly: through
    kube-apiserver, every update here failed, since kube-apiserver's etcd client sent each
    update's read to one backend and its Txn to the other, the old writer, which cannot commit
    it: etcdserver: request timed out, as on an etcd member cut off from its quorum.)"""
    import grpc

    from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg

    key = b"/registry/configmaps/" + CUT_NS.encode() + b"/probe"
    with grpc.insecure_channel(new_writer_endpoint) as ch:
        kv = pbg.KVStub(ch)
        (old,) = kv.Range(pb.RangeRequest(key=key), timeout=30).kvs
        assert old.value.count(b"before") == 1
        changed = kv.Put(pb.PutRequest(key=key, value=old.value.replace(b"before", b"cutoff")), timeout=30)
    for _ in range(6):
        status, got = c.request("GET", f"{CUT_CM}/probe", timeout=120)
        if status == 200:
            assert (got["data"]["updated"], rv(got)) == ("cutoff", changed.header.revision), \
                f"a stale read through kube-apiserver: {got['metadata']} {got['data']}"
        else:
            assert status >= 500, (status, got)
