"""INDUCTOR_PDL: Inductor's Programmatic Dependent Launch switched through the server's environment.

What can run here: the key reaching the environment the server (and every process that compiles under it) gets, its
own compile cache, and torch reading the variable into the setting Inductor's code generation consults. Whether the
kernels launch early, and how much of a step that saves, needs a Hopper GPU (a same-session comparison on the GPU
host, with greedy completions compared against the key off first).
"""
from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = "import torch._inductor.config as c; print('pdl', c.triton.enable_pdl)"


def _torch_reads(env_extra: dict) -> str:
    import os
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_ENABLE_PDL"}
    env.update(env_extra)
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip().splitlines()[-1]


def test_key_reaches_the_server_environment_with_a_compile_cache_of_its_own():
    from scripts.kit.variant import load
    base = load("qwen3.5-4b-fp8-v4")
    v = load("qwen3.5-4b-fp8-v4", ["INDUCTOR_PDL=on"])
    assert v.to_env("gpu")["TORCHINDUCTOR_ENABLE_PDL"] == "1"
    assert "TORCHINDUCTOR_ENABLE_PDL" not in base.to_env("gpu")
    assert v.cache_root.name == base.cache_root.name + "-pdl"
    assert v.config_sha256 != base.config_sha256  # other compiled kernels: records keep the two apart


def test_the_committed_variant_is_v4_with_the_key_on():
    from scripts.kit.variant import load
    v, parent = load("qwen3.5-4b-fp8-v4-pdl"), load("qwen3.5-4b-fp8-v4")
    assert v["INDUCTOR_PDL"] == "on" and parent["INDUCTOR_PDL"] == "off"
    assert {k for k in v.config if v.config[k] != parent.config.get(k)} - {"BASE"} == {"INDUCTOR_PDL"}
    assert v.output_changes() == parent.output_changes()  # launch order only: not a key that changes the output


def test_a_value_other_than_on_or_off_is_refused_naming_the_key():
    from scripts.kit.errors import KitError
    from scripts.kit.variant import load
    with pytest.raises(KitError, match="INDUCTOR_PDL"):
        load("qwen3.5-4b-fp8-v4", ["INDUCTOR_PDL=yes"])


def test_torch_reads_the_variable_the_key_sets():
    from scripts.kit.variant import load
    env = load("qwen3.5-4b-fp8-v4", ["INDUCTOR_PDL=on"]).to_env("gpu")
    assert _torch_reads({"TORCHINDUCTOR_ENABLE_PDL": env["TORCHINDUCTOR_ENABLE_PDL"]}) == "pdl True"
    assert _torch_reads({}) == "pdl False"
