"""The MTP draft chain as one CUDA graph per batch size, behind sitecustomize.py (KIT_DRAFT_GRAPH=N).

What it changes (vLLM 0.26, vllm/v1/spec_decode/llm_base_proposer.py, `SpecDecodeBaseProposer.propose`):
with K speculative tokens the drafter runs K passes a step. The first reads the target's tokens (a ragged
batch); passes 2..K read one token per request. vLLM runs every pass under piecewise CUDA graphs only
(`initialize_cudagraph_keys` pins PIECEWISE), so each of them rebuilds attention metadata in Python and
launches its attention, KV write and lm_head eagerly: on the H100, Qwen3.5-4B's four drafts were 2.4 ms
of GPU work under 14 ms of traced host time (results/profiles/20261125T204405Z-host-time.md). Patched,
the first pass is vLLM's own, unchanged (the proposer is called with K=1); passes 2..K, which have the
same shape every step, are captured once per batch size (1..N) into one CUDA graph and replayed. The
host then does five small copies into the graph's inputs and one replay instead of K-1 passes of Python.

What the graph holds, per pass, in vLLM's own order and with vLLM's own helpers: the position, slot and
sequence-length update (`_update_positions_dependent_metadata`), the attention metadata build
(`build_per_group_and_layer_attn_metadata`), the draft model's forward, the draft token (`_sample_draft_
tokens`, greedy; the kit's draft vocabulary, scripts/patches/draft_vocab.py, runs inside the graph too).
Everything the graph reads lives in buffers of fixed address: the proposer's own persistent buffers, and
this patch's copies of the step's first draft token, hidden state, position, sequence lengths and block
table. Host values are fixed at capture, as in vLLM's FULL graphs for the target: max_seq_len is
max_model_len (vLLM's capture uses the same bound, gpu_model_runner.py:2292-2296), so the attention
kernel may pick other splits than the eager pass does, with results equal up to rounding.

Where it steps aside (vLLM as it is, said once on stderr): any method but MTP, parallel or DFlash
drafting, drafters whose attention is not FlashAttention, tuple-returning MTP heads (DeepSeek), shared
MTP indices, constant draft positions, heterogeneous vocabularies, local-argmax reduction, EPLB, data
parallel, XD-RoPE, probabilistic draft sampling of a non-greedy batch, K < 2, batches above N, and eager
mode. A capture that fails switches the patch off for the process and keeps vLLM's path.

KIT_DRAFT_GRAPH_CHECK=N (diagnosis, slower): every replay is followed by the same passes run eagerly on
the same inputs, and the two sets of draft tokens are compared; the counts go to stderr every N steps.

Upstream: vllm-project/vllm#45258 (RFC, open: FULL graphs for drafter chain steps, "15-18% of decode
step time"), #34880 (closed: FULL graph mode for the EAGLE drafter). The V2 model runner captures its
draft loop; vLLM 0.26 runs hybrid models such as Qwen3.5 on V1.
"""
from __future__ import annotations

import inspect
import os
import sys

TARGET = "vllm.v1.spec_decode.llm_base_proposer"
ENV = "KIT_DRAFT_GRAPH"
CHECK_ENV = "KIT_DRAFT_GRAPH_CHECK"
_MARK = "_kit_draft_graph"


def say(msg: str) -> None:
    print(f"kit: {msg}", file=sys.stderr, flush=True)


def static_reason(p, cuda: bool = True) -> str | None:
    """Why the chain of proposer p cannot be graphed, whatever the batch; None when it can."""
    cfg = p.vllm_config
    checks = (
        (type(p).__name__ != "EagleProposer", f"proposer {type(p).__name__} (EagleProposer only)"),
        (p.method != "mtp", f"method {p.method!r} (MTP only)"),
        (p.parallel_drafting or p.needs_extra_input_slots, "parallel drafting or extra input slots"),
        (p.model_returns_tuple(), "the MTP head returns a tuple"),
        (getattr(p, "_share_mtp_indices", False), "shared MTP indices"),
        (getattr(p, "constant_draft_positions", False), "constant draft positions"),
        (getattr(p, "use_heterogeneous_vocab", False), "heterogeneous vocabulary"),
        (getattr(p, "use_local_argmax_reduction", False), "local argmax reduction"),
        (p.eplb_state is not None, "EPLB"),
        (cfg.parallel_config.data_parallel_size > 1, "data parallel"),
        (getattr(p, "uses_xdrope_dim", 0) > 0 and getattr(p, "draft_uses_xdrope_dim", 0) > 0, "XD-RoPE"),
        (p.speculative_config.enforce_eager or cfg.model_config.enforce_eager, "eager mode"),
        (cuda and not str(p.device).startswith("cuda"), f"device {p.device} (CUDA graphs)"),
        (p.block_size <= 0, "no block size yet"),
    )
    for bad, why in checks:
        if bad:
            return why
    builders = [type(g.get_metadata_builder()).__name__ for g in p.draft_attn_groups]
    if not builders or any(b != "FlashAttentionMetadataBuilder" for b in builders):
        return f"draft attention {builders or 'none'} (FlashAttention only)"
    return None


