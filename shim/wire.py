"""Hand-built response bytes for the hot KV responses.

Rows are stored as serialized ``mvccpb.KeyValue``; a RangeResponse is just
those bytes framed as field 2, so building it by concatenation avoids a
parse and a re-serialize per key.  Field numbers are etcd's:

    ResponseHeader:      cluster_id=1 member_id=2 revision=3 raft_term=4 (varints)
    RangeResponse:       header=1 kvs=2 (repeated) more=3 count=4
    PutResponse:         header=1 prev_kv=2
    DeleteRangeResponse: header=1 deleted=2 prev_kvs=3 (repeated)
    LeaseKeepAliveResponse: header=1 ID=2 TTL=3 (int64 varints)
    TxnResponse:         header=1 succeeded=2 responses=3 (repeated ResponseOp)
    ResponseOp:          response_range=1 response_put=2 response_delete_range=3 response_txn=4
"""
from __future__ import annotations

from shards.record import varint  # (the store encodes tombstone rows and delete events with it too)
from shards.steps import Steps
from shards.types import DeleteResult, PutResult, RangeResult, TxnResult


def _field_varint(tag: int, n: int) -> bytes:
    return bytes((tag,)) + varint(n) if n else b""


class Headers:
    """Builds ResponseHeader bytes for one member; only the revision varies."""

    def __init__(self, cluster_id: int, member_id: int, raft_term: int) -> None:
        self._prefix = _field_varint(0x08, cluster_id) + _field_varint(0x10, member_id)
        self._suffix = _field_varint(0x20, raft_term)
        self._last_rev = -1
        self._last = b""

    def set_term(self, raft_term: int) -> None:
        """A new term from here on (a standby that took over as the writer)."""
        self._suffix = _field_varint(0x20, raft_term)
        self._last_rev = -1

    def framed(self, revision: int) -> bytes:
        """Field 1 (header) of a response, tag and length included."""
        if revision != self._last_rev:
            body = self._prefix + _field_varint(0x18, revision) + self._suffix
            self._last = b"\x0a" + bytes((len(body),)) + body  # at most 4 fields of 11 bytes: one length byte
            self._last_rev = revision
        return self._last


def range_response(header: bytes, kvs: list[bytes], more: bool, count: int) -> bytes:
    parts = [header]
    _rows(parts, kvs)
    _range_tail(parts, more, count)
    return b"".join(parts)


def _rows(parts: list, kvs: list[bytes], tag: bytes = b"\x12") -> None:
    """``kvs`` as a repeated field (``tag``; field 2 of a RangeResponse), appended to ``parts``."""
    for kv in kvs:
        parts.append(tag)
        parts.append(varint(len(kv)))
        parts.append(kv)


def _range_tail(parts: list, more: bool, count: int) -> None:
    if more:
        parts.append(b"\x18\x01")
    if count:
        parts.append(b"\x20" + varint(count))


PART_ROWS = 1024  # rows per part of a large Range answer (about 1 MB at 1 KiB a row)


class Parts(list):
    """One message as byte strings in order, ``size`` bytes in all, never joined: the native
    gRPC server frames each in turn (joining a 100 MB answer held the event loop ~0.1 s, most
    of it faulting in the new buffer's pages); ``joined()`` for whoever needs one bytes."""

    __slots__ = ("size",)

    def joined(self) -> bytes:
        return b"".join(self)


def range_parts(header: bytes, kvs: list[bytes], more: bool, count: int) -> Steps[Parts]:
    """``range_response``'s bytes as Parts of PART_ROWS rows, one part a step."""
    tail: list[bytes] = []
    _range_tail(tail, more, count)
    return _row_parts(header, b"\x12", kvs, b"".join(tail))


def delete_parts(header: bytes, deleted: int, prev_kvs: list[bytes]) -> Steps[Parts]:
    """``delete_response``'s bytes as Parts of PART_ROWS previous rows, one part a step."""
    return _row_parts(header + b"\x10" + varint(deleted) if deleted else header, b"\x1a", prev_kvs, b"")


