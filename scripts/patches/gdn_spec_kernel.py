"""The kit's Gated DeltaNet verify kernel for a step of speculative decoding (issue 29 item 3): the gated delta-rule
recurrence over each sequence's 1 + K tokens, reading q, k and v straight from the layer's packed conv output and
writing straight into the layer's output buffer.

Why: in vLLM 0.26 a Qwen3.5 GDN layer's verify step (MTP K=4: 5 tokens a sequence) splits the packed conv output
[T, q + k + v] into three contiguous tensors (four eager copy kernels: three strided reshapes and a concatenation),
runs the recurrence into a new tensor, and copies that into the output buffer (a fifth). Five copy kernels a layer,
24 GDN layers: ~120 of the step's kernels. The H200 profile of the FP8 V2 step
(results/qwen3.5-4b-fp8-v2/20261128T210452Z-profile.json) has 0.22 ms of copy kernels a step, and the step is ~4.0
ms of GPU work. vLLM 0.32 removed them with a CUDA kernel that reads the packed tensor
(`fused_gdn_decode_post_conv_mtp`, vllm-project/vllm#51674); 0.26's wheel lacks it. This is that idea in Triton,
for the recurrence only (the gated RMSNorm after it stays vLLM's).

The arithmetic is vLLM's `fused_sigmoid_gating_delta_rule_update` for spec decoding (its FLA-derived Triton kernel),
token by token in float32: g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b), q and k L2-normalized and q
scaled, h = h * exp(g); v' = beta * (v - h k); h += v' k^T; o = h q. The state a sequence starts from is the slot
its last accepted token wrote (state_indices[n, num_accepted[n] - 1]); after each token t the state goes to slot
state_indices[n, t] (slot 0, vLLM's null block, is not written). A sequence whose starting slot is 0 or less (a
padded row of a CUDA graph) is skipped, its output rows left as they were, as vLLM's kernel skips it. With
zero_skipped (GDN_IN_PROJ=fused_lean, whose output buffer is not zero-filled first) those rows, and the rows past the
last sequence's end, are written with zeros instead: what vLLM's zero-filled buffer would have held there.

Layout (vLLM's): x [T, 2*H*K + HV*V] (q heads, then k heads, then v heads, a row a token; rows may be strided);
a, b [T, HV]; A_log, dt_bias [HV]; state [slots, HV, V, K]; state_indices [N, L] int; num_accepted [N] int;
cu_seqlens [N + 1] int; out [T, HV, V] (rows may be strided).

    from scripts.patches.gdn_spec_kernel import gdn_spec_packed, reference
    gdn_spec_packed(x, a, b, A_log, dt_bias, state, state_indices, num_accepted, cu_seqlens, out,
                    num_k_heads=H, head_k_dim=K, head_v_dim=V)

Tile: a program owns BV of a v head's V values (the state rows it updates, [BV, K] in registers) and runs on
num_warps warps; 32 x 4 by default. $KIT_GDN_SPEC_TILE ("BVxWARPS", the variant key GDN_SPEC_TILE) sets another for
a measurement, and $KIT_GDN_SPEC_OVERLAP=1 (GDN_SPEC_OVERLAP=on) a loop that asks for the next token's inputs
while this one computes and takes both reductions over the state from the state before the token's update
(o = d (h q) + v' (k . q), the same arithmetic in another order). Why: on an H200 the 24 layers' calls took 0.2515 ms
a step at the Qwen3.5 step's 5 tokens (results/qwen3.5-4b-fp8-v2-gdn/20261130T051957Z-profile.json), about four times
what the state they read and write (one slot in, one out a token) takes at the GPU's bandwidth by my count: the time
is the token loop's latency. Fewer warps keep the reductions over K inside a warp, a narrower BV puts more programs in
flight.

Tested on CPU under Triton's interpreter (tests/test_gdn_spec_kernel.py) against vLLM's own kernel source, run the
same way on q, k and v split out as vLLM splits them, and against `reference`. A server runs it with
GDN_SPEC_PACKED=on (scripts/patches/gdn_spec_packed.py).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

TILE_ENV = "KIT_GDN_SPEC_TILE"
DEFAULT_TILE = (32, 4)  # (BV, num_warps); the schema's GDN_SPEC_TILE default says the same


OVERLAP_ENV = "KIT_GDN_SPEC_OVERLAP"  # "1": the variant key GDN_SPEC_OVERLAP=on
_ENV: list = []  # the process's (tile, overlap), read from the environment once (a piecewise-graph step calls per layer)


def _env() -> tuple[tuple[int, int], bool]:
    if not _ENV:
        _ENV.append((parse_tile(os.environ[TILE_ENV]) if os.environ.get(TILE_ENV) else DEFAULT_TILE,
                     os.environ.get(OVERLAP_ENV) == "1"))
    return _ENV[0]


def parse_tile(text: str) -> tuple[int, int]:
    """"BVxWARPS" -> (BV, num_warps): BV a power of two from 8 to 128, warps 1, 2, 4 or 8."""
    try:
        bv, w = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"{TILE_ENV}={text!r}: want BVxWARPS, e.g. 32x4") from None
    if bv not in (8, 16, 32, 64, 128) or w not in (1, 2, 4, 8):
        raise ValueError(f"{TILE_ENV}={text!r}: BV one of 8, 16, 32, 64, 128 and WARPS one of 1, 2, 4, 8")
    return bv, w


@triton.jit
def _gdn_token(x_ptr, a_ptr, b_ptr, idx_ptr, row, t, i_n, i_h, i_hv, ks, vs, mk, mv, stride_x, stride_a, stride_b,
               stride_idx, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    """Token t's inputs (row: its row of x, a and b): q, k, v, a, b and the slot its state goes to."""
    xr = x_ptr + row * stride_x
    q = tl.load(xr + i_h * K + ks, mask=mk, other=0.0).to(tl.float32)
    k = tl.load(xr + (H + i_h) * K + ks, mask=mk, other=0.0).to(tl.float32)
    v = tl.load(xr + 2 * H * K + i_hv * V + vs, mask=mv, other=0.0).to(tl.float32)
    a = tl.load(a_ptr + row * stride_a + i_hv).to(tl.float32)
    b = tl.load(b_ptr + row * stride_b + i_hv).to(tl.float32)
    slot = tl.load(idx_ptr + i_n * stride_idx + t).to(tl.int64)
    return q, k, v, a, b, slot


