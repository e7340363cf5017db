"""Summary of `startup` records (make verify-cache): cold vs warm start on the baked cache, hit or miss.

The headline is the latest run that expected a hit; deliberate misses (e.g. another GPU name without
the shim) are counted and the latest is kept for contrast. `traced`: the newest passing warm start of
each set of start-up cuts (START_KEYS) that has a trace (scripts/kit/startup.py), phase by phase;
docs/startup.png draws them for every variant (artifacts). `last_session`: every traced warm start of the variant's
newest machine boot (provenance.host.boot_id), in order; docs/startup-session.png draws the newest boot that started
two or more variants or sets of cuts: starts one machine ran in one session, the one figure fit for a before/after
(starts from different sessions and machines differ by more than some cuts save).
"""
from __future__ import annotations

from scripts.kit.paths import ROOT

PLOT = ROOT / "docs" / "startup.png"
SESSION_PLOT = ROOT / "docs" / "startup-session.png"


def _cuts(rec: dict) -> dict:
    """The start keys a record ran with, where they differ from the default (none: vLLM's own start)."""
    from scripts.kit.variant import START_KEYS, _defaults, _schema
    default = _defaults(_schema())
    return {k: rec["config"][k] for k in START_KEYS if k in rec["config"] and rec["config"][k] != default.get(k)}


def traced_hit(r: dict) -> bool:
    """A warm start that expected its baked cache to hit, passed, and has a trace (make verify-cache)."""
    p = r["payload"]
    return bool(p.get("trace")) and p["expected"] == "hit" and p["passed"]


def boot(r: dict) -> str | None:
    """One machine boot: records before host facts were kept have none, and are in no session plot or pair."""
    return (r["provenance"].get("host") or {}).get("boot_id")


def _traced(records) -> list[dict]:
    newest = {}
    for rel, r in records:
        if traced_hit(r):
            newest[tuple(sorted(_cuts(r).items()))] = (rel, r)
    return [_start(rel, r) for rel, r in sorted(newest.values(), key=lambda t: t[1]["provenance"]["utc"])]


def _start(rel: str, r: dict) -> dict:
    return {"record": rel, "utc": r["provenance"]["utc"], "cuts": _cuts(r), "gpu": r["provenance"]["device"]["name"],
            "ready_s": r["payload"]["warm"]["ready_s"], "first_token_s": r["payload"]["warm"]["first_token_s"],
            "path": [{"phase": x["phase"], "s": x["s"]} for x in r["payload"]["trace"]["path"]]}


def _last_session(records) -> list[dict]:
    ok = [(rel, r) for rel, r in records if traced_hit(r) and boot(r)]
    if not ok:
        return []
    last = boot(max(ok, key=lambda t: t[1]["provenance"]["utc"])[1])
    return [{**_start(rel, r), "boot": last} for rel, r in sorted(ok, key=lambda t: t[1]["provenance"]["utc"])
            if boot(r) == last]


def _row(rec: dict) -> dict:
    p = rec["payload"]
    return {"cache_hit": p["cache_hit"], "passed": p["passed"], "warm_ready_s": p["warm"]["ready_s"],
            "warm_first_token_s": p["warm"]["first_token_s"], "cold_ready_s": p["cold"]["ready_s"],
            "speedup_ready_x": p["speedup_ready_x"], "new_artifacts": p["new_artifacts"],
            "gpu": rec["provenance"]["device"]["name"], "shim_name": p["shim_name"], "budget_s": p["phases"]["budget_s"]}


def summarize(variant, records) -> dict:
    hits = [r for _, r in records if r["payload"]["expected"] == "hit"]
    misses = [r for _, r in records if r["payload"]["expected"] == "miss"]
    out = {"runs": len(records), "expected_hits_passed": sum(r["payload"]["passed"] for r in hits),
           "expected_hits": len(hits)}
    if hits:
        out["latest_hit"] = _row(hits[-1])
    if misses:
        out["latest_miss"] = _row(misses[-1])
    traced = _traced(records)
    if traced:
        out["traced"] = traced
    last = _last_session(records)
    if last:
        out["last_session"] = last
    return out


def bar_label(name: str, traced: dict, width: int = 60) -> str:
    """A bar's label: the variant, its start keys wrapped at `width` characters, the start's UTC minute and GPU. A
    variant with six start keys made a one-line label wider than the figure, which squeezed the bars to a sliver
    (docs/startup.png, 2026-11-28), so the keys wrap and each row grows with its lines. The GPU is each bar's own:
    the plot mixes H100 and H200 starts, and one name in the title said all were the newest's (2026-11-29)."""
    import textwrap
    keys = ", ".join(f"{k.removeprefix('VLLM_')}={v}" for k, v in traced["cuts"].items()) or "no cuts"
    return "\n".join([name, textwrap.fill(keys, width, break_long_words=False),
                      f"{traced['utc'][:16]}, {traced['gpu']}"])


