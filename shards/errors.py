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


class RequestTimeoutError(StoreError):
    """A request's revision was not committed within the request timeout (the
    journal is slow or, replicated, has no quorum); it may still commit later."""


class LeaderChangedError(StoreError):
    """This process is no longer the writer (another took the writer lease): a
    linearizable read here could miss what the new writer acknowledged."""


class NotTheWriterError(StoreError):
    """A write asked of a store that follows another writer's journals: it applies theirs and
    writes none of its own (a follower hands writes to the writer before they get here)."""


class StateStoreError(StoreFailedError):
    """The in-memory state (RocksDB) failed a read or write: fail-stop, nothing more is served."""


class LayoutError(ValueError):
    """A shard layout file that does not parse or does not make sense."""


class DataDirError(RuntimeError):
    """A data directory this version cannot serve (incompatible or changed layout)."""


class SnapshotError(ValueError):
    """A snapshot file that cannot be restored (not an etcd snapshot, truncated, damaged)."""


class AuthError(StoreError):
    """Base class of the auth store's named outcomes (etcd's ``auth.Err*``)."""


class RootUserNotExistError(AuthError):
    """AuthEnable without a user named root."""


class RootRoleNotExistError(AuthError):
    """AuthEnable while the root user lacks the root role."""


class UserExistsError(AuthError):
    pass


class UserEmptyError(AuthError):
    """An empty user name; also a permission check for a request that named no user (no token)."""


class UserNotFoundError(AuthError):
    pass


class RoleExistsError(AuthError):
    pass


class RoleNotFoundError(AuthError):
    pass


class RoleEmptyError(AuthError):
    pass


class PermissionNotGivenError(AuthError):
    """RoleGrantPermission without a permission."""


class AuthFailedError(AuthError):
    """Authenticate with an unknown user or a wrong password."""


class NoPasswordUserError(AuthError):
    """Authenticate as a user added without a password (or a password change etcd cannot decode)."""


class PermissionDeniedError(AuthError):
    pass


class RoleNotGrantedError(AuthError):
    """UserRevokeRole of a role the user does not have."""


class PermissionNotGrantedError(AuthError):
    """RoleRevokePermission of a range the role does not have."""


class AuthNotEnabledError(AuthError):
    pass


class InvalidAuthTokenError(AuthError):
    """A token that is malformed, unknown, expired or revoked."""


class AuthOldRevisionError(AuthError):
    """A JWT token issued before the latest auth change, used where a permission is checked."""


class InvalidAuthMgmtError(AuthError):
    """Removing root's powers while auth is enabled (delete root, delete role root, revoke root from root)."""
