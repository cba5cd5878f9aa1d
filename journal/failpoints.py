"""Named failpoints for crash tests.

`hit(name)` is a no-op unless the point is armed. Points are armed from the
SHARDETCD_FAILPOINTS environment variable when this module is imported, e.g.

    SHARDETCD_FAILPOINTS="journal.after_write_before_fsync=exit,checkpoint.before_rename=raise"

or programmatically with arm(name, action) / disarm(name). Actions:
  "exit":  os._exit(70) on the spot (no cleanup, no flush);
  "raise": raise OSError(EIO);
  "sleep:S": hold the calling thread S seconds, once (then the point is disarmed), e.g. to
             keep written bytes in the page cache and not yet fsynced for a while;
  "pause:S": at a point awaited with `pause(name)`, wait S seconds, once, while the event
             loop runs on (`hit` passes it by).
An action may carry a hit count, "exit@25": it fires on the 25th hit, not before.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time

logger = logging.getLogger(__name__)

ENV_VAR = "SHARDETCD_FAILPOINTS"
EXIT_CODE = 70
ACTIONS = ("exit", "raise", "sleep", "pause")
TIMED = ("sleep", "pause")  # the actions that take seconds
POINTS = (
    "journal.before_write",
    "journal.after_write_before_fsync",
    "journal.after_fsync_before_ack",
    "segment.after_create_before_dirsync",
    "jetstream.after_store_before_ack",
    "checkpoint.before_rename",
    "checkpoint.after_rename_before_dirsync",
    "store.between_txn_parts",
    "state.write",
    "snapshot.restore_between_shards",
    "snapshot.restore_between_uploads",  # a restore into JetStream, after a shard's checkpoint went up
    "recovery.follow_after_checkpoints",  # a follower or standby starting: checkpoints fetched, journals not read
    "recovery.follow_journal_read",  # ... one journal read (the first to finish), the others being read
    "recovery.follow_journal_listed",  # ... a JetStream journal of 9 messages or more: its extent known, not read
    "recovery.follow_loading_checkpoints",  # ... journals read, the checkpoints' rows not yet loaded
    "server.before_announce",  # a replicated journal's writer: recovered, not yet saying where it serves
)

_armed: dict[str, str] = {}
_skips: dict[str, int] = {}  # hits to let pass before the action fires


def _due(name: str, pausing: bool) -> str | None:
    """The action armed at ``name`` if it fires at this hit (its hit count reached); only a pause
    when ``pausing`` (pause()), only the others when not (hit())."""
    action = _armed.get(name)
    if action is None or action.startswith("pause:") != pausing:
        return None
    if _skips.get(name, 0) > 0:
        _skips[name] -= 1
        return None
    return action


def hit(name: str) -> None:
    """Trigger the action armed at `name`, if any."""
    if not _armed:  # the per-write path: nothing more when nothing is armed
        return
    action = _due(name, pausing=False)
    if action is None:
        return
    logger.info("failpoint hit name=%s action=%s", name, action)
    if action == "exit":
        os._exit(EXIT_CODE)
    if action.startswith("sleep:"):
        disarm(name)
        time.sleep(float(action[len("sleep:"):]))
        return
    raise OSError(errno.EIO, f"failpoint {name}")


async def pause(name: str) -> None:
    """At an awaited point: wait the seconds of a "pause:S" armed at ``name``, once."""
    action = _due(name, pausing=True)
    if action is None:
        return
    logger.warning("failpoint pausing name=%s action=%s", name, action)  # tests wait for this line
    disarm(name)
    await asyncio.sleep(float(action[len("pause:"):]))


def sleep_armed() -> bool:
    """Is a sleep armed anywhere? (The journal then keeps its writes in its writer thread,
    so a held fsync holds that thread, not the event loop.)"""
    return bool(_armed) and any(a.startswith("sleep:") for a in _armed.values())


def arm(name: str, action: str) -> None:
    action, _, count = action.partition("@")
    if count and (not count.isdigit() or int(count) < 1):
        raise ValueError(f"failpoint {name}: hit count must be a positive integer, got {count!r}")
    if name not in POINTS:
        raise ValueError(f"unknown failpoint {name!r}; known: {', '.join(POINTS)}")
    kind, _, arg = action.partition(":")
    if kind not in ACTIONS or bool(arg) != (kind in TIMED):
        raise ValueError(f"unknown failpoint action {action!r}; known: exit, raise, sleep:SECONDS, pause:SECONDS")
    if arg:
        try:
            float(arg)
        except ValueError:
            raise ValueError(f"failpoint {name}: {kind} wants seconds, got {arg!r}") from None
    _armed[name] = action
    _skips[name] = int(count) - 1 if count else 0


def disarm(name: str | None = None) -> None:
    """Disarm one point, or all of them when name is None."""
    if name is None:
        _armed.clear()
        _skips.clear()
    else:
        _armed.pop(name, None)
        _skips.pop(name, None)


def armed() -> dict[str, str]:
    return dict(_armed)


def _arm_from_env(spec: str) -> None:
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, action = item.partition("=")
        if not sep:
            raise ValueError(f"{ENV_VAR}: expected name=action, got {item!r}")
        arm(name.strip(), action.strip())


_arm_from_env(os.environ.get(ENV_VAR, ""))
