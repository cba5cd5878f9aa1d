"""How a JetStream journal's publish sorts what NATS answers (retry, storage full,
fenced, refused for good), and a publish whose answer was lost for longer than
JetStream's duplicate window (real three-server NATS)."""
from __future__ import annotations

import asyncio
import logging

import pytest

from journal.jetstream import JetStreamConfig, JetStreamLog, publish_error_kind
from tests.nats_fixture import start_nats_cluster


@pytest.fixture(scope="module")
def nats_cluster(tmp_path_factory):
    cluster = start_nats_cluster(tmp_path_factory.mktemp("nats"), size=3)
    yield cluster
    cluster.stop()


def test_publish_errors_are_sorted():
    from nats.errors import ConnectionReconnectingError, TimeoutError as NatsTimeout
    from nats.js.errors import APIError, NoStreamResponseError, ServiceUnavailableError

    def api(cls, code, err_code, description="x"):
        return cls(code=code, err_code=err_code, description=description)

    assert publish_error_kind(api(ServiceUnavailableError, 503, 10023, "insufficient resources")) == "storage"
    assert publish_error_kind(api(APIError, 500, 10047, "insufficient storage resources available")) == "storage"
    assert publish_error_kind(api(APIError, 400, 10002, "resource limits exceeded for account")) == "storage"
    assert publish_error_kind(api(ServiceUnavailableError, 503, 10077, "maximum bytes exceeded")) == "storage"
    assert publish_error_kind(api(ServiceUnavailableError, 503, 10077, "something else broke")) == "refused"
    assert publish_error_kind(api(APIError, 400, 10054, "message size exceeds maximum allowed")) == "refused"
    assert publish_error_kind(api(APIError, 400, 10071, "wrong last sequence: 7")) == "fenced"
    assert publish_error_kind(api(APIError, 400, 10005, "no suitable peers for placement")) == "transient"
    assert publish_error_kind(api(ServiceUnavailableError, 503, 10008, "JetStream system temporarily unavailable")) == "transient"
    assert publish_error_kind(api(APIError, 409, 10158, "duplicate message id is in process")) == "transient"
    assert publish_error_kind(ServiceUnavailableError()) == "transient"  # a bare 503: no responders
    for exc in (NatsTimeout(), asyncio.TimeoutError(), NoStreamResponseError(), ConnectionReconnectingError()):
        assert publish_error_kind(exc) == "transient", exc
    assert publish_error_kind(ValueError("a bug")) is None


def test_a_publish_answered_after_the_duplicate_window_is_recognised(nats_cluster, tmp_path, caplog, monkeypatch):
    """The first try of a publish is stored but its answer never comes; the retry comes
    after JetStream forgot the message id, so it is refused for the moved tail, not answered
    as a duplicate: the journal finds its own message after the tail, acknowledges it, and
    goes on; the record is in the stream once."""
    import nats

    # the stream's leader stays where it is: a replica that became leader meanwhile may still remember
    # the id (each forgets on its own timer) and answer the retry as a duplicate, also a right answer
    monkeypatch.setattr(JetStreamLog, "leading_server", property(lambda self: None))

    async def go():
        config = JetStreamConfig(urls=tuple(nats_cluster.urls.split(",")), prefix="lost")
        log = await JetStreamLog(config).connect()
        journal = await log.open_journal("j", tmp_path / "j")
        info = await log.js.stream_info(journal.stream)
        info.config.duplicate_window = 1.0
        await log.js.update_stream(info.config)
        real = log.js.publish
        tries = []
        remembered = []  # ids JetStream still had 30 s past the window: the path under test did not run

        async def forgotten(subject: str, msg_id: str) -> bool:
            """Has JetStream forgotten ``msg_id``? A publish under it that expects a last sequence
            the stream cannot have stores nothing either way: a duplicate ack while JetStream
            remembers the id (it checks ids first), "wrong last sequence" once it forgot it."""
            try:
                ack = await real(subject, b"probe", stream=journal.stream, timeout=5,
                                 headers={"Nats-Msg-Id": msg_id, "Nats-Expected-Last-Sequence": "999999"})
            except nats.js.errors.APIError as exc:
                assert exc.err_code == 10071, exc  # wrong last sequence
                return True
            assert ack.duplicate, ack
            return False

        async def answer_lost(*args, **kwargs):
            tries.append(kwargs["headers"]["Nats-Msg-Id"])
            ack = await real(*args, **kwargs)
            if len(tries) == 1:
                # the window changed again, now that the message is stored: a change restarts JetStream's
                # purge timer (nats-server 2.15.1). Once, under the suite's load, the id was still
                # remembered 30 s past a 1 s window set before it was stored; why is not known (perhaps
                # the stream's leader applied that window late).
                again = await log.js.stream_info(journal.stream)
                again.config.duplicate_window = 1.5
                await log.js.update_stream(again.config)
                await asyncio.sleep(1.5)  # JetStream forgets ids on a timer, late under load: wait until it has
                for _ in range(60):
                    if await forgotten(args[0], tries[0]):
                        break
                    await asyncio.sleep(0.5)
                else:
                    remembered.append(tries[0])
                raise nats.errors.TimeoutError
            return ack

        log.js.publish = answer_lost
        await journal.start()
        journal.append(1, 1, b"once")
        await journal.sync()
        journal.append(1, 2, b"next")
        await journal.sync()
        await journal.close()
        await log.close()
        assert not remembered, f"JetStream still remembered {remembered} 30 s past the duplicate window"
        assert tries[0] == tries[1] and len(set(tries)) == 2, tries  # the retry used the same id

        log = await JetStreamLog(config).connect()
        again = await log.open_journal("j", tmp_path / "j2")
        got = [(r.rtype, r.rev, r.payload) for r in again.records()]
        await log.close()
        return got

    with caplog.at_level(logging.WARNING, logger="journal.jetstream"):
        assert asyncio.run(go()) == [(1, 1, b"once"), (1, 2, b"next")]
    assert "journal publish found stored by an earlier try" in caplog.text


