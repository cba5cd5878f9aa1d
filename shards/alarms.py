"""Alarms (etcd's AlarmStore): NOSPACE and friends, kept across restarts.

Alarms are few and rarely change, so they live in the data dir's
meta.json (written atomically), not in a journal.
"""
from __future__ import annotations

from .datadir import DataDir

NONE, NOSPACE, CORRUPT = 0, 1, 2
NAMES = {NONE: "NONE", NOSPACE: "NOSPACE", CORRUPT: "CORRUPT"}


class AlarmStore:
    def __init__(self, datadir: DataDir) -> None:
        self.datadir = datadir
        self._alarms: set[tuple[int, int]] = {tuple(a) for a in datadir.meta.get("alarms", [])}

    def get(self, alarm: int = NONE) -> list[tuple[int, int]]:
        """(member id, alarm type) pairs, all of them for NONE."""
        return sorted(a for a in self._alarms if alarm == NONE or a[1] == alarm)

    def active(self, alarm: int) -> bool:  # (asked by every write: most often of none)
        return bool(self._alarms) and any(a[1] == alarm for a in self._alarms)

    def activate(self, member_id: int, alarm: int) -> tuple[int, int]:
        entry = (member_id, alarm)
        if entry not in self._alarms:
            self._alarms.add(entry)
            self._save()
        return entry

    def deactivate(self, member_id: int, alarm: int) -> tuple[int, int] | None:
        entry = (member_id, alarm)
        if entry not in self._alarms:
            return None
        self._alarms.discard(entry)
        self._save()
        return entry

    def _save(self) -> None:
        self.datadir.meta["alarms"] = [list(a) for a in sorted(self._alarms)]
        self.datadir.save_meta()
