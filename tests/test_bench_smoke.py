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
    # the table puts shardetcd beside etcd as ratios
    put_seq = next(line for line in data["table_md"].splitlines() if line.startswith("| put-seq | 1/1 | shardetcd |"))
    ratios = [c.strip() for c in put_seq.strip("|").split("|")][-3:]
    assert all(float(x) > 0 for x in ratios), put_seq
    # every server was stopped by PID
    assert p.stdout.count("  stopped ") == len({srv for _, srv in want}), p.stdout
