"""The etcd v3 wire contract in proto/: generated code is fresh, and the
facts clients depend on match etcd 3.5 (checked field by field against
etcd's api/etcdserverpb/rpc.proto, api/mvccpb/kv.proto, api/authpb/auth.proto
of the release-3.5 line)."""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import FieldDescriptor

from proto import auth_pb2, generate, kv_pb2, rpc_pb2, rpc_pb2_grpc

POOL = descriptor_pool.Default()

# ---------------------------------------------------------------------------
# Generated code
# ---------------------------------------------------------------------------


def test_generated_files_are_fresh(tmp_path):
    generate.generate(tmp_path)
    stale = [
        name
        for name in generate.generated_files()
        if not (generate.PROTO_DIR / name).is_file()
        or (generate.PROTO_DIR / name).read_bytes() != (tmp_path / name).read_bytes()
    ]
    assert not stale, f"stale generated files {stale}; run: python -m proto.generate"


def test_no_leftover_generated_files():
    assert generate.stale_files() == []


def test_generated_imports_are_package_qualified():
    for name in generate.generated_files():
        text = (generate.PROTO_DIR / name).read_text()
        for module in ("kv_pb2", "auth_pb2", "rpc_pb2"):
            assert f"\nimport {module} " not in text, name
    assert rpc_pb2.kv__pb2 is kv_pb2
    assert rpc_pb2.auth__pb2 is auth_pb2
    assert rpc_pb2_grpc.rpc__pb2 is rpc_pb2


def test_files_and_packages():
    assert (kv_pb2.DESCRIPTOR.name, kv_pb2.DESCRIPTOR.package) == ("kv.proto", "mvccpb")
    assert (auth_pb2.DESCRIPTOR.name, auth_pb2.DESCRIPTOR.package) == ("auth.proto", "authpb")
    assert (rpc_pb2.DESCRIPTOR.name, rpc_pb2.DESCRIPTOR.package) == ("rpc.proto", "etcdserverpb")
    assert [d.name for d in rpc_pb2.DESCRIPTOR.dependencies] == ["kv.proto", "auth.proto"]
    for name in generate.PROTO_FILES:
        assert 'syntax = "proto3";' in (generate.PROTO_DIR / name).read_text()


# ---------------------------------------------------------------------------
# Fields: (message, field, number, type[, oneof])
# ---------------------------------------------------------------------------

