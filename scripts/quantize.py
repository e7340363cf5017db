"""`make quantize VARIANT=...`: llm-compressor one-shot -> compressed-tensors checkpoint (AWQ W4A16 or FP8 dynamic).

Runs in .venv-quant (llm-compressor pins compressed-tensors 0.19, vLLM 0.17). Reads the variant's
source folder (v.base_weights_dir, made by `make download`) and publishes v.weights_dir
(weights/<org>--<name>/awq-w4a16-g<G>-<scope>/) holding:
  - the compressed-tensors checkpoint (lm_head, vision tower and MTP kept 16-bit, and under AWQ the
    Gated-DeltaNet projections too; Qwen3.5's mtp.* tensors copied unquantized from the source,
    llm-compressor PR #2486);
  - recipe.yaml: the exact recipe given to llm-compressor (scripts.kit.quant.recipe);
  - kit-manifest.json: source + revision, recipe sha256, calibration source/hash/size, seed,
    tool versions, sha256 of every file;
  - .kit-complete, written last by an atomic rename of the staging folder. A failed or interrupted
    run publishes nothing; its staging folder is removed by the next run.
It then writes a `quantize` record (schemas/payloads/quantize.schema.json) to results/<variant>/.
A run that fails once it has started (calibration, llm-compressor, the checks) writes one too, with
status "failed" and the error, then exits non-zero; bad input (no source weights, QUANT=none) writes none.

Verification (skip with --no-verify): the checkpoint is reloaded with transformers (refused if any
weight is missing, unexpected or mismatched) and scored against the source on the kit's held-out
text; held-out perplexity ratio > QUANT_PPL_MAX_RATIO fails the command and publishes nothing.

    python -m scripts.quantize --variant qwen3.5-4b-awq                    # hub calibration
    python -m scripts.quantize --variant tiny --set QUANT=awq_w4a16 --set QUANT_SCOPE=linear \\
        --set QUANT_CALIB=kit --set QUANT_CALIB_SAMPLES=8 --set QUANT_CALIB_SEQ_LEN=128 --set QUANT_N_GRID=5
    python -m scripts.quantize --variant qwen3-4b-awq --random-source --set QUANT_CALIB=kit
        # offline GPU host: random bf16 weights of the real architecture (ARCH_CONFIG) as the source
    python -m scripts.quantize --variant qwen3.5-4b-fp8      # FP8 dynamic: no calibration text at all
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import sys
import time
from pathlib import Path

from scripts.kit import quant, weights
from scripts.kit.errors import KitError, run_main
from scripts.kit.paths import RESULTS, ROOT, sha256_file
from scripts.kit.record import make_record, versions, write_record
from scripts.kit.variant import load
from scripts.serve import add_variant_args

MANIFEST = "kit-manifest.json"
RECIPE = "recipe.yaml"
HUB_CALIB = ("HuggingFaceH4/ultrachat_200k", "train_sft")  # llm-compressor's AWQ examples use it


# -- sources ---------------------------------------------------------------------------------------
def mtp_layers(cfg: dict) -> int:
    """mtp_num_hidden_layers, top level (what vLLM 0.26 reads) or in text_config."""
    return int(cfg.get("mtp_num_hidden_layers") or (cfg.get("text_config") or {}).get("mtp_num_hidden_layers") or 0)


def weight_map(d: Path) -> dict[str, str]:
    """tensor name -> shard file, over every safetensors file in d (index or not)."""
    from safetensors import safe_open
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            out.update({k: f.name for k in st.keys()})
    return out


def build_random_source(v) -> Path:
    """v.base_weights_dir with random bf16 weights of ARCH_CONFIG's architecture, the real Qwen
    tokenizer, and (for Qwen3.5) random mtp.* tensors of the real shapes, which transformers does not
    build: they exist so the MTP copy path of the quantizer is exercised exactly as with real weights."""
    import torch
    import transformers
    from safetensors.torch import save_file
    if not v["ARCH_CONFIG"]:
        raise KitError(f"--random-source: variant {v.name} has no ARCH_CONFIG")
    arch = json.loads((ROOT / v["ARCH_CONFIG"]).read_text())
    final = v.base_weights_dir
    tmp = weights._staging(final)
    try:
        config = transformers.AutoConfig.for_model(**arch)
        cls = getattr(transformers, arch["architectures"][0])
        torch.manual_seed(quant.SEED)
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        with torch.device(dev):
            model = cls._from_config(config, dtype=torch.bfloat16)
        model.save_pretrained(tmp)
        n_mtp = mtp_layers(arch)
        if n_mtp:
            # An MTP layer is a full-attention decoder layer (vLLM qwen3_5_mtp.py) plus fc [H, 2H] and
            # three norms; take shapes from the model's first full-attention layer.
            layer = next(m for n, m in model.named_modules() if n.split(".")[-2:-1] == ["layers"]
                         and hasattr(m, "self_attn"))
            gen = torch.Generator(device=dev).manual_seed(quant.SEED + 1)
            rnd = lambda t: (torch.randn(t.shape, generator=gen, device=dev) * 0.02).to(t.dtype) if t.dim() > 1 else t.clone()
            mtp = {f"mtp.layers.{i}.{k}": rnd(t) for i in range(n_mtp) for k, t in layer.state_dict().items()}
            hidden = config.get_text_config().hidden_size
            norm = layer.input_layernorm.weight
            mtp.update({"mtp.fc.weight": rnd(torch.empty(hidden, 2 * hidden, dtype=torch.bfloat16)),
                        "mtp.norm.weight": norm.clone(), "mtp.pre_fc_norm_hidden.weight": norm.clone(),
                        "mtp.pre_fc_norm_embedding.weight": norm.clone()})
            save_file({k: t.contiguous().cpu() for k, t in mtp.items()}, str(tmp / "model-mtp.safetensors"),
                      metadata={"format": "pt"})
            # An index over all shards, as real multi-shard checkpoints have; transformers skips mtp.*.
            wm = weight_map(tmp)
            size = sum(f.stat().st_size for f in tmp.glob("*.safetensors"))
            (tmp / "model.safetensors.index.json").write_text(json.dumps(
                {"metadata": {"total_size": size}, "weight_map": dict(sorted(wm.items()))}, indent=2))
            single = tmp / "model.safetensors"
            if single.exists():  # with an index, shards must not be named like the single-file checkpoint
                single.rename(tmp / "model-00001-of-00001.safetensors")
                wm = weight_map(tmp)
                (tmp / "model.safetensors.index.json").write_text(json.dumps(
                    {"metadata": {"total_size": size}, "weight_map": dict(sorted(wm.items()))}, indent=2))
        if v["DUMMY_TOKENIZER"] != "none":
            weights.qwen_tokenizer(v["DUMMY_TOKENIZER"]).save_pretrained(tmp)
        (tmp / "kit-source.json").write_text(json.dumps({
            "random": True, "arch_config": v["ARCH_CONFIG"],
            "arch_config_sha256": sha256_file(ROOT / v["ARCH_CONFIG"]), "seed": quant.SEED,
            "mtp_tensors": n_mtp and sum(1 for k in weight_map(tmp) if k.startswith("mtp."))}, indent=2) + "\n")
        del model
        return weights._publish(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- calibration -------------------------------------------------------------------------------------
def _windows(tok, texts: list[str], n: int, seq_len: int, what: str) -> list[list[int]]:
    """Concatenate documents and cut non-overlapping seq_len-token windows (pile-val style)."""
    ids = tok("\n\n".join(texts), add_special_tokens=False)["input_ids"]
    wins = [ids[i:i + seq_len] for i in range(0, len(ids) - seq_len + 1, seq_len)]
    if len(wins) < n:
        raise KitError(f"{what}: {len(ids)} tokens make {len(wins)} windows of {seq_len}, {n} needed "
                       "(lower QUANT_CALIB_SAMPLES / QUANT_CALIB_SEQ_LEN or give more text)")
    return wins


def _read_path(p: Path) -> list[str]:
    if not p.is_file():
        raise KitError(f"QUANT_CALIB={p}: no such file (use hub, kit, or a .txt/.jsonl path)")
    if p.suffix == ".jsonl":
        out = []
        for no, line in enumerate(p.read_text().splitlines(), 1):
            if line.strip():
                row = json.loads(line)
                if "text" not in row:
                    raise KitError(f"{p}:{no}: each JSONL line needs a \"text\" field")
                out.append(row["text"])
        return out
    return [t.strip() for t in p.read_text().split("\n\n") if t.strip()]


def calibration(v, tok) -> tuple[list[list[int]], dict]:
    """Token windows for AWQ and their description (source, sha256 of the token ids, size, seed);
    ([], None) for a scheme that needs no calibration (FP8 dynamic)."""
    if not quant.needs_calibration(v):
        return [], None
    src, n, seq = v["QUANT_CALIB"], v["QUANT_CALIB_SAMPLES"], v["QUANT_CALIB_SEQ_LEN"]
    if src == "hub":
        from datasets import load_dataset
        ds = load_dataset(*HUB_CALIB[:1], split=HUB_CALIB[1]).shuffle(seed=quant.SEED).select(range(n))
        # Chat-formatted conversations, one per sample, truncated (llm-compressor's AWQ examples).
        samples = [tok(tok.apply_chat_template(r["messages"], tokenize=False), add_special_tokens=False,
                       truncation=True, max_length=seq)["input_ids"] for r in ds]
        label = f"hub:{HUB_CALIB[0]}:{HUB_CALIB[1]}"
    else:
        texts = quant.kit_texts("calib") if src == "kit" else _read_path(Path(src))
        wins = _windows(tok, texts, n, seq, f"QUANT_CALIB={src}")
        samples = random.Random(quant.SEED).sample(wins, n)
        label = "kit:stdlib-docstrings" if src == "kit" else f"path:{src}"
    h = hashlib.sha256(json.dumps(samples, separators=(",", ":")).encode()).hexdigest()
    return samples, {"source": label, "sha256": h, "samples": len(samples), "seq_len": seq,
                     "tokens": sum(map(len, samples)), "seed": quant.SEED}


# -- quantize, check, verify -----------------------------------------------------------------------
def _no_pin_memory_without_accelerator() -> None:
    # llm-compressor 0.14.0.1's AWQ pins cached activations for async host->device copies; with no
    # accelerator torch has no pinned-memory allocator and the call fails, and there is no copy to speed up.
    import torch
    from llmcompressor.pipelines.cache import IntermediatesCache
    if not torch.accelerator.is_available():
        IntermediatesCache.pin_memory = lambda self, *a, **k: None


def run_oneshot(v, src: Path, out: Path, samples: list[list[int]], dtype) -> None:
    import torch
    import transformers
    from datasets import Dataset
    from llmcompressor import oneshot
    _no_pin_memory_without_accelerator()
    cfg = json.loads((src / "config.json").read_text())
    cls = getattr(transformers, cfg["architectures"][0])
    model = cls.from_pretrained(str(src), dtype=dtype)
    tok = transformers.AutoTokenizer.from_pretrained(str(src))
    if samples:
        ds = Dataset.from_dict({"input_ids": samples, "attention_mask": [[1] * len(s) for s in samples]})
        # The tokenizer as processor: VL checkpoints (Qwen3.5) otherwise make llm-compressor look for an
        # image processor, which text-only calibration does not need.
        oneshot(model=model, processor=tok, dataset=ds, recipe=quant.recipe_yaml(v),
                max_seq_length=max(map(len, samples)), num_calibration_samples=len(samples),
                shuffle_calibration_samples=False)
    else:  # data-free (FP8 dynamic): scales come from the weights
        oneshot(model=model, processor=tok, recipe=quant.recipe_yaml(v))
    # Calibrated in fp32 on CPU (bf16 matmuls are ~6x slower on AVX2), but shipped in the source's
    # dtype: the served checkpoint must not depend on the machine that made it.
    model.to(getattr(torch, cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"))
    model.save_pretrained(str(out), save_compressed=True)
    tok.save_pretrained(str(out))
    # llm-compressor writes its own serialization of the session recipe; keep the exact input
    # instead, so recipe_sha256 is a function of the variant alone.
    (out / RECIPE).write_text(quant.recipe_yaml(v))


def check_checkpoint(v, src: Path, out: Path) -> dict:
    """What the serving side relies on, read back from disk (field.md H6 for MTP)."""
    cfg = json.loads((out / "config.json").read_text())
    qc = cfg.get("quantization_config") or {}
    where = f"{out / 'config.json'}"
    if qc.get("quant_method") != "compressed-tensors":
        raise KitError(f"{where}: quant_method is {qc.get('quant_method')!r}, not compressed-tensors")
    schemes = [g["weights"] for g in qc.get("config_groups", {}).values()]
    want = quant.weight_scheme(v)
    got = [{k: s.get(k) for k in ("num_bits", "type", "strategy", "group_size")} for s in schemes]
    if got != [{k: want[k] for k in ("num_bits", "type", "strategy", "group_size")}]:
        raise KitError(f"{where}: weight schemes {got}, expected one group of {want['num_bits']}-bit {want['type']} "
                       f"{want['strategy']} (group size {want['group_size']})")
    acts = [g.get("input_activations") for g in qc.get("config_groups", {}).values()]
    if [bool(a and a.get("dynamic")) for a in acts] != [bool(quant.activation_scheme(v))]:
        raise KitError(f"{where}: input activation schemes {acts} do not match QUANT={v['QUANT']}")
    if qc.get("format") != quant.FORMATS[v["QUANT"]]:
        raise KitError(f"{where}: format {qc.get('format')!r}, expected {quant.FORMATS[v['QUANT']]!r}")
    if "lm_head" not in qc.get("ignore", []):
        raise KitError(f"{where}: lm_head is not in quantization_config.ignore")
    src_cfg = json.loads((src / "config.json").read_text())
    n_mtp, mtp_src = mtp_layers(src_cfg), [k for k in weight_map(src) if k.startswith("mtp.")]
    mtp_out = [k for k in weight_map(out) if k.startswith("mtp.")]
    if n_mtp:
        if mtp_layers(cfg) != n_mtp or cfg.get("mtp_num_hidden_layers", n_mtp) != src_cfg.get("mtp_num_hidden_layers", n_mtp):
            raise KitError(f"{where}: mtp_num_hidden_layers lost (source {n_mtp}, output {mtp_layers(cfg)})")
        if not mtp_src:
            raise KitError(f"{src}: config says mtp_num_hidden_layers={n_mtp} but the checkpoint has no mtp.* tensors")
        if sorted(mtp_out) != sorted(mtp_src):
            raise KitError(f"{out}: {len(mtp_out)} mtp.* tensors, source has {len(mtp_src)}")
        if not any("mtp" in p for p in qc.get("ignore", [])):
            raise KitError(f"{where}: MTP is not in quantization_config.ignore (vLLM would build it quantized)")
    return {"quant_method": qc["quant_method"], "format": qc.get("format"), "group_size": want["group_size"],
            "scheme": v["QUANT"],
            "ignore": qc.get("ignore", []), "mtp_num_hidden_layers": n_mtp, "mtp_tensors": len(mtp_out)}


def _load_checked(d: Path, dtype, device: str, allow_unexpected: tuple = ()):
    import re
    import transformers
    cfg = json.loads((d / "config.json").read_text())
    cls = getattr(transformers, cfg["architectures"][0])
    kw = {}
    if "quantization_config" in cfg:
        # Decompress once at load: the default runs compressed and unpacks every weight on every
        # forward (~30x slower on CPU).
        kw["quantization_config"] = transformers.CompressedTensorsConfig(run_compressed=False)
    model, info = cls.from_pretrained(str(d), dtype=dtype, output_loading_info=True, **kw)
    if "quantization_config" in cfg:
        # transformers (5.17) hands the decompressed model to compressed-tensors' (0.19) offloading
        # ("Dispatching model"): each module's parameters live in a CPU cache, and .to(device) writes
        # back into that cache. On the H100 (2026-11-23) the checkpoint was scored on the CPU: 29 s a
        # window for Qwen3-4B, 71 for Qwen3.5-4B. Undo the dispatch so that .to(device) moves the weights.
        from compressed_tensors.offload import remove_dispatch
        remove_dispatch(model)
    unexpected = [k for k in info.get("unexpected_keys", []) if not any(re.match(p, k) for p in allow_unexpected)]
    bad = {k: sorted(info.get(k) or []) for k in ("missing_keys", "mismatched_keys", "error_msgs")}
    bad["unexpected_keys"] = sorted(unexpected)
    bad = {k: val for k, val in bad.items() if val}
    if bad:
        raise KitError(f"{d}: transformers loaded it with problems: " + "; ".join(
            f"{k}: {len(val)} e.g. {val[:3]}" for k, val in bad.items()))
    return model.to(device).eval()


def verify(out: Path, src: Path, dtype, max_ratio: float) -> dict:
    """Held-out perplexity ratio and top-1 next-token agreement, quantized vs source."""
    import torch
    import transformers
    from tqdm import tqdm
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tok = transformers.AutoTokenizer.from_pretrained(str(src))
    wins = _windows(tok, quant.kit_texts("heldout"), quant.VERIFY_WINDOWS, quant.VERIFY_SEQ_LEN, "held-out text")
    wins = wins[:quant.VERIFY_WINDOWS]
    # mtp.* is in the files on purpose; transformers' Qwen3.5 classes list it as ignorable.
    quant_model = _load_checked(out, dtype, device, allow_unexpected=(r"^mtp\.",))
    src_model = _load_checked(src, dtype, device, allow_unexpected=(r"^mtp\.",))
    # Where the weights really are while scored (see _load_checked).
    devices = {k: str(next(m.parameters()).device) for k, m in (("source", src_model), ("quant", quant_model))}
    if any(not d.startswith(device) for d in devices.values()):
        print(f"warning: verification asked for {device} but runs on {devices} (slow on a CPU)", file=sys.stderr)
    nll = {"source": 0.0, "quant": 0.0}
    agree = n = 0
    with torch.no_grad():
        for w in tqdm(wins, desc="verify (held-out windows)", unit="win"):
            ids = torch.tensor([w], device=device)
            # Each model on its own device (the record names them), the loss on `device`.
            logits = {k: m(input_ids=ids.to(m.device)).logits[0, :-1].float().to(device)
                      for k, m in (("source", src_model), ("quant", quant_model))}
            for k, lg in logits.items():
                nll[k] += torch.nn.functional.cross_entropy(lg, ids[0, 1:], reduction="sum").item()
            agree += (logits["source"].argmax(-1) == logits["quant"].argmax(-1)).sum().item()
            n += len(w) - 1
    import math
    ppl = {k: math.exp(val / n) for k, val in nll.items()}
    ratio = ppl["quant"] / ppl["source"]
    return {"ppl_source": round(ppl["source"], 4), "ppl_quant": round(ppl["quant"], 4), "ppl_ratio": round(ratio, 5),
            "top1_agreement": round(agree / n, 5), "tokens": n, "max_ratio": max_ratio, "devices": devices,
            "heldout_sha256": quant.texts_sha256(quant.kit_texts("heldout")), "passed": ratio <= max_ratio}


def write_manifest(v, src: Path, out: Path, calib: dict) -> str:
    source = {"model": v["MODEL"], "revision": v["REVISION"], "dir": str(src.relative_to(ROOT)) if ROOT in src.parents else str(src),
              "config_sha256": sha256_file(src / "config.json")}
    if (src / "kit-source.json").is_file():
        source["random"] = json.loads((src / "kit-source.json").read_text())
    files = {p.name: sha256_file(p) for p in sorted(out.iterdir()) if p.is_file() and p.name != MANIFEST}
    doc = {"schema_version": 1, "variant": v.name, "config_sha256": v.config_sha256, "source": source,
           "recipe_sha256": files[RECIPE], "calibration": calib, "seed": quant.SEED,
           "tool_versions": versions(), "files": files}
    (out / MANIFEST).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return sha256_file(out / MANIFEST)


def _dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.iterdir() if p.is_file())


def _rel_or_abs(p: Path) -> str:
    return str(p.relative_to(ROOT)) if ROOT in p.parents else str(p)


def record_failure(v, a, src: Path, out: Path, t0: float, timings: dict, err: BaseException) -> Path | None:
    """The `quantize` record of a run that raised after it started: what it was making, how far it
    got (timings_s) and the error. Never masks the error: a record that cannot be written is reported."""
    payload = {"status": "failed", "error": f"{type(err).__name__}: {err}"[:4000], "published": False,
               "weights_dir": _rel_or_abs(out), "source_dir": _rel_or_abs(src),
               "random_source": (src / "kit-source.json").is_file(),
               "timings_s": {**timings, "total_s": round(time.time() - t0, 2)}}
    try:
        path = write_record(make_record("quantize", v, payload, started=t0), root=a.results)
    except Exception as e:  # noqa: BLE001 - the run's own error is the one to raise
        print(f"warning: the failure record could not be written: {type(e).__name__}: {e}", file=sys.stderr)
        return None
    print(f"record (failed): {path}", file=sys.stderr)
    from scripts.report import refresh_after_write
    refresh_after_write(path)
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="make quantize", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_variant_args(p)
    p.add_argument("--no-verify", action="store_true",
                   help="skip the reload and the held-out perplexity / top-1 scoring against the source (the "
                        "checkpoint's scheme, ignore list and MTP tensors are still checked; the record's verify is null)")
    p.add_argument("--force", action="store_true", help="redo even if the output folder is complete")
    p.add_argument("--random-source", action="store_true",
                   help="build the source folder with random bf16 weights from ARCH_CONFIG if it is missing (no hub)")
    p.add_argument("--out", type=Path, help="output folder (default: the variant's weights folder; tests)")
    p.add_argument("--results", type=Path, default=RESULTS, help="records root (default: results/; tests)")
    a = p.parse_args(argv)
    v = load(a.variant, a.set)
    if v["QUANT"] == "none":
        raise KitError(f"variant {v.name} has QUANT=none: nothing to quantize (use an AWQ variant, e.g. "
                       "make quantize VARIANT=qwen3.5-4b-awq, or SET=QUANT=awq_w4a16)")
    if v["WEIGHTS"] == "dummy":
        raise KitError(f"WEIGHTS=dummy has no weights to quantize: make download VARIANT={v.name} SET=WEIGHTS=dummy "
                       "builds the dummy W4A16 folder directly")
    src, out = v.base_weights_dir, (a.out or v.weights_dir).resolve()
    t0 = time.time()
    if not weights.is_complete(src):
        if not a.random_source:
            raise KitError(f"source weights missing: {src} (run: make download VARIANT={v.name}, "
                           "or --random-source for random weights of ARCH_CONFIG)")
        print(f"building random source {src}", file=sys.stderr)
        build_random_source(v)
    if weights.is_complete(out) and not a.force:
        print(f"ok: {out} is complete (--force to redo)", file=sys.stderr)
        return 0
    for stale in out.parent.glob(f".{out.name}.*"):  # an interrupted earlier run
        print(f"removing leftover staging folder {stale}", file=sys.stderr)
        shutil.rmtree(stale, ignore_errors=True)

    import torch
    from tqdm import tqdm
    # fp32 calibration on CPU: bf16 matmuls on AVX2 took 22 min vs 37 s for the same job (cpu.md §3).
    dtype = torch.bfloat16 if torch.accelerator.is_available() else torch.float32
    timings, tmp = {}, weights._staging(out)
    recorded = False
    try:
        stages = tqdm(total=4, desc="quantize", unit="stage", file=sys.stderr)
        t = time.time()
        tok = __import__("transformers").AutoTokenizer.from_pretrained(str(src))
        samples, calib = calibration(v, tok)
        timings["calibration_data_s"] = round(time.time() - t, 2)
        stages.update()
        stages.set_postfix_str(f"{v['QUANT']} (per-layer progress from llm-compressor)")
        t = time.time()
        run_oneshot(v, src, tmp, samples, dtype)
        timings["awq_s" if quant.needs_calibration(v) else "oneshot_s"] = round(time.time() - t, 2)
        stages.update()
        stages.set_postfix_str("checking checkpoint")
        checks = check_checkpoint(v, src, tmp)
        stages.update()
        result = None
        if not a.no_verify:
            stages.set_postfix_str("verifying")
            t = time.time()
            result = verify(tmp, src, dtype, v["QUANT_PPL_MAX_RATIO"])
            timings["verify_s"] = round(time.time() - t, 2)
        stages.update()
        stages.close()
        published = result is None or result["passed"]
        manifest_sha = write_manifest(v, src, tmp, calib)
        payload = {"status": "ok", "weights_dir": _rel_or_abs(out), "published": published,
                   "source_dir": _rel_or_abs(src),
                   "random_source": (src / "kit-source.json").is_file(),
                   "recipe_sha256": sha256_file(tmp / RECIPE), "manifest_sha256": manifest_sha,
                   "scheme": v["QUANT"], "calibration": calib,
                   "n_grid": v["QUANT_N_GRID"] if quant.needs_calibration(v) else None,
                   "calibration_dtype": str(dtype).removeprefix("torch."),
                   "device": "cuda" if torch.cuda.is_available() else "cpu", "checkpoint": checks,
                   "verify": result, "size_bytes": {"source": _dir_bytes(src), "quantized": _dir_bytes(tmp)},
                   "timings_s": {**timings, "total_s": round(time.time() - t0, 2)}}
        if published:
            weights._publish(tmp, out)
        rec = write_record(make_record("quantize", v, payload, started=t0), root=a.results)
        recorded = True
        print(f"record: {rec}", file=sys.stderr)
        from scripts.report import refresh_after_write
        refresh_after_write(rec)
        if not published:
            raise KitError(f"held-out perplexity ratio {result['ppl_ratio']} > QUANT_PPL_MAX_RATIO={result['max_ratio']} "
                           f"(top-1 agreement {result['top1_agreement']}); nothing published")
        print(f"ok: {out} ({payload['size_bytes']['quantized'] / 2**20:.0f} MiB, "
              + (f"ppl ratio {result['ppl_ratio']}, top-1 agreement {result['top1_agreement']}, " if result else "")
              + f"{time.time() - t0:.0f} s)", file=sys.stderr)
        return 0
    except Exception as e:
        if not recorded:  # a verification failure has its record (published: false) already
            record_failure(v, a, src, out, t0, timings, e)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    run_main(main)
