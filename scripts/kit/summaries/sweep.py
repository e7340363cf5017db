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


def plot_path(variant: str, key: str):
    return EXPERIMENTS / variant / f"sweep-{key.lower()}.png"


def summarize(variant, records: list) -> dict:
    latest = {}
    for path, rec in records:  # oldest first: the last one of a key wins
        latest[rec["payload"]["key"]] = (path, rec)
    return {"by_key": {key: {"latest": path, "points": [{k: pt.get(k) for k in ("value", "status", "reason", "levels")}
                                                        for pt in rec["payload"]["points"]]}
                       for key, (path, rec) in sorted(latest.items())}}


def plot_png(variant: str, key: str, points: list) -> bytes | None:
    ok = [p for p in points if p["status"] == "ok"]
    if not ok:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for c in sorted({c for p in ok for c in p["levels"]}, key=int):
        have = [p for p in ok if c in p["levels"]]
        for ax, metric in zip(axes, ("output_tok_per_s", "tpot_p50_ms")):
            ax.plot([p["value"] for p in have], [p["levels"][c][metric] for p in have], marker="o", label=f"c={c}")
    for ax, title in zip(axes, ("output tok/s (median of repeats)", "TPOT p50 (ms)")):
        ax.set(xlabel=key, title=title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{variant}: sweep of {key}", fontsize=9)
    return png_bytes(fig)


def artifacts(docs: dict) -> dict:
    out = {}
    for name, doc in docs.items():
        for key, s in ((doc["results"].get("sweep") or {}).get("by_key") or {}).items():
            png = plot_png(name, key, s["points"])
            if png is not None:
                out[plot_path(name, key)] = png
    return out
