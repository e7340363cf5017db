"""What the kit's Triton kernel tests share: a check script run in a fresh process under Triton's CPU interpreter
(TRITON_INTERPRET must be set before Triton is imported), on one case given as JSON, reporting y's error against
the float64 reference `ref` as JSON."""
from __future__ import annotations

import json
import subprocess
import sys

from scripts.kit.paths import ROOT

# Before the kernel's own lines: the case (m, n, k, group, dtype, config, seed) and a seeded torch.
PRELUDE = r'''
import os, sys, json
os.environ["TRITON_INTERPRET"] = "1"
import torch
m, n, k, g, dt, config, seed = json.loads(sys.argv[1])
torch.manual_seed(seed)
dt = getattr(torch, dt)
'''
# After them: y (the kernel's output) against ref.
REPORT = r'''
print(json.dumps({"err": ((y.double() - ref).norm() / ref.norm()).item(), "shape": list(y.shape),
                  "dtype": str(y.dtype), "finite": bool(torch.isfinite(y).all())}))
'''


def run(check: str, case: list) -> dict:
    r = subprocess.run([sys.executable, "-c", check, json.dumps(case)], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])
