"""Device-name shim for the baked compile cache (style P15), and the draft-vocabulary patch (issue 19).
Each does nothing unless its variable is set: KIT_DEVICE_NAME, KIT_DRAFT_VOCAB.

Every Python process with the repo root on PYTHONPATH imports this file at startup, vLLM's
EngineCore and workers included, so each presents the baked GPU name to torch. The logic, the
same-compute-capability guard and the reasons live in scripts/_cache_patch.py; the drafter's in
scripts/_draft_vocab_patch.py.
"""
import os

if os.environ.get("KIT_DEVICE_NAME"):
    try:
        from scripts._cache_patch import install
        install()
    except Exception as e:  # a broken shim must never stop an interpreter from starting
        import sys
        print(f"kit: device-name shim NOT active ({type(e).__name__}: {e})", file=sys.stderr)

if os.environ.get("KIT_DRAFT_VOCAB"):
    try:
        from scripts._draft_vocab_patch import install as _install_draft_vocab
        _install_draft_vocab()
    except Exception as e:  # as above: the server then drafts over the full vocabulary, and says so
        import sys
        print(f"kit: draft vocabulary NOT active ({type(e).__name__}: {e})", file=sys.stderr)
