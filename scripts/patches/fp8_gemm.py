"""FP8_GEMM=kit: the kit's 8-bit-weight kernel (w8a16_kernel.py) serves FP8 linears at decode's batch sizes (issue 29).

$KIT_FP8_GEMM=1 in the server's processes (Variant.to_env sets it): install() puts `KitFP8Kernel` first in vLLM's
list of FP8 linear kernels, for FP8 weights with one scale a channel or a tensor (the kit's FP8 checkpoint, vLLM's
online FP8). The kernel keeps the one vLLM would have chosen without it, and one custom op, kit::fp8_gemm
(decode_gemm.py), picks between the two at run time: the kit's kernel at M <= 16 tokens, vLLM's choice above.
Block sizes are autotuned per layer shape when the weights load, so no tuning runs inside a CUDA graph capture.
Under a --linear-backend other than auto, vLLM's filter leaves the kernel out.

Why: at the 5-token verify the FP8 checkpoint's GEMMs on vLLM's pick (CUTLASS, after a per-token FP8 cast) read
about half their byte floor on an H100 (results/qwen3.5-4b-bf16/20261126T160142Z-gemm.json). `make gemm` times the
kit's kernel as fp8_kit; this puts it in a server, for `make compare --set-b FP8_GEMM=kit`.

Read at every interpreter's start (sitecustomize.py): torch, Triton and vLLM are imported only in the hook.
Tested on CPU (tests/test_gemm_patches.py): a real vLLM FP8 layer takes the kernel, both sides of the branch
match their references, eager and compiled.
"""
from __future__ import annotations

ENV = "KIT_FP8_GEMM"
TARGET = "vllm.model_executor.kernels.linear"


def _op():
    from scripts.patches import decode_gemm as D
    from scripts.patches.w8a16_kernel import w8a16_matmul
    return D.op("fp8_gemm", lambda x, weight, scale, group: w8a16_matmul(x, weight, scale))


def kernel_class(mod):
    """KitFP8Kernel on `mod`'s (vLLM's kernels.linear) base class and kernel lists."""
    import torch
    from scripts.patches import decode_gemm as D
    from scripts.patches.w8a16_kernel import w8a16_matmul
    from vllm.model_executor.kernels.linear.scaled_mm.ScaledMMLinearKernel import FP8ScaledMMLinearKernel
    op = _op()  # registered here, once: the traced forward only calls it

    class KitFP8Kernel(FP8ScaledMMLinearKernel):
        @classmethod
        def is_supported(cls, compute_capability=None):
            return D.supported("the kit's FP8 kernel", 89)

        @classmethod
        def can_implement(cls, c):
            g = c.weight_quant_key.scale.group_shape
            if not (g.is_per_tensor() or g.is_per_channel()):
                return False, "one weight scale a tensor or a channel only (no blocks or groups)"
            return True, None

        def __init__(self, c, layer_param_names):
            super().__init__(c, layer_param_names)
            import inspect
            rest = {p: [k for k in ks if k is not KitFP8Kernel] for p, ks in mod._POSSIBLE_FP8_KERNELS.items()}
            kw = {"quantization": "fp8_w8a8"} if "quantization" in inspect.signature(
                mod.choose_scaled_mm_linear_kernel).parameters else {}
            self.fallback = mod.choose_scaled_mm_linear_kernel(c, rest, **kw)(c, layer_param_names)

        def process_weights_after_loading(self, layer):
            # The FP8 [N, K] storage, taken before vLLM's kernel may repack it: the scheme hands kernels the
            # transposed [K, N] view.
            n, k = self.config.weight_shape
            w = layer.weight if tuple(layer.weight.shape) == (n, k) else layer.weight.t()
            layer.kit_fp8_weight = w if w.stride(1) == 1 else w.contiguous()
            layer.kit_fp8_scale = layer.weight_scale.detach().reshape(-1).float()
            self.fallback.process_weights_after_loading(layer)
            layer.kit_fp8_index = D.remember(self.fallback, layer)
            if layer.kit_fp8_weight.is_cuda:  # autotune this shape now, never inside a graph capture
                x = torch.zeros(1, k, dtype=self.config.input_dtype, device=layer.kit_fp8_weight.device)
                w8a16_matmul(x, layer.kit_fp8_weight, layer.kit_fp8_scale)

        def apply_scaled_mm(self, **kw):  # abstract in vLLM's base; apply_weights below never calls it
            return self.fallback.apply_scaled_mm(**kw)

        def apply_weights(self, layer, x, bias=None):
            if not isinstance(x, torch.Tensor):  # a quantized activation handed over by a fusion: vLLM's path
                return self.fallback.apply_weights(layer, x, bias)
            x2 = x.reshape(-1, x.shape[-1])
            y = op(x2, layer.kit_fp8_weight, layer.kit_fp8_scale, bias, 0, layer.kit_fp8_index)
            return y.reshape(*x.shape[:-1], y.shape[-1])

    return KitFP8Kernel


def install(target: str = TARGET) -> bool:
    """Put the kit's kernel first in vLLM's list when `target` is imported, if $KIT_FP8_GEMM is "1"."""
    from scripts.patches import decode_gemm as D
    return D.install(ENV, target, "_POSSIBLE_FP8_KERNELS", kernel_class, "FP8 GEMM")
