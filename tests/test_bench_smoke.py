"""The benchmark harness still works end to end: `python -m bench --tiny`
starts etcd, shardetcd and the ceiling server, drives etcd's shapes with
etcd's own benchmark tool and the rest with the Python generator, stops them,
and writes one table with ratios and the JSON results.  This is also the
CI smoke run of the tool against shardetcd.

Figures from a tiny run mean nothing and are not asserted on (speed is
measured in bench/, never in tests); only that every scenario produced
answered requests without errors."""
from __future__ import annotations

import json
import signal
import os
import subprocess
from pathlib import Path

import pytest

from bench import etcdtool, scenarios as sc, stages as bench_stages
from tests.benchrun import run_bench

REPO = Path(__file__).resolve().parent.parent


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ETCD", etcdtool.TOOL_ENV))}
    return {**env, **extra}


def test_bench_tiny_runs_every_scenario_on_every_server(tmp_path):
    tool = etcdtool.tool_path()  # the shipped one, handed over as the environment variable
    p = run_bench(["bench", "--tiny", "--out", str(tmp_path)], env=_env(**{etcdtool.TOOL_ENV: str(tool)}), timeout=400)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    [result] = tmp_path.glob("*.json")
    data = json.loads(result.read_text())
    assert data["meta"]["mode"] == "tiny" and data["meta"]["tool"]["path"] == str(tool)
    ran = {(r["scenario"], r["clients"], r["conns"], r["server"], r["generator"]) for r in data["rows"]}
    want = {(s.name, pt.clients, pt.conns, srv, s.driver) for s in sc.SCENARIOS for pt in s.points_for("tiny")
            for srv in s.servers}
    assert ran == want
    # etcd's shapes come from the tool, only what it cannot do from the Python generator
    assert {s.name for s in sc.SCENARIOS if s.driver == "python"} == {"lease-keepalive-many", "k8s-mix"}
    timed = {s.name: s.latency for s in sc.SCENARIOS}
    for r in data["rows"]:
        assert not r.get("errors"), r
        assert r["n"] > 0 and r["req_s"] > 0, r
        if r.get("op") in (None, "all writes+reads"):  # server CPU per request (ticks: may round to 0 in a tiny run)
            assert r["srv_cpu_us"] >= 0 and r["other_cpu_pct"] >= 0, r
        if timed[r["scenario"]]:
            assert r["p99_ms"] >= r["p50_ms"] > 0, r
        else:  # the tool's watch times nothing per event: no latency is reported
            assert r["p50_ms"] is None and r["p99_ms"] is None, r
        # durable writes: each server's own fdatasync count (etcd's WAL histogram, which shardetcd and
        # the ceiling report too) says how many writes one fdatasync covered: one writer's writes cannot
        # share one (each waits for its own), many writers' may; nothing is counted for the read shapes
        if r["scenario"] in ("put-hot", "put-seq", "txn-put"):
            if r["clients"] == 1:
                assert 0.9 <= r["writes_per_fsync"] <= 1.0, r
            else:
                assert r["writes_per_fsync"] >= 0.5, r
        else:
            assert "writes_per_fsync" not in r, r
    # the tool ran its own command for each shape, e.g. watch fan-out through its watch command
    cmds = {r["scenario"]: r["command"] for r in data["rows"] if r["generator"] == "tool"}
    assert cmds["watch-fanout"].startswith("--clients=1 --conns=1 --precise watch "), cmds
    assert "--sequential-keys" in cmds["put-seq"] and "--consistency l" in cmds["range-l"], cmds
    # the Kubernetes mix ran every call shape, the compaction loop and progress requests included
    for srv in ("etcd", "shardetcd"):
        ops = {r["op"] for r in data["rows"] if r["scenario"] == "k8s-mix" and r["server"] == srv}
        assert {"heartbeat", "pod-create", "pod-update", "pod-delete", "event", "list", "count", "compact",
                "progress", "watch /registry/pods/"} <= ops, (srv, ops)
    # one table puts shardetcd beside etcd, the ceiling and (for durable writes) the floor as ratios,
    # with p50/p99 and server CPU
    summary = data["summary_md"]
    assert "| shardetcd/etcd | shardetcd/ceiling | floor req/s | shardetcd/floor | floor/ceiling | " \
           "p50 ms etcd / shardetcd | p99 ms etcd / shardetcd | srv CPU µs/req etcd / shardetcd / ceiling / floor |" \
           in summary
    put_seq = next(line for line in summary.splitlines() if line.startswith("| put-seq | 1/1 | etcd tool |"))
    cells = [c.strip() for c in put_seq.strip("|").split("|")]
    assert all(float(cells[i].rstrip("×")) > 0 for i in (6, 7, 9, 10)), put_seq
    assert len(cells[13].split(" / ")) == 4, put_seq  # the floor's CPU too
    range_l = next(line for line in summary.splitlines() if line.startswith("| range-l | 1/1 | etcd tool |"))
    cells = [c.strip() for c in range_l.strip("|").split("|")]
    assert cells[8:11] == ["", "", ""] and len(cells[13].split(" / ")) == 3, range_l  # reads: no floor
    assert any(line.startswith("| k8s-mix | 34 clients/4 conns | Python |") for line in summary.splitlines())
    # every server was stopped by PID
    assert p.stdout.count("  stopped ") == len({srv for *_, srv, _ in want}), p.stdout
    # the machine the figures came from is part of the result
    m = data["meta"]["machine"]
    assert m["cores"] == os.cpu_count() and m["memory_gib"] > 0
    assert m["disk"]["fstype"] and 0 < m["disk"]["fdatasync_ms"]["p50"] <= m["disk"]["fdatasync_ms"]["p99"]
    assert "machine: " in p.stdout
    # a tiny run into another directory never replaces the results kept in git
    assert "kept as the latest quick run" not in p.stdout
    assert not list(tmp_path.glob("latest-quick*"))


