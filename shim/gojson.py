"""JSON as etcd's gateway reads and writes it (Go's encoding/json and golang/protobuf's jsonpb).

etcd 3.5's /v3 gateway decodes a request body with a streaming JSON decoder,
then fills the request message field by field, each value decoded on its own:
64-bit integers may be quoted, bytes are strict standard base64, enums are
names or numbers, ``null`` leaves a field unset, unknown fields are ignored,
and a field given under both its proto and its JSON name takes the JSON one.
Its error messages are Go's, and scripts (and client libraries' tests) see
them; so this module reproduces that behaviour -- the first error, worded as
Go words it -- rather than leaning on Python's json module, whose grammar
and messages differ.  The reference is a real etcd 3.5.1, compared byte for
byte by tests/integration/test_gateway.py.

Responses are written as Go writes JSON: compact, UTF-8 as is, ``<``, ``>``,
``&``, U+2028 and U+2029 escaped, control characters as ``\\u00XX`` except
``\\n``, ``\\r`` and ``\\t``.
"""
from __future__ import annotations

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message


class GoJSONError(ValueError):
    """A request body Go would refuse; ``str()`` is Go's error text."""


# -- writing ---------------------------------------------------------------

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t",
            "<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
for _c in range(0x20):
    _ESCAPES.setdefault(chr(_c), f"\\u{_c:04x}")
_ESCAPE_TABLE = str.maketrans(_ESCAPES)


def _write(doc, out: list[str]) -> None:
    if isinstance(doc, str):
        out.append('"' + doc.translate(_ESCAPE_TABLE) + '"')
    elif doc is True:
        out.append("true")
    elif doc is False:
        out.append("false")
    elif doc is None:
        out.append("null")
    elif isinstance(doc, int):
        out.append(str(doc))
    elif isinstance(doc, float):
        out.append(repr(doc))
    elif isinstance(doc, dict):
        out.append("{")
        for i, (k, v) in enumerate(doc.items()):
            if i:
                out.append(",")
            _write(str(k), out)
            out.append(":")
            _write(v, out)
        out.append("}")
    else:
        out.append("[")
        for i, v in enumerate(doc):
            if i:
                out.append(",")
            _write(v, out)
        out.append("]")


def dumps(doc) -> bytes:
    """``doc`` (dicts, lists, str, int, bool, None) as Go's encoding/json writes it."""
    out: list[str] = []
    _write(doc, out)
    return "".join(out).encode("utf-8", "surrogatepass")


# -- Go's quoting, for error texts ------------------------------------------

_GO_SHORT = {7: "\\a", 8: "\\b", 12: "\\f", 10: "\\n", 13: "\\r", 9: "\\t", 11: "\\v", 0x5C: "\\\\"}


def _go_printable(cp: int) -> bool:
    """strconv.IsPrint for code points below 0x10000 that matter here."""
    if cp < 0x20 or 0x7F <= cp <= 0x9F or cp in (0xA0, 0xAD):
        return False
    ch = chr(cp)
    return ch.isprintable() and not (0x2028 <= cp <= 0x2029)


def _go_quote_rune(cp: int, quote: str) -> str:
    if cp == ord(quote):
        return "\\" + quote
    if cp in _GO_SHORT:
        return _GO_SHORT[cp]
    if _go_printable(cp):
        return chr(cp)
    if cp < 0x20 or cp == 0x7F:
        return f"\\x{cp:02x}"
    if cp < 0x10000:
        return f"\\u{cp:04x}"
    return f"\\U{cp:08x}"


def quote_char(c: int) -> str:
    """encoding/json's quoteChar: the byte ``c`` (as a code point) in single quotes."""
    if c == 0x27:
        return "'\\''"
    if c == 0x22:
        return "'\"'"
    return "'" + _go_quote_rune(c, '"') + "'"


def go_quote_bytes(data: bytes) -> str:
    """fmt's %q of a byte slice: a Go double-quoted string, bad UTF-8 as \\xNN."""
    out = ['"']
    i = 0
    while i < len(data):
        for size in (1, 2, 3, 4):
            try:
                ch = data[i:i + size].decode("utf-8")
            except UnicodeDecodeError:
                continue
            out.append(_go_quote_rune(ord(ch), '"'))
            i += size
            break
        else:
            out.append(f"\\x{data[i]:02x}")
            i += 1
    out.append('"')
    return "".join(out)


