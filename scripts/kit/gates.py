"""Quality-gate logic, pure: no server, no lm-eval, no files written. scripts/evaluate.py feeds it.

What a gate decides, from per-item scores and per-generation finish reasons:
  - score: mean of the per-item scores (micro average over every item of the gate's tasks);
  - ci95: seeded percentile bootstrap of that mean (a sample of 10% is a sample: the interval
    says how far it can wander);
  - cutoff_rate: share of generations that stopped on the token cap (finish_reason == "length").
    A truncated answer is a measurement error, not a score, so a rate above the gate's
    max_cutoff_rate fails the gate whatever the score;
  - recovery_pct: score / baseline score x 100, only against a baseline record measured with the
    same sample and task versions (else None, with the reason);
  - verdict: "pass" | "fail" | "report" (no floor, nothing failed).

Gates files (eval/gates/<name>.yaml) and sample files (eval/samples/<name>.yaml) hold every
threshold and index; this module holds none.

    from scripts.kit.gates import judge, draw_indices
    judge({"floor": 0.6, "max_cutoff_rate": 0.02}, scores=[1, 0, 1], finish=["stop"] * 3, seed=1, iters=1000)
"""
from __future__ import annotations

import math
import random

from .paths import ROOT

# nltk data the instruction-following checkers read (IFBench's and lm-eval's ifeval tokenize words and
# sentences with nltk's punkt_tab). `make install` puts it here (scripts/install.py); scripts/evaluate.py
# points nltk at it and never lets a checker download (gates run on hosts without the network).
NLTK_DATA = ROOT / ".venv" / "nltk_data"
PUNKT_TAB = NLTK_DATA / "tokenizers" / "punkt_tab" / "english"
PUNKT_TAB_FILES = ("abbrev_types.txt", "collocations.tab", "ortho_context.tab", "sent_starters.txt")
NLTK_TASKS = ("ifeval", "kit_ifbench")  # task-name prefixes whose checkers need punkt_tab

GATE_KEYS = {"tasks", "api", "metric", "floor", "thinking", "think_end_token", "max_gen_toks",
             "max_cutoff_rate", "min_recovery_pct", "num_concurrent"}
REQUIRED = ("tasks", "api", "metric", "max_gen_toks")
APIS = ("completions", "chat")


def check_gates(doc: dict, where: str) -> list[str]:
    """Problems in a parsed gates file (empty list: valid). Typos in keys are errors, not ignored."""
    errs = []
    for key in ("sample", "seed", "bootstrap_iters", "max_cutoff_rate", "gates"):
        if key not in doc:
            errs.append(f"{where}: missing top-level key {key!r}")
    for name, g in (doc.get("gates") or {}).items():
        if not isinstance(g, dict):
            errs.append(f"{where}: gate {name}: expected a mapping")
            continue
        errs += [f"{where}: gate {name}: unknown key {k!r}" for k in sorted(set(g) - GATE_KEYS)]
        errs += [f"{where}: gate {name}: missing {k!r}" for k in REQUIRED if k not in g]
        if g.get("api") not in APIS:
            errs.append(f"{where}: gate {name}: api must be one of {APIS}")
        if g.get("thinking") and g.get("api") != "chat":
            errs.append(f"{where}: gate {name}: thinking needs api: chat (the chat template switches it)")
        if "," not in str(g.get("metric", "")):
            errs.append(f"{where}: gate {name}: metric is lm-eval's 'name,filter' (e.g. exact_match,custom-extract)")
    return errs


def draw_indices(n: int, fraction: float, seed: int, task: str) -> list[int]:
    """ceil(fraction * n) distinct indices in [0, n), sorted; a function of (seed, task, n) only, so
    every variant and every host draws the same items. Stratification comes from drawing per
    task (MMLU-Pro: per subject task)."""
    k = min(n, max(1, math.ceil(fraction * n)))
    return sorted(random.Random(f"{seed}:{task}:{n}").sample(range(n), k))


def bootstrap_ci(scores: list[float], seed: int, iters: int, level: float = 0.95) -> list[float]:
    """Percentile bootstrap interval of the mean; seeded, so a record can be recomputed exactly."""
    n = len(scores)
    if n == 0:
        return [math.nan, math.nan]
    rng = random.Random(seed)
    means = sorted(sum(scores[rng.randrange(n)] for _ in range(n)) / n for _ in range(iters))
    lo = means[int(math.floor((1 - level) / 2 * (iters - 1)))]
    hi = means[int(math.ceil((1 + level) / 2 * (iters - 1)))]
    return [lo, hi]


def cutoff_rate(finish: list[str | None]) -> float | None:
    """Share of generations whose finish_reason is "length"; None when nothing was generated."""
    return sum(f == "length" for f in finish) / len(finish) if finish else None


def recovery(score: float, baseline_score: float | None) -> float | None:
    if baseline_score is None or baseline_score == 0:
        return None
    return 100.0 * score / baseline_score


def judge(gate: dict, scores: list[float], finish: list[str | None], seed: int, iters: int,
          baseline_score: float | None = None) -> dict:
    """One gate's result; `gate` carries floor / max_cutoff_rate / min_recovery_pct (None = unset)."""
    score = sum(scores) / len(scores) if scores else math.nan
    cut = cutoff_rate(finish)
    rec = recovery(score, baseline_score)
    reasons = []
    if not scores:
        reasons.append("no items were scored")
    if cut is None:
        reasons.append("no generations were seen, so the cut-off rate is unknown")
    elif cut > gate["max_cutoff_rate"]:
        reasons.append(f"cut off by the token cap: {cut:.1%} of generations > {gate['max_cutoff_rate']:.1%} "
                       f"(raise max_gen_toks; a truncated answer is not a score)")
    floor = gate.get("floor")
    if floor is not None and scores and score < floor:
        reasons.append(f"score {score:.4f} < floor {floor}")
    min_rec = gate.get("min_recovery_pct")
    if min_rec is not None:
        if rec is None:
            reasons.append(f"recovery needed (>= {min_rec}%) but no comparable baseline score")
        elif rec < min_rec:
            reasons.append(f"recovery {rec:.1f}% < {min_rec}%")
    verdict = "fail" if reasons else ("pass" if floor is not None or min_rec is not None else "report")
    return {"n": len(scores), "score": score, "ci95": bootstrap_ci(scores, seed, iters),
            "cutoff_rate": cut, "generations": len(finish), "cut_off": sum(f == "length" for f in finish),
            "floor": floor, "max_cutoff_rate": gate["max_cutoff_rate"], "min_recovery_pct": min_rec,
            "baseline_score": baseline_score, "recovery_pct": rec, "verdict": verdict, "reasons": reasons}


def overall(results: dict) -> bool:
    """True when no gate failed (report-only gates never block)."""
    return all(r["verdict"] != "fail" for r in results.values())


# What must match for an earlier score to be a baseline: the same question, asked the same way.
SAME = ("tasks", "api", "metric", "thinking", "max_gen_toks", "task_versions")


def comparable(payload: dict, mode: str, sample_sha256: str | None, gate: str, now: dict) -> bool:
    """Can `payload` (an earlier quality record) serve as the baseline for `gate`, whose current
    settings are `now`? Same mode (never --limit), same sample file content, same tasks, task
    versions, API, metric, thinking and token cap; otherwise its score measured something else."""
    g = payload.get("gates", {}).get(gate)
    return (g is not None and mode != "limit" and payload.get("mode") == mode
            and payload.get("sample_sha256") == sample_sha256 and (g.get("n") or 0) > 0
            and all(g.get(k) == now.get(k) for k in SAME))
