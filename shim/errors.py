"""The one table from store outcomes to etcd's gRPC status codes and messages.

Messages are etcd 3.5's ``rpctypes`` strings, byte for byte: clients
(kube-apiserver among them) match on them.
"""
from __future__ import annotations

import grpc

from shards import errors as se
from shards.tokens import VerifyOnlyError

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
TIMED_OUT = (grpc.StatusCode.UNAVAILABLE, "etcdserver: request timed out")
LEADER_CHANGED = (grpc.StatusCode.UNAVAILABLE, "etcdserver: leader changed")
NO_LEADER = (grpc.StatusCode.UNAVAILABLE, "etcdserver: no leader")
MEMBER_NOT_SUPPORTED = (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: not capable")
MEMBER_NOT_FOUND = (grpc.StatusCode.NOT_FOUND, "etcdserver: member not found")
MEMBER_BAD_URLS = (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: given member URLs are invalid")
PEER_URL_EXISTS = (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: Peer URLs already exists")
MEMBER_NOT_LEARNER = (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: can only promote a learner member")
# etcd 3.5.1 does not map this one to a gRPC code on MemberRemove: it reaches clients as UNKNOWN
NOT_ENOUGH_STARTED = (grpc.StatusCode.UNKNOWN, "etcdserver: re-configuration failed due to not enough started members")
BAD_LEADER_TRANSFEREE = (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: bad leader transferee")
DOWNGRADE_VERSION_FORMAT = (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: wrong downgrade target version format")
DOWNGRADE_TARGET = (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: invalid downgrade target version")
NO_INFLIGHT_DOWNGRADE = (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: no inflight downgrade job")
UNKNOWN_METHOD = (grpc.StatusCode.UNKNOWN, "etcdserver: unknown method")
# auth, as etcd 3.5.1 answers (tests/integration/test_auth.py compares each with the real binary)
ROOT_USER_NOT_EXIST = (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: root user does not exist")
ROOT_ROLE_NOT_EXIST = (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: root user does not have root role")
USER_EXISTS = (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: user name already exists")
USER_EMPTY = (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: user name is empty")
USER_NOT_FOUND = (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: user name not found")
ROLE_EXISTS = (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: role name already exists")
ROLE_NOT_FOUND = (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: role name not found")
ROLE_EMPTY = (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: role name is empty")
AUTH_FAILED = (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: authentication failed, invalid user ID or password")
PERMISSION_NOT_GIVEN = (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: permission not given")
PERMISSION_DENIED = (grpc.StatusCode.PERMISSION_DENIED, "etcdserver: permission denied")
ROLE_NOT_GRANTED = (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: role is not granted to the user")
PERMISSION_NOT_GRANTED = (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: permission is not granted to the role")
AUTH_NOT_ENABLED = (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: authentication is not enabled")
INVALID_AUTH_TOKEN = (grpc.StatusCode.UNAUTHENTICATED, "etcdserver: invalid auth token")
INVALID_AUTH_MGMT = (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: invalid auth management")
# etcd 3.5.1 hands this one to gRPC unconverted (rpctypes' "revision of auth store is old" is never sent)
AUTH_OLD_REVISION = (grpc.StatusCode.UNKNOWN, "auth: revision in header is old")
# etcd has no gRPC status for this one: it reaches clients as UNKNOWN with the auth package's own text
NO_PASSWORD_USER = (grpc.StatusCode.UNKNOWN, "auth: authentication failed, password was given for no password user")
# what a refused watch create carries as its cancel reason: etcd sends the status's Go error string,
# for a token it does not take the token's error (etcd >= 3.5.6; 3.5.1 said "permission denied" for
# all, and a client could not tell that a new token would do)
WATCH_PERMISSION_DENIED = "rpc error: code = PermissionDenied desc = etcdserver: permission denied"
WATCH_INVALID_AUTH_TOKEN = "rpc error: code = Unauthenticated desc = etcdserver: invalid auth token"
WATCH_AUTH_OLD_REVISION = "rpc error: code = InvalidArgument desc = etcdserver: revision of auth store is old"
WATCH_USER_EMPTY = "rpc error: code = InvalidArgument desc = etcdserver: user name is empty"


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


# a member that follows another writer, asked to write: no etcd equivalent (a member forwards)
NOT_THE_WRITER = "shardetcd: not the writer"

_STORE_ERRORS: dict[type, tuple[grpc.StatusCode, str]] = {
    se.NotTheWriterError: (grpc.StatusCode.UNAVAILABLE, NOT_THE_WRITER),
    se.CompactedError: COMPACTED,
    se.FutureRevisionError: FUTURE_REV,
    se.LeaseNotFoundError: LEASE_NOT_FOUND,
    se.KeyNotFoundError: KEY_NOT_FOUND,
    se.LeaseExistsError: LEASE_EXISTS,
    se.LeaseTTLTooLargeError: LEASE_TTL_TOO_LARGE,
    se.StoreFailedError: STOPPED,
    se.RequestTimeoutError: TIMED_OUT,
    se.LeaderChangedError: LEADER_CHANGED,
    se.StateStoreError: STOPPED,
    se.RootUserNotExistError: ROOT_USER_NOT_EXIST,
    se.RootRoleNotExistError: ROOT_ROLE_NOT_EXIST,
    se.UserExistsError: USER_EXISTS,
    se.UserEmptyError: USER_EMPTY,
    se.UserNotFoundError: USER_NOT_FOUND,
    se.RoleExistsError: ROLE_EXISTS,
    se.RoleNotFoundError: ROLE_NOT_FOUND,
    se.RoleEmptyError: ROLE_EMPTY,
    se.AuthFailedError: AUTH_FAILED,
    se.NoPasswordUserError: NO_PASSWORD_USER,
    se.PermissionNotGivenError: PERMISSION_NOT_GIVEN,
    se.PermissionDeniedError: PERMISSION_DENIED,
    se.RoleNotGrantedError: ROLE_NOT_GRANTED,
    se.PermissionNotGrantedError: PERMISSION_NOT_GRANTED,
    se.AuthNotEnabledError: AUTH_NOT_ENABLED,
    se.InvalidAuthTokenError: INVALID_AUTH_TOKEN,
    se.InvalidAuthMgmtError: INVALID_AUTH_MGMT,
    se.AuthOldRevisionError: AUTH_OLD_REVISION,
    VerifyOnlyError: (grpc.StatusCode.UNKNOWN, "auth: token signing attempted with verify-only key"),
}

# Maintenance's Hash, HashKV, Defragment and Snapshot hand etcd's auth errors
# to gRPC unconverted: clients see UNKNOWN and the auth package's own text.
_UNCONVERTED_AUTH_ERRORS: dict[type, str] = {
    se.UserEmptyError: "auth: user name is empty",
    se.UserNotFoundError: "auth: user not found",
    se.PermissionDeniedError: "auth: permission denied",
    se.InvalidAuthTokenError: "auth: invalid auth token",
}


def unconverted_auth_status(exc: se.AuthError) -> tuple[grpc.StatusCode, str]:
    return grpc.StatusCode.UNKNOWN, _UNCONVERTED_AUTH_ERRORS[type(exc)]


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str] | None:
    if isinstance(exc, RequestError):
        return exc.status
    return _STORE_ERRORS.get(type(exc))
