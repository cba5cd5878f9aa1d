"""What a follower reads, whichever backend holds the journal.

A journal opened to follow (``open_journal(..., follow=True)``) is read, never
written.  Two backends implement it: ``journal.jetstream.JetStreamJournal`` (a
stream, from any machine) and ``journal.tail.SegmentTail`` (a writer's local
segment files, on the writer's own machine).  Both give:

    await j.load_checkpoint()        the newest checkpoint (Checkpoint | None)
    await j.catch_up()               read what is stored now: records(), released_before, first_top, cuts_seen
    j.records(after_rev)             what catch_up read, tag > after_rev, whose writer had it acknowledged
    j.held_records()                 what catch_up read beside: stored, not known to be acknowledged yet
    j.acknowledged_if(known)         ... known to be after all (``known(records)``): records() gives it too
    await j.newest_checkpoint_rev()  the newest checkpoint's revision (0: none)
    await j.follow(on_message, on_gap)
                                     every later Message, in order, until cancelled; messages released
                                     before they were read: ``await on_gap(expected, got)`` says whether
                                     the checkpoint loaded covers them, else JournalGap
    await j.close()

Both hand on (records(), follow()) only what the writer had acknowledged when it
was read (DESIGN.md invariant 11): the tail reads up to the durable position and
committed revision its writer publishes; a stream's last message waits for its
writer to tell it was acknowledged (journal/jetstream.py).

``shards.follow.Follower`` applies what they give, whole revisions only.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from journal.record import Record

# ``first_top`` of a read that met messages purged under it and has read no record since: past
# every revision (a checkpoint fetched before the purge does not reach it)
NO_RECORD_AFTER_PURGE = sys.maxsize


@dataclass(unsafe_hash=True, slots=True)  # immutable by convention: a frozen dataclass's __init__ costs ~1.4 µs more
class Message:
    """What a follower is given at once: a batch of records, or a marker."""

    seq: int
    epoch: int  # the writer that published it (JetStream; 0 for local segments)
    records: tuple[Record, ...] = ()
    cut: int | None = None  # a Journal-Cut marker: records of earlier epochs above this are void
    top: int = 0  # the highest record tag in it (0 for markers)
    stored: float = 0.0  # when the journal stored it (unix seconds; 0: not known)
