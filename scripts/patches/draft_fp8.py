"""SPEC_DRAFT_FP8=marlin: the MTP draft's 16-bit linears, at decode batches (M <= 16), from an FP8 copy on vLLM's FP8
Marlin kernel (issue 29 item 3: the drafts' share of the step).

Why: every kit scheme keeps the MTP head 16-bit (scripts/kit/quant.py: vLLM's MTP draft inherits the target's
quantization config, so the checkpoint must leave mtp.* alone), and on an H200 its linears were most of the four draft
passes' GEMM time after the draft vocabulary's cut (results/qwen3.5-4b-fp8-v2-gdn/20261130T052431Z-profile.json). At one
row the H200's gemm record (results/qwen3.5-4b-bf16/20261129T111821Z-gemm.json) times FP8 Marlin under cuBLAS's
16-bit GEMM for gate_up, qkv and down, the shapes of the MTP layer too.

How: right after the drafter loads its model (V1: vllm/v1/spec_decode/llm_base_proposer.py's proposer; V2:
vllm/v1/worker/gpu/spec_decode/speculator.py's), every module of that model whose quant method is vLLM's
UnquantizedLinearMethod gets an FP8 e4m3 copy of its weight, one scale a row (lm_head_w8.quantize_rows), repacked for
Marlin (fp8_gemm.marlin_copy), and its quant method is wrapped: a batch of up to 16 rows runs Marlin on the copy through
one custom op (torch.ops.kit.draft_fp8, decode_gemm.py's, the branch inside it), a larger one vLLM's 16-bit
GEMM as before. Only the drafter's own model is walked: the target's layers and the lm_head it shares are left alone.
The copies are made at load, before vLLM compiles or captures anything.

The output is unchanged: the target verifies every draft. A draft token can differ where the copy's rounding moves the
draft's argmax, so acceptance can move; dummy weights cannot show it, your weights can (`make eval-latency`'s
acceptance length beside a run without the key). Where FP8 Marlin does not run (no CUDA GPU, or one it does not
support) the draft stays 16-bit and one line says so.

Read at every interpreter's start (sitecustomize.py): torch and vLLM are imported only in the hooks.
"""
from __future__ import annotations

import os
import sys

ENV = "KIT_DRAFT_FP8"
TARGETS = ("vllm.v1.spec_decode.llm_base_proposer", "vllm.v1.worker.gpu.spec_decode.speculator")
_MARK = "_kit_draft_fp8"


def run_copy(layer, x, bias):
    """A batch of up to 16 rows against the layer's FP8 copy (FP8 Marlin)."""
    from scripts.patches.fp8_gemm import marlin_apply
    return marlin_apply(layer.kit_draft_fp8, x, bias)


def make_copy(weight, dtype):
    """The FP8 Marlin copy of a 16-bit [N, K] weight (one scale a row), or None where FP8 Marlin does not run."""
    from scripts.patches.fp8_gemm import marlin_copy
    from scripts.patches.lm_head_w8 import quantize_rows
    n, k = weight.shape
    q, scale = quantize_rows(weight, "fp8")
    return marlin_copy(q, scale, n, k, dtype)


class _Vllm16:
    """A layer's own 16-bit path, for batches above 16 rows (what decode_gemm's op calls on its layer table)."""

    def __init__(self, method):
        self.method = method

    def apply_weights(self, layer, x, bias=None):
        return self.method.apply(layer, x, bias)


def _op():
    """torch.ops.kit.draft_fp8 (decode_gemm's op): at M <= 16 the layer's FP8 copy, above it the layer's 16-bit GEMM."""
    from scripts.patches import decode_gemm as D
    return D.op("draft_fp8", lambda x, weight, scale, group, layer: run_copy(layer, x, None), with_layer=True)


class _DraftFP8Method:
    """Wraps a draft layer's UnquantizedLinearMethod: apply() goes through torch.ops.kit.draft_fp8."""

    def __init__(self, method, index: int):
        self.method, self.index = method, index

    def __getattr__(self, name):  # anything else vLLM asks of the method is the 16-bit method's
        if name == "method":  # not set yet (a copy or unpickling builds the object bare): no recursion
            raise AttributeError(name)
        return getattr(self.method, name)

    def apply(self, layer, x, bias=None):
        x2 = x.reshape(-1, x.shape[-1])
        y = _op()(x2, layer.weight, layer.weight, bias, 0, self.index)
        return y.reshape(*x.shape[:-1], y.shape[-1])


def convert(model) -> list[str]:
    """Give every 16-bit linear of the draft `model` its FP8 copy and the wrapped method; the names converted ([] and
    one line where FP8 Marlin does not run). Never an exception inside the engine: a failure leaves the rest 16-bit."""
    import torch
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    from scripts.patches import decode_gemm as D
    done = []
    for name, mod in model.named_modules():
        method = getattr(mod, "quant_method", None)
        weight = getattr(mod, "weight", None)
        if not isinstance(method, UnquantizedLinearMethod) or not isinstance(weight, torch.Tensor) \
                or weight.dim() != 2 or weight.dtype not in (torch.bfloat16, torch.float16):
            continue
        try:
            copy = make_copy(weight.detach(), weight.dtype)
        except Exception as e:
            print(f"kit: draft FP8 copy NOT made for {name} ({type(e).__name__}: {e}): 16-bit", file=sys.stderr,
                  flush=True)
            continue
        if copy is None:
            print("kit: draft FP8 copies NOT made (FP8 Marlin does not run here): the draft stays 16-bit",
                  file=sys.stderr, flush=True)
            return []
        object.__setattr__(mod, "kit_draft_fp8", copy)  # not a submodule: nothing vLLM loads, offloads or names
        mod.quant_method = _DraftFP8Method(method, D.remember(_Vllm16(method), mod))
        done.append(name)
    _op()  # registered here, once: the traced forward only calls it
    print(f"kit: draft FP8 Marlin copies of {len(done)} linears ({', '.join(done[:6])}{', ...' if len(done) > 6 else ''})"
          ", for drafts up to 16 rows", file=sys.stderr, flush=True)
    return done


def patch_class(cls) -> bool:
    """Wrap cls.load_model (a drafter's) so the model it loads is converted; False when cls defines none or is
    patched already."""
    load = cls.__dict__.get("load_model")
    if load is None or getattr(load, _MARK, False):
        return False

    def load_model(self, *args, **kwargs):
        out = load(self, *args, **kwargs)
        model = getattr(self, "model", None)
        if model is not None:
            convert(model)
        return out

    setattr(load_model, _MARK, True)
    cls.load_model = load_model
    return True


def install() -> str:
    """Hook both drafters' modules when $KIT_DRAFT_FP8 is "marlin" (a server imports one of the two)."""
    if os.environ.get(ENV) != "marlin":
        return "off"
    from scripts.patches.on_import import patch_classes
    for target in TARGETS[1:]:
        patch_classes(target, patch_class, "draft FP8 (V2 runner)", "load_model")
    return patch_classes(TARGETS[0], patch_class, "draft FP8", "load_model")
