"""NATS users for tests: NKey users, and an operator-mode configuration whose users log in with
creds files (the JWTs that `nsc` would issue, made here with the `nkeys` package).

    seed_file, public = nkey_user(tmp_path)               # for `authorization { users = [{nkey: ...}] }`
    op = OperatorMode(tmp_path)
    creds = op.account("etcd", jetstream=True).user("shardetcd")   # a creds file
    conf = op.config()                                    # the nats-server configuration lines

A JWT here is what NATS's own tools make: a header naming the ed25519-nkey algorithm, the
claims (issuer, subject, and a `nats` section with the claim's type and version 2), and the
issuer's NKey signature over the first two parts, each part base64url without padding.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from pathlib import Path

import nkeys


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _keypair(prefix: int):
    seed = nkeys.encode_seed(os.urandom(32), prefix)
    kp = nkeys.from_seed(bytearray(seed))
    return seed.decode(), kp, kp.public_key.decode()


def _jwt(claims: dict, signer) -> str:
    claims = dict(claims, iat=int(time.time()), jti="")
    digest = hashlib.sha512(json.dumps(claims, sort_keys=True).encode()).digest()[:32]
    claims["jti"] = base64.b32encode(digest).decode().rstrip("=")
    head = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    body = _b64(json.dumps(claims).encode())
    return f"{head}.{body}.{_b64(signer.sign(f'{head}.{body}'.encode()))}"


def nkey_user(directory: Path, name: str = "user") -> tuple[Path, str]:
    """A new NKey user: its seed file and its public key (what the server's configuration names)."""
    seed, _, public = _keypair(nkeys.PREFIX_BYTE_USER)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.nk"
    path.write_text(seed + "\n")
    path.chmod(0o600)
    return path, public


_UNLIMITED = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": True,
              "conn": -1, "leaf": -1}
_JETSTREAM = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}


class Account:
    def __init__(self, op: OperatorMode, name: str, jetstream: bool) -> None:
        self.op, self.name = op, name
        _, self.kp, self.public = _keypair(nkeys.PREFIX_BYTE_ACCOUNT)
        limits = dict(_UNLIMITED, **(_JETSTREAM if jetstream else {}))
        self.jwt = _jwt({"iss": op.public, "sub": self.public, "name": name,
                         "nats": {"type": "account", "version": 2, "limits": limits}}, op.kp)

    def user(self, name: str, permissions: dict | None = None) -> Path:
        """A creds file of a new user of this account (``permissions``: the JWT's pub/sub allow lists)."""
        seed, _, public = _keypair(nkeys.PREFIX_BYTE_USER)
        claims = {"type": "user", "version": 2, "subs": -1, "data": -1, "payload": -1, **(permissions or {})}
        token = _jwt({"iss": self.public, "sub": public, "name": name, "nats": claims}, self.kp)
        path = self.op.dir / f"{self.name}-{name}.creds"
        path.write_text(f"-----BEGIN NATS USER JWT-----\n{token}\n------END NATS USER JWT------\n\n"
                        f"-----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n")
        path.chmod(0o600)
        return path


class OperatorMode:
    """An operator, its system account and the accounts added; ``config()`` preloads them all in
    nats-server's memory resolver."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        _, self.kp, self.public = _keypair(nkeys.PREFIX_BYTE_OPERATOR)
        self.jwt = _jwt({"iss": self.public, "sub": self.public, "name": "test-operator",
                         "nats": {"type": "operator", "version": 2}}, self.kp)
        self.system = Account(self, "SYS", jetstream=False)
        self.accounts = [self.system]

    def account(self, name: str, jetstream: bool = True) -> Account:
        acc = Account(self, name, jetstream)
        self.accounts.append(acc)
        return acc

    def config(self) -> str:
        preload = "\n".join(f"  {a.public}: {a.jwt}" for a in self.accounts)
        return (f"operator: {self.jwt}\nsystem_account: {self.system.public}\nresolver: MEMORY\n"
                f"resolver_preload: {{\n{preload}\n}}\n")
