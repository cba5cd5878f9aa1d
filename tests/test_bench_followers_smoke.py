"""The followers bench still works end to end: `python -m bench.followers --tiny`
starts etcd 3.5.1, then one NATS server with a shardetcd writer on JetStream R1
and adds followers (1, then 3), runs range-s, range-l, watch-fanout and
lease-keepalive through etcd's benchmark tool against 1, 2 and 4 serving processes, and writes the JSON and
Markdown.

Figures from a tiny run mean nothing and are not asserted on (speed is
measured in bench/, never in tests); only that every row ran, answered
requests without errors, spread its load over every serving process, and
got its ratios."""
from __future__ import annotations

import json
import os
from pathlib import Path

from bench import followers
from tests.benchrun import run_bench

REPO = Path(__file__).resolve().parent.parent


def test_bench_followers_tiny_runs_every_row_without_errors(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
    p = run_bench(["bench.followers", "--tiny", "--out", str(tmp_path)], env=env, timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    [result] = tmp_path.glob("followers-*.json")
    data = json.loads(result.read_text())
    assert data["meta"]["mode"] == "tiny"
    rows = data["rows"]
    assert {(r["scenario"], r["server"]) for r in rows} == {(name, c) for name, _ in followers.POINTS
                                                            for c in followers.CONFIGS}
    for r in rows:
        assert not r["errors"] and not r.get("timed_out"), r
        assert r["n"] > 0 and r["req_s"] > 0, r
        if r["scenario"] != "watch-fanout":  # the tool's watch times nothing
            assert r["p99_ms"] >= r["p50_ms"] > 0, r
        # one CPU figure per serving process: the writer and its followers
        assert r["processes"] == {"etcd": 1, "shardetcd-1": 1, "shardetcd-2": 2, "shardetcd-4": 4}[r["server"]], r
        assert len(r["srv_cpu_pct_by_process"]) == r["processes"], r
        if r["scenario"] == "watch-fanout" and r["processes"] > 1:  # the followers measured their apply lag
            lag = r["follower_apply_lag"]
            assert lag["messages"] > 0 and lag["p99_ms"] >= lag["p50_ms"] >= 0, r
        else:
            assert "follower_apply_lag" not in r, r
        if r["scenario"] == "range-s":  # served by every process, none forwarded: each one worked
            assert all(v > 1 for v in r["srv_cpu_pct_by_process"].values()), r
        assert r["x_etcd"] is not None or r["server"] == "etcd", r
        assert r["x_one"] is not None or r["server"] in ("etcd", followers.ONE), r
    assert len(data["meta"]["servers"]["shardetcd-4"]["endpoints"]) == 4
    md = (tmp_path / result.name.replace(".json", ".md")).read_text()
    assert data["summary_md"] in md and "| range-l | 64/8 conns | shardetcd-4 | 4 |" in md
    # every server stopped; a tiny run never replaces the results kept in git
    assert "stopped etcd" in p.stdout and "stopped shardetcd (writer, followers) and NATS" in p.stdout
    assert "kept as the latest" not in p.stdout and not list(tmp_path.glob("latest-followers*"))


def test_readme_followers_table_is_the_kept_quick_run():
    """bench/README.md shows the summary of results/latest-followers.json, not older figures."""
    kept = json.loads((REPO / "bench" / "results" / "latest-followers.json").read_text())
    assert kept["meta"]["mode"] == "quick"
    assert {r["server"] for r in kept["rows"]} == set(followers.CONFIGS)
    readme = (REPO / "bench" / "README.md").read_text()
    block = readme.split("<!-- followers-summary:", 1)[1].split("-->", 1)[1].split("<!-- /followers-summary -->", 1)[0]
    assert block.strip() == followers.summary(kept["rows"]).strip()
    assert kept["meta"]["timestamp"] in readme
    assert kept["summary_md"] in (REPO / "bench" / "results" / "latest-followers.md").read_text()
