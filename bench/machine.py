"""What the figures were measured on: CPU, memory, the disk under the data dir.

Recorded in every result file, so that a table copied out of context still
says it came from, e.g., 2 shared cores and a virtio disk.
"""
from __future__ import annotations

import os
import platform
import time
from pathlib import Path


def _first(path: str, prefix: str) -> str | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(prefix):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _mount_of(path: Path) -> tuple[str, str, str]:
    """(device, mount point, filesystem type) of the mount holding `path`."""
    path = path.resolve()
    best = ("?", "/", "?")
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return best
    for line in lines:
        dev, mnt, fstype = line.split()[:3]
        if (path == Path(mnt) or Path(mnt) in path.parents) and len(mnt) >= len(best[1]):
            best = (dev, mnt, fstype)
    return best


def _rotational(dev: str) -> bool | None:
    name = Path(dev).name
    for cand in (name, name.rstrip("0123456789"), name.split("p")[0] if name.startswith("nvme") else name):
        p = Path("/sys/block") / cand / "queue" / "rotational"
        if p.exists():
            return p.read_text().strip() == "1"
    return None


def fdatasync_ms(data_dir: Path, n: int = 200) -> dict:
    """p50/p99 of fdatasync after a 256-byte append in `data_dir`: the floor under a durable write."""
    path = data_dir / ".fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    lat = []
    try:
        for _ in range(n):
            os.write(fd, b"\0" * 256)
            t = time.perf_counter()
            os.fdatasync(fd)
            lat.append((time.perf_counter() - t) * 1e3)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    lat.sort()
    return {"p50": round(lat[n // 2], 3), "p99": round(lat[int(n * 0.99) - 1], 3)}


def describe(data_dir: Path) -> dict:
    mem_kb = _first("/proc/meminfo", "MemTotal")
    dev, mnt, fstype = _mount_of(data_dir)
    st = os.statvfs(data_dir)
    shm = os.statvfs("/dev/shm") if os.path.isdir("/dev/shm") else None
    return {
        "cores": os.cpu_count(),
        "cpu_model": _first("/proc/cpuinfo", "model name") or platform.processor() or "?",
        "memory_gib": round(int(mem_kb.split()[0]) / 2**20, 1) if mem_kb else None,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "disk": {"device": dev, "mount": mnt, "fstype": fstype, "rotational": _rotational(dev),
                 "size_gib": round(st.f_blocks * st.f_frsize / 2**30, 1), "fdatasync_ms": fdatasync_ms(data_dir)},
        "dev_shm_gib": round(shm.f_blocks * shm.f_frsize / 2**30, 1) if shm else None,
    }


def one_line(m: dict) -> str:
    d = m["disk"]
    kind = {True: "rotational", False: "non-rotational", None: "unknown type"}[d["rotational"]]
    fs = d["fdatasync_ms"]
    return (f"{m['cores']} cores ({m['cpu_model']}), {m['memory_gib']} GiB RAM, data dir on {d['fstype']} "
            f"{d['device']} ({kind} as the kernel reports it, {d['size_gib']} GiB; fdatasync p50 {fs['p50']} ms, "
            f"p99 {fs['p99']} ms), /dev/shm {m['dev_shm_gib']} GiB, "
            f"Linux {m['kernel']}, Python {m['python']}")
