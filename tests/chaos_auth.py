"""Every channel tests/chaos.py opens (``channel``); and auth on, for its ``--auth``: every chaos
call made as a user that is not root, with a simple token, as a client library makes it; and
each round an auth change that every member must hold to at its end.

Before the first round, through the writer: users ``root`` (the root role), ``chaos`` (a role
with READWRITE on the whole keyspace, so that every call it makes goes through the permission
checks) and ``probe`` (a role of its own), then AuthEnable. Every channel the harness opens
(``channel``) sends the chaos user's token, or root's for the few admin calls; a session
authenticates through the endpoint the call goes to when it has no token (a follower hands
Authenticate to the writer, which journals the token so that every member knows it) and drops
a token a member answers "invalid auth token" for, as etcd's client does, so that the next call
authenticates again; as etcd's client, a unary call so refused is made once more at once. A member may refuse a token it lost in a restart (simple tokens live in
memory, as etcd's); the refusals are counted per endpoint and reported each round.

Findings:

* any call as the chaos user answered PERMISSION_DENIED: its role permits everything;
* the round's change not held at its end. Each round, at a random time during the fault, root
  gives ``probe`` a new password and grants its role READWRITE on ``PROBE_KEY`` (odd rounds) or
  revokes it (even rounds), each retried until answered. After the round, through every member:
  a token from the old password is refused ("invalid auth token": a password change ends the
  user's tokens on every member), the old password fails, a put on ``PROBE_KEY`` with the new
  password's token succeeds exactly when granted (else PERMISSION_DENIED), and every member
  reports the same auth revision (AuthStatus).
"""
from __future__ import annotations

import collections
import math
import random
import ssl
import threading
import time
import urllib.request
from pathlib import Path

import grpc

from proto import auth_pb2, rpc_pb2 as pb, rpc_pb2_grpc as pbg

ROOT, CHAOS, PROBE = "root", "chaos", "probe"
PASSWORDS = {ROOT: "chaos-root-pw", CHAOS: "chaos-pw"}
PROBE_KEY = b"/registry/pods/chaos/probe"
NO_TOKEN = "none.0"  # sent when no token could be had: the member answers "invalid auth token"
INVALID_TOKEN = "etcdserver: invalid auth token"
WATCH_INVALID_TOKEN = "rpc error: code = Unauthenticated desc = " + INVALID_TOKEN  # a refused watch create's reason
WAITING_CALLS = ("/v3lockpb.Lock/Lock", "/v3electionpb.Election/Campaign")
EVERYTHING = auth_pb2.Permission(permType=auth_pb2.Permission.READWRITE, key=b"\0", range_end=b"\0")

ACTIVE: Auth | None = None  # set by tests/chaos.py --auth: every channel() then sends a token
CREDENTIALS: grpc.ChannelCredentials | None = None  # use_tls: every channel over TLS (tests/chaos.py --tls)
SSL_CONTEXT: ssl.SSLContext | None = None  # and HTTPS calls (``get``)


# a member back from a fault is reconnected to within a second (gRPC's default backoff grows to
# minutes: a client kept through a restart late in a round might not call it again before the end)
RECONNECT = [("grpc.initial_reconnect_backoff_ms", 200), ("grpc.max_reconnect_backoff_ms", 1000)]


def use_tls(pki: dict[str, Path] | None) -> None:
    """From now on every channel and HTTP call over TLS, with the client certificate of ``pki``
    (tests/tls_certs.py); None: plaintext again."""
    global CREDENTIALS, SSL_CONTEXT
    if pki is None:
        CREDENTIALS = SSL_CONTEXT = None
        return
    CREDENTIALS = grpc.ssl_channel_credentials(pki["ca"].read_bytes(), pki["client-key"].read_bytes(),
                                               pki["client"].read_bytes())
    SSL_CONTEXT = ssl.create_default_context(cafile=str(pki["ca"]))
    SSL_CONTEXT.load_cert_chain(str(pki["client"]), str(pki["client-key"]))


