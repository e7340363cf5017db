"""The kit's patches, each loaded only when its variable is set (every Python process with the repo root
on PYTHONPATH imports this file at startup, vLLM's EngineCore and workers included):
- KIT_STARTUP_TRACE: where a start's seconds go, per process (issue 32; scripts/_startup_trace.py);
- KIT_DEVICE_NAME: the device-name shim for the baked compile cache (style P15; scripts/_cache_patch.py
  holds the logic, the same-compute-capability guard and the reasons);
- KIT_DRAFT_VOCAB: MTP drafts from a token set (issue 19; scripts/_draft_vocab_patch.py);
- KIT_GDN_REUSE: GDN metadata built once a step (issue 19; scripts/_gdn_reuse_patch.py);
- KIT_DRAFT_GRAPH: MTP draft passes 2..K as one CUDA graph (issue 19; scripts/_draft_graph_patch.py).
A patch that fails says so and leaves vLLM as it is: it must never stop an interpreter from starting.
"""
import os

for _var, _module, _what in (("KIT_STARTUP_TRACE", "scripts._startup_trace", "start-up trace"),
                             ("KIT_DEVICE_NAME", "scripts._cache_patch", "device-name shim"),
                             ("KIT_DRAFT_VOCAB", "scripts._draft_vocab_patch", "draft vocabulary"),
                             ("KIT_GDN_REUSE", "scripts._gdn_reuse_patch", "GDN metadata reuse"),
                             ("KIT_DRAFT_GRAPH", "scripts._draft_graph_patch", "draft chain graph")):
    if os.environ.get(_var):
        try:
            __import__(_module, fromlist=["install"]).install()
        except Exception as e:
            import sys
            print(f"kit: {_what} NOT active ({type(e).__name__}: {e})", file=sys.stderr)