class CudaGraphs:
    """capture(fn) -> replay: fn's kernels recorded into a CUDA graph (not run), on a side stream, in one
    memory pool for all of a proposer's graphs (they never run at once)."""

    def __init__(self):
        import torch
        self.torch, self.pool = torch, torch.cuda.graph_pool_handle()

    def capture(self, fn):
        import time
        from contextlib import ExitStack
        from unittest.mock import patch
        torch = self.torch
        graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        t0 = time.perf_counter()
        with ExitStack() as stack:
            # torch.cuda.graph empties the device and pinned-host caches before a capture. In a serving
            # process that frees what the next steps allocate again (vLLM's step copies use pinned host
            # memory), so a capture mid-serving would cost more than itself; vLLM's own captures skip the
            # same calls (vllm/compilation/cuda_graph.py, gc_disable).
            stack.enter_context(patch("torch.cuda.empty_cache", lambda *a, **k: None))
            if hasattr(torch._C, "_host_emptyCache"):
                stack.enter_context(patch("torch._C._host_emptyCache", lambda *a, **k: None))
            # thread_local: vLLM's other threads may touch CUDA meanwhile; only this thread must not sync.
            stack.enter_context(torch.cuda.graph(graph, pool=self.pool, stream=stream,
                                                 capture_error_mode="thread_local"))
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        self.last_ms = (time.perf_counter() - t0) * 1e3
        return graph.replay


def vllm_forward():
    """(set_forward_context, CUDAGraphMode.NONE): the pieces of vLLM the passes run under."""
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import set_forward_context
    return set_forward_context, CUDAGraphMode.NONE


