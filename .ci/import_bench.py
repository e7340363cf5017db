"""The CPU figure behind docs/compile-cache.md's API_LEAN_IMPORTS=2 bullet: python3 .ci/import_bench.py ROUNDS > OUT

Fresh interpreters (the repo's .venv, sitecustomize.py on PYTHONPATH, KIT_LAZY_IMPORTS=1) import vLLM's API server
module and transformers.modeling_utils, KIT_LEAN_IMPORTS=1 against =2, the order turned each round, after one unscored
run of each (the first run after other work reads files the page cache does not hold yet).
Prints each round, the medians, the mean of the paired differences (1 minus 2) with its 95% t interval, and what
`-X importtime` gives scipy.optimize (cumulative) at level 1. Not a test: a measurement, run by hand on a quiet host.
"""
from __future__ import annotations

import math
import os
import re
import statistics as st
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = str(ROOT / ".venv" / "bin" / "python")
CODE = ("import sys, vllm.entrypoints.openai.api_server, transformers.modeling_utils; "
        "print('scipy.optimize' in sys.modules)")
T975 = {4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 15: 2.131, 19: 2.093}


def env(level: str) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith("KIT_")}
    return {**base, "PYTHONPATH": str(ROOT), "KIT_LAZY_IMPORTS": "1", "KIT_LEAN_IMPORTS": level}


def run(level: str, *flags: str) -> tuple[float, subprocess.CompletedProcess]:
    t = time.perf_counter()
    r = subprocess.run([PY, *flags, "-c", CODE], env=env(level), cwd=ROOT, capture_output=True, text=True)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(f"import_bench: level {level} exited {r.returncode}: {r.stderr[-2000:]}")
    return dt, r


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    if n - 1 not in T975:
        sys.exit(f"import_bench: ROUNDS must be one of {sorted(k + 1 for k in T975)}")
    for level in ("1", "2"):
        run(level)  # unscored
    times, diffs = {"1": [], "2": []}, []
    for i in range(n):
        order = ("1", "2") if i % 2 == 0 else ("2", "1")
        got = {}
        for level in order:
            dt, r = run(level)
            got[level] = (dt, r.stdout.strip().splitlines()[-1])
            times[level].append(dt)
        diffs.append(got["1"][0] - got["2"][0])
        print(f"round {i + 1} ({', '.join(order)}): " + ", ".join(
            f"level {lv} {got[lv][0]:.2f} s (scipy.optimize loaded: {got[lv][1]})" for lv in ("1", "2")), flush=True)
    m, h = st.mean(diffs), T975[n - 1] * st.stdev(diffs) / math.sqrt(n)
    print(f"medians: level 1 {st.median(times['1']):.2f} s, level 2 {st.median(times['2']):.2f} s; "
          f"paired differences (1 - 2): mean {m:.2f} s, 95% t interval {m - h:.2f} to {m + h:.2f} s")
    _, r = run("1", "-X", "importtime")
    hit = [ln for ln in r.stderr.splitlines() if re.search(r"\|\s+scipy\.optimize$", ln)]
    print("-X importtime, level 1, scipy.optimize (self us | cumulative us):", hit[0].split(":", 1)[1].strip() if hit else "not imported")


if __name__ == "__main__":
    main()
