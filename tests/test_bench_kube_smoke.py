"""The kube-apiserver bench still works end to end: `python -m bench.kube --tiny`
starts etcd 3.5.1 and shardetcd in turn, a real kube-apiserver on each, offers
the same open-loop load (Lease heartbeats, pod creates, status patches and
deletes, events, paginated pod lists) and writes the tables and the JSON.

Figures from a tiny run mean nothing and are not asserted on (speed is
measured in bench/, never in tests); only that every request kind ran on both
backends without a single failed request, that kube-apiserver's storage
metrics were read, and that the table has both backends."""
from __future__ import annotations

import json
import os
from pathlib import Path

from bench import kube
from tests.conftest import require_etcd_binary
from tests.kube_fixture import require_kube_apiserver
from tests.benchrun import run_bench

REPO = Path(__file__).resolve().parent.parent


def test_bench_kube_tiny_drives_kube_apiserver_on_etcd_and_shardetcd(tmp_path):
    require_kube_apiserver()
    require_etcd_binary()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
    p = run_bench(["bench.kube", "--tiny", "--out", str(tmp_path)], env=env, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    [result] = tmp_path.glob("kube-*.json")
    data = json.loads(result.read_text())
    assert data["meta"]["mode"] == "tiny"
    assert [r["server"] for r in data["results"]] == ["etcd", "shardetcd"]
    for res in data["results"]:
        rows = {r["kind"]: r for r in res["rows"]}
        assert set(rows) == set(kube.KINDS), (res["server"], sorted(rows))
        for r in rows.values():
            assert r["n"] > 0 and r["errors"] == 0, (res["server"], r)
            assert r["p99_ms"] >= r["p50_ms"] > 0, (res["server"], r)
        assert rows["list"]["pages_per_list"] > 1, rows["list"]  # the continue token was followed
        assert res["errors"] == {}, res["errors"]
        # kube-apiserver's own storage metrics moved for every write the load makes
        storage = {(s["resource"], s["operation"]) for s in res["storage"] if s["count"] > 0}
        assert {("leases", "update"), ("pods", "create"), ("pods", "update"), ("pods", "delete"),
                ("events", "create")} <= storage, (res["server"], storage)
        verbs = {(a["verb"], a["resource"], a["subresource"]) for a in res["apiserver"]}
        assert {("PUT", "leases", ""), ("POST", "pods", ""), ("PATCH", "pods", "status"), ("DELETE", "pods", ""),
                ("POST", "events", ""), ("LIST", "pods", "")} <= verbs, (res["server"], verbs)
        assert res["cpu"]["requests"] > 0 and res["cpu"]["other_pct"] >= 0
        assert "RequestWatchProgress feature is not supported" not in res["logs"]["apiserver_bad_patterns"] \
            or res["server"] == "etcd", res["logs"]
    # the shardetcd endpoint kept what kube-apiserver wrote
    [keys] = data["results"][1]["keys"].values()
    assert keys["pods"] > 0 and keys["leases"] > 0 and keys["events"] > 0, keys
    # the table puts both backends side by side, one line per request kind
    md = (tmp_path / result.name.replace(".json", ".md")).read_text()
    head = next(line for line in md.splitlines() if line.startswith("| request |"))
    assert "etcd p50" in head and "shardetcd p50" in head and "shardetcd/etcd p99" in head, head
    for kind in kube.KINDS:
        assert any(line.startswith(f"| {kind}: ") for line in md.splitlines()), kind
    assert "| resource operation |" in md and "| pods update |" in md
    # both backends and their kube-apiservers were stopped; a tiny run never replaces the result kept in git
    assert p.stdout.count(" stopped ") == 2, p.stdout
    assert "kept as the latest" not in p.stdout and not list(tmp_path.glob("latest-kube*"))


def test_only_a_complete_default_quick_kube_run_is_kept():
    args = kube.parse_args(["--quick"])
    assert kube.publishable(args, list(kube.SERVER_ORDER))
    assert not kube.publishable(args, ["etcd", "shardetcd"])
    assert not kube.publishable(kube.parse_args(["--quick", "--duration", "5"]), list(kube.SERVER_ORDER))
    assert not kube.publishable(kube.parse_args(["--quick", "--rate-scale", "2"]), list(kube.SERVER_ORDER))
    assert not kube.publishable(kube.parse_args(["--tiny"]), list(kube.SERVER_ORDER))


def test_histogram_quantile_interpolates_inside_the_bucket():
    buckets = {0.005: 90.0, 0.025: 99.0, 0.05: 100.0, float("inf"): 100.0}
    assert kube.hist_quantile(0.5, buckets)[1] == 0.005
    value, le = kube.hist_quantile(0.99, buckets)
    assert le == 0.025 and abs(value - 0.025) < 1e-9
    value, le = kube.hist_quantile(0.995, buckets)
    assert le == 0.05 and 0.025 < value < 0.05


def test_readme_kube_tables_are_the_kept_quick_run():
    """bench/README.md shows the tables of results/latest-kube.json, not older figures."""
    kept = json.loads((REPO / "bench" / "results" / "latest-kube.json").read_text())
    assert kept["meta"]["mode"] == "quick" and kept["meta"]["machine"]["cores"]
    assert [r["server"] for r in kept["results"]] == list(kube.SERVER_ORDER)
    readme = (REPO / "bench" / "README.md").read_text()
    block = readme.split("<!-- kube-summary:", 1)[1].split("-->", 1)[1].split("<!-- /kube-summary -->", 1)[0]
    assert block.strip() == kube.summary(kept["results"]).strip()
    assert kept["meta"]["timestamp"] in readme
    md = (REPO / "bench" / "results" / "latest-kube.md").read_text()
    assert kube.latency_table(kept["results"]) in md and kept["meta"]["timestamp"] in md
