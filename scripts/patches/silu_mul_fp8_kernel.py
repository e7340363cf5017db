"""SiLU-and-mul with its per-token FP8 cast in one Triton kernel whose rows are split across programs (issue 29, the
H100 step). A kernel only, and no key serves it: on an H100 it was no faster than the kernel Inductor makes of the
same two ops (`.ci/inductor_tune_probe.py`, results/gpu-sessions/20261205T1702Z/README.md: 4.84-5.23 us against
5.13 at 5 x 18432). The time is the chain of a launch, a read, a row-wide maximum and a write, which more programs do
not shorten. It stays as the probe's measured alternative; the lever left is fusing such kernels away.

Why: in a Qwen3.5-4B FP8 verify step (5 rows) each MLP's SiLU-and-mul and the FP8 cast of its output for the down
GEMM compile to one Inductor kernel with one program a row: 5 programs read 5 x 18432 16-bit values. On an H100 that
kernel took ~4.7 us, 32 times a step (the trace of session 20261205T1617Z, results/profiles/20261205T163235Z-...),
for 0.23 MB: latency, and 5 of 132 SMs. A per-token cast needs the row's largest value before it writes any of the
row, which is why Inductor keeps a row in one program.

How: a row is split into CHUNKS blocks, one program each (M x CHUNKS programs). Each program computes its block of
silu(gate) * up, rounded to the input's dtype as vLLM's SiluAndMul returns it, stores it to a workspace, folds the
block's largest |value| into the row's with an atomic max, then counts itself in with an atomic add (acquire-release,
as scripts/patches/split_k.py's gather). The program that counts in last reads the whole row back from the workspace
(written moments ago: L2), computes the scale as vLLM's QuantFP8 does for a dynamic per-token cast
(max(amax / FP8_MAX, 1 / (FP8_MAX * 512))), writes the row's FP8 values and its scale, and puts the row's count and
maximum back to 0 for the next call (a CUDA graph replays the same addresses). Triton's interpreter runs programs one
at a time, so the CPU tests check the values and the reset, not the ordering.

Output: what vLLM's SiluAndMul.forward_native then QuantFP8.forward_native (per token, dynamic) compute, in eager
order: the product rounded to the input dtype before the maximum and the cast. Inductor's fused kernel keeps the
product in float32 there, so the two can differ by that rounding.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)
MIN_SCALE = 1.0 / (FP8_MAX * 512.0)  # vLLM 0.26's _FP8_MIN_SCALING_FACTOR
_ROWS: dict = {}  # (device, rows) -> (float32 row maxima, int32 row counts), zeroed once, put back by the kernel


@triton.jit
def _silu_mul_fp8_body(x_ptr, out_ptr, scale_ptr, ws_ptr, amax_ptr, cnt_ptr, D, stride_x, stride_o,
                       FP8_MAX: tl.constexpr, MIN_SCALE: tl.constexpr, BLOCK: tl.constexpr, CHUNKS: tl.constexpr,
                       ROW: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    offs = c * BLOCK + tl.arange(0, BLOCK)
    mask = offs < D
    xr = x_ptr + row.to(tl.int64) * stride_x
    g = tl.load(xr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(xr + D + offs, mask=mask, other=0.0).to(tl.float32)
    # SiluAndMul's eager order: silu(gate) in the input's dtype, then the product in it
    s = (g * tl.sigmoid(g)).to(ws_ptr.dtype.element_ty).to(tl.float32)
    y = (s * u).to(ws_ptr.dtype.element_ty)
    tl.store(ws_ptr + row.to(tl.int64) * D + offs, y, mask=mask)
    tl.atomic_max(amax_ptr + row, tl.max(tl.abs(y.to(tl.float32)), axis=0))
    # Every warp's stores and its share of the maximum out before one thread counts in (split_k.gather's reasoning).
    tl.debug_barrier()
    if tl.atomic_add(cnt_ptr + row, 1) == CHUNKS - 1:  # acq_rel: every other block's store and maximum are visible
        amax = tl.atomic_max(amax_ptr + row, 0.0)  # the row's maximum, read atomically (nothing is below 0)
        scale = tl.maximum(amax / FP8_MAX, MIN_SCALE)
        inv = 1.0 / scale
        all_offs = tl.arange(0, ROW)
        all_mask = all_offs < D
        yr = tl.load(ws_ptr + row.to(tl.int64) * D + all_offs, mask=all_mask, other=0.0, cache_modifier=".cg")
        q = tl.clamp(yr.to(tl.float32) * inv, -FP8_MAX, FP8_MAX)
        tl.store(out_ptr + row.to(tl.int64) * stride_o + all_offs, q.to(out_ptr.dtype.element_ty), mask=all_mask)
        tl.store(scale_ptr + row, scale)
        tl.store(amax_ptr + row, 0.0)  # the last program of the row: no one else writes these until the next call
        tl.atomic_xchg(cnt_ptr + row, 0)


def row_state(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 row maxima, int32 row counts) for x's device, at least x's rows, zero between calls. Made at the
    first call of a size, eagerly, so a CUDA graph captured later replays on the same addresses."""
    rows = max(16, triton.next_power_of_2(x.shape[0]))
    key = (x.device, rows)
    if key not in _ROWS:
        _ROWS[key] = (torch.zeros(rows, dtype=torch.float32, device=x.device),
                      torch.zeros(rows, dtype=torch.int32, device=x.device))
    return _ROWS[key]


