"""The one table from store outcomes to etcd's gRPC status codes and messages.

Messages are etcd 3.5's ``rpctypes`` strings, byte for byte: clients
(kube-apiserver among them) match on them.
"""
from __future__ import annotations

import grpc

from shards import errors as se

# (code, message) of each etcd error we can produce
EMPTY_KEY = (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: key is not provided")
KEY_NOT_FOUND = (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: key not found")
VALUE_PROVIDED = (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: value is provided")
LEASE_PROVIDED = (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: lease is provided")
TOO_MANY_OPS = (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: too many operations in txn request")
DUPLICATE_KEY = (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: duplicate key given in txn request")
INVALID_SORT = (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: invalid sort option")
REQUEST_TOO_LARGE = (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: request is too large")
COMPACTED = (grpc.StatusCode.OUT_OF_RANGE, "etcdserver: mvcc: required revision has been compacted")
FUTURE_REV = (grpc.StatusCode.OUT_OF_RANGE, "etcdserver: mvcc: required revision is a future revision")
LEASE_NOT_FOUND = (grpc.StatusCode.NOT_FOUND, "etcdserver: requested lease not found")
LEASE_EXISTS = (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: lease already exists")
LEASE_TTL_TOO_LARGE = (grpc.StatusCode.OUT_OF_RANGE, "etcdserver: too large lease TTL")
NO_SPACE = (grpc.StatusCode.RESOURCE_EXHAUSTED, "etcdserver: mvcc: database space exceeded")
STOPPED = (grpc.StatusCode.UNAVAILABLE, "etcdserver: server stopped")
MEMBER_NOT_SUPPORTED = (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: not capable")
BAD_LEADER_TRANSFEREE = (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: bad leader transferee")
DOWNGRADE_VERSION_FORMAT = (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: wrong downgrade target version format")
DOWNGRADE_TARGET = (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: invalid downgrade target version")
NO_INFLIGHT_DOWNGRADE = (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: no inflight downgrade job")
UNKNOWN_METHOD = (grpc.StatusCode.UNKNOWN, "etcdserver: unknown method")


def wrong_partition(key: bytes, owner: str, mine: str) -> tuple[grpc.StatusCode, str]:
    """A write to a resource another partition of a `shardetcd cluster` serves (no etcd equivalent)."""
    shown = key.decode("utf-8", "backslashreplace")
    return (grpc.StatusCode.FAILED_PRECONDITION,
            f"shardetcd: key {shown!r} belongs to partition {owner!r}, this endpoint serves partition {mine!r}; "
            "send that resource to its partition (kube-apiserver --etcd-servers-overrides)")


class RequestError(Exception):
    """A request rejected by validation in the gRPC layer."""

    def __init__(self, status: tuple[grpc.StatusCode, str]) -> None:
        super().__init__(status[1])
        self.status = status


_STORE_ERRORS: dict[type, tuple[grpc.StatusCode, str]] = {
    se.CompactedError: COMPACTED,
    se.FutureRevisionError: FUTURE_REV,
    se.LeaseNotFoundError: LEASE_NOT_FOUND,
    se.KeyNotFoundError: KEY_NOT_FOUND,
    se.LeaseExistsError: LEASE_EXISTS,
    se.LeaseTTLTooLargeError: LEASE_TTL_TOO_LARGE,
    se.StoreFailedError: STOPPED,
}


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str] | None:
    if isinstance(exc, RequestError):
        return exc.status
    return _STORE_ERRORS.get(type(exc))
