"""One round of each fault of tests/chaos.py against a JetStream deployment (three NATS
servers, a writer and two following standbys), and of each that applies to the default
deployment (a writer on a local journal, two followers of its data dir), in one fixed order: after each, the
round's history must be linearizable key by key, every member must take a write and a
linearizable read again, serve the same values at the same revisions, exactly one member must be the writer, and `journal
verify` (run while the writer runs) must find the journals sound with nothing lost. Members
come back as following standbys on their old data dirs, so later rounds run on
members that were writers before. Every member stores a checkpoint and releases its
journal every 20 KB of journal, so checkpoints are stored and fetched (by followers that fell
behind a release) all through the faults; and a client writes 9 MiB transactions, each journaled
as a split write, whose keys must be found whole on every member; and every member's watchers
on the round's keys must tell one history (tests/chaos_watch.py), leases kept alive through
every member or left to expire must hold their keys exactly while they live (tests/chaos_lease.py),
and the lock taken and the election won again and again through every member must be held by one
at a time (tests/chaos_lock.py). ``python -m tests.chaos
--minutes N`` runs random rounds for longer (``--journal local``: on the default deployment)."""
from __future__ import annotations

from tests import chaos


def test_one_round_of_each_fault_keeps_every_history_linearizable(tmp_path, capsys):
    """NATS as production runs it (--nats-secure): TLS with client certificates, and a JWT user
    allowed only what a journal needs."""
    assert chaos.main(["--nats-secure", "--faults", ",".join(chaos.FAULTS), "--seed", "0", "--dir", str(tmp_path),
                       "--server-args", "--checkpoint-journal-bytes 20000"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert_every_round_checked(out, chaos.FAULTS)
    verified = [line for line in out if "journal verify: all sound; acknowledged: default: writes up to" in line]
    assert len(verified) == len(chaos.FAULTS), out


def test_one_round_of_each_fault_on_a_local_journal_and_its_followers(tmp_path, capsys):
    """The default deployment: the writer on a local journal, two followers of its data dir."""
    assert chaos.main(["--journal", "local", "--faults", ",".join(chaos.LOCAL_FAULTS), "--seed", "0",
                       "--dir", str(tmp_path), "--server-args", "--checkpoint-journal-bytes 20000"]) == 0
    assert_every_round_checked(capsys.readouterr().out.splitlines(), chaos.LOCAL_FAULTS)


def test_rounds_with_auth_on_over_tls(tmp_path, capsys):
    """Auth on (tests/chaos_auth.py): every call as a user that is not root, with a simple token
    taken again when a restarted member lost it; each round's auth change held on every member.
    Over TLS, as a control plane runs: clients with certificates (--client-cert-auth), and the
    followers calling their writer so."""
    faults = ("kill-writer", "kill-member")
    assert chaos.main(["--journal", "local", "--auth", "--tls", "--faults", ",".join(faults), "--seed", "0",
                       "--dir", str(tmp_path), "--server-args", "--checkpoint-journal-bytes 20000"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert_every_round_checked(out, faults)
    held = [line for line in out if "and its new password held on every member" in line]
    assert [" granted " in line for line in held] == [True, False], out


def assert_every_round_checked(out: list[str], faults) -> None:
    """Every round reported each of its checks (and stored checkpoints, moved large transactions,
    kept leases and saw watch events)."""
    stored = [int(line.rpartition("the writer stored ")[2].split()[0]) for line in out if "the writer stored " in line]
    assert len(stored) == len(faults) and max(stored) > 0, stored
    serving = [line for line in out if "every member took a write and a linearizable read" in line]
    assert len(serving) == len(faults), out
    big = [line for line in out if "large transaction " in line and " acknowledged this round" in line]
    assert len(big) == len(faults) and any(not line.endswith("(0 acknowledged this round)") for line in big), out
    watched = [int(line.split("watches agree: ")[1].split()[0]) for line in out if "watches agree: " in line]
    assert len(watched) == len(faults) and min(watched) > 0, out
    leased = [line for line in out if "dropped gone; keys as their leases on every member" in line]
    assert len(leased) == len(faults) and any(" kept (" in line for line in leased), out
    for noun in ("locks", "elections"):  # fenced writes made holding the lock, or leading
        fenced = [int(line.split("; ")[1].split()[0]) for line in out if f"  {noun}: taken " in line]
        assert len(fenced) == len(faults) and min(fenced) > 0, out
