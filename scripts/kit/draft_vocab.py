"""Draft-vocabulary trimming for MTP (issue 19 item 3): the token set a draft proposes from.

Each MTP draft pass reads the full 16-bit lm_head (Qwen3.5-4B: 248k rows x 2560, 1.27 GB), and on the
H100 that GEMM was 1.77 of a K=4 step's 2.42 ms of draft GPU time
(results/gpu-sessions/20261125T2020Z/README.md). With SPEC_DRAFT_VOCAB=N the draft picks its greedy token
among the N most frequent tokens of calibration text (plus every special token), reading N rows. The
target still verifies over the full vocabulary, so the output is unchanged; what can change is how
often a draft is accepted (a token outside the set is never proposed). That is measurable only on real
weights: the probe's acceptance per position, with and without the set.

The set is computed once, with the model's real tokenizer, and stored beside the weights:
weights/<MODEL>/draft-vocab-<N>.json (ids sorted, the calibration source and how much of it the set
covers). The server side is scripts/patches/draft_vocab.py.

    python -m scripts.kit draft-vocab --variant qwen3.5-4b-bf16-tuned --set SPEC_DRAFT_VOCAB=32768 [--text FILE ...]

LM_HEAD_VOCAB=N (scripts/patches/lm_head_w8.py) takes a set from the same file for the target's own logits; unlike the
drafts', that one changes the output.
"""
from __future__ import annotations

import collections
import json
from pathlib import Path

from .errors import KitError
from .paths import ROOT, WEIGHTS, atomic_write, rel

ENV = "KIT_DRAFT_VOCAB"  # the set's file, for the server's processes (sitecustomize.py)


def path_for(model: str, size: int) -> Path:
    """Where the set for MODEL and N lives (shared by its real, dummy and quantized folders: one tokenizer)."""
    return WEIGHTS / model.replace("/", "--") / f"draft-vocab-{size}.json"


def build(tokenizer, texts: list[str], size: int) -> dict:
    """The N most frequent token ids of `texts` (ties: lower id first) plus every special token, sorted,
    and the share of the texts' tokens the set covers."""
    if size < 1:
        raise KitError(f"draft vocabulary size {size}: need at least 1")
    counts: collections.Counter = collections.Counter()
    for t in texts:
        counts.update(tokenizer.encode(t, add_special_tokens=False))
    total = sum(counts.values())
    if not total:
        raise KitError("calibration text gave no tokens")
    vocab = len(tokenizer)
    if size >= vocab:
        raise KitError(f"draft vocabulary size {size} is not below the tokenizer's {vocab} tokens: nothing to trim")
    top = [i for i, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:size]]
    # Text with fewer distinct tokens than N: the rest by id, lowest first. Byte-level BPE ids follow merge
    # rank, which follows frequency in the tokenizer's own training text (Qwen's ranks do).
    chosen = set(top)
    fill = (i for i in range(vocab) if i not in chosen)
    while len(chosen) < size:
        chosen.add(next(fill))
    ids = sorted(chosen | set(tokenizer.all_special_ids))
    covered = sum(counts[i] for i in ids)
    return {"size": size, "ids": ids, "vocab_size": vocab, "special_ids": sorted(tokenizer.all_special_ids),
            "calibration_tokens": total, "distinct_tokens_seen": len(counts),
            "filled_by_rank": max(0, size - len(top)), "coverage": round(covered / total, 6)}


def load_ids(path: str | Path) -> list[int]:
    """The ids of a set file; a missing or malformed file is one clear error."""
    try:
        doc = json.loads(Path(path).read_text())
        ids = doc["ids"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise KitError(f"{path}: not a draft-vocabulary file ({e}); make one: python -m scripts.kit draft-vocab") from None
    if not ids or any(not isinstance(i, int) or i < 0 for i in ids) or ids != sorted(set(ids)):
        raise KitError(f"{path}: ids must be sorted, distinct, non-negative integers")
    return ids


def tokenizer_for(variant):
    """The variant's real tokenizer: from its weights folder (real or dummy, both carry it)."""
    from transformers import AutoTokenizer
    d = variant.weights_dir
    if not (d / "tokenizer_config.json").is_file() and not (d / "tokenizer.json").is_file():
        how = f"make download VARIANT={variant.name}" + (" SET=WEIGHTS=dummy" if variant["WEIGHTS"] == "dummy" else "")
        raise KitError(f"no tokenizer in {rel(d)} (run: {how})")
    return AutoTokenizer.from_pretrained(str(d))


KEYS = ("SPEC_DRAFT_VOCAB", "LM_HEAD_VOCAB")  # the keys that name a set: the drafts' and the target's logits


def sizes(variant) -> dict[str, int]:
    """{key: N} for each of KEYS the variant sets (one file per N: equal sizes share it)."""
    return {k: int(variant[k] or 0) for k in KEYS if int(variant[k] or 0)}


def make(variant, texts: list[str] | None = None, source: str | None = None) -> list[Path]:
    """Build and write the set each of SPEC_DRAFT_VOCAB and LM_HEAD_VOCAB names for `variant` (the same file where
    they are equal); the kit's calibration text by default."""
    want = sorted(set(sizes(variant).values()))
    if not want:
        raise KitError(f"{variant.name}: SPEC_DRAFT_VOCAB and LM_HEAD_VOCAB are 0; pass --set SPEC_DRAFT_VOCAB=N")
    if texts is None:
        from .quant import kit_texts, texts_sha256
        texts = kit_texts("calib")
        source = f"the kit's calibration text (scripts/kit/quant.py kit_texts('calib'), sha256 {texts_sha256(texts)[:12]})"
    tok, outs = tokenizer_for(variant), []
    for size in want:
        doc = build(tok, texts, size)
        doc = {"model": variant["MODEL"], "calibration": source, **doc}
        out = path_for(variant["MODEL"], size)
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out, json.dumps(doc, indent=1) + "\n")
        outs.append(out)
    return outs


def require(variant) -> list[Path]:
    """The files of the sets the variant names (SPEC_DRAFT_VOCAB, LM_HEAD_VOCAB), or a KitError naming the key and the
    command that makes its file."""
    found = []
    for key, size in sizes(variant).items():
        f = path_for(variant["MODEL"], size)
        if not f.is_file():
            sets = [f"--set {k}={variant[k]}" for k in ("WEIGHTS", *KEYS) if variant.sources.get(k, "").startswith("--set")]
            raise KitError(f"{key}={size}: the token set for {variant.name} is missing: {rel(f)} (run: python -m "
                           f"scripts.kit draft-vocab --variant {variant.name}{''.join(' ' + x for x in sets)})")
        load_ids(f)
        found.append(f)
    return found
