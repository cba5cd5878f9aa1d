"""Who is asking, and may they: etcd 3.5's checks on requests while auth is enabled.

Services read ``store.auth.enabled`` (a plain attribute) and call here only
when it is true: with auth off a request costs one attribute read, and no
metadata is looked at.

The token comes from gRPC metadata "token", else "authorization" (what
etcd's JSON gateway forwards).  A token that is unknown or expired answers
"invalid auth token" wherever etcd reads tokens, also on calls that need
no permission (LeaseGrant, Compact, Alarm).  A request without a token is
made as nobody: a permission check then answers "user name is empty".

Which call needs what, as etcd 3.5.1 (each compared with the real binary in
tests/integration/test_auth.py):

    Range                 READ on [key, range_end)
    Put                   WRITE on key; READ too with prev_kv; WRITE on every key of its lease
    DeleteRange           WRITE on the range; READ too with prev_kv
    Txn                   READ for each compare; each op as above (both branches)
    Watch create          READ on its range (refused: created + canceled, not an error)
    LeaseRevoke           WRITE on every key of the lease
    LeaseGrant, Compact, Alarm           a valid token if one is given
    Hash, HashKV, Defragment, Snapshot   the root role (errors unconverted, as etcd)
    MemberAdd/Remove/Update/Promote      the root role
    auth management       the root role (UserGet of oneself and RoleGet of one's own role excepted)
    Status, MemberList, MoveLeader, Downgrade, LeaseKeepAlive, LeaseLeases, Authenticate: nothing

Where etcd 3.5.1 lets a restricted user through and later etcd releases
closed the hole, this follows the later releases (each pinned by a test):
ops inside nested txns are checked (3.5.1 skips them); a put inside a txn
is checked like a top-level put (3.5.1 skips prev_kv and the lease's keys);
a watch from a key to the end of the keyspace needs READ on that whole range
(3.5.1 checks only the first key); LeaseTimeToLive needs READ on the lease's
keys (3.5.1 shows any lease's keys to anyone). A refused watch create answers as etcd >= 3.5.6:
watch id -1 and the cause as its reason (an invalid token, an old auth revision, no user), where
3.5.1 said "permission denied" with the requested id whatever the cause, so that a client could not
tell that a new token would do (etcd issue 12385).
"""
from __future__ import annotations

import hmac

from proto import rpc_pb2 as pb
from shards.auth import AuthStore
from shards.errors import AuthError, AuthOldRevisionError, InvalidAuthTokenError, NotTheWriterError, UserEmptyError
from shards.lease import LeaseTable

from .errors import WATCH_AUTH_OLD_REVISION, WATCH_INVALID_AUTH_TOKEN, WATCH_PERMISSION_DENIED, WATCH_USER_EMPTY


# sent with every call a follower hands on: a member that is not the writer refuses it, as it
# refuses the read index, with NOT_THE_WRITER, and the follower looks the writer up again. The
# writer's address is a record in NATS that the new writer rewrites after a takeover; until
# then it can name the old writer's address, where that process, restarted, may already serve
# as a follower. Answering there, a follower's revision passed for the writer's committed one
# (a stale linearizable read, found by tests/chaos.py), and a write went round in forwards.
FORWARDED_METADATA_MARK = ("shardetcd-forwarded", "1")
# With --client-cert-auth, a forwarded call reaches the writer over the follower's own TLS
# connection, whose certificate names the follower, not the client: the follower says who the
# client is (its certificate's Common Name) in FORWARDED_CALLER, and the writer believes it only
# beside FORWARDED_SECRET, the secret it published with its address (follower.writer_record).
FORWARDED_CALLER = "shardetcd-caller-cn"
FORWARDED_SECRET = "shardetcd-writer-secret"


def token_of(metadata) -> str | None:
    """etcd's choice: the first "token" value, else the first "authorization" value."""
    found = None
    for key, value in metadata or ():
        if key == "token":
            return value
        if key == "authorization" and found is None:
            found = value
    return found


def common_name(context) -> str | None:
    """The Common Name of the client certificate the TLS connection was verified with, if any."""
    auth_context = getattr(context, "auth_context", None)
    names = auth_context().get("x509_common_name") if auth_context is not None else None
    return names[0].decode() if names else None


