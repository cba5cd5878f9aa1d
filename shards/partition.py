"""Cluster layout: which Kubernetes resources each *process* serves.

``shardetcd cluster`` runs one shardetcd process per partition, each an
independent etcd endpoint (its own revision sequence), and tells
kube-apiserver which endpoint holds which resource through
``--etcd-servers-overrides``.  A cluster layout is TOML::

    [[partition]]
    name = "leases"
    resources = ["coordination.k8s.io/leases"]

    [[partition]]
    name = "events"
    resources = ["events"]            # core group: no group part
    quota-backend-bytes = 1073741824  # this partition's own NOSPACE limit
    nice = 10                         # yield the CPU to the other partitions under load

    [[partition]]
    name = "main"
    default = true                    # every resource no partition names

Resources are Kubernetes ``group/resource`` names, as kube-apiserver's
overrides flag spells them.  Each is stored under an etcd key prefix
``/registry/<key resource>/``: built-in resources under their resource name
(``coordination.k8s.io/leases`` → ``leases``) except a few kube-apiserver
renames (``nodes`` → ``minions``, ``services`` → ``services/specs``,
``endpoints`` → ``services/endpoints``, ``replicationcontrollers`` →
``controllers``, ``networking.k8s.io/ingresses`` → ``ingress``); resources of
other groups (CRDs, aggregated APIs) under ``group/resource``.  For anything
else, write the prefix out: ``"example.com/widgets=widgets"``.

Without a ``default = true`` partition a default partition named ``main`` is
added.  Ports: ``port = N`` per partition, otherwise the default partition
gets the base port (2379) and the others base+2, base+3, … in file order
(base+1 is etcd's peer port).  ``/registry/masterleases/`` and
``/registry/peerserverleases/`` stay with the default partition: kube-apiserver
writes them through ``--etcd-servers``.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from .errors import LayoutError
from .layout import REGISTRY, Layout, Router, ShardSpec

# groups whose resources kube-apiserver stores under /registry/<resource>/
BUILTIN_GROUPS = frozenset({
    "", "apps", "batch", "autoscaling", "policy", "extensions",
    "admissionregistration.k8s.io", "certificates.k8s.io", "coordination.k8s.io",
    "discovery.k8s.io", "events.k8s.io", "flowcontrol.apiserver.k8s.io",
    "internal.apiserver.k8s.io", "networking.k8s.io", "node.k8s.io",
    "rbac.authorization.k8s.io", "resource.k8s.io", "scheduling.k8s.io",
    "storage.k8s.io", "storagemigration.k8s.io",
})
# built-in resources kube-apiserver stores under another name
RENAMED = {
    ("", "nodes"): "minions",
    ("", "services"): "services/specs",
    ("", "endpoints"): "services/endpoints",
    ("", "replicationcontrollers"): "controllers",
    ("networking.k8s.io", "ingresses"): "ingress",
    ("extensions", "ingresses"): "ingress",
}
DEFAULT_NAME = "main"


@dataclass(frozen=True)
class Resource:
    group: str
    resource: str
    key_resource: str  # the path after /registry/ that holds its keys

    @property
    def override_name(self) -> str:
        """As kube-apiserver's --etcd-servers-overrides spells it: ``group/resource``, ``/resource`` for core."""
        return f"{self.group}/{self.resource}"


@dataclass(frozen=True)
class Partition:
    name: str
    resources: tuple[Resource, ...]
    default: bool = False
    port: int | None = None
    quota_backend_bytes: int | None = None
    nice: int = 0  # CPU niceness of its process: >0 yields the CPU to the others when cores are scarce


