"""A Kubernetes-shaped mix, the way kube-apiserver talks to etcd.

Set-up (once per server, by `prepare`): N pods under /registry/pods/<ns>/,
M node leases under /registry/leases/kube-node-lease/, one LeaseGrant for
events. Then, all at the same time, closed-loop clients of each kind:

  heartbeat   Txn{ mod(node lease) == last seen } then Put, else Range
              (GuaranteedUpdate, as the kubelet's lease renewal produces)
  pod-create  Txn{ mod(key) == 0 } then Put, else Range      (Create)
  pod-update  Txn{ mod(key) == last seen } then Put, else Range
  pod-delete  Txn{ mod(key) == last seen } then DeleteRange, else Range
              (each pod client loops create -> update -> update -> delete)
  event       Put /registry/events/... with the lease attached
  list        paginated List: Range limit 500 over /registry/pods/, then the
              next pages at the first page's revision (latency = all pages)
  count       Range count_only over /registry/pods/ (the apiserver's object counts)
  watch       one Watch per resource prefix (pods, leases, events) with prev_kv;
              values carry their send time, so the report shows the watch
              delivery delay (write sent -> event received) per prefix.
  progress    every `progress_every_s`, each watch stream sends a
              WatchProgressRequest (the watch cache's consistent reads); the
              latency is request -> progress notification
  compact     the apiserver's compaction loop, every `compact_every_s`:
              Txn{ version(compact_rev_key) == last } then Put(compact_rev_key)
              else Range, then Compact to the revision seen one period before
"""
from __future__ import annotations

import asyncio
import struct
import time
from array import array
from collections import Counter, defaultdict

import grpc

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg

from .loadgen import KV_PUT, KV_RANGE, KV_TXN, WATCH, Window, my_share, now, open_channels, ready, value_bytes, wait_until

PODS = b"/registry/pods/"
LEASES = b"/registry/leases/kube-node-lease/"
EVENTS = b"/registry/events/"
STAMP = struct.Struct("<d")


def prefix_end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


def pod_key(i: int) -> bytes:
    return PODS + f"ns-{i % 20}/pod-{i:06d}".encode()


def node_key(i: int) -> bytes:
    return LEASES + f"node-{i:05d}".encode()


def prepare(target: str, p: dict) -> dict:
    """Populate pods and node leases, grant the events lease. Sync gRPC, in the parent.
    `p`: the scenario's parameters resolved for the mode (scenarios.in_mode)."""
    npods, nnodes = p["pods"], p["nodes"]
    pod_val, lease_val = value_bytes(p["pod_bytes"], 1), value_bytes(p["lease_bytes"], 2)
    with grpc.insecure_channel(target) as ch:
        kv, lease = pbg.KVStub(ch), pbg.LeaseStub(ch)
        for keys, val in (([pod_key(i) for i in range(npods)], pod_val), ([node_key(i) for i in range(nnodes)], lease_val)):
            for b in range(0, len(keys), 100):
                kv.Txn(pb.TxnRequest(success=[pb.RequestOp(request_put=pb.PutRequest(key=k, value=val))
                                              for k in keys[b:b + 100]]), timeout=60)
        lease_id = lease.LeaseGrant(pb.LeaseGrantRequest(TTL=3600), timeout=30).ID
    return {"lease": lease_id, "pods": npods, "nodes": nnodes}


def _txn(key: bytes, mod: int, then: pb.RequestOp) -> pb.TxnRequest:
    return pb.TxnRequest(
        compare=[pb.Compare(key=key, target=pb.Compare.MOD, result=pb.Compare.EQUAL, mod_revision=mod)],
        success=[then], failure=[pb.RequestOp(request_range=pb.RangeRequest(key=key))])


def _mod_after(resp: pb.TxnResponse) -> int:
    """The key's mod revision after this guarded write (or as found, if the compare failed)."""
    if resp.succeeded:
        return resp.header.revision
    kvs = resp.responses[0].response_range.kvs
    return kvs[0].mod_revision if kvs else 0


