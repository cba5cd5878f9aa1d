"""Why request bytes do not parse, in the words etcd's server gives: its messages are decoded
by code gogo/protobuf generated (``func (m *RangeRequest) Unmarshal``), whose errors grpc-go
passes on as INTERNAL "grpc: error unmarshalling request: <error>".

Only called once Python's protobuf has refused the bytes: the walk below follows the generated
code's order of checks over the message's descriptor (field numbers, wire types, lengths,
nested messages, unknown fields skipped as ``skipRpc`` skips them) and returns the first error
that code meets. Go's field names are the descriptor's in protoc-gen-gogo's CamelCase.
"""
from __future__ import annotations

from functools import lru_cache

from google.protobuf.descriptor import Descriptor, FieldDescriptor

_EOF = "unexpected EOF"
_OVERFLOW = "proto: integer overflow"
_NEGATIVE = "proto: negative length found during unmarshaling"
_MASK64 = (1 << 64) - 1
_INT_MAX = (1 << 63) - 1

# the wire type each field type is written with (a repeated scalar also takes 2, packed)
_WIRE = {FieldDescriptor.TYPE_DOUBLE: 1, FieldDescriptor.TYPE_FIXED64: 1, FieldDescriptor.TYPE_SFIXED64: 1,
         FieldDescriptor.TYPE_FLOAT: 5, FieldDescriptor.TYPE_FIXED32: 5, FieldDescriptor.TYPE_SFIXED32: 5,
         FieldDescriptor.TYPE_STRING: 2, FieldDescriptor.TYPE_BYTES: 2, FieldDescriptor.TYPE_MESSAGE: 2,
         FieldDescriptor.TYPE_GROUP: 3}  # the rest: varints


class _Refused(Exception):
    pass


def unmarshal_error(descriptor: Descriptor, data: bytes) -> str | None:
    """gogo's error for ``data`` as a ``descriptor`` message; None if its code takes the bytes."""
    try:
        _message(descriptor, data)
    except _Refused as exc:
        return str(exc)
    return None


@lru_cache(maxsize=None)
def camel_case(name: str) -> str:
    """protoc-gen-gogo's CamelCase of a field name (range_end: RangeEnd, peerURLs: PeerURLs)."""
    out, i = [], 0
    if name[:1] == "_":
        out.append("X")
        i = 1
    while i < len(name):
        c = name[i]
        if c == "_" and i + 1 < len(name) and name[i + 1].islower() and name[i + 1].isascii():
            i += 1
            continue
        if c.isdigit():
            out.append(c)
            i += 1
            continue
        out.append(c.upper() if c.islower() and c.isascii() else c)
        i += 1
        while i < len(name) and name[i].islower() and name[i].isascii():
            out.append(name[i])
            i += 1
    return "".join(out)


def _go_type(descriptor: Descriptor) -> str:
    """The Go type a message is generated as: nested names joined by '_'."""
    package = descriptor.file.package
    name = descriptor.full_name[len(package) + 1:] if package else descriptor.full_name
    return name.replace(".", "_")


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if shift >= 64:
            raise _Refused(_OVERFLOW)
        if i >= len(data):
            raise _Refused(_EOF)
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value & _MASK64, i
        shift += 7


def _length(data: bytes, i: int) -> tuple[int, int]:
    """A length prefix, checked as the generated code checks it: (end of the bytes, start)."""
    n, i = _varint(data, i)
    if n > _INT_MAX:  # a Go int below zero
        raise _Refused(_NEGATIVE)
    if i + n > _INT_MAX:
        raise _Refused(_NEGATIVE)
    if i + n > len(data):
        raise _Refused(_EOF)
    return i + n, i


def _message(descriptor: Descriptor, data: bytes) -> None:
    i, end = 0, len(data)
    while i < end:
        before = i
        wire, i = _varint(data, i)
        number, wire_type = (wire >> 3) & 0xFFFFFFFF, wire & 7
        if number >= 1 << 31:  # Go's int32 of it
            number -= 1 << 32
        if wire_type == 4:
            raise _Refused(f"proto: {_go_type(descriptor)}: wiretype end group for non-group")
        if number <= 0:
            raise _Refused(f"proto: {_go_type(descriptor)}: illegal tag {number} (wire type {wire})")
        field = descriptor.fields_by_number.get(number)
        if field is None:
            i = before + _skip(data[before:])
            if i > end:
                raise _Refused(_EOF)
            continue
        i = _field(field, wire_type, data, i)


def _field(field: FieldDescriptor, wire_type: int, data: bytes, i: int) -> int:
    want = _WIRE.get(field.type, 0)
    if wire_type == 2 and want != 2 and field.is_repeated:
        stop, i = _length(data, i)  # packed: elements up to the length's end
        while i < stop:
            i = _scalar(want, data, i)
        return i
    if wire_type != want:
        raise _Refused(f"proto: wrong wireType = {wire_type} for field {camel_case(field.name)}")
    if want != 2:
        return _scalar(want, data, i)
    stop, start = _length(data, i)
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        _message(field.message_type, data[start:stop])
    return stop


def _scalar(wire_type: int, data: bytes, i: int) -> int:
    if wire_type == 0:
        return _varint(data, i)[1]
    size = 8 if wire_type == 1 else 4
    if i + size > len(data):
        raise _Refused(_EOF)
    return i + size


def _skip(data: bytes) -> int:
    """How many bytes the unknown field at the start of ``data`` takes (gogo's skipRpc)."""
    i, depth = 0, 0
    while i < len(data):
        wire, i = _varint(data, i)
        wire_type = wire & 7
        if wire_type == 0:
            i = _varint(data, i)[1]
        elif wire_type == 1:
            i += 8
        elif wire_type == 2:
            n, i = _varint(data, i)
            if n > _INT_MAX:
                raise _Refused(_NEGATIVE)
            i += n
            if i > _INT_MAX:
                raise _Refused(_NEGATIVE)
        elif wire_type == 3:
            depth += 1
        elif wire_type == 4:
            if depth == 0:
                raise _Refused("proto: unexpected end of group")
            depth -= 1
        elif wire_type == 5:
            i += 4
        else:
            raise _Refused(f"proto: illegal wireType {wire_type}")
        if depth == 0:
            return i
    raise _Refused(_EOF)
