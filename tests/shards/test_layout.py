from pathlib import Path

import pytest

from shards.errors import LayoutError
from shards.layout import load_layout, parse_layout, prefix_end, Router

LAYOUT = """
default = "rest"
[[shard]]
name = "leases"
resources = ["leases"]
[[shard]]
name = "pods"
resources = ["pods"]
[[shard]]
name = "deploy"
resources = ["apps/deployments"]
"""


@pytest.fixture
def router():
    return Router(parse_layout(LAYOUT))


@pytest.mark.parametrize(
    "key, shard",
    [
        (b"/registry/pods/default/web-1", "pods"),
        (b"/registry/pods/", "pods"),
        (b"/registry/pods", "rest"),
        (b"/registry/podsx/a", "rest"),
        (b"/registry/leases/kube-node-lease/n1", "leases"),
        (b"/registry/apps/deployments/ns/d", "deploy"),
        (b"/registry/apps/replicasets/ns/r", "rest"),
        (b"/registry/apps/deployments", "rest"),
        (b"compact_rev_key", "rest"),
        (b"\x00" * 8, "rest"),
        (b"", "rest"),
    ],
)
def test_shard_for_key(router, key, shard):
    assert router.layout.shards[router.shard_for_key(key)].name == shard


def test_every_key_routes_inside_its_shards_ranges(router):
    """A key's shard must be among the shards a range containing it touches."""
    keys = [b"/registry/pods/a", b"/registry/pods", b"/registry/leases/x", b"/registry/apps/deployments/n/d", b"zz", b"/"]
    for k in keys:
        sid = router.shard_for_key(k)
        assert sid in router.shards_for_range(k, k + b"\x00")
        assert sid in router.shards_for_range(b"\x00", b"")
        assert sid in router.shards_for_range(b"/registry/", prefix_end(b"/registry/"))


def test_range_inside_one_resource_touches_one_shard(router):
    names = lambda sids: [router.layout.shards[s].name for s in sids]
    assert names(router.shards_for_range(b"/registry/pods/", prefix_end(b"/registry/pods/"))) == ["pods"]
    assert names(router.shards_for_range(b"/registry/pods/ns/a\x00", prefix_end(b"/registry/pods/ns/"))) == ["pods"]
    assert set(names(router.shards_for_range(b"/registry/", prefix_end(b"/registry/")))) == {"leases", "pods", "deploy", "rest"}
    assert names(router.shards_for_range(b"a", b"b")) == ["rest"]


def test_prefix_end():
    assert prefix_end(b"/a/") == b"/a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") == b""


@pytest.mark.parametrize(
    "text",
    [
        "[[shard]\nname=",  # not TOML
        '[[shard]]\nname = "a"\n',  # no resources
        '[[shard]]\nname = "a"\nresources = ["pods"]\n[[shard]]\nname = "a"\nresources = ["x"]\n',  # repeated name
        '[[shard]]\nname = "a"\nresources = ["pods"]\n[[shard]]\nname = "b"\nresources = ["pods"]\n',  # repeated resource
        '[[shard]]\nname = "a"\nresources = ["/pods"]\n',
    ],
)
def test_bad_layouts_are_refused(text):
    with pytest.raises(LayoutError):
        parse_layout(text)


def test_default_layout_has_the_hot_resources():
    layout = load_layout(None)
    assert layout.names == ["leases", "events", "pods", "nodes", "default"]


def test_missing_layout_file(tmp_path: Path):
    with pytest.raises(LayoutError, match="nope.toml"):
        load_layout(tmp_path / "nope.toml")
