"""The auth store: users, roles and permissions, durable; and who each token names.

Changes are made one at a time: on a copy of the state (``auth_state.py``
has etcd's rules), journaled as an ``AUTH`` record in the default shard's
journal, and swapped in only once the record is durable, so no request is
ever checked against a change a crash could still lose.  Each change has a
sequence number ``seq`` (1, 2, 3, ...).

AUTH record payload (little-endian)::

    | off | size | field                                        |
    |   0 |    8 | seq (u64)                                    |
    |   8 |    1 | op (auth_state.py: ENABLE, USER_ADD, ...)    |
    |   9 |    1 | N: number of fields                          |
    then N fields, each:
    |   0 |    4 | L: length (u32)                              |
    |   4 |    L | bytes (names UTF-8; passwords bcrypt hashes) |

Checkpoint table (kept beside the lease table, see record.py)::

    | off | size | field                                   |
    |   0 |    1 | format (1)                              |
    |   1 |    1 | enabled                                 |
    |   2 |    8 | authRevision (u64)                      |
    |  10 |    8 | seq of the last change included (u64)  |
    |  18 |    4 | U: number of users (u32)                |
    then U times: u32 length + serialized authpb.User
    |     |    4 | R: number of roles (u32)                |
    then R times: u32 length + serialized authpb.Role

Recovery loads the table, then applies the records whose seq is above the
table's: a change is in the table or in a record after it, never counted
twice.  A checkpoint also includes the change being journaled when it is
taken, since the segment holding that change's record may be released once
the checkpoint is written.
"""
from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Awaitable, Callable

import bcrypt

from journal.tasks import unheard
from proto import auth_pb2

from . import errors as e
from .auth_state import (DISABLE, ENABLE, ROLE_ADD, ROLE_DELETE, ROLE_GRANT, ROLE_REVOKE, USER_ADD, USER_DELETE,
                         USER_GRANT, USER_PASSWORD, USER_REVOKE, AuthState, Permission, Role, User,
                         decode_hashed_password)
from .tokens import JWTTokens, SimpleTokens, decode_token_record, encode_token_record

logger = logging.getLogger(__name__)

PASSWORD_BYTES_MAX = 72  # bcrypt reads this much; etcd 3.5.1's Go bcrypt ignores the rest
TABLE_FORMAT = 1

_HEAD = struct.Struct("<QBB")
_LEN = struct.Struct("<I")
_TABLE_HEAD = struct.Struct("<BBQQ")


def hash_password(password: str, cost: int) -> bytes:
    return bcrypt.hashpw(password.encode()[:PASSWORD_BYTES_MAX], bcrypt.gensalt(rounds=cost))


def password_matches(hashed: bytes, password: str) -> bool:
    try:
        return bcrypt.checkpw(password.encode()[:PASSWORD_BYTES_MAX], hashed)
    except ValueError:  # no password set (b"") or a hash bcrypt cannot read
        return False


# -- record and table encoding ----------------------------------------------

def encode_auth_record(seq: int, op: int, fields: tuple[bytes, ...]) -> bytes:
    out = [_HEAD.pack(seq, op, len(fields))]
    for f in fields:
        out += (_LEN.pack(len(f)), f)
    return b"".join(out)


def decode_auth_record(payload: bytes) -> tuple[int, int, tuple[bytes, ...]]:
    seq, op, n = _HEAD.unpack_from(payload)
    pos, fields = _HEAD.size, []
    for _ in range(n):
        (size,) = _LEN.unpack_from(payload, pos)
        pos += _LEN.size
        fields.append(payload[pos : pos + size])
        pos += size
    if pos != len(payload):
        raise ValueError(f"auth record has {len(payload) - pos} trailing bytes")
    return seq, op, tuple(fields)


def _framed(msgs: list[bytes]) -> list[bytes]:
    out = [_LEN.pack(len(msgs))]
    for m in msgs:
        out += (_LEN.pack(len(m)), m)
    return out


def user_message(u: User) -> auth_pb2.User:
    """A user as etcd stores it (authpb.User: also the value of etcd's authUsers bucket)."""
    return auth_pb2.User(name=u.name.encode(), password=u.password, roles=list(u.roles),
                         options=auth_pb2.UserAddOptions(no_password=u.no_password))


def role_message(r: Role) -> auth_pb2.Role:
    """A role as etcd stores it (authpb.Role: also the value of etcd's authRoles bucket)."""
    perms = [auth_pb2.Permission(permType=p.kind, key=p.key, range_end=p.range_end) for p in r.perms]
    return auth_pb2.Role(name=r.name.encode(), keyPermission=perms)


