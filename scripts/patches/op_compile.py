"""KIT_LAZY_OP_COMPILE=1: a vLLM custom op's torch.compile wrapper is made the first time the op runs outside a
compiled graph, not when the op is constructed (issue 32).

Why: vLLM 0.26's CustomOp.maybe_compile (vllm/model_executor/custom_op.py) calls torch.compile(forward_native, ...)
in the constructor of every custom op that the compilation config leaves disabled and that asks for it
(compile_native). QuantFP8, the activation quantizer each FP8 linear layer's kernel makes, asks for it by default,
so an FP8 Qwen3.5 builds one wrapper per linear layer. torch.compile does no compiling then, but building the wrapper
copies Inductor's whole config (torch's _TorchCompileInductorWrapper: get_config_copy twice) and that is slow in
bulk: in `-mega`'s H200 py-spy start
(results/profiles/20261204T155352Z-qwen3.5-4b-fp8-v3-loop-mega-startprof.speedscope.json.gz) the engine spent 1.15 s
of samples in maybe_compile while it built the model, 1.10 s of it under QuantFP8, after the hand-over and so on the
start's path. Those wrappers are for calls the model-level graph does not see (an op called from inside an opaque
custom op); a warm start that loads the model's compiled graph (the AOT artifact) never calls them at all.

What changes: custom_op.py's module-level `torch` becomes a view of torch whose `compile` (called there only by
maybe_compile) returns a plain function; every other name is torch's own. Under a Dynamo trace (the model's own
compile) Dynamo inlines forward_native in that function's place, as it does for the real wrapper: both carry
`_torchdynamo_inline` (and were it traced anyway, it calls forward_native). Called anywhere else, it makes the real
torch.compile wrapper with the same arguments once, and calls it from then on. vLLM's early returns (compile_native
off, compilation off, the eager backend) and its arguments are its own: the stand-in only defers the one call. Not in
vLLM's compile key; Dynamo never traces this file (above), and custom_op.py is unchanged, so the files vLLM records
for its cache key and the AOT artifact's source check are the same with or without the key: one bake serves both.

Measured on an H200 with GC_EARLY_FREEZE=2 and ENGINE_PRESTART=2 (results/gpu-sessions/20261204T1851Z/README.md,
nine rounds interleaved with `-mega` as committed): the start trace's weights phase, where the model is built, 0.82 s
shorter (95% 0.41-1.22 s); the profiled start had no maybe_compile samples left; every start hit its bake.
"""
from __future__ import annotations

import functools
import sys
import types

ENV = "KIT_LAZY_OP_COMPILE"
TARGET = "vllm.model_executor.custom_op"
_MARK = "_kit_lazy_op_compile"


def deferred(real_torch, fn, kwargs: dict):
    """What torch.compile(fn, **kwargs) returns under the switch: `fn` under a Dynamo trace, else the real wrapper,
    `real_torch.compile(fn, **kwargs)`, made on the first call."""
    made: list = []

    @functools.wraps(fn)
    def call(*args, **kw):
        import torch
        if torch.compiler.is_compiling():
            return fn(*args, **kw)
        if not made:
            made.append(real_torch.compile(fn, **kwargs))
        return made[0](*args, **kw)
    setattr(call, _MARK, True)
    # What torch.compile's own wrapper carries: Dynamo meets this function in a traced forward and inlines `fn`
    # instead, so the model's graph, and the files vLLM records as traced (its compile key, and the AOT artifact's
    # source check), are what they are without the patch. Without it this file would be traced too, and a bake made
    # with the key would fail its source check in a process without it (the module is not loaded there).
    call._torchdynamo_inline = fn
    call._kit_made = made  # the real wrapper, once made (tests read it)
    return call


class _TorchView(types.ModuleType):
    """custom_op.py's `torch` while the switch is on: torch itself, but `compile` defers (deferred())."""

    def __init__(self, real):
        super().__init__(real.__name__)
        self.__dict__["_kit_real"] = real

    def __getattr__(self, name):
        return getattr(self.__dict__["_kit_real"], name)

    def compile(self, fn=None, **kwargs):
        real = self.__dict__["_kit_real"]
        if fn is None:  # torch.compile(**kw) used as a decorator factory: not how custom_op.py calls it
            return real.compile(**kwargs)
        return deferred(real, fn, kwargs)


def _on_import(mod) -> None:
    t = getattr(mod, "torch", None)
    cls = getattr(mod, "CustomOp", None)
    if t is None or cls is None or "maybe_compile" not in cls.__dict__:
        print(f"kit: LAZY_OP_COMPILE: {mod.__name__} has no CustomOp.maybe_compile or no torch: custom ops compile "
              "as vLLM does", file=sys.stderr)
        return
    if not isinstance(t, _TorchView):
        mod.torch = _TorchView(t)


def install() -> None:
    from scripts.patches.on_import import after_import
    after_import(TARGET, _on_import)
