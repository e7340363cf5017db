"""Summary of `latency` records for measurements.json, the README table, and the latency plot.

The newest valid record is the result; invalid ones (failed requests, TPOT below the bandwidth
floor) are listed, never summarized. plot_png() draws TTFT/TPOT percentiles and output tok/s vs
concurrency for a variant and its baseline, as PNG bytes that depend only on the summaries (no
timestamps, no version metadata), so experiments/<v>/latency.png can be committed.

    from scripts.kit.summaries import latency
    latency.summarize(variant, [(relpath, record), ...]) -> dict
    latency.readme_table({name: measurements}) -> str
    latency.artifacts({name: measurements}) -> {Path: png bytes}
"""
from __future__ import annotations

from scripts.kit.paths import EXPERIMENTS
from scripts.kit.summaries import png_bytes


def _level(lv: dict) -> dict:
    return {"ttft_p50_ms": lv["ttft_ms"]["p50"], "ttft_p99_ms": lv["ttft_ms"]["p99"],
            "tpot_p50_ms": lv["tpot_ms"]["p50"], "tpot_p99_ms": lv["tpot_ms"]["p99"],
            "itl_p99_ms": lv["itl_ms"]["p99"], "e2e_p50_ms": lv["e2e_ms"]["p50"],
            "output_tok_per_s": lv["output_tok_per_s"]["median"],
            "output_tok_per_s_spread_pct": lv["output_tok_per_s"]["spread_pct"],
            "goodput_req_per_s": lv["goodput_req_per_s"], "meets_slo": lv["meets_slo"],
            "unstable_repeats": len(lv["unstable_repeats"]),
            "acceptance_length": (lv["spec_decode"] or {}).get("acceptance_length"),
            "per_position_acceptance": (lv["spec_decode"] or {}).get("per_position_acceptance")}


def summarize(variant, records: list) -> dict:
    valid = [(p, r) for p, r in records if r["payload"]["validity"]["valid"]]
    out = {"invalid_records": [p for p, r in records if not r["payload"]["validity"]["valid"]]}
    if not valid:
        return {**out, "latest": None}
    path, rec = valid[-1]
    p = rec["payload"]
    # The baseline record that may be set beside this one (absolute figures), never a ratio: the two
    # come from two sessions, and between sessions the figures move (scripts/kit/compare.py).
    # A record's own payload.baseline.speedup stays on disk; ratios come from comparison records only.
    baseline = {k: p["baseline"].get(k) for k in ("variant", "comparable", "reasons")}
    if p["baseline"].get("record"):
        baseline["record"] = p["baseline"]["record"]
    if not baseline["comparable"] and baseline["variant"] not in (None, variant.name):
        # The baseline's record may have come after this one (records are never rewritten): compare now.
        from scripts.kit import latency as L, record as R
        now = L.find_baseline(rec, baseline["variant"], R.RESULTS)
        if now["comparable"]:
            baseline = {**{k: now.get(k) for k in ("variant", "comparable", "reasons")},
                        "record": now["record"], "compared": "at report time"}
    prefix = (p["prefix_run"] or {}).get("prefix_cache") or {}
    from scripts.kit.latency import record_roofline
    rf = record_roofline(rec)
    return {**out, "latest": path,
            "device": rec["provenance"]["device"]["name"], "vllm": rec["provenance"]["versions"].get("vllm"),
            "weights": rec["provenance"]["weights"], "acceptance": rec["provenance"]["acceptance"],
            "workload_sha256": p["workload"]["sha256"], "slo": p["slo"], "repeats": p["repeats"],
            # Records from before 2026-11-25 keep no per-request samples: check-schemas holds their
            # figures to their repeats only, and the table says their percentiles cannot be recomputed.
            "recomputable": all("samples" in lv for lv in p["levels"]),
            "levels": {str(lv["concurrency"]): _level(lv) for lv in p["levels"]},
            "max_concurrency_meeting_slo": p["max_concurrency_meeting_slo"],
            # Recomputed under today's bytes model, not read from the record: v1 records counted target
            # weights only, and one column must not mix the two (latency.record_roofline).
            "roofline_pct_c1": rf.get("roofline_pct_c1"), "floor_tpot_ms": rf.get("floor_tpot_ms"),
            "roofline_bytes_model": rf.get("bytes_model"),
            "prefix_cache_hit_rate": prefix.get("hit_rate"),
            "prefix_cold_ttft_ms": (p["prefix_run"] or {}).get("cold_ttft_ms"),
            "prefix_warm_ttft_p50_ms": (p["prefix_run"] or {}).get("warm_ttft_p50_ms"),
            "conditions": _conditions(rec), "baseline": baseline,
            "runs": [{"record": rp, **_conditions(r), **_c1(r)} for rp, r in valid],
            "warnings": p["validity"]["warnings"]}


