"""shim/http.py's reading of a request target as Go's net/http reads it (url.ParseRequestURI's
unescaping, ServeMux's cleanPath); the answers built on them are compared with etcd in
tests/integration/test_http1_differential.py."""
from __future__ import annotations

import pytest

from shim.http import go_clean_path, go_unescape_path


@pytest.mark.parametrize("path, clean", [
    ("/health", "/health"), ("", "/"), ("//health", "/health"), ("/v3/../health", "/health"),
    ("/a/./b/", "/a/b/"), ("/../..", "/"), ("/a//b//", "/a/b/"), ("/", "/"), ("/a/b/..", "/a"),
    ("/a/b/../", "/a/"),
])
def test_clean_path_as_go_serve_mux(path, clean):
    assert go_clean_path(path) == clean


@pytest.mark.parametrize("raw, path", [
    ("/health", "/health"), ("/h%65alth", "/health"), ("/a%2Fb", "/a/b"), ("/%C3%A9", "/\xc3\xa9"), ("/a+b", "/a+b"),
    ("/%zz", None), ("/%4", None), ("/100%", None),
])
def test_unescape_as_go_url(raw, path):
    assert go_unescape_path(raw) == path
