"""Row reductions up to $KIT_INDUCTOR_PERSISTENT_MAX values made persistent by Inductor (INDUCTOR_PERSISTENT_MAX).

Why: in a Qwen3.5-4B FP8 verify step (5 rows), Inductor compiles each RMSNorm with its per-token FP8 cast, and each
standalone cast, as a *looped* reduction (`triton_red_fused_...`): a row of 2560, 4096 or 9216 values is read in
blocks, twice (the reduction, then the normalised write). On an H200 the norm kernels took 0.41 ms a step, and the
fused elementwise ones, the standalone casts among them, 0.26 ms (results/qwen3.5-4b-fp8-v2-gdn/20261130T051957Z-
profile.json, phases/0/kinds), a few microseconds each for a few kilobytes: latency, not bytes. A persistent reduction (`triton_per_...`) holds the whole
row in registers and reads it once. Inductor makes one persistent only up to 1024 values a row
(torch/_inductor/choices.py, InductorChoices.should_use_persistent_reduction), 16 times that under
`triton.multi_kernel`, which benchmarks both forms at run time; that setting stopped vLLM 0.26's compile on an H200
(`NameError: name 'multi_kernel_0' is not defined`, results/gpu-sessions/20261201T2308Z/README.md). pytorch/pytorch#196333
reports RMSNorm-then-quantize at widths 2048-4096 faster persistent.

How: the rule is wrapped, not replaced: whatever Inductor makes persistent stays so; beyond that, a reduction along
the contiguous last dimension (ReductionHint.INNER), not cooperative, whose length is known at compile time to be at
most the maximum, is made persistent too. Inductor's own switch (`triton.persistent_reductions`) still turns all of
it off. Only the generated kernels change, not what they compute (one block reduces the row instead of a loop; the
float32 sums' order can differ). The patch is invisible to vLLM's compile key and Inductor's cache key, so the
variant gets a compile cache of its own (Variant.cache_root: `-persist<N>`).
"""
from __future__ import annotations

import os
import sys

ENV = "KIT_INDUCTOR_PERSISTENT_MAX"
_MARK = "_kit_inductor_persistent"


def widen(rule, limit: int):
    """rule (InductorChoices.should_use_persistent_reduction, a function of (features, cooperative_reduction)) made
    to also answer True for an INNER row reduction of at most `limit` values known at compile time."""
    def should_use_persistent_reduction(features, cooperative_reduction):
        if rule(features, cooperative_reduction):
            return True
        from torch._inductor import config
        from torch._inductor.ir import ReductionHint
        from torch._inductor.virtualized import V
        if cooperative_reduction or not config.triton.persistent_reductions:
            return False
        if features.get_reduction_hint() != ReductionHint.INNER:
            return False
        return bool(V.graph.sizevars.statically_known_leq(features.reduction_numel, limit))
    setattr(should_use_persistent_reduction, _MARK, limit)
    return should_use_persistent_reduction


def _on_choices(mod) -> None:
    cls = getattr(mod, "InductorChoices", None)
    real = cls.__dict__.get("should_use_persistent_reduction") if cls is not None else None
    if real is None:
        print(f"kit: INDUCTOR_PERSISTENT_MAX NOT active: no InductorChoices.should_use_persistent_reduction in "
              f"{mod.__name__}", file=sys.stderr, flush=True)
        return
    fn = real.__func__ if isinstance(real, staticmethod) else real
    if getattr(fn, _MARK, None) is not None:
        return
    limit = int(os.environ[ENV])
    cls.should_use_persistent_reduction = staticmethod(widen(fn, limit))
    print(f"kit: Inductor row reductions up to {limit} values persistent (Inductor's own rule: 1024)",
          file=sys.stderr, flush=True)


def install() -> None:
    from scripts.patches.on_import import after_import
    after_import("torch._inductor.choices", _on_choices)