def user_from_message(u: auth_pb2.User) -> User:
    return User(u.name.decode(), u.password, u.options.no_password, tuple(u.roles))


def role_from_message(r: auth_pb2.Role) -> Role:
    return Role(r.name.decode(), tuple(Permission(p.permType, p.key, p.range_end) for p in r.keyPermission))


def encode_table(s: AuthState) -> bytes:
    users = [user_message(u).SerializeToString() for u in s.users.values()]
    roles = [role_message(r).SerializeToString() for r in s.roles.values()]
    return b"".join([_TABLE_HEAD.pack(TABLE_FORMAT, s.enabled, s.revision, s.seq), *_framed(users), *_framed(roles)])


def _unframe(blob: bytes, pos: int) -> tuple[list[bytes], int]:
    (count,) = _LEN.unpack_from(blob, pos)
    pos += _LEN.size
    msgs = []
    for _ in range(count):
        (size,) = _LEN.unpack_from(blob, pos)
        pos += _LEN.size
        msgs.append(blob[pos : pos + size])
        pos += size
    return msgs, pos


def decode_table(blob: bytes) -> AuthState:
    s = AuthState()
    if not blob:
        return s
    fmt, enabled, s.revision, s.seq = _TABLE_HEAD.unpack_from(blob)
    if fmt != TABLE_FORMAT:
        raise ValueError(f"auth table format {fmt}; this shardetcd reads {TABLE_FORMAT}")
    s.enabled = bool(enabled)
    users, pos = _unframe(blob, _TABLE_HEAD.size)
    roles, pos = _unframe(blob, pos)
    for raw in users:
        u = user_from_message(auth_pb2.User.FromString(raw))
        s.users[u.name] = u
    for raw in roles:
        r = role_from_message(auth_pb2.Role.FromString(raw))
        s.roles[r.name] = r
    return s


# -- the store ------------------------------------------------------------------

