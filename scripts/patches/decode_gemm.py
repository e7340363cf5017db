"""The run-time branch both kit GEMM patches share (fp8_gemm.py, w4a16_gemm.py): one custom op a weight kind,
kit::<name>, that sends a decode batch (M <= 16 tokens) to the kit's Triton kernel and a larger one to the kernel
vLLM chose for that layer. The branch sits inside an op because vLLM traces its compiled graph once for every
batch size: a Python branch on M in the traced code would be decided once, at the trace. Each layer's own vLLM
kernel is found by the index its op call carries.

Imported by the patches' install(), at every interpreter's start where a switch is on: torch and vLLM are imported
only inside its functions, in the import hook.
"""
from __future__ import annotations

import os

SCHEMA = "(Tensor x, Tensor weight, Tensor scale, Tensor? bias, int group, int index) -> Tensor"
M_MAX = 16  # the kit's kernels' row tile (w4a16_kernel.BLOCK_M)
_LAYERS: list = []  # (vLLM's kernel, layer), by the index each layer's op call carries
_SMALL: dict = {}  # op name -> fn(x, weight, scale, group) for M <= M_MAX


def remember(kernel, layer) -> int:
    """The index a layer's op calls carry, to find its vLLM kernel for large batches."""
    _LAYERS.append((kernel, layer))
    return len(_LAYERS) - 1


def op(name: str, small, with_layer: bool = False):
    """torch.ops.kit.<name>, registered once a process: small(x, weight, scale, group) at M <= 16 (with_layer:
    small(x, weight, scale, group, layer), for a kernel that keeps what it reads on the layer), else the layer's
    vLLM kernel."""
    import torch
    _SMALL[name] = (small, with_layer)
    if not hasattr(torch.ops.kit, name):
        def body(x, weight, scale, bias, group, index):
            kernel, layer = _LAYERS[index]
            if x.shape[0] <= M_MAX:
                fn, needs_layer = _SMALL[name]
                y = fn(x, weight, scale, group, layer) if needs_layer else fn(x, weight, scale, group)
                return y if bias is None else y + bias
            return kernel.apply_weights(layer, x, bias)

        def fake(x, weight, scale, bias, group, index):
            return x.new_empty((x.shape[0], weight.shape[0]))
        torch.library.custom_op(f"kit::{name}", mutates_args=(), schema=SCHEMA)(body).register_fake(fake)
    return getattr(torch.ops.kit, name)


def put_first(table: dict, cls) -> None:
    """cls first in a vLLM kernel table's CUDA and CPU lists (on a CPU it applies only under Triton's interpreter)."""
    for platform, kernels in table.items():
        if platform.name in ("CUDA", "CPU") and not any(k.__name__ == cls.__name__ for k in kernels):
            kernels.insert(0, cls)


def install(env: str, target: str, table: str, kernel_class, what: str, how: dict | None = None) -> bool:
    """A GEMM patch's install(): when $env is one of `how`'s keys ("1" by default), put kernel_class(vLLM's
    kernels.linear) first in its `table` (a kernel list by platform) as soon as `target` is imported (now, if it
    already is), and say what it does (`how`'s value)."""
    how = how or {"1": "the kit's Triton kernel at M <= 16, vLLM's choice above"}
    said = how.get(os.environ.get(env, ""))
    if said is None:
        return False
    import sys
    from scripts.patches.on_import import after_import

    def patch(mod):
        put_first(getattr(mod, table), kernel_class(mod))
        print(f"kit: {what}: {said}", file=sys.stderr, flush=True)
    after_import(target, patch)
    return True


def supported(what: str, cc: int) -> tuple[bool, str | None]:
    """Where the kit's Triton kernels run: a CUDA GPU of compute capability `cc` or newer, or Triton's CPU
    interpreter (the tests)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True, None
    from vllm.platforms import current_platform
    if not current_platform.is_cuda() or not current_platform.has_device_capability(cc):
        return False, f"{what} runs in Triton on CUDA, compute capability {cc // 10}.{cc % 10} or newer"
    return True, None
