"""shim/gojson.py without a server: Go's answers as a real etcd 3.5.1 gave them
(tests/integration/test_gateway_bytes.py asks etcd itself), and properties of the
scanner against Python's own JSON."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from proto import rpc_pb2 as pb
from shim.gojson import GoJSONError, b64decode_std, check_valid, decode_request, decode_stream, dumps

REFUSED = [  # body, etcd 3.5.1's message
    (b"{bad", "invalid character 'b' looking for beginning of object key string"),
    (b'{"key":"YQ=="', "unexpected EOF"),
    (b'"x"', "json: cannot unmarshal string into Go value of type map[string]json.RawMessage"),
    (b"[]", "json: cannot unmarshal array into Go value of type map[string]json.RawMessage"),
    (b'{"key": 5}', "json: cannot unmarshal number into Go value of type []uint8"),
    (b'{"key":"YQ"}', "illegal base64 data at input byte 0"),
    (b'{"key":"YQ=x"}', "illegal base64 data at input byte 2"),
    (b'{"key":[97,256]}', "json: cannot unmarshal number 256 into Go value of type uint8"),
    (b'{"limit":"5x"}', "invalid character 'x' after top-level value"),
    (b'{"limit":""}', "unexpected end of JSON input"),
    (b'{"limit":"2."}', "invalid character ' ' after decimal point in numeric literal"),
    (b'{"limit":1e3}', "json: cannot unmarshal number 1e3 into Go value of type int64"),
    (b'{"limit":"9223372036854775808"}', "json: cannot unmarshal number 9223372036854775808 into Go value of type int64"),
    (b'{"keys_only":"true"}', "json: cannot unmarshal string into Go value of type bool"),
    (b'{"sort_order":"NOPE"}', 'unknown value "\\"NOPE\\"" for enum etcdserverpb.RangeRequest.SortOrder'),
    (b'{"sort_order":true}', "json: cannot unmarshal bool into Go value of type protoreflect.EnumNumber"),
    (b'{"x":\x01}', "invalid character '\\x01' looking for beginning of value"),
    (b'{"x":"\\u12g4"}', "invalid character 'g' in \\u hexadecimal character escape"),
    (b'{"x":tru}', "invalid character '}' in literal true (expecting 'e')"),
    (b'{"a":01}', "invalid character '1' after object key:value pair"),
    ("{é".encode(), "invalid character 'Ã' looking for beginning of object key string"),
]


@pytest.mark.parametrize("body, message", REFUSED)
def test_refused_as_etcd_words_it(body, message):
    with pytest.raises(GoJSONError) as err:
        decode_request(body, pb.RangeRequest)
    assert str(err.value) == message


def test_accepted_as_etcd_reads_them():
    r = decode_request(b'{"key":"YWJj\\nZA==","range_end":"AA==","rangeEnd":"Yw==","limit":"3","sortOrder":2,'
                       b'"keys_only":null,"unknown":[1]} trailing', pb.RangeRequest)
    assert (r.key, r.range_end, r.limit, r.sort_order, r.keys_only) == (b"abcd", b"c", 3, pb.RangeRequest.DESCEND, False)
    assert decode_request(b"  ", pb.RangeRequest) == pb.RangeRequest()
    assert decode_request(b'{"key":[97,98]}', pb.RangeRequest).key == b"ab"
    op = decode_request(b'{"success":[{"request_range":{"key":"YQ=="},"request_put":{"key":"Yg=="}},null]}', pb.TxnRequest)
    assert [o.WhichOneof("request") for o in op.success] == ["request_put", None]  # the later member of a oneof
    assert [r.ID for r in decode_stream(b'{"ID":"7"} {"ID":8}', pb.LeaseKeepAliveRequest)] == [7, 8]


def test_dumps_writes_as_go():
    assert dumps({"a": ["é<>&\u2028", "\x01\b\f\n\t", 5, True, None]}) == \
        '{"a":["é\\u003c\\u003e\\u0026\\u2028","\\u0001\\u0008\\u000c\\n\\t",5,true,null]}'.encode()


@given(st.binary(max_size=40))
def test_base64_as_python_for_what_go_accepts(data):
    import base64

    text = base64.b64encode(data)
    assert b64decode_std(text) == data
    with pytest.raises(GoJSONError):
        b64decode_std(text.rstrip(b"=") + b"!" if text else b"!")


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                                     max_size=3), max_leaves=8)


@settings(max_examples=200)
@given(json_values, st.sampled_from([None, 1, 2]))
def test_scanner_takes_what_python_writes(value, indent):
    check_valid(json.dumps(value, indent=indent).encode())
