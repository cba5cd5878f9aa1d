"""Cluster layouts: Kubernetes group/resource → etcd key prefix, the
kube-apiserver flags, ports, and which partition may write which key."""
from __future__ import annotations

import csv
import io
from urllib.parse import urlsplit

import pytest

from shards.errors import LayoutError
from shards.partition import PartitionGuard, parse_cluster_layout, parse_resource

LAYOUT = """
[[partition]]
name = "leases"
resources = ["coordination.k8s.io/leases"]

[[partition]]
name = "events"
resources = ["events", "events.k8s.io/events"]
quota-backend-bytes = 1048576

[[partition]]
name = "crds"
resources = ["example.com/widgets", "nodes", "networking.k8s.io/ingresses", "custom.io/things=things/v2"]
port = 3000
"""


@pytest.mark.parametrize("text, key", [
    ("pods", "pods"),
    ("events", "events"),
    ("events.k8s.io/events", "events"),
    ("coordination.k8s.io/leases", "leases"),
    ("apps/deployments", "deployments"),
    ("nodes", "minions"),
    ("services", "services/specs"),
    ("endpoints", "services/endpoints"),
    ("replicationcontrollers", "controllers"),
    ("networking.k8s.io/ingresses", "ingress"),
    ("apiextensions.k8s.io/customresourcedefinitions", "apiextensions.k8s.io/customresourcedefinitions"),
    ("apiregistration.k8s.io/apiservices", "apiregistration.k8s.io/apiservices"),
    ("snapshot.storage.k8s.io/volumesnapshots", "snapshot.storage.k8s.io/volumesnapshots"),  # a CRD
    ("example.com/widgets=widgets", "widgets"),
])
def test_resource_key_prefixes(text, key):
    assert parse_resource(text, "t").key_resource == key


def kube_apiserver_overrides(flag_value: str) -> dict[tuple[str, str], list[str]]:
    """--etcd-servers-overrides parsed the way kube-apiserver does: a pflag
    string slice (CSV), each item group/resource#servers with servers split
    on ';'; anything else is its error "--etcd-servers-overrides invalid"."""
    out = {}
    for item in next(csv.reader(io.StringIO(flag_value))):
        tokens = item.split("#")
        assert len(tokens) == 2, f"--etcd-servers-overrides invalid: {item}"
        group_resource = tokens[0].split("/")
        assert len(group_resource) == 2, f"--etcd-servers-overrides invalid: {item}"
        servers = tokens[1].split(";")
        for s in servers:
            u = urlsplit(s)
            assert u.scheme in ("http", "https") and u.hostname and u.port, s
        out[tuple(group_resource)] = servers
    return out


def test_apiserver_flags_parse_as_kube_apiserver_does_and_name_every_partition():
    layout = parse_cluster_layout(LAYOUT)
    assert layout.names == ["leases", "events", "crds", "main"]
    ports = layout.ports(2379)
    assert ports == {"leases": 2381, "events": 2382, "crds": 3000, "main": 2379}
    urls = {name: [f"http://127.0.0.1:{port}", f"http://10.0.0.1:{port}"] for name, port in ports.items()}
    servers, overrides = layout.apiserver_flags(urls)
    assert servers == "--etcd-servers=http://127.0.0.1:2379,http://10.0.0.1:2379"
    name, _, value = overrides.partition("=")
    assert name == "--etcd-servers-overrides"
    parsed = kube_apiserver_overrides(value)
    assert parsed[("coordination.k8s.io", "leases")] == urls["leases"]
    assert parsed[("", "events")] == parsed[("events.k8s.io", "events")] == urls["events"]
    assert parsed[("", "nodes")] == parsed[("example.com", "widgets")] == urls["crds"]
    every_partition_url = {tuple(v) for v in parsed.values()}
    assert every_partition_url == {tuple(urls[p]) for p in ("leases", "events", "crds")}


def test_a_layout_without_overrides_gives_only_etcd_servers():
    layout = parse_cluster_layout('[[partition]]\nname = "all"\ndefault = true\n')
    assert layout.apiserver_flags({"all": ["http://h:1"]}) == ["--etcd-servers=http://h:1"]


@pytest.mark.parametrize("key, leases, events, main", [
    (b"/registry/leases/kube-node-lease/n1", True, False, False),
    (b"/registry/events/default/e1", False, True, False),
    (b"/registry/pods/default/p1", False, False, True),
    (b"/registry/minions/n1", False, False, False),  # crds partition owns nodes
    (b"/registry/widgets/a", False, False, True),  # example.com/widgets is stored with its group
    (b"/registry/example.com/widgets/a", False, False, False),
    (b"/registry/things/v2/a", False, False, False),
    (b"/registry/things/v1/a", False, False, True),
    (b"/registry/masterleases/10.0.0.1", False, False, True),  # written through --etcd-servers
    (b"compact_rev_key", True, True, True),  # kube-apiserver's compaction loop, on every endpoint
    (b"/registry/health", True, True, True),
    (b"/registry/", True, True, True),
    (b"other/key", True, True, True),
])
def test_guard_allows_own_and_resourceless_keys(key, leases, events, main):
    layout = parse_cluster_layout(LAYOUT)
    for name, allowed in (("leases", leases), ("events", events), ("main", main)):
        owner = PartitionGuard(layout, name).owner(key)
        assert (owner is None) == allowed, (key, name, owner)
    assert PartitionGuard(layout, "crds").owner(b"/registry/minions/n1") is None
    assert PartitionGuard(layout, "leases").owner(b"/registry/minions/n1") == "crds"


@pytest.mark.parametrize("text, message", [
    ("[[partition]\n", "does not parse"),
    ("", "one or more [[partition]]"),
    ('x = 1\n[[partition]]\nname = "a"\nresources = ["pods"]\n', "nothing else"),
    ('[[partition]]\nname = "a"\n', "non-empty resources"),
    ('[[partition]]\nname = "a b"\nresources = ["pods"]\n', "plain name"),
    ('[[partition]]\nname = "a"\nresources = ["pods"]\n[[partition]]\nname = "a"\nresources = ["events"]\n', "repeated"),
    ('[[partition]]\nname = "a"\nresources = ["pods"]\n[[partition]]\nname = "b"\nresources = ["pods"]\n', "in partitions 'a' and 'b'"),
    ('[[partition]]\nname = "a"\nresources = ["a/b/c"]\n', "bad resource"),
    ('[[partition]]\nname = "a"\nresources = ["pods#x"]\n', "bad resource"),
    ('[[partition]]\nname = "a"\nresources = ["pods"]\nport = -1\n', "non-negative"),
    ('[[partition]]\nname = "a"\nresources = ["pods"]\nqouta = 1\n', "unknown settings"),
    ('[[partition]]\nname = "a"\nresources = ["pods"]\nnice = 20\n', "nice must be"),
    ('[[partition]]\nname = "a"\ndefault = true\n[[partition]]\nname = "b"\ndefault = true\n', "more than one"),
])
def test_bad_layouts_are_refused_with_a_reason(text, message):
    with pytest.raises(LayoutError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_cluster_layout(text)
