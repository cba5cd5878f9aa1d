"""Helpers for the auth differential tests: one session per server, calls made
as a named user, outcomes normalised where two servers legitimately differ.

A ``Session`` keeps the tokens its server handed out, by user name; a call
made ``who="alice"`` sends alice's token from that server.  ``who`` may also
be None (no token), ``"bad"`` (a well-formed token no server issued) or
``"empty"`` (an empty token).

Outcomes are ``("ok", dict)`` or ``("error", code, message)``.  Taken out
before comparing: the member identity in headers (cluster_id, member_id,
raft_term), token strings (checked to be etcd's 16 letters, ".", index),
remaining lease TTLs, hash values, and whatever the label says is
server-specific (Status, MemberList, Snapshot bodies).
"""
from __future__ import annotations

import re

import grpc
from google.protobuf import json_format

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.watch_client import WatchClient

TOKEN = re.compile(r"^[a-zA-Z]{16}\.\d+$")
SPECIAL = {"bad": "bogusbogusbogusx.1", "empty": ""}


def normalise(resp) -> dict:
    d = json_format.MessageToDict(resp, preserving_proto_field_name=True)
    for h in _headers(d):
        for k in ("cluster_id", "member_id", "raft_term"):
            h.pop(k, None)
    if "token" in d:
        assert TOKEN.match(d["token"]), f"not an etcd simple token: {d['token']!r}"
        d["token"] = "<token>"
    if isinstance(resp, pb.LeaseTimeToLiveResponse) and "TTL" in d:
        d["TTL"] = int(d["TTL"]) > 0
    if isinstance(resp, (pb.HashResponse, pb.HashKVResponse)):
        d.pop("hash", None)
    return d


def _headers(d):
    if isinstance(d, dict):
        if "header" in d:
            yield d["header"]
        for v in d.values():
            yield from _headers(v)
    elif isinstance(d, list):
        for v in d:
            yield from _headers(v)


# a Go gRPC status's code as its error string names it
GO_CODES = {"UNAUTHENTICATED": "Unauthenticated", "INVALID_ARGUMENT": "InvalidArgument",
            "PERMISSION_DENIED": "PermissionDenied"}
# etcd 3.5.1 hands the old-revision error to gRPC unconverted; a watch refusal names rpctypes' own
OLD_REVISION = ("UNKNOWN", "auth: revision in header is old")
WATCH_OLD_REVISION = "rpc error: code = InvalidArgument desc = etcdserver: revision of auth store is old"