def test_a_missing_benchmark_tool_is_named_with_how_to_get_it(tmp_path, monkeypatch):
    """--tool or $SHARDETCD_BENCHMARK_TOOL pointing nowhere: exit 2, one message, no server started."""
    for argv, env in ((["--tool", str(tmp_path / "nope")], _env()),
                      ([], _env(**{etcdtool.TOOL_ENV: str(tmp_path / "nope")}))):
        p = run_bench(["bench", "--tiny", "--out", str(tmp_path), *argv], env=env, timeout=60)
        assert p.returncode == 2, p.stdout + p.stderr
        assert str(tmp_path / "nope") in p.stderr and "go build ./tools/benchmark" in p.stderr, p.stderr
        assert "started" not in p.stdout and not list(tmp_path.glob("*.json"))
    # nothing given and nothing shipped beside the checkout
    monkeypatch.delenv(etcdtool.TOOL_ENV, raising=False)
    monkeypatch.setattr(etcdtool, "SHIPPED", tmp_path / "etcd-benchmark.xz")
    with pytest.raises(etcdtool.ToolMissing, match=r"--tool PATH or set \$SHARDETCD_BENCHMARK_TOOL"):
        etcdtool.tool_path()


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
    assert not cli.publishable(cli.parse_args(["--quick", "--total", "100"]), list(report.SERVER_ORDER))


def test_readme_performance_table_is_the_kept_quick_run():
    """The README shows the summary of the results kept in bench/results, not older figures."""
    from bench import report

    kept = json.loads((REPO / "bench" / "results" / "latest-quick.json").read_text())
    assert kept["meta"]["mode"] == "quick" and kept["meta"]["machine"]["cores"]
    assert {r["server"] for r in kept["rows"]} == {"etcd", "shardetcd", "floor", "ceiling"}
    assert {r["generator"] for r in kept["rows"]} == {"tool", "python"}
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
    p = run_bench(["bench.partitions", "--tiny", "--servers", ",".join(servers), "--out", str(tmp_path)],
                  env=env, timeout=400)
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


def test_the_benchmark_tool_summary_is_parsed():
    out = """Summary:
  Total:\t2.001 secs.
  Slowest:\t0.02 secs.
  Requests/sec:\t999.5

Response time histogram:
  4.9e-05 [10]\t|
  0.02 [1990]\t|∎∎∎

Latency distribution:
  10% in 5e-05 secs.
  50% in 0.001 secs.
  90% in 0.005 secs.
  99% in 0.015 secs.
  99.9% in 0.0199 secs.

Error distribution:
  [3]\trpc error: code = Unavailable desc = transport is closing
"""
    row = etcdtool.parse(out)
    assert row["req_s"] == 999.5 and row["n"] == 2000 and row["total_s"] == 2.001
    assert [round(row[k], 6) for k in ("p50_ms", "p90_ms", "p99_ms", "p999_ms")] == [1.0, 5.0, 15.0, 19.9]
    assert row["errors"] == {"rpc error: code = Unavailable desc = transport is closing": 3}
    # the watch command: watch creation first, then the events, which are what counts
    watch = "Watch creation summary:\n" + out.split("Error")[0].replace("999.5", "5000") + \
        "Watch events received summary:\n" + out.split("Error")[0].replace("[1990]", "[7000]")
    row = etcdtool.parse(watch)
    assert row["req_s"] == 999.5 and row["n"] == 7010 and not row["errors"]
    with pytest.raises(ValueError):
        etcdtool.parse("Error: context deadline exceeded\n")


