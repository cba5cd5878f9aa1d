"""python -m bench.kube [--tiny|--quick]: a real kube-apiserver on etcd and on shardetcd, same load.

For each backend in turn — etcd 3.5.1 (one member), shardetcd with its
defaults, `shardetcd cluster` with node leases and events in partitions of their
own (kube-apiserver --etcd-servers-overrides) — start the backend and a
kube-apiserver v1.36.2 on it (tests/kube_fixture.py), create what the load
needs (a namespace, nodes, their Leases, pods), then offer the same fixed,
open-loop load through the API server's HTTPS API:

  heartbeat    PUT a node's coordination.k8s.io Lease (renewTime), each node every
               --heartbeat seconds (kubelet: 10 s; compressed in quick/tiny)
  pod-create   POST a pod (bound to a node)
  pod-status   PATCH a pod's /status (strategic merge: phase, Ready condition, message)
  pod-delete   DELETE a pod with gracePeriodSeconds=0 (removes it from storage)
  event        POST a core/v1 Event
  list         a paginated LIST of the namespace's pods (limit=500 + continue), every page
  list-page    each page of those lists on its own

Every request is scheduled at a fixed time before the run (open loop: a slow
answer does not delay the next request), spread over worker processes with
keep-alive HTTPS connections (several threads each, one connection per thread).
Latency is measured from the scheduled time, so a wait for a free connection
in the generator counts; the generator's lag (send time - scheduled time) is
reported beside it. Requests scheduled in the measured window count.

kube-apiserver's /metrics is read at the start and the end of the measured
window: the delta of etcd_request_duration_seconds (its time in the storage
layer, per resource and operation) and of apiserver_request_duration_seconds
(its own view of each API request) give the mean and an approximate p99
(interpolated in the histogram's buckets, like Prometheus' histogram_quantile).

Everything — load generator, kube-apiserver, the backend — shares this
machine's cores; CPU of each and of the rest of the machine (other CPU %) is
recorded over the window.
"""
from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import math
import multiprocessing as mp
import os
import platform
import queue
import re
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse
from array import array
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from . import machine, report, runargs
from .servers import busy_seconds, cpu_seconds, machine_busy, start_real_etcd, start_shardetcd_default, stop_by_pid

RESULTS = runargs.RESULTS
QUIET_WAIT_S = {"tiny": 0.0, "quick": 30.0, "full": 60.0}  # before each backend
LATEST = "latest-kube"
now = time.monotonic

NS = "kbench"  # pods and events
LEASE_NS = "kube-node-lease"
KINDS = ("heartbeat", "pod-create", "pod-status", "pod-delete", "event", "list", "list-page")
WHAT = {  # kind -> the HTTP request
    "heartbeat": "PUT lease (kube-node-lease)",
    "pod-create": "POST pod",
    "pod-status": "PATCH pod/status",
    "pod-delete": "DELETE pod (grace 0)",
    "event": "POST event",
    "list": "LIST pods, all pages",
    "list-page": "GET pods?limit= (one page)",
    "healthz": "GET /healthz",
}
SERVER_ORDER = ("etcd", "shardetcd", "shardetcd-cluster")
SHORT = {"etcd": "etcd", "shardetcd": "shardetcd", "shardetcd-cluster": "cluster"}
CLUSTER_LAYOUT = """
[[partition]]
name = "leases"
resources = ["coordination.k8s.io/leases"]

[[partition]]
name = "events"
resources = ["events"]

[[partition]]
name = "main"
default = true
"""
NOTE = ("Load generator, kube-apiserver and the backend share the same 2 cores (loopback only); kube-apiserver "
        "runs with its defaults (watch cache on) apart from the flags tests/kube_fixture.py sets.")
PROGRESS_NOTE = ("etcd 3.5.1 reports a version below 3.5.13, so kube-apiserver turns RequestWatchProgress off on it "
                 "(its log says so) and with it consistent reads from the watch cache: the first page of each LIST "
                 "(no resourceVersion) is a Range on etcd, the continue pages come from the watch cache. shardetcd "
                 "reports a newer version, so kube-apiserver serves every page from its watch cache (after a "
                 "WatchProgressRequest on the pods watch). The LIST rows compare these two read paths; the storage "
                 "counts below show which one each backend got.")


@dataclass(frozen=True)
class Mode:
    name: str
    nodes: int
    heartbeat_s: float  # each node's Lease every this many seconds
    keep_pods: int  # pods present throughout, whose status is patched
    rates: dict  # kind -> requests per second (heartbeats: nodes / heartbeat_s)
    list_limit: int
    warmup: float
    duration: float
    workers: int = 2  # load-generator processes
    threads: int = 16  # connections (one thread each) per worker
    servers: tuple = SERVER_ORDER

    def rate(self, kind: str) -> float:
        return self.nodes / self.heartbeat_s if kind == "heartbeat" else self.rates.get(kind, 0.0)

    @property
    def doomed_pods(self) -> int:
        """pods made in setup for pod-delete to remove (one per delete scheduled, and a margin)"""
        return math.ceil(self.rates["pod-delete"] * (self.warmup + self.duration)) + 5


MODES = {
    "tiny": Mode("tiny", nodes=20, heartbeat_s=1.0, keep_pods=100, list_limit=50, warmup=1.0, duration=4.0,
                 rates={"pod-create": 4, "pod-status": 10, "pod-delete": 4, "event": 10, "list": 1},
                 threads=8, servers=("etcd", "shardetcd")),
    "quick": Mode("quick", nodes=100, heartbeat_s=1.0, keep_pods=1000, list_limit=500, warmup=3.0, duration=30.0,
                  rates={"pod-create": 10, "pod-status": 30, "pod-delete": 10, "event": 30, "list": 1}),
    "full": Mode("full", nodes=1000, heartbeat_s=10.0, keep_pods=5000, list_limit=500, warmup=10.0, duration=120.0,
                 rates={"pod-create": 20, "pod-status": 60, "pod-delete": 20, "event": 50, "list": 0.2}),
}
GEN_CHECK_RATES = (500, 1000, 2000, 3000, 4000)  # GET /healthz per second, for --generator-check


# ------------------------------------------------------------------ objects


def micro_time() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rfc3339() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_name(i: int) -> str:
    return f"node-{i:05d}"


def node_obj(i: int) -> dict:
    name = node_name(i)
    cap = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
            "status": {"capacity": cap, "allocatable": cap}}


def lease_obj(i: int) -> dict:
    name = node_name(i)
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name, "namespace": LEASE_NS},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": micro_time()}}


def pod_obj(name: str, node: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": {"app": "kbench", "tier": name.split("-")[0]}},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 30,
                     "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}}


def pod_status_patch(seq: int) -> dict:
    ts = rfc3339()
    return {"status": {"phase": "Running", "startTime": ts, "message": f"kbench update {seq}",
                       "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": ts}]}}


def event_obj(k: int, pod: str, node: str) -> dict:
    ts = rfc3339()
    return {"apiVersion": "v1", "kind": "Event", "metadata": {"name": f"{pod}.{k:08x}", "namespace": NS},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": NS, "name": pod},
            "reason": "Pulled", "type": "Normal", "count": 1, "firstTimestamp": ts, "lastTimestamp": ts,
            "message": 'Container image "registry.k8s.io/pause:3.10" already present on machine',
            "source": {"component": "kubelet", "host": node}}


# ------------------------------------------------------------------ HTTP


