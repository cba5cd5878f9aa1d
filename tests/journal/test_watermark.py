"""acknowledged_revision: what the last writer of a data dir acknowledged, read from its watermark
while that writer is preempted in an update, or after it died in one."""
from __future__ import annotations

import threading
import zlib

from journal.watermark import COMMITTED_AT, COUNTER_AT, GENERATION_AT, WatermarkWriter, _U64, _crc_at, acknowledged_revision

MEMBER = 7


def published(tmp_path, committed: int) -> WatermarkWriter:
    w = WatermarkWriter(tmp_path / "watermark", shards=2, member_id=MEMBER)
    w.publish_all(3, committed, [(1, 100), (1, 200)])
    return w


def test_a_writer_preempted_in_an_update_is_waited_for(tmp_path):
    """The counter stays odd for a moment, as when the writer's thread is preempted mid-update:
    the reading is the update's, not 0 (unknown), which would pass over the start's check."""
    w = published(tmp_path, 40)
    counter = _U64.unpack_from(w._mm, COUNTER_AT)[0]
    _U64.pack_into(w._mm, COUNTER_AT, counter + 1)  # an update begun
    done = threading.Timer(0.02, w.durable, args=(41, 0, 1, 150))
    w._counter = counter  # (durable() below writes counter + 1, then counter + 2, as the update would)
    done.start()
    try:
        assert acknowledged_revision(tmp_path / "watermark", MEMBER) == 41
    finally:
        done.join()
        w.close()


def test_an_update_its_writer_died_in_counts_when_its_crc_holds(tmp_path):
    w = published(tmp_path, 40)
    counter = _U64.unpack_from(w._mm, COUNTER_AT)[0]
    w.durable(41, 0, 1, 150)  # then the counter put back odd: killed before its last store
    _U64.pack_into(w._mm, COUNTER_AT, counter + 1)
    w.close()
    assert acknowledged_revision(tmp_path / "watermark", MEMBER) == 41


def test_an_update_its_writer_died_in_before_its_crc_is_unknown(tmp_path):
    w = published(tmp_path, 40)
    counter = _U64.unpack_from(w._mm, COUNTER_AT)[0]
    _U64.pack_into(w._mm, COUNTER_AT, counter + 1)
    _U64.pack_into(w._mm, COMMITTED_AT, 41)  # the committed revision stored, the CRC not yet
    crc_at = _crc_at(2)
    assert zlib.crc32(w._mm[GENERATION_AT:crc_at]) != _U64.unpack_from(w._mm, crc_at)[0]
    w.close()
    assert acknowledged_revision(tmp_path / "watermark", MEMBER) == 0


def test_another_data_dirs_watermark_is_unknown(tmp_path):
    published(tmp_path, 40).close()
    assert acknowledged_revision(tmp_path / "watermark", MEMBER) == 40
    assert acknowledged_revision(tmp_path / "watermark", MEMBER + 1) == 0
