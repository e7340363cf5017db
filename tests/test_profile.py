"""scripts/kit/profile.py on hand-made chrome traces: classification order, per-step math, GPU and CPU
gaps, windows from the engine-step annotation, and the plot-only path of scripts/profile.py."""
from __future__ import annotations

import re
import gzip
import json

import pytest

from scripts.kit import profile as P

PID, TID = 1, 1


def ann(name, ts, dur, tid=TID):
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur}


def py(name, ts, dur):
    return {"ph": "X", "cat": "python_function", "name": name, "pid": PID, "tid": TID, "ts": ts, "dur": dur}


def op(name, ts, dur, tid=TID):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur}


def launch(corr, ts):
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": PID, "tid": TID, "ts": ts, "dur": 2,
            "args": {"correlation": corr}}


def kernel(name, corr, ts, dur, stream=7):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"correlation": corr}}


DECODE = "execute_context_0(0)_generation_1(1)"
PREFILL = "execute_context_1(128)_generation_0(0)"


def phases(red):
    return {r["phase"]: r for r in red["phases"]}


@pytest.mark.parametrize("names,phase", [
    (["gpu_model_runner: forward"], "target forward"),
    (["gpu_model_runner: postprocess"], "target forward"),
    (["gpu_model_runner: sample", "vllm/v1/sample/rejection_sampler.py(94): forward"], "sampler"),
    (["gpu_model_runner: preprocess"], "bookkeeping"),
    # a draft pass computes logits and samples: draft wins (more specific, earlier in the table)
    (["gpu_model_runner: bookkeep", "gpu_model_runner: draft", "x/llama.py(1): compute_logits"], "draft"),
    (["vllm/v1/worker/gpu/spec_decode/autoregressive/speculator.py(129): propose", "vllm/v1/worker/gpu/sample/gumbel.py(3): f"],
     "draft"),
    (["vllm/v1/spec_decode/llm_base_proposer.py(502): propose"], "draft"),
    # V2 runner: sample() holds the lm_head (target) and the rejection sampler
    (["vllm/v1/worker/gpu/model_runner.py(1085): sample", "vllm/model_executor/models/qwen3.py(9): compute_logits"],
     "target forward"),
    (["vllm/v1/worker/gpu/model_runner.py(1085): sample", "vllm/v1/worker/gpu/spec_decode/rejection_sampler.py(103): __call__"],
     "sampler"),
    # V2 execute_model: input prep is bookkeeping, the rest the forward
    (["vllm/v1/worker/gpu/model_runner.py(1151): execute_model", "vllm/v1/worker/gpu/model_runner.py(874): prepare_inputs"],
     "bookkeeping"),
    (["vllm/v1/worker/gpu/model_runner.py(1151): execute_model", "nn.Module: Qwen3ForCausalLM_0"], "target forward"),
    (["rejection_greedy_sample_kernel"], "sampler"),
    (["aten::mm", DECODE], "other"),
    ([], "other"),
])
def test_classify_ordered_table(names, phase):
    assert P.classify(names) == phase


def test_parse_step_plain_and_detailed():
    assert P.parse_step(DECODE) == {"context_requests": 0, "context_tokens": 0, "generation_requests": 1,
                                    "generation_tokens": 1}
    assert P.parse_step("execute_context_0(sq0sk0sqsq0sqsk0)_generation_2(sq10sk500sqsq50sqsk2500)")[
        "generation_tokens"] == 10
    assert P.parse_step("gpu_model_runner: forward") is None


