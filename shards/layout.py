"""Shard layout: which Kubernetes resources each shard owns, and key routing.

A layout file is TOML that a person can read and edit::

    default = "default"          # shard for every key no other shard owns

    [[shard]]
    name = "leases"
    resources = ["leases", "masterleases", "peerserverleases"]

    [[shard]]
    name = "pods"
    resources = ["pods"]

A *resource* is the path after ``/registry/``: ``pods`` owns every key under
``/registry/pods/``; ``apps/deployments`` owns ``/registry/apps/deployments/``.
Keys outside ``/registry/`` and resources no shard names go to the default
shard.  Shard ids are the order of the shards in the file, default last.
"""
from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .errors import LayoutError

REGISTRY = b"/registry/"

DEFAULT_LAYOUT_TOML = """\
# shardetcd default shard layout: hot Kubernetes resources get their own shard.
default = "default"

[[shard]]
name = "leases"
resources = ["leases", "masterleases", "peerserverleases"]

[[shard]]
name = "events"
resources = ["events"]

[[shard]]
name = "pods"
resources = ["pods"]

[[shard]]
name = "nodes"
resources = ["minions"]
"""


@dataclass(frozen=True)
class ShardSpec:
    name: str
    resources: tuple[str, ...]


@dataclass(frozen=True)
class Layout:
    shards: tuple[ShardSpec, ...]  # the default shard is last, with no resources

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.shards]

    def describe(self) -> str:
        """The layout as JSON, ``[[shard, [resource, ...]], ...]``: what routes every key."""
        return json.dumps([[s.name, list(s.resources)] for s in self.shards])

    def fingerprint(self) -> str:
        return hashlib.sha256(self.describe().encode()).hexdigest()[:16]


def partition_layout(name: str) -> Layout:
    """The layout of one ``shardetcd cluster`` partition's process: one shard, named after it."""
    return Layout((ShardSpec(name, ()),))


def parse_layout(text: str, source: str = "<layout>") -> Layout:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise LayoutError(f"shard layout {source} does not parse: {exc}") from None
    default = doc.get("default", "default")
    entries = doc.get("shard", [])
    if not isinstance(default, str) or not isinstance(entries, list):
        raise LayoutError(f"shard layout {source}: 'default' must be a name and [[shard]] a table array")
    specs: list[ShardSpec] = []
    seen_names: set[str] = {default}
    seen_resources: set[str] = set()
    for i, entry in enumerate(entries):
        name, resources = entry.get("name"), entry.get("resources")
        if not isinstance(name, str) or not name or not isinstance(resources, list) or not resources:
            raise LayoutError(f"shard layout {source}: shard #{i + 1} needs a name and a non-empty resources list")
        if name in seen_names or not name.replace("-", "").replace("_", "").isalnum():
            raise LayoutError(f"shard layout {source}: shard name {name!r} is repeated or not a plain name")
        for res in resources:
            if not isinstance(res, str) or not res or res.startswith("/") or res.endswith("/") or res.count("/") > 1:
                raise LayoutError(f"shard layout {source}: bad resource {res!r} in shard {name!r}")
            if res in seen_resources:
                raise LayoutError(f"shard layout {source}: resource {res!r} is listed twice")
            seen_resources.add(res)
        seen_names.add(name)
        specs.append(ShardSpec(name, tuple(resources)))
    specs.append(ShardSpec(default, ()))
    return Layout(tuple(specs))


def load_layout(path: Path | None) -> Layout:
    if path is None:
        return parse_layout(DEFAULT_LAYOUT_TOML, "(built-in)")
    try:
        text = path.read_text()
    except OSError as exc:
        raise LayoutError(f"shard layout {path}: {exc.strerror}") from None
    return parse_layout(text, str(path))


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix``."""
    b = bytearray(prefix)
    while b and b[-1] == 0xFF:
        b.pop()
    if not b:
        return b""
    b[-1] += 1
    return bytes(b)


class Router:
    """Maps keys and key ranges to shard ids."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.default = len(layout.shards) - 1
        self._by_resource: dict[bytes, int] = {}
        self._intervals: list[tuple[bytes, bytes, int]] = []
        for sid, spec in enumerate(layout.shards[:-1]):
            for res in spec.resources:
                self._by_resource[res.encode()] = sid
                p = REGISTRY + res.encode() + b"/"
                self._intervals.append((p, prefix_end(p), sid))

    @property
    def intervals(self) -> list[tuple[bytes, bytes, int]]:
        """(first key, end, shard id) of every resource's key range (the default shard's are the
        rest); an end of b"" is unbounded."""
        return list(self._intervals)

    def shard_for_key(self, key: bytes) -> int:
        if not key.startswith(REGISTRY):
            return self.default
        parts = key[10:].split(b"/", 2)
        if len(parts) >= 3:
            sid = self._by_resource.get(parts[0] + b"/" + parts[1])
            if sid is not None:
                return sid
        if len(parts) >= 2:
            return self._by_resource.get(parts[0], self.default)
        return self.default

    def shards_for_range(self, key: bytes, end: bytes) -> list[int]:
        """Shards that may hold keys in [key, end); ``end == b""`` means unbounded."""
        hit: set[int] = set()
        contained = False
        for lo, hi, sid in self._intervals:
            if key < hi and (not end or lo < end):
                hit.add(sid)
                if lo <= key and end and end <= hi:
                    contained = True
        if not contained:
            hit.add(self.default)
        return sorted(hit)
