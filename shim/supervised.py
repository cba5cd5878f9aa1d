"""A process `shardetcd cluster` started sets itself up first thing, before anything else is
imported: the supervisor spawns it without running code between fork and exec (no
``preexec_fn``), so Python spawns it with vfork and no fork handler runs. With a
``preexec_fn`` every spawn is a full fork that runs gRPC's fork handlers in the child, and
when the supervisor's process has gRPC running (the test suite's workers run it in-process),
the child could abort before exec ("Epoll1Poller epoll_wait error: Bad file descriptor",
grpc/grpc#43055) and the partition failed to start."""
from __future__ import annotations

import asyncio
import os
import signal
import sys

ENV = "SHARDETCD_SUPERVISED"  # "<the supervisor's pid>:<niceness to add>[:<heartbeat pipe fd>]"
# a standby that took over and finds its URL still held says this on its standard error, where the
# supervisor reads it and kills the process holding it: the one it took over from (shim/server.py)
URL_HELD = "still held after taking over as the writer"
supervisor: int | None = None  # this process's supervisor, when `shardetcd cluster` started it
heartbeat_fd: int | None = None  # where it says, once a second while it serves, that its event loop runs
HEARTBEAT_S = 1.0


def environment(nice: int, heartbeat_fd: int | None = None) -> dict[str, str]:
    """The environment a supervised process is spawned with (``heartbeat_fd``: the write end of
    a pipe the supervisor reads, passed to the process)."""
    beat = "" if heartbeat_fd is None else f":{heartbeat_fd}"
    return {**os.environ, ENV: f"{os.getpid()}:{nice}{beat}"}


async def heartbeat() -> None:
    """While this process serves, a byte down the supervisor's pipe every HEARTBEAT_S, from the
    event loop: a process whose loop is stuck (or that is stopped) falls silent, and the supervisor
    kills and restarts it (shim/cluster.py). Never blocks: a full pipe (a supervisor that reads
    nothing, stopped itself) drops the beat."""
    while True:
        try:
            os.write(heartbeat_fd, b".")
        except BlockingIOError:
            pass
        except OSError:  # the supervisor is gone: its death signal ends this process
            return
        await asyncio.sleep(HEARTBEAT_S)


def as_supervised() -> None:
    """In a process the supervisor spawned: its niceness, and SIGTERM when the supervisor dies,
    even by SIGKILL (Linux); a supervisor gone already is a SIGTERM now. Nothing otherwise."""
    global supervisor, heartbeat_fd
    given = os.environ.pop(ENV, None)  # not passed on to what this process starts
    if not given:
        return
    supervisor, nice, *beat = (int(part) for part in given.split(":"))
    if beat:
        heartbeat_fd, = beat
        os.set_blocking(heartbeat_fd, False)
        os.set_inheritable(heartbeat_fd, False)  # not passed on either
    if nice:
        os.nice(nice)
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != supervisor:  # it died before the line above: nobody would send it
            os.kill(os.getpid(), signal.SIGTERM)