def cpu_trace():
    """Prefill, then 3 decode steps of 100 us, then an empty step. Each decode step: preprocess op 10,
    forward op 50 (with a nested op that must not count twice), sample op 5, one unannotated op 5:
    70 us of ops, 30 us outside them."""
    ev = [ann(PREFILL, 0, 90), op("aten::mm", 10, 70)]
    for i in range(3):
        t = 100 + 100 * i
        ev += [ann(DECODE, t, 80),
               ann("gpu_model_runner: preprocess", t + 1, 15), op("aten::copy_", t + 2, 10),
               ann("gpu_model_runner: forward", t + 20, 55), op("aten::linear", t + 21, 50), op("aten::mm", t + 22, 40),
               ann("gpu_model_runner: sample", t + 80, 8), op("aten::argmax", t + 81, 5),
               op("aten::fill_", t + 92, 5)]
    ev += [ann("execute_context_0(0)_generation_0(0)", 400, 5), op("aten::mm", 401, 3),
           op("aten::mm", 150, 10, tid=99)]  # another thread: not the stepping one, not counted
    return {"traceEvents": ev + [{"ph": "M", "name": "process_name", "pid": PID}]}


def test_reduce_cpu_trace_per_step_math():
    red = P.reduce(cpu_trace())
    assert red["timeline"] == "cpu"
    assert red["steps"] == {"decode_steps": 3, "prefill_steps": 1, "decode_annotations": 3, "generation_tokens": 3}
    ph = phases(red)
    assert [r["phase"] for r in red["phases"]] == list(P.PHASES)
    assert ph["target forward"]["ms_per_step"] == pytest.approx(0.050)
    assert ph["bookkeeping"]["ms_per_step"] == pytest.approx(0.010)
    assert ph["sampler"]["ms_per_step"] == pytest.approx(0.005)
    assert ph["other"]["ms_per_step"] == pytest.approx(0.005)  # counted, never dropped
    assert ph["gaps"]["ms_per_step"] == pytest.approx(0.030)
    assert ph["draft"]["ms_per_step"] == 0
    assert red["step_ms"] == pytest.approx(0.100)
    assert sum(r["share_pct"] for r in red["phases"]) == pytest.approx(100, abs=0.05)
    assert ph["target forward"]["share_pct"] == pytest.approx(50)
    assert ph["target forward"]["top"][0]["name"] == "aten::linear"


def test_last_decode_step_without_successor_is_left_out():
    ev = [e for e in cpu_trace()["traceEvents"] if e.get("name") != "execute_context_0(0)_generation_0(0)"]
    red = P.reduce({"traceEvents": ev})
    assert red["steps"]["decode_steps"] == 2 and red["steps"]["decode_annotations"] == 3


def gpu_trace():
    """2 decode steps of a spec-decode runner (async: sample and draft after execute_model returns).
    Step at CPU t: forward kernel 40 us, lm_head 10, rejection sampler 5, draft 20 (its own
    compute_logits inside), a memcpy with no annotation 2. Kernels run back to back from device
    time 1000 + 100 i except a 13 us idle before the memcpy: device idle = 100 - 77 = 23 us per step."""
    ev, corr = [ann(PREFILL, 0, 50)], 1
    for i in range(3):
        t, d = 100 + 100 * i, 1000 + 100 * i
        ev += [ann(DECODE, t, 30), ann("gpu_model_runner: forward", t + 1, 10), launch(corr, t + 2),
               kernel("sm90_gemm_bf16", corr, d, 40),
               ann("gpu_model_runner: postprocess", t + 15, 5),
               py("vllm/model_executor/models/qwen3.py(300): compute_logits", t + 15, 4), launch(corr + 1, t + 16),
               kernel("lm_head_gemm", corr + 1, d + 40, 10),
               ann("gpu_model_runner: sample", t + 40, 5), launch(corr + 2, t + 41),
               kernel("rejection_greedy_sample_kernel", corr + 2, d + 50, 5),
               ann("gpu_model_runner: draft", t + 50, 20),
               py("vllm/model_executor/models/qwen3.py(300): compute_logits", t + 55, 5), launch(corr + 3, t + 56),
               kernel("draft_gemm", corr + 3, d + 55, 20),
               {**launch(corr + 4, t + 80), "name": "cudaMemcpyAsync"},
               {**kernel("Memcpy DtoH", corr + 4, d + 88, 2), "cat": "gpu_memcpy"}]
        corr += 5
    ev.append(ann("execute_context_0(0)_generation_0(0)", 400, 5))
    ev.append(kernel("orphan_kernel", 999, 5000, 50))  # no launch in the trace: not counted
    return {"traceEvents": ev}