T = FieldDescriptor
FIELDS = [
    # mvccpb
    ("mvccpb.KeyValue", "key", 1, T.TYPE_BYTES),
    ("mvccpb.KeyValue", "create_revision", 2, T.TYPE_INT64),
    ("mvccpb.KeyValue", "mod_revision", 3, T.TYPE_INT64),
    ("mvccpb.KeyValue", "version", 4, T.TYPE_INT64),
    ("mvccpb.KeyValue", "value", 5, T.TYPE_BYTES),
    ("mvccpb.KeyValue", "lease", 6, T.TYPE_INT64),
    ("mvccpb.Event", "type", 1, T.TYPE_ENUM),
    ("mvccpb.Event", "kv", 2, T.TYPE_MESSAGE),
    ("mvccpb.Event", "prev_kv", 3, T.TYPE_MESSAGE),
    # authpb
    ("authpb.UserAddOptions", "no_password", 1, T.TYPE_BOOL),
    ("authpb.User", "name", 1, T.TYPE_BYTES),
    ("authpb.User", "roles", 3, T.TYPE_STRING),
    ("authpb.User", "options", 4, T.TYPE_MESSAGE),
    ("authpb.Permission", "permType", 1, T.TYPE_ENUM),
    ("authpb.Permission", "key", 2, T.TYPE_BYTES),
    ("authpb.Permission", "range_end", 3, T.TYPE_BYTES),
    ("authpb.Role", "keyPermission", 2, T.TYPE_MESSAGE),
    # header
    ("etcdserverpb.ResponseHeader", "cluster_id", 1, T.TYPE_UINT64),
    ("etcdserverpb.ResponseHeader", "member_id", 2, T.TYPE_UINT64),
    ("etcdserverpb.ResponseHeader", "revision", 3, T.TYPE_INT64),
    ("etcdserverpb.ResponseHeader", "raft_term", 4, T.TYPE_UINT64),
    # KV
    ("etcdserverpb.RangeRequest", "range_end", 2, T.TYPE_BYTES),
    ("etcdserverpb.RangeRequest", "limit", 3, T.TYPE_INT64),
    ("etcdserverpb.RangeRequest", "revision", 4, T.TYPE_INT64),
    ("etcdserverpb.RangeRequest", "sort_order", 5, T.TYPE_ENUM),
    ("etcdserverpb.RangeRequest", "sort_target", 6, T.TYPE_ENUM),
    ("etcdserverpb.RangeRequest", "serializable", 7, T.TYPE_BOOL),
    ("etcdserverpb.RangeRequest", "keys_only", 8, T.TYPE_BOOL),
    ("etcdserverpb.RangeRequest", "count_only", 9, T.TYPE_BOOL),
    ("etcdserverpb.RangeRequest", "min_mod_revision", 10, T.TYPE_INT64),
    ("etcdserverpb.RangeRequest", "max_mod_revision", 11, T.TYPE_INT64),
    ("etcdserverpb.RangeRequest", "min_create_revision", 12, T.TYPE_INT64),
    ("etcdserverpb.RangeRequest", "max_create_revision", 13, T.TYPE_INT64),
    ("etcdserverpb.RangeResponse", "kvs", 2, T.TYPE_MESSAGE),
    ("etcdserverpb.RangeResponse", "more", 3, T.TYPE_BOOL),
    ("etcdserverpb.RangeResponse", "count", 4, T.TYPE_INT64),
    ("etcdserverpb.PutRequest", "lease", 3, T.TYPE_INT64),
    ("etcdserverpb.PutRequest", "prev_kv", 4, T.TYPE_BOOL),
    ("etcdserverpb.PutRequest", "ignore_value", 5, T.TYPE_BOOL),
    ("etcdserverpb.PutRequest", "ignore_lease", 6, T.TYPE_BOOL),
    ("etcdserverpb.PutResponse", "prev_kv", 2, T.TYPE_MESSAGE),
    ("etcdserverpb.DeleteRangeRequest", "prev_kv", 3, T.TYPE_BOOL),
    ("etcdserverpb.DeleteRangeResponse", "deleted", 2, T.TYPE_INT64),
    ("etcdserverpb.DeleteRangeResponse", "prev_kvs", 3, T.TYPE_MESSAGE),
    ("etcdserverpb.RequestOp", "request_range", 1, T.TYPE_MESSAGE, "request"),
    ("etcdserverpb.RequestOp", "request_put", 2, T.TYPE_MESSAGE, "request"),
    ("etcdserverpb.RequestOp", "request_delete_range", 3, T.TYPE_MESSAGE, "request"),
    ("etcdserverpb.RequestOp", "request_txn", 4, T.TYPE_MESSAGE, "request"),
    ("etcdserverpb.ResponseOp", "response_range", 1, T.TYPE_MESSAGE, "response"),
    ("etcdserverpb.ResponseOp", "response_txn", 4, T.TYPE_MESSAGE, "response"),
    ("etcdserverpb.Compare", "result", 1, T.TYPE_ENUM),
    ("etcdserverpb.Compare", "target", 2, T.TYPE_ENUM),
    ("etcdserverpb.Compare", "key", 3, T.TYPE_BYTES),
    ("etcdserverpb.Compare", "version", 4, T.TYPE_INT64, "target_union"),
    ("etcdserverpb.Compare", "create_revision", 5, T.TYPE_INT64, "target_union"),
    ("etcdserverpb.Compare", "mod_revision", 6, T.TYPE_INT64, "target_union"),
    ("etcdserverpb.Compare", "value", 7, T.TYPE_BYTES, "target_union"),
    ("etcdserverpb.Compare", "lease", 8, T.TYPE_INT64, "target_union"),
    ("etcdserverpb.Compare", "range_end", 64, T.TYPE_BYTES),
    ("etcdserverpb.TxnRequest", "compare", 1, T.TYPE_MESSAGE),
    ("etcdserverpb.TxnRequest", "success", 2, T.TYPE_MESSAGE),
    ("etcdserverpb.TxnRequest", "failure", 3, T.TYPE_MESSAGE),
    ("etcdserverpb.TxnResponse", "succeeded", 2, T.TYPE_BOOL),
    ("etcdserverpb.TxnResponse", "responses", 3, T.TYPE_MESSAGE),
    ("etcdserverpb.CompactionRequest", "revision", 1, T.TYPE_INT64),
    ("etcdserverpb.CompactionRequest", "physical", 2, T.TYPE_BOOL),
    # Watch
    ("etcdserverpb.WatchRequest", "create_request", 1, T.TYPE_MESSAGE, "request_union"),
    ("etcdserverpb.WatchRequest", "cancel_request", 2, T.TYPE_MESSAGE, "request_union"),
    ("etcdserverpb.WatchRequest", "progress_request", 3, T.TYPE_MESSAGE, "request_union"),
    ("etcdserverpb.WatchCreateRequest", "start_revision", 3, T.TYPE_INT64),
    ("etcdserverpb.WatchCreateRequest", "progress_notify", 4, T.TYPE_BOOL),
    ("etcdserverpb.WatchCreateRequest", "filters", 5, T.TYPE_ENUM),
    ("etcdserverpb.WatchCreateRequest", "prev_kv", 6, T.TYPE_BOOL),
    ("etcdserverpb.WatchCreateRequest", "watch_id", 7, T.TYPE_INT64),
    ("etcdserverpb.WatchCreateRequest", "fragment", 8, T.TYPE_BOOL),
    ("etcdserverpb.WatchCancelRequest", "watch_id", 1, T.TYPE_INT64),
    ("etcdserverpb.WatchResponse", "watch_id", 2, T.TYPE_INT64),
    ("etcdserverpb.WatchResponse", "created", 3, T.TYPE_BOOL),
    ("etcdserverpb.WatchResponse", "canceled", 4, T.TYPE_BOOL),
    ("etcdserverpb.WatchResponse", "compact_revision", 5, T.TYPE_INT64),
    ("etcdserverpb.WatchResponse", "cancel_reason", 6, T.TYPE_STRING),
    ("etcdserverpb.WatchResponse", "fragment", 7, T.TYPE_BOOL),
    ("etcdserverpb.WatchResponse", "events", 11, T.TYPE_MESSAGE),
    # Lease
    ("etcdserverpb.LeaseGrantRequest", "TTL", 1, T.TYPE_INT64),
    ("etcdserverpb.LeaseGrantRequest", "ID", 2, T.TYPE_INT64),
    ("etcdserverpb.LeaseGrantResponse", "ID", 2, T.TYPE_INT64),
    ("etcdserverpb.LeaseGrantResponse", "TTL", 3, T.TYPE_INT64),
    ("etcdserverpb.LeaseGrantResponse", "error", 4, T.TYPE_STRING),
    ("etcdserverpb.LeaseKeepAliveResponse", "TTL", 3, T.TYPE_INT64),
    ("etcdserverpb.LeaseTimeToLiveRequest", "keys", 2, T.TYPE_BOOL),
    ("etcdserverpb.LeaseTimeToLiveResponse", "grantedTTL", 4, T.TYPE_INT64),
    ("etcdserverpb.LeaseTimeToLiveResponse", "keys", 5, T.TYPE_BYTES),
    ("etcdserverpb.LeaseCheckpoint", "remaining_TTL", 2, T.TYPE_INT64),
    ("etcdserverpb.LeaseLeasesResponse", "leases", 2, T.TYPE_MESSAGE),
    # Cluster
    ("etcdserverpb.Member", "ID", 1, T.TYPE_UINT64),
    ("etcdserverpb.Member", "name", 2, T.TYPE_STRING),
    ("etcdserverpb.Member", "peerURLs", 3, T.TYPE_STRING),
    ("etcdserverpb.Member", "clientURLs", 4, T.TYPE_STRING),
    ("etcdserverpb.Member", "isLearner", 5, T.TYPE_BOOL),
    ("etcdserverpb.MemberAddRequest", "isLearner", 2, T.TYPE_BOOL),
    ("etcdserverpb.MemberAddResponse", "member", 2, T.TYPE_MESSAGE),
    ("etcdserverpb.MemberAddResponse", "members", 3, T.TYPE_MESSAGE),
    ("etcdserverpb.MemberListRequest", "linearizable", 1, T.TYPE_BOOL),
    # Maintenance
    ("etcdserverpb.AlarmRequest", "action", 1, T.TYPE_ENUM),
    ("etcdserverpb.AlarmRequest", "memberID", 2, T.TYPE_UINT64),
    ("etcdserverpb.AlarmRequest", "alarm", 3, T.TYPE_ENUM),
    ("etcdserverpb.StatusResponse", "version", 2, T.TYPE_STRING),
    ("etcdserverpb.StatusResponse", "dbSize", 3, T.TYPE_INT64),
    ("etcdserverpb.StatusResponse", "leader", 4, T.TYPE_UINT64),
    ("etcdserverpb.StatusResponse", "raftIndex", 5, T.TYPE_UINT64),
    ("etcdserverpb.StatusResponse", "raftTerm", 6, T.TYPE_UINT64),
    ("etcdserverpb.StatusResponse", "raftAppliedIndex", 7, T.TYPE_UINT64),
    ("etcdserverpb.StatusResponse", "errors", 8, T.TYPE_STRING),
    ("etcdserverpb.StatusResponse", "dbSizeInUse", 9, T.TYPE_INT64),
    ("etcdserverpb.StatusResponse", "isLearner", 10, T.TYPE_BOOL),
    ("etcdserverpb.HashResponse", "hash", 2, T.TYPE_UINT32),
    ("etcdserverpb.HashKVResponse", "hash", 2, T.TYPE_UINT32),
    ("etcdserverpb.HashKVResponse", "compact_revision", 3, T.TYPE_INT64),
    ("etcdserverpb.SnapshotResponse", "remaining_bytes", 2, T.TYPE_UINT64),
    ("etcdserverpb.SnapshotResponse", "blob", 3, T.TYPE_BYTES),
    ("etcdserverpb.MoveLeaderRequest", "targetID", 1, T.TYPE_UINT64),
    ("etcdserverpb.DowngradeRequest", "action", 1, T.TYPE_ENUM),
    ("etcdserverpb.DowngradeRequest", "version", 2, T.TYPE_STRING),
    # Auth
    ("etcdserverpb.AuthStatusResponse", "enabled", 2, T.TYPE_BOOL),
    ("etcdserverpb.AuthStatusResponse", "authRevision", 3, T.TYPE_UINT64),
    ("etcdserverpb.AuthenticateResponse", "token", 2, T.TYPE_STRING),
    ("etcdserverpb.AuthUserAddRequest", "options", 3, T.TYPE_MESSAGE),
    ("etcdserverpb.AuthUserAddRequest", "hashedPassword", 4, T.TYPE_STRING),
    ("etcdserverpb.AuthUserChangePasswordRequest", "hashedPassword", 3, T.TYPE_STRING),
    ("etcdserverpb.AuthUserGrantRoleRequest", "user", 1, T.TYPE_STRING),
    ("etcdserverpb.AuthUserGrantRoleRequest", "role", 2, T.TYPE_STRING),
    ("etcdserverpb.AuthUserRevokeRoleRequest", "name", 1, T.TYPE_STRING),
    ("etcdserverpb.AuthRoleGetRequest", "role", 1, T.TYPE_STRING),
    ("etcdserverpb.AuthRoleGetResponse", "perm", 2, T.TYPE_MESSAGE),
    ("etcdserverpb.AuthRoleGrantPermissionRequest", "name", 1, T.TYPE_STRING),
    ("etcdserverpb.AuthRoleGrantPermissionRequest", "perm", 2, T.TYPE_MESSAGE),
    ("etcdserverpb.AuthRoleRevokePermissionRequest", "role", 1, T.TYPE_STRING),
    ("etcdserverpb.AuthRoleRevokePermissionRequest", "range_end", 3, T.TYPE_BYTES),
    ("etcdserverpb.AuthUserListResponse", "users", 2, T.TYPE_STRING),
]


