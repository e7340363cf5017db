"""Summary of `sweep` records for measurements.json, and experiments/<v>/sweep-<key>.png.

The newest sweep of each key is the result. The plot (output tok/s and TPOT p50 against the value,
one line per concurrency) depends only on the summary, so `make report` redraws it byte for byte.

    from scripts.kit.summaries import sweep
    sweep.summarize(variant, [(relpath, record), ...]) -> dict
    sweep.artifacts({name: measurements}) -> {Path: png bytes}
"""
from __future__ import annotations

from scripts.kit.paths import EXPERIMENTS
from scripts.kit.summaries import png_bytes


K_SWEEP_FILE = "mtp_k_sweep.json"  # under results/: derived by make report, not a run record


def plot_path(variant: str, key: str):
    return EXPERIMENTS / variant / f"sweep-{key.lower()}.png"


def _gpu_processes(pt: dict):
    """Sweep records before 2026-11-23 15:00 do not copy it: read it from the point's own record."""
    if "gpu_processes" in pt or not pt.get("record"):
        return pt.get("gpu_processes")
    from scripts.kit.paths import ROOT
    from scripts.kit.record import load_record
    path = ROOT / pt["record"]
    return load_record(path)["payload"]["server"].get("gpu_processes") if path.is_file() else None


def _machine(pt: dict):
    """Which machine a point was timed on: its record's host id; records from before host ids name the
    tree the session sent (.ci/gpu-session.sh sends one commit per machine), with the GPU name."""
    from scripts.kit.paths import ROOT
    from scripts.kit.record import load_record
    path = ROOT / pt["record"] if pt.get("record") else None
    if path is None or not path.is_file():
        return None
    prov = load_record(path)["provenance"]
    return (prov.get("host") or {}).get("id") or f"{prov['device']['name']} @ {prov['git_commit'][:7]}"


def summarize(variant, records: list) -> dict:
    """Newest sweep per key. A sweep whose points ran on more than one machine is that many sweeps:
    each point carries its `session` (1, 2, ... in the order they first appear), and the plot and
    table never join points of different sessions (issue 18: levels move between machines)."""
    latest = {}
    for path, rec in records:  # oldest first: the last one of a key wins
        latest[rec["payload"]["key"]] = (path, rec)
    out = {}
    for key, (path, rec) in sorted(latest.items()):
        pts, seen = [], []
        for pt in rec["payload"]["points"]:
            m = _machine(pt)
            if m not in seen:
                seen.append(m)
            pts.append({**{k: pt.get(k) for k in ("value", "status", "reason", "levels", "record", "reused")},
                        "gpu_processes": _gpu_processes(pt), "session": seen.index(m) + 1})
        out[key] = {"latest": path, "sessions": len(seen), "points": pts}
    return {"by_key": out}


def plot_png(variant: str, key: str, points: list) -> bytes | None:
    ok = [p for p in points if p["status"] == "ok"]
    if not ok:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    sessions = sorted({p.get("session", 1) for p in ok})
    styles = ("-", "--", ":", "-.")
    for c in sorted({c for p in ok for c in p["levels"]}, key=int):
        for si, sess in enumerate(sessions):  # one line per session: points of two machines are not one curve
            have = [p for p in ok if c in p["levels"] and p.get("session", 1) == sess]
            label = f"c={c}" + (f", session {sess}" if len(sessions) > 1 else "")
            for ax, metric in zip(axes, ("output_tok_per_s", "tpot_p50_ms")):
                ax.plot([p["value"] for p in have], [p["levels"][c][metric] for p in have], marker="o",
                        linestyle=styles[si % len(styles)], label=label, color=f"C{int(c).bit_length() % 10}")
    for ax, title in zip(axes, ("output tok/s (median of repeats)", "TPOT p50 (ms)")):
        ax.set(xlabel=key, title=title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{variant}: sweep of {key}" + (f" ({len(sessions)} sessions: compare within one only)"
                                                  if len(sessions) > 1 else ""), fontsize=9)
    return png_bytes(fig)


def artifacts(docs: dict) -> dict:
    """Plots, and results/mtp_k_sweep.json: every variant's newest SPEC_K sweep in one file (the
    name the catalog issue asked for), derived like the plots, so `make report --check` keeps it true."""
    import json
    from scripts.kit.paths import RESULTS
    out, k_sweeps = {}, {}
    for name, doc in docs.items():
        for key, s in ((doc["results"].get("sweep") or {}).get("by_key") or {}).items():
            png = plot_png(name, key, s["points"])
            if png is not None:
                out[plot_path(name, key)] = png
            if key == "SPEC_K":
                k_sweeps[name] = {"sweep_record": s["latest"], "plot": str(plot_path(name, key).relative_to(
                    EXPERIMENTS.parent)), "points": s["points"]}
    if k_sweeps:
        out[RESULTS / K_SWEEP_FILE] = (json.dumps(
            {"derived_from": "the newest SPEC_K sweep record of each variant (make report writes this file)",
             "variants": k_sweeps}, indent=2, sort_keys=True) + "\n").encode()
    return out


def readme_table(docs: dict) -> str:
    """One row per point of each variant's newest sweep of each key (c=1 and the highest level)."""
    rows = ["| variant | key = value | session | status | TPOT p50 c=1 (ms) | tok/s c=1 | accept len c=1 | "
            "tok/s, TPOT p50 at top c | GPU processes | record |", "|---|---|---|---|---|---|---|---|---|---|"]
    f = lambda x: "-" if x is None else f"{x:g}"
    for name, doc in sorted(docs.items()):
        for key, s in sorted(((doc["results"].get("sweep") or {}).get("by_key") or {}).items()):
            for pt in s["points"]:
                lv = pt.get("levels") or {}
                c1, top = lv.get("1", {}), (max(lv, key=int) if lv else None)
                hi = f"{f(lv[top]['output_tok_per_s'])}, {f(lv[top]['tpot_p50_ms'])} ms (c={top})" if top else "-"
                rows.append(f"| `{name}` | {key}={pt['value']} | {pt.get('session', 1)} of {s.get('sessions', 1)} | "
                            f"{pt['status']} | {f(c1.get('tpot_p50_ms'))} | "
                            f"{f(c1.get('output_tok_per_s'))} | {f(c1.get('acceptance_length'))} | {hi} | "
                            f"{f(pt.get('gpu_processes'))} | `{pt.get('record') or '-'}` |")
    return "\n".join(rows)
