"""LM_HEAD_W8=int8 (or fp8): a 16-bit lm_head's logits at decode's batch sizes come from an 8-bit copy of it (issue 29
item 3: "the target's 16-bit lm_head, FP8 or trimmed for the verify where quality allows, behind a key").

Why: every kit scheme keeps the lm_head 16-bit, and in Qwen3.5-4B it is the largest matrix a step reads: 248320 x
2560, 1.27 GB, 0.45 ms at the 5-token verify on an H100 (results/qwen3.5-4b-bf16/20261126T160142Z-gemm.json, 96% of
its floor). Read as 8-bit it is half the bytes. Qwen3 and Qwen3.5 tie it to the input embedding, so a checkpoint
cannot quantize it alone; this keeps the 16-bit weight for the embedding lookups and adds an 8-bit copy, one scale a
row (+0.64 GB for Qwen3.5-4B), that only the logits read.

INT8 or FP8: the same bytes and the same kernel (w8a16_kernel.py widens either), but not the same logits. FP8 e4m3
keeps 3 mantissa bits of every weight; INT8 under a row's scale keeps the large weights, which decide the logits,
to about 8 bits. On the tiny model's own lm_head INT8 kept far more top-1 tokens than FP8 did
(`python -m scripts.kit lm-head-check`, which measures both on any model's weights: run it before serving either).

How: $KIT_LM_HEAD_W8=int8|fp8 in the server's processes (Variant.to_env) patches vLLM's
UnquantizedEmbeddingMethod.apply, the method every 16-bit lm_head computes logits with (embedding lookups use its
embedding()). The first call makes the copy; vLLM's profile run makes that call (0.26's profile_run ends with a
dummy sampler run that computes logits, v1/worker/gpu_model_runner.py), before the KV cache is sized and before any
CUDA graph capture, and the kernel autotunes the shape then. From then on a batch of at most 16 rows
multiplies the 8-bit copy, a larger one the 16-bit weight as before. vLLM 0.26 computes logits eagerly, outside the
compiled graph, so the branch is plain Python.

LM_HEAD_VOCAB=N (issue 29's "trimmed for the verify where quality allows"): $KIT_LM_HEAD_VOCAB names a token-set file
(scripts/kit/draft_vocab.py's, the drafts' format), and the copy holds only those rows. A batch of up to 16 rows then
reads N rows, not the whole head (Qwen3.5-4B at 32768: 32801 rows, 84 MB, against 248320 rows, 636 MB), and every
other token's logit is -inf: the output can hold only the set's tokens there. Larger batches read the 16-bit head.

Read at every interpreter's start (sitecustomize.py): torch and vLLM are imported only in the hook.
"""
from __future__ import annotations

import os
import sys

ENV = "KIT_LM_HEAD_W8"
VOCAB_ENV = "KIT_LM_HEAD_VOCAB"  # LM_HEAD_VOCAB's set file (Variant.to_env)
TARGET = "vllm.model_executor.layers.vocab_parallel_embedding"
M_MAX = 16  # the kernel's largest batch (w8a16_kernel.BLOCK_M)
SCHEMES = {"int8": 127.0, "fp8": 448.0}  # the largest magnitude each holds: a row's absmax maps to it


CHUNK_ROWS = 8192  # rows widened to float32 at a time: 80 MB for a 2560-wide head, not 2.5 GB in vLLM's profile run


def quantize_rows(weight, scheme: str):
    """(8-bit [N, K], float32 scale [N]): each row scaled so its largest magnitude is the scheme's largest; INT8
    rounds to nearest, FP8 to e4m3. Done CHUNK_ROWS at a time: the first logits call is inside vLLM's memory
    profile, whose peak sizes the KV cache."""
    import torch
    top = SCHEMES[scheme]
    out = torch.empty(weight.shape, dtype=torch.int8 if scheme == "int8" else torch.float8_e4m3fn, device=weight.device)
    scale = torch.empty(weight.shape[0], dtype=torch.float32, device=weight.device)
    for i in range(0, weight.shape[0], CHUNK_ROWS):
        w = weight[i:i + CHUNK_ROWS].float()
        s = w.abs().amax(dim=1) / top
        s = torch.where(s > 0, s, torch.ones_like(s))
        q = (w / s[:, None]).clamp(-top, top)
        out[i:i + CHUNK_ROWS] = q.round().to(torch.int8) if scheme == "int8" else q.to(torch.float8_e4m3fn)
        scale[i:i + CHUNK_ROWS] = s
    return out, scale


