"""Turn worker results into rows; print the table; write JSON and plots."""
from __future__ import annotations

import json
from array import array
from pathlib import Path

import numpy as np

SERVER_ORDER = ("etcd", "shardetcd", "floor", "ceiling")
NOTE = ("Client (load generator) and server share the same 2 cores: every number here is "
        "for both together, loopback only (127.0.0.1).")
GENERATOR = {"tool": "etcd tool", "python": "Python"}


def _arr(b: bytes, code: str = "d") -> np.ndarray:
    a = array(code)
    a.frombytes(b)
    return np.asarray(a)


def _pcts(lat: np.ndarray) -> dict:
    if lat.size == 0:
        return {"p50_ms": None, "p99_ms": None, "p999_ms": None, "max_ms": None}
    p50, p99, p999 = np.percentile(lat, [50, 99, 99.9]) * 1e3
    return {"p50_ms": float(p50), "p99_ms": float(p99), "p999_ms": float(p999), "max_ms": float(lat.max() * 1e3)}


def _cpu(results: list[dict], duration: float, n: int) -> dict:
    out = {}
    total = sum(r["total"] for r in results)
    if total:
        out["cli_cpu_us"] = sum(r["cpu"] for r in results) / total * 1e6
    sample = results[0].get("_window_sample")
    if sample and n:
        (s0, c0, b0), (s1, c1, b1) = sample
        srv, cli, busy = s1 - s0, c1 - c0, b1 - b0
        out["srv_cpu_us"] = srv / n * 1e6
        out["srv_cpu_pct"] = srv / duration * 100  # percent of one core
        out["cli_cpu_pct"] = cli / duration * 100
        out["cli_cpu_us"] = cli / n * 1e6
        # CPU used on the machine by anything else (other processes, kernel work not
        # charged to server or generator) during the window, percent of one core
        out["other_cpu_pct"] = max(0.0, (busy - srv - cli) / duration * 100)
    return out


def _errors(results: list[dict]) -> dict:
    errs: dict = {}
    for r in results:
        for k, v in r["errors"].items():
            errs[k] = errs.get(k, 0) + v
    return errs


def summarize(kind: str, results: list[dict], duration: float) -> list[dict]:
    """Rows (without scenario/server labels) for one run of the Python generator."""
    if kind == "keepalive-pipelined":
        lat = np.concatenate([_arr(r["lat"]) for r in results])
        return [{"req_s": lat.size / duration, "n": int(lat.size), **_pcts(lat), **_cpu(results, duration, lat.size),
                 "errors": _errors(results)}]
    if kind == "k8s":
        ops: dict[str, list] = {}
        wev: dict[str, int] = {}
        for r in results:
            for k, v in r["ops"].items():
                ops.setdefault(k, []).append(_arr(v))
            for k, v in r["watch_events"].items():
                wev[k] = wev.get(k, 0) + v
        conflicts: dict = {}
        for r in results:
            for k, v in r["conflicts"].items():
                conflicts[k] = conflicts.get(k, 0) + v
        pages = [p for r in results for p in r["pages"]]
        rows = []
        # watch deliveries and progress answers are not requests of their own
        counted = [k for k in ops if not k.startswith("watch") and k != "progress"]
        total_n = sum(a.size for k in counted for a in ops[k])
        cpu = _cpu(results, duration, total_n)
        rows.append({"op": "all writes+reads", "req_s": total_n / duration, "n": total_n,
                     **_pcts(np.concatenate([a for k in counted for a in ops[k]])),
                     **cpu, "errors": _errors(results), "conflicts": conflicts})
        order = ["heartbeat", "pod-create", "pod-update", "pod-delete", "event", "list", "count", "compact", "progress"]
        for k in order + sorted(k for k in ops if k not in order):
            if k not in ops and not k.startswith("watch"):
                continue
            lat = np.concatenate(ops[k]) if k in ops else np.array([])
            row = {"op": k, "req_s": lat.size / duration, "n": int(lat.size), **_pcts(lat)}
            if k.startswith("watch"):
                row["req_s"] = wev.get(k, 0) / duration  # events received/s; latency = write sent -> event
            if k == "list" and pages:
                row["pages_per_list"] = max(pages)
            rows.append(row)
        return rows
    raise ValueError(kind)