class Conn:
    """One keep-alive HTTPS connection to kube-apiserver (unverified TLS: its certificate is self-signed).
    A failed request closes it; the next request reconnects. Nothing is retried."""

    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self.tls = ssl.create_default_context()
        self.tls.check_hostname = False
        self.tls.verify_mode = ssl.CERT_NONE
        self.c: http.client.HTTPSConnection | None = None

    def connect(self) -> None:
        self.c = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.tls, timeout=60)
        self.c.connect()

    def request(self, method: str, path: str, body: dict | None = None,
                ctype: str = "application/json") -> tuple[int, bytes]:
        if self.c is None:
            self.connect()
        headers = self.headers
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers = {**headers, "Content-Type": ctype}
        try:
            self.c.request(method, path, body=data, headers=headers)
            resp = self.c.getresponse()
            return resp.status, resp.read()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.c is not None:
            self.c.close()
            self.c = None


def _ok(status: int) -> bool:
    return 200 <= status < 300


# ------------------------------------------------------------------ the load (in worker processes)


def schedule(mode: Mode, wi: int, wn: int, kinds=None, rates: dict | None = None, span: float | None = None) -> list:
    """This worker's share of the run: [(due offset s, kind, arg)], sorted. Heartbeats: node i every
    heartbeat_s from phase i/nodes of a period, worker i % wn; other kinds: request k at (k + phase)/rate,
    worker k % wn (phases differ per kind so that kinds do not fire together)."""
    span = span if span is not None else mode.warmup + mode.duration
    out = []
    kinds = kinds or [k for k in KINDS if k != "list-page"]
    for ki, kind in enumerate(kinds):
        if kind == "heartbeat":
            for i in range(wi, mode.nodes, wn):
                t = i / mode.nodes * mode.heartbeat_s
                while t < span:
                    out.append((t, kind, i))
                    t += mode.heartbeat_s
            continue
        rate = (rates or mode.rates).get(kind, 0.0)
        if rate <= 0:
            continue
        phase = (0.137 * (ki + 1)) % 1.0
        k = wi
        while (t := (k + phase) / rate) < span:
            out.append((t, kind, k))
            k += wn
    out.sort()
    return out


class Load:
    """The requests, with the little state they need (each node's Lease as last written)."""

    def __init__(self, job: dict) -> None:
        self.mode = Mode(**{**job["mode"], "servers": tuple(job["mode"]["servers"])})
        self.leases: dict[int, dict] = {}
        self.node_locks: dict[int, threading.Lock] = {}
        self.conflicts = Counter()
        self.pages: list[int] = []

    def lease_path(self, i: int) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases/{node_name(i)}"

    def prepare(self, conn: Conn, nodes: list[int]) -> None:
        for i in nodes:
            st, raw = conn.request("GET", self.lease_path(i))
            if st != 200:
                raise RuntimeError(f"GET lease {node_name(i)}: HTTP {st}: {raw[:300]!r}")
            self.leases[i] = json.loads(raw)
            self.node_locks[i] = threading.Lock()

    def do(self, conn: Conn, kind: str, k: int, page_lat: list) -> tuple[int, bytes]:
        m = self.mode
        if kind == "heartbeat":
            with self.node_locks[k]:  # one node's renewals in order, as a kubelet does
                lease = self.leases[k]
                lease["spec"]["renewTime"] = micro_time()
                st, raw = conn.request("PUT", self.lease_path(k), lease)
                if st == 409:  # kubelet: on a conflict, get the lease and update again
                    self.conflicts["heartbeat"] += 1
                    st, raw = conn.request("GET", self.lease_path(k))
                    if st == 200:
                        lease = json.loads(raw)
                        lease["spec"]["renewTime"] = micro_time()
                        st, raw = conn.request("PUT", self.lease_path(k), lease)
                if st == 200:
                    self.leases[k] = json.loads(raw)
                return st, raw
        if kind == "pod-create":
            return conn.request("POST", f"/api/v1/namespaces/{NS}/pods", pod_obj(f"new-{k}", node_name(k % m.nodes)))
        if kind == "pod-status":
            return conn.request("PATCH", f"/api/v1/namespaces/{NS}/pods/keep-{k % m.keep_pods}/status",
                                pod_status_patch(k), "application/strategic-merge-patch+json")
        if kind == "pod-delete":
            return conn.request("DELETE", f"/api/v1/namespaces/{NS}/pods/doomed-{k}?gracePeriodSeconds=0")
        if kind == "event":
            return conn.request("POST", f"/api/v1/namespaces/{NS}/events",
                                event_obj(k, f"keep-{k % m.keep_pods}", node_name(k % m.nodes)))
        if kind == "list":
            cont, pages = None, 0
            while True:
                q = {"limit": m.list_limit}
                if cont:
                    q["continue"] = cont
                t = now()
                st, raw = conn.request("GET", f"/api/v1/namespaces/{NS}/pods?{urllib.parse.urlencode(q)}")
                page_lat.append((t, now() - t, st))
                pages += 1
                if st != 200:
                    return st, raw
                # the list's metadata comes before its items: no need to decode a 1 MB page
                mm = re.search(rb'"metadata":\{[^{}]*?"continue":"([^"]*)"', raw[:4096])
                cont = mm.group(1).decode() if mm else None
                if not cont:
                    self.pages.append(pages)
                    return st, raw
        if kind == "healthz":
            return conn.request("GET", "/healthz")
        raise ValueError(kind)


def run_load(job: dict, wi: int, wn: int, pipe) -> dict:
    load = Load(job)
    mode = load.mode
    ops = schedule(mode, wi, wn, job.get("kinds"), job.get("rates"), job.get("span"))
    threads = job.get("threads", mode.threads)
    conns = [Conn(job["port"], job["token"]) for _ in range(threads)]
    for c in conns:
        c.connect()
    if "heartbeat" in {k for _, k, _ in ops}:
        load.prepare(conns[0], list(range(wi, mode.nodes, wn)))
    q: queue.Queue = queue.Queue()
    records: list = []  # (kind, due, sent, done, status)
    page_recs: list = []
    errors: dict = {}
    lock = threading.Lock()

    def serve(conn: Conn) -> None:
        local, pages = [], []
        while True:
            item = q.get()
            if item is None:
                break
            due, kind, k = item
            sent = now()
            try:
                st, raw = load.do(conn, kind, k, pages)
            except Exception as exc:  # connection reset, timeout: an error of this request
                st, raw = -1, f"{type(exc).__name__}: {exc}".encode()
            local.append((kind, due, sent, now(), st))
            if not _ok(st):
                with lock:
                    e = errors.setdefault(kind, {"count": 0, "by_status": Counter(), "samples": []})
                    e["count"] += 1
                    e["by_status"][str(st)] += 1
                    if len(e["samples"]) < 3:
                        e["samples"].append(raw[:300].decode(errors="replace"))
        with lock:
            records.extend(local)
            page_recs.extend(pages)

    workers = [threading.Thread(target=serve, args=(c,), daemon=True) for c in conns]
    for t in workers:
        t.start()
    pipe.send(("ready",))
    msg = pipe.recv()
    if msg[0] != "go":
        for _ in workers:
            q.put(None)
        return {"aborted": True}
    t0 = msg[1]
    for off, kind, k in ops:
        due = t0 + off
        d = due - now()
        if d > 0:
            time.sleep(d)
        q.put((due, kind, k))
    for _ in workers:
        q.put(None)
    for t in workers:
        t.join(mode.warmup + mode.duration + 300)
    for c in conns:
        c.close()
    win0, win1 = t0 + mode.warmup, t0 + job.get("span", mode.warmup + mode.duration)
    out: dict = {"kinds": {}, "errors": {k: {**v, "by_status": dict(v["by_status"])} for k, v in errors.items()},
                 "conflicts": dict(load.conflicts), "pages": load.pages, "scheduled": len(ops)}
    by_kind: dict[str, list] = {}
    for kind, due, sent, done, st in records:
        by_kind.setdefault(kind, []).append((due, sent, done, st))
    if page_recs:  # each page of the lists: from its own send
        by_kind["list-page"] = [(t, t, t + lat, st) for t, lat, st in page_recs]
    for kind, recs in by_kind.items():
        inwin = [r for r in recs if win0 <= r[0] < win1]
        ok = [r for r in inwin if _ok(r[3])]
        out["kinds"][kind] = {
            "n": len(inwin), "ok": len(ok), "errors": len(inwin) - len(ok), "n_all": len(recs),
            "due": array("d", [r[0] - win0 for r in ok]).tobytes(),  # scheduled, from the window's start
            "lat": array("d", [r[2] - r[0] for r in ok]).tobytes(),  # from the scheduled time
            "svc": array("d", [r[2] - r[1] for r in ok]).tobytes(),  # from the send
            "lag": array("d", [r[1] - r[0] for r in inwin]).tobytes(),
            "done_in_window": sum(1 for r in recs if win0 <= r[2] < win1 and _ok(r[3])),
        }
    return out


