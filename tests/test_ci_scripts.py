"""The shell scripts CI and the GPU sessions run parse (`bash -n`).

gpu-prepare.sh once lost a comment's `#` in a commit and failed on its first line of use, with no test to say so.
"""
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p for p in (ROOT / ".ci").iterdir() if p.suffix == ".sh" or p.name == "run")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_ci_script_parses(script):
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, f"{script.relative_to(ROOT)}: {r.stderr.strip()}"
