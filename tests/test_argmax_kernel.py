"""The draft's one-kernel argmax (scripts/patches/argmax_kernel.py) on CPU, under Triton's interpreter, against
ids[torch.argmax]: widths past a whole block and under one, ties inside a block and across blocks (torch returns the
first maximal value, so must the kernel), -inf rows, NaN (torch's maximum), rows further apart than the width, called
twice on the same workspace (the counters it leaves behind), and more rows than one call takes (PyTorch's path). The interpreter runs
programs one at a time, so this checks the picks and the reset, not the ordering between programs; on a GPU
`make profile` shows which kernel ran."""
from __future__ import annotations

import json
import subprocess
import sys

CHECK = r'''
import os, sys, json
os.environ["TRITON_INTERPRET"] = "1"
import torch
from scripts.patches.argmax_kernel import argmax_ids, BLOCK
out = []
for m, n, kind, seed in json.loads(sys.argv[1]):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, n + 8, generator=g)[:, :n]  # rows further apart than n
    if kind == "ties":  # few distinct values: many ties, inside and across blocks
        x = torch.randint(0, 3, (m, n), generator=g).float()
    elif kind == "late_tie":  # the maximum twice, in the last block and in the first: the first must win
        x[:, n - 1] = 10.0
        x[:, 3] = 10.0
    elif kind == "neg_inf":
        x[:] = float("-inf")
    elif kind == "nan":  # torch.argmax takes the first NaN as the maximum
        x[:, n // 2] = float("nan")
        x[:, n - 3] = float("nan")
    ids = torch.randperm(n, generator=g) + 1000
    want = ids[x.argmax(dim=-1)]
    got = argmax_ids(x, ids)
    again = argmax_ids(x, ids)
    out.append({"equal": bool(torch.equal(got, want)), "again": bool(torch.equal(again, want)),
                "dtype": str(got.dtype), "shape": list(got.shape), "blocks": -(-n // BLOCK)})
print(json.dumps(out))
'''
CASES = [  # rows, width, values, seed
    (1, 4500, "randn", 1),       # three blocks, the last one partial
    (5, 2048, "randn", 2),       # one whole block, the MTP K=4 verify's rows
    (3, 100, "randn", 3),        # under one block
    (4, 6000, "ties", 4),
    (2, 5000, "late_tie", 5),
    (2, 3000, "neg_inf", 6),     # torch picks index 0
    (2, 5000, "nan", 8),         # NaN in two blocks: the first one
    (20, 300, "randn", 7),       # more rows than one call takes: PyTorch's path
]


def test_picks_the_same_token_ids_as_torch_argmax():
    from scripts.kit.paths import ROOT
    r = subprocess.run([sys.executable, "-c", CHECK, json.dumps(CASES)], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-3000:]
    outs = json.loads(r.stdout.strip().splitlines()[-1])
    assert outs[0]["blocks"] == 3 and outs[2]["blocks"] == 1  # the cases reach what they say they do
    for case, out in zip(CASES, outs):
        assert out["equal"] and out["again"], (case, out)
        assert out["dtype"] == "torch.int64" and out["shape"] == [case[0]], (case, out)


def test_refuses_ids_of_another_width():
    import pytest
    torch = pytest.importorskip("torch")
    from scripts.patches.argmax_kernel import argmax_ids
    with pytest.raises(ValueError, match="100 logits a row but 99 ids"):
        argmax_ids(torch.zeros(1, 100), torch.arange(99))


W8_THEN_ARGMAX = r'''
import os, json
os.environ["TRITON_INTERPRET"] = "1"
import torch
from scripts.patches.draft_vocab import trimmed_argmax
from scripts.patches.lm_head_w8 import quantize_rows
g = torch.Generator().manual_seed(21)
rows = torch.randn(2100, 64, generator=g).half()  # the interpreter has no bfloat16; a server's logits are 16-bit too
ids = torch.randperm(2100, generator=g) + 5
w8 = quantize_rows(rows, "int8")
out = []
for n in (1, 5, 16):
    h = torch.randn(n, 64, generator=g).half()
    both = trimmed_argmax(h, rows, ids, w8, fast=True)   # SPEC_DRAFT_VOCAB_W8=int8 with SPEC_DRAFT_ARGMAX=kit
    w8_only = trimmed_argmax(h, rows, ids, w8, fast=False)
    out.append({"n": n, "equal": bool(torch.equal(both, w8_only)), "dtype": str(both.dtype)})
print(json.dumps(out))
'''


def test_the_int8_draft_rows_logits_through_the_kernel_pick_what_torch_argmax_picks():
    """SPEC_DRAFT_VOCAB_W8=int8 and SPEC_DRAFT_ARGMAX=kit together (qwen3.5-4b-fp8-v3): the W8A16 kernel's 16-bit
    logits go straight into the argmax kernel, which must pick the ids torch.argmax picks on the same logits (16-bit
    logits hold many exact ties, which the first index must win), at the draft sizes a step has."""
    from scripts.kit.paths import ROOT
    r = subprocess.run([sys.executable, "-c", W8_THEN_ARGMAX], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-3000:]
    outs = json.loads(r.stdout.strip().splitlines()[-1])
    assert [o["n"] for o in outs] == [1, 5, 16]
    for o in outs:
        assert o["equal"] and o["dtype"] == "torch.int64", o