@dataclass(frozen=True)
class ClusterLayout:
    partitions: tuple[Partition, ...]  # the default partition is last

    def partition(self, name: str) -> Partition:
        for p in self.partitions:
            if p.name == name:
                return p
        raise LayoutError(f"cluster layout has no partition {name!r} (it has {', '.join(self.names)})")

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.partitions]

    def key_layout(self) -> Layout:
        """The partitions as a key layout (one 'shard' per partition) for routing keys."""
        return Layout(tuple(ShardSpec(p.name, tuple(r.key_resource for r in p.resources)) for p in self.partitions))

    def ports(self, base_port: int) -> dict[str, int]:
        out, nxt = {}, base_port + 2
        for p in self.partitions:
            if p.port is not None:
                out[p.name] = p.port
            elif p.default:
                out[p.name] = base_port
            else:
                out[p.name], nxt = nxt, nxt + 1
        return out

    def apiserver_flags(self, urls: dict[str, list[str]]) -> list[str]:
        """kube-apiserver's --etcd-servers and --etcd-servers-overrides for these partitions."""
        default = self.partitions[-1]
        overrides = [
            f"{r.override_name}#{';'.join(urls[p.name])}"
            for p in self.partitions[:-1]
            for r in p.resources
        ]
        flags = [f"--etcd-servers={','.join(urls[default.name])}"]
        if overrides:
            flags.append(f"--etcd-servers-overrides={','.join(overrides)}")
        return flags


def parse_resource(text: str, source: str) -> Resource:
    name, _, explicit = text.partition("=")
    group, _, resource = name.rpartition("/")
    if not resource or "/" in group or " " in text or "#" in text or "," in text or ";" in text:
        raise LayoutError(f"cluster layout {source}: bad resource {text!r}: want 'resource', 'group/resource' or 'group/resource=key/prefix'")
    if explicit:
        key = explicit.strip("/")
    elif (group, resource) in RENAMED:
        key = RENAMED[(group, resource)]
    elif group in BUILTIN_GROUPS:
        key = resource
    else:
        key = f"{group}/{resource}"
    if not key or key.count("/") > 1:
        raise LayoutError(f"cluster layout {source}: key prefix of {text!r} must be one or two path segments after /registry/")
    return Resource(group, resource, key)


def _partition(i: int, entry: dict, source: str) -> Partition:
    name, default = entry.get("name"), entry.get("default", False)
    if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
        raise LayoutError(f"cluster layout {source}: partition #{i + 1} needs a plain name")
    resources = entry.get("resources", [])
    if not isinstance(resources, list) or (not resources and not default) or not isinstance(default, bool):
        raise LayoutError(f"cluster layout {source}: partition {name!r} needs a non-empty resources list (or default = true)")
    unknown = set(entry) - {"name", "resources", "default", "port", "quota-backend-bytes", "nice"}
    if unknown:
        raise LayoutError(f"cluster layout {source}: partition {name!r} has unknown settings {sorted(unknown)}")
    port, quota = entry.get("port"), entry.get("quota-backend-bytes")
    for what, v in (("port", port), ("quota-backend-bytes", quota)):
        if v is not None and (not isinstance(v, int) or v < 0):
            raise LayoutError(f"cluster layout {source}: partition {name!r}: {what} must be a non-negative integer")
    nice = entry.get("nice", 0)
    if not isinstance(nice, int) or not 0 <= nice <= 19:
        raise LayoutError(f"cluster layout {source}: partition {name!r}: nice must be an integer from 0 to 19")
    return Partition(name, tuple(parse_resource(r, source) for r in resources), default, port, quota, nice)


def parse_cluster_layout(text: str, source: str = "<cluster layout>") -> ClusterLayout:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise LayoutError(f"cluster layout {source} does not parse: {exc}") from None
    entries = doc.get("partition")
    if not isinstance(entries, list) or not entries or set(doc) - {"partition"}:
        raise LayoutError(f"cluster layout {source}: want one or more [[partition]] tables and nothing else")
    parts = [_partition(i, e, source) for i, e in enumerate(entries)]
    defaults = [p for p in parts if p.default]
    if len(defaults) > 1:
        raise LayoutError(f"cluster layout {source}: more than one partition has default = true")
    if not defaults:
        defaults = [Partition(DEFAULT_NAME, (), True)]
    named = [p for p in parts if not p.default]
    ordered = (*named, defaults[0])
    _check_unique(ordered, source)
    return ClusterLayout(ordered)


