"""The kit's W4A16 GEMM for decode-sized batches (M <= 16), in Triton: issue 29 item 2.

Why: at one to a few sequences decode is a string of weight reads, and 4-bit weights read a quarter of
BF16's bytes; yet vLLM 0.26's W4A16 kernels on an H100 lost to BF16 at MTP's 5-token verify (issue 29),
because at M <= 8 they reach a small share of the memory bandwidth. This kernel reads the weights in
compressed-tensors' own layout (no repacking) and spreads each GEMM over enough programs to keep every
SM streaming: a program owns BLOCK_N output columns and 1/SPLIT_K of the K range, unpacks 8 int4 values
from each int32, applies the group scale, and accumulates with tl.dot over a 16-row tile (rows past M
are masked: the tile costs no extra weight bytes). With SPLIT_K > 1 the partial sums meet in an fp32
buffer by atomic adds.

Layout (compressed-tensors pack-quantized, symmetric int4, as llm-compressor writes it):
  weight_packed [N, K // 8] int32: value j of an int32 is bits 4j..4j+3, the weight at k = 8 * col + j,
                stored as w + 8 (so 0..15);
  weight_scale  [N, K // G] in the activations' dtype: w_real = (q - 8) * scale[n, k // G].

    from scripts.patches.w4a16_kernel import w4a16_matmul, reference
    y = w4a16_matmul(x, weight_packed, weight_scale, group_size=32)   # x [M, K], y [M, N]

Tested on CPU under Triton's interpreter against `reference` (tests/test_w4a16_kernel.py); timed per
shape on the GPU by `make gemm` (kernel w4a16_g32_kit).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_M = 16  # tl.dot's smallest row tile; decode's M (1..8, 1+K) fits in one


@triton.jit
def _w4a16_kernel(x_ptr, w_ptr, s_ptr, out_ptr, M, N, K,
                  stride_xm, stride_wn, stride_sn, stride_om,
                  GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_PER_SPLIT: tl.constexpr,
                  SPLIT_K: tl.constexpr, BM: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.arange(0, BM)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    shifts = tl.arange(0, 8) * 4
    acc = tl.zeros((BM, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * K_PER_SPLIT
    for k0 in range(k_start, k_start + K_PER_SPLIT, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                    mask=mask_m[:, None] & (offs_k[None, :] < K), other=0.0)
        # 8 weights an int32: [BLOCK_N, BLOCK_K // 8] words -> [BLOCK_N, BLOCK_K] nibbles.
        offs_w = k0 // 8 + tl.arange(0, BLOCK_K // 8)
        packed = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_w[None, :],
                         mask=mask_n[:, None] & (offs_w[None, :] < K // 8), other=0)
        q = (packed[:, :, None] >> shifts[None, None, :]) & 0xF
        offs_g = k0 // GROUP + tl.arange(0, BLOCK_K // GROUP)
        s = tl.load(s_ptr + offs_n[:, None] * stride_sn + offs_g[None, :],
                    mask=mask_n[:, None] & (offs_g[None, :] < K // GROUP), other=0.0)
        w = (q - 8).to(tl.float32)
        w = tl.reshape(w, (BLOCK_N, BLOCK_K // GROUP, GROUP)) * s.to(tl.float32)[:, :, None]
        w = tl.reshape(w, (BLOCK_N, BLOCK_K)).to(x.dtype)
        acc += tl.dot(x, tl.trans(w))
    ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT_K == 1:
        tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(ptrs, acc, mask=mask)


def plan(n: int, k: int, group: int, sms: int = 132) -> dict:
    """Block sizes for one shape: enough programs for ~2 waves on `sms` SMs, each streaming at least
    one BLOCK_K step of K. Pure arithmetic (tested)."""
    block_k = max(128, group)
    block_n = 64 if n >= 8192 else 32 if n >= 256 else 16
    programs_n = -(-n // block_n)
    split = 1
    while programs_n * split < 2 * sms and k // (split * 2) >= block_k and (k // (split * 2)) % block_k == 0:
        split *= 2
    return {"BLOCK_N": block_n, "BLOCK_K": block_k, "SPLIT_K": split, "K_PER_SPLIT": k // split}


def w4a16_matmul(x: torch.Tensor, weight_packed: torch.Tensor, weight_scale: torch.Tensor, group_size: int,
                 sms: int | None = None) -> torch.Tensor:
    """y = x @ dequant(W).T for x [M, K] (M <= 16), W in compressed-tensors' int4 layout."""
    m, k = x.shape
    n = weight_packed.shape[0]
    if m > BLOCK_M:
        raise ValueError(f"w4a16_matmul is for decode batches (M <= {BLOCK_M}), got M={m}")
    if k % group_size or weight_packed.shape[1] * 8 != k or weight_scale.shape != (n, k // group_size):
        raise ValueError(f"shapes: x {tuple(x.shape)}, weight_packed {tuple(weight_packed.shape)}, "
                         f"weight_scale {tuple(weight_scale.shape)}, group {group_size}")
    if sms is None:
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 4
    p = plan(n, k, group_size, sms)
    if k % p["BLOCK_K"]:
        raise ValueError(f"K={k} is not a multiple of BLOCK_K={p['BLOCK_K']}")
    x = x.contiguous()
    out = (torch.zeros if p["SPLIT_K"] > 1 else torch.empty)(m, n, dtype=torch.float32 if p["SPLIT_K"] > 1 else x.dtype,
                                                            device=x.device)
    grid = (triton.cdiv(n, p["BLOCK_N"]), p["SPLIT_K"])
    _w4a16_kernel[grid](x, weight_packed, weight_scale, out, m, n, k, x.stride(0), weight_packed.stride(0),
                        weight_scale.stride(0), out.stride(0), GROUP=group_size, BLOCK_N=p["BLOCK_N"],
                        BLOCK_K=p["BLOCK_K"], K_PER_SPLIT=p["K_PER_SPLIT"], SPLIT_K=p["SPLIT_K"], BM=BLOCK_M)
    return out if p["SPLIT_K"] == 1 else out.to(x.dtype)


def pack(q: torch.Tensor) -> torch.Tensor:
    """int4 values in [-8, 7], shape [N, K] -> compressed-tensors' [N, K // 8] int32 (reference packer)."""
    u = (q.to(torch.int64) + 8) & 0xF
    n, k = u.shape
    u = u.view(n, k // 8, 8)
    words = torch.zeros(n, k // 8, dtype=torch.int64, device=q.device)
    for j in range(8):
        words |= u[:, :, j] << (4 * j)
    return (words - ((words >> 31) & 1) * (1 << 32)).to(torch.int32)  # two's complement into int32


def reference(x: torch.Tensor, weight_packed: torch.Tensor, weight_scale: torch.Tensor, group_size: int) -> torch.Tensor:
    """Dequantize in float64 and multiply: what the kernel must compute."""
    w = weight_packed.to(torch.int64) & 0xFFFFFFFF
    q = torch.stack([(w >> (4 * j)) & 0xF for j in range(8)], dim=-1).reshape(w.shape[0], -1) - 8
    scale = weight_scale.to(torch.float64).repeat_interleave(group_size, dim=1)
    return x.to(torch.float64) @ (q.to(torch.float64) * scale).T