def test_profile_splits_server_cpu_by_where_the_samples_are(tmp_path):
    """bench.profile's classification of py-spy's folded stacks (no profiler run here)."""
    from bench import profile

    loop = ("_run_module_as_main (<frozen runpy>:198);<module> (shim/__main__.py:5);main (shim/cli.py:359);"
            "run (asyncio/runners.py:190);BaseEventLoop._run_once (asyncio/base_events.py:1922)")
    call = loop + ";Handle._run (asyncio/events.py:80)"
    pool = "Thread._bootstrap (threading.py:1002);Thread.run (threading.py:982)"
    raw = tmp_path / "raw.txt"
    raw.write_text("\n".join([
        f"thread (100): MainThread;{call} 50",  # a C callback: grpc's Cython
        f"thread (100): MainThread;{loop.replace('1922', '1884')};EpollSelector.select (selectors.py:468) 30",
        f"thread (100): MainThread;{call};_unary.<locals>.handle (shim/handlers.py:61);KVService.Put (shim/kv.py:40);"
        "Store.put (shards/store.py:295);BaseEventLoop.create_future (asyncio/base_events.py:427) 10",
        f"thread (100): MainThread;{call};_unary.<locals>.handle (shim/handlers.py:61);KVService.Put (shim/kv.py:43) 5",
        f"thread (100): MainThread;{call};_deserializer.<locals>.deserialize (shim/handlers.py:38) 4",
        f"thread (100): MainThread;{loop} 1",
        "thread (100): MainThread;Journal._run (journal/journal.py:196);"
        "BaseEventLoop.run_in_executor (asyncio/base_events.py:829) 10",
        f"thread (200): asyncio_0;{pool};_worker (concurrent/futures/thread.py:81) 80",
        f"thread (200): asyncio_0;{pool};_worker (concurrent/futures/thread.py:83);_call (journal/journal.py:49);"
        "fdatasync (journal/fsutil.py:19) 20",
        f"thread (300): Thread-1 (_poll_wrapper);{pool} 100",
    ]) + "\n")
    samples = profile.read_samples(raw)
    assert samples[100]["counts"] == {"gRPC": 50, "protobuf": 4, "waiting": 30, "store": 10, "handler": 5,
                                      "event loop": 1, "journal": 10}
    assert samples[200]["counts"] == {"waiting": 100} and samples[200]["owners"] == {"journal": 20}
    cpu = {100: ("python3", 0.8), 200: ("python3", 0.1), 300: ("python3", 0.05), 400: ("event_engine", 0.04),
           500: ("rocksdb:low", 0.01)}
    b = profile.breakdown(samples, cpu, wall=1.0)
    got = {k: round(v, 4) for k, v in b["cpu_s"].items()}
    # the event loop's 0.8 s over its 80 running samples; the pool thread is the journal's; the poller and
    # grpc's native threads are gRPC; RocksDB's threads are the store's
    assert got == {"gRPC": round(0.8 * 50 / 80 + 0.05 + 0.04, 4), "protobuf": 0.04,
                   "store": round(0.8 * 10 / 80 + 0.01, 4), "handler": 0.05, "event loop": 0.01,
                   "journal": round(0.8 * 10 / 80 + 0.1, 4)}
    main = next(t for t in b["threads"] if t["tid"] == 100)
    assert main["busy_pct"] == 80 and round(main["waiting_samples_pct"], 1) == round(30 / 110 * 100, 1)
    assert main["waits"] == {"EpollSelector.select": 30}