@pytest.mark.parametrize(
    "message, field, number, ftype, oneof",
    [(*fact, None) if len(fact) == 4 else fact for fact in FIELDS],
    ids=[f"{fact[0].split('.')[-1]}.{fact[1]}" for fact in FIELDS],
)
def test_field(message, field, number, ftype, oneof):
    desc = POOL.FindMessageTypeByName(message).fields_by_name[field]
    assert desc.number == number
    assert desc.type == ftype
    containing = desc.containing_oneof
    assert (containing.name if containing else None) == oneof


REPEATED = {
    ("mvccpb.Event", "kv"): False,
    ("etcdserverpb.RangeResponse", "kvs"): True,
    ("etcdserverpb.DeleteRangeResponse", "prev_kvs"): True,
    ("etcdserverpb.WatchCreateRequest", "filters"): True,
    ("etcdserverpb.WatchResponse", "events"): True,
    ("etcdserverpb.StatusResponse", "errors"): True,
    ("etcdserverpb.Member", "peerURLs"): True,
    ("etcdserverpb.MemberAddResponse", "member"): False,
    ("etcdserverpb.LeaseTimeToLiveResponse", "keys"): True,
    ("etcdserverpb.AuthRoleGetResponse", "perm"): True,
    ("authpb.Role", "keyPermission"): True,
}


