"""GDN metadata reuse across KV-cache groups, behind sitecustomize.py (KIT_GDN_REUSE=1).

What it changes (vLLM 0.26, vllm/v1/attention/backends/gdn_attn.py): GDNAttentionMetadataBuilder gets
`update_block_table(metadata, blk_table, slot_mapping)` and `supports_update_block_table = True`. The V1
runner (vllm/v1/worker/gpu_model_runner.py:2447-2516, `_build_attn_group_metadata`) then builds GDN
metadata once a step and, for every other KV-cache group with an equal MambaSpec, calls
`update_block_table` on the cached object instead of `build`. Qwen3.5-4B has 3 GDN groups: 2 builds a
step become 2 updates.

What an update does (equal to what `build` on that group's builder would return):
- Re-gathers the only block-table-dependent fields: spec_state_indices_tensor (rows of the spec
  requests, first num_spec+1 columns), non_spec_state_indices_tensor (column 0 of the others) and
  prefill_state_indices (the prefill part of the latter), after `mamba_get_block_table_tensor` (which,
  in "align" mode, needs seq_lens: the build wrapper keeps it, and the CPU spec mask, on the metadata).
- FULL CUDA graphs: in V1, every group's graph is captured with metadata built by that group's own
  builder (gpu_model_runner.py:2496-2499 bypasses the cache at capture), so each graph reads its own
  builder's persistent buffers. Where the build staged into them (gdn_attn.py:420-485), the update
  writes the new state indices into *this* builder's buffers, and copies the batch-level staged
  fields (spec_sequence_masks, spec/non_spec_token_indx, spec/non_spec_query_start_loc,
  num_accepted_tokens) from the source group's buffers into this builder's. No two groups share a
  persistent buffer, and the source metadata is left as it was. This mirrors Mamba2's
  `_update_metadata_for_cudagraph_capture` (mamba_attn.py:560-647), which also copies into the
  builder's own buffers.
- Everything else (counts, has_initial_state, chunk/conv1d metadata) is shared with the source object.

Upstream: vLLM 0.32 has `GDNAttentionMetadataBuilder.update_block_table`, but enables it only for the V2
model runner ("update_block_table() keeps the source group's batch-level FULL graph buffers, so only
MRV2, which also reuses metadata at capture, may use it"); V1, which 0.26 and 0.32 use for hybrid
models, still rebuilds per group. This patch follows that method's field split, and adds the copies V1
needs. Where the class already has its own `update_block_table` (0.32+), nothing is patched.

V2 model runner (VLLM_USE_V2_MODEL_RUNNER=1): 0.26's `build_attn_metadata`
(vllm/v1/worker/gpu/attn_utils.py:566-656) calls `build` for every KV-cache group and has no
`update_block_table` path, so the V1 half above does not act there. The patch wraps that function: while it
runs (not at CUDA-graph capture, where each group keeps building its own, as in V1), the patched `build`
remembers the first GDN group's metadata, and a later group with an equal MambaSpec, the same builder class
and the same batch (query_start_loc, seq_lens, counts, accepted and draft tokens) gets `update_block_table`
of it instead of a build. That is what vLLM 0.32's V2 `build_attn_metadata` does itself (keyed on spec and
builder class), except that 0.32 also shares the source group's FULL-graph buffers at capture; here each
group's buffers stay its own, as the V1 half keeps them. Where the function already calls
`update_block_table` (0.32+), it is left alone. The runner's modules bind the name at import
(`from ...attn_utils import build_attn_metadata`), so the wrapper goes in right after attn_utils executes,
before they do; those already imported are rebound.

GDN_METADATA_REUSE=shared (KIT_GDN_REUSE=shared): the same reuse, and the builders of equal GDN groups share their
batch-level FULL-graph buffers (the six fields above that do not depend on the block table: spec_sequence_masks,
spec/non_spec_token_indx, spec/non_spec_query_start_loc, num_accepted_tokens). Each group's captured graph then reads
the one copy, the build stages the step there once, and an update's copies of those fields find the source's view
already in place (`_into` skips them): 5 copies an update go, and only the group's own state indices are written
(a copy, and a fill when padded rows trail). vLLM 0.32's V2 runner does the same sharing itself ("update_block_table()
keeps the source group's batch-level FULL graph buffers"). Safe because the fields are the batch's, the same for every
GDN group of a step, and every write to them is a device op on the step's stream, after the graphs that read them.
The per-group state-index buffers stay each builder's own. Shared between builders of one vLLM config with equal
MambaSpec, device, drafts a step and graph batch bound only; a builder that is not this class (a subclass) or cannot
update (micro-batching) keeps its own.

Why an import hook: the builders live in vLLM's engine process, started with spawn, where only
sitecustomize can reach them; the patch is applied right after gdn_attn is imported (the runner imports
it at module level, long before it creates any builder).
"""
from __future__ import annotations

