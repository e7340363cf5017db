"""Device-name shim for the baked compile cache (style P15). Does nothing unless KIT_DEVICE_NAME is set.

Every Python process with the repo root on PYTHONPATH imports this file at startup, vLLM's
EngineCore and workers included, so each presents the baked GPU name to torch. The logic, the
same-compute-capability guard and the reasons live in scripts/_cache_patch.py.
"""
import os

if os.environ.get("KIT_DEVICE_NAME"):
    try:
        from scripts._cache_patch import install
        install()
    except Exception as e:  # a broken shim must never stop an interpreter from starting
        import sys
        print(f"kit: device-name shim NOT active ({type(e).__name__}: {e})", file=sys.stderr)