def test_reduce_gpu_trace_device_time_by_launch_context():
    red = P.reduce(gpu_trace())
    assert red["timeline"] == "gpu"
    assert red["steps"]["decode_steps"] == 3
    ph = phases(red)
    assert ph["target forward"]["ms_per_step"] == pytest.approx(0.050)  # forward + lm_head
    assert ph["sampler"]["ms_per_step"] == pytest.approx(0.005)
    assert ph["draft"]["ms_per_step"] == pytest.approx(0.020)           # its compute_logits stays draft
    assert ph["other"]["ms_per_step"] == pytest.approx(0.002)
    assert ph["other"]["top"][0]["name"] == "Memcpy DtoH"
    # steps 0->1 and 1->2: next step's first kernel; the last: its own last kernel end (90 us span)
    assert ph["gaps"]["total_ms"] == pytest.approx((23 + 23 + 13) / 1e3)
    assert red["leaves"] == 15
    # By kind of kernel: the forward's two GEMMs (forward, lm_head), the draft's one, the memcpy a copy.
    assert ph["target forward"]["kinds"] == [{"kind": "gemm", "ms_per_step": 0.05, "per_step": 2}]
    assert ph["draft"]["kinds"] == [{"kind": "gemm", "ms_per_step": 0.02, "per_step": 1}]
    assert ph["sampler"]["kinds"][0]["kind"] == "sampling" and ph["other"]["kinds"][0]["kind"] == "copy"


