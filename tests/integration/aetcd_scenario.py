"""Drive one etcd endpoint with the aetcd client library; print JSON results.

    python aetcd_scenario.py HOST:PORT

Run as a subprocess by test_python_client.py: aetcd ships its own generated
etcd protobuf modules under the same protobuf names as ours (proto/), and the
two cannot be loaded into one process. Bytes are printed as latin-1 strings.
"""

from __future__ import annotations

import asyncio
import json
import sys

import aetcd
import aetcd.exceptions


def s(b: bytes | None) -> str | None:
    return None if b is None else b.decode("latin-1")


def kv(x) -> dict | None:
    if x is None:
        return None
    return {
        "key": s(x.key),
        "value": s(x.value),
        "create_revision": x.create_revision,
        "mod_revision": x.mod_revision,
        "version": x.version,
        "lease": x.lease,
    }


def txn_responses(responses) -> list:
    out = []
    for r in responses:
        if isinstance(r, list):  # a range: [(value, Get), ...]
            out.append({"range": [kv(get) for _, get in r]})
        else:
            which = r.WhichOneof("response")
            body = getattr(r, which)
            if which == "response_put":
                out.append({"put": {"revision": body.header.revision, "prev_kv": kv(body.prev_kv) if body.HasField("prev_kv") else None}})
            elif which == "response_delete_range":
                out.append({"delete": {"deleted": body.deleted, "prev_kvs": [kv(p) for p in body.prev_kvs]}})
            else:
                out.append({"txn": {"succeeded": body.succeeded, "n": len(body.responses)}})
    return out


async def error_of(coro) -> dict:
    try:
        await coro
    except aetcd.exceptions.ClientError as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"error": None}


async def scenario(host: str, port: int) -> dict:
    out: dict = {}
    async with aetcd.Client(host=host, port=port, timeout=10) as c:
        t = c.transactions
        r = await c.put(b"/registry/pods/default/a", b"v1")
        out["put1_rev"] = r.header.revision
        r = await c.put(b"/registry/pods/default/a", b"v2", prev_kv=True)
        out["put2"] = {"rev": r.header.revision, "prev_kv": kv(r.prev_kv)}
        for k, v in [
            (b"/registry/pods/default/b", b"pb"),
            (b"/registry/pods/kube-system/c", b"pc"),
            (b"/registry/leases/kube-node-lease/n1", b"lease"),
            (b"/registry/events/default/e1", b"event"),
            (b"/registry/minions/node1", b"node"),
            (b"/registry/configmaps/default/cm1", b"cm"),
            (b"plain", b"p"),
            (b"\x00" * 8, b"\x00\xff"),
        ]:
            await c.put(k, v)

        g = await c.get(b"/registry/pods/default/a")
        out["get"] = {"rev": g.header.revision, **kv(g)}
        out["get_missing"] = await c.get(b"/registry/pods/default/zzz")
        out["get_binary"] = kv(await c.get(b"\x00" * 8))

        pods = await c.get_prefix(b"/registry/pods/")
        out["get_prefix"] = {"count": pods.count, "more": pods.more, "kvs": [kv(x) for x in pods]}
        desc = await c.get_prefix(b"/registry/", sort_order="descend", sort_target="key", keys_only=True)
        out["get_prefix_desc_keys"] = [(s(x.key), s(x.value)) for x in desc]
        by_mod = await c.get_prefix(b"/registry/", sort_order="descend", sort_target="mod")
        out["get_prefix_by_mod"] = [s(x.key) for x in by_mod]
        rng = await c.get_range(b"/registry/leases/", b"/registry/pods/")
        out["get_range"] = [s(x.key) for x in rng]
        allkv = await c.get_all()
        out["get_all"] = [s(x.key) for x in allkv]

        d = await c.delete(b"/registry/events/default/e1", prev_kv=True)
        out["delete"] = {"deleted": d.deleted, "prev_kv": kv(d.prev_kv), "rev": d.header.revision}
        out["delete_missing"] = await c.delete(b"/registry/events/default/e1")
        dp = await c.delete_prefix(b"/registry/configmaps/", prev_kv=True)
        out["delete_prefix"] = {"deleted": dp.deleted, "prev_kvs": [kv(x) for x in dp]}

        ok, resp = await c.transaction(
            compare=[
                t.value(b"/registry/pods/default/a") == b"v2",
                t.version(b"/registry/pods/default/a") > 1,
                t.create(b"/registry/minions/node1") > 0,
                t.mod(b"/registry/pods/default/b") < 1000,
            ],
            success=[
                t.put(b"/registry/pods/default/a", b"v3", prev_kv=True),
                t.get(b"/registry/pods/", b"/registry/pods0"),
                t.delete(b"/registry/minions/node1", prev_kv=True),
                t.txn(compare=[t.version(b"plain") == 1], success=[t.put(b"plain", b"p2")], failure=[]),
            ],
            failure=[t.put(b"/registry/pods/default/a", b"never")],
        )
        out["txn_success"] = {"succeeded": ok, "responses": txn_responses(resp)}
        ok, resp = await c.transaction(
            compare=[t.value(b"/registry/pods/default/a") == b"v2"],  # it is v3 now
            success=[t.put(b"/registry/pods/default/a", b"never")],
            failure=[
                t.put(b"/registry/leases/kube-node-lease/n1", b"renewed", prev_kv=True),
                t.get(b"/registry/leases/kube-node-lease/n1"),
                t.delete(b"/registry/pods/", b"/registry/pods0"),
            ],
        )
        out["txn_failure"] = {"succeeded": ok, "responses": txn_responses(resp)}
        out["txn_dup_key"] = await error_of(
            c.transaction(compare=[], success=[t.put(b"k", b"1"), t.put(b"k", b"2")], failure=[])
        )
        out["after_txns"] = {"a": await c.get(b"/registry/pods/default/a") is None, "plain": s((await c.get(b"plain")).value)}

        # history through the library: a watch replaying every pod event from revision 2
        events = []
        async for ev in await c.watch_prefix(b"/registry/pods/", start_revision=2, prev_kv=True):
            events.append({"kind": str(ev.kind), "kv": kv(ev.kv), "prev": kv(ev.prev_kv) if ev.prev_kv and ev.prev_kv.key else None})
            if len(events) == 7:
                break
        out["watch_history"] = events

        head = (await c.get(b"plain")).header.revision
        await c.compact(head - 2)
        out["compacted_at"] = head - 2
        out["compact_again"] = await error_of(c.compact(head - 2))
        out["compact_future"] = await error_of(c.compact(head + 10))
        await c.compact(head, physical=True)
        out["after_compact_get"] = s((await c.get(b"/registry/leases/kube-node-lease/n1")).value)
        out["final_rev"] = (await c.get(b"plain")).header.revision
        st = await c.status()
        out["status"] = {"version_35": st.version.startswith("3.5."), "raft_term": st.raft_term > 0, "leader": st.leader is not None}
        members = [m async for m in c.members()]
        out["members"] = [{"name": bool(m.name), "client_urls": list(m.client_urls)} for m in members]
    return out


def main() -> None:
    host, port = sys.argv[1].rsplit(":", 1)
    print(json.dumps(asyncio.run(scenario(host, int(port)))))


if __name__ == "__main__":
    main()