def _runs_on(x) -> bool:
    return x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


def set_ids(path: str, rows: int) -> list[int]:
    """The ids of LM_HEAD_VOCAB's set file below the head's `rows` (a padded head has more rows than the tokenizer)."""
    from scripts.kit.draft_vocab import load_ids
    ids = [i for i in load_ids(path) if i < rows]
    if not ids:
        raise ValueError(f"{path}: no id below the lm_head's {rows} rows")
    return ids


def _make_copy(layer, scheme: str, vocab: str):
    """(8-bit rows, scales, ids tensor or None): the whole head's copy, or only the rows of `vocab`'s set."""
    w = layer.weight.detach()
    if not vocab:
        return (*quantize_rows(w, scheme), None)
    import torch
    ids = torch.tensor(set_ids(vocab, w.shape[0]), dtype=torch.long, device=w.device)
    return (*quantize_rows(w.index_select(0, ids), scheme), ids)


def trimmed(y_set, ids, rows: int):
    """The [M, rows] logits from the set's [M, len(ids)]: -inf everywhere else, so no other token can win or be
    sampled."""
    import torch
    y = torch.full((y_set.shape[0], rows), float("-inf"), dtype=y_set.dtype, device=y_set.device)
    return y.index_copy_(1, ids, y_set)


def patch_module(mod, scheme: str, vocab: str = "") -> None:
    import torch
    cls = mod.UnquantizedEmbeddingMethod
    if getattr(cls.apply, "_kit_lm_head_w8", None):
        return
    orig = cls.apply

    def apply(self, layer, x, bias=None):
        if torch.compiler.is_compiling() or not _runs_on(x):
            return orig(self, layer, x, bias)
        from scripts.patches.w8a16_kernel import w8a16_matmul
        c = layer.__dict__.get("_kit_w8")
        if c is None:  # the first logits call: vLLM's profile run
            c = layer.__dict__["_kit_w8"] = _make_copy(layer, scheme, vocab)
            w8a16_matmul(x[:1].reshape(1, -1), c[0], c[1])  # autotune this shape now, not in a served step
            print(f"kit: lm_head {scheme} copy {tuple(c[0].shape)}, one scale a row, for batches up to {M_MAX}"
                  + (f": only the {c[0].shape[0]} tokens of LM_HEAD_VOCAB's set ({vocab}) can be produced there, every "
                     f"other of the {layer.weight.shape[0]} rows' logit is -inf" if vocab else ""),
                  file=sys.stderr, flush=True)
        if x.dim() != 2 or not 0 < x.shape[0] <= M_MAX:
            return orig(self, layer, x, bias)
        y = w8a16_matmul(x, c[0], c[1])
        if c[2] is not None:
            y = trimmed(y, c[2], layer.weight.shape[0])
        return y if bias is None else y + bias

    apply._kit_lm_head_w8 = scheme
    cls.apply = apply


def install(target: str = TARGET) -> bool:
    """Patch `target` when it is imported (now, if it already is), if $KIT_LM_HEAD_W8 names a scheme."""
    scheme = os.environ.get(ENV, "")
    if scheme not in SCHEMES:
        if scheme:
            print(f"kit: {ENV}={scheme!r} is neither of {', '.join(SCHEMES)}: lm_head left 16-bit", file=sys.stderr)
        return False
    from scripts.patches.on_import import after_import
    vocab = os.environ.get(VOCAB_ENV, "")
    after_import(target, lambda mod: patch_module(mod, scheme, vocab))
    return True
