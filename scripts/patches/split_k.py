"""Split-K inside one kernel, for the kit's decode GEMMs (w8a16_kernel.py, w4a16_il_kernel.py): the programs of a
column block each take every SPLIT_K-th block of K, and the one that finishes last adds their partial sums up.

Why inside the kernel: the usual split-K adds into a zeroed float32 buffer and casts it after, three kernels a GEMM
(memset, GEMM, cast). At decode's M a GEMM of Qwen3.5-4B streams 3-30 us of weights, and each kernel costs a few
microseconds before its bytes count (the 64-row in_proj_ba took 5.4 us in BF16 on an H200,
results/qwen3.5-4b-bf16/20261128T123802Z-gemm.json), so the two extra kernels ate much of what the split gained.

How: each program stores its float32 partial in a workspace [SPLIT_K, BM, N], waits at a barrier for all its warps'
stores, and adds 1 to its column block's count with an atomic add, which orders memory both ways
(acquire-release): the program that reads SPLIT_K - 1 back has every other partial visible, adds them (loads that
bypass L1), puts the count back to 0 for the next call, and is the only one to write the output. Triton's
interpreter runs programs one at a time, so the CPU tests check the sums and the reset, not the ordering; `make
gemm` checks every shape against a float64 reference on the GPU before it times it.

The workspace and counts are kept per device and N and shared by the layers of one shape: that needs their GEMMs to
run one after the other, as a model forward's kernels do on its one stream (vLLM 0.26's dense and hybrid models).
They are made at a shape's first call; the patches make that call when the weights load, eagerly, so a CUDA graph
captured later replays on the same addresses. (Keyed by stream, a capture, which torch runs on a stream of its own,
would find none and make them inside the capture.)
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

SPLITS = (1, 2, 4, 8)
MIN_BLOCK_N = 16  # counts are sized for the smallest column block any config uses
_BUFFERS: dict = {}


def buffers(x: torch.Tensor, n: int, bm: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 partials [max split, bm, n], int32 counts, one a column block), for x's device and this N."""
    key = (x.device, n, bm)
    if key not in _BUFFERS:
        _BUFFERS[key] = (torch.empty(max(SPLITS), bm, n, dtype=torch.float32, device=x.device),
                         torch.zeros(triton.cdiv(n, MIN_BLOCK_N), dtype=torch.int32, device=x.device))
    return _BUFFERS[key]


@triton.jit
def gather(acc, ws_ptr, cnt_ptr, pid_n, pid_k, offs_m, offs_n, mask, N, BM: tl.constexpr, BLOCK_N: tl.constexpr,
           SPLIT_K: tl.constexpr):
    """(the column block's whole sum, whether this program counted in last); the sum is only whole in that one."""
    cell = offs_m[:, None] * N + offs_n[None, :]
    tl.store(ws_ptr + pid_k * BM * N + cell, acc, mask=mask)
    # Every warp's share of the partial stored before one thread counts in: the atomic's release covers only what
    # precedes it, and the other warps' stores precede it only past a barrier.
    tl.debug_barrier()
    last = tl.atomic_add(cnt_ptr + pid_n, 1) == SPLIT_K - 1  # acq_rel: the partial above is out before the count
    total = tl.zeros((BM, BLOCK_N), dtype=tl.float32)
    if last:
        for j in tl.static_range(SPLIT_K):
            total += tl.load(ws_ptr + j * BM * N + cell, mask=mask, other=0.0, cache_modifier=".cg")
        tl.atomic_xchg(cnt_ptr + pid_n, 0)  # ready for the next call: a CUDA graph replays these addresses
    return total, last