@pytest.mark.parametrize("key, repeated", REPEATED.items(), ids=lambda v: str(v))
def test_cardinality(key, repeated):
    message, field = key
    assert POOL.FindMessageTypeByName(message).fields_by_name[field].is_repeated is repeated


# Field numbers per message, exactly: catches additions from later etcd lines.
EXACT_NUMBERS = {
    "etcdserverpb.HashKVResponse": [1, 2, 3],  # hash_revision=4 arrived in 3.6
    "etcdserverpb.SnapshotResponse": [1, 2, 3],  # version=4 arrived in 3.6
    "etcdserverpb.StatusResponse": list(range(1, 11)),  # 11..13 are 3.6
    "etcdserverpb.WatchCreateRequest": list(range(1, 9)),
    "etcdserverpb.WatchResponse": [1, 2, 3, 4, 5, 6, 7, 11],
    "etcdserverpb.RangeRequest": list(range(1, 14)),
    "etcdserverpb.Compare": [1, 2, 3, 4, 5, 6, 7, 8, 64],
    "mvccpb.KeyValue": list(range(1, 7)),
}


@pytest.mark.parametrize("message, numbers", EXACT_NUMBERS.items())
def test_exact_field_numbers(message, numbers):
    assert sorted(f.number for f in POOL.FindMessageTypeByName(message).fields) == numbers


