"""Comparison logic with no I/O: metrics of a set of timed passes, their ratio B vs A, and its
bootstrap 95% interval. scripts/compare.py serves A and B on one GPU and times them interleaved;
`make check-schemas` recomputes every figure of a comparison record from its samples (mismatches).

Why a ratio needs its own record: on the kit's H100 the same variant and workload moved
between sessions by more than most differences the kit ranks (two K sweeps, K=0 included). Two records from two sessions differ by
the session as much as by the config. A and B timed in one session, both servers resident the whole
time, in alternating order (A B, B A, A B, ...), see the same clocks, neighbours and host, and the
alternation cancels a linear drift.

The interval resamples what varies: rounds (in pairs: a round's A and B passes ran back to back, so
they share its conditions), then requests within each pass. The seed is fixed, so the record's
interval is reproducible and the checker recomputes it exactly.

    ratio, lo, hi = metric_rows(passes, slo, rounds)[0][...]
"""
from __future__ import annotations

import random

from . import device
from . import latency as L

# (name, what it is computed from, which way is better). The ratio is oriented so that > 1 always
# means B is better: baseline/candidate for times, candidate/baseline for rates.
# tpot_p10_ms last, so records made before it keep their rows' order: at c=1 a request's TPOT on a GPU host was
# bimodal (session 20261129T1836Z, one step at acceptance 0: ~3.9-4.2 ms when the host kept up, ~4.8-6.4 ms when it
# did not, the mix moving by pass), so the median mostly counts which mode a pass was in; the 10th percentile is
# the fast mode, where a cut of the GPU's work shows, and the median and p99 are where a host cost shows.
METRICS = (("tpot_p50_ms", "lower"), ("tpot_p99_ms", "lower"), ("ttft_p50_ms", "lower"), ("ttft_p99_ms", "lower"),
           ("e2e_p50_ms", "lower"), ("output_tok_per_s", "higher"), ("goodput_req_per_s", "higher"),
           ("tpot_p10_ms", "lower"))
BOOTSTRAP_ITERATIONS = 2000
BOOTSTRAP_SEED = 0
ROUNDS = 5
# A difference under this is not called a win even when its interval excludes 1. The kit's A/A run
# (Qwen3-4B BF16 against itself, H100, results/qwen3-4b-bf16/20261125T180011Z-comparison.json) called
# 1 of its 14 metrics "better" at 1.016x [1.004, 1.028]: with 14 intervals per record, one excluding 1
# by chance is expected, and that is its size. Recorded in each payload (bootstrap.margin).
MARGIN = 0.02
# A pass is flagged when the hypervisor took this share of the host's CPU time (steal), or some task waited for a
# CPU this share of the wall time (CPU pressure), between its before and after readings (device.cpu_shares). No
# record yet says what these are on a GPU host: the levels are a first guess, to be moved once records show their
# usual range there.
STEAL_WARN_PCT = 1.0
# A 25% move of the host's python_loop_ms between a side's passes. One run of the loop spread 12% over 30 runs on
# the kit's 2-core CI machine; session 20261206T1931Z's H100 host read 16.98 and 8.93 ms minutes apart.
HOST_SPEED_WARN = 0.25
PRESSURE_WARN_PCT = 10.0


def round_order(rounds: int) -> list[list[str]]:
    """A B, B A, A B, ...: each side goes first in half the rounds, so a drift over the session
    (warming, clocks, a neighbour's state) does not favour the side that always runs second."""
    return [["a", "b"] if r % 2 == 0 else ["b", "a"] for r in range(rounds)]


def _pass_rows(samples: dict, slo: L.SLO) -> list[tuple]:
    """A pass's rows as (ok, ttft, tpot, e2e, output tokens, in the SLO), read once per pass: the bootstrap
    resamples them ~10^6 times per record, and the check recomputes every record (past 40 s, 2026-11-26)."""
    return [(r["ok"], r["ttft_ms"], r["tpot_ms"], r["e2e_ms"], r["output_tokens"],
             r["ok"] and r["ttft_ms"] <= slo.ttft_p99_ms and (r["tpot_ms"] is None or r["tpot_ms"] <= slo.tpot_p99_ms))
            for r in L.rows(samples)]


def metrics_of(passes: list[tuple[dict, float, list[int] | None]], slo: L.SLO) -> dict:
    """The METRICS over passes pooled; each pass is (samples, duration_s, request indexes or None =
    all). Rates are pooled tokens (requests) over pooled time, as a user's clock would see them."""
    rows, duration = [], 0.0
    for samples, dur, idx in passes:
        rs = _pass_rows(samples, slo)
        rows += rs if idx is None else [rs[i] for i in idx]
        duration += dur
    return _metrics(rows, duration)


