"""Summary of `quality` records for measurements.json and the README quality table.

Per gate, the latest record of each mode (sample / full; --limit runs are tests and are skipped):
score, CI, cut-off rate, recovery and verdict.
"""
from __future__ import annotations

KEEP = ("score", "ci95", "n", "cutoff_rate", "floor", "recovery_pct", "verdict")


def summarize(variant, records: list) -> dict:
    out = {}
    for rel, rec in records:  # oldest first: later records overwrite
        p = rec["payload"]
        if p["mode"] == "limit":
            continue
        out[p["mode"]] = {"record": rel, "passed": p["passed"], "gates_file": p["gates_file"],
                          "gates": {g: {k: r[k] for k in KEEP} for g, r in p["gates"].items()}}
    return out


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def readme_table(docs: dict) -> str:
    rows = ["| variant | mode | gate | score | 95% CI | n | cut-off | floor | recovery | verdict |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for name, doc in docs.items():
        for mode, s in sorted(doc["results"].get("quality", {}).items()):
            if mode == "records":
                continue
            for g, r in s["gates"].items():
                ci = "-" if r["ci95"][0] is None else f"{r['ci95'][0]:.3f}-{r['ci95'][1]:.3f}"
                rows.append(f"| `{name}` | {mode} | {g} | {_fmt(r['score'], '.3f')} | {ci} | {r['n']} | "
                            f"{_fmt(r['cutoff_rate'], '.1%')} | {_fmt(r['floor'], '')} | "
                            f"{_fmt(r['recovery_pct'], '.1f')} | {r['verdict']} |")
    return "\n".join(rows)
