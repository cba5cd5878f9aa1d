"""A follower answers a forwarded call once its effect shows on this member.

A Compact or an auth change answered by the writer leaves a journal record with no revision
of its own: the follower holds the answer until it has read its journals as far as they were
stored when the answer came (``read_as_stored``), so the next call on this member sees a
compacted revision refused or a permission granted, as on the etcd member that applied the
entry before it answered. A Put's answer waits for its revision instead; reads forwarded to
the writer wait for nothing. Every answer carries this member's header (its id and term, the
writer's revision), as etcd fills a header with the member the client called.
"""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import grpc
import pytest

from proto import rpc_pb2 as pb
from shim.follower import forwarding_handlers
from shim.wire import Headers

CALLS = {"etcdserverpb.KV": {"Compact": "unary", "Put": "unary"},
         "etcdserverpb.Auth": {"RoleGrantPermission": "unary", "RoleGet": "unary"}}
TIMEOUT_S = 30.0  # never reached unless a test says so
MEMBER, WRITER = 0x51, 0x99


class Tail:
    """A follower's journal: what the writer has stored, how far this process has read."""

    def __init__(self, stored: int, read: int) -> None:
        self.stored, self.read_tail = stored, read

    async def stored_tail(self) -> int:
        return self.stored


class Aborted(Exception):
    pass


class Context:
    aborted_with = None

    def invocation_metadata(self):
        return ()

    def code(self):  # what the follower's gRPC metrics count an ended call by
        return self.aborted_with

    async def abort(self, code, details):
        self.aborted_with = code
        raise Aborted(code, details)


class Store:
    def __init__(self, tails: list[Tail]) -> None:
        self.shards = [SimpleNamespace(journal=t) for t in tails]
        self.committed = 10
        self.follow_stats = SimpleNamespace(learned=lambda rev: None)
        self.compacted_to: list[int] = []

    async def compacted(self, rev: int) -> None:
        self.compacted_to.append(rev)


def handler(store: Store, answer: bytes, timeout_s: float = TIMEOUT_S):
    async def unary(service, method, request, metadata, **_):
        return answer

    link = SimpleNamespace(store=store, tokens=None, timeout_s=timeout_s, active=True, unary=unary)
    generic = forwarding_handlers(link, Headers(cluster_id=1, member_id=MEMBER, raft_term=2), CALLS)

    def call(service: str, method: str, request: bytes):
        details = SimpleNamespace(method=f"/{service}/{method}", invocation_metadata=())
        found = next(h for g in generic if (h := g.service(details)) is not None)
        return found.unary_unary(request, Context())

    return call


ANSWER = pb.CompactionResponse(header=pb.ResponseHeader(cluster_id=1, member_id=WRITER, revision=10, raft_term=2)
                                ).SerializeToString()  # as the writer sends it
MINE = pb.CompactionResponse(header=pb.ResponseHeader(cluster_id=1, member_id=MEMBER, revision=10, raft_term=2)
                              ).SerializeToString()  # as this member answers it


def run(body) -> None:
    asyncio.run(asyncio.wait_for(body(), 10))  # a deadline for a hang, not a timing


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


@pytest.mark.parametrize("service, method, request_", [
    ("etcdserverpb.KV", "Compact", pb.CompactionRequest(revision=7)),
    ("etcdserverpb.Auth", "RoleGrantPermission", pb.AuthRoleGrantPermissionRequest(name="r")),
])
def test_an_answer_waits_until_every_journal_is_read_as_far_as_it_was_stored(service, method, request_):
    async def body():
        tails = [Tail(stored=5, read=5), Tail(stored=9, read=3), Tail(stored=4, read=1)]
        store = Store(tails)
        task = asyncio.ensure_future(handler(store, ANSWER)(service, method, request_.SerializeToString()))
        await asyncio.sleep(0.05)
        assert not task.done()
        tails[1].read_tail = 9
        await asyncio.sleep(0.05)
        assert not task.done()  # the third journal is not read that far yet
        tails[2].read_tail = 4
        tails[1].stored = 12  # stored after the answer came: not waited for
        assert await task == MINE
        assert store.compacted_to == []  # not a physical compaction

    run(body)


def test_a_physical_compaction_is_answered_once_this_member_has_done_it():
    async def body():
        store = Store([Tail(stored=2, read=2)])
        request = pb.CompactionRequest(revision=7, physical=True).SerializeToString()
        assert await handler(store, ANSWER)("etcdserverpb.KV", "Compact", request) == MINE
        assert store.compacted_to == [7]

    run(body)


@pytest.mark.parametrize("method", ["Put", "RoleGet"])
def test_other_answers_do_not_wait_for_the_journals(method):
    async def body():
        store = Store([Tail(stored=9, read=3)])
        service = "etcdserverpb.KV" if method == "Put" else "etcdserverpb.Auth"
        task = asyncio.ensure_future(handler(store, ANSWER)(service, method, b""))
        await settle()
        assert task.done() and task.result() == MINE

    run(body)