def row_centres(labels: list[str], line: float = 0.3) -> list[float]:
    """Where each bar sits: every row is as tall as its label (at least one bar), so a label of eight lines no
    longer runs into its neighbours' (docs/startup.png, 2026-11-29, the -quick6 rows)."""
    out, top = [], 0.0
    for lab in labels:
        h = max(1.0, line * (lab.count("\n") + 1))
        out.append(top + h / 2)
        top += h
    return out


def _bars(rows: list[tuple[str, dict]], labels: list[str], title: str, legend_y: float = -0.05,
          room: float = 0.0) -> bytes:
    """One horizontal bar per start, its phases stacked left to right, the first row on top; `room` widens the x axis
    by that share so the longest bar's "to ready" text stays inside, `legend_y` places the legend under short plots."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from scripts.kit.startup import CHECKPOINTS
    from scripts.kit.summaries import png_bytes
    phases = [c[0] for c in CHECKPOINTS]
    cmap = plt.get_cmap("tab20")
    colors = {ph: cmap(i % 20) for i, ph in enumerate(phases)}
    ys = row_centres(labels)
    fig, ax = plt.subplots(figsize=(12, 2.6 + sum(0.2 + 0.17 * lab.count("\n") for lab in labels)), dpi=100)
    for y, (name, t) in zip(ys, rows):
        left = 0.0
        for seg in t["path"]:
            ax.barh(y, seg["s"], left=left, color=colors.get(seg["phase"], "lightgray"), edgecolor="white", lw=0.5,
                    label=seg["phase"])
            left += seg["s"]
        ax.text(left + 0.3, y, f"{t['ready_s']:.1f} s to ready", va="center", fontsize=7)
    ax.set_yticks(ys, labels, fontsize=7)
    ax.set_ylim(ys[-1] + 1, ys[0] - 1)  # top to bottom, oldest first
    ax.set_xlabel("seconds from the kit's spawn of the server (traced from inside it, KIT_STARTUP_TRACE)")
    handles, names = ax.get_legend_handles_labels()
    seen = dict(zip(names, handles))
    ax.legend([seen[p] for p in phases if p in seen], [p for p in phases if p in seen], fontsize=7, ncol=4,
              loc="upper center", bbox_to_anchor=(0.5, legend_y))
    if room:
        ax.set_xlim(0, max(sum(seg["s"] for seg in t["path"]) for _, t in rows) * (1 + room))
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title(title, fontsize=9)
    return png_bytes(fig)


def plot_png(docs: dict) -> bytes | None:
    """One horizontal bar per traced warm start (variant x cuts), its phases stacked left to right."""
    rows = [(name, t) for name, doc in docs.items() for t in doc["results"].get("startup", {}).get("traced", [])]
    if not rows:
        return None
    return _bars(rows, [bar_label(n, t) for n, t in rows],
                 "warm start on a baked cache, phase by phase (each bar's GPU under its label)")


def session_rows(docs: dict) -> list[tuple[str, dict]]:
    """The starts of the newest machine boot that warm-started two or more variants or sets of cuts, in the order
    they ran; none where no boot did."""
    by_boot: dict[str, list[tuple[str, dict]]] = {}
    for name, doc in docs.items():
        for t in doc["results"].get("startup", {}).get("last_session", []):
            by_boot.setdefault(t["boot"], []).append((name, t))
    pairs = [rows for rows in by_boot.values()
             if len({(n, tuple(sorted(t["cuts"].items()))) for n, t in rows}) >= 2]
    if not pairs:
        return []
    newest = max(pairs, key=lambda rows: max(t["utc"] for _, t in rows))
    return sorted(newest, key=lambda nt: nt[1]["utc"])


def session_png(docs: dict) -> bytes | None:
    rows = session_rows(docs)
    if not rows:
        return None
    labels = [f"{n}\n{len(t['cuts'])} start keys" if t["cuts"] else f"{n}\nno start key" for n, t in rows]
    labels = [f"{lab}\n{t['utc'][11:19]} UTC" for lab, (_, t) in zip(labels, rows)]
    first = rows[0][1]
    return _bars(rows, labels, f"one machine, one session ({first['utc'][:10]}, {first['gpu']}): warm starts on "
                               f"baked caches, in the order they ran, phase by phase", legend_y=-0.12, room=0.1)


def artifacts(docs: dict) -> dict:
    out = {PLOT: plot_png(docs), SESSION_PLOT: session_png(docs)}
    return {path: png for path, png in out.items() if png is not None}


def readme_table(docs: dict) -> str:
    rows = ["| variant | cold start (s) | warm start (s) | speedup | first token warm (s) | hit | GPU (shim) |",
            "|---|---|---|---|---|---|---|"]
    for name, doc in docs.items():
        s = doc["results"].get("startup", {}).get("latest_hit")
        if not s:
            continue
        gpu = s["gpu"] + (f" (as {s['shim_name']})" if s["shim_name"] else "")
        rows.append(f"| `{name}` | {s['cold_ready_s']} | {s['warm_ready_s']} | {s['speedup_ready_x']}x | "
                    f"{s['warm_first_token_s']} | {'yes' if s['cache_hit'] else 'eager' if s['cache_hit'] is None else 'no'} | {gpu} |")
    return "\n".join(rows)