async def run_k8s(job: dict, wi: int, wn: int, conn) -> dict:
    p, setup = job["params"], job["setup"]
    clients = p["clients"]
    chans = await open_channels(job["target"], 2)
    txn = [c.unary_unary(KV_TXN, response_deserializer=pb.TxnResponse.FromString) for c in chans]
    put = [c.unary_unary(KV_PUT) for c in chans]
    rng = [c.unary_unary(KV_RANGE, response_deserializer=pb.RangeResponse.FromString) for c in chans]
    rng_raw = [c.unary_unary(KV_RANGE) for c in chans]
    lat: dict[str, list] = defaultdict(list)
    errors: Counter = Counter()
    conflicts: Counter = Counter()
    total = [0]
    pod_pad, lease_pad, ev_pad = (value_bytes(p[k] - STAMP.size, 3) for k in ("pod_bytes", "lease_bytes", "event_bytes"))

    # node lease mod revisions, as an informer would know them
    r = await rng[0](pb.RangeRequest(key=LEASES, range_end=prefix_end(LEASES)).SerializeToString())
    node_mod = {kv.key: kv.mod_revision for kv in r.kvs}
    nnodes = setup["nodes"]

    async def timed(name: str, coro_fn):
        """Run one operation, record its latency if it started in the window."""
        t0 = now()
        try:
            out = await coro_fn()
        except grpc.aio.AioRpcError as exc:
            errors[f"{name}:{exc.code().name}"] += 1
            await asyncio.sleep(0.01)
            return None
        if t0 >= win.start:
            lat[name].append(now() - t0)
        total[0] += 1
        return out

    async def heartbeat(g: int) -> None:
        mine = [node_key(i) for i in range(g, nnodes, clients["heartbeat"])]
        ops = {k: _txn(k, node_mod.get(k, 0), pb.RequestOp(request_put=pb.PutRequest(key=k))) for k in mine}
        call = txn[g % 2]
        await wait_until(win.t0)
        while now() < win.end:
            for k in mine:
                req = ops[k]
                req.compare[0].mod_revision = node_mod.get(k, 0)
                req.success[0].request_put.value = STAMP.pack(now()) + lease_pad
                resp = await timed("heartbeat", lambda: call(req.SerializeToString()))
                if resp is not None:
                    if not resp.succeeded:
                        conflicts["heartbeat"] += 1
                    node_mod[k] = _mod_after(resp)
                if now() >= win.end:
                    break

    async def pod_churn(g: int) -> None:
        call = txn[g % 2]
        await wait_until(win.t0)
        i = 0
        while now() < win.end:
            key = PODS + f"churn/p-{g:03d}-{i:07d}".encode()
            i += 1
            mod = 0
            for step in ("pod-create", "pod-update", "pod-update", "pod-delete"):
                if step == "pod-delete":
                    then = pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=key))
                else:
                    then = pb.RequestOp(request_put=pb.PutRequest(key=key, value=STAMP.pack(now()) + pod_pad))
                req = _txn(key, mod, then).SerializeToString()
                resp = await timed(step, lambda: call(req))
                if resp is None:
                    break
                if not resp.succeeded:
                    conflicts[step] += 1
                mod = _mod_after(resp)

    async def event(g: int) -> None:
        call = put[g % 2]
        await wait_until(win.t0)
        i = 0
        while now() < win.end:
            req = pb.PutRequest(key=EVENTS + f"bench/ev-{g:03d}-{i:08d}".encode(),
                                value=STAMP.pack(now()) + ev_pad, lease=setup["lease"]).SerializeToString()
            i += 1
            await timed("event", lambda: call(req))

    pages = array("q")

    async def lister(g: int) -> None:
        call = rng[g % 2]
        end = prefix_end(PODS)

        async def list_all():
            resp = await call(pb.RangeRequest(key=PODS, range_end=end, limit=p["list_limit"]).SerializeToString())
            rev, n = resp.header.revision, 1
            while resp.more:
                nxt = resp.kvs[-1].key + b"\0"
                resp = await call(pb.RangeRequest(key=nxt, range_end=end, limit=p["list_limit"], revision=rev).SerializeToString())
                n += 1
            pages.append(n)

        await wait_until(win.t0)
        while now() < win.end:
            await timed("list", list_all)

    async def counter(g: int) -> None:
        call = rng_raw[g % 2]
        req = pb.RangeRequest(key=PODS, range_end=prefix_end(PODS), count_only=True).SerializeToString()
        await wait_until(win.t0)
        while now() < win.end:
            await timed("count", lambda: call(req))

    # watches: one per resource prefix, with prev_kv, on the last worker
    watch_calls = []
    if wi == wn - 1:
        for prefix in (PODS, LEASES, EVENTS):
            call = chans[1].stream_stream(WATCH, response_deserializer=pb.WatchResponse.FromString)()
            await call.write(pb.WatchRequest(create_request=pb.WatchCreateRequest(
                key=prefix, range_end=prefix_end(prefix), prev_kv=True)).SerializeToString())
            assert (await call.read()).created
            watch_calls.append((prefix, call))
    watch_events: Counter = Counter()
    progress_seen = {prefix: asyncio.Event() for prefix, _ in watch_calls}
    progress_req = pb.WatchRequest(progress_request=pb.WatchProgressRequest()).SerializeToString()

    async def progress(prefix: bytes, call) -> None:
        """One WatchProgressRequest at a time; etcd answers only when the stream's watchers are synced."""
        await wait_until(win.t0)
        while now() < win.end:
            seen = progress_seen[prefix]
            seen.clear()
            t0 = now()
            await call.write(progress_req)
            try:
                await asyncio.wait_for(seen.wait(), 2.0)
            except asyncio.TimeoutError:
                errors["progress:no answer in 2 s"] += 1
                continue
            if t0 >= win.start:
                lat["progress"].append(now() - t0)
            await asyncio.sleep(p["progress_every_s"])

    compact_key = b"compact_rev_key"

    async def compactor() -> None:
        """kube-apiserver's compaction loop (storage/etcd3/compact.go's shape)."""
        kv_compact = chans[0].unary_unary("/etcdserverpb.KV/Compact")
        version, prev_rev = 0, 0

        async def cycle():
            nonlocal version, prev_rev
            req = pb.TxnRequest(
                compare=[pb.Compare(key=compact_key, target=pb.Compare.VERSION, result=pb.Compare.EQUAL,
                                    version=version)],
                success=[pb.RequestOp(request_put=pb.PutRequest(key=compact_key, value=str(prev_rev).encode()))],
                failure=[pb.RequestOp(request_range=pb.RangeRequest(key=compact_key))])
            resp = await txn[0](req.SerializeToString())
            if resp.succeeded:
                version += 1
                if prev_rev:
                    await kv_compact(pb.CompactionRequest(revision=prev_rev).SerializeToString())
            else:  # another apiserver compacted: follow its key's version
                kvs = resp.responses[0].response_range.kvs
                version = kvs[0].version if kvs else 0
            prev_rev = resp.header.revision

        # the first cycle (at the window's start) only records a revision, as the apiserver's
        # first tick does; each later one compacts to the revision seen a period before
        await wait_until(win.start)
        while now() < win.end:
            await timed("compact", cycle)
            await asyncio.sleep(p["compact_every_s"])

    async def watcher(prefix: bytes, call) -> None:
        name = "watch " + prefix.decode()
        delays = lat[name]
        while True:
            resp = await call.read()
            if resp is grpc.aio.EOF:
                return
            t = now()
            if not resp.events and not resp.created and not resp.canceled:
                progress_seen[prefix].set()
            for ev in resp.events:
                if win.start <= t < win.end:
                    watch_events[name] += 1
                    if ev.type == 0 and len(ev.kv.value) >= 8:
                        delays.append(t - STAMP.unpack_from(ev.kv.value)[0])

    tasks = []
    for kind, fn in (("heartbeat", heartbeat), ("pod", pod_churn), ("event", event), ("list", lister), ("count", counter)):
        tasks += [fn(g) for g in my_share(clients[kind], wi, wn)]
    win = Window(await ready(conn), job["warmup"], job["duration"])
    cpu0 = time.process_time()
    wtasks = [asyncio.ensure_future(watcher(prefix, c)) for prefix, c in watch_calls]
    tasks += [progress(prefix, c) for prefix, c in watch_calls]
    if wi == 0:
        tasks.append(compactor())
    await asyncio.gather(*tasks)
    await asyncio.sleep(0.5)  # let the watchers drain
    for (_, c), t in zip(watch_calls, wtasks):
        c.cancel()
        t.cancel()
    cpu = time.process_time() - cpu0
    for ch in chans:
        await ch.close()
    return {"ops": {k: array("d", v).tobytes() for k, v in lat.items()}, "errors": dict(errors),
            "conflicts": dict(conflicts), "watch_events": dict(watch_events), "pages": list(pages),
            "total": total[0], "cpu": cpu}
