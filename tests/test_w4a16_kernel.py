"""The kit's Triton W4A16 kernel (scripts/patches/w4a16_kernel.py) on CPU, under Triton's interpreter, against a
float64 dequant-matmul: decode shapes (M 1..8, 1+K = 5), group sizes 32 and 128, the split-K path and the
single-pass one. Fresh random inputs each case; the output is poisoned first so an unwritten element fails.
The interpreter has no bfloat16 (its results are garbage there), so float16 and float32 are checked here and
bfloat16 on the GPU, where `make gemm` checks every shape against the same reference before timing it."""
from __future__ import annotations

import subprocess
import sys

import pytest

from scripts.kit.paths import ROOT

CHECK = r'''
import os, sys, json
os.environ["TRITON_INTERPRET"] = "1"
import torch
from scripts.patches.w4a16_kernel import w4a16_matmul, reference, pack, plan
m, n, k, g, dt, sms, seed = json.loads(sys.argv[1])
torch.manual_seed(seed)
dt = getattr(torch, dt)
q = torch.randint(-8, 8, (n, k))
wp = pack(q)
# The packer is the layout's definition: value j of word c is the weight at k = 8c + j, stored + 8.
assert torch.equal(((wp.to(torch.int64) & 0xFFFFFFFF) >> 4 * 3 & 0xF)[:, 1] - 8, q[:, 8 + 3])
s = (torch.rand(n, k // g) * 0.1 + 0.01).to(dt)
x = torch.randn(m, k).to(dt)
y = w4a16_matmul(x, wp, s, g, sms=sms)
ref = reference(x, wp, s, g)
print(json.dumps({"err": ((y.double() - ref).norm() / ref.norm()).item(), "shape": list(y.shape),
                  "dtype": str(y.dtype), "split": plan(n, k, g, sms)["SPLIT_K"], "finite": bool(torch.isfinite(y).all())}))
'''


def run(case):
    import json
    r = subprocess.run([sys.executable, "-c", CHECK, json.dumps(case)], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("m,n,k,g,dt,sms,seed,split,tol", [
    (1, 16, 512, 32, "float32", 4, 1, 4, 1e-6),      # split-K: partial sums meet by atomic adds
    (5, 96, 256, 32, "float16", 4, 2, 2, 1e-3),      # MTP K=4 verify, rows 5..15 of the tile masked
    (8, 48, 1024, 128, "float32", 4, 3, 4, 1e-6),    # group 128
    (3, 80, 128, 32, "float16", 1000, 4, 1, 1e-3),   # enough columns for the SMs: one pass, no atomics
])
def test_matches_the_float64_reference(m, n, k, g, dt, sms, seed, split, tol):
    out = run([m, n, k, g, dt, sms, seed])
    assert out["split"] == split  # the case exercises the path it says
    assert out["shape"] == [m, n] and out["dtype"] == f"torch.{dt}" and out["finite"]
    assert out["err"] < tol, out


def test_plan_fills_the_gpu_and_divides_k():
    from scripts.patches.w4a16_kernel import plan
    for n, k in [(18432, 2560), (2560, 9216), (12288, 2560), (64, 2560), (2560, 4096), (10240, 2560)]:
        p = plan(n, k, 32, 132)
        programs = -(-n // p["BLOCK_N"]) * p["SPLIT_K"]
        assert k % p["SPLIT_K"] == 0 and p["K_PER_SPLIT"] % p["BLOCK_K"] == 0
        # At least two waves where K allows it; never a split whose slice is under one BLOCK_K step.
        assert programs >= 264 or p["K_PER_SPLIT"] // 2 < p["BLOCK_K"] or (p["K_PER_SPLIT"] // 2) % p["BLOCK_K"]


def test_refuses_what_it_does_not_cover():
    torch = pytest.importorskip("torch")
    from scripts.patches.w4a16_kernel import w4a16_matmul
    x = torch.zeros(17, 256)
    with pytest.raises(ValueError, match="M <= 16"):
        w4a16_matmul(x, torch.zeros(8, 32, dtype=torch.int32), torch.zeros(8, 8), 32)
    with pytest.raises(ValueError, match="shapes"):
        w4a16_matmul(torch.zeros(1, 256), torch.zeros(8, 16, dtype=torch.int32), torch.zeros(8, 8), 32)
