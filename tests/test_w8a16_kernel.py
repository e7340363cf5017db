"""The kit's W8A16 Triton kernel (scripts/patches/w8a16_kernel.py), FP8 and INT8 weights, on CPU, under Triton's interpreter, against a
float64 reference: decode shapes (M 1..8), per-channel and per-tensor scales, block sizes from the autotuner's list,
K and N past a whole block, rows further apart than K, K split 2-8 ways (more splits than blocks too) and called twice
(the counts a split leaves behind), INT8 as the lm_head copy holds it; float16 and float32 activations here (the interpreter has no bfloat16), bfloat16 on the
GPU, where `make gemm` checks every shape against the same reference before timing it."""
from __future__ import annotations

import pytest

CHECK = r'''
import os, sys, json
os.environ["TRITON_INTERPRET"] = "1"
import torch
from scripts.patches.w8a16_kernel import w8a16_matmul, reference
for m, n, k, dt, per_tensor, strided, config, seed, w8 in json.loads(sys.argv[1]):
    torch.manual_seed(seed)
    dt = getattr(torch, dt)
    w = torch.randn(n, k + 64 * strided) * 2
    w = (w.to(torch.float8_e4m3fn) if w8 == "fp8" else (w * 40).round().clamp(-127, 127).to(torch.int8))[:, :k]  # strided: rows further apart than K
    assert w.stride(0) == k + 64 * strided
    s = torch.rand(1 if per_tensor else n, 1) * 0.1 + 0.01
    x = torch.randn(m, k).to(dt)
    y = w8a16_matmul(x, w, s, config=config)
    again = w8a16_matmul(x, w, s, config=config)  # a split's counts were put back to 0: the same sums again
    ref = reference(x, w, s)
    print(json.dumps({"err": ((y.double() - ref).norm() / ref.norm()).item(), "shape": list(y.shape),
                      "dtype": str(y.dtype), "finite": bool(torch.isfinite(y).all()),
                      "again": bool(torch.equal(y, again))}))
'''
CASES = [  # m, n, k, activations, one scale a tensor, strided rows, blocks, seed, weights; tolerance
    ((1, 16, 512, "float32", False, False, None, 1, "fp8"), 1e-6),
    ((5, 96, 256, "float16", True, True, {"BLOCK_N": 32, "BLOCK_K": 256}, 2, "fp8"), 1e-3),   # MTP K=4 verify, one scale
    ((8, 48, 1000, "float32", False, False, {"BLOCK_N": 16, "BLOCK_K": 512}, 3, "fp8"), 1e-6),  # K past the last step
    ((3, 80, 384, "float16", False, True, {"BLOCK_N": 64, "BLOCK_K": 128}, 4, "fp8"), 1e-3),   # N past a block
    ((5, 96, 1000, "float32", False, True, {"BLOCK_N": 32, "BLOCK_K": 256}, 5, "int8"), 1e-6),  # the lm_head copy's
    ((1, 48, 256, "float16", True, False, None, 6, "int8"), 1e-3),
    # K split: each program of a column block takes every SPLIT_K-th block of K, the last one in adds them up
    ((5, 80, 1000, "float32", False, True, {"BLOCK_N": 16, "BLOCK_K": 128, "SPLIT_K": 4}, 7, "fp8"), 1e-6),
    ((1, 96, 512, "float16", True, False, {"BLOCK_N": 32, "BLOCK_K": 128, "SPLIT_K": 8}, 8, "fp8"), 1e-3),  # 4 blocks, 8 splits
    ((8, 48, 768, "float32", False, False, {"BLOCK_N": 16, "BLOCK_K": 256, "SPLIT_K": 2}, 9, "int8"), 1e-6),
]


def test_matches_the_float64_reference():
    import json
    import subprocess
    import sys
    from scripts.kit.paths import ROOT
    r = subprocess.run([sys.executable, "-c", CHECK, json.dumps([c for c, _ in CASES])], cwd=ROOT, capture_output=True,
                       text=True, timeout=600, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-3000:]
    outs = [json.loads(line) for line in r.stdout.strip().splitlines()[-len(CASES):]]
    for (case, tol), out in zip(CASES, outs):
        m, n, _, dt = case[:4]
        assert out["shape"] == [m, n] and out["dtype"] == f"torch.{dt}" and out["finite"], (case, out)
        assert out["err"] < tol and out["again"], (case, out)


def test_refuses_what_it_does_not_cover():
    torch = pytest.importorskip("torch")
    from scripts.patches.w8a16_kernel import w8a16_matmul as fp8_matmul
    w = torch.zeros(8, 256).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="M <= 16"):
        fp8_matmul(torch.zeros(17, 256), w, torch.ones(8))
    with pytest.raises(ValueError, match="float8_e4m3fn or int8"):
        fp8_matmul(torch.zeros(1, 256), w.float(), torch.ones(8))
    with pytest.raises(ValueError, match="K contiguous"):  # the [K, N] view itself, not its .t()
        fp8_matmul(torch.zeros(1, 8), w.t(), torch.ones(256))
    with pytest.raises(ValueError, match="one per output channel"):
        fp8_matmul(torch.zeros(1, 256), w, torch.ones(4))
    with pytest.raises(ValueError, match="SPLIT_K one of"):
        fp8_matmul(torch.zeros(1, 256), w, torch.ones(8), config={"BLOCK_N": 16, "BLOCK_K": 128, "SPLIT_K": 3})
