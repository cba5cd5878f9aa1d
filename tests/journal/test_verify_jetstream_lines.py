"""What `journal verify --journal-url` prints for streams it could not read (no leader). The whole
command against real NATS servers: tests/integration/test_journal_verify_jetstream.py."""
from __future__ import annotations

from journal.verify_jetstream import NO_LEADER, StreamReport, acknowledged_lines, report_lines


def _read(shard: str, last_rev: int) -> StreamReport:
    return StreamReport(shard, f"p_{shard}", 1, 3, messages=3, records=1, first_rev=last_rev, last_rev=last_rev)


def test_a_journal_whose_checkpoints_could_not_be_read_is_not_held_to_what_was_acknowledged():
    pods = _read("pods", 5)
    pods.unread = "checkpoints"
    assert pods.status == "checkpoints unavailable" and not pods.sound
    lines = report_lines([pods])
    assert lines[0].startswith("pods: stream p_pods: checkpoints unavailable, 3 messages") and \
        lines[1] == f"pods: p_pods-checkpoints: unavailable: {NO_LEADER}", lines
    # revision 9 is past what the stream holds: with its checkpoints unread, that is not "gone"
    said, gone = acknowledged_lines([pods, _read("events", 9)], {"default": 9}, "p", {"default": ["pods", "events"]})
    assert not gone and said == ["acknowledged: default: writes up to revision 9 (key acknowledged.default of "
                                 "p-meta); not checked: p_pods-checkpoints unavailable"], said


def test_a_stream_not_read_is_reported_so_and_other_roles_are_still_checked():
    pods = StreamReport("pods", "p_pods", unread="stream")
    assert report_lines([pods]) == [f"pods: stream p_pods: unavailable: {NO_LEADER}"]
    said, gone = acknowledged_lines([pods, _read("events", 4)], {"main": 9, "events": 8}, "p",
                                    {"main": ["pods"], "events": ["events"]})
    assert gone and said[1].endswith("not checked: p_pods unavailable") and \
        said[0].startswith("acknowledged: events: writes up to revision 8") and "are gone" in said[0], said


def test_what_was_acknowledged_is_unknown_when_the_meta_bucket_did_not_answer():
    said, gone = acknowledged_lines([_read("pods", 5)], None, "p")
    assert not gone and said == ["acknowledged: unknown: p-meta did not answer (no leader?)"]
