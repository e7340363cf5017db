"""GDN_SPEC_SLICE=on: the Gated DeltaNet metadata of an all-spec-decode step is built without the two host-mask
gathers that stall the host on the GPU (issue 29, "the step toward its floor").

What it changes (vLLM 0.26, vllm/v1/attention/backends/gdn_attn.py, GDNAttentionMetadataBuilder.build): when every
real request of the step verifies drafts (no prefills, no plain decodes; padded requests, zero tokens each, trail
them), 0.26 takes the spec rows of the block table and of the accepted-token counts by indexing those GPU tensors
with a boolean mask on the CPU (gdn_attn.py:286-288 and 327). PyTorch turns such a mask into indices on the host and
copies them to the device with a blocking copy, which waits for the stream to drain (pytorch/pytorch#12461; the
fix proposed in #156384 and #186484 was not merged). Two such waits a build: whatever the host prepares after them
(the rest of this build, the other groups, the next step's inputs) no longer overlaps the GPU's work, and the GPU
idles while it runs. vLLM 0.32 slices there instead ("padded sequences trail the spec decodes, so slice them off
rather than gather with the host mask"); this patch does the same on 0.26.

Scope, so the result is the one 0.26's build returns, field for field:
- only where 0.26 would stage the step into the builder's FULL-CUDA-graph buffers (use_full_cuda_graph, and the
  requests and tokens within decode_cudagraph_max_bs), so the sliced views are copied into the same contiguous
  buffers the gathered copies were; the kernels see the same tensors;
- only when the spec rows form a leading run and every other row has no tokens (then 0.26 counts no prefills and
  no decodes), checked on the CPU tensors the build already has;
- everything else (prefills, mixed batches, piecewise graphs, capture) goes to 0.26's own build.
The fast path is this module's own code for that one branch of 0.26's build (gdn_attn.py:190-212, 252-275, 418-464,
486-512); tests/test_gdn_spec_slice_patch.py checks it against 0.26's file, field by field and buffer by buffer.

Order with GDN_METADATA_REUSE (gdn_reuse.py, which wraps `build` too): this patch must be applied first, so the
reuse wraps it. sitecustomize.py loads the patches in the table's order (scripts/patches/__init__.py), where this
row comes before the reuse's; where the reuse got there first, this patch says so and stays off.
"""
from __future__ import annotations

import os

ENV = "KIT_GDN_SPEC_SLICE"
TARGET = "vllm.v1.attention.backends.gdn_attn"
_MARK = "_kit_gdn_spec_slice"
_REUSE_MARK = "_kit_gdn_reuse"  # gdn_reuse.py's mark on the build it installs


def fast_case(b, m, num_accepted_tokens, num_decode_draft_tokens_cpu):
    """(n, spec tokens) when `build` may take the sliced path for metadata m, else None. CPU tensors only."""
    if not b.use_spec_decode or num_decode_draft_tokens_cpu is None or num_accepted_tokens is None:
        return None
    if not b.use_full_cuda_graph:
        return None
    d = num_decode_draft_tokens_cpu
    mask = d >= 0
    n = int(mask.sum())
    if n == 0 or int(d[mask].sum()) == 0:  # 0.26 takes its non-spec path then
        return None
    if not bool(mask[:n].all()):  # the spec rows are not a leading run: 0.26 gathers
        return None
    qsl = m.query_start_loc_cpu
    lens = qsl[1:] - qsl[:-1]
    if bool((lens[n:] != 0).any()):  # a prefill or a plain decode beside them
        return None
    tokens = int(lens.sum())
    if n > b.decode_cudagraph_max_bs or tokens > b.decode_cudagraph_max_bs:  # 0.26 would not stage: its tensors stay
        return None
    return n, tokens


