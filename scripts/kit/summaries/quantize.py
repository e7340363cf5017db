"""Summary of `quantize` records for measurements.json: the latest published checkpoint's numbers.

    summarize(variant, [(relpath, record), ...]) -> {"latest": relpath, "ppl_ratio": ..., ...}
"""
from __future__ import annotations


def summarize(variant, records: list) -> dict:
    published = [(rel, r) for rel, r in records if r["payload"]["published"]]
    if not published:
        return {"published": False}
    rel, rec = published[-1]  # records come oldest first; the folder on disk is the latest publish
    p = rec["payload"]
    verify = p["verify"] or {}
    return {"published": True, "latest": rel, "recipe_sha256": p["recipe_sha256"],
            "calibration": f"{p['calibration']['source']} {p['calibration']['samples']}x{p['calibration']['seq_len']}",
            "random_source": p["random_source"], "ppl_ratio": verify.get("ppl_ratio"),
            "top1_agreement": verify.get("top1_agreement"), "awq_s": p["timings_s"]["awq_s"],
            "quantized_mib": round(p["size_bytes"]["quantized"] / 2**20, 1),
            "device": rec["provenance"]["device"]["name"]}
