"""The kit's W4A16 GEMM for decode batches, third design: weights repacked so that each slice is a group (issue 29
item 2). Timed by `make gemm` as `w4a16_g32_kit_il`; nothing serves with it yet.

Why a third design. The second one (w4a16_kernel.py) reads compressed-tensors' layout as it is: nibble j of word c
is the weight at k = 8c + j, so each of its 8 dots a step reads x at a stride of 8 (x[m, k0 + 8c + j]), every program
reads all of x again, and each weight is multiplied by a scale gathered per word. On an H200 it reached 7.7% of its
byte floor at M=1 and its time grew with M (6.4 ms a step at M=1, 8.6 at M=8), where every vLLM kernel's time is flat
in M (results/qwen3.5-4b-bf16/20261128T093522Z-gemm.json). That points at the strided reads of x, not the
weights; no profile has shown it yet.

This one repacks the weights once, at load, so that within each block of 256 inputs nibble j of word c is the weight
at k = k0 + 32j + c. Then slice j of a block is 32 consecutive inputs: x_j = x[:, k0 + 32j : k0 + 32j + 32] is one
coalesced read, and at group 32 the slice is exactly one group, so its scale multiplies the dot's [M, BLOCK_N] result,
not each weight. A program owns BLOCK_N output columns and 1/SPLIT_K of the blocks (for N = 2560, whose column blocks
alone leave an H100's or H200's 132 SMs idle); with SPLIT_K > 1 the partial sums meet inside the same kernel
(split_k.py). Until 2026-11-29 they met in a zeroed float32 buffer by atomic adds and a second kernel cast it: three
kernels a GEMM where split, as timed in the record below.

On an H200 (results/qwen3.5-4b-bf16/20261128T123802Z-gemm.json) this design took 2.74 ms a step at M=1 and 2.81 at
M=8 (17.8% of its floor): flat in M, 2.3-3.1 times the second design's speed, still behind Marlin (2.15 ms) and BF16
(2.44 ms). At these sizes a GEMM kernel costs ~5 us before its bytes count (the 64-row in_proj_ba in BF16 took 5.4 us),
near the 4-bit floor of most of the layer's GEMMs: docs/quantization.md says why that caps any kernel per GEMM.

Layout (pack_il): weight_il [N, K // 8] int32, K a multiple of 256; word 32b + c of row n holds, at bits 4j..4j+3,
q[n, 256b + 32j + c] + 8 (q in -8..7). The scales stay compressed-tensors' [N, K // GROUP], GROUP a multiple of 32.

    from scripts.patches.w4a16_il_kernel import pack_il, repack_il, w4a16_il_matmul
    w_il = repack_il(weight_packed)                      # from compressed-tensors' layout, once
    y = w4a16_il_matmul(x, w_il, weight_scale, group_size=32)

Tested on CPU under Triton's interpreter against w4a16_kernel.reference (tests/test_w4a16_il_kernel.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .split_k import buffers, gather
from .w4a16_kernel import BLOCK_M, pack, unpack

IL = 256  # inputs a block: 8 slices of 32, one int32 word per slice column

# Column blocks x split of K; 4 warps. BLOCK_N 16 keeps 160 programs on N = 2560 before any split.
CONFIGS = [triton.Config({"BLOCK_N": bn, "SPLIT_K": sk}, num_warps=w, num_stages=s)
           for bn in (16, 32, 64, 128) for sk in (1, 2, 4) for w in (4,) for s in (2, 4)]


@triton.jit(do_not_specialize=["M"])
def _w4a16_il_body(x_ptr, w_ptr, s_ptr, out_ptr, ws_ptr, cnt_ptr, M, N, K, stride_xm, stride_wn, stride_sn, stride_om,
                   GROUP: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr, BM: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.arange(0, BM)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_c = tl.arange(0, 32)
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc = tl.zeros((BM, BLOCK_N), dtype=tl.float32)
    for k0 in range(pid_k * 256, K, 256 * SPLIT_K):
        words = tl.load(w_ptr + offs_n[:, None] * stride_wn + (k0 // 8 + offs_c)[None, :], mask=mask_n[:, None], other=0)
        for j in tl.static_range(8):
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + (k0 + 32 * j + offs_c)[None, :],
                        mask=mask_m[:, None], other=0.0)
            q = (((words >> (4 * j)) & 0xF) - 8).to(x.dtype)
            s = tl.load(s_ptr + offs_n * stride_sn + (k0 + 32 * j) // GROUP, mask=mask_n, other=0.0).to(tl.float32)
            acc += tl.dot(x, tl.trans(q)) * s[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    out = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    if SPLIT_K == 1:
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        acc, last = gather(acc, ws_ptr, cnt_ptr, pid_n, pid_k, offs_m, offs_n, mask, N, BM, BLOCK_N, SPLIT_K)
        if last:
            tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)


_il_tuned = triton.autotune(configs=CONFIGS, key=["N", "K"])(_w4a16_il_body)


def pack_il(q: torch.Tensor) -> torch.Tensor:
    """int4 values in [-8, 7], shape [N, K] (K a multiple of 256) -> the interleaved [N, K // 8] int32 layout."""
    n, k = q.shape
    if k % IL:
        raise ValueError(f"pack_il: K={k} is not a multiple of {IL}")
    # Block b, slice j, column c -> the standard packer's word 32b + c, value j: reorder k as (b, c, j).
    order = q.view(n, k // IL, 8, 32).transpose(2, 3).reshape(n, k)
    return pack(order)


def repack_il(weight_packed: torch.Tensor) -> torch.Tensor:
    """compressed-tensors' [N, K // 8] int32 -> the interleaved layout of the same weights."""
    return pack_il(unpack(weight_packed))


def unpack_il(weight_il: torch.Tensor) -> torch.Tensor:
    """The interleaved layout back to compressed-tensors' (what the reference reads): read as the standard layout,
    its values come in the order (b, c, j); put them back in (b, j, c)."""
    q = unpack(weight_il)
    n, k = q.shape
    return pack(q.view(n, k // IL, 32, 8).transpose(2, 3).reshape(n, k))


def best_split(config: dict | None) -> int:
    return int((config or {}).get("SPLIT_K", 1))


def w4a16_il_matmul(x: torch.Tensor, weight_il: torch.Tensor, weight_scale: torch.Tensor, group_size: int,
                    config: dict | None = None) -> torch.Tensor:
    """y = x @ dequant(W).T for x [M, K] (M <= 16), W in the interleaved layout (pack_il / repack_il).
    config: block sizes for Triton's CPU interpreter or a pinned choice; on a GPU without it, the autotuner picks."""
    m, k = x.shape
    n = weight_il.shape[0]
    if m > BLOCK_M:
        raise ValueError(f"w4a16_il_matmul is for decode batches (M <= {BLOCK_M}), got M={m}")
    if group_size % 32 or k % IL or k % group_size or weight_il.shape[1] * 8 != k or \
            weight_scale.shape != (n, k // group_size):
        raise ValueError(f"shapes: x {tuple(x.shape)}, weight_il {tuple(weight_il.shape)}, "
                         f"weight_scale {tuple(weight_scale.shape)}, group {group_size} (K a multiple of {IL}, "
                         f"the group of 32)")
    x = x.contiguous()
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    ws, cnt = buffers(x, n, BLOCK_M)
    args = (x, weight_il, weight_scale, out, ws, cnt, m, n, k, x.stride(0), weight_il.stride(0),
            weight_scale.stride(0), out.stride(0))
    if config is None and x.is_cuda:
        _il_tuned[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), meta["SPLIT_K"])](*args, GROUP=group_size, BM=BLOCK_M)
        return out
    chosen = config or {"BLOCK_N": 16, "SPLIT_K": 1}
    extra = {key: chosen[key] for key in ("num_warps", "num_stages") if key in chosen}
    _w4a16_il_body[(triton.cdiv(n, chosen["BLOCK_N"]), best_split(chosen))](
        *args, GROUP=group_size, BLOCK_N=chosen["BLOCK_N"], SPLIT_K=best_split(chosen), BM=BLOCK_M, **extra)
    return out
