"""Summary of `startup` records (make verify-cache): cold vs warm start on the baked cache, hit or miss.

The headline is the latest run that expected a hit; deliberate misses (e.g. another GPU name without
the shim) are counted and the latest is kept for contrast.
"""
from __future__ import annotations


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
    return out


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
