"""``journal verify``'s check for acknowledged revisions that no journal holds and no checkpoint
can (both backends use ``journal.verify.lost_revisions``): each revision is a record in some shard's
journal; one in none was released, and is kept only if a checkpoint of a journal released past it
reaches it."""
from __future__ import annotations

from journal.verify import lost_revisions, runs_text


def test_every_revision_in_some_journal_is_none_lost():
    pods = ({2, 4, 6, 7}, False, 0)
    default = ({3, 5, 8}, False, 0)
    assert lost_revisions([pods, default], 8) == []


def test_a_revision_in_no_journal_that_was_never_released_is_lost():
    """Nothing released, so every revision must be in a journal: 5 is gone (a record deleted inside)."""
    assert lost_revisions([({2, 3, 4}, False, 0), ({6, 7}, False, 0)], 7) == [5]


def test_what_a_checkpoint_of_a_journal_released_past_it_reaches_is_kept():
    """pods released up to its checkpoint at 10 (its records now start at 11): 2..10 are kept."""
    assert lost_revisions([(set(range(11, 21)), True, 10)], 20) == []


def test_a_journal_released_past_its_checkpoint_loses_what_lies_between():
    """pods' checkpoint reaches 10, its records start at 20: 11..19 are gone, and so is an
    acknowledged revision above every record (21, 22)."""
    assert lost_revisions([(set(range(20, 21)), True, 10)], 22) == [*range(11, 20), 21, 22]


def test_a_checkpoint_of_a_journal_that_was_not_released_covers_nothing_of_another():
    """default's checkpoint at 30 says nothing of pods' records: default was never released, so its
    journal still holds all of its own; pods' 11..19 are gone."""
    pods = (set(range(20, 31)), True, 10)
    default = ({31}, False, 30)
    assert lost_revisions([pods, default], 31) == list(range(11, 20))


def test_another_released_journal_whose_checkpoint_reaches_a_revision_hides_its_loss():
    """default released up to 30 (its records start at 31) may have held 11..19 itself: which shard a
    released revision was in is gone with it, so nothing is called lost (the check never guesses)."""
    pods = (set(range(20, 31)), True, 10)
    default = ({31, 32}, True, 30)
    assert lost_revisions([pods, default], 32) == []


def test_lost_revisions_are_shown_as_runs():
    assert runs_text([3, 4, 5, 9]) == "3..5, 9"
    assert runs_text(list(range(1, 40, 2)), shown=2) == "1, 3 and 18 more runs"
