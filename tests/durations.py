"""How long each test file took, for scheduling: the suite runs whole files on parallel
workers (``--dist loadfile``), and a long file handed out last leaves one worker running
alone at the end. ``tests/conftest.py`` orders files longest first from
``tests/durations.json``; a file missing from it runs after the known ones, in collection
order. A stale table costs only wall time, never a result. Refresh it from a run's JUnit
report:

    python3 -m pytest --junitxml=/tmp/junit.xml && python3 -m tests.durations /tmp/junit.xml
"""
from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TABLE = Path(__file__).with_name("durations.json")


def load() -> dict[str, float]:
    """Seconds per test file (a path relative to the repository), or nothing if there is no table."""
    try:
        return json.loads(TABLE.read_text())
    except FileNotFoundError:
        return {}


def file_of(classname: str) -> str | None:
    """The test file of a JUnit classname (``tests.x.test_y`` or ``tests.x.test_y.TestClass``)."""
    parts = classname.split(".")
    for n in range(len(parts), 0, -1):
        path = Path(*parts[:n]).with_suffix(".py")
        if (REPO / path).is_file():
            return path.as_posix()
    return None


def from_junit(report: Path) -> dict[str, float]:
    seconds: dict[str, float] = defaultdict(float)
    for case in ET.parse(report).iter("testcase"):
        path = file_of(case.get("classname", ""))
        if path is not None:
            seconds[path] += float(case.get("time", 0))
    return {path: round(s, 1) for path, s in sorted(seconds.items(), key=lambda kv: -kv[1])}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    table = from_junit(Path(argv[0]))
    TABLE.write_text(json.dumps(table, indent=0) + "\n")
    print(f"{TABLE}: {len(table)} files, {sum(table.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
