"""The benchmark harness still works end to end: `python -m bench --tiny`
starts etcd, shardetcd and the ceiling server, runs every scenario once with
each, stops them, and writes a table with ratios and the JSON results.

Figures from a tiny run mean nothing and are not asserted on (speed is
measured in bench/, never in tests); only that every scenario produced
answered requests without errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench import scenarios as sc

REPO = Path(__file__).resolve().parent.parent


def test_bench_tiny_runs_every_scenario_on_every_server(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
    p = subprocess.run([sys.executable, "-m", "bench", "--tiny", "--out", str(tmp_path)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    [result] = tmp_path.glob("*.json")
    data = json.loads(result.read_text())
    assert data["meta"]["mode"] == "tiny"
    ran = {(r["scenario"], r["server"]) for r in data["rows"]}
    want = {(s.name, srv) for s in sc.SCENARIOS for srv in s.servers}
    assert ran == want
    for r in data["rows"]:
        assert not r.get("errors"), r
        assert r["n"] > 0 and r["req_s"] > 0 and r["p99_ms"] >= r["p50_ms"] > 0, r
    # the Kubernetes mix ran every call shape, the compaction loop and progress requests included
    for srv in ("etcd", "shardetcd"):
        ops = {r["op"] for r in data["rows"] if r["scenario"] == "k8s-mix" and r["server"] == srv}
        assert {"heartbeat", "pod-create", "pod-update", "pod-delete", "event", "list", "count", "compact",
                "progress", "watch /registry/pods/"} <= ops, (srv, ops)
    # the table puts shardetcd beside etcd as ratios
    put_seq = next(line for line in data["table_md"].splitlines() if line.startswith("| put-seq | 1/1 | shardetcd |"))
    ratios = [c.strip() for c in put_seq.strip("|").split("|")][-3:]
    assert all(float(x) > 0 for x in ratios), put_seq
    # every server was stopped by PID
    assert p.stdout.count("  stopped ") == len({srv for _, srv in want}), p.stdout
    # the machine the figures came from is part of the result
    m = data["meta"]["machine"]
    assert m["cores"] == os.cpu_count() and m["memory_gib"] > 0
    assert m["disk"]["fstype"] and 0 < m["disk"]["fdatasync_ms"]["p50"] <= m["disk"]["fdatasync_ms"]["p99"]
    assert "machine: " in p.stdout
    # a tiny run into another directory never replaces the results kept in git
    assert "kept as the latest quick run" not in p.stdout
    assert not list(tmp_path.glob("latest-quick*"))


def test_publish_keeps_json_plots_and_a_table_with_the_machine(tmp_path):
    from bench import cli, report

    stem = tmp_path / "20260101-000000"
    doc = {"meta": {"timestamp": "20260101-000000", "grpcio": "1", "elapsed_s": 200.0,
                    "servers": {"etcd": {"version": "etcd 3.5.1"}},
                    "machine": {"cores": 2, "cpu_model": "X", "memory_gib": 1.0, "kernel": "k", "python": "3",
                                "dev_shm_gib": 1.0,
                                "disk": {"device": "/dev/x", "fstype": "ext4", "rotational": False, "size_gib": 9.0,
                                         "fdatasync_ms": {"p50": 0.2, "p99": 0.5}}}},
           "rows": [], "check_perf": {}, "table_md": "| t |"}
    report.write_json(stem.with_suffix(".json"), doc)
    png = tmp_path / (stem.name + "-put-seq.png")
    png.write_bytes(b"\x89PNG")
    kept = report.publish(stem, [png], tmp_path / cli.LATEST, doc["meta"], doc["table_md"], {}, doc["rows"])
    assert sorted(p.name for p in kept) == ["latest-quick-put-seq.png", "latest-quick.json", "latest-quick.md"]
    assert json.loads((tmp_path / "latest-quick.json").read_text()) == doc
    text = (tmp_path / "latest-quick.md").read_text()
    assert "2 cores (X), 1.0 GiB RAM, data dir on ext4 /dev/x (non-rotational" in text and "| t |" in text
    # only a complete default quick run is published
    args = cli.parse_args(["--quick"])
    assert cli.publishable(args, list(report.SERVER_ORDER))
    assert not cli.publishable(args, ["etcd", "shardetcd"])
    assert not cli.publishable(cli.parse_args(["--quick", "--only", "put-seq"]), list(report.SERVER_ORDER))
    tiny = cli.parse_args(["--tiny"])
    tiny.quick = True
    assert not cli.publishable(tiny, list(report.SERVER_ORDER))
    assert not cli.publishable(cli.parse_args(["--quick", "--out", str(tmp_path)]), list(report.SERVER_ORDER))


def test_readme_performance_table_is_the_kept_quick_run():
    """The README shows the summary of the results kept in bench/results, not older figures."""
    from bench import report

    kept = json.loads((REPO / "bench" / "results" / "latest-quick.json").read_text())
    assert kept["meta"]["mode"] == "quick" and kept["meta"]["machine"]["cores"]
    assert {r["server"] for r in kept["rows"]} == {"etcd", "shardetcd", "ceiling"}
    readme = (REPO / "README.md").read_text()
    block = readme.split("<!-- bench-summary:", 1)[1].split("-->", 1)[1].split("<!-- /bench-summary -->", 1)[0]
    assert block.strip() == report.summary(kept["rows"]).strip()
    md = (REPO / "bench" / "results" / "latest-quick.md").read_text()
    assert report.summary(kept["rows"]) in md and kept["meta"]["timestamp"] in md


def test_bench_partitions_tiny_runs_one_process_and_a_cluster(tmp_path):
    """python -m bench.partitions still starts etcd, shardetcd with one shard and a two-partition
    cluster, drives spread-put and isolation against each, and stops them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
    servers = ["etcd", "shardetcd-1shard", "cluster-2"]
    p = subprocess.run([sys.executable, "-m", "bench.partitions", "--tiny", "--servers", ",".join(servers),
                        "--out", str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    [result] = tmp_path.glob("*-partitions.json")
    rows = json.loads(result.read_text())["rows"]
    for srv in servers:
        mine = {(r["scenario"], r["op"]) for r in rows if r["server"] == srv}
        assert {("spread-put", "pods"), ("spread-put", "leases"), ("isolation", "heartbeat"),
                ("isolation", "event flood")} <= mine, (srv, mine)
    for r in rows:
        assert not r["errors"], r
        assert r["req_s"] > 0, r
    assert p.stdout.count("  stopped ") == len(servers), p.stdout


def test_etcds_own_benchmark_tool_drives_shardetcd_and_the_ceiling(tmp_path):
    """etcd's tools/benchmark (shared/bin) runs each of etcd's shapes against
    shardetcd, and the ceiling answers the shapes it was given for it (Txn,
    Watch); the tool's summary is parsed into rows. Figures are not asserted."""
    from bench import etcdtool

    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
    for servers, only in (("shardetcd", None), ("ceiling", "txn-put,watch-latency@100")):
        argv = [sys.executable, "-m", "bench.etcdtool", "--tiny", "--servers", servers, "--out", str(tmp_path / servers)]
        p = subprocess.run(argv + (["--only", only] if only else []), cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=400)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        [result] = (tmp_path / servers).glob("*-etcdtool.json")
        rows = json.loads(result.read_text())["rows"]
        want = {(s.name, s.label) for s in etcdtool.SHAPES if only is None or s.name in only.split(",")}
        assert {(r["shape"], r["point"]) for r in rows} == want
        for r in rows:
            assert r["server"] == servers and r["n"] > 0 and r["req_s"] > 0 and r["p99_ms"] >= r["p50_ms"] >= 0, r
        assert f"stopped {servers} (pid " in p.stdout


def test_the_benchmark_tool_summary_is_parsed():
    from bench import etcdtool

    out = """Summary:
  Total:\t2.0010 secs.
  Slowest:\t0.0200 secs.
  Requests/sec:\t999.5000

Response time histogram:
  0.0001 [10]\t|
  0.0200 [1990]\t|∎∎∎

Latency distribution:
  10% in 0.0001 secs.
  50% in 0.0010 secs.
  90% in 0.0050 secs.
  99% in 0.0150 secs.
  99.9% in 0.0199 secs.
"""
    row = etcdtool.parse(out)
    assert row["req_s"] == 999.5 and row["n"] == 2000 and row["total_s"] == 2.001
    assert [round(row[k], 6) for k in ("p50_ms", "p90_ms", "p99_ms", "p999_ms")] == [1.0, 5.0, 15.0, 19.9]
    import pytest

    with pytest.raises(ValueError):
        etcdtool.parse("Error: context deadline exceeded\n")
