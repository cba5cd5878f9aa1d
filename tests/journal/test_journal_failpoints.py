from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from journal import failpoints

REPO = Path(__file__).resolve().parents[2]


def test_arm_validates_names_and_actions():
    with pytest.raises(ValueError):
        failpoints.arm("journal.no_such_point", "raise")
    with pytest.raises(ValueError):
        failpoints.arm("journal.before_write", "explode")


def test_hit_is_a_no_op_unless_armed():
    failpoints.hit("journal.before_write")
    failpoints.arm("journal.before_write", "raise")
    with pytest.raises(OSError):
        failpoints.hit("journal.before_write")
    failpoints.hit("checkpoint.before_rename")
    failpoints.disarm("journal.before_write")
    failpoints.hit("journal.before_write")
    assert failpoints.armed() == {}


def test_a_pause_holds_only_the_awaiting_caller_once():
    """pause:S is for awaited points: hit() passes it by (the thread is not held), pause()
    waits S seconds while the loop runs others, on its hit count, then the point is disarmed."""
    import asyncio
    import time

    with pytest.raises(ValueError):
        failpoints.arm("snapshot.restore_between_uploads", "pause")  # seconds wanted
    failpoints.arm("snapshot.restore_between_uploads", "pause:0.3@2")
    try:
        failpoints.hit("snapshot.restore_between_uploads")

        async def run() -> tuple[int, int, float]:
            ticks = 0

            async def tick() -> None:
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0.01)

            ticker = asyncio.ensure_future(tick())
            await asyncio.sleep(0)
            before = ticks
            await failpoints.pause("snapshot.restore_between_uploads")  # the first hit passes, not yielding
            passed = ticks - before
            t0 = time.monotonic()
            await failpoints.pause("snapshot.restore_between_uploads")
            waited = time.monotonic() - t0
            ticker.cancel()
            return passed, ticks - before, waited

        passed, ran, waited = asyncio.run(run())
        assert passed == 0 and ran > 1 and waited >= 0.3, (passed, ran, waited)
        assert "snapshot.restore_between_uploads" not in failpoints.armed()
    finally:
        failpoints.disarm("snapshot.restore_between_uploads")


def test_env_var_exit_kills_the_process_mid_write(tmp_path, reopen_records):
    script = textwrap.dedent(f"""
        import asyncio
        from journal import Journal

        async def main():
            journal = Journal.open({str(tmp_path)!r})
            await journal.start()
            journal.append(1, 1, b"written but never fsynced")
            await journal.sync()
            print("acknowledged")

        asyncio.run(main())
    """)
    env = dict(os.environ, SHARDETCD_FAILPOINTS="journal.after_write_before_fsync=exit")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=60)
    assert done.returncode == failpoints.EXIT_CODE, done.stderr
    assert b"acknowledged" not in done.stdout
    # The write reached the page cache, so the record survives a process crash.
    assert reopen_records(tmp_path) == [(1, 1, b"written but never fsynced")]


def test_malformed_env_spec_is_rejected():
    with pytest.raises(ValueError):
        failpoints._arm_from_env("journal.before_write")
    failpoints._arm_from_env(" journal.before_write = raise , ")
    assert failpoints.armed() == {"journal.before_write": "raise"}