def _metrics(rows: list[tuple], duration: float) -> dict:
    ok = [t for t in rows if t[0]]
    tpot, ttft = sorted(t[2] for t in ok if t[2] is not None), sorted(t[1] for t in ok if t[1] is not None)
    return {"tpot_p50_ms": L.percentile(tpot, 50, True), "tpot_p99_ms": L.percentile(tpot, 99, True),
            "ttft_p50_ms": L.percentile(ttft, 50, True), "ttft_p99_ms": L.percentile(ttft, 99, True),
            "e2e_p50_ms": L.percentile([t[3] for t in ok if t[3] is not None], 50),
            "output_tok_per_s": sum(t[4] for t in ok) / duration if duration else None,
            "goodput_req_per_s": sum(t[5] for t in rows) / duration if duration else None,
            "tpot_p10_ms": L.percentile(tpot, 10, True)}


def ratio(metric: str, a: float | None, b: float | None) -> float | None:
    """B vs A, > 1 when B is better."""
    if a is None or b is None or not a or not b:
        return None
    return a / b if dict(METRICS)[metric] == "lower" else b / a


def _r(x, n=4):
    return None if x is None else round(x, n)


def by_key(passes: list[dict]) -> dict:
    """{(round, side, concurrency): pass} of a payload's passes."""
    return {(p["round"], p["side"], p["concurrency"]): p for p in passes}


def verdict(est: float | None, lo: float | None, hi: float | None, margin: float) -> str:
    """A winner only when the interval excludes 1 and the ratio is at least `margin` away from it."""
    if est is None or lo is None:
        return "no difference"
    if lo > 1 and est >= 1 + margin:
        return "b better"
    if hi < 1 and est <= 1 - margin:
        return "a better"
    return "no difference"


def metric_rows(passes: list[dict], slo: L.SLO, rounds: int, iterations: int = BOOTSTRAP_ITERATIONS,
                seed: int = BOOTSTRAP_SEED, margin: float = 0.0) -> list[dict]:
    """One row per (concurrency, metric): A's and B's value over all rounds, B-vs-A ratio, its bootstrap
    95% interval, per-round ratios, and a verdict (see verdict)."""
    P = by_key(passes)
    levels = sorted({p["concurrency"] for p in passes})
    rng = random.Random(seed)
    out = []
    for c in levels:
        whole = {s: metrics_of([(P[(r, s, c)]["samples"], P[(r, s, c)]["duration_s"], None) for r in range(rounds)], slo)
                 for s in "ab"}
        per_round = [{s: metrics_of([(P[(r, s, c)]["samples"], P[(r, s, c)]["duration_s"], None)], slo) for s in "ab"}
                     for r in range(rounds)]
        boots = {m: [] for m, _ in METRICS}
        # Each pass's rows read once (_pass_rows). _randbelow is what randrange(n) calls for n > 0: the
        # same draws, so every committed interval recomputes to the same digits.
        rows = {(r, s): _pass_rows(P[(r, s, c)]["samples"], slo) for r in range(rounds) for s in "ab"}
        below = getattr(rng, "_randbelow", rng.randrange)
        for _ in range(iterations):
            pick = [below(rounds) for _ in range(rounds)]
            m = {}
            for s in "ab":
                chosen, duration = [], 0.0
                for r in pick:
                    rs = rows[(r, s)]
                    n = len(rs)
                    chosen += [rs[below(n)] for _ in range(n)]
                    duration += P[(r, s, c)]["duration_s"]
                m[s] = _metrics(chosen, duration)
            for name, _ in METRICS:
                x = ratio(name, m["a"][name], m["b"][name])
                if x is not None:
                    boots[name].append(x)
        for name, better in METRICS:
            est = ratio(name, whole["a"][name], whole["b"][name])
            lo, hi = L.percentile(boots[name], 2.5), L.percentile(boots[name], 97.5)
            out.append({"concurrency": c, "metric": name, "better": better,
                        "a": _r(whole["a"][name], 3), "b": _r(whole["b"][name], 3), "ratio": _r(est),
                        "ci95": [_r(lo), _r(hi)], "verdict": verdict(_r(est), _r(lo), _r(hi), margin),
                        "per_round": [_r(ratio(name, pr["a"][name], pr["b"][name])) for pr in per_round]})
    return out