class Chain:
    """Passes 2..K of one proposer: static inputs, one graph per (batch size, K), capture on first use."""

    def __init__(self, p, max_bs: int, graphs=None):
        import torch
        self.p, self.torch = p, torch
        self.recorder = graphs or CudaGraphs()
        self.max_bs = max(1, min(max_bs, p.max_batch_size))
        dev, n = p.device, self.max_bs
        self.ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.hidden = torch.zeros(n, p.hidden_size, dtype=p.dtype, device=dev)
        self.pos = torch.zeros((3, n) if p.uses_mrope else (n,), dtype=torch.int64, device=dev)
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=dev)
        self.block_table = None  # (n, blocks per request): its width is known at the first step
        self.out = None  # (n, K-1) draft tokens of passes 2..K
        self.graphs: dict[tuple[int, int], object] = {}  # (batch size, K) -> replay
        self.check = int(os.environ.get(CHECK_ENV) or 0)  # print the counts every this many steps
        self.steps = self.differ = 0

    def fits(self, cad, k: int) -> bool:
        bt = cad.block_table_tensor
        if self.block_table is None:
            self.block_table = self.torch.zeros(self.max_bs, bt.shape[1], dtype=bt.dtype, device=bt.device)
        if self.out is None or self.out.shape[1] < k - 1:
            self.out = self.torch.zeros(self.max_bs, k - 1, dtype=self.torch.int64, device=self.p.device)
        return bt.shape[1] == self.block_table.shape[1] and bt.dtype == self.block_table.dtype

    def load(self, bs, first, hidden, positions, cad, rejected) -> None:
        """This step's values into the graph's inputs (copies on the stream, no host sync)."""
        self.ids[:bs].copy_(first[:, 0])
        self.hidden[:bs].copy_(hidden)
        self.pos[..., :bs].copy_(positions)
        live = cad.seq_lens[:bs]
        if rejected is not None:
            self.torch.sub(live, rejected[:bs], out=self.seq_lens[:bs])
        else:
            self.seq_lens[:bs].copy_(live)
        self.block_table[:bs].copy_(cad.block_table_tensor[:bs])

    def metadata(self, cad, bs: int):
        """The chain's CommonAttentionMetadata over the static inputs; host fields as at capture."""
        import dataclasses
        p = self.p
        return dataclasses.replace(
            cad, query_start_loc=p.arange[: bs + 1],
            query_start_loc_cpu=self.torch.from_numpy(p.token_arange_np[: bs + 1]).clone(),
            seq_lens=self.seq_lens[:bs], num_reqs=bs, num_actual_tokens=bs, max_query_len=1,
            max_seq_len=p.max_model_len, block_table_tensor=self.block_table[:bs],
            slot_mapping=p._slot_mapping_buffer[:bs], _seq_lens_cpu=None, _num_computed_tokens_cpu=None,
            seq_lens_cpu_upper_bound=None, logits_indices_padded=None, num_logits_indices=None,
            dcp_local_seq_lens=None, dcp_local_seq_lens_cpu=None, positions=None, is_prefilling=None,
            _num_computed_tokens_cache=None, _token_to_req_indices_cache=None)

    def passes(self, cad, bs: int, k: int, sampling_metadata) -> None:
        """Draft passes 2..K over the static inputs, tokens into self.out[:bs]; capturable as it stands."""
        set_forward_context, no_graph = vllm_forward()
        p, cad = self.p, self.metadata(cad, bs)
        ids, hidden, positions = self.ids[:bs], self.hidden[:bs], self.pos[..., :bs]
        for t in range(k - 1):
            positions = p._update_positions_dependent_metadata(positions, cad, bs, bs, p.block_size)
            _, per_layer = p.build_per_group_and_layer_attn_metadata(cad, draft_index=t + 1)
            p.input_ids[:bs] = ids.int()
            p.hidden_states[:bs] = hidden
            kwargs = {"positions": p._get_positions(bs), "hidden_states": p.hidden_states[:bs]}
            if p.supports_mm_inputs:
                p.inputs_embeds[:bs] = p.model.embed_input_ids(p.input_ids[:bs])
                kwargs.update(input_ids=None, inputs_embeds=p.inputs_embeds[:bs])
            else:
                kwargs.update(input_ids=p.input_ids[:bs], inputs_embeds=None)
            with set_forward_context(per_layer, p.vllm_config, num_tokens=bs, num_tokens_across_dp=None,
                                     cudagraph_runtime_mode=no_graph,
                                     slot_mapping=p._get_slot_mapping(bs)):
                hidden = p.model(**kwargs)[:bs]
            ids, _ = p._sample_draft_tokens(hidden, sampling_metadata)
            self.out[:bs, t].copy_(ids)

    def run(self, cad, bs: int, k: int, sampling_metadata) -> None:
        """self.out[:bs] for this step: replay, or on a batch size's first step run eagerly, then capture."""
        torch, key = self.torch, (bs, k)
        replay = self.graphs.get(key)
        if replay is None:
            self.passes(cad, bs, k, sampling_metadata)  # this step's drafts, and the warm-up before capture
            self.graphs[key] = self.recorder.capture(lambda: self.passes(cad, bs, k, sampling_metadata))
            ms = getattr(self.recorder, "last_ms", None)
            say(f"draft chain graph captured for batch {bs}, K={k}" + (f" in {ms:.1f} ms" if ms is not None else ""))
            return
        if not self.check:
            replay()
            return
        saved = [t[..., :bs].clone() for t in (self.ids, self.hidden, self.pos, self.seq_lens)]
        saved.append(self.block_table[:bs].clone())
        replay()
        replayed = self.out[:bs, : k - 1].clone()
        for dst, src in zip((self.ids, self.hidden, self.pos, self.seq_lens), saved):
            dst[..., :bs].copy_(src)
        self.block_table[:bs].copy_(saved[-1])
        self.passes(cad, bs, k, sampling_metadata)
        self.steps += 1
        self.differ += int(not torch.equal(replayed, self.out[:bs, : k - 1]))
        if self.steps % self.check == 0:
            say(f"draft chain graph check: {self.steps} steps, {self.differ} with other drafts than eager")


