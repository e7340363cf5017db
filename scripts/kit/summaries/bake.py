"""Summary of `bake` records: the latest empty-cache start and the cache it left (make bake)."""
from __future__ import annotations


def summarize(variant, records) -> dict:
    _, rec = records[-1]
    p = rec["payload"]
    return {"cold_ready_s": p["cold"]["ready_s"], "cold_first_token_s": p["cold"]["first_token_s"],
            "cache_mib": round(p["cache"]["total_bytes"] / 2**20, 1), "cache_files": p["cache"]["artifact_count"],
            "key_sha256": p["cache"]["key_sha256"], "triton_in_cache_root": p["cache"]["triton_in_cache_root"],
            "budget_s": p["phases"]["budget_s"], "gpu": rec["provenance"]["device"]["name"],
            "shimmed_name": rec["provenance"]["device"].get("shimmed_name")}