def get(endpoint: str, path: str, timeout: float = 5.0) -> bytes:
    """GET ``path`` from a member's client port (its /metrics, say): HTTPS with TLS on."""
    scheme = "https" if SSL_CONTEXT is not None else "http"
    with urllib.request.urlopen(f"{scheme}://{endpoint}{path}", timeout=timeout, context=SSL_CONTEXT) as r:
        return r.read()


def bare_channel(endpoint: str, options=()) -> grpc.Channel:
    """A channel to ``endpoint`` that sends no token: with --tls, over TLS with a client certificate."""
    options = [*RECONNECT, *options]
    if CREDENTIALS is None:
        return grpc.insecure_channel(endpoint, options=options)
    return grpc.secure_channel(endpoint, CREDENTIALS, options=options)


def channel(endpoint: str, options=None, as_root: bool = False) -> grpc.Channel:
    """A channel to ``endpoint``; with auth on, its calls made as the chaos user (or root)."""
    plain = bare_channel(endpoint, options or ())
    if ACTIVE is None:
        return plain
    return grpc.intercept_channel(plain, _Interceptor(ACTIVE, ACTIVE.session(endpoint, as_root), endpoint))


def stream_token_refused(endpoint: str) -> None:
    """A watch stream through ``endpoint`` had its creates refused for the chaos user's token."""
    if ACTIVE is not None:
        ACTIVE.session(endpoint).drop()
        ACTIVE.refused(endpoint)


class Session:
    """One user's simple token, shared by every channel made as the user."""

    def __init__(self, user: str, password: str) -> None:
        self.user, self.password = user, password
        self._token: str | None = None
        self._lock = threading.Lock()

    def token(self, endpoint: str) -> str:
        """The token, authenticating through ``endpoint`` first if there is none (NO_TOKEN when that fails)."""
        with self._lock:
            if self._token is None:
                try:
                    self._token = authenticate(endpoint, self.user, self.password)
                except grpc.RpcError:
                    return NO_TOKEN
            return self._token

    def drop(self, token: str | None = None) -> None:
        """``token`` (None: the one now) was refused: the next call authenticates again (unless
        another already did)."""
        with self._lock:
            if token is None or self._token == token:
                self._token = None


def authenticate(endpoint: str, user: str, password: str) -> str:
    with bare_channel(endpoint) as ch:
        return pbg.AuthStub(ch).Authenticate(pb.AuthenticateRequest(name=user, password=password), timeout=5).token


def caught_up(endpoint: str, timeout: float = 30.0) -> None:
    """A linearizable read through ``endpoint`` as the chaos user answered (a refused token taken
    again): the member has applied all the writer had when it was asked."""
    deadline = time.monotonic() + timeout
    with channel(endpoint) as ch:
        while True:
            try:
                pbg.KVStub(ch).Range(pb.RangeRequest(key=PROBE_KEY), timeout=10)
                return
            except grpc.RpcError as exc:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{endpoint} answered no read in {timeout} s: {exc.code().name}: {exc.details()}")
                time.sleep(0.3)


def token_refused(call) -> bool:
    """Whether a finished call was answered "invalid auth token"."""
    return call.code() == grpc.StatusCode.UNAUTHENTICATED and call.details() == INVALID_TOKEN


class _Details(collections.namedtuple("_Details", ("method", "timeout", "metadata", "credentials",
                                                   "wait_for_ready", "compression")), grpc.ClientCallDetails):
    pass


