"""Issue 6's start-up cuts the kit makes on its own: the thin server main module and bytecode."""
from __future__ import annotations

import os
import subprocess
import sys

from scripts.kit import bytecode
from scripts.kit.paths import ROOT
from scripts.kit.variant import SERVER_MODULE, load


def test_kit_main_imports_nothing_when_a_spawned_child_reimports_it():
    # multiprocessing's spawn imports the parent's __main__ module in the child (as __mp_main__):
    # this module must cost nothing there, i.e. not import vLLM or anything else.
    code = ("import sys, runpy; before = set(sys.modules); runpy.run_module('scripts.kit.vllm_main', "
            "run_name='__mp_main__', alter_sys=True); print(sorted(set(sys.modules) - before))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    new = eval(out.stdout.strip())
    assert not [m for m in new if m.split(".")[0] in ("vllm", "torch", "fastapi", "transformers")], new


def test_server_main_picks_the_module_and_stays_out_of_the_cache_key_flags():
    from scripts.kit.cachekey import key_flags
    kit, plain = load("tiny"), load("tiny", ["SERVER_MAIN=vllm"])
    assert kit.to_argv("cpu")[1:3] == ["-m", "scripts.kit.vllm_main"]
    assert plain.to_argv("cpu")[1:3] == ["-m", SERVER_MODULE]
    # A cache baked under one main module is hit under the other: vLLM's key never sees it.
    assert key_flags(kit.to_argv("cpu")) == key_flags(plain.to_argv("cpu"))


def test_bytecode_compiles_only_what_lacks_it(tmp_path):
    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "__init__.py").write_text("X = 1\n")
    (site / "pkg" / "sub.py").write_text("Y = 2\n")
    (site / "single.py").write_text("Z = 3\n")
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1"}
    first = bytecode.ensure(sys.executable, env)
    assert first["ok"] and first["compiled"] == 2, first  # pkg/ and single.py
    assert list((site / "pkg" / "__pycache__").glob("sub.*.pyc")) and list((site / "__pycache__").glob("single.*.pyc"))
    assert bytecode.ensure(sys.executable, env)["compiled"] == 0  # nothing left to do: it only looked
    (site / "bad.py").write_text("def (:\n")
    got = bytecode.ensure(sys.executable, env)
    assert got["compiled"] == 1 and got["ok"] is False  # reported, not fatal
