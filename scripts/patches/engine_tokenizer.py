"""KIT_ENGINE_TOKENIZER_EARLY=1: the engine process loads its tokenizer in a thread from the start of EngineCore's
__init__, not in series after the model's warm-up (issue 32).

Why: vLLM's EngineCore.__init__ (vllm/v1/engine/core.py:101-137 in 0.26) sets up the model executor (device, weights,
compile cache, CUDA graphs) and only then makes its StructuredOutputManager, whose __init__ loads the tokenizer
(vllm/v1/structured_output/__init__.py:79, cached_tokenizer_from_config). When the engine is forked from an API process
that loaded the tokenizer already, vLLM's cache of it comes along and the load takes nothing. Under API_ENGINE_FIRST
(engine_first.py) the engine is forked before that load, so it loads the tokenizer itself: 0.29-0.52 s of "engine:
the rest" in the H200 starts of results/gpu-sessions/20261128T1651Z/README.md that had the key, 0.01 s in those
without.

What changes, in the engine process: when EngineCore.__init__ starts, a thread calls vLLM's own
cached_tokenizer_from_config for the engine's model config. When StructuredOutputManager asks for that config's
tokenizer, it gets the thread's result (waiting for it if the thread is still loading). If the thread failed, vLLM's
own call runs as it would have and raises its own error. Nothing else moves. Left as vLLM does it:
- skip_tokenizer_init (no tokenizer to load);
- an engine of more than one worker process (world size > 1): its executor forks or spawns workers, which a thread
  mid-load must not be inside of.

The thread holds the interpreter's lock while it unpickles or parses, so it slows the main thread's own Python work
during the executor's set-up. Measured on an H200 only with ENGINE_PRESTART (results/gpu-sessions/20261129T0100Z):
"engine: the rest" fell from 0.26-0.40 s to 0.01-0.02 s, the device init beside the thread grew from 0.73-0.91 s to
1.05-2.42 s, and the starts were no faster.
"""
from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import Future

ENV = "KIT_ENGINE_TOKENIZER_EARLY"
CORE = "vllm.v1.engine.core"
SO = "vllm.v1.structured_output"
_MARK = "_kit_engine_tokenizer"
# id(model config) -> (the config, the load's Future): the one EngineCore of this process, while it starts
_pending: dict[int, tuple[object, Future]] = {}
_lock = threading.Lock()


def _say(msg: str) -> None:
    print(f"kit: {ENV}: {msg}", file=sys.stderr, flush=True)


def start(vllm_config, load=None) -> Future | None:
    """Begin loading vllm_config's tokenizer in a thread; the Future, or None where vLLM's order is kept."""
    mc = vllm_config.model_config
    if getattr(mc, "skip_tokenizer_init", False):
        return None
    if getattr(vllm_config.parallel_config, "world_size", 1) > 1:
        _say("left in vLLM's order: the engine starts more than one worker process")
        return None
    if load is None:
        from vllm.tokenizers import registry
        load = registry.cached_tokenizer_from_config  # looked up now: a startup trace's wrapper, where set, times it
    fut: Future = Future()

    def run():
        try:
            fut.set_result(load(model_config=mc))
        except BaseException as e:  # noqa: BLE001 - vLLM's own call, later, raises its own error
            fut.set_exception(e)
    with _lock:
        _pending[id(mc)] = (mc, fut)
    threading.Thread(target=run, name="kit-engine-tokenizer", daemon=True).start()
    return fut


def take(model_config, orig, **kwargs):
    """The tokenizer for model_config: the thread's, when it loaded this config's, else orig's."""
    with _lock:
        job = _pending.pop(id(model_config), None)
    if job is not None and job[0] is model_config and not kwargs:
        try:
            tok = job[1].result()
        except BaseException:  # noqa: BLE001 - the thread failed: vLLM's call below raises its own error
            pass
        else:
            _say("tokenizer loaded while the engine set up its model")
            return tok
    return orig(model_config=model_config, **kwargs)


def patch_core(mod) -> bool:
    cls = getattr(mod, "EngineCore", None)
    init = cls.__dict__.get("__init__") if cls is not None else None
    if init is None or getattr(init, _MARK, False):
        return False

    def __init__(self, vllm_config, *args, **kwargs):
        start(vllm_config)
        init(self, vllm_config, *args, **kwargs)
    __init__.__name__, __init__.__qualname__, __init__.__wrapped__ = "__init__", f"{cls.__qualname__}.__init__", init
    setattr(__init__, _MARK, True)
    cls.__init__ = __init__
    return True


def patch_structured_output(mod) -> bool:
    orig = getattr(mod, "cached_tokenizer_from_config", None)
    if orig is None or getattr(orig, _MARK, False):
        if orig is None:
            _say(f"NOT active: {mod.__name__} has no cached_tokenizer_from_config")
        return False

    def cached_tokenizer_from_config(model_config, **kwargs):
        return take(model_config, orig, **kwargs)
    cached_tokenizer_from_config.__wrapped__ = orig
    setattr(cached_tokenizer_from_config, _MARK, True)
    mod.cached_tokenizer_from_config = cached_tokenizer_from_config
    return True


def install(core: str = CORE, so: str = SO) -> bool:
    """Patch `core` and `so` when each is imported (now, if it already is), if $KIT_ENGINE_TOKENIZER_EARLY is "1"."""
    if os.environ.get(ENV) != "1":
        return False
    from scripts.patches.on_import import after_import
    after_import(so, patch_structured_output)
    after_import(core, patch_core)
    return True