# ------------------------------------------------------------------ table


def _f(v, fmt="{:.2f}"):
    return "-" if v is None else fmt.format(v)


def _thr(v):
    return "-" if v is None else (f"{v:,.0f}" if v >= 100 else f"{v:.1f}")


def _points(rows: list[dict]) -> tuple[dict, list[tuple]]:
    """(row by (scenario, point, op, server), the (scenario, point, op) keys in first-seen order)."""
    index = {(r["scenario"], r["point"], r.get("op"), r["server"]): r for r in rows}
    return index, list(dict.fromkeys(k[:3] for k in index))


def _ratio(a: dict | None, b: dict | None, key: str, suffix: str = "") -> str:
    return f"{a[key] / b[key]:.2f}{suffix}" if a and b and a.get(key) is not None and b.get(key) else ""


def table(rows: list[dict]) -> str:
    """Markdown table, every row; a shardetcd row carries its ratios to etcd, the floor and the
    ceiling, a floor row its ratio to the ceiling."""
    index, points = _points(rows)
    head = ["scenario", "clients/conns", "generator", "server", "req/s", "p50 ms", "p99 ms", "srv CPU µs/req",
            "cli CPU µs/req", "other CPU %", "writes/fsync", "shardetcd/etcd req/s", "shardetcd/etcd p99",
            "shardetcd/ceiling req/s", "shardetcd/floor req/s", "floor/ceiling req/s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for k in points:
        for srv in SERVER_ORDER:
            r = index.get((*k, srv))
            if not r:
                continue
            ratios = ["", "", "", "", ""]
            e, f, c = (index.get((*k, other)) for other in ("etcd", "floor", "ceiling"))
            if srv == "shardetcd":
                ratios = [_ratio(r, e, "req_s"), _ratio(r, e, "p99_ms"), _ratio(r, c, "req_s"), _ratio(r, f, "req_s"), ""]
            elif srv == "floor":
                ratios[4] = _ratio(r, c, "req_s")
            name = r["scenario"] + (f" {r['op']}" if r.get("op") else "")
            cells = [name, r["point"], GENERATOR.get(r.get("generator"), "?"), srv, _thr(r["req_s"]),
                     _f(r.get("p50_ms")), _f(r.get("p99_ms")), _f(r.get("srv_cpu_us"), "{:.0f}"),
                     _f(r.get("cli_cpu_us"), "{:.0f}"), _f(r.get("other_cpu_pct"), "{:.0f}"),
                     _f(r.get("writes_per_fsync"), "{:.1f}"), *ratios]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(rows: list[dict]) -> str:
    """One line per scenario point (k8s-mix: its total only): req/s of each server, the ratios,
    p50 and p99 of etcd and shardetcd, server CPU per request of every server. The README's
    Performance table is this table. The floor runs the durable writes only."""
    index, points = _points(rows)
    head = ["scenario", "clients/conns", "generator", "etcd req/s", "shardetcd req/s", "ceiling req/s",
            "shardetcd/etcd", "shardetcd/ceiling", "floor req/s", "shardetcd/floor", "floor/ceiling",
            "p50 ms etcd / shardetcd", "p99 ms etcd / shardetcd", "srv CPU µs/req etcd / shardetcd / ceiling / floor"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for k in (k for k in points if k[2] in (None, "all writes+reads")):
        e, s, f, c = (index.get((*k, srv)) for srv in SERVER_ORDER)
        gen = GENERATOR.get(next(x for x in (e, s, c, f) if x).get("generator"), "?")

        def pair(key: str, fmt: str, of=(e, s)) -> str:
            return " / ".join(_f(x.get(key), fmt) if x else "-" for x in of)

        cpu = pair("srv_cpu_us", "{:.0f}", (e, s, c, f) if f else (e, s, c))
        lines.append("| " + " | ".join([k[0], k[1], gen, *(_thr(x["req_s"]) if x else "" for x in (e, s, c)),
                                         _ratio(s, e, "req_s", "×"), _ratio(s, c, "req_s", "×"),
                                         _thr(f["req_s"]) if f else "", _ratio(s, f, "req_s", "×"),
                                         _ratio(f, c, "req_s", "×"),
                                         pair("p50_ms", "{:.1f}"), pair("p99_ms", "{:.1f}"), cpu]) + " |")
    return "\n".join(lines)


def write_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=str))


