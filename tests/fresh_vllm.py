"""A scenario run in a fresh Python process with the kit's sitecustomize.py and a patch's switch, as a server's
engine process starts: the patch installs through its import hook, not through the test's own imports."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from scripts.kit.paths import ROOT


def run_scenario(code: str, env: dict[str, str], marked: str = "marked") -> tuple[dict, subprocess.CompletedProcess]:
    """Run `code` (which prints one JSON line last) with ROOT on PYTHONPATH and `env` added; assert it exited 0 and
    that its JSON's `marked` entry is true (the patch was installed). Returns (that JSON, the process)."""
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT), **env},
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out[marked], "sitecustomize.py did not install the patch in a process with the switch"
    return out, r


def run_fresh(code: str, env: dict[str, str], extra_path: str | None = None) -> dict:
    """Run `code` (dedented; it prints one JSON line last) in a fresh interpreter with none of the caller's KIT_
    variables, ROOT (and `extra_path`) on PYTHONPATH, and `env` added; assert it exited 0. Returns that JSON with
    the process's stderr under "stderr"."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("KIT_")}
    path = os.pathsep.join([str(ROOT)] + ([extra_path] if extra_path else []))
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env={**base, "PYTHONPATH": path, **env},
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["stderr"] = r.stderr
    return out
