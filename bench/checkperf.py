"""etcd's own checks against one server (full mode or --check-perf yes):
`etcdctl check perf --load=s` (~60 s) and `etcdctl check datascale --load=s`
(10,000 1 KiB puts from 50 clients, memory from the server's /metrics).

datascale reads /metrics over HTTP from the first endpoint. etcd serves it on
its client URL; shardetcd on --listen-metrics-urls, so that URL is listed
first and etcdctl's gRPC balancer sends the puts to the client URL."""
from __future__ import annotations

import os
import re
import subprocess

ETCDCTL = "/usr/bin/etcdctl"


def check_perf(endpoint: str, load: str = "s", timeout: float = 180) -> dict:
    return _run([f"--endpoints=http://{endpoint}", "check", "perf", f"--load={load}"], timeout)


def check_datascale(endpoint: str, metrics_url: str, load: str = "s", timeout: float = 300) -> dict:
    endpoints = [f"http://{endpoint}"]
    if metrics_url != endpoints[0]:
        endpoints.insert(0, metrics_url)
    return _run([f"--endpoints={','.join(endpoints)}", "check", "datascale", f"--load={load}", "--auto-compact"],
                timeout)


def _run(args: list[str], timeout: float) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
    env["ETCDCTL_API"] = "3"
    cmd = [ETCDCTL, *args]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        return {"cmd": " ".join(cmd), "rc": None, "summary": [f"timed out after {timeout:.0f}s"],
                "output": (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")}
    text = p.stdout + p.stderr
    # the progress bar redraws with \r; keep the verdict lines
    lines = [ln.strip() for ln in re.split(r"[\r\n]+", text) if ln.strip()]
    summary = [ln for ln in lines if ln.startswith(("PASS", "FAIL", "Error", "{")) or "error" in ln.lower()]
    return {"cmd": " ".join(cmd), "rc": p.returncode, "summary": summary, "output": "\n".join(lines[-30:])}
