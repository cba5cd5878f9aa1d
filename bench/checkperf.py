"""`etcdctl check perf --load=s` against one server (full mode only: ~60 s each)."""
from __future__ import annotations

import os
import re
import subprocess

ETCDCTL = "/usr/bin/etcdctl"


def check_perf(endpoint: str, load: str = "s", timeout: float = 180) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
    env["ETCDCTL_API"] = "3"
    cmd = [ETCDCTL, f"--endpoints=http://{endpoint}", "check", "perf", f"--load={load}"]
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
