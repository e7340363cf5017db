"""Latency probe: the pure math (scripts/kit/latency.py), and the whole probe against a FAKE
streaming server with known TTFT/ITL (tests/fake_openai_stream.py), since a real server's timing
is unknown. The real-vLLM run is tests/test_probe_e2e.py."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scripts import probe
from scripts.kit import latency as L
from scripts.kit.errors import KitError
from scripts.kit.paths import ROOT
from scripts.kit.record import records
from scripts.kit.summaries import latency as S
from scripts.kit.variant import load
from tests.fake_openai_stream import FakeOpenAIStream

SMALL = ["--concurrency", "1,2", "--repeats", "2", "--input-lens", "8,16,32", "--output-min", "10",
         "--output-max", "10", "--requests", "3", "--prefix-tokens", "64", "--prefix-suffix-tokens", "4",
         "--prefix-requests", "2"]


def run_probe(fake, tmp_path, variant="tiny", extra=()):
    return probe.main(["--variant", variant, "--url", fake.url, "--results-dir", str(tmp_path / "results"),
                       "--plot", str(tmp_path / "latency.png"), *SMALL, *extra])


def only_record(tmp_path, variant="tiny"):
    recs = records(variant, "latency", tmp_path / "results")
    assert len(recs) == 1
    return recs[0][1]


# -- pure math -----------------------------------------------------------------------------------
def test_percentile_interpolates_like_numpy():
    assert L.percentile([5, 1, 3, 2, 4], 50) == 3
    assert L.percentile(range(101), 99) == 99
    assert L.percentile([10, 20], 95) == pytest.approx(19.5)
    assert L.percentile([], 50) is None


def test_workload_is_seeded_exact_and_distinct_per_pass():
    w = L.Workload(input_lens=(8, 16, 32), output_min=5, output_max=9, requests=6)
    a, b = L.level_requests(w, 4, 0), L.level_requests(w, 4, 0)
    assert a == b
    assert {len(r.prompt) for r in a} <= {8, 16, 32}
    assert all(5 <= r.max_tokens <= 9 for r in a)
    assert all(L.TOKEN_LO <= t < L.TOKEN_HI for r in a for t in r.prompt)
    assert len(L.level_requests(w, 8, 0)) == 8  # at least one full wave
    warm, again = L.level_requests(w, 4, 0, warmup=True), L.level_requests(w, 4, 1)
    shape = lambda rs: [(len(r.prompt), r.max_tokens, r.cls) for r in rs]
    assert shape(warm) == shape(again) == shape(a)  # warm-up and repeats: the same shapes...
    assert len({r.max_tokens for r in a}) > 1 or len({r.cls for r in a}) > 1  # (a real mix)
    assert all(x.prompt != y.prompt for x, y in zip(again, a))  # ...never the same prompt
    assert all(x.prompt != y.prompt for x, y in zip(warm, a))
    assert L.Workload().spec()["draw"] == L.DRAW  # a change of draw changes the hash
    pre = L.prefix_requests(L.Workload(prefix_tokens=20, prefix_suffix_tokens=3, prefix_requests=3))
    assert all(len(r.prompt) == 23 and r.prompt[:20] == pre[0].prompt[:20] for r in pre)
    assert len({tuple(r.prompt) for r in pre}) == 3
    assert w.sha256 == L.Workload(input_lens=(8, 16, 32), output_min=5, output_max=9, requests=6).sha256
    assert w.sha256 != L.Workload(input_lens=(8, 16, 32), output_min=5, output_max=9, requests=7).sha256


def test_completion_body_forces_output_length():
    body = L.completion_body("m", L.Request([1, 2], 7, "short"))
    assert body["max_tokens"] == body["min_tokens"] == 7 and body["ignore_eos"] and body["stream"]


def test_request_metrics_from_chunk_times():
    r = L.Result(sent=0.0, chunk_times=[0.05, 0.06, 0.08], end=0.09, output_tokens=4, expected_tokens=4)
    assert r.ok
    assert r.ttft_ms == pytest.approx(50) and r.e2e_ms == pytest.approx(90)
    assert r.tpot_ms == pytest.approx(40 / 3)
    assert r.itl_ms == pytest.approx([10, 20])
    short = L.Result(sent=0.0, chunk_times=[0.1], end=0.2, output_tokens=3, expected_tokens=4)
    assert not short.ok and short.failure() == "generated 3 of 4 tokens"


METRICS = """# HELP vllm:prefix_cache_queries_total x
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 50.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 30.0
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 40.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 25.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 5.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="3"} 4.0
vllm:num_requests_running{engine="0",model_name="m"} 3.0
"""


def test_metrics_parse_delta_prefix_and_acceptance():
    after = L.parse_metrics(METRICS)
    assert after[L.PREFIX_QUERIES] == 150.0  # summed over engines
    assert "vllm:num_requests_running" not in after
    before = {L.PREFIX_QUERIES: 50.0, L.PREFIX_HITS: 10.0, L.SPEC_DRAFTS: 0.0, L.SPEC_ACCEPTED: 0.0,
              L.SPEC_DRAFT_TOKENS: 0.0, L.SPEC_PER_POS: {0: 1.0}}
    d = L.metrics_delta(before, after)
    assert L.prefix_cache(d) == {"queries_tokens": 100, "hits_tokens": 20, "hit_rate": 0.2}
    s = L.spec_decode(d)
    assert s["acceptance_length"] == pytest.approx(1 + 25 / 10)
    assert s["draft_acceptance_rate"] == pytest.approx(25 / 40)
    assert s["per_position_acceptance"] == pytest.approx([0.8, 0.7, 0.5, 0.4])
    assert L.spec_decode({}) is None and L.prefix_cache({}) is None
    assert L.add_deltas([d, d])[L.SPEC_PER_POS][3] == 8.0


def test_preemptions_counted_per_level_and_warned():
    """vLLM's preemption counter: a level whose requests were evicted for KV space says so (the
    2026-11-23 K sweep at 2 GiB looked like a speculation effect at concurrency 8, and was not)."""
    before = L.parse_metrics('vllm:num_preemptions_total{engine="0",model_name="m"} 2.0\n')
    after = L.parse_metrics('vllm:num_preemptions_total{engine="0",model_name="m"} 9.0\n')
    assert L.preemptions(L.add_deltas([L.metrics_delta(before, after)])) == 7
    assert L.preemptions({}) is None  # a server without the counter: unknown, not zero
    w = L.preemption_warnings([{"concurrency": 1, "preemptions": 0}, {"concurrency": 8, "preemptions": 7},
                               {"concurrency": 16, "preemptions": None}])
    assert len(w) == 1 and w[0].startswith("concurrency 8: 7 preemption(s)") and "KV budget" in w[0]


def _res(ttft, tpot, n=11):
    return L.Result(sent=0.0, chunk_times=[ttft / 1e3 + i * tpot / 1e3 for i in range(n)],
                    end=ttft / 1e3 + (n - 1) * tpot / 1e3, output_tokens=n, expected_tokens=n)


def test_level_goodput_slo_and_unstable_repeat():
    slo = L.SLO(ttft_p99_ms=100, tpot_p99_ms=20)
    good, slow = [_res(50, 10) for _ in range(3)], [_res(50, 30)]
    reps = [{"duration_s": 1.0, "results": good}, {"duration_s": 1.0, "results": slow}]
    lv = L.summarize_level(4, reps, good + slow, slo, max_spread_pct=10)
    assert lv["goodput_req_per_s"] == pytest.approx(3 / 2.0) and lv["good_fraction"] == 0.75
    assert not lv["meets_slo"]  # p99 TPOT 30 > 20
    assert lv["tpot_ms"]["p50"] == pytest.approx(10)
    # The shared GPU README's un-warmed batch 8: 650 vs 1423 tok/s is flagged, 1400 is not.
    reps = [{"duration_s": 1.0, "results": [_res(50, 10, n)]} for n in (1423, 650, 1400)]
    lv = L.summarize_level(8, reps, [r for x in reps for r in x["results"]], L.SLO(), max_spread_pct=10)
    assert lv["unstable_repeats"] == [1]
    assert lv["output_tok_per_s"]["spread_pct"] == pytest.approx(100 * (1423 - 650) / 1400, abs=0.01)


def test_max_concurrency_needs_every_lower_level():
    lv = lambda c, ok: {"concurrency": c, "meets_slo": ok}
    assert L.max_concurrency_meeting_slo([lv(1, True), lv(8, True), lv(4, True), lv(16, False)]) == 8
    assert L.max_concurrency_meeting_slo([lv(1, True), lv(4, False), lv(8, True)]) == 1
    assert L.max_concurrency_meeting_slo([lv(1, False)]) is None


def test_slo_parsing():
    assert L.parse_slo("ttft=200,tpot=50") == L.SLO(200, 50)
    assert L.parse_slo("tpot=15") == L.SLO(500, 15)
    with pytest.raises(ValueError, match="unknown SLO bound"):
        L.parse_slo("e2e=3")


def _cfg(name):
    return json.loads((ROOT / "weights" / "configs" / name).read_text())


def test_weight_bytes_match_the_gpu_readme_figures():
    q3 = _cfg("qwen3-4b.json")
    assert L.weight_bytes_per_step(q3) / 1e9 == pytest.approx(8.0, rel=0.03)  # "8.0 GB read per token"
    assert L.weight_bytes_per_step(q3, "awq_w4a16", 32, "linear") / 1e9 == pytest.approx(2.8, rel=0.05)
    mlp_only = L.weight_bytes_per_step(q3, "awq_w4a16", 32, "mlp")
    assert 2.8e9 < mlp_only < 8.0e9
    q35 = _cfg("qwen3.5-4b.json")
    assert L.layer_kinds(q35["text_config"]).count("full") == 8
    assert 7.5e9 < L.weight_bytes_per_step(q35) < 9.5e9  # ~4.2B params read per step in bf16


def test_roofline_floor_skip_and_violation():
    v = load("qwen3-4b-bf16").config
    assert L.roofline(_cfg("qwen3-4b.json"), v, None, 4.0, 1)["status"] == "skipped"
    assert "no bandwidth" in L.roofline(_cfg("qwen3-4b.json"), v, "Tesla T4", 4.0, 1)["reason"]
    rf = L.roofline(_cfg("qwen3-4b.json"), v, "NVIDIA H100 80GB HBM3", 4.36, 1)
    assert rf["status"] == "ok" and rf["floor_tpot_ms"] == pytest.approx(2.7, rel=0.03)
    assert rf["roofline_pct_c1"] == pytest.approx(61, abs=2)  # the README's "61% of it"
    assert L.roofline(_cfg("qwen3-4b.json"), v, "NVIDIA H100 80GB HBM3", 1.0, 1)["status"] == "violated"
    # Speculation: 3.7 tokens per step lowers the floor, so 1.0 ms is possible.
    assert L.roofline(_cfg("qwen3-4b.json"), v, "NVIDIA H100 80GB HBM3", 1.0, 3.7)["status"] == "ok"
    lv = {"concurrency": 8, "tpot_ms": {"p50": 2.0}}
    assert "below the bandwidth floor" in L.floor_violations([lv], 2.7)[0]


def _rec(gpu="NVIDIA H100 80GB HBM3", vllm="0.26.0", sha="a" * 64, weights="dummy", valid=True, kv=None):
    return {"config": {"SERVE_KV_CACHE_MEMORY_BYTES": kv},
            "provenance": {"device": {"name": gpu}, "versions": {"vllm": vllm}, "weights": weights},
            "payload": {"workload": {"sha256": sha}, "validity": {"valid": valid, "errors": [] if valid else ["x"]}}}


def test_comparability_names_each_mismatch():
    assert L.comparability(_rec(), _rec()) == []
    why = L.comparability(_rec(), _rec(gpu="NVIDIA H200", vllm="0.32.0", sha="b" * 64, weights="real", valid=False,
                                       kv="6442450944"))
    assert [w.split()[0] for w in why] == ["GPU", "vLLM", "workload", "weights", "memory", "the"]
    assert L.comparability(_rec(kv="6442450944"), _rec(kv="6442450944")) == []


def test_speedups_are_better_when_above_one():
    lv = lambda c, tps, tpot: {"concurrency": c, "output_tok_per_s": {"median": tps}, "tpot_ms": {"p50": tpot},
                               "ttft_ms": {"p50": 10}, "e2e_ms": {"p50": 100}}
    sp = L.speedups([lv(1, 300, 3.0), lv(8, 100, 1)], [lv(1, 200, 4.5), lv(4, 1, 1)])
    assert sp == [{"concurrency": 1, "output_tok_per_s": 1.5, "tpot_p50": 1.5, "ttft_p50": 1.0, "e2e_p50": 1.0}]


# -- the probe against the FAKE server ------------------------------------------------------------
def test_probe_measures_fake_server_known_delays(tmp_path, short_gil_slices):
    with FakeOpenAIStream("tiny", ttft_s=0.05, itl_s=0.01) as fake:
        assert run_probe(fake, tmp_path) == 0
    p = only_record(tmp_path)["payload"]  # records() re-validates against the schema
    for lv in p["levels"]:
        assert lv["failed"] == 0 and lv["requests"] == 3 * 2  # pooled over both repeats
        # A sleep never ends early, so the lower bounds are tight; a loaded host only adds time.
        assert 48 <= lv["ttft_ms"]["p50"] <= 65, lv["ttft_ms"]
        assert 9.5 <= lv["tpot_ms"]["p50"] <= 12.5, lv["tpot_ms"]
        assert 9.5 <= lv["itl_ms"]["p50"] <= 12.5, lv["itl_ms"]
        assert 50 + 9 * 10 - 5 <= lv["e2e_ms"]["p50"] <= 50 + 9 * 10 + 20, lv["e2e_ms"]
        assert lv["prefix_cache"]["queries_tokens"] > 0
        assert lv["spec_decode"] is None
    # Two requests in flight share nothing in the fake: twice the tokens per second.
    c1, c2 = (lv["output_tok_per_s"]["median"] for lv in p["levels"])
    assert c2 == pytest.approx(2 * c1 * 3 / 4, rel=0.2)  # 3 requests on 2 slots take 2 rounds
    assert p["server"]["prefix_cache_reset"] == "unavailable"
    assert any("reset_prefix_cache" in w for w in p["validity"]["warnings"])
    assert p["prefix_run"]["prefix_cache"]["queries_tokens"] == 2 * 68
    assert p["roofline"]["status"] == "skipped" and p["validity"]["valid"]
    assert p["baseline"] == {"variant": None, "comparable": False, "reasons": ["the variant names no BASELINE"]}
    png = (tmp_path / "latency.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    summ = S.summarize(load("tiny"), records("tiny", "latency", tmp_path / "results"))
    assert S.plot_png("tiny", {"tiny": {"results": {"latency": summ}}}) == png  # deterministic
    assert "| `tiny` |" in S.readme_table({"tiny": {"results": {"latency": summ}}})


def test_chunks_with_empty_text_are_still_timed_as_tokens(short_gil_slices):
    """vLLM streams a chunk per step even when its text is held back (empty); random weights can do
    that for a whole request, which the probe once counted as a failed request."""
    from scripts.probe import stream_one
    with FakeOpenAIStream("tiny", ttft_s=0.05, itl_s=0.01, text="") as fake:
        body = L.completion_body("tiny", L.Request(prompt=[1] * 16, max_tokens=5, cls="short"))
        r = stream_one(fake.url, body, 30)
    assert r.ok, r.failure()
    assert len(r.chunk_times) == 5  # the usage-only chunk is not a token
    assert 45 <= r.ttft_ms <= 80 and r.tpot_ms == pytest.approx(10, abs=3)


def test_probe_resets_prefix_cache_in_dev_mode_and_reads_acceptance(tmp_path):
    with FakeOpenAIStream("tiny", ttft_s=0.01, itl_s=0.002, dev_mode=True, spec_rates=[0.9, 0.6]) as fake:
        assert run_probe(fake, tmp_path) == 0
        assert fake.resets == 2 * 2 + 1  # every timed repeat of both levels, then the prefix run
    p = only_record(tmp_path)["payload"]
    assert p["server"]["prefix_cache_reset"] == "ok"
    assert p["levels"][0]["spec_decode"]["acceptance_length"] == pytest.approx(2.5)
    assert p["levels"][0]["spec_decode"]["per_position_acceptance"] == pytest.approx([0.9, 0.6])


def test_probe_speedup_only_against_comparable_baseline(tmp_path, short_gil_slices):
    with FakeOpenAIStream("qwen3-4b-bf16", ttft_s=0.01, itl_s=0.02) as fake:
        assert run_probe(fake, tmp_path, "qwen3-4b-bf16") == 0
    with FakeOpenAIStream("qwen3-4b-awq", ttft_s=0.01, itl_s=0.01) as fake:
        assert run_probe(fake, tmp_path, "qwen3-4b-awq") == 0
        assert run_probe(fake, tmp_path, "qwen3-4b-awq", ["--seed", "1"]) == 0
    recs = records("qwen3-4b-awq", "latency", tmp_path / "results")
    same, other = recs[0][1]["payload"]["baseline"], recs[1][1]["payload"]["baseline"]
    assert same["comparable"] and same["variant"] == "qwen3-4b-bf16"
    assert same["speedup"][0]["tpot_p50"] == pytest.approx(2.0, rel=0.15)
    assert not other["comparable"] and other["reasons"][0].startswith("workload differs")
    own = records("qwen3-4b-bf16", "latency", tmp_path / "results")[0][1]["payload"]["baseline"]
    assert own["reasons"] == ["this variant is its own baseline"]


def test_fake_gpu_neighbours_are_recorded_and_flagged(tmp_path, monkeypatch):
    # FAKE nvidia-smi answer: three processes hold GPU memory, so two servers idle beside this one.
    monkeypatch.setattr(probe, "gpu_compute_processes", lambda: 3)
    with FakeOpenAIStream("tiny", ttft_s=0.01, itl_s=0.002) as fake:
        assert run_probe(fake, tmp_path) == 0
    p = only_record(tmp_path)["payload"]
    assert p["server"]["gpu_processes"] == 3 and p["validity"]["valid"]
    assert any("3 processes held GPU memory" in w and "own: 1" in w for w in p["validity"]["warnings"])


def test_fake_gpu_tpot_below_floor_is_invalid_not_a_result(tmp_path, monkeypatch):
    # FAKE GPU identity: a 1 ms/token stream on "an H100" is faster than reading 8 GB of weights.
    monkeypatch.setattr(probe, "device_provenance", lambda: {"kind": "gpu", "name": "NVIDIA H100 80GB HBM3"})
    with FakeOpenAIStream("qwen3-4b-bf16", ttft_s=0.005, itl_s=0.001) as fake:
        assert run_probe(fake, tmp_path, "qwen3-4b-bf16") == 1
    rec = only_record(tmp_path, "qwen3-4b-bf16")
    assert not rec["payload"]["validity"]["valid"]
    assert rec["payload"]["roofline"]["status"] == "violated"
    assert "below the bandwidth floor" in rec["payload"]["validity"]["errors"][0]
    summ = S.summarize(load("qwen3-4b-bf16"), [("r.json", rec)])
    assert summ["latest"] is None and summ["invalid_records"] == ["r.json"]


def test_server_dying_mid_probe_is_one_error_and_no_record(tmp_path):
    with FakeOpenAIStream("tiny", ttft_s=0.01, itl_s=0.005, die_after=4) as fake:
        with pytest.raises(KitError, match="stopped answering during .*no record written"):
            run_probe(fake, tmp_path)
    assert not (tmp_path / "results").exists() or not list((tmp_path / "results").rglob("*.json"))


def test_wrong_server_and_bad_input_are_refused(tmp_path):
    with FakeOpenAIStream("something-else") as fake:
        with pytest.raises(KitError, match="serves \\['something-else'\\], not variant 'tiny'"):
            run_probe(fake, tmp_path)
    with pytest.raises(KitError, match="unknown variant 'nope'"):
        probe.main(["--variant", "nope", "--url", "http://127.0.0.1:1"])
    with pytest.raises(KitError, match="--class-weights has 2 values for 3"):
        probe.main(["--variant", "tiny", "--url", "http://127.0.0.1:1", "--class-weights", "1,1"])


def test_unreachable_url_exits_2_with_one_line(tmp_path):
    from scripts.kit.procs import free_port
    r = subprocess.run([sys.executable, "-m", "scripts.probe", "--variant", "tiny", "--url",
                        f"http://127.0.0.1:{free_port()}", "--results-dir", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("error: --url http://127.0.0.1:")
    assert not list(tmp_path.rglob("*.json"))


def test_help_lists_workload_flags():
    r = subprocess.run([sys.executable, "-m", "scripts.probe", "--help"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0
    for flag in ("--url", "--baseline", "--concurrency", "--repeats", "--slo", "--input-lens", "--prefix-tokens",
                 "--results-dir"):
        assert flag in r.stdout


def test_repeat_warnings_name_outliers_and_a_level_still_warming():
    # The shape of results/qwen3.5-4b-awq-seq8-mtp4/20261123T091528Z-latency.json at c=8.
    reps = lambda tps: [{"output_tok_per_s": t, "deviation_pct": 100.0 * (t - sorted(tps)[1]) / sorted(tps)[1]}
                        for t in tps]
    rising = {"concurrency": 8, "repeats": reps([574.55, 850.89, 1628.01]), "unstable_repeats": [0, 2]}
    noisy = {"concurrency": 4, "repeats": reps([900.0, 700.0, 800.0]), "unstable_repeats": [0, 1]}
    steady = {"concurrency": 1, "repeats": reps([300.0, 301.0, 299.0]), "unstable_repeats": []}
    w = L.repeat_warnings([rising, noisy, steady])
    assert sum("rose every repeat" in x for x in w) == 1 and "concurrency 8: tok/s rose" in " ".join(w)
    assert sum("from the median" in x for x in w) == 4
    assert not any("concurrency 1" in x for x in w)


def test_prefix_caching_on_with_no_hit_is_warned():
    """The two FP8-KV Qwen3.5 records (committed) asked for prefix caching and hit 0 of 8704 tokens;
    their BF16-KV twin hit. The warning fires only where the lever was asked for and nothing hit."""
    import json
    from scripts.kit.paths import RESULTS
    fp8 = json.loads((RESULTS / "qwen3.5-4b-awq-seq8-mtp4-fp8kv/20261125T104616Z-latency.json").read_text())
    twin = json.loads((RESULTS / "qwen3.5-4b-awq-seq8-mtp4/20261125T104617Z-latency.json").read_text())
    assert fp8["config"]["SERVE_ENABLE_PREFIX_CACHING"] in ("true", True)
    [w] = L.prefix_warnings(fp8["payload"]["prefix_run"], fp8["config"]["SERVE_ENABLE_PREFIX_CACHING"])
    assert "0 of 8704 queried tokens hit" in w
    assert L.prefix_warnings(twin["payload"]["prefix_run"], twin["config"]["SERVE_ENABLE_PREFIX_CACHING"]) == []
    assert L.prefix_warnings(fp8["payload"]["prefix_run"], "false") == []  # not asked for: nothing to say
    assert L.prefix_warnings(None, "true") == []  # no prefix run


# -- the v2 bytes model (issue #18 item 6) --------------------------------------------------------
def test_step_bytes_mtp_counts_k_draft_passes_with_the_lm_head():
    q35 = _cfg("qwen3.5-4b.json")
    v = {**load("qwen3.5-4b-bf16").config, "SPEC_METHOD": "mtp", "SPEC_K": 4, "SPEC_SCHEDULE": ""}
    b = L.step_bytes(q35, v, context_tokens=1000)
    lm_head = 248320 * 2560 * 2
    assert lm_head > 1.27e9
    assert b["target_weights"] == L.weight_bytes_per_step(q35)
    assert b["draft_weights"] >= 4 * lm_head  # every one of the K passes reads the 16-bit lm_head
    assert b["draft_weights"] < 4 * (lm_head + 0.4e9)  # ... plus one decoder layer and its fc, not more
    assert b["total"] == b["target_weights"] + b["draft_weights"] + b["kv_state"]
    assert b["model"].startswith("v2")
    # Quantizing the target leaves the 16-bit draft alone; K from a schedule's batch-1 range wins.
    awq = L.step_bytes(q35, {**v, "QUANT": "awq_w4a16"}, context_tokens=1000)
    assert awq["draft_weights"] == b["draft_weights"] and awq["target_weights"] < b["target_weights"]
    sched = L.step_bytes(q35, {**v, "SPEC_SCHEDULE": "1-1:2,2-8:4"}, context_tokens=1000)
    assert sched["draft_weights"] == b["draft_weights"] // 2


def test_step_bytes_dflash_counts_the_draft_model():
    q3 = _cfg("qwen3-4b.json")
    v = load("qwen3-4b-awq-dflash").config
    draft = L.spec_arch_config(v)
    assert draft is not None and draft["num_hidden_layers"] == 5
    b = L.step_bytes(q3, v, draft, context_tokens=0)
    d = draft
    layer = (d["hidden_size"] * 32 * 128 * 2 + 2 * d["hidden_size"] * 8 * 128) + 3 * d["hidden_size"] * d["intermediate_size"]
    assert b["draft_weights"] >= 2 * (5 * layer + d["vocab_size"] * d["hidden_size"])  # 5 layers + lm_head, 16-bit
    assert b["draft_weights"] == pytest.approx(1.85e9, rel=0.02)
    assert L.step_bytes(q3, v, None, 0)["draft_weights"] == 0  # no draft config: nothing invented
    assert L.step_bytes(q3, v, draft, 1000)["kv_state"] > L.step_bytes(q3, {**v, "SPEC_METHOD": "none"}, None, 1000)["kv_state"]


def test_step_bytes_fp8_kv_halves_the_kv_cache():
    q3, q35 = _cfg("qwen3-4b.json"), _cfg("qwen3.5-4b.json")
    v = load("qwen3-4b-bf16").config
    auto = L.step_bytes(q3, v, context_tokens=2000)["kv_state"]
    assert auto == 36 * 2 * 8 * 128 * 2 * 2000
    assert L.step_bytes(q3, {**v, "SERVE_KV_CACHE_DTYPE": "fp8_e4m3"}, context_tokens=2000)["kv_state"] == auto // 2
    # Qwen3.5: the Gated DeltaNet state (fp32, context-independent) stays; the attention K/V halves.
    v35 = {**load("qwen3.5-4b-awq-seq8-mtp4").config, "SERVE_KV_CACHE_DTYPE": "auto"}
    kv = lambda dt, n: L.step_bytes(q35, {**v35, "SERVE_KV_CACHE_DTYPE": dt}, context_tokens=n)["kv_state"]
    state = 24 * (32 * 128 * 128 * 4 + (2 * 16 * 128 + 32 * 128) * 3 * 2)
    assert kv("auto", 0) == kv("fp8_e4m3", 0) == state
    assert kv("auto", 1000) - state == 2 * (kv("fp8_e4m3", 1000) - state) > 0


def test_step_bytes_without_speculation_is_target_plus_kv():
    q35 = _cfg("qwen3.5-4b.json")
    v = load("qwen3.5-4b-bf16").config
    assert v["SPEC_METHOD"] == "none"
    b = L.step_bytes(q35, v, context_tokens=1085)
    assert b["draft_weights"] == 0 and b["kv_state"] > 0
    assert b["total"] == b["target_weights"] + b["kv_state"]
    assert L.context_tokens({"input_lens": [128, 1024, 4096], "class_weights": [0.5, 0.35, 0.15],
                             "output_min": 64, "output_max": 128}) == pytest.approx(1036.8 + 48)


def test_roofline_v2_reports_total_but_judges_validity_on_target_weights():
    q35 = _cfg("qwen3.5-4b.json")
    v = load("qwen3.5-4b-awq-seq8-mtp4").config
    rf = L.roofline(q35, v, "NVIDIA H100 80GB HBM3", 5.0, 2.27, None, 1085)
    assert rf["bytes_model"].startswith("v2") and rf["bytes_per_step"]["total"] > 2 * rf["weight_bytes_per_step"]
    assert rf["weight_bytes_per_step"] == rf["bytes_per_step"]["target_weights"]
    assert rf["floor_tpot_ms"] == pytest.approx(rf["bytes_per_step"]["total"] / 3.0e12 * 1e3 / 2.27, rel=1e-3)
    assert rf["weights_floor_tpot_ms"] == pytest.approx(rf["weight_bytes_per_step"] / 3.0e12 * 1e3 / 2.27, rel=1e-3)
    assert rf["roofline_pct_c1"] == pytest.approx(100 * rf["floor_tpot_ms"] / 5.0, abs=0.01)
    # A TPOT between the two floors is below the v2 floor but not impossible: still ok.
    between = (rf["floor_tpot_ms"] + rf["weights_floor_tpot_ms"]) / 2
    assert L.roofline(q35, v, "NVIDIA H100 80GB HBM3", between, 2.27, None, 1085)["status"] == "ok"
    assert L.roofline(q35, v, "NVIDIA H100 80GB HBM3", rf["weights_floor_tpot_ms"] * 0.9, 2.27, None, 1085)["status"] == "violated"
    lv = {"concurrency": 1, "tpot_ms": {"p50": between}}
    assert L.floor_violations([lv], rf["weights_floor_tpot_ms"]) == []


def test_probe_validity_checks_the_target_weights_floor(monkeypatch):
    """validity() passes the draft config and context and judges levels on weights_floor_tpot_ms."""
    seen = {}
    real = L.roofline

    def spy(*a, **k):
        seen["args"] = a
        return real(*a, **k)
    monkeypatch.setattr(L, "roofline", spy)
    monkeypatch.setattr(probe, "weights_config", lambda v: _cfg("qwen3-4b.json"))
    v = load("qwen3-4b-awq-dflash")
    rf0 = real(_cfg("qwen3-4b.json"), v.config, "NVIDIA H100 80GB HBM3", None, 3.5, L.spec_arch_config(v.config), 1085)
    between = (rf0["floor_tpot_ms"] + rf0["weights_floor_tpot_ms"]) / 2
    lvl = {"concurrency": 1, "failed": 0, "tpot_ms": {"p50": between}, "spec_decode": {"acceptance_length": 3.5},
           "output_tok_per_s": {"median": 1.0, "spread_pct": 0}, "repeats": [], "unstable_repeats": [], "preemptions": None}
    payload = {"levels": [lvl], "prefix_run": None, "notes": [], "server": {},
               "workload": {"input_lens": [128, 1024, 4096], "class_weights": [0.5, 0.35, 0.15],
                            "output_min": 64, "output_max": 128}}
    rf, val = probe.validity(payload, v, "NVIDIA H100 80GB HBM3", 3)
    assert seen["args"][5] is not None and seen["args"][5]["num_hidden_layers"] == 5
    assert rf["bytes_per_step"]["context_tokens"] == pytest.approx(1084.8)
    assert rf["status"] == "ok" and not any("bandwidth floor" in e for e in val["errors"])


def test_summary_recomputes_the_roofline_of_v1_records():
    """Committed records hold the v1 (target-only) figure; the table shows v2 for all of them."""
    from scripts.kit.paths import RESULTS
    rec = json.loads((RESULTS / "qwen3.5-4b-awq-seq8-mtp4-fp8kv/20261125T104616Z-latency.json").read_text())
    assert "bytes_model" not in rec["payload"]["roofline"]
    rf = L.record_roofline(rec)
    assert rf["bytes_model"].startswith("v2") and rf["weight_bytes_per_step"] == rec["payload"]["roofline"]["weight_bytes_per_step"]
    assert rf["roofline_pct_c1"] > 2 * rec["payload"]["roofline"]["roofline_pct_c1"]
    s = S.summarize(load("qwen3.5-4b-awq-seq8-mtp4-fp8kv"), [("r.json", rec)])
    assert s["roofline_pct_c1"] == rf["roofline_pct_c1"] and s["roofline_bytes_model"].startswith("v2")
    table = S.readme_table({"x": {"results": {"latency": s}}})
    assert "roofline c=1 (v2 bytes)" in table and "lm_head" in table


def test_condition_warnings_name_slowdowns_and_a_neighbour_that_came_or_went():
    gpu = lambda procs, slow=(): {"gpu": {"gpu_processes": procs, "slowdowns": list(slow)}, "host": {}}
    steady = {"concurrency": 1, "conditions": [{"before": gpu(1), "after": gpu(1)}] * 3}
    assert L.condition_warnings([steady]) == []
    capped = {"concurrency": 8, "conditions": [{"before": gpu(1), "after": gpu(1, ["sw_power_cap"])}]}
    joined = {"concurrency": 4, "conditions": [{"before": gpu(1), "after": gpu(2)}]}
    out = L.condition_warnings([capped, joined])
    assert any("sw_power_cap" in w and "concurrency 8" in w for w in out)
    assert any("[1, 2]" in w and "concurrency 4" in w for w in out)
    assert L.condition_warnings([{"concurrency": 1}]) == []  # records from before conditions were kept
