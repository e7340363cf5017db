"""GDN_QKV_SPLIT=two_copies: the Gated DeltaNet layer splits its packed q, k, v in two copies, not four (issue 29
item 3, "the 122 copy kernels of the GDN spec path").

What it changes (vLLM 0.26, vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py): the layer's
`rearrange_mixed_qkv`, which turns the conv output [T, q + k + v] into three contiguous (1, T, heads, dim)
tensors. vLLM's version reshapes each of the three column slices (a copy each: their rows are strided) and
concatenates them (a fourth copy), and says torch.compile fuses that into one kernel. It runs inside the
qwen_gdn_attention_core custom op, which the compiler does not enter, so on the H100 each call is four eager copy
kernels: with MTP K=4 every step calls it for the 5-token verify in each of Qwen3.5-4B's 24 GDN layers. That would
be 96 of the 122 copy kernels a step in results/profiles/20261126T091758Z-qwen3.5-4b-bf16-tuned-dvg.trace.json.gz,
counted from the code, not traced back kernel by kernel.

Patched, for T > 1: one buffer of the same layout, q and k written by one copy (their column slices are adjacent
and equally wide, so they form one [2, T, dim] source view), v by a second; the same three views are returned. A
single token (T = 1) keeps vLLM's path, which is one copy there; so does a tensor whose columns are not contiguous.

Read at every interpreter's start (sitecustomize.py): torch and vLLM are imported only in the hook. Tested
(tests/test_gdn_qkv_split_patch.py) against the installed vLLM's own method: the same values and shapes, two copies
where it makes four.
"""
from __future__ import annotations

import sys

ENV = "KIT_GDN_QKV_SPLIT"
TARGET = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"
_MARK = "_kit_gdn_qkv_split"
_SEEN: list[int] = []  # the first patched call's token count, once a process


def two_copies(self, mixed_qkv):
    """q, k, v as (1, T, heads, dim) views of one buffer laid out as vLLM's: q rows, then k rows, then v rows."""
    t = mixed_qkv.shape[0]
    kd = self.key_dim // self.tp_size
    vd = self.value_dim // self.tp_size
    fused = mixed_qkv.new_empty(t * (2 * kd + vd))
    fused[:2 * t * kd].view(2, t, kd).copy_(mixed_qkv[:, :2 * kd].view(t, 2, kd).transpose(0, 1))
    fused[2 * t * kd:].view(t, vd).copy_(mixed_qkv[:, 2 * kd:2 * kd + vd])
    return (fused[:t * kd].view(1, t, -1, self.head_k_dim), fused[t * kd:2 * t * kd].view(1, t, -1, self.head_k_dim),
            fused[2 * t * kd:].view(1, t, -1, self.head_v_dim))


def patch_class(cls) -> bool:
    orig = cls.__dict__.get("rearrange_mixed_qkv")
    if orig is None or getattr(orig, _MARK, False):
        return False

    def rearrange_mixed_qkv(self, mixed_qkv):
        if mixed_qkv is None or mixed_qkv.dim() != 2 or mixed_qkv.shape[0] < 2 or mixed_qkv.stride(1) != 1:
            return orig(self, mixed_qkv)
        if not _SEEN:  # once a process: the server log then shows the split ran, not only that it was installed
            _SEEN.append(mixed_qkv.shape[0])
            print(f"kit: GDN q/k/v split in two copies ran (first call: {mixed_qkv.shape[0]} tokens)", file=sys.stderr,
                  flush=True)
        return two_copies(self, mixed_qkv)

    setattr(rearrange_mixed_qkv, _MARK, True)
    cls.rearrange_mixed_qkv = rearrange_mixed_qkv
    return True


def install(target: str = TARGET) -> bool:
    """Patch the GDN layer class of `target` when it is imported, if $KIT_GDN_QKV_SPLIT is "1"."""
    from scripts.patches.on_import import install_switched
    return install_switched(ENV, target, patch_class, "GDN q/k/v split in two copies", "rearrange_mixed_qkv")