def test_no_messages_from_later_releases():
    names = set(rpc_pb2.DESCRIPTOR.message_types_by_name)
    assert not names & {"DowngradeInfo", "DowngradeVersionTestRequest"}


def test_field_types_reference_the_right_messages():
    ref = {
        ("etcdserverpb.RangeResponse", "kvs"): "mvccpb.KeyValue",
        ("etcdserverpb.WatchResponse", "events"): "mvccpb.Event",
        ("etcdserverpb.RequestOp", "request_txn"): "etcdserverpb.TxnRequest",
        ("etcdserverpb.ResponseOp", "response_txn"): "etcdserverpb.TxnResponse",
        ("etcdserverpb.WatchRequest", "progress_request"): "etcdserverpb.WatchProgressRequest",
        ("etcdserverpb.AuthUserAddRequest", "options"): "authpb.UserAddOptions",
        ("etcdserverpb.AuthRoleGrantPermissionRequest", "perm"): "authpb.Permission",
    }
    for (message, field), target in ref.items():
        fd = POOL.FindMessageTypeByName(message).fields_by_name[field]
        assert fd.message_type.full_name == target, (message, field)


# ---------------------------------------------------------------------------
# Enums
# ---------------------------------------------------------------------------

ENUMS = {
    "mvccpb.Event.EventType": {"PUT": 0, "DELETE": 1},
    "authpb.Permission.Type": {"READ": 0, "WRITE": 1, "READWRITE": 2},
    "etcdserverpb.RangeRequest.SortOrder": {"NONE": 0, "ASCEND": 1, "DESCEND": 2},
    "etcdserverpb.RangeRequest.SortTarget": {
        "KEY": 0, "VERSION": 1, "CREATE": 2, "MOD": 3, "VALUE": 4,
    },
    "etcdserverpb.Compare.CompareResult": {"EQUAL": 0, "GREATER": 1, "LESS": 2, "NOT_EQUAL": 3},
    "etcdserverpb.Compare.CompareTarget": {
        "VERSION": 0, "CREATE": 1, "MOD": 2, "VALUE": 3, "LEASE": 4,
    },
    "etcdserverpb.WatchCreateRequest.FilterType": {"NOPUT": 0, "NODELETE": 1},
    "etcdserverpb.AlarmType": {"NONE": 0, "NOSPACE": 1, "CORRUPT": 2},
    "etcdserverpb.AlarmRequest.AlarmAction": {"GET": 0, "ACTIVATE": 1, "DEACTIVATE": 2},
    "etcdserverpb.DowngradeRequest.DowngradeAction": {"VALIDATE": 0, "ENABLE": 1, "CANCEL": 2},
}


