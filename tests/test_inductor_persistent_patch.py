"""INDUCTOR_PERSISTENT_MAX (scripts/patches/inductor_persistent.py): Inductor's own persistent-reduction rule, from this
machine's torch, wrapped and asked about the reductions a decode step has; the patch installed by sitecustomize.py in
a fresh interpreter through the import hook; the key's way to the server and its own compile cache.

What cannot run here: Inductor generating Triton code (it asks for a GPU driver before it writes a kernel), so
whether the step's norms come out as `triton_per_` kernels is for `make profile` on a GPU to show."""
from __future__ import annotations

import subprocess
import sys
import types

import pytest

torch = pytest.importorskip("torch")


def _ask(rule, hint, numel, cooperative=False):
    """rule's answer for a reduction of `numel` values a row (an int, or a sympy expression) with this hint, under a
    graph whose size variables are Inductor's own allocator."""
    from torch._inductor.sizevars import SizeVarAllocator
    from torch._inductor.virtualized import V
    import sympy
    features = types.SimpleNamespace(get_reduction_hint=lambda: hint, numel=sympy.Integer(5),  # a verify step's rows
                                     reduction_numel=sympy.Integer(numel) if isinstance(numel, int) else numel)
    with V.set_graph_handler(types.SimpleNamespace(sizevars=SizeVarAllocator())):
        return bool(rule(features, cooperative))


def test_row_reductions_up_to_the_limit_become_persistent_and_nothing_else_changes():
    import sympy
    from torch._inductor import config
    from torch._inductor.choices import InductorChoices
    from torch._inductor.ir import ReductionHint
    from scripts.patches.inductor_persistent import widen
    own = InductorChoices.__dict__["should_use_persistent_reduction"].__func__
    rule = widen(own, 4096)
    inner, outer = ReductionHint.INNER, ReductionHint.OUTER
    # Inductor's own threshold, as this file says it is: 1024 values for a row reduction
    assert _ask(own, inner, 1024) and not _ask(own, inner, 2560)
    assert _ask(rule, inner, 512)                                          # persistent before, and after
    assert _ask(rule, inner, 2560) and _ask(rule, inner, 4096)             # Qwen3.5-4B's hidden and GDN widths
    assert not _ask(rule, inner, 9216)                                      # over the limit: Inductor's answer
    assert not _ask(rule, outer, 2560) and not _ask(own, outer, 2560)       # another kind of reduction: untouched
    # a cooperative reduction (split over blocks) keeps Inductor's answer: its own threshold is raised by the rows
    assert _ask(own, inner, 2560, cooperative=True) and _ask(rule, inner, 2560, cooperative=True)
    assert not _ask(widen(own, 16384), inner, 9216, cooperative=True) and _ask(widen(own, 16384), inner, 9216)
    assert not _ask(rule, inner, sympy.Symbol("s0", integer=True, positive=True))  # length unknown at compile time
    with config.patch({"triton.persistent_reductions": False}):
        assert not _ask(rule, inner, 2560) and not _ask(rule, inner, 512)  # Inductor's own switch still wins


PROBE = r'''
import sys
import torch._inductor.choices as c
fn = c.InductorChoices.__dict__["should_use_persistent_reduction"]
print("limit", getattr(fn.__func__, "_kit_inductor_persistent", None))
'''


@pytest.mark.parametrize("limit", ["4096", None])
def test_sitecustomize_wraps_inductors_rule_when_the_variable_is_set(limit):
    import os
    from scripts.kit.paths import ROOT
    env = {k: v for k, v in os.environ.items() if k != "KIT_INDUCTOR_PERSISTENT_MAX"}
    env["PYTHONPATH"] = str(ROOT)
    if limit:
        env["KIT_INDUCTOR_PERSISTENT_MAX"] = limit
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == f"limit {limit}"
    said = r.stderr.count("kit: Inductor row reductions up to 4096 values persistent")
    assert said == (1 if limit else 0), r.stderr[-2000:]


def test_key_reaches_the_engine_with_a_compile_cache_of_its_own():
    from scripts.kit.errors import KitError
    from scripts.kit.variant import load
    base = load("qwen3.5-4b-fp8-v2-gdn")
    v = load("qwen3.5-4b-fp8-v2-gdn", ["INDUCTOR_PERSISTENT_MAX=16384"])
    assert v.to_env("gpu")["KIT_INDUCTOR_PERSISTENT_MAX"] == "16384"
    assert "KIT_INDUCTOR_PERSISTENT_MAX" not in base.to_env("gpu")
    assert v.cache_root.name == "qwen3.5-4b-fp8-v2-gdn-persist16384" and base.cache_root.name == "qwen3.5-4b-fp8-v2-gdn"
    assert v.config_sha256 != base.config_sha256  # other compiled kernels: records keep the two apart
    with pytest.raises(KitError, match="INDUCTOR_PERSISTENT_MAX"):
        load("qwen3.5-4b-fp8-v2-gdn", ["INDUCTOR_PERSISTENT_MAX=-1"])
