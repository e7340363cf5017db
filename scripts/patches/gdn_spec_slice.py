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

GDN_SPEC_SLICE=lean (KIT_GDN_SPEC_SLICE=lean): the same branch with less host work, for a host-bound step (issue 29:
v3's step sat 0.3-1.1 ms above its GPU work, session 20261202T0238Z, and its profile put the GDN build first among
the builds' host frames). Upstream measured this build at ~900 us for spec decodes and cut it to ~300 us by computing
the batch's split once (vllm-project/vllm#52297, open). `lean` returns the same metadata, field for field and buffer
for buffer, but
- decides the case from two lists (`tolist` of the draft counts and of query_start_loc_cpu) instead of ~17 small CPU
  tensor ops;
- stages the spec mask (n True rows, then False up to the batch) with one device copy from a pattern the builder keeps
  (n rows of True then False), instead of a pinned host-to-device copy of the mask plus a fill;
- stages spec_token_indx (always 0..size-1 on this branch) with one device copy from an arange the builder keeps,
  instead of an arange kernel plus a copy;
- fills a padded tail only when the step has one.
The pattern and the arange are made once a builder, at its first lean build outside CUDA-graph capture (a capture
before that takes the `on` path). The `on` path's 11 device ops a build (5 copies, 4 fills, an arange, a host-to-device
copy) become 5 copies, and a fill for each of 3 fields when padded rows trail (counted in the tests with a dispatch
mode); ~17 small CPU tensor ops go.

Order with GDN_METADATA_REUSE (gdn_reuse.py, which wraps `build` too): this patch must be applied first, so the
reuse wraps it. sitecustomize.py loads the patches in the table's order (scripts/patches/__init__.py), where this
row comes before the reuse's; where the reuse got there first, this patch says so and stays off.
"""
from __future__ import annotations

import os
import sys

ENV = "KIT_GDN_SPEC_SLICE"  # "1" (GDN_SPEC_SLICE=on) or "lean"
MODES = ("1", "lean")
TARGET = "vllm.v1.attention.backends.gdn_attn"
_MARK = "_kit_gdn_spec_slice"
_REUSE_MARK = "_kit_gdn_reuse"  # gdn_reuse.py's mark on the build it installs
_LEAN = "_kit_gdn_lean"  # on a builder: (mask pattern, arange) on its device, made at its first lean build


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


def spec_metadata(_mod, m, n, tokens, sqsl, spec_idx, smask, s_indx, ns_indx, acc):
    """0.26's metadata object for an all-spec-decode step staged for a FULL graph, from its staged fields."""
    return _mod.GDNAttentionMetadata(
        num_prefills=0, num_prefill_tokens=0, num_decodes=0, num_decode_tokens=0, num_spec_decodes=n,
        num_spec_decode_tokens=tokens, num_actual_tokens=m.num_actual_tokens, has_initial_state=None,
        chunk_indices=None, chunk_offsets=None, prefill_query_start_loc=None, prefill_state_indices=None,
        prefill_has_initial_state=None, spec_query_start_loc=sqsl, non_spec_query_start_loc=None,
        spec_state_indices_tensor=spec_idx, non_spec_state_indices_tensor=None, spec_sequence_masks=smask,
        spec_token_indx=s_indx, non_spec_token_indx=ns_indx, num_accepted_tokens=acc, nums_dict=None,
        batch_ptr=None, token_chunk_offset_ptr=None)


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

    return spec_metadata(_mod, m, n, tokens, sqsl, spec_idx, smask, s_indx, ns_indx, acc)


def lean_case(b, m, num_accepted_tokens, num_decode_draft_tokens_cpu):
    """fast_case's answer from two Python lists: (n, spec tokens, query_start_loc_cpu as a list) or None."""
    if not b.use_spec_decode or num_decode_draft_tokens_cpu is None or num_accepted_tokens is None:
        return None
    if not b.use_full_cuda_graph:
        return None
    d = num_decode_draft_tokens_cpu.tolist()
    n = 0
    drafts = 0
    for x in d:  # the spec rows (draft count >= 0) must form a leading run
        if x < 0:
            break
        n += 1
        drafts += x
    if n == 0 or drafts == 0:  # no spec rows, or only zero-draft ones: 0.26 takes its non-spec path
        return None
    for x in d[n:]:
        if x >= 0:  # a spec row after a non-spec one: not a leading run, 0.26 gathers
            return None
    qsl = m.query_start_loc_cpu.tolist()
    if n >= len(qsl):  # more draft counts than requests: not a batch 0.26's build takes either
        return None
    if qsl[-1] != qsl[n]:  # tokens after the spec rows: a prefill or a plain decode beside them
        return None  # (query lens are >= 0, so a flat tail means every one of them is 0)
    tokens = qsl[-1] - qsl[0]
    if n > b.decode_cudagraph_max_bs or tokens > b.decode_cudagraph_max_bs:  # 0.26 would not stage
        return None
    return n, tokens, qsl


