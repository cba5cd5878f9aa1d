"""tests/chaos_lock.py's checks: a lock answered at a revision where another key is the oldest, a
key not the session's, a revision the member does not have, a fenced write failing while the
session lives, a locker that never got the lock, and an observer naming another than the leader
(or going back, or seeing none) are caught; what faults allow is not."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.chaos_lock import Held, Observed, check_lockers, check_observers, proclaims

NAME = b"/chaos/lock/round1"


def locker(member: str, lease: int, *held: Held) -> SimpleNamespace:
    return SimpleNamespace(member=member, name=NAME, lease=lease, held=list(held), errors=["Lock: UNAVAILABLE: x"],
                           kind="Lock", noun="locks")


def taken(lease: int, revision: int, **kw) -> Held:
    key = NAME + b"/%x" % lease
    return Held(key, revision, **({"oldest": key, "fenced": True} | kw))


def test_locks_taken_in_turn_report_what_was_done():
    lockers = [locker("m0", 0xA, taken(0xA, 10), taken(0xA, 14)), locker("m1", 0xB, taken(0xB, 12))]
    assert check_lockers(lockers, {0xA: True, 0xB: True}, None) == "locks: taken m0 2, m1 1; 3 fenced writes; 0 not read back"


def test_a_lock_answered_where_another_key_is_the_oldest_is_a_finding():
    twice = taken(0xB, 12, oldest=NAME + b"/a")
    with pytest.raises(AssertionError, match="held twice"):
        check_lockers([locker("m0", 0xA, taken(0xA, 10)), locker("m1", 0xB, twice)], {0xA: True, 0xB: True}, None)


def test_a_lock_answer_naming_another_sessions_key_is_a_finding():
    other = Held(NAME + b"/c", 10, oldest=NAME + b"/c", fenced=True)
    with pytest.raises(AssertionError, match="its session's is"):
        check_lockers([locker("m0", 0xA, other)], {0xA: True}, None)


def test_a_lock_answer_at_a_revision_the_member_lacks_is_a_finding_other_unread_ones_are_counted():
    lost = taken(0xA, 99, oldest=None, fenced=None, read_error="OUT_OF_RANGE: etcdserver: mvcc: required revision is a future revision")
    with pytest.raises(AssertionError, match="which it does not have"):
        check_lockers([locker("m0", 0xA, lost)], {0xA: True}, None)
    unread = taken(0xA, 9, oldest=None, fenced=None, read_error="UNAVAILABLE: connection refused")
    assert check_lockers([locker("m0", 0xA, unread)], {0xA: True}, None).endswith("0 fenced writes; 1 not read back")


def test_a_fenced_write_failing_while_the_session_lives_is_a_finding_unless_a_call_before_failed():
    failed = taken(0xA, 10, fenced=False)
    with pytest.raises(AssertionError, match="its session alive"):
        check_lockers([locker("m0", 0xA, failed)], {0xA: True}, None)
    check_lockers([locker("m0", 0xA, failed)], {0xA: False}, None)  # the session expired meanwhile
    check_lockers([locker("m0", 0xA, taken(0xA, 10, fenced=False, after_failed_call=True))], {0xA: True}, None)
    check_lockers([locker("m0", 0xA, taken(0xA, 10, fenced=None))], {0xA: True}, None)  # no answer
    # a Campaign's Proclaim refused as "not leader": nothing read back, still judged
    refused = taken(0xA, 10, oldest=None, fenced=False, read_error="not proclaimed")
    with pytest.raises(AssertionError, match="its session alive"):
        check_lockers([locker("m0", 0xA, refused)], {0xA: True}, None)


def test_a_locker_that_never_got_the_lock_is_a_finding_unless_its_member_was_struck():
    lockers = [locker("m0", 0xA, taken(0xA, 10)), locker("m1", 0xB)]
    with pytest.raises(AssertionError, match="Lock through m1 never got what it asked"):
        check_lockers(lockers, {0xA: True, 0xB: True}, None)
    assert check_lockers(lockers, {0xA: True, 0xB: True}, "m1").startswith("locks: taken m0 1, m1 0")


def observer(member: str, *seen: Observed) -> SimpleNamespace:
    return SimpleNamespace(member=member, name=NAME, seen=list(seen), streams=1, errors=["Observe: UNAVAILABLE: x"])


def said(revision: int, key: bytes, created: int, modified: int, value: bytes = b"v", stream: int = 1, **kw) -> Observed:
    """An answer read back as it names it, unless ``kw`` says otherwise."""
    return Observed(revision, (key, created, modified, value), stream, **({"oldest": (key, modified, value)} | kw))


A, B = NAME + b"/a", NAME + b"/b"


def test_observers_that_name_the_leader_at_each_revision_pass():
    o = observer("m0", said(10, A, 8, 10), said(12, A, 8, 12, b"w"), said(15, B, 11, 11),
                 said(16, A, 16, 16, stream=2))  # a new stream starts afresh
    assert check_observers([o], None) == "observers: answers m0 4 (1 streams); 0 not read back"


@pytest.mark.parametrize("seen, says", [
    ([said(10, A, 8, 10, oldest=(B, 9, b"v"))], "where the oldest key"),  # another key led at that revision
    ([said(10, A, 8, 10, oldest=(A, 9, b"v"))], "where the oldest key"),  # not the value it had there
    ([said(10, A, 8, 11)], "after the answer's revision"),
    ([said(12, A, 8, 12), said(11, A, 8, 11)], "went back"),
    ([said(12, B, 9, 12), said(14, A, 8, 14)], "an older key"),
    ([said(99, A, 8, 10, oldest=None, read_error="OUT_OF_RANGE: etcdserver: mvcc: required revision is a future "
                                                 "revision")], "which it does not have"),
])
def test_an_observer_naming_another_than_the_leader_is_a_finding(seen, says):
    with pytest.raises(AssertionError, match=says):
        check_observers([observer("m0", *seen)], None)


def test_an_observer_that_saw_no_leader_is_a_finding_unless_its_member_was_struck():
    unread = said(10, A, 8, 10, oldest=None, read_error="UNAVAILABLE: connection refused")
    assert check_observers([observer("m0", unread), observer("m1")], "m1").endswith("1 not read back")
    with pytest.raises(AssertionError, match="saw no leader"):
        check_observers([observer("m0", unread), observer("m1")], None)


def test_a_proclamation_speaks_for_its_own_revision_a_new_leader_for_the_answers():
    """etcd's Observe answers a put to the leader's key with the watch response's header, which may
    be later than the put, when the leader may have gone: the put's revision is the one to check."""
    assert said(14, A, 8, 12, proclaimed=True).at == 12
    assert said(14, A, 8, 12).at == 14


def test_a_key_created_again_under_the_same_name_is_a_new_leader_not_a_proclamation():
    """The same lease campaigning again gets a key of the same name: told as the new leader (checked
    at the answer's revision, where the leader between may have gone too), not as a put to the old key."""
    told = said(129, A, 99, 126)
    assert proclaims(told, (A, 99, 130, b"w")) and not proclaims(None, (A, 99, 130, b"w"))
    assert not proclaims(told, (A, 139, 139, b"v")) and not proclaims(told, (B, 99, 130, b"w"))