def _row_parts(head: bytes, tag: bytes, rows: list[bytes], tail: bytes) -> Steps[Parts]:
    """``head``, ``rows`` as the repeated field ``tag``, then ``tail``: Parts of PART_ROWS rows,
    one part a step."""
    parts, size = Parts(), 0
    for start in range(0, len(rows), PART_ROWS):
        chunk = [head] if not start else []
        _rows(chunk, rows[start:start + PART_ROWS], tag)
        if start + PART_ROWS >= len(rows):
            chunk.append(tail)
        data = b"".join(chunk)
        parts.append(data)
        size += len(data)
        yield
    if not parts:
        parts.append(head + tail)
        size = len(parts[0])
    parts.size = size
    return parts


def put_response(header: bytes, prev_kv: bytes | None) -> bytes:
    if prev_kv is None:
        return header
    return header + b"\x12" + varint(len(prev_kv)) + prev_kv


def delete_response(header: bytes, deleted: int, prev_kvs: list[bytes]) -> bytes:
    parts = [header]
    if deleted:
        parts.append(b"\x10" + varint(deleted))
    for kv in prev_kvs:
        parts.append(b"\x1a")
        parts.append(varint(len(kv)))
        parts.append(kv)
    return b"".join(parts)


def _len_field(tag: bytes, data: bytes) -> bytes:
    return tag + varint(len(data)) + data


def _op_header(revision: int) -> bytes:
    """The header of a response inside a txn: the revision only (an empty header is still sent)."""
    return _len_field(b"\x0a", _field_varint(0x18, revision))


_EMPTY_HEADER = b"\x0a\x00"


def txn_response(header: bytes, result: TxnResult) -> bytes:
    parts = [header]
    if result.succeeded:
        parts.append(b"\x10\x01")
    for r in result.responses:
        parts.append(_len_field(b"\x1a", _response_op(r)))
    return b"".join(parts)


def txn_rows(result: TxnResult) -> int:
    """Rows a txn's answer holds: its ranges' and its deletes' previous ones, nested txns' too."""
    n = 0
    for r in result.responses:
        kind = type(r)
        if kind is RangeResult:
            n += len(r.kvs)
        elif kind is DeleteResult:
            n += len(r.prev_kvs)
        elif kind is TxnResult:
            n += txn_rows(r)
    return n


def txn_parts(header: bytes, result: TxnResult) -> Steps[Parts]:
    """``txn_response``'s bytes as Parts: a step per operation's answer, one of more than
    PART_ROWS rows in parts of PART_ROWS rows, a step each (the lengths around them are sums of
    the parts' sizes)."""
    out = Parts()
    pending = [header, b"\x10\x01"] if result.succeeded else [header]
    for r in result.responses:
        op = yield from _op_parts(r)
        if type(op) is bytes:
            pending.append(_len_field(b"\x1a", op))
        else:
            pending.append(b"\x1a" + varint(op.size))
            out.append(b"".join(pending))
            out.extend(op)
            pending = []
        yield
    if pending:
        out.append(b"".join(pending))
    out.size = sum(len(part) for part in out)
    return out


def _op_parts(r) -> Steps[bytes | Parts]:
    """A ResponseOp's bytes; Parts for one of more than PART_ROWS rows."""
    kind = type(r)
    if kind is RangeResult and len(r.kvs) > PART_ROWS:
        return _wrapped(b"\x0a", (yield from range_parts(_op_header(r.revision), r.kvs, r.more, r.count)))
    if kind is DeleteResult and len(r.prev_kvs) > PART_ROWS:
        return _wrapped(b"\x1a", (yield from delete_parts(_op_header(r.revision), r.deleted, r.prev_kvs)))
    if kind is TxnResult and txn_rows(r) > PART_ROWS:
        return _wrapped(b"\x22", (yield from txn_parts(_EMPTY_HEADER, r)))
    return _response_op(r)