def _conditions(rec: dict) -> dict:
    """What the run was measured under that config_sha256 leaves out: memory budget, synthetic rates."""
    from scripts.kit.latency import memory_budget
    out = memory_budget(rec)
    if rec["config"].get("SPEC_ACCEPTANCE"):
        out["SPEC_ACCEPTANCE"] = rec["config"]["SPEC_ACCEPTANCE"]
    return out


def _c1(rec: dict) -> dict:
    lv = next((x for x in rec["payload"]["levels"] if x["concurrency"] == 1), None)
    return {} if lv is None else {"tpot_p50_ms_c1": lv["tpot_ms"]["p50"], "tok_per_s_c1": lv["output_tok_per_s"]["median"]}


def _fmt(x, unit: str = "") -> str:
    return "-" if x is None else f"{x:g}{unit}"


def _cond(c: dict) -> str:
    """Run conditions, short: synthetic acceptance rates and the memory budget."""
    parts = []
    if c.get("SPEC_ACCEPTANCE"):
        parts.append(f"acc {c['SPEC_ACCEPTANCE']}")
    if c.get("SERVE_KV_CACHE_MEMORY_BYTES"):
        parts.append(f"KV {int(c['SERVE_KV_CACHE_MEMORY_BYTES']) / 2**30:g} GiB")
    return ", ".join(parts) or "-"


ROOFLINE_NOTE = ("*roofline c=1 (v2 bytes)*: bytes a c=1 decode step reads / HBM bandwidth / measured acceptance "
                 "length, as % of TPOT p50, recomputed for every record by `scripts/kit/latency.py` `step_bytes`: "
                 "the target's weights once (verify), the draft passes (MTP: K x (MTP layer + 16-bit lm_head); "
                 "DFlash: its draft model once; EAGLE-3: K x its draft), and KV cache (fp8: 1 byte an element) "
                 "plus Gated DeltaNet state at the workload's mean context. Records without `roofline.bytes_model` "
                 "store v1 (target weights only); the validity check still uses the target-weights floor.")


NO_RATIO_NOTE = ("Each row is one variant's own record, from its own session: the rows are not ranked and no "
                 "speedup is computed between them (between sessions the same variant moved more than most "
                 "differences between variants on the kit's H100). A ratio comes from a comparison record only (Comparisons, `make compare A=... B=...`).")


