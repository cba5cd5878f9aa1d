"""Users, roles and key permissions, and etcd 3.5's rules for changing them.

An ``AuthState`` is plain data plus etcd's auth-store semantics, checked
against etcd 3.5.1 (tests/integration/test_auth.py):

- every change that succeeds adds one to ``revision`` (etcd's authRevision),
  except AuthEnable, which only sets the flag; changes that change nothing
  (granting a role twice, enabling twice, disabling when disabled) neither
  bump it nor get journaled;
- the role "root" may be granted without having been added as a role; a
  user holding it passes every permission check;
- while auth is enabled, the root user cannot be deleted, the root role
  cannot be deleted, and root cannot lose the root role;
- RoleGrantPermission does not validate the range; it replaces the type of
  the first permission with the same key when that one also has the same
  range_end, and otherwise appends and re-sorts by key (with Go's unstable
  sort.Sort, shards/gosort.py: permissions on the same key keep etcd's order), so
  the same range can appear twice, as in etcd.

``apply(op, fields)`` is the one entry point for changes: the store journals
``(op, fields)`` and replays it through the same call after a restart.
Passwords arrive already hashed (bcrypt); a user without a password has an
empty hash and cannot authenticate.
"""
from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, replace

from . import errors as e
from .gosort import go_sort
from .permissions import UserPermissions

ROOT = "root"

# change operations, as journaled (auth.py): (op, fields)
ENABLE, DISABLE = 1, 2
USER_ADD, USER_DELETE, USER_PASSWORD, USER_GRANT, USER_REVOKE = 3, 4, 5, 6, 7
ROLE_ADD, ROLE_DELETE, ROLE_GRANT, ROLE_REVOKE = 8, 9, 10, 11


@dataclass(frozen=True, slots=True)
class Permission:
    kind: int  # READ / WRITE / READWRITE (any int32 is stored, as etcd does)
    key: bytes
    range_end: bytes


@dataclass(frozen=True, slots=True)
class User:
    name: str
    password: bytes  # bcrypt hash; b"" for none
    no_password: bool = False
    roles: tuple[str, ...] = ()  # sorted


@dataclass(frozen=True, slots=True)
class Role:
    name: str
    perms: tuple[Permission, ...] = ()


def decode_hashed_password(hashed: str) -> bytes:
    """etcd's UserChangePassword with hashedPassword and no password: base64 of a bcrypt hash."""
    try:
        return base64.b64decode(hashed.replace("\r", "").replace("\n", ""), validate=True)
    except (binascii.Error, ValueError):
        raise e.NoPasswordUserError from None


