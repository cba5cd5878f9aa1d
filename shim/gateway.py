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


class GatewayError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message

    def body(self) -> bytes:
        return json.dumps({"error": self.message, "code": self.code.value[0], "message": self.message}).encode()


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


class Gateway:
    def __init__(self, services: dict) -> None:
        kv, lease, mt, cluster, auth = (services[n] for n in ("KV", "Lease", "Maintenance", "Cluster", "Auth"))
        self.watch = services["Watch"]
        self.routes = {
            "/v3/kv/range": (kv.Range, pb.RangeRequest, pb.RangeResponse),
            "/v3/kv/put": (kv.Put, pb.PutRequest, pb.PutResponse),
            "/v3/kv/deleterange": (kv.DeleteRange, pb.DeleteRangeRequest, pb.DeleteRangeResponse),
            "/v3/kv/txn": (kv.Txn, pb.TxnRequest, pb.TxnResponse),
            "/v3/kv/compaction": (kv.Compact, pb.CompactionRequest, pb.CompactionResponse),
            "/v3/lease/grant": (lease.LeaseGrant, pb.LeaseGrantRequest, pb.LeaseGrantResponse),
            "/v3/lease/revoke": (lease.LeaseRevoke, pb.LeaseRevokeRequest, pb.LeaseRevokeResponse),
            "/v3/kv/lease/revoke": (lease.LeaseRevoke, pb.LeaseRevokeRequest, pb.LeaseRevokeResponse),
            "/v3/lease/timetolive": (lease.LeaseTimeToLive, pb.LeaseTimeToLiveRequest, pb.LeaseTimeToLiveResponse),
            "/v3/kv/lease/timetolive": (lease.LeaseTimeToLive, pb.LeaseTimeToLiveRequest, pb.LeaseTimeToLiveResponse),
            "/v3/lease/leases": (lease.LeaseLeases, pb.LeaseLeasesRequest, pb.LeaseLeasesResponse),
            "/v3/kv/lease/leases": (lease.LeaseLeases, pb.LeaseLeasesRequest, pb.LeaseLeasesResponse),
            "/v3/maintenance/status": (mt.Status, pb.StatusRequest, pb.StatusResponse),
            "/v3/maintenance/alarm": (mt.Alarm, pb.AlarmRequest, pb.AlarmResponse),
            "/v3/maintenance/defragment": (mt.Defragment, pb.DefragmentRequest, pb.DefragmentResponse),
            "/v3/maintenance/hash": (mt.HashKV, pb.HashKVRequest, pb.HashKVResponse),
            "/v3/cluster/member/list": (cluster.MemberList, pb.MemberListRequest, pb.MemberListResponse),
            "/v3/auth/status": (auth.AuthStatus, pb.AuthStatusRequest, pb.AuthStatusResponse),
            "/v3/auth/enable": (auth.AuthEnable, pb.AuthEnableRequest, pb.AuthEnableResponse),
            "/v3/auth/disable": (auth.AuthDisable, pb.AuthDisableRequest, pb.AuthDisableResponse),
            "/v3/auth/authenticate": (auth.Authenticate, pb.AuthenticateRequest, pb.AuthenticateResponse),
            "/v3/auth/user/add": (auth.UserAdd, pb.AuthUserAddRequest, pb.AuthUserAddResponse),
            "/v3/auth/user/get": (auth.UserGet, pb.AuthUserGetRequest, pb.AuthUserGetResponse),
            "/v3/auth/user/list": (auth.UserList, pb.AuthUserListRequest, pb.AuthUserListResponse),
            "/v3/auth/user/delete": (auth.UserDelete, pb.AuthUserDeleteRequest, pb.AuthUserDeleteResponse),
            "/v3/auth/user/changepw": (auth.UserChangePassword, pb.AuthUserChangePasswordRequest,
                                       pb.AuthUserChangePasswordResponse),
            "/v3/auth/user/grant": (auth.UserGrantRole, pb.AuthUserGrantRoleRequest, pb.AuthUserGrantRoleResponse),
            "/v3/auth/user/revoke": (auth.UserRevokeRole, pb.AuthUserRevokeRoleRequest, pb.AuthUserRevokeRoleResponse),
            "/v3/auth/role/add": (auth.RoleAdd, pb.AuthRoleAddRequest, pb.AuthRoleAddResponse),
            "/v3/auth/role/get": (auth.RoleGet, pb.AuthRoleGetRequest, pb.AuthRoleGetResponse),
            "/v3/auth/role/list": (auth.RoleList, pb.AuthRoleListRequest, pb.AuthRoleListResponse),
            "/v3/auth/role/delete": (auth.RoleDelete, pb.AuthRoleDeleteRequest, pb.AuthRoleDeleteResponse),
            "/v3/auth/role/grant": (auth.RoleGrantPermission, pb.AuthRoleGrantPermissionRequest,
                                    pb.AuthRoleGrantPermissionResponse),
            "/v3/auth/role/revoke": (auth.RoleRevokePermission, pb.AuthRoleRevokePermissionRequest,
                                     pb.AuthRoleRevokePermissionResponse),
        }
        self.observe = None
        if "Lock" in services:
            lock, election = services["Lock"], services["Election"]
            self.observe = election.Observe
            self.routes |= {
                "/v3/lock/lock": (lock.Lock, lpb.LockRequest, lpb.LockResponse),
                "/v3/lock/unlock": (lock.Unlock, lpb.UnlockRequest, lpb.UnlockResponse),
                "/v3/election/campaign": (election.Campaign, epb.CampaignRequest, epb.CampaignResponse),
                "/v3/election/proclaim": (election.Proclaim, epb.ProclaimRequest, epb.ProclaimResponse),
                "/v3/election/leader": (election.Leader, epb.LeaderRequest, epb.LeaderResponse),
                "/v3/election/resign": (election.Resign, epb.ResignRequest, epb.ResignResponse),
            }
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
            return json.dumps({"result": to_json(resp)}).encode()
        route = self.routes.get(path)
        if route is None:
            raise GatewayError(grpc.StatusCode.NOT_FOUND, "Not Found")
        method, req_cls, resp_cls = route
        resp = await method(self.parse(body, req_cls), _Context(authorization))
        if isinstance(resp, bytes):
            resp = resp_cls.FromString(resp)
        return json.dumps(to_json(resp)).encode()

    async def observe_stream(self, body: bytes, authorization: str | None = None):
        """Yield JSON lines {"result": LeaderResponse} for /v3/election/observe."""
        req = self.parse(body, epb.LeaderRequest)
        async for resp in self.observe(req, _Context(authorization)):
            yield json.dumps({"result": to_json(resp)}).encode() + b"\n"

    async def watch_stream(self, body: bytes, authorization: str | None = None):
        """Yield JSON lines for a watch opened with one WatchRequest."""
        req = self.parse(body, pb.WatchRequest)
        stream = self.watch.hub.open_stream()
        try:
            if req.WhichOneof("request_union") == "create_request":
                self.watch.create(stream, req.create_request, _Context(authorization))
            while (msg := await stream.get()) is not None:
                for raw in self.watch.encode(msg):
                    yield json.dumps({"result": to_json(pb.WatchResponse.FromString(raw))}).encode() + b"\n"
        finally:
            stream.close()
