"""The kit's 8-bit-weight GEMM for decode-sized batches (M <= 16), 16-bit activations (W8A16), in Triton: issue 29
item 2's "W8A16, if it wins". The weights are FP8 (e4m3) or INT8, one scale a row or one a tensor.

Why: the FP8 checkpoint's GEMMs at decode's M reached about half their byte floor on an H100 under vLLM's pick
(CUTLASS, results/qwen3.5-4b-bf16/20261126T160142Z-gemm.json). That path casts the activations to FP8 per token
first, a kernel of its own before every GEMM, and at M <= 8 the FP8 tensor cores buy nothing: the GEMM reads
weights. This one reads the FP8 weights as stored, widens them to the activations' dtype in registers, and
multiplies with 16-bit activations: one kernel a GEMM. The per-channel weight scale (or the one per tensor) is
applied once, to the finished sums. INT8 weights take the same path (every int8 is exact in bfloat16): the kit's
lm_head copy is INT8 (lm_head_w8.py), because at the same bytes it keeps logits far closer than FP8 does.

Layout: weight [N, K] float8_e4m3fn or int8, row-major (vLLM's FP8 layers keep this storage and hand CUTLASS its
transposed view, [K, N] with stride (1, K): pass that view's .t()); weight_scale float32, [N] or [N, 1] per
channel, or one value per tensor.

    from scripts.patches.w8a16_kernel import w8a16_matmul, reference
    y = w8a16_matmul(x, weight, weight_scale)   # x [M, K] 16-bit, y [M, N]

The program layout, the autotuned block sizes and the launch are the W4A16 kernel's (w4a16_kernel.py). Tested
on CPU under Triton's interpreter against `reference` (tests/test_w8a16_kernel.py); timed per shape on the GPU by
`make gemm` (kernel fp8_kit).

A server runs it with FP8_GEMM=kit (scripts/patches/fp8_gemm.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .w4a16_kernel import BLOCK_M, CONFIGS, launch


@triton.jit(do_not_specialize=["M"])  # one compiled kernel for every M (Triton would specialize M == 1)
def _w8_body(x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
              PER_TENSOR: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BM: tl.constexpr):
    pid_n = tl.program_id(0)
    offs_m = tl.arange(0, BM)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc = tl.zeros((BM, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + offs_k
        mask_k = ks < K
        w = tl.load(w_ptr + offs_n[:, None] * stride_wn + ks[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + ks[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        acc += tl.dot(x, tl.trans(w.to(x.dtype)))
    if PER_TENSOR:
        acc = acc * tl.load(s_ptr)
    else:
        acc = acc * tl.load(s_ptr + offs_n, mask=mask_n, other=0.0)[None, :]
    ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


_w8_tuned = triton.autotune(configs=CONFIGS, key=["N", "K"])(_w8_body)
W8_DTYPES = (torch.float8_e4m3fn, torch.int8)


def w8a16_matmul(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                 config: dict | None = None) -> torch.Tensor:
    """y = x @ (W * scale).T for x [M, K] (M <= 16), W [N, K] FP8 (e4m3) or INT8, scale per channel or per tensor."""
    m, k = x.shape
    n = weight.shape[0]
    if m > BLOCK_M:
        raise ValueError(f"w8a16_matmul is for decode batches (M <= {BLOCK_M}), got M={m}")
    if weight.dtype not in W8_DTYPES or weight.shape[1] != k or weight.stride(1) != 1:
        raise ValueError(f"weight: float8_e4m3fn or int8 [N, K] with K contiguous, got {weight.dtype} "
                         f"{tuple(weight.shape)} strides {weight.stride()} for x {tuple(x.shape)}")
    scale = weight_scale.reshape(-1).float()
    if scale.numel() not in (1, n):
        raise ValueError(f"weight_scale: one value or one per output channel ({n}), got {tuple(weight_scale.shape)}")
    x = x.contiguous()
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    launch(_w8_tuned, _w8_body, n, (x, weight, scale, out, m, n, k, x.stride(0), weight.stride(0), out.stride(0)),
           config, PER_TENSOR=scale.numel() == 1)
    return out


def reference(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """Widen in float64 and multiply: what the kernel must compute (FP8 or INT8 weights alike)."""
    s = weight_scale.reshape(-1).to(torch.float64)
    return x.to(torch.float64) @ (weight.to(torch.float64) * (s[:, None] if s.numel() > 1 else s)).T
