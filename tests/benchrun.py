"""Run a bench entry point (``python -m bench...``) from a test, and never leave its servers behind.

The bench runs in a process group of its own. However the test ends (its own timeout,
pytest-timeout's exception, a failure), the bench is sent SIGTERM if it is still running
(``bench.runargs.run`` turns that into an exit through the finally blocks that stop its
servers by PID), given time for that, and whatever is still left in its group is killed.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STOP_GRACE_S = 60  # a bench stops each of its servers with a grace of its own


def start_bench(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """``python -m <args>`` in a new process group (its PID), output piped as text."""
    return subprocess.Popen([sys.executable, "-m", *args], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def run_bench(args: list[str], *, timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m <args>``, its output captured; raises subprocess.TimeoutExpired after ``timeout``."""
    proc = start_bench(args, env)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        stop_bench(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def group_members(pgid: int) -> list[int]:
    """PIDs of the live processes in process group ``pgid``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...
        if fields[0] != "Z" and int(fields[2]) == pgid:
            pids.append(int(entry))
    return pids


def stop_bench(proc: subprocess.Popen) -> list[int]:
    """Stop a bench started by ``start_bench``: SIGTERM while it runs, up to STOP_GRACE_S for it
    to stop its servers, then SIGKILL to what is left of its group. Returns the PIDs that had to
    be killed that way (none when the bench cleaned up after itself)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
    left = group_members(proc.pid)
    if left:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left
