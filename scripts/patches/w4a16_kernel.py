"""The kit's W4A16 GEMM for decode-sized batches (M <= 16), in Triton: issue 29 item 2.

Why: at one to a few sequences decode is a string of weight reads, and 4-bit weights read a quarter of
BF16's bytes; yet vLLM 0.26's W4A16 kernels on an H100 lost to BF16 at MTP's 5-token verify (issue 29),
because at M <= 8 they reach a small share of the memory bandwidth. This kernel reads the weights in
compressed-tensors' own layout (no repacking), one kernel a GEMM.

Design, second version (2026-11-27). The first (split-K; each int32 unpacked into a [BLOCK_N, BLOCK_K // 8, 8]
tile and reshaped into K order; partial sums by fp32 atomics, then a cast) reached 16.5% of its byte floor on
the H100 (results/qwen3.5-4b-bf16/20261126T154801Z-gemm.json): three kernels a GEMM, and the reshape moves
every nibble through shared memory. This one never reorders the weights. Nibble j of word c is the weight at
k = 8c + j, so a tile of words gives 8 slices w_j[n, c] = nibble j, and x is read in the same order instead:
x_j[m, c] = x[m, k0 + 8c + j]. The GEMM is then 8 dots of [BM, BLOCK_K // 8] x [BLOCK_K // 8, BLOCK_N] a step,
on words loaded whole and in order. The group scale of word c is scale[n, (k0 + 8c) // GROUP], one gather of a
small tile shared by the 8 slices. A program owns BLOCK_N output columns and the whole of K, and writes them
once: no atomics, no zeroed buffer, no cast.

Block sizes are chosen on the GPU by Triton's autotuner, per (N, K), among CONFIGS, on the first call of each
shape (a server's warm-up, or `make gemm`'s, never inside a CUDA graph capture). On CPU (Triton's interpreter,
the tests) a config is passed in.

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

# What the autotuner tries: narrow column blocks keep enough programs for 132 SMs on N = 2560 (160 programs of 16),
# long K steps keep bytes in flight; BLOCK_K // 8 >= 16 for tl.dot. Shared with the kit's FP8 kernel.
CONFIGS = [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s)
           for bn in (16, 32, 64) for bk in (128, 256, 512) for w in (2, 4) for s in (3,)
           if bn * bk <= 16384]  # 16: each compiles once per kernel and is timed once per (N, K)


@triton.jit(do_not_specialize=["M"])  # one compiled kernel for every M (Triton would specialize M == 1)
def _w4a16_body(x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_sn, stride_om,
                GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BM: tl.constexpr):
    pid_n = tl.program_id(0)
    offs_m = tl.arange(0, BM)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_c = tl.arange(0, BLOCK_K // 8)
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc = tl.zeros((BM, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        words = k0 // 8 + offs_c
        mask_c = words < K // 8
        packed = tl.load(w_ptr + offs_n[:, None] * stride_wn + words[None, :],
                         mask=mask_n[:, None] & mask_c[None, :], other=0)
        s = tl.load(s_ptr + offs_n[:, None] * stride_sn + (words // (GROUP // 8))[None, :],
                    mask=mask_n[:, None] & mask_c[None, :], other=0.0).to(tl.float32)
        for j in tl.static_range(8):
            w = (((packed >> (4 * j)) & 0xF) - 8).to(tl.float32) * s
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + (k0 + 8 * offs_c + j)[None, :],
                        mask=mask_m[:, None] & mask_c[None, :], other=0.0)
            acc += tl.dot(x, tl.trans(w.to(x.dtype)))
    ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


_w4a16_tuned = triton.autotune(configs=CONFIGS, key=["N", "K"])(_w4a16_body)


def launch(tuned, body, n: int, args: tuple, config: dict | None, **const) -> None:
    """One kernel over cdiv(N, BLOCK_N) programs: the autotuned one on a GPU without `config`, else `body` with
    the config's block sizes (Triton's CPU interpreter, or a pinned choice). args: the kernel's positional ones."""
    if config is None and args[0].is_cuda:
        tuned[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)](*args, BM=BLOCK_M, **const)
        return
    cfg = config or {"BLOCK_N": 16, "BLOCK_K": 128}
    extra = {key: cfg[key] for key in ("num_warps", "num_stages") if key in cfg}
    body[(triton.cdiv(n, cfg["BLOCK_N"]),)](*args, BM=BLOCK_M, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
                                            **extra, **const)


def best_config(tuned) -> dict | None:
    """The block sizes the autotuner chose for the shape it ran last (None before any GPU call)."""
    c = getattr(tuned, "best_config", None)
    return None if c is None else {**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages}


def w4a16_matmul(x: torch.Tensor, weight_packed: torch.Tensor, weight_scale: torch.Tensor, group_size: int,
                 config: dict | None = None) -> torch.Tensor:
    """y = x @ dequant(W).T for x [M, K] (M <= 16), W in compressed-tensors' int4 layout."""
    m, k = x.shape
    n = weight_packed.shape[0]
    if m > BLOCK_M:
        raise ValueError(f"w4a16_matmul is for decode batches (M <= {BLOCK_M}), got M={m}")
    if group_size % 8 or k % group_size or weight_packed.shape[1] * 8 != k or weight_scale.shape != (n, k // group_size):
        raise ValueError(f"shapes: x {tuple(x.shape)}, weight_packed {tuple(weight_packed.shape)}, "
                         f"weight_scale {tuple(weight_scale.shape)}, group {group_size}")
    x = x.contiguous()
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    launch(_w4a16_tuned, _w4a16_body, n, (x, weight_packed, weight_scale, out, m, n, k, x.stride(0),
                                          weight_packed.stride(0), weight_scale.stride(0), out.stride(0)),
           config, GROUP=group_size)
    return out


def pack(q: torch.Tensor) -> torch.Tensor:
    """int4 values in [-8, 7], shape [N, K] -> compressed-tensors' [N, K // 8] int32 (reference packer)."""
    u = (q.to(torch.int64) + 8) & 0xF
    n, k = u.shape
    u = u.view(n, k // 8, 8)
    words = torch.zeros(n, k // 8, dtype=torch.int64, device=q.device)
    for j in range(8):
        words |= u[:, :, j] << (4 * j)
    return (words - ((words >> 31) & 1) * (1 << 32)).to(torch.int32)  # two's complement into int32


def unpack(weight_packed: torch.Tensor) -> torch.Tensor:
    """compressed-tensors' [N, K // 8] int32 -> the int4 values [N, K] in [-8, 7] (pack's inverse)."""
    w = weight_packed.to(torch.int64) & 0xFFFFFFFF
    return torch.stack([(w >> (4 * j)) & 0xF for j in range(8)], dim=-1).reshape(w.shape[0], -1) - 8


def reference(x: torch.Tensor, weight_packed: torch.Tensor, weight_scale: torch.Tensor, group_size: int) -> torch.Tensor:
    """Dequantize in float64 and multiply: what the kernel must compute."""
    q = unpack(weight_packed)
    scale = weight_scale.to(torch.float64).repeat_interleave(group_size, dim=1)
    return x.to(torch.float64) @ (q.to(torch.float64) * scale).T
