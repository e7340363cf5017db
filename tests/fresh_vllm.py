"""Python code run in a fresh interpreter, as a server's process starts, for the patch tests.

Why a fresh process: the kit's patches are applied at interpreter start (sitecustomize.py installs each one whose
switch is set, through its import hook, before vLLM is imported), and some of what they patch is process-wide (a
fork, a frozen heap, a module left in sys.modules). So each scenario runs in an interpreter of its own, started with
the switches the test chooses, not through the test process's own imports.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scripts.kit.paths import ROOT


def run_fresh_python(code: str, *argv: str, env: Mapping[str, str] | None = None,
                     extra_path: str | Path | None = None, timeout: float = 300,
                     marked: bool = False) -> tuple[Any, subprocess.CompletedProcess]:
    """Run `code` (dedented) as `python -c code *argv` at the repo root, in an environment of the caller's without
    its KIT_ variables (so no patch switch leaks in), ROOT (then `extra_path`) on PYTHONPATH, and `env` added (the
    switches the scenario sets). The code prints its result as one JSON line, last. Asserts that it exited 0 and
    that this line parses, and, with `marked`, that the result's "marked" entry is true (sitecustomize.py installed
    the patch); each failure shows the tails of the child's stderr and stdout. Returns (the result, the process),
    the process for what the child logged."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("KIT_")}
    path = os.pathsep.join([str(ROOT)] + ([str(extra_path)] if extra_path else []))
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *argv], cwd=ROOT,
                       env={**base, "PYTHONPATH": path, **(env or {})}, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, _tails(f"the fresh interpreter exited {r.returncode}", r)
    lines = r.stdout.strip().splitlines()
    try:
        out = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        raise AssertionError(_tails("the fresh interpreter's last line of stdout is not JSON", r)) from None
    if marked:
        assert out["marked"], _tails("sitecustomize.py did not install the patch in a process with the switch", r)
    return out, r


def _tails(what: str, r: subprocess.CompletedProcess) -> str:
    return f"{what}\n--- stderr (tail) ---\n{r.stderr[-3000:]}\n--- stdout (tail) ---\n{r.stdout[-1500:]}"