def _worker_main(pipe) -> None:
    while True:
        msg = pipe.recv()
        if msg[0] == "close":
            return
        if msg[0] != "job":
            continue
        _, job, wi, wn = msg
        try:
            pipe.send(("result", run_load(job, wi, wn, pipe)))
        except Exception:
            pipe.send(("error", traceback.format_exc()))


class Pool:
    """Worker processes (spawned once, reused for every backend)."""

    def __init__(self, size: int) -> None:
        ctx = mp.get_context("spawn")
        self.pipes, self.procs = [], []
        for _ in range(size):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker_main, args=(child,), daemon=True)
            p.start()
            self.pipes.append(parent)
            self.procs.append(p)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def _recv(self, pipe, timeout: float, expect: str):
        if not pipe.poll(timeout):
            raise RuntimeError(f"load worker silent for {timeout:.0f} s while waiting for {expect}")
        msg = pipe.recv()
        if msg[0] == "error":
            raise RuntimeError(f"load worker failed:\n{msg[1]}")
        if msg[0] != expect:
            raise RuntimeError(f"load worker sent {msg[0]!r}, expected {expect!r}")
        return msg

    def run(self, job: dict, in_window=None) -> list[dict]:
        """Run `job` on every worker; `in_window(t0)` runs here meanwhile (samples, progress)."""
        for wi, p in enumerate(self.pipes):
            p.send(("job", job, wi, len(self.pipes)))
        try:
            for p in self.pipes:
                self._recv(p, 300, "ready")
        except Exception:
            for p in self.pipes:
                p.send(("abort",))
            raise
        t0 = now() + 0.2
        for p in self.pipes:
            p.send(("go", t0))
        extra = in_window(t0) if in_window else None
        span = job.get("span", job["mode"]["warmup"] + job["mode"]["duration"])
        results = [self._recv(p, span + 400, "result")[1] for p in self.pipes]
        if extra is not None:
            results[0]["_window"] = extra
        return results

    def close(self) -> None:
        for p in self.pipes:
            try:
                p.send(("close",))
            except OSError:
                pass
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()


# ------------------------------------------------------------------ /metrics


def scrape(api) -> dict[str, dict]:
    """{metric: {labels (sorted tuple without 'le'): {"buckets": {le: cum}, "sum": s, "count": n}}} for the
    two duration histograms."""
    st, text = api.client.text("/metrics", timeout=60)
    if st != 200:
        raise RuntimeError(f"/metrics: HTTP {st}: {text[:300]}")
    out: dict[str, dict] = {"etcd_request_duration_seconds": {}, "apiserver_request_duration_seconds": {}}
    rx = re.compile(r"(etcd_request_duration_seconds|apiserver_request_duration_seconds)_(bucket|sum|count)\{(.*)\} (\S+)")
    for line in text.splitlines():
        m = rx.fullmatch(line)
        if not m:
            continue
        name, part, labels, value = m.groups()
        lab = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels))
        le = lab.pop("le", None)
        key = tuple(sorted(lab.items()))
        h = out[name].setdefault(key, {"buckets": {}, "sum": 0.0, "count": 0.0})
        if part == "bucket":
            h["buckets"][float(le)] = float(value)
        else:
            h[part] = float(value)
    return out


FSYNC = "etcd_disk_wal_fsync_duration_seconds"


def scrape_backend(urls) -> dict:
    """The backend's WAL/journal fsync histogram (etcd and shardetcd both export it), summed over `urls`."""
    import urllib.request

    h = {"buckets": {}, "sum": 0.0, "count": 0.0}
    for url in urls or ():
        with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
            text = resp.read().decode()
        for m in re.finditer(rf"^{FSYNC}_(bucket|sum|count)(?:{{(.*)}})? (\S+)$", text, re.M):
            part, labels, value = m.groups()
            if part == "bucket":
                le = float(re.search(r'le="([^"]+)"', labels).group(1))
                h["buckets"][le] = h["buckets"].get(le, 0.0) + float(value)
            else:
                h[part] += float(value)
    return {FSYNC: {(): h}} if urls else {}


def hist_delta(a: dict, b: dict) -> dict:
    """b - a, for each histogram series with a positive count delta."""
    out = {}
    for name, series in b.items():
        for key, h1 in series.items():
            h0 = a.get(name, {}).get(key, {"buckets": {}, "sum": 0.0, "count": 0.0})
            n = h1["count"] - h0["count"]
            if n <= 0:
                continue
            buckets = {le: c - h0["buckets"].get(le, 0.0) for le, c in h1["buckets"].items()}
            out.setdefault(name, {})[key] = {"buckets": buckets, "sum": h1["sum"] - h0["sum"], "count": n}
    return out


def hist_quantile(q: float, buckets: dict[float, float]) -> tuple[float | None, float | None]:
    """(value, upper bound of its bucket), linear within the bucket as histogram_quantile does."""
    les = sorted(buckets)
    if not les:
        return None, None
    total = buckets[les[-1]]
    if total <= 0:
        return None, None
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le in les:
        c = buckets[le]
        if c >= rank:
            if math.isinf(le):
                return prev_le, le  # beyond the last finite bucket: its bound is all we know
            frac = (rank - prev_c) / (c - prev_c) if c > prev_c else 1.0
            return prev_le + (le - prev_le) * frac, le
        prev_le, prev_c = le, c
    return prev_le, les[-1]


def hist_rows(delta: dict, name: str, label_keys: tuple[str, ...], seconds: float) -> list[dict]:
    rows = []
    for key, h in delta.get(name, {}).items():
        lab = dict(key)
        p99, bound = hist_quantile(0.99, h["buckets"])
        p50, _ = hist_quantile(0.5, h["buckets"])
        rows.append({**{k: lab.get(k, "") for k in label_keys}, "count": int(round(h["count"])),
                     "per_s": h["count"] / seconds, "mean_ms": h["sum"] / h["count"] * 1e3,
                     "p50_ms": None if p50 is None else p50 * 1e3, "p99_ms": None if p99 is None else p99 * 1e3,
                     "p99_bucket_le_ms": None if bound is None else bound * 1e3})
    rows.sort(key=lambda r: -r["count"])
    return rows


# ------------------------------------------------------------------ backends


@dataclass
class Backend:
    name: str
    version: str
    etcd_servers: list[str]
    overrides: list[str]
    pids: dict  # role -> pid (processes whose CPU is the backend's)
    logs: list[Path]
    stop: object
    describe: str = ""
    metrics_urls: list = None  # the backend's own /metrics (etcd: its client URL; shardetcd: --listen-metrics-urls)


def start_backend(name: str, tmp: Path) -> Backend:
    tmp.mkdir(parents=True, exist_ok=True)
    if name == "etcd":
        s = start_real_etcd(tmp)
        return Backend(name, s.version, [f"http://{s.endpoint}"], [], {"etcd": s.pid}, [s.process.log_path], s.stop,
                       "etcd 3.5.1, one member, data dir on disk", [s.metrics_url])
    if name == "shardetcd":
        s = start_shardetcd_default(tmp)
        return Backend(name, s.version, [f"http://{s.endpoint}"], [], {"shardetcd": s.pid}, [s.process.log_path], s.stop,
                       "shardetcd with its defaults: one process, 5 shards, local journal fsync=always, state on /dev/shm",
                       [s.metrics_url])
    if name == "shardetcd-cluster":
        return start_cluster(tmp)
    raise ValueError(name)


