"""KIT_LAZY_IMPORTS=1: modules vLLM imports at the top of its own modules, but that a text-only server on a CUDA host
never uses, are loaded when first used instead (issue 32).

Why: the API process's imports are the longest phase of a warm start, and every later phase waits for them (the
engine is launched from the config they lead to). In the py-spy start of session 20261129T0410Z
(results/profiles/20261129T042526Z-qwen3.5-4b-bf16-tuned-dvg-quick6-startprof.speedscope.json.gz) the API process
spent 1.45 s of import samples in scipy, all of it under vllm/multimodal/audio.py's `import scipy.signal` (audio
resampling), and 0.30 s in pandas, under vllm/_aiter_ops.py's `import pandas` (ROCm's aiter kernels). A server
started with --language-model-only on a CUDA GPU calls neither.

What changes: a finder ahead of Python's own hands the import system each module in LAZY with its real loader
wrapped in importlib.util.LazyLoader. `import scipy.signal` then binds a module object whose code has not run; the
first attribute read anywhere runs it, in full, as the plain import would have. A module someone does use costs its
import at that moment instead: nothing is skipped, only deferred. A later `import` statement of the same name reads
the module's __spec__ and so loads it too: where the profile shows a second importer, the saving is gone, not the
behaviour.

What it does not do: `from scipy.signal import x` needs x, so it loads the module at once (vLLM's own `from
opentelemetry ... import ...` lines, 0.35 s in that profile, stay as they are). transformers imports scipy.optimize
itself (its object-detection losses), which scipy.signal used to bring: that part of scipy's time stays.

A deferred module answers its own metadata (__file__, __name__, __spec__, ...) without running. The first H200
measure (session 20261129T0735Z, py-spy start results/profiles/20261129T075238Z-...-startprof.speedscope.json.gz)
found scipy.signal run anyway, 0.80 s of samples: vllm/ir/ops/layernorm.py registers a fake kernel with
torch.library, which asks inspect.getmodule for the caller's source, and getmodule reads `__file__` (and, through
isinstance, `__class__`) of every module in sys.modules. importlib's own lazy module runs its code on any attribute
read, those included.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
import types

ENV = "KIT_LAZY_IMPORTS"
# module -> who imports it at the top of a module and why a text-only server on a CUDA host never calls it
LAZY = {
    "scipy.signal": "vllm/multimodal/audio.py: audio resampling (resample_audio_scipy)",
    "pandas": "vllm/_aiter_ops.py: ROCm's aiter kernels",
}


class LazyFinder(importlib.abc.MetaPathFinder):
    """For a name in `names`: the spec the other finders give, its loader wrapped in LazyLoader."""

    def __init__(self, names):
        self.names = frozenset(names)

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.names:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _MetadataFirst(spec.loader)
        return spec


# What the import system sets on a module before its code runs (importlib's _init_module_attrs): read from the
# deferred module's own dict, so a scan of sys.modules (inspect.getmodule) does not run it.
METADATA = frozenset(("__name__", "__file__", "__spec__", "__loader__", "__package__", "__path__", "__cached__"))


_HANDING = threading.Lock()


class _Deferred(types.ModuleType):
    """A lazily loaded module that has not run yet: metadata comes from its dict; any other attribute hands the
    module to importlib's own lazy module class, which runs it and answers."""

    def __getattribute__(self, attr):
        if attr == "__class__":  # isinstance(m, type) reads it (inspect.isclass, in getmodule's scan)
            return type(self)
        if attr in METADATA:
            d = object.__getattribute__(self, "__dict__")
            if attr in d:
                return d[attr]
            raise AttributeError(attr)  # a plain module without __path__ (not a package) has none either
        with _HANDING:  # once: a second thread here after the load must not make the loaded module lazy again
            if type(self) is _Deferred:
                object.__setattr__(self, "__class__", importlib.util._LazyModule)
        return getattr(self, attr)


class _MetadataFirst(importlib.util.LazyLoader):
    def exec_module(self, module):
        super().exec_module(module)  # sets module.__class__ to importlib's _LazyModule
        module.__class__ = _Deferred


def is_deferred(name: str) -> bool:
    """True if `name` was imported lazily and nothing has read it yet (type() reads no attribute)."""
    mod = sys.modules.get(name)
    return mod is not None and type(mod).__name__ in ("_LazyModule", "_Deferred")


def install(names=None) -> None:
    names = LAZY if names is None else names
    already = [n for n in names if n in sys.modules]
    if already:  # imported before this process ran sitecustomize's patches: nothing to defer
        print(f"kit: {ENV}=1 but {', '.join(already)} already imported: loaded as usual", file=sys.stderr)
    if not any(isinstance(f, LazyFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, LazyFinder([n for n in names if n not in sys.modules]))
