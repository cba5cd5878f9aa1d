"""Named outcomes of the store, one class per etcd error it can produce.

The store raises these; ``shim/errors.py`` maps each to etcd's exact gRPC
status code and message.  Nothing here knows about gRPC.
"""
from __future__ import annotations


class StoreError(Exception):
    """Base class of every expected failure of a store operation."""


class CompactedError(StoreError):
    """A read or compaction asked for a revision at or below the compacted one."""


class FutureRevisionError(StoreError):
    """A read or compaction asked for a revision above the current one."""


class LeaseNotFoundError(StoreError):
    """A put named a lease that does not exist."""


class LeaseExistsError(StoreError):
    """LeaseGrant with an id already in use."""


class LeaseTTLTooLargeError(StoreError):
    """LeaseGrant with a TTL above etcd's maximum."""


class KeyNotFoundError(StoreError):
    """ignore_value / ignore_lease on a key that does not exist."""


class StoreFailedError(StoreError):
    """The store stopped acknowledging writes after an I/O failure (fail-stop)."""


class LayoutError(ValueError):
    """A shard layout file that does not parse or does not make sense."""


class DataDirError(RuntimeError):
    """A data directory this version cannot serve (incompatible or changed layout)."""
