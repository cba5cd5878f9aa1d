"""tests/chaos_watch.py's check: each way a watch history can be wrong is caught, and what etcd
allows (a watcher's events lost to compaction, writes of unknown outcome) is not called wrong."""
from __future__ import annotations

import math
import re

import pytest

from tests.chaos_watch import FENCE, Seen, check_watches
from tests.lincheck import Op

KEY = b"/registry/pods/lin/round1"
START, FENCE_REV = 10, 20


def history(*ops: tuple[str, object, object]) -> list:
    """(kind, arg, out) client ops on KEY; out None: outcome unknown."""
    return [(KEY, Op(0, i, math.inf if out is None else i + 0.5, kind, arg, out)) for i, (kind, arg, out) in enumerate(ops)]


def seen(member: str, *events: tuple[int, str, bytes], gaps=()) -> Seen:
    return Seen(member, KEY, [*events, (FENCE_REV, "PUT", FENCE)], list(gaps))


GOOD = [(11, "PUT", b"c0-1"), (12, "DELETE", b""), (15, "PUT", b"c1-1")]
HISTORY = history(("put", "c0-1", True), ("delete", None, True), ("cas", (None, "c1-1"), True))


def check(*watchers: Seen, served=((b"c1-1", 15),), ops=HISTORY) -> int:
    return check_watches(list(watchers), START, FENCE_REV, list(served), ops)


def test_watchers_that_agree_pass_and_the_revisions_are_counted():
    assert check(seen("m0", *GOOD), seen("m1", *GOOD), seen("m2", *GOOD)) == 4


def test_a_gap_from_compaction_excuses_what_it_covers():
    assert check(seen("m0", *GOOD), seen("m1", GOOD[2], gaps=[(10, 14)])) == 4


def test_an_unknown_outcome_may_or_may_not_show():
    ops = HISTORY + history(("put", "c2-9", None))
    assert check(seen("m0", *GOOD), ops=ops) == 4
    assert check(seen("m0", *GOOD[:2], (14, "PUT", b"c2-9"), GOOD[2]), ops=ops) == 5


@pytest.mark.parametrize("watchers, served, says", [
    # two members tell different events at one revision
    ([seen("m0", *GOOD), seen("m1", GOOD[0], (12, "PUT", b"c0-1"), GOOD[2])], [(b"c1-1", 15)], "m0 saw DELETE"),
    # a member missed a revision another saw, with no compaction to excuse it
    ([seen("m0", *GOOD), seen("m1", GOOD[0], GOOD[2])], [(b"c1-1", 15)], "missed revisions [12]"),
    # the gap does not reach the revision it missed
    ([seen("m0", *GOOD), seen("m1", GOOD[2], gaps=[(10, 11)])], [(b"c1-1", 15)], "missed revisions [12]"),
    # out of order, or one revision twice
    ([seen("m0", GOOD[1], GOOD[0], GOOD[2])], [(b"c1-1", 15)], "revisions [12, 11, 15"),
    ([seen("m0", *GOOD, GOOD[2])], [(b"c1-1", 15)], "revisions"),
    # an event from before the watch's start revision
    ([seen("m0", (9, "PUT", b"c0-1"), *GOOD[1:])], [(b"c1-1", 15)], "began at 9"),
    # the events end somewhere else than the members' value
    ([seen("m0", *GOOD)], [(b"c0-1", 11)], "ended in [(b'c1-1', 15)]"),
    ([seen("m0", *GOOD[:2])], [(b"c1-1", 15)], "ended in []"),
    # a value nobody put, a value put once shown twice, an acknowledged put shown nowhere
    ([seen("m0", *GOOD[:2], (14, "PUT", b"c9-9"), GOOD[2])], [(b"c1-1", 15)], "no client put"),
    ([seen("m0", *GOOD[:2], (14, "PUT", b"c1-1"), GOOD[2])], [(b"c1-1", 15)], "put twice"),
    ([seen("m0", *GOOD[1:])], [(b"c1-1", 15)], "acknowledged puts no watcher saw"),
])
def test_a_wrong_history_is_caught(watchers, served, says):
    with pytest.raises(AssertionError, match=re.escape(says)):
        check(*watchers, served=served)


def test_the_fence_must_be_there():
    w = seen("m0", *GOOD)
    w.events[-1] = (FENCE_REV, "PUT", b"other")
    with pytest.raises(AssertionError, match="the fence"):
        check(w)


def test_a_watcher_cancelled_for_another_reason_than_compaction_is_a_finding():
    w = seen("m0", *GOOD)
    w.problems.append("cancelled: 'permission denied'")
    with pytest.raises(AssertionError, match="permission denied"):
        check(w)


def test_when_every_watcher_has_a_gap_an_acknowledged_put_may_be_lost_to_it():
    assert check(seen("m0", *GOOD[1:], gaps=[(10, 10)]), seen("m1", GOOD[2], gaps=[(10, 14)])) == 3


def test_a_prev_kv_must_be_the_state_the_event_before_left():
    def with_prevs(w: Seen, prevs: dict) -> Seen:
        w.prevs.update(prevs)
        return w
    right = {12: (b"c0-1", 11), FENCE_REV: (b"c1-1", 15)}  # 15's prev absent: the key was deleted at 12
    assert check(with_prevs(seen("m0", *GOOD), right)) == 4
    assert check(with_prevs(seen("m0", *GOOD), {12: (b"c0-1", 11)})) == 4  # left out (compacted): allowed
    for wrong in ({11: (b"c0-1", 11)}, {12: (b"c0-1", 10)}, {15: (b"c0-1", 11)}, {FENCE_REV: (b"c0-1", 11)}):
        with pytest.raises(AssertionError, match="prev_kv"):
            check(with_prevs(seen("m0", *GOOD), wrong))
    # behind a gap the event before is not known: not checked
    assert check(seen("m0", *GOOD), with_prevs(seen("m1", GOOD[0], GOOD[2], gaps=[(12, 14)]), {15: (b"x", 1)})) == 4


def test_an_event_at_or_below_a_progress_notification_is_a_finding():
    from proto import kv_pb2, rpc_pb2 as pb
    from tests.chaos_watch import MemberWatch

    w = object.__new__(MemberWatch)  # its bookkeeping only: no stream
    w.seen, w.next = {KEY: Seen("m0", KEY)}, {KEY: START}

    def answer(rev: int) -> pb.WatchResponse:
        return pb.WatchResponse(events=[kv_pb2.Event(kv=kv_pb2.KeyValue(key=KEY, mod_revision=rev, value=b"v"))])

    w._take(KEY, answer(11), progress=10)
    assert not w.seen[KEY].problems
    w._take(KEY, answer(13), progress=13)
    assert w.seen[KEY].problems == ["event at 13 after a progress notification at 13"]