import copy
import inspect
import os
import sys
import threading

TARGET = "vllm.v1.attention.backends.gdn_attn"
V2_TARGET = "vllm.v1.worker.gpu.attn_utils"
# V2 modules that import build_attn_metadata by name (0.26): rebound when they were imported before the patch
V2_USERS = ("vllm.v1.worker.gpu.model_states.default", "vllm.v1.worker.gpu.model_states.mamba_hybrid",
            "vllm.v1.worker.gpu.model_states.encoder_decoder", "vllm.v1.worker.gpu.spec_decode.speculator",
            "vllm.v1.worker.gpu.spec_decode.dflash.cudagraph")
# Per thread: the GDN metadata built so far in the running build_attn_metadata call, or None outside one
_scope = threading.local()
ENV = "KIT_GDN_REUSE"  # "1" (GDN_METADATA_REUSE=on) or "shared"
MODES = ("1", "shared")
_MARK = "_kit_gdn_reuse"
_SIDE = "_kit_gdn_side"  # (spec mask on CPU or None, mask is a leading run, seq_lens, num_reqs), on metadata

# Batch-level fields a FULL-graph build stages into the builder's buffers: (field, staged when)
_SPEC_STAGED = ("spec_sequence_masks", "spec_token_indx", "non_spec_token_indx", "spec_query_start_loc",
                "num_accepted_tokens")
_DECODE_STAGED = ("non_spec_query_start_loc",)
# shared: per process, [(vllm_config, kv_cache_spec, device, num_spec, decode_cudagraph_max_bs), {field: buffer}]
_SHARED: list = []


def share_batch_buffers(b) -> bool:
    """b's batch-level FULL-graph buffers replaced by those of the first builder with the same key (or registered as
    that key's); True when b now reads another builder's."""
    dev = b.spec_sequence_masks.device
    for key, bufs in _SHARED:
        if (key[0] is b.vllm_config and key[1] == b.kv_cache_spec and key[2] == dev and key[3] == b.num_spec
                and key[4] == b.decode_cudagraph_max_bs):
            for name, buf in bufs.items():
                setattr(b, name, buf)
            return True
    _SHARED.append(((b.vllm_config, b.kv_cache_spec, dev, b.num_spec, b.decode_cudagraph_max_bs),
                    {name: getattr(b, name) for name in _SPEC_STAGED + _DECODE_STAGED}))
    return False


def spec_staged(b, m) -> bool:
    """Whether `build` put m's spec-decode fields into b's FULL-graph buffers (gdn_attn.py:420-426)."""
    return (m.spec_sequence_masks is not None and b.use_full_cuda_graph and m.num_prefills == 0
            and m.num_decodes == 0 and m.num_spec_decodes <= b.decode_cudagraph_max_bs
            and m.num_spec_decode_tokens <= b.decode_cudagraph_max_bs)


def decode_staged(b, m) -> bool:
    """Whether `build` put m's decode fields into b's FULL-graph buffers (gdn_attn.py:466-471)."""
    return (b.use_full_cuda_graph and m.num_prefills == 0 and m.num_spec_decodes == 0
            and m.num_decodes <= b.decode_cudagraph_max_bs)


def _into(buf, src):
    """src copied into the front of persistent buffer buf (unless it is there already); the view."""
    dst = buf[: src.shape[0]]
    if src.numel() and dst.data_ptr() != src.data_ptr():
        dst.copy_(src, non_blocking=True)
    return dst