# Names from the H100 traces under results/profiles/ (vLLM 0.26, Qwen3.5-4B): what each kind stands for.
@pytest.mark.parametrize("name,kind", [
    ("nvjet_sm90_tst_256x8_64x6_4x1_v_bz_TNT", "gemm"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float>", "gemm"),
    ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::Col", "attention"),
    ("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16>", "attention"),
    ("fused_sigmoid_gating_delta_rule_update_kernel", "gated deltanet"),
    ("_gdn_spec_packed_kernel", "gated deltanet"),  # the kit's (GDN_SPEC_PACKED), H200 trace of 20261129T1836Z
    ("_causal_conv1d_update_kernel", "conv1d"),
    ("triton_red_fused__to_copy_add_fused_add_rms_norm_3", "norm"),
    ("_fused_qk_rmsnorm_rope_gate_kernel", "norm"),
    ("triton_poi_fused_mul_silu_slice_4", "fused elementwise"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>>>", "sampling"),
    ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda", "copy"),
    ("Memcpy HtoD (Pinned -> Device)", "copy"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<int>>", "elementwise"),
    ("eagle_step_slot_mapping_metadata_kernel", "other"),
    ("aten::linear", "gemm"),
    # H200 traces of session 20261130T0158Z: FP8 Marlin (FP8_GEMM=pick) and the kit's W8A16 body (LM_HEAD_W8=int8)
    ("void marlin::Marlin<1125899906909960l, 2814749767172868l, 1125899906909960l, 1125899906909960l, 256, 1, 8, 8, "
     "true, 4, -1, false>(int4 const*, int4 const*, int4*, int4*, int4 const*, float const*, int)", "gemm"),
    ("_w8_body", "gemm"),
    ("_w4a16_il_body", "gemm"),
    ("triton_red_fused__to_copy_add_fp8_gemm_pick_fused_add_rms_norm_3", "norm"),  # Inductor names the op it follows
])
def test_kernel_kind_of_real_kernel_names(name, kind):
    assert P.kernel_kind(name) == kind


def test_kinds_line_gives_the_gemms_bandwidth_against_the_phase_bytes():
    rows = [{"phase": "target forward", "ms_per_step": 4.0, "bytes_per_step": 6_000_000_000, "floor_ms": 2.0,
             "kinds": [{"kind": "gemm", "ms_per_step": 3.0, "per_step": 200},
                       {"kind": "norm", "ms_per_step": 0.5, "per_step": 96.5}]},
            {"phase": "draft", "ms_per_step": 1.0, "bytes_per_step": None, "floor_ms": None,
             "kinds": [{"kind": "gemm", "ms_per_step": 0.8, "per_step": 12}]},
            {"phase": "sampler", "ms_per_step": 0.1, "kinds": [{"kind": "sampling", "ms_per_step": 0.1, "per_step": 1}]}]
    lines = P.kinds_lines(rows)
    assert lines[0] == ("target forward by kind: gemm 3.0 ms (200/step), norm 0.5 ms (96.5/step); its 6000 MB over "
                        "the GEMMs' 3.0 ms is 2.00 TB/s, the floor's 67%")
    assert lines[1] == "draft by kind: gemm 0.8 ms (12/step)" and len(lines) == 2


def test_gpu_gaps_split_by_what_the_host_was_doing():
    """Host and device on one clock. Step 0: inputs prepared (bookkeeping) until the forward's launch,
    the forward 30-70, then the host drafts 70-100 and launches a draft kernel 100-110, then nothing
    matched until the next step prepares its inputs 120-148 and launches its forward 148-150. Device idle
    between the step's first kernel and the next step's: 70-100 (draft), 110-120 (outside), 120-148
    (bookkeeping), 148-150 (target forward: the launch)."""
    ev, corr = [], 1
    for t in (0, 120):
        ev += [ann(DECODE, t, 5), ann("gpu_model_runner: preprocess", t, 28),
               ann("gpu_model_runner: forward", t + 28, 4), launch(corr, t + 28), kernel("gemm", corr, t + 30, 40)]
        corr += 1
    ev += [ann("gpu_model_runner: draft", 70, 30), launch(corr, 95), kernel("draft_gemm", corr, 100, 10)]
    ev.append(ann("execute_context_0(0)_generation_0(0)", 300, 5))
    red = P.reduce({"traceEvents": ev})
    assert red["steps"]["decode_steps"] == 2
    assert phases(red)["gaps"]["total_ms"] == pytest.approx(0.070)
    host = {g["host"]: g["ms_per_step"] for g in red["gaps_by_host"]}
    assert host == pytest.approx({"target forward": 0.001, "draft": 0.015, "sampler": 0.0, "bookkeeping": 0.014,
                                  P.OUTSIDE: 0.005})
    assert sum(g["share_pct"] for g in red["gaps_by_host"]) == pytest.approx(100, abs=0.05)  # rounded shares
    assert "bookkeeping 0.014 ms" in P.table_text(red["phases"], red["steps"], red["timeline"], red["step_ms"],
                                                   red["gaps_by_host"])


def test_cpu_trace_has_no_host_split_of_gaps():
    red = P.reduce({"traceEvents": [ann(DECODE, 0, 5), op("aten::mm", 1, 3),
                                    ann("execute_context_0(0)_generation_0(0)", 10, 1)]})
    assert red["timeline"] == "cpu" and red["gaps_by_host"] is None


def test_gpu_gap_stops_at_a_prefill_between_decode_steps():
    """Two requests one after another: the idle before the second prefill is not a decode gap."""
    ev, corr = [], 1
    for i, name in enumerate([DECODE, PREFILL, DECODE, "execute_context_0(0)_generation_0(0)"]):
        t, d = 100 * i, 10_000 * i
        ev += [ann(name, t, 30), ann("gpu_model_runner: forward", t + 1, 10), launch(corr, t + 2),
               kernel("gemm", corr, d, 40)]
        corr += 1
    red = P.reduce({"traceEvents": ev})
    assert red["steps"]["decode_steps"] == 2
    assert phases(red)["gaps"]["total_ms"] == 0
    assert phases(red)["target forward"]["ms_per_step"] == pytest.approx(0.040)


def test_no_step_annotation_gives_no_steps():
    red = P.reduce({"traceEvents": [op("aten::mm", 0, 10)]})
    assert red["steps"]["decode_steps"] == 0 and red["step_ms"] is None


def test_load_trace_gzipped_or_plain(tmp_path):
    t = cpu_trace()
    (tmp_path / "a.json").write_text(json.dumps(t))
    (tmp_path / "b.pt.trace.json").write_bytes(gzip.compress(json.dumps(t).encode()))  # gz without the suffix
    assert P.load_trace(tmp_path / "a.json") == P.load_trace(tmp_path / "b.pt.trace.json") == t


def test_draft_bytes_count_only_the_draft_vocabulary_rows():
    """SPEC_DRAFT_VOCAB=N: each MTP pass reads N lm_head rows, not the whole vocabulary (the 2026-11-26
    H100 profile counted 248320; results/corrections/20261126T041500Z-draft-floor-with-draft-vocab.json)."""
    cfg = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": 1000}
    spec = {"SPEC_METHOD": "mtp", "SPEC_K": 2}
    full = P.phase_bytes(cfg, spec, None, 100)["draft"]
    trimmed = P.phase_bytes(cfg, {**spec, "SPEC_DRAFT_VOCAB": 250}, None, 100)["draft"]
    assert full - trimmed == 2 * 2 * (1000 - 250) * 64  # K passes x 2 bytes x rows not read x hidden
    assert P.phase_bytes(cfg, {**spec, "SPEC_DRAFT_VOCAB": 5000}, None, 100)["draft"] == full  # never above the head


def test_phase_bytes_split_target_and_draft():
    cfg = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": 1000}
    plain = P.phase_bytes(cfg, {"SPEC_METHOD": "none"}, None, 100)
    assert set(plain) == {"target forward"}
    mtp = P.phase_bytes(cfg, {"SPEC_METHOD": "mtp", "SPEC_K": 2}, None, 100)
    assert mtp["target forward"] == plain["target forward"] and mtp["draft"] > 0
    from scripts.kit.latency import step_bytes
    assert sum(mtp.values()) == step_bytes(cfg, {"SPEC_METHOD": "mtp", "SPEC_K": 2}, None, 100)["total"]
    assert P.phase_bytes(None, {}, None, 0) == {}
    rows = P.add_floors([{"phase": "target forward"}, {"phase": "gaps"}], mtp, 1e12)
    assert rows[0]["floor_ms"] == pytest.approx(mtp["target forward"] / 1e9, abs=1e-4) and rows[1]["floor_ms"] is None
    assert P.add_floors([{"phase": "target forward"}], mtp, None)[0]["floor_ms"] is None  # CPU: n/a


def test_rules_are_documented_and_compile():
    for phase, pattern, where in P.RULES:
        assert phase in P.PHASES and phase not in ("gaps", "other") and where


def test_plot_only_from_records(tmp_path):
    """--plot RECORD... -o PNG: one bar per record, no server."""
    pytest.importorskip("matplotlib")
    from scripts import profile as cmd
    from scripts.kit.record import make_record, write_record
    from scripts.kit.variant import load
    v = load("tiny")
    red = P.reduce(cpu_trace())
    payload = {"workload": {"prompt_tokens": 8, "decode_tokens": 4, "requests": 1, "warmup_requests": 0,
                            "concurrency": 1, "seed": 0, "sha256": "0" * 64},
               "profiler": {"config": {}, "env": {}, "with_stack": True},
               "server": {"ready_s": 1.0, "argv": ["vllm"]}, "timeline": red["timeline"],
               "steps": {**red["steps"], "output_tokens": 4, "decode_tokens": 3, "tokens_per_step": 1.0,
                         "draft_passes_per_step": 0, "source": "test"},
               "step_ms": red["step_ms"], "phases": P.add_floors(red["phases"], {}, None),
               "floor": {"bandwidth_bytes_per_s": None, "source": None, "note": "n/a"},
               "rules": [{"phase": p, "pattern": r} for p, r, _ in P.RULES],
               "trace": {"path": "x.trace.json.gz", "bytes": 1, "sha256": "0" * 64, "worker_traces": 1, "source": "x"}}
    path = write_record(make_record("profile", v, payload), tmp_path)
    out = tmp_path / "p.png"
    assert cmd.main(["--plot", str(path), str(path), "-o", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"
    out2 = tmp_path / "q.png"
    assert cmd.main(["--variant", "tiny", "--plot", "--results-dir", str(tmp_path), "-o", str(out2)]) == 0
    assert out2.read_bytes()[:4] == b"\x89PNG"


def test_h100_profile_records_keep_their_traces_and_the_checker_catches_a_lost_or_changed_one(tmp_path, monkeypatch):
    """The committed H100 profiles name traces that exist with their sha256 (after the path correction);
    a record pointing at a missing file, or at a file of other bytes, is a mismatch."""
    import glob
    import shutil
    from scripts.kit import paths
    from scripts.kit.record import load_record
    from scripts.kit.summaries.recompute import record_mismatches
    recs = [load_record(f) for f in sorted(glob.glob(str(paths.ROOT / "results/*/*-profile.json")))]
    gpu = [r for r in recs if r["provenance"]["device"]["kind"] == "gpu"]
    assert gpu, "no GPU profile record committed"
    for r in gpu:
        assert r["payload"]["trace"]["path"].startswith("results/profiles/")
        assert record_mismatches(r) == []
    rec = gpu[0]
    copy = tmp_path / "results" / "profiles" / "t.trace.json.gz"
    copy.parent.mkdir(parents=True)
    shutil.copy(paths.ROOT / rec["payload"]["trace"]["path"], copy)
    monkeypatch.setattr(paths, "ROOT", tmp_path)
    moved = {**rec, "payload": {**rec["payload"], "trace": {**rec["payload"]["trace"], "path": "results/profiles/t.trace.json.gz"}}}
    assert record_mismatches(moved) == []
    copy.write_bytes(copy.read_bytes()[:-1] + b"\0")
    assert any("sha256" in m for m in record_mismatches(moved))
    copy.unlink()
    assert any("does not exist" in m for m in record_mismatches(moved))


def test_reduce_only_a_committed_h100_trace_says_where_the_device_idled(capsys, tmp_path):
    """The MTP trace of 2026-11-25 20:44 through --reduce: the device idles mostly while the host
    drafts and prepares inputs; a file that is no trace is one clear error."""
    from scripts import profile as S
    from scripts.kit.errors import KitError
    from scripts.kit.paths import ROOT
    assert S.main(["--reduce", str(ROOT / "results/profiles/20261125T204405Z-qwen3.5-4b-bf16-tuned.trace.json.gz")]) == 0
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if l.startswith("gaps by what the host was doing"))
    shares = {h: float(pct) for h, pct in re.findall(r"(target forward|draft|sampler|bookkeeping|outside the runner) "
                                                      r"[\d.]+ ms \(([\d.]+)%\)", line)}
    assert shares["draft"] + shares["bookkeeping"] > 80
    bad = tmp_path / "x.json.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(KitError, match="not a torch-profiler chrome trace"):
        S.main(["--reduce", str(bad)])


def test_gpu_gaps_charged_to_the_innermost_vllm_function():
    """Step 0: kernel 0-10, then the GPU idles 10-50 while the host is in the runner's _prepare_inputs (10-30),
    inside it a GDN metadata build (15-25) that calls into torch (18-22: charged to the build, its vLLM caller),
    then in no vLLM frame (30-40), then in propose (40-50); the next step's kernel starts at 50."""
    ev = [ann(DECODE, 0, 5), launch(1, 0), kernel("gemm", 1, 0, 10),
          py("vllm/v1/worker/gpu_model_runner.py(1937): _prepare_inputs", 10, 20),
          py("vllm/v1/attention/backends/gdn_attn.py(168): build", 15, 10),
          py("torch/_tensor.py(40): item", 18, 4),
          py("vllm/v1/spec_decode/llm_base_proposer.py(502): propose", 40, 10),
          ann(DECODE, 50, 5), launch(2, 50), kernel("gemm", 2, 50, 10),
          ann("execute_context_0(0)_generation_0(0)", 100, 5)]
    red = P.reduce({"traceEvents": ev})
    assert red["steps"]["decode_steps"] == 2
    by = {g["frame"]: g["ms_per_step"] for g in red["gaps_by_frame"]}
    assert by == pytest.approx({"vllm/v1/worker/gpu_model_runner.py(1937): _prepare_inputs": 0.005,
                                "vllm/v1/attention/backends/gdn_attn.py(168): build": 0.005,
                                "vllm/v1/spec_decode/llm_base_proposer.py(502): propose": 0.005,
                                "(no vLLM frame open)": 0.005})
    assert red["gaps_by_frame"][0]["share_pct"] == pytest.approx(25)
    text = P.table_text(red["phases"], red["steps"], red["timeline"], red["step_ms"], red["gaps_by_host"],
                        red["gaps_by_frame"])
    assert "gdn_attn.py(168): build" in text
    # Without Python stacks (make profile --no-stack) there is nothing to charge: an empty list, not a guess.
    bare = P.reduce({"traceEvents": [e for e in ev if e["cat"] != "python_function"]})
    assert bare["gaps_by_frame"] == []


def test_a_trace_whose_kernels_match_no_phase_says_how_to_split_it():
    """The V2 runner has no profiling scopes: with the Python stack, its CUDA-graph replay frame puts the step's
    kernel in target forward; without (make profile --no-stack, as session 20261128T1236Z ran it) every kernel is
    'other', and the table says why and what to do, where a V1-style split table says nothing of the kind."""
    ev = [ann(DECODE, 0, 5), py("vllm/v1/worker/gpu/cudagraph_utils.py(300): run_fullgraph", 1, 8), launch(1, 2),
          kernel("gemm", 1, 2, 10), ann(DECODE, 50, 5), py("vllm/v1/worker/gpu/cudagraph_utils.py(300): run_fullgraph",
          51, 8), launch(2, 52), kernel("gemm", 2, 52, 10), ann("execute_context_0(0)_generation_0(0)", 100, 5)]
    stacked = P.reduce({"traceEvents": ev})
    ms = {r["phase"]: r["ms_per_step"] for r in stacked["phases"]}
    assert ms["target forward"] > 0 and not ms["other"]
    assert not P.unsplit(stacked["phases"])
    bare = P.reduce({"traceEvents": [e for e in ev if e["cat"] != "python_function"]})
    assert P.unsplit(bare["phases"])
    say = "no kernel matched a phase rule"
    assert say in P.table_text(bare["phases"], bare["steps"], bare["timeline"], bare["step_ms"])
    assert say not in P.table_text(stacked["phases"], stacked["steps"], stacked["timeline"], stacked["step_ms"])


def graph_launch(corr, ts):
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": PID, "tid": TID, "ts": ts, "dur": 3,
            "args": {"correlation": corr}}


def test_v2_graph_replays_without_stacks_split_by_where_the_graph_was_launched():
    """vLLM's V2 runner under --no-stack: no rule sees a replayed kernel's context, so a graph launched before the
    step's first sampler kernel is the target's and one after it the drafter's. Step 0 speculates (target graph,
    eager rejection kernel, two draft graphs, an eager copy); step 1 samples nothing (no speculation): its graph
    stays the target's. A replayed kernel a rule names (the sampler's, by its own name) keeps its rule."""
    ev = [ann(DECODE, 0, 5),
          graph_launch(1, 1), kernel("cutlass_3x_gemm_sm90_fp8", 1, 5, 20), kernel("_gdn_spec_packed_kernel", 1, 25, 4),
          launch(2, 10), kernel("_rejection_kernel", 2, 30, 2),
          graph_launch(3, 12), kernel("cutlass_3x_gemm_sm90_fp8", 3, 33, 6),
          graph_launch(4, 14), kernel("cutlass_3x_gemm_sm90_fp8", 4, 40, 8), kernel("_resample_kernel", 4, 48, 1),
          launch(5, 16), kernel("Memcpy DtoD (Device -> Device)", 5, 50, 1),
          ann(DECODE, 100, 5), graph_launch(6, 101), kernel("cutlass_3x_gemm_sm90_fp8", 6, 105, 30),
          ann("execute_context_0(0)_generation_0(0)", 200, 5)]
    red = P.reduce({"traceEvents": ev})
    us = {r["phase"]: r["total_ms"] * 1e3 for r in red["phases"]}
    assert us["target forward"] == pytest.approx(20 + 4 + 30)
    assert us["draft"] == pytest.approx(6 + 8)
    assert us["sampler"] == pytest.approx(2 + 1)
    assert us["other"] == pytest.approx(1)        # an eager kernel no rule names stays other
    assert not P.unsplit(red["phases"])
    assert red["leaves"] == 8
    # A sampler-named kernel replayed inside the target's graph does not move where the step samples: the target's
    # graph stays the target's.
    inside = ev[:4] + [kernel("_resample_kernel", 1, 29, 1)] + ev[4:]
    us2 = {r["phase"]: r["total_ms"] * 1e3 for r in P.reduce({"traceEvents": inside})["phases"]}
    assert us2["target forward"] == pytest.approx(20 + 4 + 30) and us2["draft"] == pytest.approx(6 + 8)
    # The same launches without the graph (eager cudaLaunchKernel): nothing to place by order, all other.
    eager = [dict(e, name="cudaLaunchKernel") if e.get("name") == "cudaGraphLaunch" else e for e in ev]
    assert P.unsplit(P.reduce({"traceEvents": eager})["phases"])


def test_a_committed_v2_trace_without_stacks_splits_into_target_and_draft(capsys):
    """Session 20261206T0747Z's trace of the all-cuts variant (V2 runner, --no-stack) was all 'other' in its record;
    by graph order the target's verify is most of the step's kernel time and the drafter's four passes the rest."""
    from scripts.kit.paths import ROOT
    red = P.reduce(P.load_trace(ROOT / "results/profiles/20261206T081001Z-qwen3.5-4b-fp8-v4-nocopy-vocab-draftcutlass"
                                       ".trace.json.gz"))
    ms = {r["phase"]: r["ms_per_step"] for r in red["phases"]}
    assert not P.unsplit(red["phases"])
    assert ms["target forward"] > 3 * ms["draft"] > 0
    assert ms["other"] < 0.1 * ms["target forward"]
    kinds = {k["kind"]: k for k in phases(red)["target forward"]["kinds"]}
    assert kinds["gemm"]["ms_per_step"] > 0.5 * ms["target forward"]
    assert kinds["gated deltanet"]["per_step"] == 24  # the target's GDN layers, once each


def test_two_runs_of_one_second_get_their_own_trace_folder_and_log(tmp_path):
    """Two jobs profiling on two GPUs of one host can start in the same second: each claims its own name (the log
    made with O_EXCL), so neither reduces the other's traces; with an explicit --trace-dir the clash is an error."""
    from scripts.kit.errors import KitError
    from scripts.profile import run_name
    logs = tmp_path / "logs"
    first, second = run_name(logs, "20261130T070000", None), run_name(logs, "20261130T070000", None)
    assert (first, second) == ("profile-20261130T070000", "profile-20261130T070000-2")
    assert (logs / f"{second}.log").is_file()
    with pytest.raises(KitError, match="another run of this second"):
        run_name(logs, "20261130T070000", tmp_path / "mine")
