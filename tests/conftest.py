"""Shared pytest fixtures."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# Make the repository's packages (proto, shim, ...) and tests.* importable
# even when pytest is run as a plain `pytest` rather than `python -m pytest`.
REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tests.etcd_fixture import EtcdProcess, etcd_binary, start_etcd  # noqa: E402


@pytest.fixture
def real_etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    """A fresh single-member etcd on free loopback ports, killed afterwards."""
    if etcd_binary() is None:
        pytest.skip("etcd binary not available")
    etcd = start_etcd(tmp_path)
    try:
        yield etcd
    finally:
        etcd.stop()