class AuthState:
    """The auth store's contents; a change is made on a copy (``copy``), then swapped in."""

    __slots__ = ("enabled", "revision", "seq", "users", "roles", "_merged")

    def __init__(self) -> None:
        self.enabled = False
        self.revision = 1  # etcd starts a new auth store at revision 1
        self.seq = 0  # number of changes journaled so far (auth.py)
        self.users: dict[str, User] = {}
        self.roles: dict[str, Role] = {}
        self._merged: dict[str, UserPermissions] = {}

    def copy(self) -> AuthState:
        new = AuthState()
        new.enabled, new.revision, new.seq = self.enabled, self.revision, self.seq
        new.users, new.roles = dict(self.users), dict(self.roles)
        return new

    # -- reads -----------------------------------------------------------

    def is_root(self, name: str) -> bool:
        user = self.users.get(name)
        return user is not None and ROOT in user.roles

    def has_role(self, name: str, role: str) -> bool:
        user = self.users.get(name)
        return user is not None and role in user.roles

    def permissions(self, name: str) -> UserPermissions:
        merged = self._merged.get(name)
        if merged is None:
            user = self.users[name]
            perms = [(p.kind, p.key, p.range_end)
                     for r in user.roles if (role := self.roles.get(r)) is not None for p in role.perms]
            merged = self._merged[name] = UserPermissions(perms)
        return merged

    def check(self, name: str | None, key: bytes, range_end: bytes, write: bool) -> None:
        """etcd's isOpPermitted for a request made as ``name`` (None: no token given)."""
        if name is None:
            raise e.UserEmptyError
        if getattr(name, "revision", self.revision) < self.revision:  # a JWT token from before an auth change
            raise e.AuthOldRevisionError
        if name not in self.users:
            raise e.PermissionDeniedError
        if self.is_root(name) or self.permissions(name).allows(key, range_end, write):
            return
        raise e.PermissionDeniedError

    def check_admin(self, name: str | None) -> None:
        """etcd's IsAdminPermitted: the caller holds the root role."""
        if name is None:
            raise e.UserEmptyError
        if name not in self.users:
            raise e.UserNotFoundError
        if not self.is_root(name):
            raise e.PermissionDeniedError

    # -- changes -----------------------------------------------------------

    def apply(self, op: int, fields: tuple[bytes, ...]) -> bool:
        """Make one change; raises the store's named error, or returns False if nothing changes."""
        f = fields
        if op == ENABLE:
            return self._enable()
        if op == DISABLE:
            return self._disable()
        if op == USER_ADD:
            return self._user_add(f[0].decode(), f[1], f[2] == b"1")
        if op == USER_DELETE:
            return self._user_delete(f[0].decode())
        if op == USER_PASSWORD:
            return self._user_password(f[0].decode(), f[1])
        if op == USER_GRANT:
            return self._user_grant(f[0].decode(), f[1].decode())
        if op == USER_REVOKE:
            return self._user_revoke(f[0].decode(), f[1].decode())
        if op == ROLE_ADD:
            return self._role_add(f[0].decode())
        if op == ROLE_DELETE:
            return self._role_delete(f[0].decode())
        if op == ROLE_GRANT:
            return self._role_grant(f[0].decode(), Permission(int(f[1]), f[2], f[3]))
        if op == ROLE_REVOKE:
            return self._role_revoke(f[0].decode(), f[1], f[2])
        raise ValueError(f"unknown auth change op {op}")

    def _changed(self) -> bool:
        self.revision += 1
        self._merged = {}
        return True

    def _enable(self) -> bool:
        if self.enabled:
            return False
        root = self.users.get(ROOT)
        if root is None:
            raise e.RootUserNotExistError
        if ROOT not in root.roles:
            raise e.RootRoleNotExistError
        self.enabled = True  # etcd does not bump the revision here
        return True

    def _disable(self) -> bool:
        if not self.enabled:
            return False
        self.enabled = False
        return self._changed()

    def _user_add(self, name: str, password: bytes, no_password: bool) -> bool:
        if not name:
            raise e.UserEmptyError
        if name in self.users:
            raise e.UserExistsError
        self.users[name] = User(name, b"" if no_password else password, no_password)
        return self._changed()

    def _user_delete(self, name: str) -> bool:
        if self.enabled and name == ROOT:
            raise e.InvalidAuthMgmtError
        if name not in self.users:
            raise e.UserNotFoundError
        del self.users[name]
        return self._changed()

    def _user_password(self, name: str, password: bytes) -> bool:
        user = self.users.get(name)
        if user is None:
            raise e.UserNotFoundError
        if not user.no_password:
            self.users[name] = replace(user, password=password)
        return self._changed()

    def _user_grant(self, name: str, role: str) -> bool:
        user = self.users.get(name)
        if user is None:
            raise e.UserNotFoundError
        if role != ROOT and role not in self.roles:
            raise e.RoleNotFoundError
        if role in user.roles:
            return False
        self.users[name] = replace(user, roles=tuple(sorted((*user.roles, role))))
        return self._changed()

    def _user_revoke(self, name: str, role: str) -> bool:
        if self.enabled and name == ROOT and role == ROOT:
            raise e.InvalidAuthMgmtError
        user = self.users.get(name)
        if user is None:
            raise e.UserNotFoundError
        if role not in user.roles:
            raise e.RoleNotGrantedError
        self.users[name] = replace(user, roles=tuple(r for r in user.roles if r != role))
        return self._changed()

    def _role_add(self, name: str) -> bool:
        if not name:
            raise e.RoleEmptyError
        if name in self.roles:
            raise e.RoleExistsError
        self.roles[name] = Role(name)
        return self._changed()

    def _role_delete(self, name: str) -> bool:
        if self.enabled and name == ROOT:
            raise e.InvalidAuthMgmtError
        if name not in self.roles:
            raise e.RoleNotFoundError
        del self.roles[name]
        for user in list(self.users.values()):
            if name in user.roles:
                self.users[user.name] = replace(user, roles=tuple(r for r in user.roles if r != name))
        return self._changed()

    def _role_grant(self, name: str, perm: Permission) -> bool:
        role = self.roles.get(name)
        if role is None:
            raise e.RoleNotFoundError
        perms = list(role.perms)
        # etcd: binary search for the first permission whose key is >= perm.key
        i = next((i for i, p in enumerate(perms) if p.key >= perm.key), len(perms))
        if i < len(perms) and perms[i].key == perm.key and perms[i].range_end == perm.range_end:
            perms[i] = replace(perms[i], kind=perm.kind)
        else:
            perms.append(perm)
            go_sort(perms, lambda a, b: a.key < b.key)  # Go's sort.Sort: equal keys may change places
        self.roles[name] = Role(name, tuple(perms))
        return self._changed()

    def _role_revoke(self, name: str, key: bytes, range_end: bytes) -> bool:
        role = self.roles.get(name)
        if role is None:
            raise e.RoleNotFoundError
        kept = tuple(p for p in role.perms if p.key != key or p.range_end != range_end)
        if len(kept) == len(role.perms):
            raise e.PermissionNotGrantedError
        self.roles[name] = Role(name, kept)
        return self._changed()
