"""The member registry's announce loop stops, although NATS's wait_for may lose the cancel."""
import asyncio

from proto import rpc_pb2 as pb
from shim import members
from shim.members import Registry


class AnswerQueueLog:
    """announce() waits for its answer as nats-py waits for a KV put's: wait_for on a queue."""

    def __init__(self) -> None:
        self.answers: asyncio.Queue = asyncio.Queue()
        self.announced = 0

    async def announce(self, key: str, value: str, ttl_s: float) -> None:
        self.announced += 1
        if self.announced > 1:  # the first is start()'s, answered at once
            await asyncio.wait_for(self.answers.get(), 30)


def test_stop_ends_the_announce_loop_when_an_answer_arrives_with_the_cancel(monkeypatch):
    """Seen in a chaos run: a writer deposed while paused hung stopping, for ever, in
    Registry.stop: the answer to its announce came in the same loop pass as the cancel,
    Python 3.11's wait_for dropped the cancel, and the loop went back to sleep."""
    monkeypatch.setattr(members, "ANNOUNCE_S", 0)

    async def main():
        log = AnswerQueueLog()
        registry = Registry(log, "writer", pb.Member(ID=1, name="m"))
        await registry.start()
        while log.announced < 2:  # the loop is in its second announce, waiting for the answer
            await asyncio.sleep(0)
        log.answers.put_nowait("ack")
        await registry.stop()
        assert registry._task.done()
        announced = log.announced
        await asyncio.sleep(0.05)
        assert log.announced == announced  # no announce after stop

    asyncio.run(asyncio.wait_for(main(), 10))  # a deadline for a hang, not a timing


def test_a_local_journal_member_withdraws_its_entry_when_it_stops(tmp_path):
    """Each server with the default local journal announces itself in a tmpfs directory named
    after the writer's data dir; a clean stop takes its entry away, and the directory with the
    last one (thousands were left behind in /dev/shm by test runs)."""
    from journal.tail import LocalMembers

    async def main():
        writer = Registry(LocalMembers(tmp_path / "data"), "writer", pb.Member(ID=1, name="w"))
        follower = Registry(LocalMembers(tmp_path / "data"), "writer", pb.Member(ID=2, name="f"))
        await writer.start()
        await follower.start()
        directory = writer.log.directory
        assert sorted(p.name for p in directory.iterdir()) == ["writer.1", "writer.2"]
        assert [m.ID for m in await writer.members()] == [1, 2]
        await follower.stop()
        assert [p.name for p in directory.iterdir()] == ["writer.1"]
        await writer.stop()
        assert not directory.exists()

    asyncio.run(asyncio.wait_for(main(), 10))


def test_member_directories_of_killed_members_are_swept(tmp_path):
    """A member that is killed cannot withdraw its entry: the next local member to announce
    removes the directories in which nobody announced for ten TTLs, and only those."""
    import os
    import time

    from journal.tail import sweep_members

    long_ago = time.time() - 3600

    def member_dir(name: str, *entries: str, stale: bool) -> None:
        d = tmp_path / f"shardetcd-0-members-{name}"
        d.mkdir()
        for e in entries:
            (d / e).write_text("{}")
            if stale:
                os.utime(d / e, (long_ago, long_ago))
        if stale:
            os.utime(d, (long_ago, long_ago))

    member_dir("killed", "writer.1", "writer.2", stale=True)
    member_dir("emptied", stale=True)
    member_dir("serving", "writer.1", stale=False)
    member_dir("starting", stale=False)  # made, its first entry not written yet
    (tmp_path / "shardetcd-0-other").mkdir()
    assert sweep_members(tmp_path, "shardetcd-0-members-", stale_s=100) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "shardetcd-0-members-serving", "shardetcd-0-members-starting", "shardetcd-0-other"]
    assert (tmp_path / "shardetcd-0-members-serving" / "writer.1").exists()