def silu_mul_fp8(x: torch.Tensor, *, block: int = 512, num_warps: int = 4,
                 out_dtype: torch.dtype = FP8) -> tuple[torch.Tensor, torch.Tensor]:
    """(FP8 [M, D], float32 scales [M, 1]) of silu(x[:, :D]) * x[:, D:], D = x.shape[1] // 2, cast per row.
    out_dtype=torch.float32 keeps the scaled, clamped values before the FP8 rounding: the CPU tests compare those,
    because Triton's interpreter rounds to FP8 in software and drops the carry when a value rounds up to a power of
    two (7.98 becomes 4, not 8), which the GPU's conversion does not."""
    if x.dim() != 2 or x.shape[1] % 2 or x.stride(1) != 1:
        raise ValueError(f"silu_mul_fp8: x must be [M, 2*D] with unit column stride, got {list(x.shape)} "
                         f"strides {x.stride()}")
    if block & (block - 1):
        raise ValueError(f"silu_mul_fp8: block must be a power of 2, got {block}")
    m, d = x.shape[0], x.shape[1] // 2
    out = torch.empty(m, d, dtype=out_dtype, device=x.device)
    scale = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    if m == 0:
        return out, scale
    ws = torch.empty(m, d, dtype=x.dtype, device=x.device)
    amax, cnt = row_state(x)
    chunks = triton.cdiv(d, block)
    _silu_mul_fp8_body[(m, chunks)](x, out, scale, ws, amax, cnt, d, x.stride(0), out.stride(0), FP8_MAX=FP8_MAX,
                                    MIN_SCALE=MIN_SCALE, BLOCK=block, CHUNKS=chunks,
                                    ROW=triton.next_power_of_2(d), num_warps=num_warps)
    return out, scale


def reference(x: torch.Tensor, out_dtype: torch.dtype = FP8) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM 0.26's SiluAndMul.forward_native, then QuantFP8.forward_native for a dynamic per-token cast, eagerly
    (out_dtype=torch.float32: the values just before the FP8 cast)."""
    d = x.shape[-1] // 2
    y = torch.nn.functional.silu(x[..., :d]) * x[..., d:]
    x_max = y.abs().max(dim=-1).values.unsqueeze(-1).to(torch.float32)
    scale = (x_max / FP8_MAX).clamp(min=MIN_SCALE)
    out = (y.to(torch.float32) * scale.reciprocal()).clamp(-FP8_MAX, FP8_MAX).to(out_dtype)
    return out, scale
