"""Auth tokens, as etcd's two providers (``--auth-token``).

Simple tokens (``--auth-token simple``, the default): who a token names, until it goes unused for the TTL.

A token is 16 random letters, a dot and an index (etcd uses the raft index
of the Authenticate request; here a counter that a follower of the journal
moves up to the highest index it has learned, so it keeps growing across a
takeover), e.g. ``"bIcuGTshfkKmMbgR.62"``.  Each use renews it for another
TTL (``--auth-token-ttl``, 300 s) on the member it is used on.  Tokens live
only in memory, as in etcd: a restart, AuthDisable, or a change of the user's
password (or the user's deletion) ends them.

As in etcd, where Authenticate goes through Raft carrying the token so every
member learns it, the writer journals each token it assigns (a TOKEN record,
``encode_token_record``) before answering, and followers ``add`` it when they
apply the record: a client may authenticate on one member and use the token
on any other.  The TTL runs per member, from when that member learned it.

JWT tokens (``--auth-token jwt,sign-method=RS256,priv-key=F,pub-key=F,ttl=5m``):
signed claims, nothing kept per token; see ``JWTTokens``.
"""
from __future__ import annotations

import secrets
import string
import struct
import time

from .durations import go_duration_s

LETTERS = string.ascii_lowercase + string.ascii_uppercase
PREFIX_LETTERS = 16
SWEEP_INTERVAL_S = 1.0  # as etcd's token keeper
TOKENS_MAX = 100_000  # past this, the oldest tokens are dropped


class SimpleTokens:
    def __init__(self, ttl_s: float = 300.0, clock=time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._tokens: dict[str, list] = {}  # token -> [user name, deadline]
        self._index = 0
        self._swept = clock()

    def __len__(self) -> int:
        return len(self._tokens)

    def assign(self, user: str, revision: int = 0) -> str:
        """A new token for ``user`` (the auth revision does not matter to simple tokens)."""
        now = self.clock()
        self._sweep(now)
        self._index += 1
        token = "".join(secrets.choice(LETTERS) for _ in range(PREFIX_LETTERS)) + f".{self._index}"
        self._tokens[token] = [user, now + self.ttl_s]
        return token

    def add(self, token: str, user: str) -> None:
        """A token the writer assigned (learned from the journal): valid here from now for the TTL."""
        now = self.clock()
        self._sweep(now)
        self._tokens[token] = [user, now + self.ttl_s]
        index = token.rpartition(".")[2]
        if index.isdigit():
            self._index = max(self._index, int(index))

    def merge(self, other: SimpleTokens) -> None:
        """Add ``other``'s tokens (a follower's tokens relearned from the journal on a resync)."""
        for token, (user, _) in list(other._tokens.items()):
            self.add(token, user)

    def discard(self, token: str) -> None:
        self._tokens.pop(token, None)

    def known(self, token: str) -> bool:
        """Whether ``token`` is valid here now (without renewing it)."""
        entry = self._tokens.get(token)
        return entry is not None and entry[1] > self.clock()

    def user(self, token: str) -> str | None:
        """The user ``token`` names (renewing it), or None if it is unknown or expired."""
        entry = self._tokens.get(token)
        if entry is None:
            return None
        now = self.clock()
        if entry[1] <= now:
            del self._tokens[token]
            return None
        entry[1] = now + self.ttl_s
        return entry[0]

    def caller(self, token: str) -> str | None:
        return self.user(token)

    def invalidate_user(self, user: str) -> None:
        for token in [t for t, (u, _) in self._tokens.items() if u == user]:
            del self._tokens[token]

    def clear(self) -> None:
        self._tokens.clear()

    def _sweep(self, now: float) -> None:
        if now - self._swept >= SWEEP_INTERVAL_S:
            self._swept = now
            for token in [t for t, (_, deadline) in self._tokens.items() if deadline <= now]:
                del self._tokens[token]
        while len(self._tokens) >= TOKENS_MAX:
            del self._tokens[next(iter(self._tokens))]


_LEN = struct.Struct("<I")


def encode_token_record(token: str, user: str) -> bytes:
    """A TOKEN journal record's payload: u32 LE token length, token, user name (UTF-8)."""
    raw = token.encode()
    return _LEN.pack(len(raw)) + raw + user.encode()


def decode_token_record(payload: bytes) -> tuple[str, str]:
    (n,) = _LEN.unpack_from(payload)
    return payload[4 : 4 + n].decode(), payload[4 + n :].decode()


def looks_simple(token: str) -> bool:
    """Shaped like a simple token (``<16 letters>.<index>``), as etcd checks before waiting for its index."""
    prefix, dot, index = token.partition(".")
    return bool(dot) and len(prefix) == PREFIX_LETTERS and index.isdigit()


# -- JWT tokens (--auth-token jwt,...) -------------------------------------------------

JWT_SIGN_METHODS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
                    "ES256", "ES384", "ES512", "HS256", "HS384", "HS512")
