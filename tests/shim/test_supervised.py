"""A process `shardetcd cluster` spawns (shim/supervised.py): spawned with no fork handler run
(gRPC's could abort the child before exec), it takes its niceness and its parent-death signal
itself, first thing."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from shim.cluster import Child


def state(pid: int) -> str | None:
    """The process's state letter (Z: ended, not reaped), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def niceness(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


forks: list[int] = []
os.register_at_fork(before=lambda: forks.append(os.getpid()))


def test_a_partition_is_spawned_without_running_fork_handlers(tmp_path):
    partition = type("P", (), {"nice": 0, "name": "main"})()
    child = Child(partition, "http://127.0.0.1:1", tmp_path / "d", tmp_path / "main.log",
                  [sys.executable, "-c", "print('started')"])
    before = len(forks)
    child.spawn()
    assert child.proc.wait(30) == 0 and child.new_log() == b"started\n"
    assert len(forks) == before  # a preexec_fn would fork with them (and gRPC's would run in the child)


def test_a_supervised_process_takes_its_niceness_and_ends_with_its_supervisor():
    supervisor = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import subprocess, sys, time
        from shim import supervised
        code = "from shim.supervised import as_supervised; as_supervised(); import time; time.sleep(60)"
        p = subprocess.Popen([sys.executable, "-c", code], env=supervised.environment(3))
        print(p.pid, flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        pid = int(supervisor.stdout.readline())
        deadline = time.monotonic() + 30
        while niceness(pid) != min(19, os.nice(0) + 3):  # set first thing, but after the interpreter starts
            assert time.monotonic() < deadline, niceness(pid)
            time.sleep(0.05)
        supervisor.kill()
        supervisor.wait()
        while state(pid) not in (None, "Z"):
            assert time.monotonic() < deadline, "the supervised process outlived its supervisor"
            time.sleep(0.05)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()



def test_a_serving_process_beats_down_its_pipe_and_a_full_pipe_does_not_stop_its_loop(tmp_path, monkeypatch):
    partition = type("P", (), {"nice": 0, "name": "main"})()
    code = textwrap.dedent("""
        import asyncio
        from shim import supervised
        supervised.as_supervised()

        async def main():
            beating = asyncio.ensure_future(supervised.heartbeat())
            await asyncio.sleep(2.5)
            beating.cancel()

        asyncio.run(main())
    """)
    child = Child(partition, "http://127.0.0.1:1", tmp_path / "d", tmp_path / "main.log", [sys.executable, "-c", code])
    child.spawn()
    child.ready, child.heard_at = True, time.monotonic() - 100  # as if it served long silent
    assert child.proc.wait(30) == 0, child.new_log()
    assert child.silent_for(time.monotonic()) < 1  # it beat
    child.close_beats()
    # a supervisor that reads nothing: the pipe fills, the beats are dropped, the loop goes on
    from shim import supervised

    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        while True:
            os.write(w, b"x" * 65536)
    except BlockingIOError:
        pass
    monkeypatch.setattr(supervised, "heartbeat_fd", w)
    try:
        asyncio.run(asyncio.wait_for(supervised.heartbeat(), 1.5))
        raise AssertionError("the heartbeat ended")
    except TimeoutError:
        pass  # still beating (into a full pipe) when its time was up
    finally:
        os.close(r)
        os.close(w)