def test_a_lease_lives_as_long_as_its_bucket_keeps_entries(nats_cluster, caplog):
    """The writer lease bucket keeps the TTL of the process that made it. A writer started later
    with a longer --journal-lease-ttl renewed on its own, slower cadence: the entry expired between
    renewals (a standby could take over while this writer still counted on the lease for two
    thirds of its TTL). The lease now takes the bucket's TTL, and says so."""
    from journal.leadership import WriterLease

    async def go():
        config = JetStreamConfig(urls=tuple(nats_cluster.urls.split(",")), prefix="ttl")
        first_log = await JetStreamLog(config).connect()
        first = WriterLease(first_log, ttl_s=1.0)
        assert await first.try_acquire()
        await first.release()
        await first_log.close()
        log = await JetStreamLog(config).connect()
        try:
            lease = WriterLease(log, ttl_s=6.0)
            await lease.acquire()
            lease.start_renewing()
            await asyncio.sleep(3.5)  # a renewal every 6 s / 3 comes after the 1 s entry expired
            holder = await lease.holder()
            await lease.release()
            return lease, holder
        finally:
            await log.close()

    caplog.set_level("WARNING", logger="journal.leadership")
    lease, holder = asyncio.run(go())
    assert lease.ttl_s == 1.0 and holder == lease.me
    assert lease.lapses == 0, "the lease lapsed between renewals"
    assert "writer lease TTL is the bucket's bucket=ttl-writer ttl_s=1 asked_ttl_s=6" in caplog.text


def test_a_new_bucket_opened_by_several_journals_at_once_is_read_at_once(nats_cluster, caplog):
    """The journals of a new prefix open its meta bucket together and read a key from it. JetStream
    answered the later creates of the bucket while the first was still being made, before the stream
    had a leader, and their reads then went unanswered for a whole request timeout (2 s, retried:
    "jetstream unavailable, retrying op=get"). One process now opens a bucket one caller at a time;
    none of the five reads waits."""
    async def go():
        log = await JetStreamLog(JetStreamConfig(urls=tuple(nats_cluster.urls.split(",")), prefix="fresh")).connect()
        try:
            return await asyncio.gather(*(log.get_meta(f"released.s{i}") for i in range(5)))
        finally:
            await log.close()

    caplog.set_level("WARNING", logger="journal.jetstream")
    assert asyncio.run(go()) == [None] * 5
    assert "jetstream unavailable" not in caplog.text, caplog.text


def test_a_stream_is_handed_to_the_writers_server_only_by_a_nats_that_takes_a_preferred_leader(nats_cluster,
                                                                                               monkeypatch):
    """A NATS before 2.11 takes the preferred stepdown as a plain one and elects at random, so a
    writer would move its streams' leaders about every minute: ``leading_server`` is None there. On
    the real servers (2.11 or later) it is the server the connection is on, one of the cluster."""
    from nats.aio.client import ServerVersion

    log = JetStreamLog(JetStreamConfig(urls=tuple(nats_cluster.urls.split(",")), replicas=3))
    assert log.leading_server is None  # not connected

    async def go() -> None:
        await log.connect()
        try:
            assert log.leading_server in {s.name for s in nats_cluster.servers}
            for version, takes in (("2.10.22", False), ("2.11.0", True), ("3.0.1", True), ("1.4.1", False)):
                monkeypatch.setattr(type(log.nc), "connected_server_version",
                                    property(lambda _, v=version: ServerVersion(v)))
                assert (log.leading_server is not None) == takes, version
        finally:
            await log.close()

    asyncio.run(go())