class AuthStore:
    def __init__(self, journal: Callable[[bytes], Awaitable[None]], bcrypt_cost: int = 10,
                 token_ttl_s: float = 300.0, tokens: SimpleTokens | JWTTokens | None = None,
                 journal_token: Callable[[bytes], Awaitable[None]] | None = None) -> None:
        """``journal_token(payload)`` appends a TOKEN record at once and returns
        what to await for it to be durable (None: simple tokens stay local)."""
        self._journal = journal
        self._journal_token = journal_token
        self.bcrypt_cost = bcrypt_cost
        self.state = AuthState()
        self.enabled = False  # a plain attribute: the one check a request makes while auth is off
        self.tokens = tokens if tokens is not None else SimpleTokens(token_ttl_s)
        self._pending: AuthState | None = None
        self._lock = asyncio.Lock()

    # -- who is asking -------------------------------------------------------

    def user_of(self, token: str) -> str:
        """Who ``token`` names (for a JWT token, a Caller with its revision); InvalidAuthTokenError."""
        name = self.tokens.caller(token)
        if name is None:
            raise e.InvalidAuthTokenError
        return name

    async def authenticate(self, name: str, password: str) -> str:
        """A new token for ``name``; etcd's CheckPassword errors otherwise."""
        while True:
            state = self.state
            if not state.enabled:
                raise e.AuthNotEnabledError
            user = state.users.get(name)
            if user is None:
                raise e.AuthFailedError
            if user.no_password:
                raise e.NoPasswordUserError
            if not await asyncio.to_thread(password_matches, user.password, password):
                raise e.AuthFailedError
            async with self._lock:  # no change is between being journaled and swapped in
                if not (self.state.enabled and self.state.users.get(name) is user):
                    continue  # the user changed while bcrypt ran: check again, as etcd does
                token = self.tokens.assign(name, self.state.revision)
                if self._journal_token is None or not isinstance(self.tokens, SimpleTokens):
                    return token
                try:  # appended now: a change journaled after it ends it on every member
                    durable = self._journal_token(encode_token_record(token, name))
                except BaseException:
                    self.tokens.discard(token)
                    raise
            await durable  # every member that follows the journal knows it (etcd: applied through Raft)
            return token

    # -- changes -------------------------------------------------------------

    async def enable(self) -> bool:
        return await self.change(ENABLE)

    async def disable(self) -> bool:
        return await self.change(DISABLE)

    async def user_add(self, name: str, password: str, no_password: bool) -> bool:
        if not name:
            raise e.UserEmptyError
        if name in self.state.users:
            raise e.UserExistsError
        hashed = b"" if no_password else await asyncio.to_thread(hash_password, password, self.bcrypt_cost)
        return await self.change(USER_ADD, name.encode(), hashed, b"1" if no_password else b"0")

    async def user_password(self, name: str, password: str, hashed_password: str) -> bool:
        """etcd 3.5: a non-empty password is hashed; otherwise hashedPassword is base64 of a bcrypt hash."""
        if password:
            hashed = await asyncio.to_thread(hash_password, password, self.bcrypt_cost)
        else:
            user = self.state.users.get(name)
            needs = user is not None and not user.no_password
            hashed = decode_hashed_password(hashed_password) if needs else b""
        return await self.change(USER_PASSWORD, name.encode(), hashed)

    async def user_delete(self, name: str) -> bool:
        return await self.change(USER_DELETE, name.encode())

    async def user_grant(self, name: str, role: str) -> bool:
        return await self.change(USER_GRANT, name.encode(), role.encode())

    async def user_revoke(self, name: str, role: str) -> bool:
        return await self.change(USER_REVOKE, name.encode(), role.encode())

    async def role_add(self, name: str) -> bool:
        return await self.change(ROLE_ADD, name.encode())

    async def role_delete(self, name: str) -> bool:
        return await self.change(ROLE_DELETE, name.encode())

    async def role_grant(self, name: str, perm: Permission | None) -> bool:
        if perm is None:
            raise e.PermissionNotGivenError
        return await self.change(ROLE_GRANT, name.encode(), str(perm.kind).encode(), perm.key, perm.range_end)

    async def role_revoke(self, name: str, key: bytes, range_end: bytes) -> bool:
        return await self.change(ROLE_REVOKE, name.encode(), key, range_end)

    async def change(self, op: int, *fields: bytes) -> bool:
        """Make one change durable, then visible; False if it changes nothing.

        Runs to the end even if the caller goes away: a change journaled but
        never swapped in would differ between memory and disk."""
        task = asyncio.ensure_future(self._change(op, fields))
        task.add_done_callback(unheard)
        return await asyncio.shield(task)

    async def _change(self, op: int, fields: tuple[bytes, ...]) -> bool:
        async with self._lock:
            new = self.state.copy()
            if not new.apply(op, fields):
                return False
            new.seq += 1
            self._pending = new
            try:
                await self._journal(encode_auth_record(new.seq, op, fields))
            finally:
                self._pending = None
            self._swap(new)
            self._end_tokens(op, fields)
            return True

    def _end_tokens(self, op: int, fields: tuple[bytes, ...]) -> None:
        """The tokens a change ends, as etcd: the user's on a password change or
        deletion, all of them on AuthEnable and AuthDisable."""
        if op in (USER_DELETE, USER_PASSWORD):
            self.tokens.invalidate_user(fields[0].decode())
        elif op in (ENABLE, DISABLE):
            self.tokens.clear()

    def _swap(self, state: AuthState) -> None:
        self.state = state
        self.enabled = state.enabled

    # -- checkpoints and recovery ---------------------------------------------

    def encode_table(self) -> bytes:
        return encode_table(self._pending or self.state)

    def load_table(self, blob: bytes) -> None:
        self._swap(decode_table(blob))

    def replay(self, payload: bytes) -> None:
        """Apply one journaled change unless the loaded table already has it."""
        seq, op, fields = decode_auth_record(payload)
        state = self.state
        if seq <= state.seq:
            return
        if seq != state.seq + 1:
            raise ValueError(f"auth record seq {seq} follows {state.seq}: a change is missing")
        state.apply(op, fields)
        state.seq = seq
        self.enabled = state.enabled
        self._end_tokens(op, fields)

    # -- tokens learned from the journal (followers) -------------------------------

    def learn_token(self, payload: bytes) -> None:
        """Apply a TOKEN record: the writer assigned this simple token."""
        if isinstance(self.tokens, SimpleTokens):
            token, user = decode_token_record(payload)
            self.tokens.add(token, user)

    def replay_token_effects(self, payload: bytes) -> None:
        """An AUTH record already in the loaded table, read again for the tokens it ends
        (a follower replaying TOKEN records from before its checkpoint, in journal order)."""
        _, op, fields = decode_auth_record(payload)
        self._end_tokens(op, fields)