@pytest.mark.parametrize("enum, values", ENUMS.items())
def test_enum(enum, values):
    desc = POOL.FindEnumTypeByName(enum)
    assert {v.name: v.number for v in desc.values} == values


# ---------------------------------------------------------------------------
# Services: method -> (request, response, client streaming, server streaming)
# ---------------------------------------------------------------------------

SERVICES = {
    "KV": {
        "Range": ("RangeRequest", "RangeResponse", False, False),
        "Put": ("PutRequest", "PutResponse", False, False),
        "DeleteRange": ("DeleteRangeRequest", "DeleteRangeResponse", False, False),
        "Txn": ("TxnRequest", "TxnResponse", False, False),
        "Compact": ("CompactionRequest", "CompactionResponse", False, False),
    },
    "Watch": {"Watch": ("WatchRequest", "WatchResponse", True, True)},
    "Lease": {
        "LeaseGrant": ("LeaseGrantRequest", "LeaseGrantResponse", False, False),
        "LeaseRevoke": ("LeaseRevokeRequest", "LeaseRevokeResponse", False, False),
        "LeaseKeepAlive": ("LeaseKeepAliveRequest", "LeaseKeepAliveResponse", True, True),
        "LeaseTimeToLive": ("LeaseTimeToLiveRequest", "LeaseTimeToLiveResponse", False, False),
        "LeaseLeases": ("LeaseLeasesRequest", "LeaseLeasesResponse", False, False),
    },
    "Cluster": {
        name: (f"{name}Request", f"{name}Response", False, False)
        for name in ("MemberAdd", "MemberRemove", "MemberUpdate", "MemberList", "MemberPromote")
    },
    "Maintenance": {
        "Alarm": ("AlarmRequest", "AlarmResponse", False, False),
        "Status": ("StatusRequest", "StatusResponse", False, False),
        "Defragment": ("DefragmentRequest", "DefragmentResponse", False, False),
        "Hash": ("HashRequest", "HashResponse", False, False),
        "HashKV": ("HashKVRequest", "HashKVResponse", False, False),
        "Snapshot": ("SnapshotRequest", "SnapshotResponse", False, True),
        "MoveLeader": ("MoveLeaderRequest", "MoveLeaderResponse", False, False),
        "Downgrade": ("DowngradeRequest", "DowngradeResponse", False, False),
    },
    "Auth": {
        "AuthEnable": ("AuthEnableRequest", "AuthEnableResponse", False, False),
        "AuthDisable": ("AuthDisableRequest", "AuthDisableResponse", False, False),
        "AuthStatus": ("AuthStatusRequest", "AuthStatusResponse", False, False),
        "Authenticate": ("AuthenticateRequest", "AuthenticateResponse", False, False),
        **{
            method: (f"Auth{method}Request", f"Auth{method}Response", False, False)
            for method in (
                "UserAdd", "UserGet", "UserList", "UserDelete", "UserChangePassword",
                "UserGrantRole", "UserRevokeRole", "RoleAdd", "RoleGet", "RoleList",
                "RoleDelete", "RoleGrantPermission", "RoleRevokePermission",
            )
        },
    },
}