def test_the_ceiling_makes_puts_and_txns_durable_before_answering(tmp_path):
    """The ceiling the writes are compared with pays for a durable write: each Put and
    Txn's bytes are in its file, fdatasynced, by the time it answers."""
    import asyncio

    from bench import ceiling

    async def go() -> None:
        os_fdatasync, synced = os.fdatasync, []
        try:
            # what each fdatasync covers: the requests' bytes before the zeros written ahead of them
            log = tmp_path / "ceiling.log"
            os.fdatasync = lambda fd: (synced.append(len(log.read_bytes().rstrip(b"\0"))), os_fdatasync(fd))[1]
            gc = ceiling.GroupCommit(str(tmp_path), "thread")
            ceiling._commit[0] = gc
            puts = [ceiling._put(b"\x0a\x01" + bytes([65 + i]), None) for i in range(20)]
            await asyncio.gather(*puts, ceiling._txn(b"", None))
            written = log.read_bytes().rstrip(b"\0")
            assert sorted(written[i + 2] for i in range(0, 60, 3)) == list(range(65, 85))
            size = len(written)
            assert size == 20 * 3 and synced and synced[-1] == size  # every answer came after the sync covering it
            assert len(synced) < 21  # group commit: puts arriving during a sync share the next one
        finally:
            os.fdatasync = os_fdatasync
            ceiling._commit[0] = None
            gc.close()

    asyncio.run(go())


def test_the_floor_keeps_versions_journals_rows_and_answers_revisions(tmp_path):
    """The floor (the ceiling + the least MVCC work) does the work it stands for: each write gets the
    next revision in its answer, its row (mvccpb.KeyValue, create revision and version from the key's
    earlier writes) framed with a CRC in the group-committed file, and its tmpfs state goes with it."""
    import grpc

    from bench import servers
    from journal.record import HEADER_BYTES, decode_frame
    from proto import kv_pb2, rpc_pb2 as pb, rpc_pb2_grpc as pbg

    floor = servers.start_floor(tmp_path)
    try:
        assert floor.state_dir.is_dir() and str(floor.state_dir).startswith("/dev/shm/")
        with grpc.insecure_channel(floor.endpoint) as ch:
            kv = pbg.KVStub(ch)
            revs = [kv.Put(pb.PutRequest(key=k, value=v)).header.revision
                    for k, v in ((b"a", b"1"), (b"b", b"2"), (b"a", b"3"))]
            t = kv.Txn(pb.TxnRequest(success=[pb.RequestOp(request_put=pb.PutRequest(key=b"a", value=b"4"))]))
    finally:
        floor.stop()
    assert revs == [2, 3, 4]  # a fresh store's first write is revision 2, as etcd's
    assert t.succeeded and t.header.revision == 5 and t.responses[0].response_put.header.revision == 5
    assert not floor.state_dir.exists()
    data = (tmp_path / "floor" / "ceiling-journal" / "ceiling.log").read_bytes()
    rows, pos = [], 0
    while pos + HEADER_BYTES <= len(data) and data[pos:pos + HEADER_BYTES].strip(b"\0"):  # zeros follow the last
        frame = decode_frame(data, pos, 1 << 20)
        row = kv_pb2.KeyValue.FromString(bytes(frame.payload))
        rows.append((frame.rev, row.key, row.value, row.create_revision, row.mod_revision, row.version))
        pos += HEADER_BYTES + len(frame.payload)
    assert rows == [(2, b"a", b"1", 2, 2, 1), (3, b"b", b"2", 3, 3, 1), (4, b"a", b"3", 2, 4, 2),
                    (5, b"a", b"4", 2, 5, 3)]