def _argument(bound, name, default=None):
    return bound.arguments.get(name, default)


def patch_class(cls, max_bs: int, graphs=None) -> bool:
    """Wrap cls.propose; False when cls defines none (or is patched already)."""
    orig = cls.__dict__.get("propose")
    if orig is None or getattr(orig, _MARK, False):
        return False
    sig = inspect.signature(orig)

    def propose(self, *args, **kwargs):
        bound = sig.bind(self, *args, **kwargs)
        k = _argument(bound, "num_speculative_tokens")
        cad = _argument(bound, "common_attn_metadata")
        sm = _argument(bound, "sampling_metadata")
        try:  # deciding must not fail a step either: nothing has run yet, so vLLM's propose takes it whole
            chain = _chain_for(self, max_bs, graphs)
            usable = chain is not None and k is not None and k >= 2 and cad is not None
            bs = cad.batch_size() if usable else 0
            greedy = usable and (not self._enable_probabilistic_draft_probs or getattr(sm, "all_greedy", False))
            usable = usable and greedy and bs <= chain.max_bs and chain.fits(cad, k)
        except Exception as e:
            self._kit_chain, usable = False, False
            say(f"draft chain graph NOT active from now on ({type(e).__name__}: {e})")
        if not usable:
            return orig(*bound.args, **bound.kwargs)
        # The first pass, vLLM's own: propose with K=1 returns the first draft token; its hidden state is
        # the one the sampler saw (MTP heads return one tensor, so it is also the chain's input).
        seen = {}
        sample = self._sample_draft_tokens

        def grab(hidden_states, sampling_metadata):
            seen["hidden"] = hidden_states
            return sample(hidden_states, sampling_metadata)
        self._sample_draft_tokens = grab
        try:
            bound.arguments["num_speculative_tokens"] = 1
            first = orig(*bound.args, **bound.kwargs)
        finally:
            del self._sample_draft_tokens
            self.num_speculative_tokens = k
        tis = _argument(bound, "token_indices_to_sample")
        if tis is None:
            tis = cad.query_start_loc[1:] - 1
        positions = self.mrope_positions[:, tis] if self.uses_mrope else self.positions[tis]
        rejected = _argument(bound, "num_rejected_tokens_gpu")
        try:
            chain.load(bs, first, seen["hidden"], positions, cad, rejected)
            chain.run(cad, bs, k, sm)
        except Exception as e:  # never a failed step for the graph's sake: vLLM's own passes instead
            self._kit_chain = False
            say(f"draft chain graph NOT active from now on ({type(e).__name__}: {e})")
            return _finish_eagerly(self, orig, bound, k)
        # vLLM's passes leave the step's sequence lengths advanced in place; so does this.
        cad.seq_lens[:bs].copy_(chain.seq_lens[:bs])
        return chain.torch.cat([first, chain.out[:bs, : k - 1]], dim=1)

    setattr(propose, _MARK, True)
    cls.propose = propose
    return True


def _finish_eagerly(p, orig, bound, k):
    """After a failed capture the first pass has run and written the draft KV; running vLLM's whole
    propose again rewrites the same KV slots with the same values and returns all K drafts."""
    bound.arguments["num_speculative_tokens"] = k
    return orig(*bound.args, **bound.kwargs)


def _chain_for(p, max_bs: int, graphs=None):
    """The proposer's Chain, made on its first step; None (said once) where the chain cannot be graphed.
    graphs: the capture mechanism (CUDA graphs unless a test brings its own)."""
    chain = getattr(p, "_kit_chain", None)
    if chain is None:
        why = static_reason(p, cuda=graphs is None)
        if why:
            say(f"draft chain graph NOT active: {why}; vLLM's piecewise drafter")
            chain = False
        else:
            chain = Chain(p, max_bs, graphs)
            say(f"draft chain graph on for batches of 1..{chain.max_bs}")
        p._kit_chain = chain
    return chain or None


def install(target: str = TARGET) -> str:
    """Patch `target` when it is imported (now, if it already is); $KIT_DRAFT_GRAPH is the largest batch."""
    from scripts.patches.on_import import patch_classes
    max_bs = int(os.environ[ENV])
    return patch_classes(target, lambda cls: patch_class(cls, max_bs), "draft chain graph", "propose")
