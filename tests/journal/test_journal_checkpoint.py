from __future__ import annotations

import random
import shutil

import pytest

from journal import (CheckpointConfig, JournalCorrupt, failpoints, load_latest_checkpoint,
                     write_checkpoint)

SMALL_FRAMES = CheckpointConfig(frame_bytes_target=256)


def random_rows(count: int, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.choice([0, 1, 5, 40, 300])) for _ in range(count)]


def test_round_trip_many_rows(tmp_path):
    rows = random_rows(5000)
    path = write_checkpoint(tmp_path, 42, b"meta-bytes", iter(rows), config=SMALL_FRAMES)
    assert path == tmp_path / f"checkpoint-{42:016x}.ckpt"
    loaded = load_latest_checkpoint(tmp_path, config=SMALL_FRAMES)
    assert (loaded.rev, loaded.meta, loaded.path, loaded.row_count) == (42, b"meta-bytes", path, 5000)
    assert list(loaded.rows()) == rows
    assert list(loaded.rows()) == rows  # rows() can be streamed again


def test_default_config_packs_many_rows_per_frame(tmp_path):
    rows = random_rows(3000)
    write_checkpoint(tmp_path, 1, b"", rows)
    assert list(load_latest_checkpoint(tmp_path).rows()) == rows


def test_empty_checkpoint_and_big_rows(tmp_path):
    write_checkpoint(tmp_path / "empty", 0, b"", [])
    empty = load_latest_checkpoint(tmp_path / "empty")
    assert (empty.rev, empty.meta, empty.row_count, list(empty.rows())) == (0, b"", 0, [])
    rows = [b"a" * 1000, b"", b"b" * 3000]
    write_checkpoint(tmp_path / "big", 7, b"m" * 500, rows, config=SMALL_FRAMES)
    assert list(load_latest_checkpoint(tmp_path / "big").rows()) == rows


def test_nothing_to_load(tmp_path):
    assert load_latest_checkpoint(tmp_path / "missing") is None
    assert load_latest_checkpoint(tmp_path) is None


def test_newer_checkpoint_replaces_older(tmp_path):
    first = write_checkpoint(tmp_path, 5, b"old", [b"x"])
    second = write_checkpoint(tmp_path, 9, b"new", [b"y"])
    assert not first.exists() and second.exists()
    assert load_latest_checkpoint(tmp_path).meta == b"new"


def two_checkpoints(tmp_path):
    aside = tmp_path / "aside"
    aside.mkdir()
    older = write_checkpoint(tmp_path, 5, b"old", random_rows(200, seed=5), config=SMALL_FRAMES)
    shutil.copy(older, aside / older.name)
    newer = write_checkpoint(tmp_path, 9, b"new", random_rows(200, seed=9), config=SMALL_FRAMES)
    shutil.copy(aside / older.name, older)
    return older, newer


@pytest.mark.parametrize("keep", [0, 10, 47, 48, "half", -28, -1])
def test_truncated_checkpoint_falls_back_to_older(tmp_path, keep):
    older, newer = two_checkpoints(tmp_path)
    raw = newer.read_bytes()
    cut = len(raw) // 2 if keep == "half" else keep % len(raw) if keep < 0 else keep
    newer.write_bytes(raw[:cut])
    loaded = load_latest_checkpoint(tmp_path, config=SMALL_FRAMES)
    assert (loaded.rev, loaded.meta) == (5, b"old")
    assert list(loaded.rows()) == random_rows(200, seed=5)


def test_all_checkpoints_invalid(tmp_path):
    older, newer = two_checkpoints(tmp_path)
    for path in (older, newer):
        path.write_bytes(path.read_bytes()[:-1])
    assert load_latest_checkpoint(tmp_path) is None


def test_damaged_body_raises_while_streaming(tmp_path):
    path = write_checkpoint(tmp_path, 3, b"meta", random_rows(500), config=SMALL_FRAMES)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    path.write_bytes(bytes(raw))
    loaded = load_latest_checkpoint(tmp_path, config=SMALL_FRAMES)
    with pytest.raises(JournalCorrupt) as info:
        list(loaded.rows())
    assert info.value.path == path


