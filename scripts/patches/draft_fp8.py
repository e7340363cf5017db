"""SPEC_DRAFT_FP8=marlin|cutlass: the MTP draft's 16-bit linears, at decode batches (M <= 16), from an FP8 copy on
vLLM's FP8 Marlin kernel (marlin) or on vLLM's CUTLASS FP8 GEMM with per-token FP8 activations (cutlass) (issue 29
item 3: the drafts' share of the step).

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

cutlass: the same copy, one scale a row, transposed for vLLM's CUTLASS GEMM (torch.ops._C.cutlass_scaled_mm, the
kernel of the target's own FP8 layers), and the activations cast to FP8 one scale a token in plain torch ops before
the op (quantize_tokens), so that Inductor fuses the cast into the kernel before it (the norm, the SiLU-and-mul), as it
does for the target's layers. Why: on an H100 the draft's five linears took 0.31 ms a step on FP8 Marlin (session
20261206T0237Z's trace: 20 calls, four passes), and at one row the H100's gemm record
(results/qwen3.5-4b-bf16/20261205T141333Z-gemm.json) times CUTLASS without its cast under Marlin on every shape the
MTP layer has (qkv 14.4 against 15.1 us, o 7.5 against 11.5, gate_up 21.9 against 24.0, down 12.3 against 16.6).
The casts of batches above 16 rows are computed and not used: a few elementwise ops inside kernels that run anyway.

The output is unchanged: the target verifies every draft. A draft token can differ where the copy's rounding moves the
draft's argmax, so acceptance can move; dummy weights cannot show it, your weights can (`make eval-latency`'s
acceptance length beside a run without the key). Where the kernel does not run (no CUDA GPU, or one it does not
support: CUTLASS FP8 needs compute capability 8.9) the draft stays 16-bit and one line says so.

Read at every interpreter's start (sitecustomize.py): torch and vLLM are imported only in the hooks.
"""
from __future__ import annotations

import os
import sys

ENV = "KIT_DRAFT_FP8"
TARGETS = ("vllm.v1.spec_decode.llm_base_proposer", "vllm.v1.worker.gpu.spec_decode.speculator")
_MARK = "_kit_draft_fp8"


FP8_MAX = 448.0  # e4m3's largest magnitude
MODES = ("marlin", "cutlass")


def mode() -> str:
    return os.environ.get(ENV, "off")


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


def quantize_tokens(x):
    """(FP8 e4m3 x, float32 scale [M, 1]): each row (token) scaled so its largest magnitude is e4m3's largest. Plain
    torch ops, traced into the drafter's graph, where Inductor fuses them into the kernel that made x. A zero row
    gets a tiny scale and stays zero."""
    import torch
    scale = (x.abs().amax(dim=-1, keepdim=True).float() / FP8_MAX).clamp(min=1e-12)
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def cutlass_copy(weight, dtype):
    """(FP8 [K, N] column-major, float32 scale [N, 1]) of a 16-bit [N, K] weight, one scale a row, for vLLM's CUTLASS
    GEMM; None where it does not run (no CUDA GPU of compute capability 8.9 or newer). A shape it cannot take (N or
    K not a multiple of 16) raises, and convert() leaves that layer 16-bit."""
    import torch
    from scripts.patches.lm_head_w8 import quantize_rows
    if not weight.is_cuda or torch.cuda.get_device_capability(weight.device) < (8, 9):
        return None
    n, k = weight.shape
    if n % 16 or k % 16:
        raise ValueError(f"{n} x {k}: CUTLASS needs multiples of 16")
    q, scale = quantize_rows(weight, "fp8")
    return q.t(), scale[:, None]


def run_cutlass(layer, xq, xs, bias, dtype):
    """A batch of up to 16 rows: vLLM's CUTLASS FP8 GEMM of the cast activations against the layer's copy."""
    import torch
    w, ws = layer.kit_draft_fp8
    out = torch.empty((xq.shape[0], w.shape[1]), dtype=dtype, device=xq.device)
    torch.ops._C.cutlass_scaled_mm(out, xq, w, xs, ws, bias)
    return out


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


CUTLASS_SCHEMA = "(Tensor x, Tensor xq, Tensor xs, Tensor? bias, int index) -> Tensor"


