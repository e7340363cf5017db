"""The kit's patches (scripts/patches/__init__.py: one row each), each loaded only when its variable is set.
Every Python process with the repo root on PYTHONPATH imports this file at start, vLLM's EngineCore and
workers included; the table imports nothing, and a patch's module is imported only when its row is on.
A patch that fails says so and leaves vLLM as it is: it must never stop an interpreter from starting.
"""
import os

try:
    from scripts.patches import PATCHES
except Exception as e:
    import sys
    print(f"kit: no patch active (scripts.patches: {type(e).__name__}: {e})", file=sys.stderr)
    PATCHES = ()
for _p in PATCHES:
    if _p.switch and os.environ.get(_p.switch):
        try:
            __import__(f"scripts.patches.{_p.module}", fromlist=["install"]).install()
        except Exception as e:
            import sys
            print(f"kit: {_p.switch} is set but scripts/patches/{_p.module}.py is NOT active ({type(e).__name__}: {e})",
                  file=sys.stderr)
