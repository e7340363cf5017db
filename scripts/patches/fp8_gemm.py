"""FP8_GEMM=kit: the kit's 8-bit-weight kernel (w8a16_kernel.py) serves FP8 linears at decode's batch sizes (issue 29).

$KIT_FP8_GEMM=1 in the server's processes (Variant.to_env sets it): install() puts `KitFP8Kernel` first in vLLM's
list of FP8 linear kernels, for FP8 weights with one scale a channel or a tensor (the kit's FP8 checkpoint, vLLM's
online FP8). The kernel keeps the one vLLM would have chosen without it, and one custom op, kit::fp8_gemm
(decode_gemm.py), picks between the two at run time: the kit's kernel at M <= 16 tokens, vLLM's choice above.
Block sizes are autotuned per layer shape when the weights load, so no tuning runs inside a CUDA graph capture.
Under a --linear-backend other than auto, vLLM's filter leaves the kernel out.

FP8_GEMM=pick ($KIT_FP8_GEMM=pick): each layer, when its weights load on the GPU, times the candidates at
$KIT_FP8_PICK_M rows (Variant.to_env: the verify's 1+K rows, or 1 without speculation) and keeps the fastest for
batches of up to 16 rows: vLLM's own kernel, the kit's, or FP8 Marlin on a repacked copy of the weights (where vLLM's
FP8 Marlin runs; the copy is kept only for layers that pick it). Larger batches keep vLLM's kernel in every layer.
Why: no one kernel wins every shape at 5 rows. On an H200 (results/qwen3.5-4b-bf16/20261129T111821Z-gemm.json)
Marlin beat CUTLASS on gate_up, qkv and in_proj_qkvz, CUTLASS won o_proj and out_proj, the kit's kernel won the
64-row in_proj_ba: about 0.15 ms a Qwen3.5 step between the best per shape and CUTLASS everywhere. The op calls the
graph holds are the same whatever a layer picks (one op, kit::fp8_gemm_pick, the choice read inside it), so a
compile cache baked under one set of picks serves another. Each pick is printed once a shape
("kit: FP8 pick at M=5, N x K: ...").

Why: at the 5-token verify the FP8 checkpoint's GEMMs on vLLM's pick (CUTLASS, after a per-token FP8 cast) read
about half their byte floor on an H100 (results/qwen3.5-4b-bf16/20261126T160142Z-gemm.json). `make gemm` times the
kit's kernel as fp8_kit; this puts it in a server, for `make compare --set-b FP8_GEMM=kit`.

Read at every interpreter's start (sitecustomize.py): torch, Triton and vLLM are imported only in the hook.
Tested on CPU (tests/test_gemm_patches.py): a real vLLM FP8 layer takes the kernel, both sides of the branch
match their references, eager and compiled.
"""
from __future__ import annotations

import os

ENV = "KIT_FP8_GEMM"
PICK_M_ENV = "KIT_FP8_PICK_M"
TARGET = "vllm.model_executor.kernels.linear"
PICK_REPS = 25  # timed calls a candidate, after one untimed: the median is kept
_PICK: dict = {}  # layer index (decode_gemm.remember) -> the kernel it picked for M <= 16
_SHAPES_SAID: set = set()  # (N, K) whose pick was printed


def mode() -> str | None:
    """'kit', 'pick' or None, from $KIT_FP8_GEMM ("1" is kit)."""
    v = os.environ.get(ENV)
    return {"1": "kit", "pick": "pick"}.get(v)


