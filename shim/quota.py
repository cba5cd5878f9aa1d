"""Backend quota and the NOSPACE alarm, as etcd's quotaKVServer / applierV3Capped.

A write whose cost would take the state past ``--quota-backend-bytes`` raises
the NOSPACE alarm and fails; while the alarm is active, every Put, every Txn
that puts something and every LeaseGrant fails with "database space
exceeded" — deletes and compaction still work — until an operator reclaims
space (compact + defrag) and disarms the alarm.
"""
from __future__ import annotations

from proto import rpc_pb2 as pb
from shards.alarms import NOSPACE, AlarmStore
from shards.types import PutReq

from .errors import NO_SPACE, RequestError

DEFAULT_QUOTA_BYTES = 2 * 1024**3
KV_OVERHEAD_BYTES = 256
LEASE_OVERHEAD_BYTES = 64


def cost_put(r: pb.PutRequest | PutReq) -> int:
    return KV_OVERHEAD_BYTES + len(r.key) + len(r.value)


def cost_txn(r: pb.TxnRequest) -> int:
    """The larger of the two branches' top-level puts (nested txns are free, as in etcd)."""

    def branch(ops) -> int:
        return sum(cost_put(op.request_put) for op in ops if op.WhichOneof("request") == "request_put")

    return max(branch(r.success), branch(r.failure))


class Quota:
    def __init__(self, store, alarms: AlarmStore, member_id: int, quota_bytes: int) -> None:
        self.store = store
        self.alarms = alarms
        self.member_id = member_id
        self.limit = None if quota_bytes < 0 else (quota_bytes or DEFAULT_QUOTA_BYTES)
    def check(self, cost: int, capped: bool) -> None:
        """Raise NOSPACE if this write does not fit; ``capped``: refused while the alarm is on."""
        if self.limit is not None and self.store.db_size() + cost >= self.limit:
            self.alarms.activate(self.member_id, NOSPACE)
            raise RequestError(NO_SPACE)
        if capped and self.alarms.active(NOSPACE):
            raise RequestError(NO_SPACE)
