"""Bytecode for the serving interpreter's packages, written once so that no server start compiles
Python source. `make bake` calls it before its cold start.

Why: a package installed without bytecode (`pip install --no-compile`, a tree unpacked from an
archive) is compiled from source on every import when the environment also sets
PYTHONDONTWRITEBYTECODE=1 (common in containers; vLLM's spawned processes then run with -B too).
On the H100 machine that was 36% of a warm start's engine-process samples
(SourceLoader.source_to_code, results/profiles/20261124T034930Z-...). A pip install with its default
--compile already has bytecode: then this only looks (one stat per top-level package) and writes nothing.
"""
from __future__ import annotations

import json
import subprocess

# Runs in the server's interpreter and environment (its sys.path, its bytecode tag). Only writable
# directories, never the working directory (the repo), only packages and modules lacking bytecode.
_SNIPPET = r"""
import compileall, importlib.util, json, os, sys, time
t = time.time(); cwd = os.path.realpath(os.getcwd()); todo = []
for d in dict.fromkeys(os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)):
    if d == cwd or not os.access(d, os.W_OK):
        continue
    for name in sorted(os.listdir(d)):
        p = os.path.join(d, name)
        src = os.path.join(p, "__init__.py") if os.path.isdir(p) else p
        if src.endswith(".py") and os.path.isfile(src) and os.access(os.path.dirname(src), os.W_OK) \
                and not os.path.exists(importlib.util.cache_from_source(src)):
            todo.append(p)
ok = True
for p in todo:
    ok &= bool(compileall.compile_dir(p, quiet=2, workers=0) if os.path.isdir(p) else compileall.compile_file(p, quiet=2))
print(json.dumps({"compiled": len(todo), "sample": [os.path.basename(p) for p in todo[:8]],
                  "ok": ok, "seconds": round(time.time() - t, 2)}))
"""


def ensure(python: str, env: dict, timeout_s: float = 1800) -> dict:
    """Compile what lacks bytecode; {'compiled': N packages/modules, 'sample', 'ok', 'seconds'}.
    A failure to compile some file (a syntax error in an unused module) is reported, not fatal."""
    out = subprocess.run([python, "-c", _SNIPPET], env=env, capture_output=True, text=True, timeout=timeout_s)
    if out.returncode != 0:
        return {"compiled": 0, "sample": [], "ok": False, "seconds": 0.0,
                "error": (out.stderr.strip().splitlines() or ["exit %d" % out.returncode])[-1][:300]}
    return json.loads(out.stdout.strip().splitlines()[-1])