def lean_buffers(b, dev, torch):
    """The builder's (mask pattern, arange): max_bs True then max_bs False; 0..len(spec_token_indx)-1. None while a
    CUDA graph is being captured and they are not made yet (a fill there would be recorded, not run)."""
    have = getattr(b, _LEAN, None)
    if have is not None:
        return have
    if dev.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None
    mx = b.decode_cudagraph_max_bs
    pat = torch.zeros(2 * mx, dtype=torch.bool, device=dev)
    pat[:mx] = True
    ar = torch.arange(b.spec_token_indx.numel(), dtype=b.spec_token_indx.dtype, device=dev)
    setattr(b, _LEAN, (pat, ar))
    # Once a builder, so a server's log shows the lean path was taken (a first step that never comes says so too)
    print(f"kit: GDN_SPEC_SLICE=lean: first lean build (up to {mx} requests staged)", file=sys.stderr, flush=True)
    return pat, ar


def lean_build(b, m, n, tokens, qsl_list, num_accepted_tokens, bufs, *, _mod):
    """sliced_build's metadata with fewer device ops (the module docstring's list). Same fields, same buffers."""
    k1 = b.num_spec + 1
    pat, ar = bufs
    mx = b.decode_cudagraph_max_bs
    bt = _mod.mamba_get_block_table_tensor(m.block_table_tensor, m.seq_lens, b.kv_cache_spec,
                                           b.vllm_config.cache_config.mamba_cache_mode)
    size = min(n * k1, qsl_list[-1])
    batch = m.num_reqs

    spec_idx = b.spec_state_indices_tensor
    spec_idx[:n].copy_(bt[:n, :k1], non_blocking=True)
    spec_idx = spec_idx[:batch]
    rows = spec_idx.shape[0]  # 0.26 slices its buffer to the batch: a batch past the buffer is cut to it
    if rows > n:
        spec_idx[n:].fill_(_mod.NULL_BLOCK_ID)

    smask = b.spec_sequence_masks[:batch]
    smask.copy_(pat[mx - n: mx - n + smask.shape[0]], non_blocking=True)  # n True, then False to the batch

    ns_indx = b.non_spec_token_indx[:0]
    s_indx = b.spec_token_indx[:size]
    s_indx.copy_(ar[:size], non_blocking=True)

    qsl = m.query_start_loc
    sqsl = b.spec_query_start_loc
    sqsl[: n + 1].copy_(qsl[: n + 1], non_blocking=True)
    sqsl = sqsl[: batch + 1]
    if sqsl.shape[0] > n + 1:
        sqsl[n + 1:].fill_(qsl[n])  # the device's own total, as 0.26 fills it

    acc = b.num_accepted_tokens
    acc[:n].copy_(num_accepted_tokens[:n], non_blocking=True)
    acc = acc[:batch]
    if acc.shape[0] > n:
        acc[n:].fill_(1)

    return spec_metadata(_mod, m, n, tokens, sqsl, spec_idx, smask, s_indx, ns_indx, acc)


def patch_class(cls, mod, lean: bool | None = None) -> bool:
    """Give cls (0.26's GDNAttentionMetadataBuilder) the sliced path; False when patched already, when the class
    slices itself (0.32+: its build has no mask gather to skip) or when GDN_METADATA_REUSE's build is in place."""
    orig = cls.__dict__.get("build")
    if orig is None or getattr(orig, _MARK, False) or getattr(orig, _REUSE_MARK, False):
        return False
    if "update_block_table" in cls.__dict__:  # vLLM 0.32+, which slices in this case itself
        return False

    if lean is None:
        lean = os.environ.get(ENV) == "lean"

    def build(self, common_prefix_len, common_attn_metadata, num_accepted_tokens=None,
              num_decode_draft_tokens_cpu=None, fast_build=False):
        if type(self) is cls:  # a subclass may build more than this path knows of
            m, d = common_attn_metadata, num_decode_draft_tokens_cpu
            if lean:  # one decision (lean_case takes exactly fast_case's steps: tested)
                case = lean_case(self, m, num_accepted_tokens, d)
                bufs = None if case is None else lean_buffers(self, m.query_start_loc.device, mod.torch)
                if bufs is not None:
                    return lean_build(self, m, *case, num_accepted_tokens, bufs, _mod=mod)
                case = None if case is None else case[:2]  # during capture, before its buffers: the sliced path
            else:
                case = fast_case(self, m, num_accepted_tokens, d)
            if case is not None:
                return sliced_build(self, m, *case, num_accepted_tokens, d, _mod=mod)
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
    lean = os.environ.get(ENV) == "lean"
    what = ("GDN spec-decode metadata sliced, not gathered with a host mask, with fewer host ops (GDN_SPEC_SLICE=lean)"
            if lean else "GDN spec-decode metadata sliced, not gathered with a host mask (GDN_SPEC_SLICE)")
    return patch_class_of(mod, "GDNAttentionMetadataBuilder", lambda cls, m: patch_class(cls, m, lean), _MARK,
                          "build", what, why_not)


def install(target: str = TARGET) -> bool:
    """Patch `target` when it is imported (now, if it already is), if $KIT_GDN_SPEC_SLICE is "1" or "lean"."""
    if os.environ.get(ENV) not in MODES:
        return False
    from scripts.patches.on_import import after_import
    after_import(target, patch_module)
    return True
