"""`make variance RECORDS="results/.../x-comparison.json ..."`: how much one config's level moves, and
with what, from comparison records of one session.

For every side of every record and every concurrency level: the per-pass TPOT p50 and output tok/s
(each pass is one timed run of that server), their range and coefficient of variation, and how they
move with what each pass ran under (SM clock, power, temperature, GPU processes, host load: Pearson
correlation over the passes, null where the condition did not vary), plus the passes during which
the GPU reported a slowdown. An A/A record (the same variant on both sides) adds the method's own
noise: its ratio interval.

TPOT splits in two, per pass, from the requests' own samples: tokens per engine step (Σ(output
tokens - 1) / Σ stream chunks after the first; the server streams one chunk per request per step, so
1 without speculation, the acceptance length with it) and step time (Σ(E2E - TTFT) / Σ chunks). A
level that moves with the step time and not with tokens per step moved with the engine's step, not
with the acceptance draw.

Output: one `variance` record under results/<variant of the first record>/ (schemas/payloads/
variance.schema.json). Records of different sessions (another host id or GPU) are refused: a level
shift between sessions is what this measures within one, not across.

    python -m scripts.variance results/qwen3-4b-bf16/20261125T180011Z-comparison.json \\
        results/qwen3-4b-bf16-tuned/20261125T175735Z-comparison.json
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from scripts.kit import latency as L
from scripts.kit.errors import KitError, run_main
from scripts.kit.paths import RESULTS, ROOT, rel as _rel
from scripts.kit.record import load_record, make_record, write_record
from scripts.report import refresh_after_write
from scripts.kit.variant import load

# python_loop_ms: the host's single-thread speed at each reading (device.conditions; records since 2026-12-06 20:10)
CONDITIONS = ("sm_clock_mhz", "power_w", "temperature_c", "gpu_processes", "loadavg_1m", "python_loop_ms")
HOST_CONDITIONS = ("loadavg_1m", "python_loop_ms")


def pearson(xs: list, ys: list) -> float | None:
    """Correlation over paired values; None when either side is constant or has under 3 points."""
    pairs = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None]
    if len(pairs) < 3:
        return None
    xs, ys = zip(*pairs)
    if len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    return round(statistics.correlation(xs, ys), 3)


def pass_condition(p: dict, key: str) -> float | None:
    """A condition over one pass: the mean of its before and after readings."""
    vals = []
    for when in ("before", "after"):
        c = (p.get("conditions") or {}).get(when) or {}
        v = (c.get("host") or {}).get(key) if key in HOST_CONDITIONS else (c.get("gpu") or {}).get(key)
        if v is not None:
            vals.append(v)
    return round(statistics.fmean(vals), 3) if vals else None


def spread(xs: list[float]) -> dict:
    med = statistics.median(xs)
    return {"n": len(xs), "min": round(min(xs), 4), "median": round(med, 4), "max": round(max(xs), 4),
            "range_pct": round(100 * (max(xs) - min(xs)) / med, 2) if med else None,
            "cv_pct": round(100 * statistics.pstdev(xs) / statistics.fmean(xs), 2) if len(xs) > 1 else None}


def study(path: str, rec: dict) -> list[dict]:
    """One entry per (side, concurrency) of a comparison record."""
    p = rec["payload"]
    out = []
    for side in "ab":
        for c in sorted({x["concurrency"] for x in p["passes"]}):
            ps = [x for x in p["passes"] if x["side"] == side and x["concurrency"] == c]
            tpot, tps, per_step, step_ms = [], [], [], []
            for x in ps:
                rows = [r for r in L.rows(x["samples"]) if r["ok"]]
                tpot.append(L.percentile([r["tpot_ms"] for r in rows if r["tpot_ms"] is not None], 50))
                tps.append(sum(r["output_tokens"] for r in rows) / x["duration_s"])
                k, ms = L.engine_steps(rows)
                per_step.append(k)
                step_ms.append(ms)
            conds = {k: [pass_condition(x, k) for x in ps] for k in CONDITIONS}
            slow = [i for i, x in enumerate(ps)
                    if any(((x["conditions"].get(w) or {}).get("gpu") or {}).get("slowdowns") for w in ("before", "after"))]
            out.append({"record": path, "side": side, "variant": p["sides"][side]["variant"],
                        "acceptance": p["sides"][side]["config"].get("SPEC_ACCEPTANCE") or None,
                        "concurrency": c, "rounds": [x["round"] for x in ps],
                        "tpot_p50_ms": spread(tpot), "output_tok_per_s": spread(tps),
                        "tpot_p50_ms_per_pass": [round(t, 4) for t in tpot],
                        "tokens_per_step": spread(per_step) if None not in per_step else None,
                        "step_ms": spread(step_ms) if None not in step_ms else None,
                        "tokens_per_step_per_pass": per_step, "step_ms_per_pass": step_ms,
                        "conditions": {k: ([min(v for v in vs if v is not None), max(v for v in vs if v is not None)]
                                           if any(v is not None for v in vs) else None) for k, vs in conds.items()},
                        "correlation_with_tpot": {k: pearson(vs, tpot) for k, vs in conds.items()},
                        "slowdown_passes": slow})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="make variance", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("records", nargs="+", help="comparison records of one session")
    ap.add_argument("--results-dir", type=Path, default=RESULTS, help="where the record goes (default: results/)")
    a = ap.parse_args(argv)
    started = time.time()
    recs = []
    for f in a.records:
        path = Path(f)
        if not path.is_file():
            raise KitError(f"{f}: no such record")
        rec = load_record(path)
        if rec["kind"] != "comparison":
            raise KitError(f"{f}: a {rec['kind']} record; variance reads comparison records (make compare)")
        recs.append((_rel(path.resolve()) if ROOT in path.resolve().parents else str(path), rec))
    machines = {(r["provenance"]["device"]["name"], (r["provenance"].get("host") or {}).get("id"),
                 r["provenance"]["utc"][:10]) for _, r in recs}
    if len({m[:2] for m in machines}) > 1 or len({m[2] for m in machines}) > 1:
        raise KitError(f"records from more than one machine or day: {sorted(machines, key=str)}; a variance study "
                       "is of one session")
    entries = [e for path, rec in recs for e in study(path, rec)]
    aa = [{"record": path, "variant": rec["payload"]["sides"]["a"]["variant"],
           "rows": [{k: m[k] for k in ("concurrency", "metric", "ratio", "ci95", "verdict")} for m in rec["payload"]["metrics"]]}
          for path, rec in recs
          if rec["payload"]["sides"]["a"]["config_sha256"] == rec["payload"]["sides"]["b"]["config_sha256"]
          and rec["payload"]["sides"]["a"]["config"].get("SPEC_ACCEPTANCE") == rec["payload"]["sides"]["b"]["config"].get("SPEC_ACCEPTANCE")]
    payload = {"sources": [p for p, _ in recs], "entries": entries, "a_a": aa}
    v = load(recs[0][1]["payload"]["sides"]["a"]["variant"])
    rec = make_record("variance", v, payload, started=started)
    # The passes ran on the sources' machine, not here: their device, versions and host are the study's.
    src = recs[0][1]["provenance"]
    rec["provenance"].update(device=src["device"], versions=src["versions"], weights=src["weights"],
                             acceptance="mixed" if len({r["provenance"]["acceptance"] for _, r in recs}) > 1
                             else src["acceptance"])
    if src.get("host"):
        rec["provenance"]["host"] = src["host"]
    else:
        rec["provenance"].pop("host", None)
    out = write_record(rec, a.results_dir)
    for e in entries:
        t = e["tpot_p50_ms"]
        k, ms = e["tokens_per_step"], e["step_ms"]
        split = (f"; tokens/step {k['min']}-{k['max']} (range {k['range_pct']}%), step {ms['min']}-{ms['max']} ms "
                 f"(range {ms['range_pct']}%)") if k and ms else ""
        print(f"{e['variant']} ({e['side'].upper()}) c={e['concurrency']}: TPOT p50 per pass {t['min']}-{t['max']} ms "
              f"(range {t['range_pct']}%, cv {t['cv_pct']}%){split}, slowdown passes {len(e['slowdown_passes'])}", file=sys.stderr)
    print(f"record: {_rel(out)}", file=sys.stderr)
    refresh_after_write(out)
    return 0


if __name__ == "__main__":
    run_main(main)