class Access:
    def __init__(self, auth: AuthStore, leases: LeaseTable, cert_users: bool = False,
                 forward_secret: str = "") -> None:
        self.auth = auth
        self.leases = leases
        # --client-cert-auth: a request without a token acts as the user its certificate's CN names
        self.cert_users = cert_users
        self.forward_secret = forward_secret  # what this member's followers' calls carry (FORWARDED_SECRET)

    def user(self, metadata) -> str | None:
        """The user the request's token names; None without a token; InvalidAuthTokenError."""
        token = token_of(metadata)
        return None if token is None else self.auth.user_of(token)

    def caller(self, context) -> str | None:
        """etcd's order: a token (a bad one is an error), else with --client-cert-auth the
        certificate's Common Name (never for the JSON gateway, whose context has none), else nobody."""
        metadata = context.invocation_metadata()
        token = token_of(metadata)
        if token is not None:
            return self.auth.user_of(token)
        if not self.cert_users:
            return None
        cn = common_name(context)
        if cn is not None and FORWARDED_METADATA_MARK in (metadata or ()):  # a follower's own certificate
            return self.forwarded_caller(metadata)
        return cn

    def forwarded_caller(self, metadata) -> str | None:
        """Who a follower's client is, as the follower says (its connection's certificate is the
        follower's own; the secret travels over TLS only). Believed only beside this writer's
        secret: a call without it comes from a follower of an earlier writer at this address, or
        from no follower at all, and is refused as a call to a member that is not the writer (a
        follower then looks the writer up again)."""
        secret = caller = None
        for key, value in metadata:
            if key == FORWARDED_SECRET:
                secret = value
            elif key == FORWARDED_CALLER:
                caller = value
        if secret is None or not self.forward_secret or not hmac.compare_digest(secret, self.forward_secret):
            raise NotTheWriterError()
        return caller or None

    def check(self, user: str | None, key: bytes, range_end: bytes, write: bool) -> None:
        """etcd's isOpPermitted for one key or range (also used by Lock and Election, which make KV requests of their own)."""
        self.auth.state.check(user, key, range_end, write)

    def admin(self, context) -> str | None:
        user = self.caller(context)
        self.auth.state.check_admin(user)
        return user

    # -- KV -------------------------------------------------------------------

    def range(self, user: str | None, r: pb.RangeRequest) -> None:
        self.check(user, r.key, r.range_end, False)

    def put(self, user: str | None, r: pb.PutRequest) -> None:
        self.check(user, r.key, b"", True)
        self.lease_keys(user, r.lease, write=True)
        if r.prev_kv:
            self.check(user, r.key, b"", False)

    def delete(self, user: str | None, r: pb.DeleteRangeRequest) -> None:
        self.check(user, r.key, r.range_end, True)
        if r.prev_kv:
            self.check(user, r.key, r.range_end, False)

    def txn(self, user: str | None, r: pb.TxnRequest) -> None:
        for c in r.compare:
            self.check(user, c.key, c.range_end, False)
        for op in (*r.success, *r.failure):
            which = op.WhichOneof("request")
            if which == "request_range":
                self.range(user, op.request_range)
            elif which == "request_put":
                self.put(user, op.request_put)
            elif which == "request_delete_range":
                self.delete(user, op.request_delete_range)
            elif which == "request_txn":
                self.txn(user, op.request_txn)

    # -- leases and watches -------------------------------------------------

    def lease_keys(self, user: str | None, lease_id: int, write: bool) -> None:
        """The permission on every key the lease holds (none if there is no such lease)."""
        lease = self.leases.leases.get(lease_id) if lease_id else None
        if lease is not None:
            for key in sorted(lease.keys):
                self.check(user, key, b"", write)

    def time_to_live(self, user: str | None, lease_id: int) -> None:
        if user is None:
            raise UserEmptyError
        self.lease_keys(user, lease_id, write=False)

    def watch_refused(self, context, key: bytes, range_end: bytes) -> str | None:
        """Why a watch on [key, range_end) may not be created (etcd turns key "" into "\\0"), as the
        cancel reason etcd >= 3.5.6 gives: a token's error as itself, so that a client knows a new
        token will do; None: it may."""
        try:
            self.check(self.caller(context), key or b"\x00", range_end, False)
        except InvalidAuthTokenError:
            return WATCH_INVALID_AUTH_TOKEN
        except AuthOldRevisionError:
            return WATCH_AUTH_OLD_REVISION
        except UserEmptyError:
            return WATCH_USER_EMPTY
        except AuthError:
            return WATCH_PERMISSION_DENIED
        return None
