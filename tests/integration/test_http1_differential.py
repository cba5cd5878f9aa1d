"""HTTP/1.1 on the client port, malformed or unusual, answered as etcd answers it.

etcd serves /health, /version, /metrics and its JSON gateway on the client port through
Go's net/http; load balancers' health checks, curl and hand-written probes talk to it
there (HTTP/1.0, bare LF line ends, proxies' absolute URIs, large headers). The same
bytes go to a real etcd and to shardetcd (the native gRPC server hands HTTP/1.1 to
shim/http.py); the status lines, the bodies of the refusals Go's server makes itself
(before any handler: 400, 431, 501, each closing the connection) and whether the
connection stays open must be the same.
"""
from __future__ import annotations

import datetime
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from email.utils import parsedate_to_datetime

import pytest

from tests.conftest import require_etcd_binary
from tests.shardetcd_fixture import etcd_and_shardetcd

pytestmark = pytest.mark.timeout(300)

BODY = b'{"key":"Zm9v"}'
RANGE = b"POST /v3/kv/range HTTP/1.1\r\nHost: x\r\n"
HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n"

CASES = {
    "a plain GET": HEALTH + b"\r\n",
    "HTTP/1.1 without Host": b"GET /health HTTP/1.1\r\n\r\n",
    "HTTP/1.0 (answered in 1.0, then closed)": b"GET /health HTTP/1.0\r\n\r\n",
    "HTTP/1.0 with keep-alive": b"GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
    "Connection: close among other options": HEALTH + b"Connection: close, TE\r\nTE: trailers\r\n\r\n",
    "bare LF line ends": b"GET /health HTTP/1.1\nHost: x\n\n",
    "a 20 KB header": HEALTH + b"X-Big: " + b"a" * 20_000 + b"\r\n\r\n",
    "a 100 KB header": HEALTH + b"X-Big: " + b"a" * 100_000 + b"\r\n\r\n",
    "a 2 MB header": HEALTH + b"X-Big: " + b"a" * 2_000_000 + b"\r\n\r\n",
    "a header line without a colon": HEALTH + b"NoColon\r\n\r\n",
    "a space before a header's colon": HEALTH + b"X-A : 1\r\n\r\n",
    "a Content-Length that is not a number": RANGE + b"Content-Length: abc\r\n\r\n" + BODY,
    "a negative Content-Length": RANGE + b"Content-Length: -5\r\n\r\n" + BODY,
    "two different Content-Lengths": RANGE + b"Content-Length: 14\r\nContent-Length: 15\r\n\r\n" + BODY,
    "the same Content-Length twice": RANGE + b"Content-Length: 14\r\nContent-Length: 14\r\n\r\n" + BODY,
    "a Content-Length in other digits": RANGE + "Content-Length: \u00b9\u2074\r\n\r\n".encode("latin-1", "replace") + BODY,
    "a chunked body": RANGE + b"Transfer-Encoding: chunked\r\n\r\ne\r\n" + BODY + b"\r\n0\r\n\r\n",
    "chunked and a Content-Length": RANGE + b"Transfer-Encoding: chunked\r\nContent-Length: 14\r\n\r\ne\r\n" + BODY
                                    + b"\r\n0\r\n\r\n",
    "a chunk size that is not hex": RANGE + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n" + BODY + b"\r\n0\r\n\r\n",
    "a chunk longer than its size": RANGE + b"Transfer-Encoding: chunked\r\n\r\ne\r\n" + BODY + b"XX0\r\n\r\n",
    "a transfer encoding other than chunked": RANGE + b"Transfer-Encoding: gzip\r\n\r\n" + BODY,
    "two requests in one write": HEALTH + b"\r\n" + HEALTH + b"\r\n",
    "a proxy's absolute URI": b"GET http://x/health HTTP/1.1\r\nHost: x\r\n\r\n",
    "a path without its slash": b"GET health HTTP/1.1\r\nHost: x\r\n\r\n",
    "a lower-case method": b"get /health HTTP/1.1\r\nHost: x\r\n\r\n",
    "a request line of one word": b"GARBAGE\r\nHost: x\r\n\r\n",
    "HTTP/9.9": b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n",
    "a body shorter than its Content-Length": RANGE + b"Content-Length: 100\r\n\r\n" + BODY,
    "a bad chunked body to a handler that reads none": b"POST /health HTTP/1.1\r\nHost: x\r\n"
    b"Transfer-Encoding: chunked\r\n\r\nzz\r\n" + BODY + b"\r\n0\r\n\r\n" + HEALTH + b"\r\n",
    "a chunked body to a handler that reads none, then a request": b"POST /health HTTP/1.1\r\nHost: x\r\n"
    b"Transfer-Encoding: chunked\r\n\r\ne\r\n" + BODY + b"\r\n0\r\n\r\n" + HEALTH + b"\r\n",
    "a body to /version, then a request": b"POST /version HTTP/1.1\r\nHost: x\r\nContent-Length: 14\r\n\r\n"
    + BODY + HEALTH + b"\r\n",
    # the head as Go's textproto and server check it
    "a header continued on the next line": HEALTH + b"X-A: 1\r\n  2\r\n\r\n",
    "a first header line beginning with a space": b"GET /health HTTP/1.1\r\n Host: x\r\n\r\n",
    "a header value with a control byte": HEALTH + b"X-A: a\x01b\r\n\r\n",
    "a Host with a space": b"GET /health HTTP/1.1\r\nHost: a b\r\n\r\n",
    "a Host with a non-ASCII byte": b"GET /health HTTP/1.1\r\nHost: \xc3\xa9\r\n\r\n",
    "an empty Host": b"GET /health HTTP/1.1\r\nHost:\r\n\r\n",
    "two Host headers": b"GET /health HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n",
    "two Host headers and a bad Content-Length": b"GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n"
    b"Content-Length: x\r\n\r\n",
    # Expect
    "an Expect other than 100-continue": RANGE + b"Content-Length: 14\r\nExpect: foo\r\n\r\n" + BODY,
    "100-Continue to the gateway": RANGE + b"Content-Length: 14\r\nExpect: 100-Continue\r\n\r\n" + BODY,
    "100-continue to a handler that reads no body": HEALTH + b"Content-Length: 14\r\nExpect: 100-continue\r\n\r\n",
    "100-continue to it, the body, then a request": HEALTH + b"Content-Length: 14\r\nExpect: 100-continue\r\n\r\n"
    + BODY + HEALTH + b"\r\n",
    "100-continue over HTTP/1.0": b"POST /v3/kv/range HTTP/1.0\r\nContent-Length: 14\r\nExpect: 100-continue\r\n\r\n"
    + BODY,
    "100-continue with an empty body": RANGE + b"Content-Length: 0\r\nExpect: 100-continue\r\n\r\n",
    # the target: url.ParseRequestURI, then ServeMux's clean path
    "a path with a bad escape": b"GET /health%zz HTTP/1.1\r\nHost: x\r\n\r\n",
    "a tab in the target": b"GET /hea\tlth HTTP/1.1\r\nHost: x\r\n\r\n",
    "a DEL in the target": b"GET /hea\x7flth HTTP/1.1\r\nHost: x\r\n\r\n",
    "an escaped path": b"GET /h%65alth HTTP/1.1\r\nHost: x\r\n\r\n",
    "a path with two slashes": b"GET //health HTTP/1.1\r\nHost: x\r\n\r\n",
    "dot segments and a query": b"GET /v3/../health?x=1 HTTP/1.1\r\nHost: x\r\n\r\n",
    "dot segments in a POST": b"POST /v3/../health HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    "an unclean gateway path": b"POST /v3//kv/range HTTP/1.1\r\nHost: x\r\nContent-Length: 14\r\n\r\n" + BODY,
    # cmux reads the first request line into 4 KiB; later ones are Go's alone
    "a first request line of 4,096 bytes": b"GET /health?" + b"a" * 4073 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    "a first request line of 4,097 bytes": b"GET /health?" + b"a" * 4074 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    "a long request line after the first": HEALTH + b"\r\nGET /health?" + b"a" * 10000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    "HTTP/1.2": b"GET /health HTTP/1.2\r\nHost: x\r\n\r\n",
    "a request line of one word after the first": HEALTH + b"\r\nGARBAGE\r\nHost: x\r\n\r\n",
    "two spaces in a request line after the first": HEALTH + b"\r\nGET  /health HTTP/1.1\r\nHost: x\r\n\r\n",
    "an invalid method after the first": HEALTH + b"\r\nG(T /health HTTP/1.1\r\nHost: x\r\n\r\n",
    "HTTP/1.x after the first": HEALTH + b"\r\nGET /health HTTP/1.x\r\nHost: x\r\n\r\n",
    "HTTP/9.9 after the first": HEALTH + b"\r\nGET /health HTTP/9.9\r\nHost: x\r\n\r\n",
    # /metrics as promhttp serves it
    "/metrics": b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
    "/metrics over HTTP/1.0": b"GET /metrics HTTP/1.0\r\n\r\n",
    "/metrics gzip": b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip;q=1.0, identity\r\n\r\n" + HEALTH
    + b"\r\n",
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    require_etcd_binary()
    with etcd_and_shardetcd(tmp_path_factory.mktemp("h1")) as (etcd, shardetcd):
        yield {"etcd": etcd.client_port, "shardetcd": shardetcd.port, "process": shardetcd}


def _responses(data: bytes, ended: bool = False) -> list[tuple[str, dict[str, str], bytes]] | None:
    """The complete responses at the start of ``data`` (Content-Length or chunked bodies, or one
    that runs to the close the connection ``ended`` in), or None if the last one is not complete yet."""
    out = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if not sep:
            return None
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        if lines[0].endswith(" 100 Continue"):
            body, data = b"", rest
        elif "content-length" in headers:
            n = int(headers["content-length"])
            if len(rest) < n:
                return None
            body, data = rest[:n], rest[n:]
        elif headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                size_line, sep, rest = rest.partition(b"\r\n")
                if not sep or len(rest) < int(size_line, 16) + 2:
                    return None
                n = int(size_line, 16)
                body, rest = body + rest[:n], rest[n + 2:]
                if n == 0:
                    break
            data = rest
        elif headers.get("connection") == "close" or (lines[0].startswith("HTTP/1.0") and ended):
            body, data = rest, b""  # Go's refusals: the body runs to the close
        else:
            return None
        out.append((lines[0], headers, body))
    return out


def exchange(port: int, data: bytes, settle: float = 0.7) -> tuple[list, bool]:
    """Send ``data``; read until the connection ends or nothing more came for ``settle`` seconds.
    (status lines, with the body of each answer Go's server gives before any handler), and whether
    the connection ended."""
    received, ended = b"", False
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            sock.sendall(data)
        except OSError:
            ended = True
        sock.settimeout(settle)
        deadline = time.monotonic() + 15
        while not ended and time.monotonic() < deadline:
            try:
                chunk = sock.recv(1 << 16)
            except TimeoutError:
                if received == b"" or _responses(received) is not None:
                    break  # nothing (more) is coming
                continue
            except ConnectionError:
                chunk = b""
            if not chunk:
                ended = True
            received += chunk
    answers = _responses(received, ended) or []
    # what the handlers answer carries etcd's CORS headers and differs in versions and ids
    # (compared elsewhere): their header names are compared, and their Date is a date; Go's own
    # refusals carry none of that: their bodies and header values are compared too
    seen = [(status, _dated(headers), body) if "access-control-allow-origin" not in headers
            else (status, sorted(headers), parsedate_to_datetime(headers["date"]).tzname())
            for status, headers, body in answers]
    return seen, ended


def _dated(headers: dict) -> dict:
    """``headers`` with a Date in Go's http.TimeFormat shown as such, not as its value: the two
    servers answer a moment apart, and that moment can fall across a second."""
    date = headers.get("date")
    if date is None:
        return headers
    try:
        shaped = datetime.datetime.strptime(date, "%a, %d %b %Y %H:%M:%S GMT").strftime("%a, %d %b %Y %H:%M:%S GMT")
    except ValueError:
        return headers
    return {**headers, "date": "<an http.TimeFormat date>"} if shaped == date else headers


@pytest.mark.parametrize("case", list(CASES))
def test_http1_answered_as_etcd_answers_it(servers, case):
    with ThreadPoolExecutor(2) as pool:  # both at once: each exchange waits for a quiet connection
        want, got = pool.map(lambda port: exchange(port, CASES[case]), (servers["etcd"], servers["shardetcd"]))
    assert got == want, f"etcd: {want}\nshardetcd: {got}"
    process = servers["process"]
    assert process.running() and process.answers_range(timeout=10), process.log_tail()
