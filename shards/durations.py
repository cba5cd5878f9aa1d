"""Go duration strings, as etcd's flags and options take them ("5m", "1h30m", "1.5s", "0")."""
from __future__ import annotations

import re

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def go_duration_s(text: str) -> float:
    """Seconds in a Go duration string; ValueError if Go's time.ParseDuration would refuse it
    (one sign at most, then "0" or parts of a number and a unit each)."""
    body, sign = text, 1.0
    if body[:1] in ("+", "-"):
        sign, body = (-1.0 if body[0] == "-" else 1.0), body[1:]
    if body == "0":
        return 0.0
    pos, total = 0, 0.0
    for m in _PART.finditer(body):
        if m.start() != pos:
            break
        total += float(m[1]) * _UNITS[m[2]]
        pos = m.end()
    if not body or pos != len(body):
        raise ValueError(f"time: invalid duration {text!r}")
    return sign * total
