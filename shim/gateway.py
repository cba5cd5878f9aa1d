"""etcd's JSON gateway (grpc-gateway): POST /v3/<service>/<method> with JSON.

Each route calls the same service method as gRPC does, so validation,
errors and results are identical; messages map to JSON as etcd's gateway
maps them (original field names, 64-bit integers as strings, bytes as
base64), and request bodies are read as etcd reads them, Go's errors
included (``shim/gojson.py``).  /v3/watch streams newline-delimited
{"result": WatchResponse}, /v3/lease/keepalive one {"result": ...} line per
request in the body, /v3/election/observe {"result": LeaderResponse} and
/v3/maintenance/snapshot {"result": SnapshotResponse}.  /v3beta/ is the same
gateway, as in etcd 3.5.
The HTTP "Authorization" header carries an auth token, as etcd's gateway
forwards it (gRPC metadata "authorization").

etcd's gateway is a gRPC client of its own member, so a route goes wherever
that call would go: on a follower, the gRPC handlers registered in front of
the services (``front``: writes, leases, auth changes handed to the writer,
keep-alives coalesced) answer the routes they answer, and ``gate`` (a new
token's catch-up) runs before a route the follower serves itself.
"""
from __future__ import annotations

import asyncio

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from proto import rpc_pb2 as pb
from proto import v3election_pb2 as epb, v3lock_pb2 as lpb

from . import gojson
from .grpcserver import CallDetails
from .handlers import too_large
from .wire import Parts

# grpc code -> HTTP status, as grpc-gateway maps them
HTTP_STATUS = {
    grpc.StatusCode.OK: 200, grpc.StatusCode.CANCELLED: 408, grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.DEADLINE_EXCEEDED: 504, grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409, grpc.StatusCode.PERMISSION_DENIED: 403, grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429, grpc.StatusCode.FAILED_PRECONDITION: 400, grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400, grpc.StatusCode.UNIMPLEMENTED: 501, grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503, grpc.StatusCode.DATA_LOSS: 500,
}


def compact_json(doc) -> bytes:
    """JSON as etcd's gateway (Go) writes it: no spaces, Go's escaping; clients and scripts compare bytes."""
    return gojson.dumps(doc)


class GatewayError(Exception):
    """A route's error; ``from_grpc`` when the call reached the gRPC service (etcd's gateway
    then passes the gRPC server's response headers on as Grpc-Metadata-*), not when the
    request could not be read."""

    def __init__(self, code: grpc.StatusCode, message: str, http_status: int | None = None,
                 from_grpc: bool = False) -> None:
        super().__init__(message)
        self.code, self.message, self.from_grpc = code, message, from_grpc
        self.http_status = HTTP_STATUS.get(code, 500) if http_status is None else http_status

    def body(self) -> bytes:
        return compact_json({"error": self.message, "code": self.code.value[0], "message": self.message})

    def chunk(self) -> bytes:
        """The error as a streaming route sends it, in place of a result line."""
        return compact_json({"error": {"grpc_code": self.code.value[0], "http_code": self.http_status,
                                       "message": self.message, "http_status": REASONS.get(self.http_status, "")}})


REASONS = {200: "OK", 301: "Moved Permanently", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
           404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout", 409: "Conflict", 417: "Expectation Failed",
           429: "Too Many Requests", 431: "Request Header Fields Too Large", 500: "Internal Server Error", 501: "Not Implemented",
           503: "Service Unavailable", 504: "Gateway Timeout", 505: "HTTP Version Not Supported"}


def _bad_body(exc: gojson.GoJSONError) -> GatewayError:
    """A request body etcd cannot read: INVALID_ARGUMENT with Go's words."""
    return GatewayError(grpc.StatusCode.INVALID_ARGUMENT, str(exc))


def _bad_stream_body(exc: gojson.GoJSONError) -> GatewayError:
    """The same on a client-streaming route, where etcd's gateway reports it as UNKNOWN (HTTP 500)."""
    return GatewayError(grpc.StatusCode.UNKNOWN, str(exc), 500)


class _Context:
    """The little of grpc.aio.ServicerContext our services use."""

    def __init__(self, authorization: str | None = None) -> None:
        self.metadata = () if authorization is None else (("authorization", authorization),)
        self.aborted: grpc.StatusCode | None = None

    def invocation_metadata(self):
        return self.metadata

    def time_remaining(self) -> None:
        return None  # an HTTP request has no deadline: a lock or a campaign waits while its client does

    def code(self) -> grpc.StatusCode | None:  # a follower's forwarded calls count the call by it
        return self.aborted

    async def abort(self, code: grpc.StatusCode, details: str):
        self.aborted = code
        raise GatewayError(code, details, from_grpc=True)


async def _aiter(items):
    for item in items:
        yield item


async def _parsed(raw_messages, cls):
    async for raw in raw_messages:
        yield cls.FromString(raw)


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
    "/v3/maintenance/hash": ("Maintenance", "Hash"),  # etcd routes HashKV here too, but Hash wins
    "/v3/maintenance/transfer-leadership": ("Maintenance", "MoveLeader"),
    "/v3/maintenance/downgrade": ("Maintenance", "Downgrade"),
    "/v3/cluster/member/add": ("Cluster", "MemberAdd"),
    "/v3/cluster/member/remove": ("Cluster", "MemberRemove"),
    "/v3/cluster/member/update": ("Cluster", "MemberUpdate"),
    "/v3/cluster/member/list": ("Cluster", "MemberList"),
    "/v3/cluster/member/promote": ("Cluster", "MemberPromote"),
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
STREAMS = ("/v3/watch", "/v3/lease/keepalive", "/v3/election/observe", "/v3/maintenance/snapshot")
PATHS = frozenset(ROUTES) | frozenset(STREAMS)  # every path the gateway answers (POST only)
MODULES = {"Lock": lpb, "Election": epb}  # every other service is declared in rpc.proto