def update_block_table(self, metadata, blk_table, slot_mapping, *, _mod):
    side = getattr(metadata, _SIDE, None)
    if side is None:
        raise RuntimeError("kit GDN reuse: metadata was not built by the patched build()")
    masks, leading, seq_lens, batch_size = side
    m, null = metadata, _mod.NULL_BLOCK_ID
    bt = _mod.mamba_get_block_table_tensor(blk_table, seq_lens, self.kv_cache_spec,
                                           self.vllm_config.cache_config.mamba_cache_mode)
    k1 = self.num_spec + 1
    spec = non_spec = prefill = None
    new = copy.copy(m)  # shallow, as flash_attn's update_block_table; keeps the side attribute
    if masks is None:  # gdn_attn.py:219, 342-356
        non_spec = bt[:, 0]
        if m.num_prefills > 0:
            prefill = non_spec[m.num_decodes:] if m.num_decodes > 0 else non_spec
    elif m.num_prefills == 0:  # all spec decodes (+ trailing padding): gdn_attn.py:267-270
        staged = spec_staged(self, m)
        # a leading run of spec rows is the same rows as the mask; a view is enough when it is copied
        spec = bt[: m.num_spec_decodes, :k1] if (staged and leading) else bt[masks, :k1]
    else:  # spec decodes mixed with prefills: gdn_attn.py:288-293, 356
        spec = bt[masks, :k1]
        non_spec = prefill = bt[~masks, 0]

    def stage(buf, idx, n, fields):  # into this builder's own buffers: idx's n rows, null up to the batch size
        buf[:n].copy_(idx, non_blocking=True)
        buf[n:batch_size].fill_(null)
        for name in fields:
            setattr(new, name, _into(getattr(self, name), getattr(m, name)))
        return buf[:batch_size]

    if spec_staged(self, m):  # gdn_attn.py:428-464
        spec = stage(self.spec_state_indices_tensor, spec, m.num_spec_decodes, _SPEC_STAGED)
    if decode_staged(self, m):  # gdn_attn.py:472-485
        non_spec = stage(self.non_spec_state_indices_tensor, non_spec, m.num_decodes, _DECODE_STAGED)
    new.spec_state_indices_tensor = spec
    new.non_spec_state_indices_tensor = non_spec
    new.prefill_state_indices = prefill
    return new


def patch_class(cls, mod, shared: bool | None = None) -> bool:
    """Give cls (vLLM 0.26's GDNAttentionMetadataBuilder) update_block_table (and, shared, one set of batch-level
    buffers for equal groups); False when it has its own (vLLM 0.32+) or is patched already."""
    if shared is None:
        shared = os.environ.get(ENV) == "shared"
    orig_build, orig_init = cls.__dict__.get("build"), cls.__dict__.get("__init__")
    if orig_build is None or orig_init is None or getattr(orig_build, _MARK, False):
        return False
    if "update_block_table" in cls.__dict__:
        return False

    def __init__(self, *args, **kwargs):
        orig_init(self, *args, **kwargs)
        # Only this class: a subclass may add per-group metadata the update would not know of. Not with
        # micro-batching: the runner's cache key has no ubatch id, and GDN has no ubatch support anyway.
        parallel = getattr(self.vllm_config, "parallel_config", None)
        self.supports_update_block_table = (type(self) is cls
                                            and not getattr(parallel, "use_ubatching", False))
        if shared and self.supports_update_block_table:
            share_batch_buffers(self)

    def build(self, common_prefix_len, common_attn_metadata, num_accepted_tokens=None,
              num_decode_draft_tokens_cpu=None, fast_build=False):
        reuse = getattr(_scope, "built", None) if self.supports_update_block_table else None
        if reuse is not None:  # inside V2's build_attn_metadata: a group of this step's batch built already?
            key = batch_key(self, common_prefix_len, common_attn_metadata, num_accepted_tokens,
                            num_decode_draft_tokens_cpu)
            for k, md in reuse:
                if k == key:
                    return self.update_block_table(md, common_attn_metadata.block_table_tensor,
                                                   common_attn_metadata.slot_mapping)
        md = orig_build(self, common_prefix_len, common_attn_metadata, num_accepted_tokens,
                        num_decode_draft_tokens_cpu, fast_build)
        if self.supports_update_block_table:
            masks, leading = None, False
            if md.spec_sequence_masks is not None:  # the spec branch ran: its CPU mask (gdn_attn.py:201)
                masks = num_decode_draft_tokens_cpu >= 0
                leading = md.num_prefills == 0 and bool(masks[: md.num_spec_decodes].all())
            setattr(md, _SIDE, (masks, leading, common_attn_metadata.seq_lens, common_attn_metadata.num_reqs))
            if reuse is not None:
                reuse.append((key, md))
        return md

    def _update_block_table(self, metadata, blk_table, slot_mapping):
        return update_block_table(self, metadata, blk_table, slot_mapping, _mod=mod)

    for f, name in ((__init__, "__init__"), (build, "build"), (_update_block_table, "update_block_table")):
        f.__name__, f.__qualname__ = name, f"{cls.__qualname__}.{name}"
        setattr(f, _MARK, True)
        setattr(cls, name, f)
    return True