def _check_unique(parts, source: str) -> None:
    names, keys, ports = set(), {}, set()
    for p in parts:
        if p.name in names:
            raise LayoutError(f"cluster layout {source}: partition name {p.name!r} is repeated")
        names.add(p.name)
        if p.port is not None:
            if p.port in ports:
                raise LayoutError(f"cluster layout {source}: port {p.port} is given twice")
            ports.add(p.port)
        for r in p.resources:
            if r.key_resource in keys and keys[r.key_resource] != p.name:
                raise LayoutError(f"cluster layout {source}: /registry/{r.key_resource}/ is in partitions {keys[r.key_resource]!r} and {p.name!r}")
            keys[r.key_resource] = p.name


def load_cluster_layout(path: Path) -> ClusterLayout:
    try:
        text = path.read_text()
    except OSError as exc:
        raise LayoutError(f"cluster layout {path}: {exc.strerror}") from None
    return parse_cluster_layout(text, str(path))


def everyones(key: bytes) -> bool:
    """A key that names no resource (``compact_rev_key``, ``/registry/health``): every partition
    keeps its own, as kube-apiserver sends it to each endpoint it uses."""
    return not key.startswith(REGISTRY) or key.find(b"/", len(REGISTRY)) < 0


class PartitionRouter:
    """A key's partition, by index in the layout, or ``EVERY`` for a key each keeps (a snapshot's
    rows into partitions: shards/snapshot.py)."""

    EVERY = 0xFE

    def __init__(self, layout: ClusterLayout) -> None:
        self.router = Router(layout.key_layout())
        self.default = self.router.default

    def shard_for_key(self, key: bytes) -> int:
        return self.EVERY if everyones(key) else self.router.shard_for_key(key)


class PartitionGuard:
    """Answers whether a key may be written on one partition.

    Keys of a resource (``/registry/<resource>/…``) belong to the partition
    that names the resource, or to the default partition.  Keys that name no
    resource (``compact_rev_key``, ``/registry/health``) belong to every
    partition: kube-apiserver sends them to each endpoint it uses.
    """

    def __init__(self, layout: ClusterLayout, mine: str) -> None:
        self.layout = layout
        self.router = Router(layout.key_layout())
        self.mine = layout.names.index(layout.partition(mine).name)

    def owner(self, key: bytes) -> str | None:
        """The partition ``key`` must live on, or None if it is not ours to refuse."""
        if everyones(key):
            return None
        pid = self.router.shard_for_key(key)
        return None if pid == self.mine else self.layout.partitions[pid].name

    def foreign(self, live) -> tuple[bytes, str] | None:
        """A key of ``live`` (a SortedList of this partition's live keys) that the layout gives to
        another partition, with that partition's name; None if there is none. Such keys are what a
        changed layout leaves behind: a resource moved to another partition, whose keys stayed
        here. Only the ranges that can hold one are read: other partitions' resources, and on a
        partition that is not the default one everything outside its own resources (there, in
        an unchanged layout, only the keys every partition keeps)."""
        spans = [(lo, hi) for lo, hi, pid in self.router.intervals if pid != self.mine]
        if self.mine != self.router.default:  # the gaps between its own resources' ranges
            edge = b""
            for lo, hi in sorted((lo, hi) for lo, hi, pid in self.router.intervals if pid == self.mine):
                spans.append((edge, lo))
                edge = hi
                if not edge:  # unbounded: nothing after it
                    break
            else:
                spans.append((edge, b""))
        for lo, hi in spans:
            for key in live.irange(lo, hi or None, inclusive=(True, False)):
                if (owner := self.owner(key)) is not None:
                    return key, owner
        return None
