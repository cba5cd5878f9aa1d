"""The durability bench still works end to end: `python -m bench.durability --tiny`
starts single etcd, a 3-member etcd cluster, shardetcd on its local journal and
on JetStream R1 and R3 (real NATS servers), runs put-seq, txn-put and the k8s
mix against each, kills etcd-3's leader and shardetcd-js-r3's writer once, and
writes the tables and the JSON.

Figures from a tiny run mean nothing and are not asserted on (speed is
measured in bench/, never in tests); only that every row has answered
requests and bytes written, and that each takeover produced a time."""
from __future__ import annotations

import json
import os
from pathlib import Path

from bench import durability
from tests.benchrun import run_bench

REPO = Path(__file__).resolve().parent.parent


def test_bench_durability_tiny_runs_every_server_and_both_takeovers(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
    p = run_bench(["bench.durability", "--tiny", "--out", str(tmp_path)], env=env, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    [result] = tmp_path.glob("durability-*.json")
    data = json.loads(result.read_text())
    assert data["meta"]["mode"] == "tiny"
    main = [r for r in data["rows"] if r.get("op") in (None, "all writes+reads")]
    ran = {(r["scenario"], r["server"]) for r in main}
    assert ran == {(s, srv) for s, _ in durability.TINY_POINTS for srv in durability.TINY_SERVERS}
    for r in main:
        assert not r.get("errors"), r
        assert r["n"] > 0 and r["req_s"] > 0 and r["p99_ms"] >= r["p50_ms"] > 0, r
        assert r["writes"] > 0 and r["disk_bytes_per_write"] is not None, r
        if r["scenario"] == "put-seq":  # hundreds of 256-byte puts dirty more than one page on any server
            assert r["disk_bytes_per_write"] > 0, r
    # bytes are counted on every process that persists: three members, three NATS servers
    by_proc = {r["server"]: set(r["disk_bytes_by_process"]) for r in main if r["scenario"] == "put-seq"}
    assert by_proc["etcd-3"] == {"etcd m0", "etcd m1", "etcd m2"}
    assert by_proc["shardetcd-js-r3"] == {"shardetcd", "nats n0", "nats n1", "nats n2"}
    assert by_proc["shardetcd-js-r1"] == {"shardetcd", "nats n0"}
    # one takeover each, with a time
    took = {t["server"]: t for t in data["takeovers"]}
    assert set(took) == {"etcd-3", "shardetcd-js-r3"}
    for t in took.values():
        assert t["repeats"] == 1 and t["median_s"] > 0 and t["max_s"] >= t["median_s"], t
    # the standby's log says when it took the lease and recovered, and what it replayed
    assert {"lease_s_median", "recovery_s_median", "records_replayed_median"} <= set(took["shardetcd-js-r3"]), took
    # the table puts every server beside etcd-3 and etcd as ratios
    md = (tmp_path / result.name.replace(".json", ".md")).read_text()
    line = next(x for x in md.splitlines() if x.startswith("| put-seq | 1/1 | shardetcd-js-r3 |"))
    assert all(float(c) > 0 for c in [c.strip() for c in line.strip("|").split("|")][-4:]), line
    assert "| etcd-3 | the leader |" in md and "| shardetcd-js-r3 | the writer |" in md
    # every server was stopped by PID; a tiny run never replaces the results kept in git
    assert p.stdout.count(" stopped ") == len(durability.TINY_SERVERS), p.stdout
    assert "kept as the latest" not in p.stdout and not list(tmp_path.glob("latest-durability*"))


def test_only_a_complete_default_quick_durability_run_is_kept():
    args = durability.parse_args(["--quick"])
    assert durability.publishable(args, list(durability.SERVER_ORDER))
    assert not durability.publishable(args, ["etcd", "etcd-3"])
    assert not durability.publishable(durability.parse_args(["--quick", "--takeovers", "1"]), list(durability.SERVER_ORDER))
    tiny = durability.parse_args(["--tiny"])
    tiny.quick = True
    assert not durability.publishable(tiny, list(durability.SERVER_ORDER))


def test_readme_durability_table_is_the_kept_quick_run():
    """bench/README.md shows the summary of results/latest-durability.json, not older figures."""
    kept = json.loads((REPO / "bench" / "results" / "latest-durability.json").read_text())
    assert kept["meta"]["mode"] == "quick" and kept["meta"]["machine"]["cores"]
    assert {r["server"] for r in kept["rows"]} == set(durability.SERVER_ORDER)
    assert {t["server"] for t in kept["takeovers"]} == {"etcd-3", "shardetcd-js-r3"}
    readme = (REPO / "bench" / "README.md").read_text()
    block = readme.split("<!-- durability-summary:", 1)[1].split("-->", 1)[1].split("<!-- /durability-summary -->", 1)[0]
    assert block.strip() == durability.summary(kept["rows"]).strip()
    assert kept["takeover_md"] in readme and kept["meta"]["timestamp"] in readme
    md = (REPO / "bench" / "results" / "latest-durability.md").read_text()
    assert durability.summary(kept["rows"]) in md and kept["meta"]["timestamp"] in md