def _cutlass_op():
    """torch.ops.kit.draft_fp8_cutlass: at M <= 16 the layer's FP8 copy on vLLM's CUTLASS GEMM (the activations cast
    before the op), above it the layer's 16-bit GEMM on x. One op with the branch inside, as decode_gemm's: vLLM
    traces the drafter once for every batch size."""
    import torch
    from scripts.patches import decode_gemm as D
    if not hasattr(torch.ops.kit, "draft_fp8_cutlass"):
        def body(x, xq, xs, bias, index):
            kernel, layer = D._LAYERS[index]
            if x.shape[0] <= D.M_MAX:
                return run_cutlass(layer, xq, xs, bias, x.dtype)
            return kernel.apply_weights(layer, x, bias)

        def fake(x, xq, xs, bias, index):
            kernel, layer = D._LAYERS[index]
            return x.new_empty((x.shape[0], layer.weight.shape[0]))
        torch.library.custom_op("kit::draft_fp8_cutlass", mutates_args=(), schema=CUTLASS_SCHEMA)(body).register_fake(fake)
    return torch.ops.kit.draft_fp8_cutlass


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


class _DraftFP8CutlassMethod(_DraftFP8Method):
    """SPEC_DRAFT_FP8=cutlass: the activations cast in the traced graph, then torch.ops.kit.draft_fp8_cutlass."""

    def apply(self, layer, x, bias=None):
        x2 = x.reshape(-1, x.shape[-1])
        xq, xs = quantize_tokens(x2)
        y = _cutlass_op()(x2, xq, xs, bias, self.index)
        return y.reshape(*x.shape[:-1], y.shape[-1])


def convert(model, how: str | None = None) -> list[str]:
    """Give every 16-bit linear of the draft `model` its FP8 copy and the wrapped method (`how`: marlin or cutlass,
    default $KIT_DRAFT_FP8); the names converted ([] and one line where the kernel does not run). Never an exception
    inside the engine: a failure leaves the rest 16-bit."""
    import torch
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    from scripts.patches import decode_gemm as D
    how = how or mode()
    copy_of, method_cls, kernel = ((cutlass_copy, _DraftFP8CutlassMethod, "CUTLASS") if how == "cutlass"
                                   else (make_copy, _DraftFP8Method, "Marlin"))
    done = []
    for name, mod in model.named_modules():
        method = getattr(mod, "quant_method", None)
        weight = getattr(mod, "weight", None)
        if not isinstance(method, UnquantizedLinearMethod) or not isinstance(weight, torch.Tensor) \
                or weight.dim() != 2 or weight.dtype not in (torch.bfloat16, torch.float16):
            continue
        try:
            copy = copy_of(weight.detach(), weight.dtype)
        except Exception as e:
            print(f"kit: draft FP8 copy NOT made for {name} ({type(e).__name__}: {e}): 16-bit", file=sys.stderr,
                  flush=True)
            continue
        if copy is None:
            print(f"kit: draft FP8 copies NOT made (FP8 {kernel} does not run here): the draft stays 16-bit",
                  file=sys.stderr, flush=True)
            return []
        object.__setattr__(mod, "kit_draft_fp8", copy)  # not a submodule: nothing vLLM loads, offloads or names
        mod.quant_method = method_cls(method, D.remember(_Vllm16(method), mod))
        done.append(name)
    _cutlass_op() if how == "cutlass" else _op()  # registered here, once: the traced forward only calls it
    print(f"kit: draft FP8 {kernel} copies of {len(done)} linears ({', '.join(done[:6])}"
          f"{', ...' if len(done) > 6 else ''}), for drafts up to 16 rows", file=sys.stderr, flush=True)
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
    """Hook both drafters' modules when $KIT_DRAFT_FP8 is "marlin" or "cutlass" (a server imports one of the two)."""
    if mode() not in MODES:
        return "off"
    from scripts.patches.on_import import patch_classes
    for target in TARGETS[1:]:
        patch_classes(target, patch_class, "draft FP8 (V2 runner)", "load_model")
    return patch_classes(TARGETS[0], patch_class, "draft FP8", "load_model")