def test_service_set():
    assert set(rpc_pb2.DESCRIPTOR.services_by_name) == set(SERVICES)


@pytest.mark.parametrize("service, methods", SERVICES.items())
def test_service_methods(service, methods):
    desc = POOL.FindServiceByName(f"etcdserverpb.{service}")
    actual = {
        m.name: (m.input_type.name, m.output_type.name, m.client_streaming, m.server_streaming)
        for m in desc.methods
    }
    assert actual == methods
    for m in desc.methods:
        assert m.input_type.file.package == "etcdserverpb"


def test_grpc_method_paths():
    # The HTTP/2 path is what actually goes over the wire.
    stubs_src = (generate.PROTO_DIR / "rpc_pb2_grpc.py").read_text()
    for path in (
        "/etcdserverpb.KV/Range",
        "/etcdserverpb.KV/Compact",
        "/etcdserverpb.Watch/Watch",
        "/etcdserverpb.Lease/LeaseKeepAlive",
        "/etcdserverpb.Maintenance/Snapshot",
        "/etcdserverpb.Auth/RoleRevokePermission",
    ):
        assert f"'{path}'" in stubs_src


# ---------------------------------------------------------------------------
# Encoded bytes for a few hand-checked messages
# ---------------------------------------------------------------------------


def test_wire_bytes():
    # Compare.range_end is tag 64: key (64 << 3 | 2) = 514 = varint 0x82 0x04.
    assert rpc_pb2.Compare(range_end=b"z").SerializeToString() == b"\x82\x04\x01z"
    # Compare.value is inside target_union with tag 7.
    assert rpc_pb2.Compare(value=b"v").SerializeToString() == b"\x3a\x01v"
    # WatchResponse.events is tag 11.
    ev = rpc_pb2.WatchResponse(events=[kv_pb2.Event()]).SerializeToString()
    assert ev == b"\x5a\x00"
    # An empty WatchProgressRequest still selects the oneof (tag 3, length 0).
    wr = rpc_pb2.WatchRequest(progress_request=rpc_pb2.WatchProgressRequest())
    assert wr.SerializeToString() == b"\x1a\x00"
    assert rpc_pb2.RangeRequest(count_only=True).SerializeToString() == b"\x48\x01"


# ---------------------------------------------------------------------------
# v3lockpb and v3electionpb (etcd's server/etcdserver/api/v3lock, v3election)
# ---------------------------------------------------------------------------

