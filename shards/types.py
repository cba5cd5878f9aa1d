"""Plain request and result types of the store contract.

Keys and values are bytes; key-values travel as serialized
``mvccpb.KeyValue`` bytes (the same bytes the store keeps as rows), so the
gRPC layer can splice them into responses without re-encoding.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

# RangeRequest.SortOrder / SortTarget, Compare.CompareTarget / CompareResult
SORT_NONE, SORT_ASCEND, SORT_DESCEND = 0, 1, 2
TARGET_KEY, TARGET_VERSION, TARGET_CREATE, TARGET_MOD, TARGET_VALUE = 0, 1, 2, 3, 4
CMP_VERSION, CMP_CREATE, CMP_MOD, CMP_VALUE, CMP_LEASE = 0, 1, 2, 3, 4
RESULT_EQUAL, RESULT_GREATER, RESULT_LESS, RESULT_NOT_EQUAL = 0, 1, 2, 3


@dataclass(unsafe_hash=True, slots=True)  # immutable by convention: a frozen dataclass's __init__ costs ~1.4 µs more
class RangeReq:
    key: bytes
    range_end: bytes = b""
    limit: int = 0
    revision: int = 0
    sort_order: int = SORT_NONE
    sort_target: int = TARGET_KEY
    keys_only: bool = False
    count_only: bool = False
    min_mod_revision: int = 0
    max_mod_revision: int = 0
    min_create_revision: int = 0
    max_create_revision: int = 0


@dataclass(unsafe_hash=True, slots=True)  # immutable by convention: a frozen dataclass's __init__ costs ~1.4 µs more
class PutReq:
    key: bytes
    value: bytes = b""
    lease: int = 0
    prev_kv: bool = False
    ignore_value: bool = False
    ignore_lease: bool = False


@dataclass(unsafe_hash=True, slots=True)  # immutable by convention: a frozen dataclass's __init__ costs ~1.4 µs more
class DeleteReq:
    key: bytes
    range_end: bytes = b""
    prev_kv: bool = False


@dataclass(unsafe_hash=True, slots=True)  # immutable by convention: a frozen dataclass's __init__ costs ~1.4 µs more
class Compare:
    target: int
    result: int
    key: bytes
    range_end: bytes = b""
    value: bytes = b""  # for CMP_VALUE
    number: int = 0  # for version / create / mod / lease


@dataclass(unsafe_hash=True, slots=True)  # immutable by convention: a frozen dataclass's __init__ costs ~1.4 µs more
class TxnReq:
    compare: tuple[Compare, ...] = ()
    success: tuple[Op, ...] = ()
    failure: tuple[Op, ...] = ()


Op = Union[RangeReq, PutReq, DeleteReq, TxnReq, None]


@dataclass(slots=True)
class RangeResult:
    revision: int
    kvs: list[bytes] = field(default_factory=list)
    more: bool = False
    count: int = 0


@dataclass(slots=True)
class PutResult:
    revision: int
    prev_kv: bytes | None = None


@dataclass(slots=True)
class DeleteResult:
    revision: int
    deleted: int = 0
    prev_kvs: list[bytes] = field(default_factory=list)


@dataclass(slots=True)
class TxnResult:
    revision: int
    succeeded: bool
    responses: list[OpResult] = field(default_factory=list)


OpResult = Union[RangeResult, PutResult, DeleteResult, TxnResult, None]