def _view(t):
    """What identifies a tensor argument within one call: the memory it reads, its shape and dtype."""
    return None if t is None else (t.data_ptr(), tuple(t.shape), t.dtype)


def batch_key(b, common_prefix_len, cm, num_accepted_tokens, num_decode_draft_tokens_cpu):
    """Everything a GDN build reads except the block table (and the slot mapping, which it does not read):
    two groups with equal keys get the same metadata up to their state indices. V2 makes a new
    CommonAttentionMetadata, and new slices of the accepted and draft counts, for every group, so these are
    compared by the memory they view."""
    return (type(b), b.kv_cache_spec, common_prefix_len, cm.num_reqs, cm.num_actual_tokens, cm.max_query_len,
            _view(cm.query_start_loc), _view(cm.query_start_loc_cpu), _view(cm.seq_lens),
            _view(num_accepted_tokens), _view(num_decode_draft_tokens_cpu))


def wrap_build_attn_metadata(orig):
    """orig (V2's build_attn_metadata) run with a reuse scope open, unless it builds for CUDA-graph capture."""
    params = list(inspect.signature(orig).parameters)
    at = params.index("for_cudagraph_capture")

    def build_attn_metadata(*args, **kwargs):
        capture = kwargs["for_cudagraph_capture"] if "for_cudagraph_capture" in kwargs else (
            len(args) > at and args[at])
        if capture:
            return orig(*args, **kwargs)
        outer = getattr(_scope, "built", None)
        _scope.built = []
        try:
            return orig(*args, **kwargs)
        finally:
            _scope.built = outer
    build_attn_metadata.__name__ = build_attn_metadata.__qualname__ = orig.__name__
    build_attn_metadata.__doc__, build_attn_metadata.__wrapped__ = orig.__doc__, orig
    setattr(build_attn_metadata, _MARK, True)
    return build_attn_metadata


def patch_v2_module(mod) -> bool:
    """Wrap mod.build_attn_metadata (0.26's V2 attn_utils) and rebind it where the runner's modules took it;
    False when vLLM's own already reuses (calls update_block_table, 0.32+) or it is wrapped already."""
    orig = getattr(mod, "build_attn_metadata", None)
    if orig is None or getattr(orig, _MARK, False):
        return False
    if "for_cudagraph_capture" not in inspect.signature(orig).parameters:  # not the function this was written for
        print(f"kit: GDN metadata reuse (V2) NOT patched: {mod.__name__}.build_attn_metadata takes no "
              "for_cudagraph_capture", file=sys.stderr, flush=True)
        return False
    if "update_block_table" in orig.__code__.co_names:
        print(f"kit: GDN metadata reuse (V2) NOT patched: {mod.__name__}.build_attn_metadata reuses metadata "
              "itself", file=sys.stderr, flush=True)
        return False
    wrapped = wrap_build_attn_metadata(orig)
    mod.build_attn_metadata = wrapped
    for name in V2_USERS:
        user = sys.modules.get(name)
        if user is not None and getattr(user, "build_attn_metadata", None) is orig:
            user.build_attn_metadata = wrapped
    print("kit: GDN metadata reuse across KV-cache groups active in the V2 runner (build_attn_metadata)",
          file=sys.stderr, flush=True)
    return True


def patch_module(mod) -> bool:
    from scripts.patches.on_import import patch_class_of
    shared = os.environ.get(ENV) == "shared"
    what = "GDN metadata reuse across KV-cache groups active (update_block_table)" + (
        ", batch-level graph buffers shared between equal groups" if shared else "")
    return patch_class_of(mod, "GDNAttentionMetadataBuilder", lambda cls, m: patch_class(cls, m, shared), _MARK,
                          "build", what,
                          lambda cls: f"GDN metadata reuse NOT active: {mod.__name__}.GDNAttentionMetadataBuilder "
                                      "already has update_block_table (vLLM's own) or no build")


def install(target: str = TARGET, v2_target: str = V2_TARGET) -> bool:
    """Patch `target` (the builder) and `v2_target` (V2's build_attn_metadata) when each is imported (now, if
    it already is), if $KIT_GDN_REUSE is "1" or "shared"."""
    if os.environ.get(ENV) not in MODES:
        return False
    from scripts.patches.on_import import after_import
    after_import(target, patch_module)
    after_import(v2_target, patch_v2_module)
    return True
