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
    return []


def trace_mismatches(trace: dict | None) -> list[str]:
    """A profile record's kept trace: the file it names exists, with the bytes and sha256 it gives."""
    from scripts.kit.paths import ROOT, sha256_file
    if not trace:
        return []
    f = ROOT / trace["path"]
    if not f.is_file():
        return [f"payload/trace/path: {trace['path']} does not exist"]
    if f.stat().st_size != trace["bytes"] or sha256_file(f) != trace["sha256"]:
        return [f"payload/trace: {trace['path']} is not the trace the record kept (bytes or sha256 differ)"]
    return []