def test_a_journal_not_read_that_far_in_time_is_a_request_timeout():
    async def body():
        store = Store([Tail(stored=9, read=3)])
        request = pb.CompactionRequest(revision=7).SerializeToString()
        with pytest.raises(Aborted) as err:
            await handler(store, ANSWER, timeout_s=0.05)("etcdserverpb.KV", "Compact", request)
        assert err.value.args == (grpc.StatusCode.UNAVAILABLE, "etcdserver: request timed out")

    run(body)


def test_a_journal_whose_stored_tail_nats_does_not_tell_is_a_request_timeout():
    """Seen in chaos (a NATS server paused): the writer compacted, but JetStream did not answer
    this member how far its journals are stored. The answer is etcd's for a proposal whose
    apply its member did not see in time, not an unexpected error."""
    from journal.errors import JournalFailed

    class Unanswered(Tail):
        async def stored_tail(self) -> int:
            raise JournalFailed("JetStream did not answer stream info for 5 s")

    async def body():
        store = Store([Tail(stored=2, read=2), Unanswered(stored=9, read=3)])
        request = pb.CompactionRequest(revision=7).SerializeToString()
        with pytest.raises(Aborted) as err:
            await handler(store, ANSWER)("etcdserverpb.KV", "Compact", request)
        assert err.value.args == (grpc.StatusCode.UNAVAILABLE, "etcdserver: request timed out")

    run(body)


def test_a_token_catch_up_that_nats_does_not_answer_leaves_the_token_unknown():
    """A follower meeting a simple token it does not know catches up with the writer first; when
    JetStream does not answer how far the lease journal is stored, the call goes on with the
    token unknown (the client is asked to authenticate again), as when the catch-up times out."""
    from journal.errors import JournalFailed
    from shards.tokens import SimpleTokens
    from shim.follower import TokenCatchUp

    async def body():
        store = SimpleNamespace(auth=SimpleNamespace(tokens=SimpleTokens()))
        catch_up = TokenCatchUp(SimpleNamespace(timeout_s=TIMEOUT_S), SimpleNamespace(store=store))

        async def unanswered():
            raise JournalFailed("JetStream did not answer stream info for 5 s")

        catch_up._catch_up = unanswered
        await catch_up.learned("abcdefghijklmnop.12")
        assert not store.auth.tokens.known("abcdefghijklmnop.12")

    run(body)


def test_a_follower_presents_the_client_certificate_etcd_would_present(tmp_path):
    """A follower calls an https:// writer as etcd's own client side calls: --client-cert-file and
    --client-key-file when given, else the server's --cert-file and --key-file (kubeadm's etcd
    server certificates are made for both uses), the writer checked against --trusted-ca-file;
    the files are read when a channel is made."""
    from pathlib import Path

    from shim.config import ServerConfig
    from shim.follower import WriterTLS

    ca, cert, key, ccert, ckey = (Path(n) for n in ("ca.pem", "s.pem", "s-key.pem", "c.pem", "c-key.pem"))
    assert WriterTLS.of(ServerConfig(cert_file=cert, key_file=key, trusted_ca_file=ca)) == WriterTLS(ca, cert, key)
    assert WriterTLS.of(ServerConfig(cert_file=cert, key_file=key, trusted_ca_file=ca, client_cert_file=ccert,
                                     client_key_file=ckey)) == WriterTLS(ca, ccert, ckey)
    assert WriterTLS.of(ServerConfig()) == WriterTLS()  # the system's CAs, no certificate
    with pytest.raises(FileNotFoundError):
        WriterTLS(tmp_path / "gone.pem").credentials()
    assert isinstance(WriterTLS().credentials(), grpc.ChannelCredentials)


def test_the_clients_common_name_goes_to_the_writer_only_with_its_secret_over_tls():
    """Over plaintext a forwarded call carries no secret, so the writer would not believe a
    claimed caller: the follower does not send the client's certificate name there at all."""
    from shim.access import FORWARDED_CALLER, FORWARDED_METADATA_MARK, FORWARDED_SECRET
    from shim.follower import WriterLink

    link = WriterLink(log=None, role="writer", store=None)
    metadata = (("token", "t"), (FORWARDED_CALLER, "admin"), FORWARDED_METADATA_MARK)
    assert link.signed(metadata) == (("token", "t"), FORWARDED_METADATA_MARK)
    link.secret = "s3cret"  # read from an https:// writer's record
    assert link.signed(metadata) == (*metadata, (FORWARDED_SECRET, "s3cret"))