@triton.jit(do_not_specialize=["N"])
def _gdn_spec_packed_kernel(x_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, h_ptr, idx_ptr, nacc_ptr, cu_ptr, o_ptr, N, scale,
                            stride_x, stride_a, stride_b, stride_h, stride_idx, stride_o,
                            H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                            BK: tl.constexpr, BV: tl.constexpr, OVERLAP: tl.constexpr, ZERO_SKIPPED: tl.constexpr,
                            T):
    i_v = tl.program_id(0)
    i_nh = tl.program_id(1)
    i_n = i_nh // HV
    i_hv = i_nh % HV
    i_h = i_hv // (HV // H)  # the q/k head this v head reads (grouped heads)
    bos = tl.load(cu_ptr + i_n).to(tl.int64)
    eos = tl.load(cu_ptr + i_n + 1).to(tl.int64)
    first = tl.load(nacc_ptr + i_n).to(tl.int64) - 1
    slot0 = tl.load(idx_ptr + i_n * stride_idx + first).to(tl.int64)
    if (eos > bos) & (slot0 > 0):
        ks = tl.arange(0, BK)
        vs = i_v * BV + tl.arange(0, BV)
        mk = ks < K
        mv = vs < V
        mh = mv[:, None] & mk[None, :]
        hoff = i_hv * V * K + vs[:, None] * K + ks[None, :]
        n_tok = eos - bos
        if OVERLAP:  # token 0's inputs requested before the state is (the plain loop loads nothing early)
            nq, nk, nv, na, nb, nslot = _gdn_token(x_ptr, a_ptr, b_ptr, idx_ptr, bos, 0, i_n, i_h, i_hv, ks, vs, mk,
                                                   mv, stride_x, stride_a, stride_b, stride_idx, H, K, V)
        h = tl.load(h_ptr + slot0 * stride_h + hoff, mask=mh, other=0.0).to(tl.float32)
        neg_a = -tl.exp(tl.load(alog_ptr + i_hv).to(tl.float32))
        dtb = tl.load(dtb_ptr + i_hv).to(tl.float32)
        for t in range(0, n_tok):
            row = bos + t
            if OVERLAP:
                # this token's inputs came with the last iteration; the next token's are requested now, so their
                # memory latency passes while this token computes
                # (the last token asks for itself again: in bounds, never used)
                q, k, v, a, b, slot = nq, nk, nv, na, nb, nslot
                tn = tl.minimum(t + 1, n_tok - 1)
                nq, nk, nv, na, nb, nslot = _gdn_token(x_ptr, a_ptr, b_ptr, idx_ptr, bos + tn, tn, i_n, i_h, i_hv, ks,
                                                       vs, mk, mv, stride_x, stride_a, stride_b, stride_idx, H, K, V)
            else:
                q, k, v, a, b, slot = _gdn_token(x_ptr, a_ptr, b_ptr, idx_ptr, row, t, i_n, i_h, i_hv, ks, vs, mk, mv,
                                                 stride_x, stride_a, stride_b, stride_idx, H, K, V)
            z = a + dtb
            softplus = tl.where(z <= 20.0, tl.log(1.0 + tl.exp(z)), z)
            beta = tl.sigmoid(b)
            q = q * tl.rsqrt(tl.sum(q * q) + 1e-6) * scale
            k = k * tl.rsqrt(tl.sum(k * k) + 1e-6)
            decay = tl.exp(neg_a * softplus)
            if OVERLAP:
                # both reductions over the old state side by side: o = (d h + v' k^T) q = d (h q) + v' (k . q)
                hk = tl.sum(h * k[None, :], 1)
                hq = tl.sum(h * q[None, :], 1)
                v = (v - decay * hk) * beta
                o = decay * hq + v * tl.sum(k * q)
                h = h * decay + v[:, None] * k[None, :]
            else:
                h = h * decay
                v = (v - tl.sum(h * k[None, :], 1)) * beta
                h = h + v[:, None] * k[None, :]
                o = tl.sum(h * q[None, :], 1)
            tl.store(o_ptr + row * stride_o + i_hv * V + vs, o.to(o_ptr.dtype.element_ty), mask=mv)
            if slot > 0:
                tl.store(h_ptr + slot * stride_h + hoff, h.to(h_ptr.dtype.element_ty), mask=mh)
    if ZERO_SKIPPED:  # rows no sequence computes hold zeros, as in vLLM's zero-filled buffer
        vz = i_v * BV + tl.arange(0, BV)
        zero = tl.zeros([BV], dtype=tl.float32).to(o_ptr.dtype.element_ty)
        if (eos > bos) & (slot0 <= 0):  # a skipped sequence's own rows
            for t in range(0, eos - bos):
                tl.store(o_ptr + (bos + t) * stride_o + i_hv * V + vz, zero, mask=vz < V)
        if i_n == N - 1:  # rows past the last sequence's end, up to the step's token count (a graph's padding)
            for row in range(eos, T):
                tl.store(o_ptr + row * stride_o + i_hv * V + vz, zero, mask=vz < V)


