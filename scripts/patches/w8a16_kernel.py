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

A program owns BLOCK_N output columns and every SPLIT_K-th block of K (split_k.py: the partial sums meet inside the
same kernel). With the columns alone (SPLIT_K = 1, the first design), N = 2560 at BLOCK_N 16 is 160 programs, about
one per SM of an H100 or H200, each streaming its rows' whole K: on an H200 that design reached 28.1% of its byte
floor over a Qwen3.5 step at M=1 (results/qwen3.5-4b-bf16/20261128T093522Z-gemm.json), behind CUTLASS's 42.4%.
Splitting K puts 2-8 times as many programs in flight.

Block sizes, split included, are chosen on the GPU by Triton's autotuner per (N, K) among CONFIGS, on the first
call of each shape (a server's warm-up, or `make gemm`'s), never inside a CUDA graph capture. On CPU (Triton's
interpreter, the tests) a config is passed in. Tested there against `reference` (tests/test_w8a16_kernel.py); timed
per shape on the GPU by `make gemm` (kernel fp8_kit).

A server runs it with FP8_GEMM=kit (scripts/patches/fp8_gemm.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .split_k import SPLITS, buffers, gather
from .w4a16_kernel import BLOCK_M

CONFIGS = [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": sk}, num_warps=4, num_stages=3)
           for bn in (16, 32, 64) for bk in (128, 256, 512) for sk in SPLITS if bn * bk <= 16384]


@triton.jit(do_not_specialize=["M"])  # one compiled kernel for every M (Triton would specialize M == 1)
def _w8_body(x_ptr, w_ptr, s_ptr, out_ptr, ws_ptr, cnt_ptr, M, N, K, stride_xm, stride_wn, stride_om,
             PER_TENSOR: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
             BM: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.arange(0, BM)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc = tl.zeros((BM, BLOCK_N), dtype=tl.float32)
    for k0 in range(pid_k * BLOCK_K, K, BLOCK_K * SPLIT_K):
        ks = k0 + offs_k
        mask_k = ks < K
        w = tl.load(w_ptr + offs_n[:, None] * stride_wn + ks[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + ks[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        acc += tl.dot(x, tl.trans(w.to(x.dtype)))
    mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT_K > 1:
        acc, last = gather(acc, ws_ptr, cnt_ptr, pid_n, pid_k, offs_m, offs_n, mask, N, BM, BLOCK_N, SPLIT_K)
        if last:
            _w8_store(acc, s_ptr, out_ptr, offs_m, offs_n, mask_n, mask, stride_om, PER_TENSOR)
    else:
        _w8_store(acc, s_ptr, out_ptr, offs_m, offs_n, mask_n, mask, stride_om, PER_TENSOR)


@triton.jit
def _w8_store(acc, s_ptr, out_ptr, offs_m, offs_n, mask_n, mask, stride_om, PER_TENSOR: tl.constexpr):
    if PER_TENSOR:
        acc = acc * tl.load(s_ptr)
    else:
        acc = acc * tl.load(s_ptr + offs_n, mask=mask_n, other=0.0)[None, :]
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)


_w8_tuned = triton.autotune(configs=CONFIGS, key=["N", "K"])(_w8_body)
W8_DTYPES = (torch.float8_e4m3fn, torch.int8)


def w8a16_matmul(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                 config: dict | None = None) -> torch.Tensor:
    """y = x @ (W * scale).T for x [M, K] (M <= 16), W [N, K] FP8 (e4m3) or INT8, scale per channel or per tensor.
    config: block sizes (BLOCK_N, BLOCK_K, SPLIT_K) for Triton's CPU interpreter or a pinned choice; on a GPU
    without it, the autotuner picks."""
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
    cfg = dict(config or {})
    if cfg.get("SPLIT_K", 1) not in SPLITS or cfg.get("BLOCK_N", 16) % 16:
        raise ValueError(f"config: SPLIT_K one of {SPLITS}, BLOCK_N a multiple of 16, got {config}")
    x = x.contiguous()
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    ws, cnt = buffers(x, n, BLOCK_M)
    args = (x, weight, scale, out, ws, cnt, m, n, k, x.stride(0), weight.stride(0), out.stride(0))
    if config is None and x.is_cuda:
        _w8_tuned[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), meta["SPLIT_K"])](
            *args, PER_TENSOR=scale.numel() == 1, BM=BLOCK_M)
        return out
    cfg = {"BLOCK_N": 16, "BLOCK_K": 128, "SPLIT_K": 1, **cfg}
    extra = {key: cfg[key] for key in ("num_warps", "num_stages") if key in cfg}
    _w8_body[(triton.cdiv(n, cfg["BLOCK_N"]), cfg["SPLIT_K"])](
        *args, PER_TENSOR=scale.numel() == 1, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], SPLIT_K=cfg["SPLIT_K"],
        BM=BLOCK_M, **extra)
    return out


def reference(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """Widen in float64 and multiply: what the kernel must compute (FP8 or INT8 weights alike)."""
    s = weight_scale.reshape(-1).to(torch.float64)
    return x.to(torch.float64) @ (weight.to(torch.float64) * (s[:, None] if s.numel() > 1 else s)).T