RECIPE_FIELDS = [
    ("v3lockpb.LockRequest", "name", 1, T.TYPE_BYTES),
    ("v3lockpb.LockRequest", "lease", 2, T.TYPE_INT64),
    ("v3lockpb.LockResponse", "header", 1, T.TYPE_MESSAGE),
    ("v3lockpb.LockResponse", "key", 2, T.TYPE_BYTES),
    ("v3lockpb.UnlockRequest", "key", 1, T.TYPE_BYTES),
    ("v3lockpb.UnlockResponse", "header", 1, T.TYPE_MESSAGE),
    ("v3electionpb.CampaignRequest", "name", 1, T.TYPE_BYTES),
    ("v3electionpb.CampaignRequest", "lease", 2, T.TYPE_INT64),
    ("v3electionpb.CampaignRequest", "value", 3, T.TYPE_BYTES),
    ("v3electionpb.CampaignResponse", "header", 1, T.TYPE_MESSAGE),
    ("v3electionpb.CampaignResponse", "leader", 2, T.TYPE_MESSAGE),
    ("v3electionpb.LeaderKey", "name", 1, T.TYPE_BYTES),
    ("v3electionpb.LeaderKey", "key", 2, T.TYPE_BYTES),
    ("v3electionpb.LeaderKey", "rev", 3, T.TYPE_INT64),
    ("v3electionpb.LeaderKey", "lease", 4, T.TYPE_INT64),
    ("v3electionpb.LeaderRequest", "name", 1, T.TYPE_BYTES),
    ("v3electionpb.LeaderResponse", "header", 1, T.TYPE_MESSAGE),
    ("v3electionpb.LeaderResponse", "kv", 2, T.TYPE_MESSAGE),
    ("v3electionpb.ResignRequest", "leader", 1, T.TYPE_MESSAGE),
    ("v3electionpb.ResignResponse", "header", 1, T.TYPE_MESSAGE),
    ("v3electionpb.ProclaimRequest", "leader", 1, T.TYPE_MESSAGE),
    ("v3electionpb.ProclaimRequest", "value", 2, T.TYPE_BYTES),
    ("v3electionpb.ProclaimResponse", "header", 1, T.TYPE_MESSAGE),
]


@pytest.mark.parametrize("message, field, number, ftype", RECIPE_FIELDS,
                         ids=[f"{m.split('.')[-1]}.{f}" for m, f, _, _ in RECIPE_FIELDS])
def test_recipe_fields(message, field, number, ftype):
    from proto import v3election_pb2, v3lock_pb2  # noqa: F401 - registers the messages

    msg = POOL.FindMessageTypeByName(message)
    assert (msg.fields_by_name[field].number, msg.fields_by_name[field].type) == (number, ftype)
    assert sorted(f.number for f in msg.fields) == sorted(n for m, _, n, _ in RECIPE_FIELDS if m == message)


def test_recipe_services_and_paths():
    from proto import v3election_pb2, v3election_pb2_grpc, v3lock_pb2, v3lock_pb2_grpc  # noqa: F401

    lock = POOL.FindServiceByName("v3lockpb.Lock")
    assert {m.name: (m.input_type.full_name, m.output_type.full_name, m.server_streaming) for m in lock.methods} == {
        "Lock": ("v3lockpb.LockRequest", "v3lockpb.LockResponse", False),
        "Unlock": ("v3lockpb.UnlockRequest", "v3lockpb.UnlockResponse", False),
    }
    election = POOL.FindServiceByName("v3electionpb.Election")
    assert {m.name: (m.input_type.name, m.output_type.name, m.server_streaming) for m in election.methods} == {
        "Campaign": ("CampaignRequest", "CampaignResponse", False),
        "Proclaim": ("ProclaimRequest", "ProclaimResponse", False),
        "Leader": ("LeaderRequest", "LeaderResponse", False),
        "Observe": ("LeaderRequest", "LeaderResponse", True),
        "Resign": ("ResignRequest", "ResignResponse", False),
    }
    assert POOL.FindMessageTypeByName("v3electionpb.LeaderResponse").fields_by_name["kv"].message_type.full_name \
        == "mvccpb.KeyValue"
    assert "'/v3lockpb.Lock/Lock'" in (generate.PROTO_DIR / "v3lock_pb2_grpc.py").read_text()
    assert "'/v3electionpb.Election/Observe'" in (generate.PROTO_DIR / "v3election_pb2_grpc.py").read_text()