def state_layout_error(state: torch.Tensor, hv: int, v: int, k: int) -> str | None:
    """None when `state` is a pool of slots the kernel reads as vLLM's does (each a contiguous [hv, v, k]), else
    what it is instead. The kernel refuses such a pool; the patch (gdn_spec_packed.py) keeps vLLM's path for it."""
    if state.dim() != 4 or tuple(state.shape[1:]) != (hv, v, k) or state.stride()[1:] != (v * k, k, 1):
        return f"[slots, {hv}, {v}, {k}], each slot contiguous, got {list(state.shape)} strides {state.stride()}"
    return None


def gdn_spec_packed(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                    state: torch.Tensor, state_indices: torch.Tensor, num_accepted: torch.Tensor,
                    cu_seqlens: torch.Tensor, out: torch.Tensor, *, num_k_heads: int, head_k_dim: int,
                    head_v_dim: int, scale: float | None = None, num_seqs: int | None = None,
                    tile: tuple[int, int] | None = None, overlap: bool | None = None,
                    zero_skipped: bool = False) -> torch.Tensor:
    """The verify step's recurrence for num_seqs sequences (default: len(cu_seqlens) - 1), in place: `out` rows
    bos..eos-1 of each live sequence, and the state slots its tokens name. Returns `out`. tile: (BV, num_warps),
    default $KIT_GDN_SPEC_TILE, else DEFAULT_TILE; overlap (the next token's loads and the two state reductions
    overlapped), default $KIT_GDN_SPEC_OVERLAP == "1". zero_skipped: every other row of `out` (a skipped sequence's,
    and those past the last sequence's end) written with zeros, for a buffer that was not zero-filled."""
    H, K, V = num_k_heads, head_k_dim, head_v_dim
    HV = state.shape[1]
    n = len(cu_seqlens) - 1 if num_seqs is None else num_seqs
    width = 2 * H * K + HV * V
    if x.dim() != 2 or x.shape[1] != width or x.stride(1) != 1:
        raise ValueError(f"gdn_spec_packed: x must be [T, {width}] with unit column stride, got {list(x.shape)} "
                         f"strides {x.stride()}")
    bad = state_layout_error(state, HV, V, K)
    if bad:
        raise ValueError(f"gdn_spec_packed: state must be {bad}")
    if HV % H:
        raise ValueError(f"gdn_spec_packed: {HV} v heads do not group over {H} q/k heads")
    if tuple(out.shape[1:]) != (HV, V) or out.stride(2) != 1 or out.stride(1) != V:
        raise ValueError(f"gdn_spec_packed: out must be [T, {HV}, {V}] with contiguous rows, got {list(out.shape)} "
                         f"strides {out.stride()}")
    if a.stride(1) != 1 or b.stride(1) != 1:
        raise ValueError("gdn_spec_packed: a and b need unit column stride")
    BK = triton.next_power_of_2(K)
    env_tile, env_overlap = _env()
    bv, warps = tile or env_tile
    overlap = env_overlap if overlap is None else overlap
    BV = min(triton.next_power_of_2(V), bv)
    if n > 0:
        _gdn_spec_packed_kernel[(triton.cdiv(V, BV), n * HV)](
            x, a, b, A_log, dt_bias, state, state_indices, num_accepted, cu_seqlens, out, n,
            float(K ** -0.5 if scale is None else scale), x.stride(0), a.stride(0), b.stride(0), state.stride(0),
            state_indices.stride(0), out.stride(0), H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, OVERLAP=bool(overlap),
            ZERO_SKIPPED=bool(zero_skipped), T=out.shape[0], num_warps=warps, num_stages=3)
    elif zero_skipped:
        out.zero_()
    return out