# -- scanning (syntax) ------------------------------------------------------

_WS = b" \t\r\n"
_DIGITS = b"0123456789"
_HEX = b"0123456789abcdefABCDEF"


class _End(Exception):
    """The input ended inside a value."""


class _Scanner:
    """Finds the end of one JSON value, failing as Go's scanner does: at the first
    byte that cannot continue the value, with the same words."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def _at(self, i: int) -> int:
        if i >= len(self.data):
            raise _End
        return self.data[i]

    def skip_ws(self, i: int) -> int:
        data = self.data
        while i < len(data) and data[i] in _WS:
            i += 1
        return i

    @staticmethod
    def _bad(c: int, where: str) -> GoJSONError:
        return GoJSONError(f"invalid character {quote_char(c)} {where}")

    def value(self, i: int) -> int:
        """``i`` is at the first byte of a value (whitespace skipped); return its end."""
        c = self._at(i)
        if c == 0x7B:  # {
            return self._object(i + 1)
        if c == 0x5B:  # [
            return self._array(i + 1)
        if c == 0x22:
            return self._string(i + 1)
        if c == 0x2D or c in _DIGITS:
            return self._number(i)
        for word in (b"true", b"false", b"null"):
            if c == word[0]:
                for k in range(1, len(word)):
                    got = self._at(i + k)
                    if got != word[k]:
                        raise self._bad(got, f"in literal {word.decode()} (expecting {quote_char(word[k])})")
                return i + len(word)
        raise self._bad(c, "looking for beginning of value")

    def _container(self, i: int, close: int, member, after: str) -> int:
        """An object's or array's members from just after its opening byte; its end."""
        i = self.skip_ws(i)
        if self._at(i) == close:
            return i + 1
        while True:
            i = self.skip_ws(member(i))
            c = self._at(i)
            if c == close:
                return i + 1
            if c != 0x2C:
                raise self._bad(c, after)
            i = self.skip_ws(i + 1)

    def _object(self, i: int) -> int:
        return self._container(i, 0x7D, self._pair, "after object key:value pair")

    def _pair(self, i: int) -> int:
        c = self._at(i)
        if c != 0x22:
            raise self._bad(c, "looking for beginning of object key string")
        i = self.skip_ws(self._string(i + 1))
        c = self._at(i)
        if c != 0x3A:
            raise self._bad(c, "after object key")
        return self.value(self.skip_ws(i + 1))

    def _array(self, i: int) -> int:
        return self._container(i, 0x5D, self.value, "after array element")

    def _string(self, i: int) -> int:
        while True:
            c = self._at(i)
            if c == 0x22:
                return i + 1
            if c == 0x5C:
                e = self._at(i + 1)
                if e == 0x75:  # \u
                    for k in range(2, 6):
                        h = self._at(i + k)
                        if h not in _HEX:
                            raise self._bad(h, "in \\u hexadecimal character escape")
                    i += 6
                    continue
                if e not in b'"\\/bfnrt':
                    raise self._bad(e, "in string escape code")
                i += 2
                continue
            if c < 0x20:
                raise self._bad(c, "in string literal")
            i += 1

    def _digits(self, i: int, where: str) -> int:
        """One digit or more from ``i`` (``where`` names the place of a missing one); their end."""
        c = self._at(i)
        if c not in _DIGITS:
            raise self._bad(c, where)
        data = self.data
        i += 1
        while i < len(data) and data[i] in _DIGITS:
            i += 1
        return i

    def _number(self, i: int) -> int:
        data = self.data
        if data[i] == 0x2D:  # '-'
            i += 1
        i = i + 1 if self._at(i) == 0x30 else self._digits(i, "in numeric literal")
        if i < len(data) and data[i] == 0x2E:
            i = self._digits(i + 1, "after decimal point in numeric literal")
        if i < len(data) and data[i] in b"eE":
            i += 1
            if self._at(i) in b"+-":
                i += 1
            i = self._digits(i, "in exponent of numeric literal")
        return i


def check_valid(data: bytes) -> None:
    """json.Unmarshal's first step: ``data`` must be exactly one JSON value. At the end
    of the input Go's scanner is fed one space, so a value cut short where a space is
    wrong ("2.") fails on that space, and elsewhere as "unexpected end"."""
    s = _Scanner(data + b" ")
    try:
        end = s.skip_ws(s.value(s.skip_ws(0)))
    except _End:
        raise GoJSONError("unexpected end of JSON input") from None
    if end < len(data):
        raise _Scanner._bad(data[end], "after top-level value")


def next_value(data: bytes, start: int) -> tuple[bytes, int] | None:
    """json.Decoder.Decode into a RawMessage: the next value from ``start`` and
    where it ends, or None at the end of the input (io.EOF); whatever follows
    a value is left for the next call."""
    s = _Scanner(data)
    i = s.skip_ws(start)
    if i >= len(data):
        return None
    try:
        end = s.value(i)
    except _End:
        raise GoJSONError("unexpected EOF") from None
    return data[i:end], end


# -- values (types) ---------------------------------------------------------

def kind_of(raw: bytes) -> str:
    c = raw[:1]
    if c == b"{":
        return "object"
    if c == b"[":
        return "array"
    if c == b'"':
        return "string"
    if c in (b"t", b"f"):
        return "bool"
    if c == b"n":
        return "null"
    return "number"


def _type_error(value: str, go_type: str) -> GoJSONError:
    return GoJSONError(f"json: cannot unmarshal {value} into Go value of type {go_type}")


def _members(raw: bytes) -> dict[bytes, bytes]:
    """A valid object's members: unescaped key -> raw value; a repeated key keeps its last value."""
    return dict(member_list(raw))


