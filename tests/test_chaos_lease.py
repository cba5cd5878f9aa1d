"""tests/chaos_lease.py's checks: a kept lease found gone too soon after a renewal, and a lease's
keys present or absent against whether it is alive, are caught; what is allowed is not."""
from __future__ import annotations

import pytest

from tests.chaos_lease import COALESCE_S, check_keeper, check_leases


def test_a_lease_kept_alive_reports_its_renewals():
    answers = [(0.0, 0.1, 10), (1.0, 1.1, 10), (4.0, 4.2, 10), (5.0, 5.1, 10)]
    assert check_keeper(answers) == "kept (4 renewals, longest 3.0 s between)"


def test_a_lease_gone_once_its_renewals_stopped_long_enough_is_allowed():
    answers = [(0.0, 0.1, 10), (1.0, 1.1, 10), (12.0, 12.1, 0)]
    assert check_keeper(answers) == "gone 11.1 s after its last renewal"


def test_a_lease_gone_before_its_ttl_after_a_renewal_is_a_finding():
    answers = [(0.0, 0.1, 10), (1.0, 1.1, 10), (2.0, 2.1, 0)]
    with pytest.raises(AssertionError, match="found gone 1.10 s after a keep-alive answered with TTL 10"):
        check_keeper(answers)
    with pytest.raises(AssertionError, match="found gone 8.80 s"):
        check_keeper([(0.0, 0.1, 10), (1.0, 1.1, 10), (9.7, 9.8, 0)])
    # a follower's answer may come from a renewal up to COALESCE_S older; measured from the
    # keep-alive's sending, not its answer, with the TTL it was answered with
    assert check_keeper([(0.0, 0.1, 10), (1.0, 2.0, 10), (1.0 + 10 - COALESCE_S, 10.1, 0)]).startswith("gone")
    assert check_keeper([(0.0, 0.1, 10), (1.0, 1.1, 3), (3.5, 3.6, 0)]).startswith("gone")


def test_a_leases_keys_are_there_exactly_while_it_is_alive():
    keys = {1: [b"a", b"b"], 2: [b"c"]}
    view = {b"a": [(b"1", 5)], b"b": [(b"1", 5)], b"c": []}
    check_leases({1: True, 2: False}, keys, view)
    for alive, wrong in (({1: False}, "lease 1 gone"), ({2: True}, "lease 2 alive")):
        with pytest.raises(AssertionError, match=wrong):
            check_leases(alive, keys, view)
    with pytest.raises(AssertionError, match=r"\[b'a'\] of"):  # revoked in part
        check_leases({1: True}, keys, {b"a": [(b"1", 5)], b"b": []})