def conditions_summary(passes: list[dict]) -> dict:
    """Per side: the range of SM clock, power, temperature (over every GPU the record saw) and GPU
    processes over its passes, and any slowdown reason seen; the host's load range. A clock or neighbour count that differs between the
    sides is a reason to doubt the ratio (validity warnings)."""
    out = {}
    for s in "ab":
        vals = {"sm_clock_mhz": [], "power_w": [], "temperature_c": [], "gpu_processes": [], "loadavg_1m": []}
        slow = set()
        for p in passes:
            if p["side"] != s:
                continue
            for when in ("before", "after"):
                cond = (p.get("conditions") or {}).get(when) or {}
                g = cond.get("gpu") or {}
                if g.get("gpu_processes") is not None:
                    vals["gpu_processes"].append(g["gpu_processes"])
                # every GPU of the host where the record has them (a TP/DP side runs on all)
                for one in g.get("per_gpu") or [g]:
                    for k in ("sm_clock_mhz", "power_w", "temperature_c"):
                        if one.get(k) is not None:
                            vals[k].append(one[k])
                    slow.update(one.get("slowdowns") or [])
                if (cond.get("host") or {}).get("loadavg_1m") is not None:
                    vals["loadavg_1m"].append(cond["host"]["loadavg_1m"])
            c = p.get("conditions") or {}
            for k, v in device.cpu_shares(c.get("before") or {}, c.get("after") or {}).items():
                if v is not None:
                    vals.setdefault(k, []).append(v)
            busiest = (p.get("server_sched") or {}).get("busiest")  # a local server's busiest thread (procstat)
            if busiest:
                vals.setdefault("busiest_thread_wait_pct", []).append(busiest["wait_pct"])
        out[s] = {k: [min(v), max(v)] if v else None for k, v in vals.items()}
        out[s]["slowdowns"] = sorted(slow)
    return out


def warnings(payload: dict, own_processes: int) -> list[str]:
    """What could make this ratio not what it seems: unequal neighbours, a slowdown, failed requests."""
    out = []
    cs = payload["conditions"]
    for s in "ab":
        gp = cs[s]["gpu_processes"]
        if gp and gp[1] > own_processes:
            out.append(f"side {s}: up to {gp[1]} processes held GPU memory while timing (A and B: {own_processes}): "
                       "other servers were resident beside the comparison")
        if cs[s]["slowdowns"]:
            out.append(f"side {s}: the GPU reported slowdowns while timing: {', '.join(cs[s]['slowdowns'])}")
        steal, psi = cs[s].get("steal_pct"), cs[s].get("cpu_pressure_pct")
        if steal and steal[1] >= STEAL_WARN_PCT:
            out.append(f"side {s}: the hypervisor took up to {steal[1]:g}% of the host's CPU time in a pass (steal): "
                       "another guest's load moves a host-bound step")
        if psi and psi[1] >= PRESSURE_WARN_PCT:
            out.append(f"side {s}: some task waited for a CPU during up to {psi[1]:g}% of a pass (CPU pressure): "
                       "the servers and the client were short of CPUs")
    if cs["a"]["gpu_processes"] and cs["b"]["gpu_processes"] and cs["a"]["gpu_processes"] != cs["b"]["gpu_processes"]:
        out.append(f"GPU processes differed between the sides: {cs['a']['gpu_processes']} vs {cs['b']['gpu_processes']}")
    return out + queue_warnings(payload) + step_warnings(payload)


def queue_warnings(payload: dict) -> list[str]:
    """Per side and level, a server that held fewer requests than were in flight (latency.queue_warning), and a
    fleet whose router kept one replica busy and the others idle (latency.herd_warning)."""
    out = []
    for s in "ab":
        for c in sorted({p["concurrency"] for p in payload["passes"]}):
            qs = [p.get("server_queue") for p in payload["passes"] if p["side"] == s and p["concurrency"] == c]
            out += [w for w in (L.queue_warning(f"side {s} c={c}", c, qs), L.herd_warning(f"side {s} c={c}", qs)) if w]
    return out


