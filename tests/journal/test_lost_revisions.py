"""``journal verify``'s check for acknowledged revisions that no journal holds and no checkpoint
can (both backends use ``journal.verify.lost_revisions``): each revision is a write record in some
shard's journal; one in none is kept only if a checkpoint reaches it, of a shard whose records
start past it (released up to that checkpoint, or put there by a restore)."""
from __future__ import annotations

from journal.verify import lost_revisions, runs_text


def test_every_revision_in_some_journal_is_none_lost():
    pods = ({2, 4, 6, 7}, 0)
    default = ({3, 5, 8}, 0)
    assert lost_revisions([pods, default], 8) == []


def test_a_revision_in_no_journal_and_under_no_checkpoint_is_lost():
    """5 is in no journal (a record deleted inside one) and no checkpoint reaches it."""
    assert lost_revisions([({2, 3, 4}, 0), ({6, 7}, 0)], 7) == [5]


def test_what_a_checkpoint_of_a_journal_released_past_it_reaches_is_kept():
    """pods released up to its checkpoint at 10 (its records now start at 11): 2..10 are kept."""
    assert lost_revisions([(set(range(11, 21)), 10)], 20) == []


def test_a_restored_state_is_in_the_checkpoints_alone():
    """A snapshot restored at 40 is every shard's checkpoint at 40 and no journal record: the
    revisions up to it are kept; those written since are in the journals."""
    assert lost_revisions([({41, 43}, 40), ({42}, 40), (set(), 40)], 43) == []


def test_a_journal_released_past_its_checkpoint_loses_what_lies_between():
    """pods' checkpoint reaches 10, its records start at 20: 11..19 are gone, and so is an
    acknowledged revision above every record (21, 22)."""
    assert lost_revisions([({20}, 10)], 22) == [*range(11, 20), 21, 22]


def test_a_checkpoint_above_a_journals_first_record_covers_nothing_before_that_record():
    """default's checkpoint at 30 with its journal's records from 3 on: a revision it did not write
    is not in its checkpoint alone, so pods' 11..19 are gone all the same."""
    pods = (set(range(20, 31)), 10)
    default = ({3, 31}, 30)
    assert lost_revisions([pods, default], 31) == list(range(11, 20))


def test_a_checkpoint_of_a_shard_whose_records_start_past_a_revision_hides_its_loss():
    """default's records start at 31 and its checkpoint is at 30: 11..19 may have been its own,
    released to that checkpoint. Which shard a released revision was in is gone with it, so
    nothing is called lost (the check never guesses)."""
    pods = (set(range(20, 31)), 10)
    default = ({31, 32}, 30)
    assert lost_revisions([pods, default], 32) == []


def test_lost_revisions_are_shown_as_runs():
    assert runs_text([3, 4, 5, 9]) == "3..5, 9"
    assert runs_text(list(range(1, 40, 2)), shown=2) == "1, 3 and 18 more runs"