def plots(rows: list[dict], stem: Path) -> list[Path]:
    """throughput and p99 vs clients, for put-seq and range-l, one PNG each."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    out = []
    for scen in ("put-seq", "range-l"):
        data = [r for r in rows if r["scenario"] == scen]
        if not data:
            continue
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
        for srv in SERVER_ORDER:
            pts = sorted((r["clients"], r["req_s"], r["p99_ms"]) for r in data if r["server"] == srv)
            labels = {r["clients"]: r["point"] for r in data}
            if not pts:
                continue
            xs = [p[0] for p in pts]
            a1.plot(xs, [p[1] for p in pts], marker="o", label=srv)
            a2.plot(xs, [p[2] for p in pts], marker="o", label=srv)
        for ax, yl in ((a1, "requests/s"), (a2, "p99 latency (ms)")):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(labels), [labels[c] for c in sorted(labels)])
            ax.set_xlabel("clients/connections (etcd's benchmark tool)")
            ax.set_ylabel(yl)
            ax.grid(True, alpha=0.3)
            ax.legend()
        a2.set_yscale("log")
        fig.suptitle(f"{scen}: throughput and p99 vs concurrency (client and server share 2 cores)")
        fig.tight_layout()
        path = stem.with_name(f"{stem.name}-{scen}.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        out.append(path)
    return out


def publish(stem: Path, pngs: list[Path], latest: Path, meta: dict, md: str, perf: dict,
            doc_rows: list[dict]) -> list[Path]:
    """Copy one run's JSON and plots to `<latest>.json` / `<latest>-<scenario>.png` and write
    `<latest>.md`: the machine, the table and how to reproduce it. These files are the ones
    kept in git; the timestamped files stay local."""
    import shutil

    from .machine import one_line

    kept = [latest.with_name(latest.name + ".json")]
    shutil.copyfile(stem.with_suffix(".json"), kept[0])
    for png in pngs:
        dst = latest.with_name(latest.name + png.name[len(stem.name):])
        shutil.copyfile(png, dst)
        kept.append(dst)
    lines = [f"# Latest `python -m bench --quick` ({meta['timestamp']})", "",
             f"Machine: {one_line(meta['machine'])}; grpcio {meta['grpcio']}.", "",
             f"Load: {meta.get('tool', {}).get('describe', 'etcd benchmark tool')} for etcd's shapes; the Python "
             "generator (bench/loadgen.py, bench/k8s.py) for lease-keepalive-many and k8s-mix.", "",
             "Other CPU while measuring (the rest of the machine, % of one core): "
             f"median {meta.get('other_cpu_pct_median', 0):.0f} %, max {meta.get('other_cpu_pct_max', 0):.0f} %.", "",
             "Servers: " + "; ".join(f"{k}: {v['version']}" for k, v in meta["servers"].items()) + ".", "",
             NOTE, "", "## Summary", "", summary(doc_rows), "", "## Every row", "", md, ""]
    for srv, p in perf.items():
        lines.append(f"- etcdctl check {'datascale' if srv.endswith('datascale') else 'perf'} --load=s, "
                     f"{srv.split()[0]}: " + " | ".join(p["summary"]))
    lines += ["", "Reproduce: `pip install -e '.[bench]' && python -m bench --quick` from the repository root "
              f"(took {meta['elapsed_s']:.0f} s). Plots: " + ", ".join(f"`{p.name}`" for p in kept[1:]) + ".", ""]
    md_path = latest.with_name(latest.name + ".md")
    md_path.write_text("\n".join(lines))
    kept.append(md_path)
    return kept