def start_cluster(tmp: Path) -> Backend:
    """`shardetcd cluster`: node leases, events, everything else, one process each; kube-apiserver gets
    the --etcd-servers and --etcd-servers-overrides the cluster prints."""
    from tests.etcd_fixture import free_port

    layout = tmp / "cluster.toml"
    layout.write_text(re.sub(r'^(name = "\w+")$', lambda m: f"{m[1]}\nport = {free_port()}", CLUSTER_LAYOUT, flags=re.M))
    data = tmp / "cluster"
    out_path = tmp / "cluster.out"
    out = out_path.open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "shim", "cluster", "--layout", str(layout), "--data-dir", str(data),
                             "--base-port", str(free_port())], stdout=out, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, cwd=Path(__file__).resolve().parent.parent)

    def stop() -> None:
        stop_by_pid(proc)
        out.close()

    try:
        flags_file = data / "kube-apiserver.flags"
        deadline = time.monotonic() + 90
        while not (flags_file.exists() and "kube-apiserver flags" in out_path.read_text()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"shardetcd cluster did not start:\n{out_path.read_text()}")
            time.sleep(0.1)
        text = out_path.read_text()
        pids = {m[0]: int(m[1]) for m in re.findall(r"^  (\w+)\s+http://\S+\s+pid (\d+)", text, re.M)}
        flags = flags_file.read_text().split()
        servers = next(f.split("=", 1)[1] for f in flags if f.startswith("--etcd-servers="))
        overrides = [f.split("=", 1)[1] for f in flags if f.startswith("--etcd-servers-overrides=")]
    except BaseException:
        stop()
        raise
    pids["supervisor"] = proc.pid
    return Backend("shardetcd-cluster", f"shardetcd cluster ({len(pids) - 1} partition processes)", servers.split(","),
                   ",".join(overrides).split(",") if overrides else [], pids,
                   [data / f"{n}.log" for n in pids if n != "supervisor"], stop,
                   "`shardetcd cluster`: partitions leases (coordination.k8s.io/leases), events, main (the rest), "
                   "one process each, defaults otherwise")


def key_counts(be: Backend) -> dict:
    """Keys under the load's prefixes on each endpoint after the run: shows where kube-apiserver put them
    (with --etcd-servers-overrides, node leases and events on their own partitions)."""
    import grpc

    from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg

    out = {}
    for url in dict.fromkeys(be.etcd_servers + [o.split("#", 1)[1] for o in be.overrides]):
        with grpc.insecure_channel(url.removeprefix("http://")) as ch:
            kv = pbg.KVStub(ch)
            counts = {}
            for res in ("pods", "leases", "events", "minions"):
                key = f"/registry/{res}/".encode()
                end = key[:-1] + bytes([key[-1] + 1])
                counts[res] = kv.Range(pb.RangeRequest(key=key, range_end=end, count_only=True), timeout=10).count
        out[url] = counts
    return out


# ------------------------------------------------------------------ setup