class _Interceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                   grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Sends the session's token with every call; drops a refused one (a unary call is made again
    with a new one); tells ``auth`` of every call answered PERMISSION_DENIED."""

    def __init__(self, auth: Auth, session: Session, endpoint: str) -> None:
        self.auth, self.session, self.endpoint = auth, session, endpoint

    def _call(self, continuation, details, request):
        token = self.session.token(self.endpoint)
        details = _Details(details.method, details.timeout, [*(details.metadata or ()), ("token", token)],
                           details.credentials, getattr(details, "wait_for_ready", None),
                           getattr(details, "compression", None))
        call = continuation(details, request)
        call.add_done_callback(lambda c: self._done(c, token, details.method))
        return call

    def _done(self, call, token: str, method) -> None:
        if token_refused(call):
            self.session.drop(token)
            if token != NO_TOKEN:
                self.auth.refused(self.endpoint)
        elif call.code() == grpc.StatusCode.PERMISSION_DENIED:
            self.auth.denied(f"{self.session.user} {method} through {self.endpoint}: {call.details()}")

    def intercept_unary_unary(self, continuation, details, request):
        """As etcd's client: a call refused for its token is made once more, with a new one (the
        server did nothing with it). Not a Lock or Campaign, which wait, and whose callers cancel
        them: their takers try again anyway."""
        call = self._call(continuation, details, request)
        if details.method in WAITING_CALLS or not token_refused(call):
            return call
        return self._call(continuation, details, request)

    intercept_unary_stream = intercept_stream_unary = intercept_stream_stream = _call


class Auth:
    """The chaos run's users and their sessions; what the round's calls met."""

    def __init__(self) -> None:
        self.root, self.user = Session(ROOT, PASSWORDS[ROOT]), Session(CHAOS, PASSWORDS[CHAOS])
        # a cluster's other partitions are etcds of their own, with tokens of their own: their
        # endpoints (``separate``) have sessions of their own
        self._separate: dict[str, tuple[Session, Session]] = {}
        self.probe_password = "probe-0"
        self.probe_token: str | None = None  # the last round's, from the password before
        self._lock = threading.Lock()
        self._refused: collections.Counter = collections.Counter()  # endpoint -> tokens refused this round
        self._denied: list[str] = []

    def separate(self, endpoints: list[str]) -> None:
        """``endpoints`` serve an etcd of their own (another partition of a cluster): tokens of its own."""
        sessions = Session(ROOT, PASSWORDS[ROOT]), Session(CHAOS, PASSWORDS[CHAOS])
        self._separate.update(dict.fromkeys(endpoints, sessions))

    def session(self, endpoint: str, as_root: bool = False) -> Session:
        root, user = self._separate.get(endpoint, (self.root, self.user))
        return root if as_root else user

    def refused(self, endpoint: str) -> None:
        with self._lock:
            self._refused[endpoint] += 1

    def denied(self, what: str) -> None:
        with self._lock:
            self._denied.append(what)

    def enable(self, endpoint: str) -> None:
        """The users and roles, then auth on, through ``endpoint`` (a writer; no auth yet)."""
        with bare_channel(endpoint) as ch:
            a = pbg.AuthStub(ch)
            for user, password in ((ROOT, PASSWORDS[ROOT]), (CHAOS, PASSWORDS[CHAOS]), (PROBE, self.probe_password)):
                a.UserAdd(pb.AuthUserAddRequest(name=user, password=password), timeout=10)
                a.RoleAdd(pb.AuthRoleAddRequest(name=user), timeout=10)
                a.UserGrantRole(pb.AuthUserGrantRoleRequest(user=user, role=user), timeout=10)
            a.RoleGrantPermission(pb.AuthRoleGrantPermissionRequest(name=CHAOS, perm=EVERYTHING), timeout=10)
            a.AuthEnable(pb.AuthEnableRequest(), timeout=10)

    def change(self, r: int, endpoints: list[str], rng: random.Random) -> Change:
        """The round's change, begun (``Change``)."""
        return Change(r, endpoints, random.Random(rng.random()))

    def check(self, change: Change, endpoints: dict[str, str]) -> str:
        """After the round (``change`` ended, the members converged): the findings above; what is reported."""
        with self._lock:
            denied, refused = self._denied[:], dict(self._refused)
            self._denied.clear()
            self._refused.clear()
        assert not denied, f"the chaos user (READWRITE on everything) was denied: {denied[:5]} ({len(denied)} calls)"
        password, grant = change.password, change.grant
        old_token, old_password = self.probe_token, self.probe_password
        first = next(iter(endpoints.values()))
        try:
            authenticate(first, PROBE, old_password)
            raise AssertionError(f"probe's password before the round ({old_password}) still works")
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (exc.code(), exc.details())
        token = authenticate(first, PROBE, password)
        revisions = {}
        for name, endpoint in endpoints.items():
            with bare_channel(endpoint) as ch:
                kv = pbg.KVStub(ch)
                caught_up(endpoint)
                if old_token is not None:
                    try:
                        kv.Range(pb.RangeRequest(key=PROBE_KEY), metadata=[("token", old_token)], timeout=10)
                        raise AssertionError(f"{name} took probe's token from before its password changed")
                    except grpc.RpcError as exc:
                        assert (exc.code(), exc.details()) == (grpc.StatusCode.UNAUTHENTICATED, INVALID_TOKEN), \
                            f"{name}, probe's old token: {exc.code().name}: {exc.details()}"
                try:
                    kv.Put(pb.PutRequest(key=PROBE_KEY, value=name.encode()), metadata=[("token", token)], timeout=10)
                    assert grant, f"{name} let probe put {PROBE_KEY!r}, its permission revoked"
                except grpc.RpcError as exc:
                    assert not grant and exc.code() == grpc.StatusCode.PERMISSION_DENIED, \
                        f"{name}, probe's put ({'granted' if grant else 'revoked'}): {exc.code().name}: {exc.details()}"
            with channel(endpoint, as_root=True) as ch:  # AuthStatus: the root role's
                revisions[name] = pbg.AuthStub(ch).AuthStatus(pb.AuthStatusRequest(), timeout=10).authRevision
        assert len(set(revisions.values())) == 1, f"members' auth revisions differ: {revisions}"
        self.probe_token, self.probe_password = token, password
        counts = ", ".join(f"{ep} {n}" for ep, n in sorted(refused.items())) or "none"
        return (f"auth: probe {'granted' if grant else 'revoked'} and its new password held on every member "
                f"(auth revision {revisions[name]}); tokens refused: {counts}")