def time_ms(fn, x, reps: int = PICK_REPS) -> float:
    """Median milliseconds of fn(x) over `reps` calls after one untimed: CUDA events on a GPU, the wall clock on a
    CPU."""
    import time
    import torch
    fn(x)
    ts = []
    if x.is_cuda:
        torch.cuda.synchronize(x.device)
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn(x)
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn(x)
            ts.append((time.perf_counter() - t0) * 1e3)
    return sorted(ts)[len(ts) // 2]


def choose(candidates: dict, x, timer=time_ms) -> tuple[str, dict]:
    """The fastest of candidates (name -> fn(x)) at x, and every candidate's time (ms)."""
    times = {name: round(timer(fn, x), 5) for name, fn in candidates.items()}
    return min(times, key=times.get), times


def marlin_copy(weight_nk, scale, n: int, k: int, dtype, logical_widths=()):
    """An FP8 Marlin copy of a layer's [N, K] FP8 weight and its scale, as vLLM's MarlinFP8ScaledMMLinearKernel
    prepares its own layer (prepare_fp8_layer_for_marlin, on a module of its own, so the layer vLLM serves is left as
    it is); None where FP8 Marlin does not run."""
    import torch
    from vllm.model_executor.layers.quantization.utils import marlin_utils_fp8 as MU
    if not weight_nk.is_cuda or not MU.is_fp8_marlin_supported():
        return None
    m = torch.nn.Module()
    m.weight = torch.nn.Parameter(weight_nk.t().contiguous(), requires_grad=False)  # [K, N]: size_k_first
    m.weight_scale = torch.nn.Parameter(scale.detach().clone(), requires_grad=False)
    m.output_size_per_partition, m.input_size_per_partition, m.orig_dtype = n, k, dtype
    m.logical_widths = list(logical_widths)
    MU.prepare_fp8_layer_for_marlin(m, size_k_first=True)
    return m


def marlin_apply(m, x, bias=None):
    from vllm.model_executor.layers.quantization.utils.marlin_utils_fp8 import apply_fp8_marlin_linear
    return apply_fp8_marlin_linear(input=x, weight=m.weight, weight_scale=m.weight_scale, workspace=m.workspace,
                                   size_n=m.output_size_per_partition, size_k=m.input_size_per_partition, bias=bias)


def _pick_op():
    """torch.ops.kit.fp8_gemm_pick: at M <= 16 the layer's pick, else its vLLM kernel. The pick is read inside the op,
    so the traced graph is the same whatever each layer picked."""
    import torch
    from scripts.patches import decode_gemm as D
    from scripts.patches.w8a16_kernel import w8a16_matmul
    if not hasattr(torch.ops.kit, "fp8_gemm_pick"):
        def body(x, weight, scale, bias, group, index):
            kernel, layer = D._LAYERS[index]
            if x.shape[0] <= D.M_MAX:
                p = _PICK.get(index, "vllm")
                if p == "kit":
                    y = w8a16_matmul(x, weight, scale)
                    return y if bias is None else y + bias
                if p == "marlin":
                    return marlin_apply(layer.kit_fp8_marlin, x, bias)
            return kernel.apply_weights(layer, x, bias)

        def fake(x, weight, scale, bias, group, index):
            return x.new_empty((x.shape[0], weight.shape[0]))
        torch.library.custom_op("kit::fp8_gemm_pick", mutates_args=(), schema=D.SCHEMA)(body).register_fake(fake)
    return torch.ops.kit.fp8_gemm_pick


def pick(layer, index: int, fallback, m: int) -> str:
    """Time this layer's candidates at m rows and keep the fastest for M <= 16 (_PICK[index]); a Marlin copy stays on
    the layer only when it won. Printed once a shape."""
    import sys
    import torch
    from scripts.patches.w8a16_kernel import w8a16_matmul
    w, s = layer.kit_fp8_weight, layer.kit_fp8_scale
    n, k = w.shape
    dtype = getattr(layer, "orig_dtype", None) or torch.bfloat16
    x = torch.randn(m, k, dtype=dtype, device=w.device)
    cands = {"vllm": lambda x: fallback.apply_weights(layer, x, None), "kit": lambda x: w8a16_matmul(x, w, s)}
    mar = marlin_copy(w, s, n, k, dtype, getattr(layer, "logical_widths", ()))
    if mar is not None:
        cands["marlin"] = lambda x: marlin_apply(mar, x)
    best, times = choose(cands, x)
    if best == "marlin":
        layer.kit_fp8_marlin = mar
    _PICK[index] = best
    if (n, k) not in _SHAPES_SAID:
        _SHAPES_SAID.add((n, k))
        print(f"kit: FP8 pick at M={m}, {n} x {k}: {best} ("
              + ", ".join(f"{name} {ms:.4f} ms" for name, ms in sorted(times.items(), key=lambda kv: kv[1])) + ")",
              file=sys.stderr, flush=True)
    return best


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
    pick_op = _pick_op()

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
            if mode() == "pick":
                pick(layer, layer.kit_fp8_index, self.fallback, int(os.environ.get(PICK_M_ENV) or 1))

        def apply_scaled_mm(self, **kw):  # abstract in vLLM's base; apply_weights below never calls it
            return self.fallback.apply_scaled_mm(**kw)

        def apply_weights(self, layer, x, bias=None):
            if not isinstance(x, torch.Tensor):  # a quantized activation handed over by a fusion: vLLM's path
                return self.fallback.apply_weights(layer, x, bias)
            x2 = x.reshape(-1, x.shape[-1])
            run = pick_op if mode() == "pick" else op
            y = run(x2, layer.kit_fp8_weight, layer.kit_fp8_scale, bias, 0, layer.kit_fp8_index)
            return y.reshape(*x.shape[:-1], y.shape[-1])

    return KitFP8Kernel


def install(target: str = TARGET) -> bool:
    """Put the kit's kernel first in vLLM's list when `target` is imported, if $KIT_FP8_GEMM is "1" or "pick"."""
    from scripts.patches import decode_gemm as D
    return D.install(ENV, target, "_POSSIBLE_FP8_KERNELS", kernel_class, "FP8 GEMM", {
        "1": "the kit's Triton kernel at M <= 16, vLLM's choice above",
        "pick": "at M <= 16 each layer's fastest of vLLM's kernel, the kit's and FP8 Marlin (timed as it loads), "
                "vLLM's choice above"})