def _route(servicer, service: str, method: str):
    module = MODULES.get(service, pb)
    desc = module.DESCRIPTOR.services_by_name[service].methods_by_name[method]
    return (getattr(servicer, method), getattr(module, desc.input_type.name), getattr(module, desc.output_type.name),
            f"/{desc.containing_service.full_name}/{method}")


class Gateway:
    def __init__(self, services: dict, max_message: int | None = None, front: list = (), gate=None) -> None:
        """``services``: the servicer of each service by its name in the protos ("KV", ..., "Election");
        ``max_message``: the gRPC receive limit a decoded request is held to, as etcd's gateway meets it;
        ``front``: generic gRPC handlers that answer some calls before the services do (a follower's);
        ``gate(context)``: awaited before a call the services answer."""
        self.max_message = max_message
        self.front, self.gate = list(front), gate
        self.routes = {path: _route(services[svc], svc, method) for path, (svc, method) in ROUTES.items()}
        self.watch = services["Watch"]
        self.observe = services["Election"].Observe
        self.snapshot = services["Maintenance"].Snapshot
        lease = services["Lease"]
        self.renew = lease.store.lease_renew
        self.member = lease.m

    def _in_front(self, full_method: str):
        """The method handler of a front handler that answers ``full_method`` now, if any."""
        details = CallDetails(full_method)
        for generic in self.front:
            if (handler := generic.service(details)) is not None:
                return handler
        return None

    def parse(self, body: bytes, cls):
        try:
            req = gojson.decode_request(body, cls)
        except gojson.GoJSONError as exc:
            raise _bad_body(exc) from None
        if self.max_message is not None and (size := req.ByteSize()) > self.max_message:
            raise GatewayError(grpc.StatusCode.RESOURCE_EXHAUSTED, too_large(size, self.max_message))
        return req

    async def call(self, path: str, body: bytes, authorization: str | None = None) -> bytes:
        """Answer one unary route (a path of ROUTES); raises GatewayError."""
        method, req_cls, resp_cls, full_method = self.routes[path]
        req, context = self.parse(body, req_cls), _Context(authorization)
        if (handler := self._in_front(full_method)) is not None:
            resp = await handler.unary_unary(req.SerializeToString(), context)  # raw bytes in and out
        else:
            if self.gate is not None:
                await self.gate(context)
            resp = await method(req, context)
        if type(resp) is Parts:
            resp = resp.joined()
        if isinstance(resp, bytes):
            resp = resp_cls.FromString(resp)
        return compact_json(to_json(resp))

    @staticmethod
    def _stream_requests(body: bytes, cls) -> list:
        """A client stream's requests: an undecodable first one is the call's error; one
        further on ends the stream after the ones before it, as in etcd."""
        requests = []
        try:
            for req in gojson.decode_stream(body, cls):
                requests.append(req)
        except gojson.GoJSONError as exc:
            if not requests:
                raise _bad_stream_body(exc) from None
        return requests

    async def stream(self, path: str, body: bytes, authorization: str | None = None):
        """The chunks of a streaming route (JSON lines); raises GatewayError before the first
        one when the request cannot be read."""
        context = _Context(authorization)
        if path == "/v3/lease/keepalive":
            requests = self._stream_requests(body, pb.LeaseKeepAliveRequest)
            if (handler := self._in_front("/etcdserverpb.Lease/LeaseKeepAlive")) is not None:
                raw = handler.stream_stream(_aiter(r.SerializeToString() for r in requests), context)
                return self._lines(_parsed(raw, pb.LeaseKeepAliveResponse))
            return self._keepalive(requests)
        if path == "/v3/election/observe":
            req = self.parse(body, epb.LeaderRequest)
            if (handler := self._in_front("/v3electionpb.Election/Observe")) is not None:
                return self._lines(_parsed(handler.unary_stream(req.SerializeToString(), context), epb.LeaderResponse))
        if self.gate is not None:  # served here, as unary routes the front does not take
            await self.gate(context)
        if path == "/v3/watch":
            return self._watch(self._stream_requests(body, pb.WatchRequest), authorization)
        if path == "/v3/election/observe":
            return self._lines(self.observe(req, context))
        return self._lines(self.snapshot(self.parse(body, pb.SnapshotRequest), context))

    async def _keepalive(self, requests):
        for req in requests:
            resp = pb.LeaseKeepAliveResponse(header=self.member.header(), ID=req.ID, TTL=self.renew(req.ID))
            yield compact_json({"result": to_json(resp)}) + b"\n"

    @staticmethod
    async def _lines(responses):
        async for resp in responses:
            yield compact_json({"result": to_json(resp)}) + b"\n"

    async def _watch(self, requests, authorization: str | None):
        """JSON lines of a watch stream fed the body's WatchRequests, as the gRPC Watch applies them."""
        async def feed():
            for req in requests:
                yield req

        stream = self.watch.hub.open_stream()
        reader = asyncio.ensure_future(self.watch.apply_requests(feed(), stream, _Context(authorization)))
        try:
            while (msg := await stream.get()) is not None:
                for raw in self.watch.encode(msg):
                    yield compact_json({"result": to_json(pb.WatchResponse.FromString(raw))}) + b"\n"
        finally:
            reader.cancel()
            stream.close()
