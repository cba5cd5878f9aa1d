"""etcd's simple tokens (``--auth-token simple``): who a token names, until it goes unused for the TTL.

A token is 16 random letters, a dot and an index (etcd uses the raft index
of the Authenticate request; here a counter), e.g. ``"bIcuGTshfkKmMbgR.62"``.
Each use renews it for another TTL (``--auth-token-ttl``, 300 s).  Tokens
live only in memory, as in etcd: a restart, AuthDisable, or a change of the
user's password (or the user's deletion) ends them.
"""
from __future__ import annotations

import secrets
import string
import time

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

    def assign(self, user: str) -> str:
        now = self.clock()
        self._sweep(now)
        self._index += 1
        token = "".join(secrets.choice(LETTERS) for _ in range(PREFIX_LETTERS)) + f".{self._index}"
        self._tokens[token] = [user, now + self.ttl_s]
        return token

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
