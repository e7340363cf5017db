"""`make start-pair A=VARIANT B=VARIANT`: two variants' warm starts from one machine boot, phase by phase and
round by round, with the paired difference in time to ready and its 95% t interval.

Reads the traced startup records `make verify-cache` writes (results/<variant>/*-startup.json: a warm start on a
baked cache that hit it). Only starts of one machine boot (provenance.host.boot_id) are set side by side: starts on
different machines, or before and after a reboot, differ by more than most start keys save. The i-th start of A is
paired with the i-th start of B in the order they ran, so run them alternately (A B, B A, ...): a drift over the
session then falls on both sides. Without --boot, the newest boot holding starts of both is used. Prints; writes
nothing (every figure is in the records it names).

    make verify-cache VARIANT=qwen3.5-4b-fp8-v4 && make verify-cache VARIANT=qwen3.5-4b-fp8-v4-mega   # round 1, ...
    make start-pair A=qwen3.5-4b-fp8-v4 B=qwen3.5-4b-fp8-v4-mega
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from scripts.kit.errors import KitError, run_main
from scripts.kit.paths import RESULTS, ROOT
from scripts.kit.record import records
from scripts.kit.summaries.startup import boot as _boot, traced_hit
from scripts.kit.variant import load

# Student's t, two-sided 95% (0.975 quantile), by degrees of freedom; above 30 the normal's 1.96 is within 4%.
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
        20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048,
        29: 2.045, 30: 2.042}


def warm_starts(variant: str, root: Path) -> list[tuple[str, dict]]:
    """The variant's traced warm starts that hit their baked cache, oldest first, each with the path it is read from."""
    out = []
    for path, r in records(variant, "startup", root):
        if traced_hit(r) and _boot(r):
            out.append((str(path.relative_to(ROOT)) if ROOT in path.parents else str(path), r))
    return out


def t_interval(diffs: list[float]) -> tuple[float, float] | None:
    if len(diffs) < 2:
        return None
    mean, se = statistics.mean(diffs), statistics.stdev(diffs) / len(diffs) ** 0.5
    t = T975.get(len(diffs) - 1, 1.96)
    return round(mean - t * se, 2), round(mean + t * se, 2)


def pair(a: str, b: str, root: Path = RESULTS, boot: str | None = None) -> dict:
    sa, sb = warm_starts(a, root), warm_starts(b, root)
    for name, s in ((a, sa), (b, sb)):
        if not s:
            raise KitError(f"{name}: no traced warm start that hit its cache under {root} (make bake VARIANT={name}, "
                           f"then make verify-cache VARIANT={name})")
    both = {_boot(r) for _, r in sa} & {_boot(r) for _, r in sb}
    if boot is None:
        if not both:
            raise KitError(f"no machine boot holds warm starts of both {a} and {b}: starts from different machines or "
                           "sessions are not a pair. Run make verify-cache for each, alternately, on one host")
        boot = max(both, key=lambda x: max(r["provenance"]["utc"] for _, r in sa + sb if _boot(r) == x))
    elif boot not in both:
        raise KitError(f"--boot {boot}: no warm starts of both {a} and {b} in it; boots with both: "
                       f"{', '.join(sorted(both)) or 'none'}")
    sa = [(p, r) for p, r in sa if _boot(r) == boot]
    sb = [(p, r) for p, r in sb if _boot(r) == boot]
    n = min(len(sa), len(sb))
    rounds = [{"a": pa, "b": pb, "a_ready_s": ra["payload"]["warm"]["ready_s"], "b_ready_s": rb["payload"]["warm"]["ready_s"],
               "a_minus_b_s": round(ra["payload"]["warm"]["ready_s"] - rb["payload"]["warm"]["ready_s"], 2)}
              for (pa, ra), (pb, rb) in zip(sa[:n], sb[:n])]
    phases: dict[str, dict[str, list[float]]] = {}
    for side, starts in (("a", sa[:n]), ("b", sb[:n])):
        for _, r in starts:
            for seg in r["payload"]["trace"]["path"]:
                phases.setdefault(seg["phase"], {"a": [], "b": []})[side].append(seg["s"])
    diffs = [x["a_minus_b_s"] for x in rounds]
    return {"a": a, "b": b, "boot": boot, "gpu": sa[0][1]["provenance"]["device"]["name"],
            "unpaired": {a: len(sa) - n, b: len(sb) - n}, "rounds": rounds,
            "phases": [{"phase": ph, "a_median_s": round(statistics.median(v["a"]), 3) if v["a"] else None,
                        "b_median_s": round(statistics.median(v["b"]), 3) if v["b"] else None}
                       for ph, v in phases.items()],
            "a_minus_b_mean_s": round(statistics.mean(diffs), 2), "a_minus_b_ci95_s": t_interval(diffs)}


def text(res: dict) -> str:
    a, b = res["a"], res["b"]
    width = max(len(p["phase"]) for p in res["phases"])

    def fmt(x):
        return "-" if x is None else f"{x:.2f}"
    lines = [f"{a} (A) against {b} (B): {len(res['rounds'])} paired warm start(s), one machine boot ({res['gpu']}, "
             f"boot {res['boot']})", "", f"  {'phase (median s)':<{width}}        A        B      A-B"]
    for p in res["phases"]:
        d = None if p["a_median_s"] is None or p["b_median_s"] is None else p["a_median_s"] - p["b_median_s"]
        lines.append(f"  {p['phase']:<{width}} {fmt(p['a_median_s']):>8} {fmt(p['b_median_s']):>8} {fmt(d):>8}")
    lines += ["", "  round  A ready (s)  B ready (s)  A-B (s)  records"]
    for i, r in enumerate(res["rounds"], 1):
        lines.append(f"  {i:>5}  {r['a_ready_s']:>11.2f}  {r['b_ready_s']:>11.2f}  {r['a_minus_b_s']:>7.2f}  {r['a']}, {r['b']}")
    ci = res["a_minus_b_ci95_s"]
    lines.append("")
    if ci is None:
        lines.append(f"A-B to ready: {res['a_minus_b_mean_s']:.2f} s from one pair: no interval; run more rounds")
    else:
        verdict = ("B readier" if ci[0] > 0 else "A readier" if ci[1] < 0 else "no difference resolved")
        lines.append(f"A-B to ready: mean {res['a_minus_b_mean_s']:.2f} s, 95% t interval [{ci[0]:.2f}, {ci[1]:.2f}] s "
                     f"over {len(res['rounds'])} rounds: {verdict}")
    left = {k: v for k, v in res["unpaired"].items() if v}
    if left:
        lines.append("unpaired (more starts of one side in this boot, left out): "
                     + ", ".join(f"{k} {v}" for k, v in left.items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="make start-pair", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="the variant before (A)")
    ap.add_argument("--b", required=True, help="the variant after (B)")
    ap.add_argument("--boot", default=None, help="the machine boot (a record's provenance.host.boot_id); default: "
                                                 "the newest holding starts of both")
    ap.add_argument("--results-dir", type=Path, default=RESULTS, help="where the records are (default: results/)")
    ap.add_argument("--json", action="store_true", help="print the pair as JSON")
    a = ap.parse_args(argv)
    for name in (a.a, a.b):
        load(name)  # an unknown variant says so, naming experiments/
    res = pair(a.a, a.b, a.results_dir, a.boot)
    print(json.dumps(res, indent=1) if a.json else text(res))
    return 0


if __name__ == "__main__":
    run_main(main)
