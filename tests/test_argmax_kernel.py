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