def test_bench_writepath_compares_the_store_with_a_bare_group_commit():
    p = run_bench(["bench.writepath", "--puts", "300", "--rounds", "1", "--writers", "1,8"], timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = [ln for ln in p.stdout.splitlines() if ln.startswith(("| 1 |", "| 8 |"))]
    assert len(rows) == 2, p.stdout
    for ln in rows:  # every variant answered puts (figures mean nothing in so short a run)
        cells = [c.strip() for c in ln.strip("|").split("|")]
        assert all(float(c.replace(",", "")) > 0 for c in cells[1:7]), ln


def test_bench_jsread_reads_back_every_message_written_and_a_checkpoint():
    p = run_bench(["bench.jsread", "--messages", "300", "--records", "2", "--rounds", "2", "--checkpoint-mb", "0.5"],
                  timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rounds = [ln for ln in p.stdout.splitlines() if ln.startswith("  round ")]
    assert len(rounds) == 2 and all(" 301 messages (600 records) in " in ln for ln in rounds), p.stdout  # and the fence
    assert not Path(p.stdout.split("data under ", 1)[1].split()[0]).exists()  # its NATS data and files went with it
    ways = ("store_object, 32 in flight (a restore)", "store_object, 1 in flight (a serving writer)", "nats-py's put",
            "fetch_object", "nats-py's get")
    stored = [ln for ln in p.stdout.splitlines() if ln.startswith("  checkpoint round ")]  # each checked byte for byte
    assert len(stored) == 2 and all(ln.count(" s, ") == 4 and all(f"{way} " in ln for way in ways)
                                    for ln in stored), p.stdout
    medians = p.stdout.split("checkpoint medians of 2 rounds, 0.5 MB:\n")[1].splitlines()
    assert [ln.split(":")[0].strip() for ln in medians[:5]] == list(ways), p.stdout
    assert all("a journal's writes meanwhile" in ln for ln in medians[:3]), p.stdout


def test_stage_timers_count_each_stage_once_without_its_nested_stages_or_waits():
    """bench.stages_server's timers: a stage's self time excludes the stages it calls, a timed
    coroutine counts the CPU of its steps (not the time it waits) and one call per run."""
    import asyncio
    import time
    import types

    from bench import stages_server as st

    def burn(seconds: float) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    ns = types.SimpleNamespace(inner=lambda: burn(0.02), outer=None, coro=None)

    def outer():
        burn(0.01)
        ns.inner()

    async def coro():
        ns.inner()
        await asyncio.sleep(0.1)  # waits: not counted
        burn(0.01)
        return 7

    ns.outer, ns.coro = outer, coro
    st.timed(ns, "inner", "inner")
    st.timed(ns, "outer", "outer")
    st.timed_async(ns, "coro", "coro")
    st.STAGES.clear()
    ns.outer()
    assert asyncio.run(ns.coro()) == 7
    inner_ns, inner_calls = st.STAGES["inner"]
    outer_ns, outer_calls = st.STAGES["outer"]
    coro_ns, coro_calls = st.STAGES["coro"]
    assert (inner_calls, outer_calls, coro_calls) == (2, 1, 1)
    assert 0.04e9 <= inner_ns < 0.06e9, inner_ns
    assert 0.01e9 <= outer_ns < 0.018e9, outer_ns  # its own 10 ms, not the inner 20
    assert 0.01e9 <= coro_ns < 0.018e9, coro_ns  # its own 10 ms: neither the inner call nor the 100 ms wait
    st.STAGES.clear()


def test_bench_stages_tiny_splits_shardetcd_per_stage_beside_the_ceiling(tmp_path):
    p = run_bench(["bench.stages", "--tiny", "--out", str(tmp_path)],
                  env=_env(**{etcdtool.TOOL_ENV: str(etcdtool.tool_path())}), timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (path,) = tmp_path.glob("*-stages.json")
    data = json.loads(path.read_text())
    rows = {(r["load"], r["server"]): r for r in data["results"]}
    loads = {r["load"] for r in data["results"]}
    assert {"put 1/1", "txn-put 64/8", "range-l 64/8"} <= loads
    assert {s for _, s in rows} == {"shardetcd", "shardetcd-staged", "ceiling"}
    for load in loads:
        staged = rows[(load, "shardetcd-staged")]
        stages = staged["stages_us"]
        handler, check = {"put 1/1": ("handler: Put", "check + convert a Put"),
                          "txn-put 64/8": ("handler: Txn", "check + convert a Txn")}.get(load, (None, None))
        if handler:  # every write passed through its handler's checks (alone or in a batch: the handler
            # stage then counts one call per batch), the store and the journal's acknowledgement
            assert staged["stage_calls"][check] >= 0.99, staged["stage_calls"]
            for stage in (handler, "store: MVCC row + key index (WriteTxn.put)",
                          "journal: batch acknowledged (commit, release waiters)"):
                assert stages[stage] > 0, (load, stage, stages)
        timed = sum(v for k, v in stages.items() if k != bench_stages.OUTSIDE)
        assert 0 < timed <= staged["loop_us"] * 1.05, (load, timed, staged["loop_us"])
        assert rows[(load, "ceiling")]["total_us"] > 0 and "stages_us" not in rows[(load, "ceiling")]
    assert "| handler: Txn |" in data["table_md"] and "shardetcd − ceiling" in data["table_md"]


def test_a_bench_stopped_midway_stops_its_servers():
    """A bench ended by SIGTERM (what tests/benchrun does when a test times out) stops the servers
    it started, through its own finally blocks: nothing is left in its process group."""
    from tests.benchrun import group_members, start_bench, stop_bench

    proc = start_bench(["bench.jsread", "--messages", "10000000", "--rounds", "1"])
    try:
        line = proc.stdout.readline()  # printed once its NATS server runs
        assert line.startswith("bench.jsread:"), line + proc.stderr.read()
        assert len(group_members(proc.pid)) >= 2  # the bench and its NATS server
    finally:
        killed = stop_bench(proc)
    assert proc.returncode == 128 + signal.SIGTERM
    assert killed == [] and group_members(proc.pid) == []


def test_bench_gcpause_tiny_reports_both_servers_and_the_collector(tmp_path):
    """python -m bench.gcpause --tiny: etcd and shardetcd each take the fill and the updates
    through etcd's tool, and shardetcd's collector runs are read from its /metrics."""
    p = run_bench(["bench.gcpause", "--tiny", "--out", str(tmp_path)],
                  env=_env(**{etcdtool.TOOL_ENV: str(etcdtool.tool_path())}), timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = json.loads(next(tmp_path.glob("*-gcpause.json")).read_text())["rows"]
    assert [(r["server"], r["phase"]) for r in rows] == [("etcd", "fill"), ("etcd", "updates"),
                                                         ("shardetcd", "fill"), ("shardetcd", "updates")]
    assert all(r["n"] == 5_000 and not r["errors"] and r["slowest_ms"] >= r["p99_ms"] > 0 for r in rows)
    assert all("gc_full" in r for r in rows if r["server"] == "shardetcd")
    assert rows[0]["rss_bytes"] > 0 and rows[2]["rss_bytes"] > 0


def test_bench_stalls_tiny_times_each_operation_with_probes_on_both_servers(tmp_path):
    """python -m bench.stalls --tiny: on etcd and on shardetcd each heavy operation does its work
    (every key answered, the lease's keys gone, half the keys deleted) while the probes' Puts and
    Ranges are answered and their slowest timed."""
    p = run_bench(["bench.stalls", "--tiny", "--out", str(tmp_path)],
                  env=_env(**{etcdtool.TOOL_ENV: str(etcdtool.tool_path())}), timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = json.loads(next(tmp_path.glob("*-stalls.json")).read_text())["rows"]
    from bench.stalls import OPS
    assert [(r["server"], r["op"]) for r in rows] == [(s, op) for s in ("etcd", "shardetcd") for op in OPS]
    for r in rows:
        assert r["took_s"] > 0 and r["probes"] > 0 and r["slowest_put_ms"] > 0 and r["slowest_range_ms"] > 0, r
        want = {"range-keys-only": 2_001, "range-all": 2_001, "txn-range-all": 2_001, "delete-range": 1_000,
                "delete-range+prev-kv": 1_000, "delete-range+watch": 1_000}.get(r["op"])
        assert r["did"] == want if want else r["did"] > 0, r
        if r["op"].startswith("lease-revoke"):
            assert r["keys_left"] == 0, r
        if r["op"].endswith("+watch"):  # the watch had every deletion
            assert r["watch_events"] == 1_000 and r["watch_last_event_s"] > 0, r
    assert "| compact-hot |" in next(tmp_path.glob("*-stalls.md")).read_text()


def test_bench_ab_compares_two_builds_round_by_round(tmp_path):
    """python -m bench.ab --tiny: a git revision (checked out into a worktree it removes again) and
    this tree each serve through fresh shardetcd and ceiling processes, every load runs on both,
    and the table says per load and server how the two compare."""
    worktrees = subprocess.run(["git", "-C", str(REPO), "worktree", "list"], capture_output=True, text=True).stdout
    p = run_bench(["bench.ab", "--tiny", "--a", "HEAD", "--b", str(REPO), "--loads", "range-l:1/1,put-seq:64/8",
                   "--out", str(tmp_path)], env=_env(**{etcdtool.TOOL_ENV: str(etcdtool.tool_path())}), timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (path,) = tmp_path.glob("*-ab.json")
    data = json.loads(path.read_text())
    seen = {(r["load"], r["server"], r["side"]) for r in data["runs"]}
    assert seen == {(load, server, side) for load in ("range-l:1/1", "put-seq:64/8")
                    for server in ("shardetcd", "ceiling") for side in "AB"}
    assert all(r["requests"] >= 200 and r["req_s"] > 0 for r in data["runs"]), data["runs"]
    assert data["table_md"].count("| 1 of 1 |") + data["table_md"].count("| 0 of 1 |") == 4
    assert subprocess.run(["git", "-C", str(REPO), "worktree", "list"], capture_output=True,
                          text=True).stdout == worktrees  # its worktree is gone