def setup(api, mode: Mode, log) -> dict:
    """Namespaces, nodes, their Leases, the pods to patch and to delete. Parallel, not measured."""
    c = api.client
    for ns in (NS, LEASE_NS):
        st, body = c.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
        if st not in (201, 409):
            raise RuntimeError(f"create namespace {ns}: HTTP {st}: {body}")
    local = threading.local()

    def create(item: tuple[str, dict]) -> None:
        path, obj = item
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = Conn(api.port, api.token)
        for attempt in range(5):
            try:
                st, raw = conn.request("POST", path, obj)
            except (OSError, http.client.HTTPException) as exc:
                st, raw = -1, str(exc).encode()
            if st in (201, 409):
                return
            time.sleep(0.2 * (attempt + 1))
        raise RuntimeError(f"setup POST {path}: HTTP {st}: {raw[:300]!r}")

    items = [("/api/v1/nodes", node_obj(i)) for i in range(mode.nodes)]
    items += [(f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases", lease_obj(i)) for i in range(mode.nodes)]
    pods = [f"keep-{j}" for j in range(mode.keep_pods)] + [f"doomed-{j}" for j in range(mode.doomed_pods)]
    items += [(f"/api/v1/namespaces/{NS}/pods", pod_obj(p, node_name(j % mode.nodes))) for j, p in enumerate(pods)]
    t = now()
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(create, items))
    took = now() - t
    log(f"setup: {mode.nodes} nodes, {mode.nodes} leases, {len(pods)} pods in {took:.1f} s "
        f"({len(items) / took:.0f} creates/s, closed loop, 16 connections)")
    return {"objects": len(items), "seconds": took}


# ------------------------------------------------------------------ one backend


def process_cpu() -> dict[int, tuple[float, str]]:
    """{pid: (CPU seconds, command line)} of every process on the machine right now."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        out[int(d)] = ((int(fields[11]) + int(fields[12])) / tick, cmd[:120])
    return out


def top_others(a: dict, b: dict, ours: set[int], seconds: float, n: int = 5) -> list[dict]:
    """The processes other than ours that used the most CPU between two process_cpu() samples."""
    used = []
    for pid, (cpu1, cmd) in b.items():
        if pid in ours:
            continue
        cpu0 = a.get(pid, (0.0, cmd))[0]  # started in the window: all its CPU is in it
        if cpu1 - cpu0 > 0.01 * seconds:
            used.append({"pid": pid, "cpu_pct": (cpu1 - cpu0) / seconds * 100, "cmd": cmd})
    used.sort(key=lambda x: -x["cpu_pct"])
    return used[:n]


def _cpu(pids) -> float:
    total = 0.0
    for p in pids:
        try:
            total += cpu_seconds(p)
        except OSError:
            pass
    return total


def run_backend(name: str, tmp: Path, mode: Mode, pool: Pool, log, gen_check: bool, quiet_wait: float,
                quiet_below: float) -> dict:
    from tests.kube_fixture import start_kube_apiserver

    idle = runargs.wait_quiet(quiet_wait, quiet_below) if quiet_wait else machine_busy(0.5)  # logged either way
    be = start_backend(name, tmp / name)
    log(f"started {name}: {be.version} (pids {be.pids}); machine busy before start {idle:.0f} % of a core")
    res: dict = {"server": name, "version": be.version, "describe": be.describe, "busy_before_pct": idle}
    try:
        t = now()
        api = start_kube_apiserver(tmp / name, be.etcd_servers, etcd_servers_overrides=be.overrides)
        log(f"kube-apiserver ready in {now() - t:.1f} s (pid {api.pid}) on --etcd-servers={','.join(be.etcd_servers)}"
            + (f" --etcd-servers-overrides={','.join(be.overrides)}" if be.overrides else ""))
        try:
            res["setup"] = setup(api, mode, log)
            if gen_check:
                res["generator_check"] = generator_check(api, mode, pool, log)
            res.update(measure(api, be, mode, pool, log))
            res["logs"] = scan_logs(api, be, res.pop("_apiserver_log_offset"))
            res["keys"] = key_counts(be)
        finally:
            api.stop()
    finally:
        be.stop()
        log(f"stopped {name} (pids {list(be.pids.values())}) and its kube-apiserver")
    return res


def measure(api, be: Backend, mode: Mode, pool: Pool, log) -> dict:
    job = {"mode": asdict(mode), "port": api.port, "token": api.token}
    offset = api.log_path.stat().st_size

    def in_window(t0: float) -> dict:
        start, end = t0 + mode.warmup, t0 + mode.warmup + mode.duration
        time.sleep(max(0.0, start - now()))
        m0 = scrape(api)
        f0 = scrape_backend(be.metrics_urls)
        pids_gen = pool.pids
        p0 = process_cpu()
        h0 = cpu_seconds(os.getpid())
        s0 = (_cpu(be.pids.values()), cpu_seconds(api.pid), _cpu(pids_gen), busy_seconds(), now())
        log(f"measuring {mode.duration:.0f} s (warm-up {mode.warmup:.0f} s done)")
        next_note = now() + 10
        while now() < end:
            time.sleep(max(0.0, min(end, next_note) - now()))
            if now() >= next_note and now() < end - 2:
                log(f"  ... {now() - start:.0f}/{mode.duration:.0f} s")
                next_note += 10
        s1 = (_cpu(be.pids.values()), cpu_seconds(api.pid), _cpu(pids_gen), busy_seconds(), now())
        others = top_others(p0, process_cpu(), {*be.pids.values(), api.pid, *pids_gen, os.getpid()}, s1[4] - s0[4])
        harness = cpu_seconds(os.getpid()) - h0
        m1 = scrape(api)
        f1 = scrape_backend(be.metrics_urls)
        return {"metrics": hist_delta(m0, m1), "fsync": hist_delta(f0, f1), "cpu": (s0, s1), "others": others,
                "harness_s": harness}

    results = pool.run(job, in_window)
    window = results[0].pop("_window")
    (b0, a0, g0, m0, t0), (b1, a1, g1, m1, t1) = window["cpu"]
    secs = t1 - t0
    cpu = {"backend_pct": (b1 - b0) / secs * 100, "apiserver_pct": (a1 - a0) / secs * 100,
           "generator_pct": (g1 - g0) / secs * 100, "window_s": secs}
    cpu["harness_pct"] = window["harness_s"] / secs * 100  # this process: /proc samples (the /metrics scrapes are outside)
    cpu["other_pct"] = max(0.0, ((m1 - m0) - (b1 - b0) - (a1 - a0) - (g1 - g0) - window["harness_s"]) / secs * 100)
    cpu["other_processes"] = window["others"]  # what else ran in the window, by CPU
    rows, requests = [], 0
    for kind in [*KINDS, "healthz"]:
        parts = [r["kinds"][kind] for r in results if kind in r["kinds"]]
        if not parts:
            continue
        lat = np.concatenate([report._arr(p["lat"]) for p in parts])
        svc = np.concatenate([report._arr(p["svc"]) for p in parts])
        lag = np.concatenate([report._arr(p["lag"]) for p in parts])
        n, errs = sum(p["n"] for p in parts), sum(p["errors"] for p in parts)
        pct = report._pcts(lat)
        sp = report._pcts(svc)
        row = {"kind": kind, "what": WHAT[kind], "offered_per_s": mode.rate(kind) if kind not in ("list-page",) else None,
               "n": n, "errors": errs, "per_s": n / mode.duration, **pct,
               "svc_p50_ms": sp["p50_ms"], "svc_p99_ms": sp["p99_ms"],
               "lag_p50_ms": report._pcts(lag)["p50_ms"], "lag_p99_ms": report._pcts(lag)["p99_ms"]}
        if kind == "list":
            pages = [x for r in results for x in r["pages"]]
            row["pages_per_list"] = max(pages) if pages else None
        rows.append(row)
        if kind != "list":  # a list is its pages: count each HTTP request once
            requests += n
    # per second of the window (by scheduled time), the single-object requests (no lists): where the stalls were
    single = [k for k in KINDS if k not in ("list", "list-page")]
    due = np.concatenate([report._arr(r["kinds"][k]["due"]) for r in results for k in r["kinds"] if k in single])
    lat_all = np.concatenate([report._arr(r["kinds"][k]["lat"]) for r in results for k in r["kinds"] if k in single])
    timeline = []
    for sec in range(int(math.ceil(mode.duration))):
        sel = lat_all[(due >= sec) & (due < sec + 1)]
        if sel.size:
            timeline.append([sec, int(sel.size), float(np.median(sel) * 1e3), float(sel.max() * 1e3)])
    all_lag = np.concatenate([report._arr(r["kinds"][k]["lag"]) for r in results for k in r["kinds"] if k != "list-page"])
    lag = report._pcts(all_lag)
    cpu["requests"] = requests
    cpu["generator_us_per_request"] = (g1 - g0) / requests * 1e6 if requests else None
    cpu["lag_p50_ms"], cpu["lag_p99_ms"], cpu["lag_max_ms"] = lag["p50_ms"], lag["p99_ms"], lag["max_ms"]
    errors: dict = {}
    for r in results:
        for kind, e in r["errors"].items():
            d = errors.setdefault(kind, {"count": 0, "by_status": {}, "samples": []})
            d["count"] += e["count"]
            for s, c in e["by_status"].items():
                d["by_status"][s] = d["by_status"].get(s, 0) + c
            d["samples"] = (d["samples"] + e["samples"])[:3]
    conflicts = Counter()
    for r in results:
        conflicts.update(r["conflicts"])
    delta = window["metrics"]
    storage = hist_rows(delta, "etcd_request_duration_seconds", ("group", "resource", "operation"), secs)
    apiserver = [r for r in hist_rows(delta, "apiserver_request_duration_seconds",
                                      ("verb", "group", "resource", "subresource", "scope"), secs) if r["resource"]]
    fsync = None
    if be.metrics_urls:
        fs = hist_rows(window["fsync"], FSYNC, (), secs)
        fsync = fs[0] if fs else {"count": 0}
        if fs:  # the highest bucket anything fell in: the slowest fsync was at most this
            b = window["fsync"][FSYNC][()]["buckets"]
            prev, worst = 0.0, None
            for le in sorted(b):
                if b[le] > prev:
                    worst = le
                prev = b[le]
            fsync["max_le_ms"] = None if worst is None else worst * 1e3
    cpu["fsync"] = fsync
    summary = "  ".join(f"{r['kind']} {report._f(r['p50_ms'])}/{report._f(r['p99_ms'])}" for r in rows)
    log(f"done: p50/p99 ms {summary}; {requests / mode.duration:.0f} req/s; CPU % of a core: backend "
        f"{cpu['backend_pct']:.0f}, kube-apiserver {cpu['apiserver_pct']:.0f}, generator {cpu['generator_pct']:.0f}, "
        f"other {cpu['other_pct']:.0f}; generator lag p99 {report._f(lag['p99_ms'])} ms"
        + (f"; ERRORS {sum(e['count'] for e in errors.values())}" if errors else ""))
    slow = sorted(timeline, key=lambda x: -x[2])[:3]
    if slow:
        log("slowest seconds of the window (s: requests, p50 ms, max ms): "
            + ", ".join(f"{t[0]}: {t[1]}, {t[2]:.0f}, {t[3]:.0f}" for t in slow))
    return {"rows": rows, "storage": storage, "apiserver": apiserver, "cpu": cpu, "errors": errors, "timeline": timeline,
            "conflicts": dict(conflicts), "_apiserver_log_offset": offset}


def generator_check(api, mode: Mode, pool: Pool, log) -> list[dict]:
    """What the generator itself sustains: GET /healthz (no storage, little work in kube-apiserver) at
    rising fixed rates, 3 s each, until the p50 passes 20 ms or fewer than 95 % are answered; achieved =
    answers completed in the window per second (a backlog from a stall can push it above the offered rate)."""
    out = []
    check = replace(mode, warmup=1.0, duration=3.0)
    for rate in GEN_CHECK_RATES:
        job = {"mode": asdict(check), "port": api.port, "token": api.token, "kinds": ["healthz"],
               "rates": {"healthz": rate}, "span": 4.0}
        box = {}

        def in_window(t0: float) -> None:
            time.sleep(max(0.0, t0 + 1.0 - now()))
            box["a"] = (_cpu(pool.pids), cpu_seconds(api.pid), busy_seconds(), now())
            time.sleep(max(0.0, t0 + 4.0 - now()))
            box["b"] = (_cpu(pool.pids), cpu_seconds(api.pid), busy_seconds(), now())

        results = pool.run(job, in_window)
        parts = [r["kinds"]["healthz"] for r in results if "healthz" in r["kinds"]]
        done = sum(p["done_in_window"] for p in parts)
        lat = np.concatenate([report._arr(p["lat"]) for p in parts])
        errs = sum(p["errors"] for p in parts)
        (g0, a0, m0, t0), (g1, a1, m1, t1) = box["a"], box["b"]
        row = {"offered_per_s": rate, "achieved_per_s": done / 3.0, "errors": errs, **report._pcts(lat),
               "generator_pct": (g1 - g0) / (t1 - t0) * 100, "apiserver_pct": (a1 - a0) / (t1 - t0) * 100,
               "generator_us_per_request": (g1 - g0) / done * 1e6 if done else None,
               "other_pct": max(0.0, ((m1 - m0) - (g1 - g0) - (a1 - a0)) / (t1 - t0) * 100)}
        out.append(row)
        log(f"generator check: GET /healthz offered {rate}/s -> {row['achieved_per_s']:.0f}/s, p99 "
            f"{report._f(row['p99_ms'])} ms, generator {row['generator_pct']:.0f} % / kube-apiserver "
            f"{row['apiserver_pct']:.0f} % of a core (other {row['other_pct']:.0f} %), "
            f"{report._f(row['generator_us_per_request'], '{:.0f}')} µs/request")
        if row["achieved_per_s"] < 0.95 * rate or (row["p50_ms"] or 0) > 20:
            break
    return out


# ------------------------------------------------------------------ logs


KLOG = re.compile(r"^([EW])\d{4} [\d:.]+\s+\d+ (\S+)\] (.*)$")


def scan_logs(api, be: Backend, offset: int) -> dict:
    """What went wrong per the logs: kube-apiserver's lines that mean the endpoint answered differently from
    etcd (whole log), its E/W lines from the load on, and the backend's warnings and errors."""
    from tests.kube_fixture import BAD_LOG_PATTERNS

    raw = api.log_path.read_bytes()
    text = raw.decode(errors="replace")
    bad = Counter(p for line in text.splitlines() for p in BAD_LOG_PATTERNS if p in line)
    ew = Counter()
    for line in raw[offset:].decode(errors="replace").splitlines():
        m = KLOG.match(line)
        if m:
            msg = re.sub(r"\b\d+(\.\d+)?(ms|s|µs)?\b", "N", m.group(3))[:300]
            ew[f"{m.group(1)} {m.group(2)} {msg}"] += 1
    backend_lines = Counter()
    for path in be.logs:
        try:
            lines = Path(path).read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            if line.startswith("{"):  # etcd: one JSON object per line
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("level") in ("warn", "error", "fatal", "panic"):
                    backend_lines[f"{Path(path).name}: {rec['level']} {rec.get('msg', '')}"[:200]] += 1
            elif re.search(r"level=(WARNING|ERROR|CRITICAL)", line):  # shardetcd
                msg = re.sub(r"^\S+ \S+ ", "", line)
                msg = re.sub(r"\d+(\.\d+)?", "N", msg)[:200]
                backend_lines[f"{Path(path).name}: {msg}"] += 1
    return {"apiserver_bad_patterns": dict(bad), "apiserver_errors_warnings_during_load": dict(ew.most_common(15)),
            "apiserver_errors_warnings_total": sum(ew.values()),
            "backend_warnings": dict(backend_lines.most_common(15)), "backend_warnings_total": sum(backend_lines.values())}


# ------------------------------------------------------------------ tables


def _ratio(a, b) -> str:
    return f"{a / b:.2f}" if a is not None and b else ""


def latency_table(results: list[dict]) -> str:
    """Per request kind: p50/p99 ms on each backend and the ratios to etcd."""
    servers = [r["server"] for r in results]
    by = {r["server"]: {row["kind"]: row for row in r["rows"]} for r in results}
    head = ["request", "offered /s"]
    for s in servers:
        head += [f"{SHORT[s]} p50", f"{SHORT[s]} p99"]
    for s in servers:
        if s != "etcd" and "etcd" in by:
            head += [f"{SHORT[s]}/etcd p50", f"{SHORT[s]}/etcd p99"]
    head += [f"errors ({' / '.join(SHORT[s] for s in servers)})"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for kind in KINDS:
        rows = {s: by[s].get(kind) for s in servers}
        if not any(rows.values()):
            continue
        first = next(r for r in rows.values() if r)
        off = first.get("offered_per_s")
        cells = [f"{kind}: {WHAT[kind]}", report._thr(off) if off is not None else "-"]
        for s in servers:
            r = rows[s]
            cells += [report._f(r and r["p50_ms"]), report._f(r and r["p99_ms"])]
        e = rows.get("etcd")
        for s in servers:
            if s != "etcd" and "etcd" in by:
                r = rows[s]
                cells += [_ratio(r and r["p50_ms"], e and e["p50_ms"]), _ratio(r and r["p99_ms"], e and e["p99_ms"])]
        cells.append(" / ".join(str(rows[s]["errors"]) if rows[s] else "-" for s in servers))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def detail_table(results: list[dict]) -> str:
    head = ["backend", "request", "n", "errors", "req/s", "p50 ms", "p99 ms", "max ms", "p50 / p99 ms from send",
            "lag p99 ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for res in results:
        for r in res["rows"]:
            lines.append("| " + " | ".join([res["server"], r["kind"] + (f" ({r['pages_per_list']} pages)" if r.get("pages_per_list") else ""),
                                            str(r["n"]), str(r["errors"]), report._thr(r["per_s"]),
                                            report._f(r["p50_ms"]), report._f(r["p99_ms"]), report._f(r["max_ms"]),
                                            f"{report._f(r['svc_p50_ms'])} / {report._f(r['svc_p99_ms'])}",
                                            report._f(r["lag_p99_ms"])]) + " |")
    return "\n".join(lines)


def _hist_table(results: list[dict], field_name: str, keyf, label: str, min_count: int) -> str:
    servers = [r["server"] for r in results]
    idx = {r["server"]: {keyf(x): x for x in r.get(field_name, [])} for r in results}
    keys = []
    for s in servers:
        for k, x in idx[s].items():
            if k not in keys and x["count"] >= min_count:
                keys.append(k)
    ref = "etcd" if "etcd" in idx else None
    keys.sort(key=lambda k: -(idx[ref].get(k, {}).get("count", 0) if ref else 0))
    head = [label]
    for s in servers:
        head += [f"{SHORT[s]} n", f"{SHORT[s]} mean ms", f"{SHORT[s]} ~p99 ms"]
    for s in servers:
        if s != "etcd" and ref:
            head += [f"{SHORT[s]}/etcd mean"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for k in keys:
        cells = [k]
        for s in servers:
            x = idx[s].get(k)
            cells += ([str(x["count"]), report._f(x["mean_ms"]), report._f(x["p99_ms"])] if x else ["0", "-", "-"])
        for s in servers:
            if s != "etcd" and ref:
                x, e = idx[s].get(k), idx[ref].get(k)
                cells.append(_ratio(x and x["mean_ms"], e and e["mean_ms"]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def storage_table(results: list[dict], min_count: int = 5) -> str:
    return _hist_table(results, "storage", lambda x: f"{x['resource']}{'.' + x['group'] if x['group'] else ''} {x['operation']}",
                       "resource operation", min_count)


def apiserver_table(results: list[dict], min_count: int = 5) -> str:
    return _hist_table(results, "apiserver",
                       lambda x: f"{x['verb']} {x['resource']}{'/' + x['subresource'] if x['subresource'] else ''}",
                       "verb resource", min_count)


def cpu_table(results: list[dict]) -> str:
    head = ["backend", "API req/s", "backend CPU %", "kube-apiserver CPU %", "generator CPU %", "other CPU %",
            "generator µs/req", "generator lag p50 / p99 ms", "backend fsyncs: n, mean ms, slowest ≤ ms",
            "kube-apiserver log: E/W lines in the run", "backend log: warnings"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in results:
        c, lg = r["cpu"], r.get("logs", {})
        lines.append("| " + " | ".join([r["server"], report._thr(c["requests"] / r["duration_s"]), f"{c['backend_pct']:.0f}",
                                        f"{c['apiserver_pct']:.0f}", f"{c['generator_pct']:.0f}", f"{c['other_pct']:.0f}",
                                        report._f(c["generator_us_per_request"], "{:.0f}"),
                                        f"{report._f(c['lag_p50_ms'])} / {report._f(c['lag_p99_ms'])}",
                                        _fsync_cell(c.get("fsync")),
                                        str(lg.get("apiserver_errors_warnings_total", "-")),
                                        str(lg.get("backend_warnings_total", "-"))]) + " |")
    return "\n".join(lines)


def _fsync_cell(f: dict | None) -> str:
    if not f:
        return "- (no metrics URL)"
    if not f.get("count"):
        return "0"
    return f"{f['count']:,}, {f['mean_ms']:.2f}, {report._f(f.get('max_le_ms'), '{:g}')}"


def generator_table(rows: list[dict]) -> str:
    head = ["GET /healthz offered /s", "achieved /s", "p50 ms", "p99 ms", "generator CPU % (of a core)",
            "kube-apiserver CPU %", "other CPU %", "generator µs/req"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        lines.append("| " + " | ".join([str(r["offered_per_s"]), f"{r['achieved_per_s']:.0f}", report._f(r["p50_ms"]),
                                        report._f(r["p99_ms"]), f"{r['generator_pct']:.0f}", f"{r['apiserver_pct']:.0f}",
                                        report._f(r.get("other_pct"), "{:.0f}"),
                                        report._f(r["generator_us_per_request"], "{:.0f}")]) + " |")
    return "\n".join(lines)


def summary(results: list[dict]) -> str:
    """The bench README's kube tables: API latency per request kind, then the storage-side time of the
    writes and reads the load makes (kube-apiserver's etcd_request_duration_seconds)."""
    mine = [dict(r, storage=[x for x in r["storage"] if x["resource"] in ("pods", "leases", "events")]) for r in results]
    return latency_table(results) + "\n\nStorage side (kube-apiserver's etcd_request_duration_seconds, ms):\n\n" + storage_table(mine)


def markdown(meta: dict, results: list[dict]) -> str:
    mode = meta["mode"]
    offered = ", ".join(f"{k} {report._thr(v)}/s" for k, v in meta["offered_per_s"].items())
    lines = [f"# `python -m bench.kube{'' if mode == 'full' else ' --' + mode}` ({meta['timestamp']})", "",
             f"Machine: {machine.one_line(meta['machine'])}.", "",
             f"kube-apiserver {meta['kube_apiserver']}; " + "; ".join(f"**{r['server']}**: {r['describe']} ({r['version']})"
                                                                      for r in results) + ".", "",
             f"Load (open loop, fixed rates, {meta['workers']} generator processes × {meta['threads']} keep-alive HTTPS "
             f"connections): {meta['nodes']} nodes renewing their Lease every {meta['heartbeat_s']:g} s, {offered}; "
             f"{meta['keep_pods']} pods patched in turn, ~{meta['pods_listed']} pods listed (limit {meta['list_limit']}). "
             f"{meta['warmup_s']:g} s warm-up + {meta['duration_s']:g} s measured per backend.", "",
             NOTE + " The rest of the machine (other sessions) used, in each backend's measured window: "
             + ", ".join(f"{r['server']} {r['cpu']['other_pct']:.0f} %" for r in results) + " of one core.", "",
             "## API request latency (client side, ms, from the scheduled send time)", "",
             latency_table(results), "",
             "## Storage-side time: kube-apiserver's etcd_request_duration_seconds over the measured window", "",
             "*mean* is exact (sum/count); *~p99* is interpolated inside the histogram's buckets (0.005, 0.025, 0.05, "
             "0.1, 0.2, 0.4 s, ...), so below 5 ms it only says \"under 5 ms\". Includes kube-apiserver's own "
             "background storage calls in the window. Rows with at least 5 calls.", "",
             storage_table(results), "",
             "## kube-apiserver's own view: apiserver_request_duration_seconds over the window", "",
             apiserver_table(results), "",
             "## CPU and the generator", "",
             "Percent of one core over the measured window; *other* is the rest of the machine (other sessions, "
             "kernel work not charged to these processes). Generator lag = send time - scheduled time.", "",
             cpu_table(results), ""]
    gen = next((r["generator_check"] for r in results if r.get("generator_check")), None)
    if gen:
        lines += ["Generator check (before the first backend's load, against the same kube-apiserver; /healthz "
                  "touches no storage):", "", generator_table(gen), ""]
    lines += ["## Every row", "", detail_table(results), ""]
    notes = []
    for r in results:
        lg = r.get("logs", {})
        if lg.get("apiserver_bad_patterns"):
            notes.append(f"- {r['server']}: kube-apiserver log: " + "; ".join(f"`{k}` ×{v}" for k, v in lg["apiserver_bad_patterns"].items()))
        for k, v in list(lg.get("backend_warnings", {}).items())[:5]:
            notes.append(f"- {r['server']}: backend log ×{v}: `{k}`")
        for k, v in list(lg.get("apiserver_errors_warnings_during_load", {}).items())[:5]:
            notes.append(f"- {r['server']}: kube-apiserver log ×{v}: `{k}`")
        if r.get("errors"):
            for kind, e in r["errors"].items():
                notes.append(f"- {r['server']}: {e['count']} failed {kind} requests, by status {e['by_status']}: {e['samples'][:1]}")
        if r.get("conflicts"):
            notes.append(f"- {r['server']}: conflicts retried: {r['conflicts']}")
        if r.get("attempts_other_cpu_pct"):
            notes.append(f"- {r['server']}: run {len(r['attempts_other_cpu_pct'])} times because other CPU exceeded "
                         f"--max-other; other CPU per attempt: " + ", ".join(f"{x:.0f} %" for x in r["attempts_other_cpu_pct"])
                         + "; the attempt with the least is reported")
        if r["cpu"].get("other_processes"):
            notes.append(f"- {r['server']}: other CPU {r['cpu']['other_pct']:.0f} % in the window; most of it: " + "; ".join(
                f"{o['cpu_pct']:.0f} % `{o['cmd'][:70]}`" for o in r["cpu"]["other_processes"][:3]))
        pages = next((x["n"] for x in r["rows"] if x["kind"] == "list-page"), 0)
        lists = next((x["n"] for x in r["rows"] if x["kind"] == "list"), 0)
        st = sum(x["count"] for x in r.get("storage", []) if x["resource"] == "pods" and x["operation"].startswith("list"))
        notes.append(f"- {r['server']}: {lists} LISTs of pods, {pages} pages; storage-side pods list calls in the "
                     f"window: {st}")
        deletes = next((x["n"] for x in r["rows"] if x["kind"] == "pod-delete"), 0)
        st_del = sum(x["count"] for x in r.get("storage", []) if x["resource"] == "pods" and x["operation"] == "delete")
        if deletes:
            notes.append(f"- {r['server']}: {st_del} storage-side pods delete calls for {deletes} DELETE requests "
                         f"({st_del / deletes:.2f} each). The watch cache hands the delete Txn its copy of the pod; "
                         f"when that copy does not yet have the update the DELETE itself made just before "
                         f"(deletionTimestamp), the mod-revision compare fails and the Txn is sent again: more "
                         f"calls per DELETE = the update came back through the watch later")
        if len(r.get("keys", {})) > 1:
            notes.append(f"- {r['server']}: keys per endpoint after the run: " + "; ".join(
                f"{url}: " + ", ".join(f"{k} {v}" for k, v in c.items() if v) for url, c in r["keys"].items()))
    if any(r["server"] == "etcd" for r in results):
        notes.insert(0, f"- {PROGRESS_NOTE}")
    lines += ["## Notes and logs", "", *(notes or ["- nothing to report"]), "",
              f"Reproduce: `python -m bench.kube{'' if mode == 'full' else ' --' + mode}` from the repository root "
              f"(took {meta['elapsed_s']:.0f} s).", ""]
    return "\n".join(lines)


# ------------------------------------------------------------------ main


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.kube", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="100 nodes (Lease every 1 s), 30 s measured per backend (≈ 4 min)")
    ap.add_argument("--tiny", action="store_true", help="smoke run: etcd and shardetcd, 20 nodes, 4 s measured; "
                                                        "its figures mean nothing")
    ap.add_argument("--servers", default=None, help=f"comma-separated, of {','.join(SERVER_ORDER)} "
                                                    "(default: all; --tiny: etcd,shardetcd)")
    ap.add_argument("--duration", type=float, default=None, help="measured seconds per backend")
    ap.add_argument("--rate-scale", type=float, default=1.0, help="multiply every offered rate (heartbeats: the node count)")
    ap.add_argument("--generator-check", choices=("auto", "yes", "no"), default="auto",
                    help="measure what the generator sustains (GET /healthz at rising rates) before the first "
                         "backend's load (auto: quick and full)")
    runargs.add_quiet(ap, QUIET_WAIT_S, before="each backend")
    ap.add_argument("--max-other", type=float, default=50.0,
                    help="run a backend again (fresh backend and kube-apiserver) when the rest of the machine used more "
                         "than this percent of a core during its window (default 50)")
    ap.add_argument("--retries", type=int, default=None, help="how many times at most (default 0 tiny, 2 quick and full); "
                                                             "the attempt with the least other CPU is reported")
    runargs.add_out(ap)
    return ap.parse_args(argv)


def mode_of(args) -> Mode:
    base = MODES[runargs.mode_of(args)]
    m = base
    if args.duration:
        m = replace(m, duration=args.duration)
    if args.rate_scale != 1.0:
        m = replace(m, nodes=max(1, round(m.nodes * args.rate_scale)),
                    rates={k: v * args.rate_scale for k, v in m.rates.items()})
    return m


def publishable(args, servers: list[str]) -> bool:
    """Only a complete, default quick run replaces the result kept in the repository."""
    return (args.quick and not args.tiny and args.duration is None and args.rate_scale == 1.0
            and servers == list(SERVER_ORDER) and args.generator_check != "no" and args.out.resolve() == RESULTS.resolve())


def kube_version() -> str:
    from tests.kube_fixture import kube_apiserver_binary

    out = subprocess.run([str(kube_apiserver_binary()), "--version"], capture_output=True, text=True).stdout.strip()
    return out.split()[-1] if out else "?"


def main(argv=None) -> int:
    args = parse_args(argv)
    mode = mode_of(args)
    servers = [s for s in (args.servers or ",".join(mode.servers)).split(",") if s]
    bad = [s for s in servers if s not in SERVER_ORDER]
    if bad:
        raise SystemExit(f"unknown server(s) {bad}; known: {list(SERVER_ORDER)}")
    servers = [s for s in SERVER_ORDER if s in servers]
    gen_check = args.generator_check == "yes" or (args.generator_check == "auto" and not args.tiny)
    quiet_wait = runargs.quiet_wait_s(args, mode.name, QUIET_WAIT_S)
    retries = args.retries if args.retries is not None else (0 if args.tiny else 2)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    tmp = Path(tempfile.mkdtemp(prefix="shardetcd-bench-kube-"))
    t_begin = now()

    log = runargs.progress(t_begin)

    offered = {k: mode.rate(k) for k in KINDS if k != "list-page"}
    print(f"bench.kube: {mode.name} mode, backends {','.join(servers)}; offered "
          + ", ".join(f"{k} {report._thr(v)}/s" for k, v in offered.items())
          + f"; {mode.warmup:g} s warm-up + {mode.duration:g} s measured each; {os.cpu_count()} cores shared by the "
          f"generator, kube-apiserver and the backend; data under {tmp}", flush=True)
    meta = {"timestamp": stamp, "mode": mode.name, "cores": os.cpu_count(), "python": platform.python_version(),
            "kube_apiserver": kube_version(), "note": NOTE, "workers": mode.workers, "threads": mode.threads,
            "nodes": mode.nodes, "heartbeat_s": mode.heartbeat_s, "keep_pods": mode.keep_pods,
            "pods_listed": mode.keep_pods + mode.doomed_pods, "list_limit": mode.list_limit,
            "warmup_s": mode.warmup, "duration_s": mode.duration, "offered_per_s": offered,
            "rate_scale": args.rate_scale, "machine": machine.describe(tmp)}
    log(f"machine: {machine.one_line(meta['machine'])}; kube-apiserver {meta['kube_apiserver']}")
    pool = Pool(mode.workers)
    results: list[dict] = []
    try:
        for i, name in enumerate(servers):
            attempts = []
            for attempt in range(1 + retries):
                res = run_backend(name, tmp / f"{name}-{attempt}", mode, pool, log, gen_check and i == 0 and attempt == 0,
                                  quiet_wait, args.quiet_below)
                res["duration_s"] = mode.duration
                attempts.append(res)
                other = res["cpu"]["other_pct"]
                if other <= args.max_other:
                    break
                log(f"{name}: the rest of the machine used {other:.0f} % of a core in the window (> --max-other "
                    f"{args.max_other:.0f})" + ("; running this backend again" if attempt < retries else "; keeping "
                                                "the attempt with the least other CPU"))
            best = min(attempts, key=lambda r: r["cpu"]["other_pct"])
            if len(attempts) > 1:
                best["attempts_other_cpu_pct"] = [r["cpu"]["other_pct"] for r in attempts]
                if not best.get("generator_check"):
                    best["generator_check"] = next((r["generator_check"] for r in attempts if r.get("generator_check")), None)
            results.append(best)
    finally:
        pool.close()
        shutil.rmtree(tmp, ignore_errors=True)
    meta["elapsed_s"] = now() - t_begin
    other = [r["cpu"]["other_pct"] for r in results]
    meta["other_cpu_pct_median"] = statistics.median(other) if other else 0.0
    meta["other_cpu_pct_max"] = max(other) if other else 0.0
    md = markdown(meta, results)
    lat = latency_table(results)
    print()
    print(lat)
    print()
    print(storage_table(results))
    print()
    print(cpu_table(results))
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"kube-{stamp}"
    report.write_json(stem.with_suffix(".json"), {"meta": meta, "results": results, "latency_md": lat,
                                                  "storage_md": storage_table(results)})
    stem.with_suffix(".md").write_text(md)
    print(f"\nresults: {stem.with_suffix('.json')}, {stem.with_suffix('.md')}  ({meta['elapsed_s']:.0f} s)")
    if publishable(args, servers):
        for ext in (".json", ".md"):
            shutil.copyfile(stem.with_suffix(ext), args.out / (LATEST + ext))
        print(f"kept as the latest quick kube run (tracked in git): {args.out / LATEST}.{{json,md}}")
    return 0


if __name__ == "__main__":
    runargs.run(main)
