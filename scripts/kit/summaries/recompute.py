"""Summary figures recomputed from the raw samples a record keeps (issue 18: a wrong summary must be
caught). One entry per record kind that keeps samples; `make check-schemas` calls record_mismatches."""
from __future__ import annotations


def record_mismatches(rec: dict) -> list[str]:
    """Each figure of `rec` that its own samples do not give back ([] when it keeps none)."""
    from scripts.kit import latency as L
    if rec["kind"] == "latency":
        return L.sample_mismatches(rec["payload"])
    if rec["kind"] == "comparison":
        from scripts.kit import compare as C
        return C.mismatches(rec["payload"])
    if rec["kind"] == "failover":
        from scripts.kit import failover as F
        return F.mismatches(rec["payload"])
    if rec["kind"] == "profile":
        return trace_mismatches(rec["payload"].get("trace"))
    if rec["kind"] == "host_profile":
        return host_mismatches(rec["payload"])
    return []


def host_mismatches(payload: dict) -> list[str]:
    """A host_profile record: its kept samples exist as recorded, and reduce (with the record's rate, tokens and
    the rules it names) to the reduction it gives."""
    from scripts.kit import hostprof as H
    from scripts.kit.paths import ROOT
    raw = payload["raw"]
    bad = trace_mismatches(raw, "raw")
    if bad or not raw:
        return bad
    red = payload["reduction"]
    rules, worker_rules = ([(r["phase"], r["function"], r["path"]) for r in payload[k]] for k in ("rules", "worker_rules"))
    try:
        again = H.reduce(H.load(ROOT / raw["path"]), red["rate_hz"], red["output_tokens"], top=red["top_n"],
                         rules=rules, worker_rules=worker_rules)
    except ValueError as e:
        return [f"payload/raw: {raw['path']}: {e}"]
    return [f"payload/reduction/{k}: the record gives {red[k]!r}, its samples {again[k]!r}"
            for k in red if red[k] != again[k]]


def trace_mismatches(trace: dict | None, key: str = "trace") -> list[str]:
    """A profile record's kept trace: the file it names exists, with the bytes and sha256 it gives."""
    from scripts.kit.paths import ROOT, sha256_file
    if not trace:
        return []
    f = ROOT / trace["path"]
    if not f.is_file():
        return [f"payload/{key}/path: {trace['path']} does not exist"]
    if f.stat().st_size != trace["bytes"] or sha256_file(f) != trace["sha256"]:
        return [f"payload/{key}: {trace['path']} is not the file the record kept (bytes or sha256 differ)"]
    return []
