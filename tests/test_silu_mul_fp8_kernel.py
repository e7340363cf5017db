"""The kit's SiLU-and-mul + per-token FP8 cast kernel (scripts/patches/silu_mul_fp8_kernel.py) on CPU, under Triton's
interpreter, against vLLM 0.26's eager definition (SiluAndMul then QuantFP8, dynamic per token): decode row counts,
rows split into 1 to 18 blocks (a last block past the row's end too), called twice (the row maxima and counts the
last program puts back), an all-zero row (the scale's floor), and refused inputs. The values are compared just before
the FP8 rounding, which the interpreter does in software (see silu_mul_fp8's docstring); torch's own cast of them
must then equal the reference's FP8 values."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

CHECK = r'''
import os, sys, json
os.environ["TRITON_INTERPRET"] = "1"
import torch
from scripts.patches.silu_mul_fp8_kernel import silu_mul_fp8, reference, row_state, FP8, MIN_SCALE
out = []
for m, d, dt, block, seed, zero_row in json.loads(sys.argv[1]):
    torch.manual_seed(seed)
    x = (torch.randn(m, 2 * d) * 3).to(getattr(torch, dt))
    if zero_row:
        x[0] = 0
    q, s = silu_mul_fp8(x, block=block, out_dtype=torch.float32)
    q2, s2 = silu_mul_fp8(x, block=block, out_dtype=torch.float32)
    rq, rs = reference(x, out_dtype=torch.float32)
    amax, cnt = row_state(x)
    out.append({"scale_rel": ((s - rs).abs() / rs).max().item(), "value_err": (q - rq).abs().max().item(),
                "fp8_equal": torch.equal(q.to(FP8).float(), reference(x)[0].float()),
                "again": torch.equal(q, q2) and torch.equal(s, s2), "reset": bool((amax == 0).all() and (cnt == 0).all()),
                "shape": [list(q.shape), list(s.shape)], "zero_scale": s[0].item() if zero_row else None,
                "min_scale": MIN_SCALE})
print(json.dumps(out))
'''
CASES = [  # rows, D, input dtype, block, seed, first row all zero
    (5, 1000, "float16", 128, 0, False),   # an MTP K=4 verify; 8 blocks, the last past the row's end
    (5, 9216, "float16", 512, 1, False),   # Qwen3.5-4B's MLP width, 18 blocks a row
    (1, 512, "float32", 512, 2, False),    # one block a row
    (3, 700, "float32", 256, 3, True),     # a row of zeros: its scale is the floor, its values 0
]


def run(code: str, arg: str) -> subprocess.CompletedProcess:
    from scripts.kit.paths import ROOT
    return subprocess.run([sys.executable, "-c", code, arg], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_matches_vllms_eager_silu_and_mul_then_per_token_cast():
    r = run(CHECK, json.dumps(CASES))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    for (m, d, *_), row in zip(CASES, rows):
        assert row["shape"] == [[m, d], [m, 1]]
        assert row["scale_rel"] < 1e-5, row
        assert row["value_err"] < 5e-3, row  # of values up to 448: float32 rounding of sigmoid's, not of the cast
        assert row["fp8_equal"], row
        assert row["again"] and row["reset"], row
    assert rows[3]["zero_scale"] == pytest.approx(rows[3]["min_scale"])


REFUSE = r'''
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch
from scripts.patches.silu_mul_fp8_kernel import silu_mul_fp8
for bad, kw in [(torch.randn(4, 7), {}), (torch.randn(8), {}), (torch.randn(8, 4)[:, ::2], {}), (torch.randn(2, 8), {"block": 100})]:
    try:
        silu_mul_fp8(bad, **kw)
        print("accepted")
    except ValueError as e:
        print("refused:", e)
'''


def test_refuses_what_it_cannot_read():
    r = run(REFUSE, "")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 4 and all(line.startswith("refused: silu_mul_fp8:") for line in lines), lines
    assert "unit column stride" in lines[0] and "power of 2" in lines[3]