def member_list(raw: bytes) -> list[tuple[bytes, bytes]]:
    """A valid object's members in their order, repeated keys included: (unescaped key, raw value)."""
    s = _Scanner(raw)
    out: list[tuple[bytes, bytes]] = []
    i = s.skip_ws(1)
    if raw[i] == 0x7D:
        return out
    while True:
        end = s._string(i + 1)
        key = _unquote(raw[i:end])
        i = s.skip_ws(s.skip_ws(end) + 1)
        vend = s.value(i)
        out.append((key, raw[i:vend]))
        i = s.skip_ws(vend)
        if raw[i] == 0x7D:
            return out
        i = s.skip_ws(i + 1)


def _elements(raw: bytes) -> list[bytes]:
    s = _Scanner(raw)
    out: list[bytes] = []
    i = s.skip_ws(1)
    if raw[i] == 0x5D:
        return out
    while True:
        end = s.value(i)
        out.append(raw[i:end])
        i = s.skip_ws(end)
        if raw[i] == 0x5D:
            return out
        i = s.skip_ws(i + 1)


_SIMPLE = {ord('"'): '"', ord("\\"): "\\", ord("/"): "/", ord("b"): "\b", ord("f"): "\f",
           ord("n"): "\n", ord("r"): "\r", ord("t"): "\t"}


def _unquote(raw: bytes) -> bytes:
    """A valid string literal's UTF-8 bytes, as Go unquotes it (bad UTF-8 and lone surrogates become U+FFFD)."""
    body = raw[1:-1]
    if b"\\" not in body:
        return body.decode("utf-8", "replace").encode()
    out: list[str] = []
    text = body.decode("utf-8", "surrogateescape")
    i = 0
    while i < len(text):
        ch = text[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        e = text[i + 1]
        if e != "u":
            out.append(_SIMPLE[ord(e)])
            i += 2
            continue
        cp = int(text[i + 2:i + 6], 16)
        i += 6
        if 0xD800 <= cp < 0xDC00 and text[i:i + 2] == "\\u":
            low = int(text[i + 2:i + 6], 16)
            if 0xDC00 <= low < 0xE000:
                out.append(chr(0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00)))
                i += 6
                continue
        out.append("\ufffd" if 0xD800 <= cp < 0xE000 else chr(cp))
    joined = "".join(out)
    return joined.encode("utf-8", "surrogateescape").decode("utf-8", "replace").encode()


