"""The draft's greedy pick in one kernel: the argmax of each row of a draft pass's logits over the SPEC_DRAFT_VOCAB set,
mapped through the set's token ids (SPEC_DRAFT_ARGMAX=kit, issue 29 item 3).

Why: after the draft's logits, vLLM's drafter takes `logits.argmax(dim=-1)` and the kit's draft-vocabulary patch maps
the winner to its token id (`ids[...]`), two kernels a draft pass. On an H200 the argmax alone, PyTorch's reduce
kernel over one row of 32832 bfloat16 logits, took 0.0418 ms a step for four passes (about 10 us each,
results/qwen3.5-4b-fp8-v2-gdn/20261130T052431Z-profile.json, kind "sampling" of the draft phase): one row is one
thread block reading 64 KB while the rest of the GPU waits.

How: a program per (row, block of BLOCK logits) finds its block's largest logit and the lowest index holding it,
stores the pair in a workspace, and counts in on the row's counter with an atomic add (acquire-release, as
split_k.gather); the program that counts in last reads every block's pair, keeps the largest (the lowest index on a
tie, as torch.argmax returns the first maximal value), writes that index's token id, and puts the counter back to 0
for the next call, so a CUDA graph replays it. The workspace is made once per device and width, when the draft's rows
are copied at load (`prepare`), never inside a graph capture.

Rows above M_MAX take PyTorch's path. Tested against torch.argmax under Triton's interpreter, ties included
(tests/test_argmax_kernel.py); on a GPU, `make profile` shows the reduce kernel leave.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 2048  # logits a program reads: 17 programs a row for Qwen3.5-4B's 32832-row set
M_MAX = 16  # the draft rows one call takes (as w8a16_kernel.BLOCK_M); larger batches go to torch.argmax
_BUFFERS: dict = {}


def prepare(device, n: int):
    """(float32 block maxima [M_MAX, blocks], int32 their indices, int32 counters [M_MAX]) for logits n wide on
    `device`, made at the first call for that width: call it where the rows are copied, before any capture."""
    key = (torch.device(device), n)
    if key not in _BUFFERS:
        nb = triton.cdiv(n, BLOCK)
        _BUFFERS[key] = (torch.empty(M_MAX, nb, dtype=torch.float32, device=device),
                         torch.empty(M_MAX, nb, dtype=torch.int32, device=device),
                         torch.zeros(M_MAX, dtype=torch.int32, device=device))
    return _BUFFERS[key]


@triton.jit
def _argmax_ids(x_ptr, ids_ptr, out_ptr, pmax_ptr, pidx_ptr, cnt_ptr, N, NB, stride_xm,
                BLOCK: tl.constexpr, NBP: tl.constexpr):
    row = tl.program_id(0)
    blk = tl.program_id(1)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    v = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=float("-inf")).to(tl.float32)
    v = tl.where(v != v, float("inf"), v)  # NaN wins, as in torch.argmax (and no comparison misses every logit)
    best = tl.max(v, axis=0)
    idx = tl.min(tl.where((v == best) & mask, offs, N), axis=0)
    tl.store(pmax_ptr + row * NB + blk, best)
    tl.store(pidx_ptr + row * NB + blk, idx)
    # Every warp's stores out before one thread counts in (the atomic releases only what precedes it).
    tl.debug_barrier()
    if tl.atomic_add(cnt_ptr + row, 1) == NB - 1:
        b = tl.arange(0, NBP)
        bm = b < NB
        pm = tl.load(pmax_ptr + row * NB + b, mask=bm, other=float("-inf"), cache_modifier=".cg")
        pi = tl.load(pidx_ptr + row * NB + b, mask=bm, other=N, cache_modifier=".cg")
        top = tl.max(pm, axis=0)
        win = tl.min(tl.where((pm == top) & bm, pi, N), axis=0)
        tl.store(out_ptr + row, tl.load(ids_ptr + win))
        tl.atomic_xchg(cnt_ptr + row, 0)


def argmax_ids(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """ids[logits.argmax(dim=-1)] for logits [M, N] (M <= M_MAX, one kernel) and ids [N]; larger M: PyTorch's."""
    m, n = logits.shape
    if m > M_MAX or m == 0:
        return ids[logits.argmax(dim=-1)]
    if ids.shape[0] != n:
        raise ValueError(f"argmax_ids: {n} logits a row but {ids.shape[0]} ids")
    pmax, pidx, cnt = prepare(logits.device, n)
    nb = pmax.shape[1]
    x = logits if logits.stride(1) == 1 else logits.contiguous()
    out = torch.empty(m, dtype=ids.dtype, device=logits.device)
    _argmax_ids[(m, nb)](x, ids, out, pmax, pidx, cnt, n, nb, x.stride(0), BLOCK=BLOCK,
                         NBP=triton.next_power_of_2(nb))
    return out