def test_leftover_tmp_files_are_removed(tmp_path):
    write_checkpoint(tmp_path, 1, b"m", [b"r"])
    leftover = tmp_path / f"checkpoint-{2:016x}.ckpt.tmp"
    leftover.write_bytes(b"half written")
    assert load_latest_checkpoint(tmp_path).rev == 1
    assert not leftover.exists()


def test_failed_rename_leaves_previous_checkpoint(tmp_path):
    write_checkpoint(tmp_path, 1, b"first", [b"r"])
    failpoints.arm("checkpoint.before_rename", "raise")
    with pytest.raises(OSError):
        write_checkpoint(tmp_path, 2, b"second", [b"r"])
    failpoints.disarm()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"checkpoint-{1:016x}.ckpt"]
    assert load_latest_checkpoint(tmp_path).meta == b"first"


def test_failure_writing_rows_removes_tmp(tmp_path):
    def rows():
        yield b"ok"
        raise RuntimeError("source failed")

    with pytest.raises(RuntimeError):
        write_checkpoint(tmp_path, 1, b"", rows())
    assert list(tmp_path.iterdir()) == []


def test_row_too_large_is_rejected(tmp_path):
    with pytest.raises(ValueError):
        write_checkpoint(tmp_path, 1, b"", [b"x" * 100], config=CheckpointConfig(record_bytes_max=50))


def rows_in_place(ckpt) -> list[bytes]:
    """What a reader of row_frames reads: each frame's rows unpacked in place."""
    from journal.checkpoint import ROW_LEN

    out = []
    for frame in ckpt.row_frames():
        payload, pos = frame.payload, 0
        assert isinstance(payload, bytes)
        while pos < len(payload):
            (n,) = ROW_LEN.unpack_from(payload, pos)
            out.append(payload[pos + 4:pos + 4 + n])
            pos += 4 + n
        ckpt.check_frame_rows(frame)  # they add up: no error
    ckpt.check_row_count(len(out))
    return out


def test_row_frames_hold_the_rows_in_place(tmp_path):
    rows = random_rows(3000)
    write_checkpoint(tmp_path, 4, b"", rows, config=SMALL_FRAMES)
    ckpt = load_latest_checkpoint(tmp_path, config=SMALL_FRAMES)
    assert rows_in_place(ckpt) == rows
    with pytest.raises(JournalCorrupt, match="trailer says 3000 rows, body holds 2999"):
        ckpt.check_row_count(2999)


@pytest.mark.parametrize("tail, reason", [(b"\x09\x00\x00\x00ab", "row overruns its frame"),
                                          (b"\x01\x00", "row length prefix cut short")])
def test_rows_that_do_not_add_up_to_their_frame(tmp_path, tail, reason):
    """A frame whose CRC holds but whose rows do not add up (a writer's bug): rows() and
    check_frame_rows name the frame."""
    from journal.checkpoint import RTYPE_ROWS
    from journal.reader import iter_frames
    from journal.record import encode_frame

    path = write_checkpoint(tmp_path, 6, b"", random_rows(300), config=SMALL_FRAMES)
    raw = path.read_bytes()
    with open(path, "rb") as f:
        frames = list(iter_frames(f, 0, len(raw), 1 << 20, 1 << 20))
    victim = frames[3]
    assert victim.rtype == RTYPE_ROWS
    bad = encode_frame(RTYPE_ROWS, 6, bytes(victim.payload) + tail)
    path.write_bytes(raw[:victim.offset] + bad + raw[victim.end:])
    ckpt = load_latest_checkpoint(tmp_path, config=SMALL_FRAMES)
    with pytest.raises(JournalCorrupt, match=reason) as info:
        list(ckpt.rows())
    assert info.value.offset == victim.offset
    frame = list(ckpt.row_frames())[2]
    with pytest.raises(JournalCorrupt, match=reason):
        ckpt.check_frame_rows(frame)