def test_calls_in_flight_to_the_writer_end_on_their_own_when_its_address_is_forgotten():
    """Another call's failure makes the link forget the writer's address (look it up again next
    time). Calls still on the old channel are not cancelled by that: a Put completes with the
    writer's answer (cancelled, it would end as if this server were stopping, though the writer
    may apply it) and a stream on it (the lease keep-alives') goes on; the next call looks
    the writer up again."""
    import json

    from shim.follower import WriterLink

    async def body() -> None:
        release = asyncio.Event()
        lookups = []

        async def put(request: bytes, context) -> bytes:
            await release.wait()
            return ANSWER

        async def keepalive(requests, context):
            yield b"first"
            await release.wait()
            yield b"second"

        server = grpc.aio.server()
        server.add_generic_rpc_handlers([
            grpc.method_handlers_generic_handler("etcdserverpb.KV", {"Put": grpc.unary_unary_rpc_method_handler(put)}),
            grpc.method_handlers_generic_handler("etcdserverpb.Lease",
                                                 {"LeaseKeepAlive": grpc.stream_stream_rpc_method_handler(keepalive)})])
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()

        class Log:
            async def get_meta(self, key: str) -> str:
                lookups.append(key)
                return json.dumps({"urls": [f"http://127.0.0.1:{port}"], "member_id": WRITER, "secret": "s"})

        link = WriterLink(Log(), "writer", Store([]), timeout_s=TIMEOUT_S)
        try:
            call = asyncio.ensure_future(link.unary("etcdserverpb.KV", "Put", b"", ()))
            async with link.calling() as channel:  # a stream on the channel, as KeepAlives opens one
                stream = channel.stream_stream("/etcdserverpb.Lease/LeaseKeepAlive")()
                answers = aiter(stream)
                assert await anext(answers) == b"first"
                await asyncio.sleep(0.2)  # the Put has reached the server and waits there
                await link.forget()
                release.set()
                assert await call == ANSWER
                assert await anext(answers) == b"second"
                stream.cancel()
            assert len(lookups) == 1
            release.clear()
            call = asyncio.ensure_future(link.unary("etcdserverpb.KV", "Put", b"", ()))
            await asyncio.sleep(0.2)
            release.set()
            assert await call == ANSWER and len(lookups) == 2
        finally:
            await link.close()
            await server.stop(None)

    run(body)


def test_a_waiting_lock_stays_at_its_writer_until_another_writer_is_recorded(monkeypatch):
    """A Lock waits at the writer as long as its client does. The link forgetting the writer's
    address for another call's sake leaves it be (sent again to the same writer, it would queue
    anew behind later lockers); once the writer record names another writer, the call to the old
    one is cancelled and the same Lock asked of the new one."""
    import json

    from shim import follower
    from shim.follower import WriterLink

    monkeypatch.setattr(follower, "STREAM_CHECK_S", 0.05)
    monkeypatch.setattr(follower, "RECHECK_EVERY_S", 0.0)

    async def body() -> None:
        calls: dict[str, list[str]] = {"old": [], "new": []}
        servers, ports = [], {}
        for name in ("old", "new"):
            async def lock(request: bytes, context, name=name) -> bytes:
                calls[name].append("asked")
                try:
                    await asyncio.Event().wait() if name == "old" else None
                except asyncio.CancelledError:
                    calls[name].append("cancelled")
                    raise
                return b"had at " + name.encode()

            server = grpc.aio.server()
            server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
                "v3lockpb.Lock", {"Lock": grpc.unary_unary_rpc_method_handler(lock)})])
            ports[name] = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            servers.append(server)
        recorded = {"at": "old"}

        class Log:
            async def get_meta(self, key: str) -> str:
                return json.dumps({"urls": [f"http://127.0.0.1:{ports[recorded['at']]}"],
                                   "member_id": WRITER if recorded["at"] == "old" else WRITER + 1})

        link = WriterLink(Log(), "writer", Store([]), timeout_s=TIMEOUT_S)
        try:
            call = asyncio.ensure_future(link.unary("v3lockpb.Lock", "Lock", b"", (), waits=True))
            await asyncio.sleep(0.3)
            await link.forget()  # another call failed: the writer looked up again, the same one
            await asyncio.sleep(0.5)  # ten looks at the record
            assert calls == {"old": ["asked"], "new": []} and not call.done()
            recorded["at"] = "new"
            assert await call == b"had at new"
            assert calls == {"old": ["asked", "cancelled"], "new": ["asked"]}
        finally:
            await link.close()
            for server in servers:
                await server.stop(None)

    run(body)


def test_looking_the_writer_up_again_logs_a_writer_once(caplog):
    """While the writer is down every forwarded call looks it up again (ten times a second, seen
    in chaos); the INFO line naming the writer followed comes once a writer, not once a lookup."""
    import json
    import logging

    from shim.follower import WriterLink

    records = [{"urls": ["http://127.0.0.1:1"], "member_id": 1}] * 3 + [{"urls": ["http://127.0.0.1:2"], "member_id": 2}]

    class Log:
        async def get_meta(self, key: str) -> str:
            return json.dumps(records.pop(0))

    async def body() -> None:
        link = WriterLink(Log(), "writer", None)
        for _ in range(4):
            await link.channel()
            await link.forget()

    with caplog.at_level(logging.INFO, logger="shim.follower"):
        run(body)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO and "following writer" in r.getMessage()]
    assert said == ["following writer target=127.0.0.1:1 member=1", "following writer target=127.0.0.1:2 member=2"]
