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
    return []