class Change:
    """A round's auth change, in a thread: at a random time, a new password for probe and its
    permission on PROBE_KEY granted (odd rounds) or revoked, each call retried (through a member
    chosen each time) until answered."""

    def __init__(self, r: int, endpoints: list[str], rng: random.Random) -> None:
        self.password, self.grant = f"probe-{r}", r % 2 == 1
        self.endpoints, self.rng = endpoints, rng
        self.made = False
        self.errors: list[str] = []
        self._deadline = math.inf  # set by end()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        time.sleep(self.rng.uniform(0.5, 6.0))
        perm = auth_pb2.Permission(permType=auth_pb2.Permission.READWRITE, key=PROBE_KEY)
        self.made = self._attempt(lambda a: a.UserChangePassword(pb.AuthUserChangePasswordRequest(
            name=PROBE, password=self.password), timeout=5)) and self._attempt(
            (lambda a: a.RoleGrantPermission(pb.AuthRoleGrantPermissionRequest(name=PROBE, perm=perm), timeout=5))
            if self.grant else
            (lambda a: a.RoleRevokePermission(pb.AuthRoleRevokePermissionRequest(
                role=PROBE, key=perm.key, range_end=perm.range_end), timeout=5)))

    def _attempt(self, call) -> bool:
        """``call`` answered (False: not before the deadline)."""
        while True:
            try:
                with channel(self.rng.choice(self.endpoints), as_root=True) as ch:
                    call(pbg.AuthStub(ch))
                return True
            except grpc.RpcError as exc:
                if (exc.code(), exc.details()) == (grpc.StatusCode.FAILED_PRECONDITION,
                                                   "etcdserver: permission is not granted to the role"):
                    return True  # an attempt before, of unknown outcome, revoked it
                self.errors.append(f"{exc.code().name}: {exc.details()}")
                if time.monotonic() > self._deadline:
                    return False
                time.sleep(0.3)

    def end(self, timeout: float = 60.0) -> None:
        """Made, within ``timeout`` more (the members serve again by now)."""
        self._deadline = time.monotonic() + timeout
        self._thread.join(timeout + 15)
        assert self.made, f"the round's auth change was not made: {self.errors[-3:]}"