def reference(x, a, b, A_log, dt_bias, state, state_indices, num_accepted, cu_seqlens, out, *, num_k_heads,
              head_k_dim, head_v_dim, scale=None, num_seqs=None):
    """The same in float64 PyTorch, a token at a time: what the tests hold both kernels to."""
    H, K, V = num_k_heads, head_k_dim, head_v_dim
    HV = state.shape[1]
    g = HV // H
    n = len(cu_seqlens) - 1 if num_seqs is None else num_seqs
    scale = K ** -0.5 if scale is None else scale
    for i in range(n):
        bos, eos = int(cu_seqlens[i]), int(cu_seqlens[i + 1])
        slot0 = int(state_indices[i, int(num_accepted[i]) - 1])
        if eos <= bos or slot0 <= 0:
            continue
        h = state[slot0].double().clone()  # [HV, V, K]
        for t in range(eos - bos):
            row = x[bos + t].double()
            q = row[:H * K].view(H, K).repeat_interleave(g, 0)
            k = row[H * K:2 * H * K].view(H, K).repeat_interleave(g, 0)
            v = row[2 * H * K:].view(HV, V)
            q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6) * scale
            k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
            decay = torch.exp(-torch.exp(A_log.double()) * torch.nn.functional.softplus(a[bos + t].double() + dt_bias.double()))
            beta = torch.sigmoid(b[bos + t].double())
            h = h * decay[:, None, None]
            vv = (v - (h * k[:, None, :]).sum(-1)) * beta[:, None]
            h = h + vv[:, :, None] * k[:, None, :]
            out[bos + t] = (h * q[:, None, :]).sum(-1).to(out.dtype).view(out[bos + t].shape)
            slot = int(state_indices[i, t])
            if slot > 0:
                state[slot] = h.to(state.dtype)
    return out
