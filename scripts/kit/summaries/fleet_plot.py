"""docs/scale-out.png: what routing by cache and adding replicas bought, level by level, from every GPU comparison
record whose two sides differ in FLEET_POLICY or FLEET_REPLICAS (make report draws it; comparison.artifacts)."""
from __future__ import annotations

from scripts.kit.paths import ROOT

PLOT = ROOT / "docs" / "scale-out.png"
# (the key B changes, the metric drawn, its axis label): TTFT for routing, where a hit saves a prefill;
# goodput for replicas, the measure of what a fleet serves.
PANELS = (("FLEET_POLICY", "ttft_p50_ms", "TTFT p50, A / B (below 1: A faster)"),
          ("FLEET_REPLICAS", "goodput_req_per_s", "goodput within the SLO, B / A (above 1: B serves more)"))


def series(recs: list) -> dict[str, list[dict]]:
    """{fleet key: [one line a record]} over (path, record) pairs: the GPU records, valid, whose B changes that
    key, each with its label and (level, ratio, low, high) points of the panel's metric, oldest first."""
    from scripts.kit.summaries.comparison import row, workload_text
    out: dict[str, list[dict]] = {k: [] for k, _, _ in PANELS}
    for f, rec in recs:
        r = row(str(f), rec)
        if r["device_kind"] != "gpu" or not r["valid"]:
            continue
        for key, metric, _ in PANELS:
            if key not in r["b_change"]:
                continue
            pts = [(m["concurrency"], m["ratio"], *m["ci95"]) for m in rec["payload"]["metrics"]
                   if m["metric"] == metric and m["ratio"] is not None]
            if not pts:
                continue
            change = f"{r['a_values'].get(key)} → {r['b_change'][key]}"
            wl = workload_text(rec["payload"].get("workload") or {}) or "catalog mix"
            out[key].append({"record": str(f), "utc": r["utc"], "points": sorted(pts),
                             "label": f"{r['a']}: {change}, {wl} ({r['device']}, {r['utc'][:10]})"})
    for lines in out.values():
        lines.sort(key=lambda x: (x["utc"], x["record"]))
    return out


def plot_png(recs: list) -> bytes | None:
    data = series(recs)
    if not any(data.values()):
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator
    from scripts.kit.summaries import png_bytes
    fig, axes = plt.subplots(1, len(PANELS), figsize=(13, 5.2), dpi=100)
    for ax, (key, metric, ylabel) in zip(axes, PANELS):
        if not data[key]:
            ax.text(0.5, 0.5, f"no GPU record changes {key} yet", ha="center", va="center", fontsize=9)
            ax.set_axis_off()
            continue
        for i, line in enumerate(data[key]):
            c, ratio, lo, hi = zip(*line["points"])
            err = [[r - (l if l is not None else r) for r, l in zip(ratio, lo)],
                   [(h if h is not None else r) - r for r, h in zip(ratio, hi)]]
            ax.errorbar(c, ratio, yerr=err, marker="os^vD<>"[i % 7], ms=4, capsize=3, lw=1.2, label=line["label"])
        ax.axhline(1.0, color="gray", lw=0.8)
        if key == "FLEET_POLICY":
            ax.axhline(0.5, color="gray", lw=0.8, ls="--")  # issue 31's goal: TTFT p50 at least 2x better
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        levels = sorted({p[0] for line in data[key] for p in line["points"]})
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.minorticks_off()
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel("concurrency (closed-loop streams)")
        ax.set_ylabel(ylabel, fontsize=8)
        ax.set_title({"FLEET_POLICY": "routing policy (A → B)", "FLEET_REPLICAS": "replicas (A → B)"}[key], fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=1)
    fig.suptitle("fleet comparisons, each record's two sides timed in one session (95% intervals)", fontsize=9)
    return png_bytes(fig)
