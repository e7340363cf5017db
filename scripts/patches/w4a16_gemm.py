"""W4A16_GEMM=kit: the kit's W4A16 kernel (w4a16_kernel.py) serves compressed-tensors int4 linears at decode's batch
sizes (issue 29 item 2: "a kit-carried W4A16 kernel for small M ... behind a switch ... measured end to end").

$KIT_W4A16_GEMM=1 in the server's processes (Variant.to_env sets it): install() puts `KitW4A16Kernel` first in
vLLM's list of mixed-precision linear kernels, for symmetric int4 weights in groups (the kit's AWQ checkpoints: no
zero points, no activation order). The kernel keeps the one vLLM would have chosen without it (Marlin or Machete on
a Hopper GPU), and one custom op, kit::w4a16_gemm (decode_gemm.py), picks between the two at run time: the kit's
kernel at M <= 16 tokens, vLLM's above. vLLM's kernels repack the weights for themselves, so the layer keeps the
checkpoint's packed int4 and scales beside them: the int4 weights are held twice (1.27 GB more for
Qwen3.5-4B's MLPs at group 32: 32 layers x 3 x 2560 x 9216 weights at 4 bits, with their scales). Block sizes
are autotuned per layer shape when the weights load, never inside a CUDA graph capture. Under a --linear-backend
other than auto, vLLM's filter leaves the kernel out.

Read at every interpreter's start (sitecustomize.py): torch, Triton and vLLM are imported only in the hook.
Tested on CPU (tests/test_gemm_patches.py): a real vLLM compressed-tensors W4A16 layer takes the kernel, and
both sides of the branch match their references, eager and compiled.
"""
from __future__ import annotations

ENV = "KIT_W4A16_GEMM"
TARGET = "vllm.model_executor.kernels.linear"


def _op():
    from scripts.patches import decode_gemm as D
    from scripts.patches.w4a16_kernel import w4a16_matmul
    return D.op("w4a16_gemm", lambda x, packed, scale, group: w4a16_matmul(x, packed, scale, group))


def kernel_class(mod):
    """KitW4A16Kernel on `mod`'s (vLLM's kernels.linear) base class and kernel lists."""
    import torch
    from scripts.patches import decode_gemm as D
    from scripts.patches.w4a16_kernel import w4a16_matmul
    from vllm.model_executor.kernels.linear.mixed_precision.MPLinearKernel import MPLinearKernel
    from vllm.scalar_type import scalar_types
    op = _op()  # registered here, once: the traced forward only calls it

    class KitW4A16Kernel(MPLinearKernel):
        @classmethod
        def get_min_capability(cls) -> int:
            return 80  # tl.dot on 16-bit tiles

        @classmethod
        def can_implement(cls, c):
            ok, why = D.supported("the kit's W4A16 kernel", 80)
            if not ok:
                return ok, why
            if c.weight_type != scalar_types.uint4b8 or c.zero_points or getattr(c, "has_g_idx", False):
                return False, "symmetric int4 (uint4b8) without zero points or activation order only"
            k = c.partition_weight_shape[0]
            if c.group_size == -1 or c.group_size % 8 or k % c.group_size:
                return False, f"groups of a multiple of 8 that divide K ({k}), got {c.group_size}"
            return True, None

        def __init__(self, c, *args, **kwargs):  # the parameter names (0.32 dropped the g_idx one)
            super().__init__(c, *args, **kwargs)
            # vLLM's own choice: the same search with this kernel out of its list for the moment.
            kernels = mod._POSSIBLE_KERNELS.get(mod.current_platform._enum, [])
            i = kernels.index(KitW4A16Kernel)
            kernels.pop(i)
            try:
                chosen = mod.choose_mp_linear_kernel(c)
            finally:
                kernels.insert(i, KitW4A16Kernel)
            self.fallback = chosen(c, *args, **kwargs)

        def process_weights_after_loading(self, layer):
            # The checkpoint's [N, K // 8] int32 words and [N, K // G] scales, kept before vLLM's kernel repacks them.
            layer.kit_w4_packed = getattr(layer, self.w_q_name).data
            layer.kit_w4_scale = getattr(layer, self.w_s_name).data
            self.fallback.process_weights_after_loading(layer)
            layer.kit_w4_index = D.remember(self.fallback, layer)
            if layer.kit_w4_packed.is_cuda:  # autotune this shape now, never inside a graph capture
                x = torch.zeros(1, self.config.partition_weight_shape[0], dtype=self.config.act_type,
                                device=layer.kit_w4_packed.device)
                w4a16_matmul(x, layer.kit_w4_packed, layer.kit_w4_scale, self.config.group_size)

        def apply_weights(self, layer, x, bias=None):
            x2 = x.reshape(-1, x.shape[-1])
            y = op(x2, layer.kit_w4_packed, layer.kit_w4_scale, bias, self.config.group_size, layer.kit_w4_index)
            return y.reshape(*x.shape[:-1], y.shape[-1])

    return KitW4A16Kernel


def install(target: str = TARGET) -> bool:
    """Put the kit's kernel first in vLLM's list when `target` is imported, if $KIT_W4A16_GEMM is "1"."""
    from scripts.patches import decode_gemm as D
    return D.install(ENV, target, "_POSSIBLE_KERNELS", kernel_class, "W4A16 GEMM")