class Session:
    def __init__(self, endpoint: str, refusals_of_3_5_1: bool = False) -> None:
        """``refusals_of_3_5_1``: the server is etcd 3.5.1, whose refused watch creates are read as
        etcd >= 3.5.6 (and shardetcd) answers them (``as_later_3_5``)."""
        self.refusals_of_3_5_1 = refusals_of_3_5_1
        self.channel = grpc.insecure_channel(endpoint)
        ch = self.channel
        self.stubs = {
            "Auth": pbg.AuthStub(ch), "KV": pbg.KVStub(ch), "Lease": pbg.LeaseStub(ch),
            "Maintenance": pbg.MaintenanceStub(ch), "Cluster": pbg.ClusterStub(ch),
        }
        self.tokens: dict[str, str] = {}
        self.log: list[tuple[str, tuple]] = []

    def close(self) -> None:
        self.channel.close()

    def metadata(self, who: str | None, key: str = "token"):
        if who is None:
            return None
        token = SPECIAL[who] if who in SPECIAL else self.tokens[who]
        return ((key, token),)

    def call(self, label: str, method: str, req, who: str | None = None, *, shape: str = "full",
             metadata=None) -> tuple:
        """Call "Service.Method"; record and return the outcome.  shape="ok" keeps only success."""
        service, name = method.split(".")
        fn = getattr(self.stubs[service], name)
        md = metadata if metadata is not None else self.metadata(who)
        try:
            if name in ("Snapshot", "LeaseKeepAlive"):  # streams: the first response
                stream = fn(iter([req]) if name == "LeaseKeepAlive" else req, metadata=md, timeout=10)
                resp = next(stream)
                stream.cancel()
            else:
                resp = fn(req, metadata=md, timeout=10)
            out: tuple = ("ok", normalise(resp) if shape == "full" else None)
        except grpc.RpcError as e:
            out = ("error", e.code().name, e.details())
        if name == "Authenticate" and out[0] == "ok":
            self.tokens[req.name] = resp.token
        self.log.append((label, out))
        return out

    def watch(self, label: str, who: str | None, key: bytes, range_end: bytes = b"", **kw) -> tuple:
        """The first response to one watch create, made as ``who``."""
        w = WatchClient(self.channel, metadata=self.metadata(who))
        try:
            w.create(key, range_end, **kw)
            out: tuple = ("ok", normalise(w.wait_for(lambda rs: rs, timeout=10)[0]))
        finally:
            w.close()
        if self.refusals_of_3_5_1 and out[1].get("canceled") and "compact_revision" not in out[1]:
            out = ("ok", self.as_later_3_5(out[1], who, key, range_end))
        self.log.append((label, out))
        return out

    def as_later_3_5(self, refused: dict, who: str | None, key: bytes, range_end: bytes) -> dict:
        """A watch create etcd 3.5.1 refused, as etcd >= 3.5.6 refuses it: watch id -1 (3.5.1 sent
        the requested id, 0 if none) and the reason ``refusal_after_3_5_6`` gives."""
        reason = refusal_after_3_5_6(self.stubs["KV"], self.metadata(who), key, range_end)
        return refused if reason is None else refused | {"watch_id": "-1", "cancel_reason": reason}


def refusal_after_3_5_6(kv: pbg.KVStub, metadata, key: bytes, range_end: bytes) -> str | None:
    """The cancel reason etcd >= 3.5.6 gives a refused watch create on [key, range_end) with
    ``metadata`` (3.5.1 said "permission denied" whatever the cause): the error its checks met, as
    a Range of the watched range with the same token answers it; None: a Range is allowed."""
    try:
        kv.Range(pb.RangeRequest(key=key or b"\0", range_end=range_end, keys_only=True), metadata=metadata, timeout=10)
        return None
    except grpc.RpcError as e:
        error = (e.code().name, e.details())
    return WATCH_OLD_REVISION if error == OLD_REVISION else f"rpc error: code = {GO_CODES[error[0]]} desc = {error[1]}"


def differences(a: Session, b: Session) -> list[str]:
    """Labels whose outcomes differ, with both outcomes, in call order."""
    out = []
    assert [l for l, _ in a.log] == [l for l, _ in b.log], "the sessions made different calls"
    for (label, x), (_, y) in zip(a.log, b.log):
        if x != y:
            out.append(f"{label}:\n    etcd:      {x}\n    shardetcd: {y}")
    return out


def enable_with_user(auth: pbg.AuthStub, user: str, password: str, key: bytes, range_end: bytes,
                     root_password: str = "rootpw") -> None:
    """root (with the root role), ``user`` with READWRITE on [key, range_end) through role
    "<user>-rw", then AuthEnable; the same calls whatever the server."""
    from proto import auth_pb2

    auth.UserAdd(pb.AuthUserAddRequest(name="root", password=root_password), timeout=10)
    auth.UserGrantRole(pb.AuthUserGrantRoleRequest(user="root", role="root"), timeout=10)
    auth.UserAdd(pb.AuthUserAddRequest(name=user, password=password), timeout=10)
    auth.RoleAdd(pb.AuthRoleAddRequest(name=f"{user}-rw"), timeout=10)
    auth.RoleGrantPermission(pb.AuthRoleGrantPermissionRequest(name=f"{user}-rw", perm=auth_pb2.Permission(
        permType=auth_pb2.Permission.READWRITE, key=key, range_end=range_end)), timeout=10)
    auth.UserGrantRole(pb.AuthUserGrantRoleRequest(user=user, role=f"{user}-rw"), timeout=10)
    auth.AuthEnable(pb.AuthEnableRequest(), timeout=10)