def readme_table(docs: dict) -> str:
    rows = ["| variant | conditions | device | weights | TPOT p50 c=1 (ms) | TTFT p50 c=1 (ms) | tok/s c=1 | "
            "best tok/s (c) | max c in SLO | roofline c=1 (v2 bytes) | accept len | prefix hit | flags |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, doc in sorted(docs.items()):
        s = doc["results"].get("latency")
        if not s:
            continue
        if not s.get("latest"):
            rows.append(f"| `{name}` | - | - | - | - | - | - | - | - | - | - | - | "
                        f"no valid record ({len(s['invalid_records'])} invalid: {', '.join(s['invalid_records'])}) |")
            continue
        lv = s["levels"]
        c1 = lv.get("1", {})
        best_c = max(lv, key=lambda c: lv[c]["output_tok_per_s"])
        flags = []
        if any(x["unstable_repeats"] for x in lv.values()):
            flags.append("unstable repeats")
        if s["invalid_records"]:
            flags.append(f"{len(s['invalid_records'])} invalid")
        if not s.get("recomputable"):
            flags.append("no samples: percentiles not recomputable")
        rows.append(f"| `{name}` | {_cond(s.get('conditions') or {})} | {s['device']} | {s['weights']} | "
                    f"{_fmt(c1.get('tpot_p50_ms'))} | "
                    f"{_fmt(c1.get('ttft_p50_ms'))} | {_fmt(c1.get('output_tok_per_s'))} | "
                    f"{_fmt(lv[best_c]['output_tok_per_s'])} ({best_c}) | {_fmt(s['max_concurrency_meeting_slo'])} | "
                    f"{_fmt(s['roofline_pct_c1'], '%')} | {_fmt(c1.get('acceptance_length'))} | "
                    f"{_fmt(s['prefix_cache_hit_rate'])} | {', '.join(flags) or '-'} |")
        # Earlier valid runs under other synthetic rates: the newest of each, c=1 only.
        shown = {(s.get("conditions") or {}).get("SPEC_ACCEPTANCE")}
        for run in reversed(s.get("runs") or []):
            if run.get("SPEC_ACCEPTANCE") not in shown:
                shown.add(run.get("SPEC_ACCEPTANCE"))
                rows.append(f"| `{name}` | {_cond(run)} | | | {_fmt(run.get('tpot_p50_ms_c1'))} | | "
                            f"{_fmt(run.get('tok_per_s_c1'))} | | | | | | `{run['record']}` |")
    return "\n".join(rows) + "\n\n" + ROOFLINE_NOTE + "\n\n" + NO_RATIO_NOTE


def plot_png(name: str, docs: dict) -> bytes | None:
    """TTFT and TPOT (p50 solid, p99 dashed) and output tok/s vs concurrency, variant vs baseline."""
    s = docs.get(name, {}).get("results", {}).get("latency")
    if not s or not s.get("latest"):
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    series = [(name, s, "tab:blue")]
    b = s["baseline"]
    bs = docs.get(b["variant"] or "", {}).get("results", {}).get("latency")
    if b["comparable"] and bs and bs.get("latest"):
        series.append((f"{b['variant']} (baseline)", bs, "tab:gray"))
    fig, axes = plt.subplots(1, 3, figsize=(13, 4), dpi=100)
    for label, summ, color in series:
        cs = sorted(summ["levels"], key=int)
        x = [int(c) for c in cs]
        for ax, metric in zip(axes[:2], ("ttft", "tpot")):
            ax.plot(x, [summ["levels"][c][f"{metric}_p50_ms"] for c in cs], "o-", color=color, label=f"{label} p50")
            ax.plot(x, [summ["levels"][c][f"{metric}_p99_ms"] for c in cs], "s--", color=color, label=f"{label} p99")
        axes[2].plot(x, [summ["levels"][c]["output_tok_per_s"] for c in cs], "o-", color=color, label=label)
    slo = s["slo"]
    axes[0].axhline(slo["ttft_p99_ms"], color="tab:red", lw=0.8, label="SLO p99")
    axes[1].axhline(slo["tpot_p99_ms"], color="tab:red", lw=0.8, label="SLO p99")
    if s.get("floor_tpot_ms"):
        axes[1].axhline(s["floor_tpot_ms"], color="black", lw=0.8, ls=":", label="bandwidth floor")
    for ax, title in zip(axes, ("TTFT (ms)", "TPOT (ms)", "output tok/s")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{name}: {s['device']}, vLLM {s['vllm']}, {s['weights']} weights, workload {s['workload_sha256'][:8]}",
                 fontsize=9)
    return png_bytes(fig)


def artifacts(docs: dict) -> dict:
    """experiments/<v>/latency.png for every variant with a latency result."""
    out = {}
    for name in docs:
        png = plot_png(name, docs)
        if png is not None:
            out[EXPERIMENTS / name / "latency.png"] = png
    return out