_B64 = {c: i for i, c in enumerate(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}


def b64decode_std(src: bytes) -> bytes:
    """Go's base64.StdEncoding.Decode: padding required, CR and LF skipped, anything
    else refused with the offset Go reports."""
    out = bytearray()
    si = 0
    n = len(src)
    while True:
        quantum: list[int] = []
        j = 0
        while j < 4:
            if si == n:
                if j == 0:
                    return bytes(out)
                raise GoJSONError(f"illegal base64 data at input byte {si - j}")
            c = src[si]
            si += 1
            if c in _B64:
                quantum.append(_B64[c])
                j += 1
                continue
            if c in (0x0A, 0x0D):
                continue
            if c != 0x3D:  # '='
                raise GoJSONError(f"illegal base64 data at input byte {si - 1}")
            if j in (0, 1):  # padding where data must be
                raise GoJSONError(f"illegal base64 data at input byte {si - 1}")
            if j == 2:  # "==" expected: the second '=' after any newlines
                while si < n and src[si] in (0x0A, 0x0D):
                    si += 1
                if si == n:
                    raise GoJSONError(f"illegal base64 data at input byte {n}")
                if src[si] != 0x3D:
                    raise GoJSONError(f"illegal base64 data at input byte {si - 1}")
                si += 1
            while si < n and src[si] in (0x0A, 0x0D):
                si += 1
            if si < n:  # data after the padding
                raise GoJSONError(f"illegal base64 data at input byte {si}")
            break
        val = 0
        for k in range(4):
            val = (val << 6) | (quantum[k] if k < len(quantum) else 0)
        decoded = val.to_bytes(3, "big")
        out += decoded[:len(quantum) - 1] if len(quantum) < 4 else decoded
        if len(quantum) < 4:
            return bytes(out)


_INT_TYPES = {
    FieldDescriptor.TYPE_INT64: ("int64", -(1 << 63), (1 << 63) - 1),
    FieldDescriptor.TYPE_SINT64: ("int64", -(1 << 63), (1 << 63) - 1),
    FieldDescriptor.TYPE_SFIXED64: ("int64", -(1 << 63), (1 << 63) - 1),
    FieldDescriptor.TYPE_INT32: ("int32", -(1 << 31), (1 << 31) - 1),
    FieldDescriptor.TYPE_SINT32: ("int32", -(1 << 31), (1 << 31) - 1),
    FieldDescriptor.TYPE_SFIXED32: ("int32", -(1 << 31), (1 << 31) - 1),
    FieldDescriptor.TYPE_UINT64: ("uint64", 0, (1 << 64) - 1),
    FieldDescriptor.TYPE_FIXED64: ("uint64", 0, (1 << 64) - 1),
    FieldDescriptor.TYPE_UINT32: ("uint32", 0, (1 << 32) - 1),
    FieldDescriptor.TYPE_FIXED32: ("uint32", 0, (1 << 32) - 1),
}


def _integer(raw: bytes, go_type: str, lo: int, hi: int) -> int | None:
    """json.Unmarshal of ``raw`` into a Go integer; None for null (unchanged)."""
    check_valid(raw)
    raw = raw.strip(_WS)
    kind = kind_of(raw)
    if kind == "null":
        return None
    if kind != "number":
        raise _type_error(kind, go_type)
    text = raw.decode()
    if "." in text or "e" in text or "E" in text or (lo == 0 and text.startswith("-")):
        raise _type_error("number " + text, go_type)
    value = int(text)
    if not lo <= value <= hi:
        raise _type_error("number " + text, go_type)
    return value


def _trim_quote(raw: bytes) -> bytes:
    return raw[1:-1] if len(raw) >= 2 and raw[:1] == b'"' and raw[-1:] == b'"' else raw


def _bytes(raw: bytes) -> bytes | None:
    kind = kind_of(raw)
    if kind == "null":
        return None
    if kind == "string":
        return b64decode_std(_unquote(raw))
    if kind == "array":  # a JSON array decodes into []byte element by element
        out = bytearray()
        for element in _elements(raw):
            b = _integer(element, "uint8", 0, 255)
            out.append(b or 0)
        return bytes(out)
    raise _type_error(kind, "[]uint8")


def _literal(raw: bytes, kind: str, value):
    """A Go bool or string from ``raw``: None for null, ``value()`` when ``raw`` is of that kind."""
    got = kind_of(raw)
    if got == "null":
        return None
    if got != kind:
        raise _type_error(got, kind)
    return value()


def _scalar(raw: bytes, fd: FieldDescriptor):
    """One value of a scalar field, or None to leave it unset."""
    t = fd.type
    if t in _INT_TYPES:
        return _integer(_trim_quote(raw), *_INT_TYPES[t])
    if t == FieldDescriptor.TYPE_BOOL:
        return _literal(raw, "bool", lambda: raw == b"true")
    if t == FieldDescriptor.TYPE_STRING:
        return _literal(raw, "string", lambda: _unquote(raw).decode())
    if t == FieldDescriptor.TYPE_BYTES:
        return _bytes(raw)
    if t == FieldDescriptor.TYPE_ENUM:
        if len(raw) >= 2 and raw[:1] == b'"' and raw[-1:] == b'"':
            value = fd.enum_type.values_by_name.get(raw[1:-1].decode("utf-8", "replace"))
            if value is None:
                raise GoJSONError(f"unknown value {go_quote_bytes(raw)} for enum {fd.enum_type.full_name}")
            return value.number
        return _integer(raw, "protoreflect.EnumNumber", -(1 << 31), (1 << 31) - 1)
    raise GoJSONError(f"unsupported field type of {fd.full_name}")  # floats: no etcd request has one


def _fill(msg: Message, raw: bytes) -> None:
    """jsonpb's unmarshalMessage: ``raw`` (a valid JSON value) into ``msg``."""
    if raw == b"null":
        return
    kind = kind_of(raw)
    if kind != "object":
        raise _type_error(kind, "map[string]json.RawMessage")
    members = _members(raw)
    desc: Descriptor = msg.DESCRIPTOR
    for fd in desc.fields:  # declaration order: the first field that fails is the error
        value = members.get(fd.name.encode())
        value = members.get(fd.json_name.encode(), value)
        if value is None or value == b"null":
            continue
        if fd.is_repeated:
            if kind_of(value) != "array":
                raise _type_error(kind_of(value), "[]json.RawMessage")
            target = getattr(msg, fd.name)
            for element in _elements(value):
                if fd.type == FieldDescriptor.TYPE_MESSAGE:
                    _fill(target.add(), element)
                else:
                    v = _scalar(element, fd)
                    target.append(v if v is not None else _zero(fd))
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            sub = getattr(msg, fd.name)
            sub.SetInParent()
            _fill(sub, value)
        else:
            v = _scalar(value, fd)
            setattr(msg, fd.name, v if v is not None else _zero(fd))


def _zero(fd: FieldDescriptor):
    if fd.type == FieldDescriptor.TYPE_BYTES:
        return b""
    if fd.type == FieldDescriptor.TYPE_STRING:
        return ""
    if fd.type == FieldDescriptor.TYPE_BOOL:
        return False
    return 0


def decode_message(raw: bytes, cls: type[Message]) -> Message:
    """One request decoded from the raw JSON value ``raw`` (Decoder output)."""
    msg = cls()
    _fill(msg, raw)
    return msg


def decode_request(body: bytes, cls: type[Message]) -> Message:
    """A unary or server-streaming request from its body: the first JSON value
    (none at all is the empty request, anything after it is ignored)."""
    first = next_value(body, 0)
    return cls() if first is None else decode_message(first[0], cls)


def decode_stream(body: bytes, cls: type[Message]):
    """A client stream's requests, one per JSON value of the body, in order; the
    first undecodable one raises GoJSONError after the ones before it were yielded."""
    pos = 0
    while (item := next_value(body, pos)) is not None:
        raw, pos = item
        yield decode_message(raw, cls)
