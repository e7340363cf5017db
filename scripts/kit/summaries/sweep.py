"""Summary of `sweep` records for measurements.json: the newest sweep of each key, point by point.

    from scripts.kit.summaries import sweep
    sweep.summarize(variant, [(relpath, record), ...]) -> dict
"""
from __future__ import annotations


def summarize(variant, records: list) -> dict:
    latest = {}
    for path, rec in records:  # oldest first: the last one of a key wins
        latest[rec["payload"]["key"]] = (path, rec)
    return {"by_key": {key: {"latest": path, "plot": rec["payload"]["plot"],
                             "points": [{"value": pt["value"], "status": pt["status"],
                                         **{f"tok_per_s_c{c}": lv["output_tok_per_s"] for c, lv in pt.get("levels", {}).items()},
                                         **{f"tpot_p50_ms_c{c}": lv["tpot_p50_ms"] for c, lv in pt.get("levels", {}).items()}}
                                        for pt in rec["payload"]["points"]]}
                       for key, (path, rec) in sorted(latest.items())}}