def _wrapped(tag: bytes, inner: Parts) -> Parts:
    """``inner`` as the field ``tag`` of the message around it: its tag and length, then it."""
    out = Parts([tag + varint(inner.size), *inner])
    out.size = len(out[0]) + inner.size
    return out


def _response_op(r) -> bytes:
    kind = type(r)
    if kind is PutResult:
        if r.prev_kv is None and r.revision:  # the header alone, every length below 128: one byte each
            rev = varint(r.revision)
            n = len(rev) + 1
            return b"\x12" + bytes((n + 2, 0x0A, n, 0x18)) + rev
        return _len_field(b"\x12", put_response(_op_header(r.revision), r.prev_kv))
    if kind is RangeResult:
        return _len_field(b"\x0a", range_response(_op_header(r.revision), r.kvs, r.more, r.count))
    if kind is DeleteResult:
        return _len_field(b"\x1a", delete_response(_op_header(r.revision), r.deleted, r.prev_kvs))
    if kind is TxnResult:
        return _len_field(b"\x22", txn_response(_EMPTY_HEADER, r))
    return b""


def encode_event(kind: int, kv: bytes, prev_kv: bytes | None) -> bytes:
    """mvccpb.Event: type=1 (omitted for PUT) kv=2 prev_kv=3."""
    out = (b"\x08\x01" if kind else b"") + _len_field(b"\x12", kv)
    return out + _len_field(b"\x1a", prev_kv) if prev_kv is not None else out


def watch_response(
    header: bytes,
    watch_id: int,
    events: list[bytes] = (),
    *,
    created: bool = False,
    canceled: bool = False,
    compact_revision: int = 0,
    cancel_reason: str = "",
    fragment: bool = False,
) -> bytes:
    """WatchResponse: header=1 watch_id=2 created=3 canceled=4 compact_revision=5
    cancel_reason=6 fragment=7 events=11; events are encoded Event bytes."""
    parts = [header]
    if watch_id:
        parts.append(b"\x10" + varint(watch_id))
    if created:
        parts.append(b"\x18\x01")
    if canceled:
        parts.append(b"\x20\x01")
    if compact_revision:
        parts.append(b"\x28" + varint(compact_revision))
    if cancel_reason:
        parts.append(_len_field(b"\x32", cancel_reason.encode()))
    if fragment:
        parts.append(b"\x38\x01")
    for ev in events:
        parts.append(_len_field(b"\x5a", ev))
    return b"".join(parts)


def event_field(event: bytes) -> bytes:
    """An encoded mvccpb.Event as a WatchResponse's events field (tag and length included)."""
    return b"\x5a" + varint(len(event)) + event


def watch_event_response(header: bytes, watch_id: int, field: bytes) -> bytes:
    """watch_response(header, watch_id, [event]) for a watch id > 0, with nothing else set;
    ``field``: the event as ``event_field`` frames it (once for every watcher it goes to)."""
    return b"".join((header, b"\x10", varint(watch_id), field))


def fragments(events: list[bytes], base_bytes: int, max_bytes: int) -> list[list[bytes]]:
    """Split events as etcd does: a fragment grows until adding an event would
    reach max_bytes (each fragment keeps at least one event)."""
    out: list[list[bytes]] = []
    cur: list[bytes] = []
    size = base_bytes
    for ev in events:
        ev_bytes = 1 + len(varint(len(ev))) + len(ev)
        if cur and size + ev_bytes >= max_bytes:
            out.append(cur)
            cur, size = [], base_bytes
        cur.append(ev)
        size += ev_bytes
    out.append(cur)
    return out


def keepalive_response(header: bytes, lease_id: int, ttl: int) -> bytes:
    return header + _field_varint(0x10, lease_id) + _field_varint(0x18, ttl)
