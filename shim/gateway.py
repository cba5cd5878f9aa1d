"""etcd's JSON gateway (grpc-gateway): POST /v3/<service>/<method> with JSON.

Each route calls the same service method as gRPC does, so validation,
errors and results are identical; messages map to JSON as etcd's gateway
maps them (original field names, 64-bit integers as strings, bytes as
base64).  /v3/watch streams newline-delimited {"result": WatchResponse}, and
/v3/election/observe {"result": LeaderResponse}.
The HTTP "Authorization" header carries an auth token, as etcd's gateway
forwards it (gRPC metadata "authorization").
"""
from __future__ import annotations

import json

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from proto import rpc_pb2 as pb
from proto import v3election_pb2 as epb, v3lock_pb2 as lpb

# grpc code -> HTTP status, as grpc-gateway maps them
HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400, grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429, grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.UNIMPLEMENTED: 501, grpc.StatusCode.INTERNAL: 500, grpc.StatusCode.UNKNOWN: 500,
}


def compact_json(doc) -> bytes:
    """JSON as etcd's gateway (Go) writes it: no spaces; clients and scripts compare bytes."""
    return json.dumps(doc, separators=(",", ":")).encode()


class GatewayError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message

    def body(self) -> bytes:
        return compact_json({"error": self.message, "code": self.code.value[0], "message": self.message})


class _Context:
    """The little of grpc.aio.ServicerContext our services use."""

    def __init__(self, authorization: str | None = None) -> None:
        self.metadata = () if authorization is None else (("authorization", authorization),)

    def invocation_metadata(self):
        return self.metadata

    async def abort(self, code: grpc.StatusCode, details: str):
        raise GatewayError(code, details)


def to_json(msg: Message) -> dict:
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


# path -> (service, method), as etcd's gateway maps them; the request and response
# messages come from the method's descriptor
ROUTES = {
    "/v3/kv/range": ("KV", "Range"),
    "/v3/kv/put": ("KV", "Put"),
    "/v3/kv/deleterange": ("KV", "DeleteRange"),
    "/v3/kv/txn": ("KV", "Txn"),
    "/v3/kv/compaction": ("KV", "Compact"),
    "/v3/lease/grant": ("Lease", "LeaseGrant"),
    "/v3/lease/revoke": ("Lease", "LeaseRevoke"),
    "/v3/kv/lease/revoke": ("Lease", "LeaseRevoke"),
    "/v3/lease/timetolive": ("Lease", "LeaseTimeToLive"),
    "/v3/kv/lease/timetolive": ("Lease", "LeaseTimeToLive"),
    "/v3/lease/leases": ("Lease", "LeaseLeases"),
    "/v3/kv/lease/leases": ("Lease", "LeaseLeases"),
    "/v3/maintenance/status": ("Maintenance", "Status"),
    "/v3/maintenance/alarm": ("Maintenance", "Alarm"),
    "/v3/maintenance/defragment": ("Maintenance", "Defragment"),
    "/v3/maintenance/hash": ("Maintenance", "HashKV"),
    "/v3/cluster/member/list": ("Cluster", "MemberList"),
    "/v3/auth/status": ("Auth", "AuthStatus"),
    "/v3/auth/enable": ("Auth", "AuthEnable"),
    "/v3/auth/disable": ("Auth", "AuthDisable"),
    "/v3/auth/authenticate": ("Auth", "Authenticate"),
    "/v3/auth/user/add": ("Auth", "UserAdd"),
    "/v3/auth/user/get": ("Auth", "UserGet"),
    "/v3/auth/user/list": ("Auth", "UserList"),
    "/v3/auth/user/delete": ("Auth", "UserDelete"),
    "/v3/auth/user/changepw": ("Auth", "UserChangePassword"),
    "/v3/auth/user/grant": ("Auth", "UserGrantRole"),
    "/v3/auth/user/revoke": ("Auth", "UserRevokeRole"),
    "/v3/auth/role/add": ("Auth", "RoleAdd"),
    "/v3/auth/role/get": ("Auth", "RoleGet"),
    "/v3/auth/role/list": ("Auth", "RoleList"),
    "/v3/auth/role/delete": ("Auth", "RoleDelete"),
    "/v3/auth/role/grant": ("Auth", "RoleGrantPermission"),
    "/v3/auth/role/revoke": ("Auth", "RoleRevokePermission"),
    "/v3/lock/lock": ("Lock", "Lock"),
    "/v3/lock/unlock": ("Lock", "Unlock"),
    "/v3/election/campaign": ("Election", "Campaign"),
    "/v3/election/proclaim": ("Election", "Proclaim"),
    "/v3/election/leader": ("Election", "Leader"),
    "/v3/election/resign": ("Election", "Resign"),
}
MODULES = {"Lock": lpb, "Election": epb}  # every other service is declared in rpc.proto


def _route(servicer, service: str, method: str):
    module = MODULES.get(service, pb)
    desc = module.DESCRIPTOR.services_by_name[service].methods_by_name[method]
    return getattr(servicer, method), getattr(module, desc.input_type.name), getattr(module, desc.output_type.name)


class Gateway:
    def __init__(self, services: dict) -> None:
        """``services``: the servicer of each service by its name in the protos ("KV", ..., "Election")."""
        self.routes = {path: _route(services[svc], svc, method) for path, (svc, method) in ROUTES.items()}
        self.watch = services["Watch"]
        self.observe = services["Election"].Observe
        lease = services["Lease"]
        self.renew = lease.store.lease_renew
        self.member = lease.m

    def parse(self, body: bytes, cls):
        try:
            return json_format.Parse(body or b"{}", cls(), ignore_unknown_fields=True)
        except json_format.ParseError as exc:
            raise GatewayError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None

    async def call(self, path: str, body: bytes, authorization: str | None = None) -> bytes:
        """Answer one unary route; raises GatewayError."""
        if path == "/v3/lease/keepalive":
            req = self.parse(body, pb.LeaseKeepAliveRequest)
            resp = pb.LeaseKeepAliveResponse(header=self.member.header(), ID=req.ID, TTL=self.renew(req.ID))
            return compact_json({"result": to_json(resp)})
        route = self.routes.get(path)
        if route is None:
            raise GatewayError(grpc.StatusCode.NOT_FOUND, "Not Found")
        method, req_cls, resp_cls = route
        resp = await method(self.parse(body, req_cls), _Context(authorization))
        if isinstance(resp, bytes):
            resp = resp_cls.FromString(resp)
        return compact_json(to_json(resp))

    async def observe_stream(self, body: bytes, authorization: str | None = None):
        """Yield JSON lines {"result": LeaderResponse} for /v3/election/observe."""
        req = self.parse(body, epb.LeaderRequest)
        async for resp in self.observe(req, _Context(authorization)):
            yield compact_json({"result": to_json(resp)}) + b"\n"

    async def watch_stream(self, body: bytes, authorization: str | None = None):
        """Yield JSON lines for a watch opened with one WatchRequest."""
        req = self.parse(body, pb.WatchRequest)
        stream = self.watch.hub.open_stream()
        try:
            if req.WhichOneof("request_union") == "create_request":
                self.watch.create(stream, req.create_request, _Context(authorization))
            while (msg := await stream.get()) is not None:
                for raw in self.watch.encode(msg):
                    yield compact_json({"result": to_json(pb.WatchResponse.FromString(raw))}) + b"\n"
        finally:
            stream.close()