def sliced_build(b, m, n, tokens, num_accepted_tokens, d_cpu, *, _mod):
    """0.26's build for an all-spec-decode step staged for a FULL graph, with slices where it gathers."""
    k1 = b.num_spec + 1
    dev = m.query_start_loc.device
    bt = _mod.mamba_get_block_table_tensor(m.block_table_tensor, m.seq_lens, b.kv_cache_spec,
                                           b.vllm_config.cache_config.mamba_cache_mode)
    mask_cpu = d_cpu >= 0
    masks = _mod.async_tensor_h2d(mask_cpu, device=dev)
    size = min(n * k1, int(m.query_start_loc_cpu[-1]))
    spec_token_indx = _mod.torch.arange(size, dtype=_mod.torch.int32, device=dev)
    batch = m.num_reqs  # each staged field: the first n rows copied into b's buffer, the rest up to the batch filled

    spec_idx = b.spec_state_indices_tensor
    spec_idx[:n].copy_(bt[:n, :k1], non_blocking=True)
    spec_idx = spec_idx[:batch]
    spec_idx[n:].fill_(_mod.NULL_BLOCK_ID)

    smask = b.spec_sequence_masks
    smask[:n].copy_(masks[:n], non_blocking=True)
    smask = smask[:batch]
    smask[n:].fill_(False)

    ns_indx = b.non_spec_token_indx[:0]  # 0.26 stages an empty tensor there: this same empty view
    s_indx = b.spec_token_indx
    s_indx[:size].copy_(spec_token_indx, non_blocking=True)
    s_indx = s_indx[:size]

    qsl = m.query_start_loc[: n + 1]
    sqsl = b.spec_query_start_loc
    sqsl[: n + 1].copy_(qsl, non_blocking=True)
    total = qsl[-1]
    sqsl = sqsl[: batch + 1]
    sqsl[n + 1:].fill_(total)

    acc = b.num_accepted_tokens
    acc[:n].copy_(num_accepted_tokens[:n], non_blocking=True)
    acc = acc[:batch]
    acc[n:].fill_(1)

    return _mod.GDNAttentionMetadata(
        num_prefills=0, num_prefill_tokens=0, num_decodes=0, num_decode_tokens=0, num_spec_decodes=n,
        num_spec_decode_tokens=tokens, num_actual_tokens=m.num_actual_tokens, has_initial_state=None,
        chunk_indices=None, chunk_offsets=None, prefill_query_start_loc=None, prefill_state_indices=None,
        prefill_has_initial_state=None, spec_query_start_loc=sqsl, non_spec_query_start_loc=None,
        spec_state_indices_tensor=spec_idx, non_spec_state_indices_tensor=None, spec_sequence_masks=smask,
        spec_token_indx=s_indx, non_spec_token_indx=ns_indx, num_accepted_tokens=acc, nums_dict=None,
        batch_ptr=None, token_chunk_offset_ptr=None)


def patch_class(cls, mod) -> bool:
    """Give cls (0.26's GDNAttentionMetadataBuilder) the sliced path; False when patched already, when the class
    slices itself (0.32+: its build has no mask gather to skip) or when GDN_METADATA_REUSE's build is in place."""
    orig = cls.__dict__.get("build")
    if orig is None or getattr(orig, _MARK, False) or getattr(orig, _REUSE_MARK, False):
        return False
    if "update_block_table" in cls.__dict__:  # vLLM 0.32+, which slices in this case itself
        return False

    def build(self, common_prefix_len, common_attn_metadata, num_accepted_tokens=None,
              num_decode_draft_tokens_cpu=None, fast_build=False):
        if type(self) is cls:  # a subclass may build more than this path knows of
            case = fast_case(self, common_attn_metadata, num_accepted_tokens, num_decode_draft_tokens_cpu)
            if case is not None:
                return sliced_build(self, common_attn_metadata, *case, num_accepted_tokens,
                                    num_decode_draft_tokens_cpu, _mod=mod)
        return orig(self, common_prefix_len, common_attn_metadata, num_accepted_tokens,
                    num_decode_draft_tokens_cpu, fast_build)

    build.__name__, build.__qualname__, build.__wrapped__ = "build", f"{cls.__qualname__}.build", orig
    setattr(build, _MARK, True)
    cls.build = build
    return True


def patch_module(mod) -> bool:
    from scripts.patches.on_import import patch_class_of

    def why_not(cls):
        why = ("GDN_METADATA_REUSE's build was applied first" if getattr(cls.__dict__.get("build"), _REUSE_MARK, False)
               else "the class has update_block_table (vLLM 0.32+, which slices itself) or no build")
        return f"GDN spec-decode slicing NOT active: {why}"
    return patch_class_of(mod, "GDNAttentionMetadataBuilder", patch_class, _MARK, "build",
                          "GDN spec-decode metadata sliced, not gathered with a host mask (GDN_SPEC_SLICE)", why_not)


def install(target: str = TARGET) -> bool:
    """Patch `target` when it is imported (now, if it already is), if $KIT_GDN_SPEC_SLICE is "1"."""
    if os.environ.get(ENV) != "1":
        return False
    from scripts.patches.on_import import after_import
    after_import(target, patch_module)
    return True