def host_speed_warnings(payload: dict) -> list[str]:
    """Per side, the host's single-thread speed (each pass's python_loop_ms, the mean of its before and after readings)
    where it moved HOST_SPEED_WARN or more between passes: a host-bound step (a speculating one at low acceptance)
    moves with it, and the ratio then measures the host too. Records before 2026-12-06 20:10 have no such reading."""
    out = []
    for s in "ab":
        per = []
        for p in payload["passes"]:
            if p["side"] != s:
                continue
            cond = p.get("conditions") or {}
            got = [((cond.get(w) or {}).get("host") or {}).get("python_loop_ms") for w in ("before", "after")]
            got = [g for g in got if g]
            if got:
                per.append(sum(got) / len(got))
        if len(per) > 1 and max(per) >= min(per) * (1 + HOST_SPEED_WARN):
            out.append(f"side {s}: the host's single-thread speed moved between passes (python_loop_ms "
                       f"{min(per):.2f}-{max(per):.2f}, lower is faster): a host-bound step moves with it")
    return out


def step_warnings(payload: dict) -> list[str]:
    """Per side and level, a step time that moved between passes (latency.step_spread_warning), and the host's speed
    where it moved (host_speed_warnings)."""
    out = host_speed_warnings(payload)
    for s in "ab":
        for c in sorted({p["concurrency"] for p in payload["passes"]}):
            per = [L.engine_steps([r for r in L.rows(p["samples"]) if r["ok"]]) for p in payload["passes"]
                   if p["side"] == s and p["concurrency"] == c]
            w = L.step_spread_warning(f"side {s} c={c}", per)
            if w:
                out.append(w)
    return out


def prefix_cache_rows(passes: list[dict]) -> list[dict]:
    """Per side and level, the prefix cache's token hit rate over all rounds, from each pass's /metrics
    delta (the engines', summed: a router's replicas where --metrics-url-* named them); a level whose
    passes lack the counters is left out. What a routing policy changes: a cache-aware router sends a
    shared prefix back to the replica that holds it."""
    out = []
    for s in "ab":
        for c in sorted({p["concurrency"] for p in passes if p["side"] == s}):
            ds = [p.get("metrics_delta") or {} for p in passes if p["side"] == s and p["concurrency"] == c]
            if not ds or any("prefix_cache_queries_total" not in d for d in ds):
                continue
            q = sum(d["prefix_cache_queries_total"] for d in ds)
            h = sum(d.get("prefix_cache_hits_total", 0.0) for d in ds)
            out.append({"side": s, "concurrency": c, "queries_tokens": int(q), "hits_tokens": int(h),
                        "hit_rate": round(h / q, 4) if q else None})
    return out


def mismatches(payload: dict) -> list[str]:
    """Every figure of a comparison payload that its passes' samples do not give back."""
    slo = L.SLO(payload["slo"]["ttft_p99_ms"], payload["slo"]["tpot_p99_ms"])
    boot = payload["bootstrap"]
    # Records made before the margin existed called any interval that excluded 1 (margin 0).
    again = metric_rows(payload["passes"], slo, payload["rounds"], boot["iterations"], boot["seed"], boot.get("margin", 0.0))
    # A record made before a metric existed has no row of it: the bootstrap's draws do not depend on the metrics, so
    # the rows it has recompute to the same digits.
    have = {m["metric"] for m in payload["metrics"]}
    again = [r for r in again if r["metric"] in have]
    out = []
    for old, new in zip(payload["metrics"], again):
        if old != new:
            out.append(f"comparison c={old['concurrency']} {old['metric']}: recorded {old} but the samples give {new}")
    if len(payload["metrics"]) != len(again):
        out.append(f"comparison: {len(payload['metrics'])} metric rows recorded, the samples give {len(again)}")
    # Records made before the rows existed have none to check.
    if "prefix_cache" in payload and payload["prefix_cache"] != prefix_cache_rows(payload["passes"]):
        out.append("comparison prefix_cache: the recorded rows are not what the passes' /metrics deltas give")
    return out


def headline(rows: list[dict], metric: str, concurrency: int) -> dict | None:
    return next((r for r in rows if r["metric"] == metric and r["concurrency"] == concurrency), None)


def describe(row: dict, a: str, b: str) -> str:
    """'tpot_p50_ms c=1: A tiny 4.19 vs B tiny 2.42, B 1.731x [1.700, 1.760]: B (tiny) better'. Each value
    and the verdict name the side: A against itself reads "tiny better" otherwise, whichever side won."""
    if row["ratio"] is None:
        return f"{row['metric']} c={row['concurrency']}: no value"
    who = {"b better": f"B ({b}) better", "a better": f"A ({a}) better", "no difference": "no difference"}[row["verdict"]]
    return (f"{row['metric']} c={row['concurrency']}: A {a} {row['a']} vs B {b} {row['b']}, "
            f"B {row['ratio']:.3f}x [{row['ci95'][0]:.3f}, {row['ci95'][1]:.3f}]: {who}")