JWT_DEFAULT_TTL_S = 300.0  # etcd's default ttl option: 5m


class TokenOptionsError(ValueError):
    """An --auth-token value etcd would refuse to start with."""


class JWTTokens:
    """etcd's JWT tokens: stateless, signed claims {"exp", "revision", "username"}.

    A token names the user and the auth revision it was issued at; once auth
    changes (a higher revision) the token still says who, but permission
    checks refuse it as old (etcd's ErrAuthOldRevision) and clients log in
    again.  Nothing is kept per token: a restart, AuthDisable or a password
    change does not end one by itself (the revision does)."""

    def __init__(self, sign_method: str, signing_key, verifying_key, ttl_s: float, clock=time.time) -> None:
        self.sign_method = sign_method
        self.signing_key = signing_key  # None: verify-only (only a public key was given)
        self.verifying_key = verifying_key
        self.ttl_s = ttl_s
        self.clock = clock

    @classmethod
    def from_options(cls, options: dict[str, str]) -> JWTTokens:
        from cryptography.hazmat.primitives import serialization

        method = options.get("sign-method", "")
        if method not in JWT_SIGN_METHODS:
            raise TokenOptionsError(f"jwt: unsupported or missing sign-method {method!r}")
        try:
            ttl = go_duration_s(options["ttl"]) if "ttl" in options else JWT_DEFAULT_TTL_S
        except ValueError as exc:
            raise TokenOptionsError(f"jwt: ttl: {exc}") from None

        def read(option: str) -> bytes | None:
            path = options.get(option)
            if not path:
                return None
            try:
                with open(path, "rb") as f:
                    return f.read()
            except OSError as exc:
                raise TokenOptionsError(f"jwt: cannot read {option} {path}: {exc.strerror}") from None

        private, public = read("priv-key"), read("pub-key")
        if method.startswith("HS"):  # the private key file's bytes are the shared secret
            if private is None:
                raise TokenOptionsError("jwt: HMAC sign-method needs priv-key")
            return cls(method, private, private, ttl)
        try:
            signing = serialization.load_pem_private_key(private, password=None) if private else None
            verifying = serialization.load_pem_public_key(public) if public else None
        except (ValueError, TypeError) as exc:
            raise TokenOptionsError(f"jwt: bad key: {exc}") from None
        if signing is None and verifying is None:
            raise TokenOptionsError("jwt: priv-key or pub-key is required")
        return cls(method, signing, verifying or signing.public_key(), ttl)

    def assign(self, user: str, revision: int) -> str:
        import jwt  # PyJWT: imported only when JWT tokens are configured

        if self.signing_key is None:
            raise VerifyOnlyError
        claims = {"exp": int(self.clock() + self.ttl_s), "revision": revision, "username": user}
        return jwt.encode(claims, self.signing_key, algorithm=self.sign_method)

    def info(self, token: str) -> tuple[str, int] | None:
        """(user, auth revision at issue) if ``token`` is one of ours, signed and unexpired."""
        import jwt  # PyJWT

        try:
            claims = jwt.decode(token, self.verifying_key, algorithms=[self.sign_method],
                                options={"require": [], "verify_aud": False, "verify_iss": False})
        except jwt.InvalidTokenError:
            return None
        user, revision = claims.get("username"), claims.get("revision")
        if not isinstance(user, str) or isinstance(revision, bool) or not isinstance(revision, (int, float)):
            return None
        return user, int(revision)

    def caller(self, token: str) -> Caller | None:
        found = self.info(token)
        return None if found is None else Caller(*found)

    def invalidate_user(self, user: str) -> None:
        pass  # the auth revision outdates the user's tokens

    def clear(self) -> None:
        pass


class Caller(str):
    """A user name that carries the auth revision its token was issued at (JWT tokens only)."""

    def __new__(cls, name: str, revision: int) -> Caller:
        obj = super().__new__(cls, name)
        obj.revision = revision
        return obj


class VerifyOnlyError(Exception):
    """Authenticate on a server given only a public key (etcd's ErrVerifyOnly)."""


def parse_auth_token(spec: str, simple_ttl_s: float):
    """The token provider for an --auth-token value: "simple" or "jwt,opt=value,..."."""
    kind, _, rest = spec.partition(",")
    if kind == "simple":
        return SimpleTokens(simple_ttl_s)
    if kind == "jwt":
        options = {}
        for item in filter(None, rest.split(",")):
            key, eq, value = item.partition("=")
            if not eq:
                raise TokenOptionsError(f"jwt: option {item!r} is not key=value")
            options[key] = value
        return JWTTokens.from_options(options)
    raise TokenOptionsError(f"unknown token type {kind!r}: simple or jwt")
