"""`make compare`: the interleaved A/B record, its ratios and intervals, and the checker that
recomputes them. Timing math against FAKE streaming servers of known speed (tests/fake_openai_stream.py:
a real server's timing is unknown, so a ratio could not be asserted); the same driver runs real vLLM in
tests/test_serve_e2e.py-style e2e runs and on the GPU."""
from __future__ import annotations

import copy
import json

import pytest

from fake_openai_stream import FakeOpenAIStream
from scripts import compare
from scripts.kit import compare as C
from scripts.kit import latency as L
from scripts.kit.errors import KitError
from scripts.kit.record import records
from scripts.kit.record import load_record
from scripts.kit.summaries.recompute import record_mismatches

SMALL = ["--concurrency", "1,2", "--warmup-waves", "1", "--requests", "3", "--input-lens", "16",
         "--class-weights", "1", "--output-min", "8", "--output-max", "12", "--prefix-tokens", "0"]


def run_compare(a_fake, b_fake, tmp_path, extra=()):
    return compare.main(["--a", "tiny", "--b", "tiny", "--url-a", a_fake.url, "--url-b", b_fake.url,
                         "--results-dir", str(tmp_path / "results"), *SMALL, *extra])


def only(tmp_path):
    recs = records("tiny", "comparison", tmp_path / "results")
    assert len(recs) == 1
    return recs[0][1]


def test_round_order_alternates_who_goes_first():
    assert C.round_order(5) == [["a", "b"], ["b", "a"], ["a", "b"], ["b", "a"], ["a", "b"]]


def test_fake_b_twice_as_fast_is_named_the_winner_with_an_interval_around_two(tmp_path, short_gil_slices):
    with FakeOpenAIStream("tiny", ttft_s=0.02, itl_s=0.012) as a, FakeOpenAIStream("tiny", ttft_s=0.02, itl_s=0.006) as b:
        assert run_compare(a, b, tmp_path) == 0
    p = only(tmp_path)["payload"]
    assert len(p["passes"]) == 5 * 2 * 2 and p["order"][1] == ["b", "a"]
    row = C.headline(p["metrics"], "tpot_p50_ms", 1)
    assert row["ratio"] == pytest.approx(2.0, rel=0.25)
    assert row["ci95"][0] <= row["ratio"] <= row["ci95"][1] and row["ci95"][0] > 1
    assert row["verdict"] == "b better" and len(row["per_round"]) == 5
    tps = C.headline(p["metrics"], "output_tok_per_s", 2)
    assert tps["ratio"] > 1.3 and tps["verdict"] == "b better"
    assert all(x["conditions"]["before"]["host"]["cpus"] >= 1 for x in p["passes"])
    # the fakes listen inside this process: its threads are the "server" whose scheduler counters each pass keeps
    import os
    if os.path.exists("/proc/self/schedstat"):
        assert all(x["server_sched"]["threads"] >= 1 and x["server_sched"]["run_s"] > 0 for x in p["passes"])
        assert p["conditions"]["b"]["busiest_thread_wait_pct"][0] >= 0
    if os.path.exists("/proc/pressure/cpu"):
        assert p["conditions"]["a"]["cpu_pressure_pct"] is not None
    # the report prints one host line a pass, in the order they ran
    text = compare.report_text(p).splitlines()
    host = text[text.index("the host, pass by pass:") + 1:][:len(p["passes"])]
    assert [x.split(":")[0].strip() for x in host] == [
        f"round {q['round'] + 1} {q['side'].upper()} c={q['concurrency']}" for q in p["passes"]]
    assert all("TPOT p50 " in x and "steal " in x and ", python_loop_ms " in x for x in host)
    assert all(x["conditions"][w]["host"]["python_loop_ms"] > 0 for x in p["passes"] for w in ("before", "after"))


def test_fake_a_against_itself_finds_no_big_difference(tmp_path, short_gil_slices):
    with FakeOpenAIStream("tiny", ttft_s=0.02, itl_s=0.008) as a, FakeOpenAIStream("tiny", ttft_s=0.02, itl_s=0.008) as b:
        assert run_compare(a, b, tmp_path) == 0
    row = C.headline(only(tmp_path)["payload"]["metrics"], "tpot_p50_ms", 1)
    assert row["ratio"] == pytest.approx(1.0, abs=0.15)
    assert row["ci95"][0] < 1.15 and row["ci95"][1] > 0.87


def test_fewer_than_five_rounds_is_refused(tmp_path):
    with FakeOpenAIStream("tiny") as a, FakeOpenAIStream("tiny") as b, pytest.raises(KitError, match="at least 5"):
        run_compare(a, b, tmp_path, ["--rounds", "3"])
    assert not (tmp_path / "results").exists()


def test_checker_recomputes_ratios_and_catches_a_tampered_sample_or_summary(tmp_path):
    with FakeOpenAIStream("tiny", ttft_s=0.01, itl_s=0.004) as a, FakeOpenAIStream("tiny", ttft_s=0.01, itl_s=0.003) as b:
        assert run_compare(a, b, tmp_path) == 0
    rec = only(tmp_path)
    assert record_mismatches(rec) == []
    bad = copy.deepcopy(rec)
    bad["payload"]["passes"][0]["samples"]["tpot_ms"][0] *= 3
    assert any("tpot" in m for m in record_mismatches(bad))
    bad = copy.deepcopy(rec)
    bad["payload"]["metrics"][0]["ratio"] += 0.5
    assert record_mismatches(bad)


def test_latency_record_summaries_are_recomputed_from_samples():
    w = L.Workload(requests=4)
    mk = lambda sent, ttft, itl, n: L.Result(sent=sent, chunk_times=[sent + ttft + i * itl for i in range(n)],
                                            end=sent + ttft + (n - 1) * itl, output_tokens=n, expected_tokens=n)
    reps = [{"duration_s": 1.0, "results": [mk(0, 0.05, 0.01, 10), mk(0, 0.07, 0.02, 20)]},
            {"duration_s": 1.2, "results": [mk(0, 0.06, 0.01, 10), mk(0, 0.9, 0.02, 20)]}]
    lv = L.summarize_level(2, reps, [r for rep in reps for r in rep["results"]], L.SLO(), 10.0)
    payload = {"slo": {"ttft_p99_ms": 500.0, "tpot_p99_ms": 30.0}, "max_spread_pct": 10.0, "levels": [lv]}
    assert L.sample_mismatches(payload) == []
    assert lv["samples"]["ttft_ms"] == [50.0, 70.0, 60.0, 900.0] and lv["good_fraction"] == 0.75
    tampered = json.loads(json.dumps(payload))
    tampered["levels"][0]["ttft_ms"]["p99"] = 1.0
    assert any("ttft_ms" in m for m in L.sample_mismatches(tampered))
    tampered = json.loads(json.dumps(payload))
    tampered["levels"][0]["samples"]["output_tokens"][0] = 11
    assert any("output_tok_per_s" in m for m in L.sample_mismatches(tampered))
    del w


def test_latency_record_without_samples_is_held_to_its_repeats():
    """Issue 30: an old record's repeats edited against their median passed. Every committed record
    agrees with its repeats; each tamper below is named."""
    from scripts.kit.paths import RESULTS
    rec = json.loads((RESULTS / "qwen3-4b-bf16" / "20261123T091447Z-latency.json").read_text())
    p = rec["payload"]
    assert "samples" not in p["levels"][0] and L.sample_mismatches(p) == []
    for edit, want in [
            (lambda lv: lv["repeats"][0].update(output_tok_per_s=lv["repeats"][0]["output_tok_per_s"] + 40),
             "concurrency 1: output_tok_per_s.min is 207.93 but its repeats give"),
            (lambda lv: lv["output_tok_per_s"].update(median=250.0), "output_tok_per_s.median is 250.0 but its repeats give 214.1"),
            (lambda lv: lv["repeats"][1].update(deviation_pct=9.0), "repeats[1].deviation_pct is 9.0"),
            (lambda lv: lv.update(goodput_req_per_s=lv["goodput_req_per_s"] * 1.1), "concurrency 1: goodput_req_per_s is"),
            (lambda lv: lv.update(requests=lv["requests"] + 1), "concurrency 1: requests/failed are")]:
        t = json.loads(json.dumps(p))
        edit(t["levels"][0])
        assert any(m.startswith(want) or want in m for m in L.sample_mismatches(t)), want


def test_verdict_needs_the_interval_off_one_and_the_margin():
    assert C.verdict(1.016, 1.004, 1.028, 0.02) == "no difference"  # the A/A run's chance call
    assert C.verdict(1.016, 1.004, 1.028, 0.0) == "b better"
    assert C.verdict(1.30, 1.20, 1.40, 0.02) == "b better"
    assert C.verdict(0.70, 0.60, 0.80, 0.02) == "a better"
    assert C.verdict(1.30, 0.90, 1.70, 0.02) == "no difference"


REAL = ("results/qwen3-4b-bf16/20261125T180011Z-comparison.json",
        "results/qwen3-4b-bf16-tuned/20261125T175735Z-comparison.json")


def test_h100_comparison_records_recompute_exactly():
    from scripts.kit.record import load_record
    for f in REAL:
        assert record_mismatches(load_record(f)) == [], f


def test_variance_study_of_the_h100_session_separates_noise_from_speculation(tmp_path):
    from scripts import variance
    assert variance.main([*REAL, "--results-dir", str(tmp_path)]) == 0
    (rec,) = [r for _, r in records(kind="variance", root=tmp_path)]
    e = {(x["variant"], x["side"], x["concurrency"], x["record"]): x for x in rec["payload"]["entries"]}
    bf16 = e[("qwen3-4b-bf16", "a", 1, REAL[0])]["tpot_p50_ms"]
    dflash = e[("qwen3-4b-bf16-tuned", "b", 1, REAL[1])]["tpot_p50_ms"]
    assert bf16["n"] == 5 and bf16["range_pct"] < 1 < dflash["range_pct"]
    assert rec["payload"]["a_a"][0]["record"] == REAL[0]
    assert rec["provenance"]["device"]["name"].startswith("NVIDIA H100")


SESSION2 = ("results/qwen3.5-4b-bf16-tuned/20261125T203357Z-comparison.json",
            "results/qwen3-4b-bf16-tuned/20261125T204450Z-comparison.json")


def test_variance_splits_tpot_into_tokens_per_step_and_step_time(tmp_path):
    """On the second H100 session: BF16 emits one token a step; MTP's per-pass TPOT moves with its step
    time while its tokens per step (the acceptance draw) stay within a few percent."""
    from scripts import variance
    assert all(record_mismatches(load_record(f)) == [] for f in SESSION2)
    assert variance.main([*SESSION2, "--results-dir", str(tmp_path)]) == 0
    (rec,) = [r for _, r in records(kind="variance", root=tmp_path)]
    e = {(x["variant"], x["side"], x["concurrency"], x["record"]): x for x in rec["payload"]["entries"]}
    bf16 = e[("qwen3.5-4b-bf16", "a", 1, SESSION2[0])]
    mtp = e[("qwen3.5-4b-bf16-tuned", "b", 1, SESSION2[0])]
    assert bf16["tokens_per_step"]["min"] == bf16["tokens_per_step"]["max"] == 1.0
    assert mtp["tokens_per_step"]["range_pct"] < 5 < 20 < mtp["step_ms"]["range_pct"]
    # TPOT = step time / tokens per step, pass by pass, within the per-request vs pooled difference
    for t, k, ms in zip(mtp["tpot_p50_ms_per_pass"], mtp["tokens_per_step_per_pass"], mtp["step_ms_per_pass"]):
        assert abs(t - ms / k) / t < 0.1


def test_a_comparison_flags_a_side_whose_step_time_moved_between_passes():
    """The 20:20 Qwen3.5 record: MTP's step time moved ~32% between passes at both levels, BF16's did
    not; the warning says tokens per step held. A pass that agrees with the others clears it."""
    from scripts.kit import compare as C
    rec = load_record(SESSION2[0])
    w = [x for x in C.warnings(rec["payload"], 2) if "step time moved" in x]
    assert [x.split(":")[0] for x in w] == ["side b c=1", "side b c=8"]
    assert "tokens per step moved 4%" in w[0]
    steady = copy.deepcopy(rec["payload"])
    steady["passes"] = [p for p in steady["passes"] if p["side"] == "a"]
    assert not [x for x in C.warnings({**steady, "conditions": rec["payload"]["conditions"]}, 2) if "step time" in x]


def test_probe_flags_a_level_whose_step_time_moved_between_repeats():
    from scripts.kit import latency as L
    def level(step_ms_by_repeat):
        samples = {k: [] for k in ("repeat", "ok", "ttft_ms", "e2e_ms", "output_tokens", "itl_n")}
        for i, ms in enumerate(step_ms_by_repeat):
            for _ in range(2):
                for k, v in (("repeat", i), ("ok", True), ("ttft_ms", 10.0), ("e2e_ms", 10.0 + 20 * ms),
                             ("output_tokens", 81), ("itl_n", 20)):
                    samples[k].append(v)
        return {"concurrency": 1, "samples": samples, "conditions": []}
    assert L.condition_warnings([level([10.0, 10.5, 11.0])]) == []
    (w,) = L.condition_warnings([level([10.0, 13.0, 11.0])])
    assert w.startswith("concurrency 1: step time moved 27%") and "tokens per step moved 0%" in w


def test_engine_steps_of_a_pass_by_hand():
    from scripts.kit.latency import engine_steps as steps
    rows = [{"output_tokens": 9, "itl_n": 2, "e2e_ms": 30.0, "ttft_ms": 10.0},
            {"output_tokens": 5, "itl_n": 2, "e2e_ms": 26.0, "ttft_ms": 6.0}]
    assert steps(rows) == (3.0, 10.0)
    assert steps([{"output_tokens": 1, "itl_n": 0, "e2e_ms": 5.0, "ttft_ms": 5.0}]) == (None, None)


def test_variance_refuses_records_of_two_machines(tmp_path):
    from scripts import variance
    other = json.loads(open(REAL[1]).read())
    other["provenance"]["device"]["name"] = "NVIDIA H200"
    f = tmp_path / "other-comparison.json"
    f.write_text(json.dumps(other))
    with pytest.raises(KitError, match="one session"):
        variance.main([REAL[0], str(f), "--results-dir", str(tmp_path)])


@pytest.mark.e2e
@pytest.mark.slow  # ~40 s of probing on the shared tiny server: `make test` stays under its 10 minutes
def test_real_tiny_server_as_both_sides_writes_a_record_the_checker_recomputes(tiny_server, tmp_path, monkeypatch):
    """The driver against real vLLM (the shared tiny server as A and B): requests, samples, conditions,
    and a record whose every ratio its samples give back."""
    url = tiny_server.url
    assert compare.main(["--a", "tiny", "--b", "tiny", "--url-a", url, "--url-b", url,
                         "--set", f"PORT={tiny_server.variant['PORT']}", "--results-dir", str(tmp_path / "results"),
                         *SMALL]) == 0
    rec = only(tmp_path)
    p = rec["payload"]
    assert len(p["passes"]) == 5 * 2 * 2 and all(all(x["samples"]["ok"]) for x in p["passes"])
    assert p["sides"]["a"]["started_here"] is False and "--enforce-eager" in p["sides"]["a"]["argv"]
    assert rec["provenance"]["acceptance"] == "none" and rec["provenance"]["weights"] == "real"
    assert record_mismatches(rec) == []
    # vLLM's request gauges, polled during each pass: some poll saw a request running.
    qs = [x["server_queue"] for x in p["passes"]]
    assert all(q and q["polls"] >= 1 for q in qs) and max(q["running_max"] for q in qs) >= 1
    # The server's own threads, found from its port (the API process and the engine below it): every pass has
    # their scheduler counters, and the busiest one (the engine's loop, or the API's) ran during it.
    import os
    if os.path.exists("/proc/self/schedstat"):
        sched = [x["server_sched"] for x in p["passes"]]
        assert all(s and s["threads"] > 2 and s["busiest"]["run_s"] > 0 for s in sched), sched[:2]
    # Issue 33: a user's own `make compare A=tiny B=tiny` on a CPU reached README's table of GPU
    # comparisons. Set beside the committed records, this one goes to the CPU table, labelled as the
    # user's, and neither the GPU table nor the answer changes.
    from scripts.kit.paths import RESULTS, ROOT
    from scripts.kit.summaries import comparison as S
    committed, answer, gpu_table = S._comparisons(), S.answer_block(), S.readme_table({})
    committed_cpu = [r["record"] for r in S.gpu_rows()[1]]  # the kit's own CPU records (results/tiny/)
    mine = RESULTS / "tiny" / "20991231T000000Z-comparison.json"  # where make compare writes it
    monkeypatch.setattr(S, "_comparisons", lambda: committed + [(mine, rec)])
    gpu, cpu, _ = S.gpu_rows()
    assert sorted(r["record"] for r in cpu) == sorted(committed_cpu + [str(mine.relative_to(ROOT))])
    assert all(r["device_kind"] == "cpu" for r in cpu)
    assert S.readme_table({}) == gpu_table and S.answer_block() == answer
    block = S.readme_blocks({})[S.CPU_TAG]
    assert block.startswith("These ran on a CPU (the device column names it)") and "| `tiny` → itself |" in block


def test_conditions_of_a_two_gpu_host_cover_every_gpu():
    """A TP/DP side runs on GPU 1 too: its clock and a slowdown there reach the summary, not only GPU 0's."""
    from scripts.kit import device
    fields = "1980, 2619, 120.5, 40, 0, P0, 0x0000000000000000"
    g0, g1 = device.parse_gpu_state(fields), device.parse_gpu_state("1410, 2619, 690.0, 71, 99, P0, 0x0000000000000004")
    two = dict(g0, gpu_processes=3, per_gpu=[g0, g1])
    one = dict(g0, gpu_processes=1)
    passes = [{"side": "a", "conditions": {"before": {"gpu": one}, "after": {"gpu": one}}},
              {"side": "b", "conditions": {"before": {"gpu": two}, "after": {"gpu": two}}}]
    cs = C.conditions_summary(passes)
    assert cs["a"]["sm_clock_mhz"] == [1980, 1980] and cs["a"]["slowdowns"] == []
    assert cs["b"]["sm_clock_mhz"] == [1410, 1980] and cs["b"]["power_w"] == [120.5, 690.0]
    assert cs["b"]["slowdowns"] == ["sw_power_cap"] and cs["b"]["gpu_processes"] == [3, 3]


def test_shuffled_prefix_order_breaks_the_round_robin_alignment_of_cycle():
    """cycle (request j takes prefix j mod N) lines prefix k up with request parity when 2 divides N, so a
    round-robin router over two replicas sends each prefix to one replica; shuffle uses each prefix as often,
    in an order no replica count lines up with, and is its own workload hash."""
    base = dict(input_lens=(16,), class_weights=(1.0,), requests=64, prefix_tokens=8, shared_prefixes=4)

    def parities(w):
        heads = [tuple(r.prompt[:8]) for r in L.level_requests(w, 16, 0)]
        seen = {}
        for j, h in enumerate(heads):
            seen.setdefault(h, set()).add(j % 2)
        return heads, seen
    heads, seen = parities(L.Workload(**base))
    assert len(seen) == 4 and all(len(p) == 1 for p in seen.values())  # the flaw cycle has
    shuffled = L.Workload(**base, prefix_order="shuffle")
    heads, seen = parities(shuffled)
    assert len(seen) == 4 and all(len(p) == 2 for p in seen.values())
    assert sorted(heads.count(h) for h in seen) == [16, 16, 16, 16]
    assert "prefix_order" not in L.Workload(**base).spec() and shuffled.spec()["prefix_order"] == "shuffle"
    assert shuffled.sha256 != L.Workload(**base).sha256
    # conversations: the same turns, each after its previous one, in another order within each turn
    conv = dict(input_lens=(16,), class_weights=(1.0,), output_min=4, output_max=4, requests=8, turns=2,
                prefix_tokens=8, shared_prefixes=2)
    plain, mixed = L.level_requests(L.Workload(**conv), 4, 0), L.level_requests(L.Workload(**conv, prefix_order="shuffle"), 4, 0)
    assert [r.turn for r in mixed] == [r.turn for r in plain]
    assert sorted((r.conversation, r.turn) for r in mixed) == sorted((r.conversation, r.turn) for r in plain)
    assert [r.conversation for r in mixed] != [r.conversation for r in plain]


def test_level_scoped_prefixes_outlive_the_pass_and_warm_up_while_prompts_stay_fresh():
    """prefix_scope level: the same prefixes in a level's warm-up and every repeat (system prompts a router meets
    again), other prefixes at another level, the requests' own prompts still new every pass; its own hash, and
    --prefix-scope level without shared prefixes is refused."""
    import argparse
    from scripts import probe as P
    from scripts.kit.errors import KitError
    base = dict(input_lens=(16,), class_weights=(1.0,), requests=8, prefix_tokens=12, shared_prefixes=2)
    w = L.Workload(**base, prefix_scope="level")
    heads = lambda reqs: {tuple(r.prompt[:12]) for r in reqs}
    warm, one, two = L.level_requests(w, 4, 0, warmup=True), L.level_requests(w, 4, 0), L.level_requests(w, 4, 1)
    assert len(heads(one)) == 2 and heads(warm) == heads(one) == heads(two)
    assert not heads(L.level_requests(w, 8, 0)) & heads(one)  # another level, other prefixes
    tails = lambda reqs: {tuple(r.prompt[12:]) for r in reqs}
    assert not tails(one) & tails(two) and not tails(warm) & tails(one)  # a request's own prompt is never resent
    assert not heads(L.level_requests(L.Workload(**base), 4, 0)) & heads(L.level_requests(L.Workload(**base), 4, 1))
    assert w.spec()["prefix_scope"] == "level" and "prefix_scope" not in L.Workload(**base).spec()
    assert w.sha256 != L.Workload(**base).sha256
    conv = L.Workload(**dict(base, turns=2), prefix_scope="level")  # conversations open with them too
    assert heads(L.level_requests(conv, 4, 0)) == heads(L.level_requests(conv, 4, 1))
    a = argparse.Namespace(**{f.name: f.default for f in L.workload_fields()})
    a.prefix_scope = "level"
    with pytest.raises(KitError, match="--prefix-scope level without --shared-prefixes"):
        P.workload(a)


def test_shared_prefixes_are_shared_within_a_pass_and_fresh_across_passes():
    w = L.Workload(input_lens=(16, 32), class_weights=(0.5, 0.5), requests=6, prefix_tokens=40, shared_prefixes=3)
    one, two = L.level_requests(w, 2, 0), L.level_requests(w, 2, 1)
    heads = [r.prompt[:40] for r in one]
    assert heads[0] == heads[3] and heads[1] == heads[4] and heads[2] == heads[5] and len({tuple(h) for h in heads}) == 3
    assert all(len(r.prompt) == 40 + {"short": 16, "medium": 32}[r.cls] for r in one)
    assert not {tuple(r.prompt[:40]) for r in one} & {tuple(r.prompt[:40]) for r in two}  # a pass never warms the next
    # Without it: the field is not in the spec, so every earlier record's workload hash is unchanged.
    plain = L.Workload()
    assert "shared_prefixes" not in plain.spec() and "shared_prefixes" in w.spec()
    rec = load_record(next(iter(sorted((compare.RESULTS).glob("qwen3-4b-bf16-dp2/*-comparison.json")))))
    spec = {k: v for k, v in rec["payload"]["workload"].items() if k not in ("sha256", "token_range", "draw")}
    again = L.Workload(**{k: tuple(v) if isinstance(v, list) else v for k, v in spec.items()})
    assert again.sha256 == rec["payload"]["workload"]["sha256"]


def test_prefix_cache_rows_pool_each_sides_rounds_and_the_checker_recomputes_them():
    def p(side, c, q, h):
        return {"side": side, "concurrency": c, "metrics_delta": {"prefix_cache_queries_total": q, "prefix_cache_hits_total": h}}
    passes = [p("a", 8, 1000, 250), p("a", 8, 1000, 350), p("b", 8, 1000, 700), p("b", 8, 1000, 800),
              {"side": "b", "concurrency": 1, "metrics_delta": None}]
    rows = C.prefix_cache_rows(passes)
    assert rows == [{"side": "a", "concurrency": 8, "queries_tokens": 2000, "hits_tokens": 600, "hit_rate": 0.3},
                    {"side": "b", "concurrency": 8, "queries_tokens": 2000, "hits_tokens": 1500, "hit_rate": 0.75}]
    assert C.prefix_cache_rows([p("a", 1, 0, 0)])[0]["hit_rate"] is None


def test_fake_router_side_reads_metrics_from_its_fake_replicas_summed(tmp_path):
    """FAKE servers (the real router and vLLM replicas: tests/test_fleet_e2e.py). A side behind a router: /metrics is read at each --metrics-url-b and summed, and the record says where."""
    with FakeOpenAIStream("tiny", ttft_s=0.005, itl_s=0.002) as a, FakeOpenAIStream("tiny") as r1, FakeOpenAIStream("tiny") as r2:
        assert run_compare(a, a, tmp_path, ["--metrics-url-b", r1.url, "--metrics-url-b", r2.url]) == 0
        rec = only(tmp_path)
    pay = rec["payload"]
    assert pay["sides"]["b"]["metrics_urls"] == [r1.url, r2.url] and "metrics_urls" not in pay["sides"]["a"]
    # B's requests went to `a` (its url), so the replicas it reads saw none: a zero delta, not A's counters.
    b_rows = [r for r in pay["prefix_cache"] if r["side"] == "b"]
    a_rows = [r for r in pay["prefix_cache"] if r["side"] == "a"]
    assert a_rows and all(r["queries_tokens"] > 0 for r in a_rows)
    assert b_rows and all(r["queries_tokens"] == 0 for r in b_rows)
    assert record_mismatches(rec) == []
    bad = copy.deepcopy(rec)
    bad["payload"]["prefix_cache"][0]["hits_tokens"] += 1
    assert any("prefix_cache" in m for m in record_mismatches(bad))


def test_fake_b_that_holds_one_request_at_a_time_is_flagged_as_timing_its_queue(tmp_path):
    """FAKE servers: B holds one completion at a time (capacity=1: a full KV cache), so at c=2 one request
    always waits. The passes record the polled gauges; the record says the level timed the queue, at c=2 only.
    Both sides here are fakes so that A has no gauges and B a known queue in one run; real vLLM holding one
    sequence at c=2 is tests/test_probe_e2e.py's own-server test.
    Six requests a pass, not three: every c=2 pass must show the queue. With three of ~0.1 s it lasted ~0.2 s, two
    or three polls 0.1 s apart, and on a runner loaded by a slow test's fleet they once all came late; with six it
    lasts ~0.5 s."""
    with FakeOpenAIStream("tiny", ttft_s=0.02, itl_s=0.01) as a, \
            FakeOpenAIStream("tiny", ttft_s=0.02, itl_s=0.01, capacity=1) as b:
        assert run_compare(a, b, tmp_path, extra=("--requests", "6")) == 0
    p = only(tmp_path)["payload"]
    qa = [x["server_queue"] for x in p["passes"] if x["side"] == "a"]
    qb = {c: [x["server_queue"] for x in p["passes"] if x["side"] == "b" and x["concurrency"] == c] for c in (1, 2)}
    assert qa == [None] * len(qa)  # no request gauges in A's /metrics: nothing polled, nothing made up
    assert all(q["running_max"] == 1 and q["waiting_max"] == 0 for q in qb[1])
    assert all(q["running_max"] == 1 and q["waiting_max"] == 1 and q["kv_usage_max"] == 1.0 for q in qb[2])
    warned = [w for w in p["validity"]["warnings"] if "times the queue" in w]
    assert len(warned) == 1 and warned[0].startswith("side b c=2: the server ran at most 1 of the 2 requests")
    assert "KV cache was 100% full" in warned[0] and "SERVE_KV_CACHE_MEMORY_BYTES" in warned[0]


def test_fake_fleet_whose_router_keeps_one_replica_busy_is_flagged_as_herding(tmp_path):
    """FAKE servers: B's URL serves every request itself while its second metrics URL, another replica, idles, as
    a router that herds would. The passes keep each replica's most requests running, and at c=2 the record warns
    that one replica ran them all; at c=1 no poll has two running, so nothing is said."""
    with FakeOpenAIStream("tiny", ttft_s=0.02, itl_s=0.01) as a, \
            FakeOpenAIStream("tiny", ttft_s=0.02, itl_s=0.01, capacity=8) as b, \
            FakeOpenAIStream("tiny", capacity=8) as idle:
        assert run_compare(a, b, tmp_path, extra=("--requests", "6", "--metrics-url-b", b.url,
                                                  "--metrics-url-b", idle.url)) == 0
    p = only(tmp_path)["payload"]
    qb = {c: [x["server_queue"] for x in p["passes"] if x["side"] == "b" and x["concurrency"] == c] for c in (1, 2)}
    assert all(q["replica_running_max"] == [1, 0] and q["one_replica_share"] is None for q in qb[1])
    assert all(q["replica_running_max"] == [2, 0] and q["one_replica_share"] == 1.0 for q in qb[2])
    herd = [w for w in p["validity"]["warnings"] if "herded" in w]
    assert len(herd) == 1 and herd[0].startswith("side b c=2: one replica ran every request in flight in up to 100%")
    assert all("replica_running_max" not in (x["server_queue"] or {}) for x in p["passes"] if x["side"] == "a")


def test_herding_summary_and_warning_by_hand():
    polls = [L.add_gauges([{"running": r0, "waiting": 0, "kv_usage": 0.1}, {"running": r1, "waiting": 0, "kv_usage": 0.2}])
             for r0, r1 in ((0, 0), (3, 0), (0, 4), (2, 2), (1, 0))]
    assert polls[1] == {"running": 3, "waiting": 0, "kv_usage": 0.2, "replicas": [3, 0]}
    q = L.queue_summary(polls)
    # busy polls (2+ running): (3,0), (0,4), (2,2); one replica ran them all in two of the three
    assert q["replica_running_max"] == [3, 4] and q["one_replica_share"] == 0.667
    assert L.herd_warning("side a c=4", [q, None]).startswith(
        "side a c=4: one replica ran every request in flight in up to 67% of the polls with two or more running "
        "(1 of 1 passes)")
    assert L.herd_warning("x", [dict(q, one_replica_share=0.4)]) is None  # spread most of the time: no warning
    one = L.queue_summary([L.add_gauges([{"running": 2, "waiting": 0, "kv_usage": 0.1}])])
    assert "replicas" not in L.add_gauges([{"running": 2, "waiting": 0, "kv_usage": 0.1}])
    assert "one_replica_share" not in one and L.herd_warning("x", [one]) is None  # one server: nothing to say


def test_queue_summary_and_warning_by_hand():
    polls = [{"running": 0, "waiting": 0, "kv_usage": 0.1}, {"running": 18, "waiting": 14, "kv_usage": 0.99},
             {"running": 18, "waiting": 3, "kv_usage": 0.97}, {"running": 9, "waiting": 0, "kv_usage": 0.5}]
    q = L.queue_summary(polls)
    assert q == {"polls": 4, "running_max": 18, "waiting_max": 14, "waiting_share": 0.5, "kv_usage_max": 0.99}
    assert L.queue_summary([]) is None
    w = L.queue_warning("side b c=32", 32, [q, None])
    assert w.startswith("side b c=32: the server ran at most 18 of the 32 requests in flight while up to 14 waited "
                        "(1 of 1 passes); its KV cache was 99% full")
    # All 32 ran at some point (a burst that waited a step for the token budget): no warning.
    assert L.queue_warning("side a c=32", 32, [dict(q, running_max=32)]) is None
    # Held back with room in the cache: the sequence limit is named with the cache.
    assert "SERVE_MAX_NUM_SEQS" in L.queue_warning("x", 32, [dict(q, kv_usage_max=0.4)])
    text = ('vllm:num_requests_running{engine="0"} 3.0\nvllm:num_requests_running{engine="1"} 2.0\n'
            'vllm:num_requests_waiting{engine="0"} 1.0\nvllm:kv_cache_usage_perc{engine="0"} 0.25\n'
            'vllm:kv_cache_usage_perc{engine="1"} 0.75\n')
    assert L.parse_gauges(text) == {"running": 5.0, "waiting": 1.0, "kv_usage": 0.75}
    assert L.parse_gauges("vllm:prefix_cache_hits_total 3\n") is None


@pytest.mark.e2e
@pytest.mark.slow  # ~60 s: four report runs over the copied tree
def test_derived_files_are_current_after_eval_latency_and_compare_through_make(tiny_server, kit_copy):
    """Issue #33: eval-quality refreshed measurements.json, the README blocks and docs/results.md; eval-latency
    and compare did not, so `make check-schemas` failed right after them. Through make, on a copy of the
    tree, against the real tiny server (URL=, URL_A=, URL_B=), with PROBE= shrinking both workloads: each
    command's record leaves report --check clean, and each says where it refreshed."""
    import sys
    from scripts.kit.paths import ROOT
    (kit_copy.root / ".venv").symlink_to(ROOT / ".venv")  # make's PY; the copy has no install of its own
    url, port = tiny_server.url, tiny_server.variant["PORT"]
    probe = "--concurrency 1 --requests 2 --input-lens 16 --class-weights 1 --output-min 4 --output-max 8 --prefix-tokens 0"
    check = [sys.executable, "-m", "scripts.report", "--check"]
    for target, args in (("eval-latency", [f"URL={url}", f"PROBE={probe} --repeats 1 --warmup-waves 1"]),
                         ("compare", ["A=tiny", "B=tiny", f"URL_A={url}", f"URL_B={url}",
                                      f"PROBE={probe} --warmup-waves 1"])):
        r = kit_copy(["make", "--no-print-directory", target, f"SET=PORT={port}", *args])
        assert r.returncode == 0, r.stderr[-3000:]
        assert "report: wrote: " in r.stderr and "experiments/tiny/measurements.json" in r.stderr, r.stderr[-2000:]
        fresh = kit_copy(check)
        assert fresh.returncode == 0, f"after make {target}: {fresh.stderr[-2000:]}"
    assert ": no difference" in r.stderr or "B (tiny) better" in r.stderr or "A (tiny) better" in r.stderr


def test_tpot_p10_is_the_pooled_10th_percentile_and_records_made_before_it_still_recompute():
    """Committed record, H200 (session 20261129T1836Z): its rows predate tpot_p10_ms. The checker recomputes the rows
    it has to the same digits; the new row is the 10th percentile of every pass's TPOTs pooled; a tampered row of it
    is caught."""
    from scripts.kit.paths import ROOT
    p = json.loads((ROOT / "results/qwen3.5-4b-fp8-v2/20261129T185041Z-comparison.json").read_text())["payload"]
    assert "tpot_p10_ms" not in {m["metric"] for m in p["metrics"]}
    assert C.mismatches(p) == []
    slo = L.SLO(p["slo"]["ttft_p99_ms"], p["slo"]["tpot_p99_ms"])
    b = p["bootstrap"]
    rows = C.metric_rows(p["passes"], slo, p["rounds"], b["iterations"], b["seed"], b["margin"])
    assert [r for r in rows if r["metric"] != "tpot_p10_ms"] == p["metrics"]
    p10 = next(r for r in rows if r["metric"] == "tpot_p10_ms")
    for side in "ab":
        tpot = sorted(t for q in p["passes"] if q["side"] == side for t in q["samples"]["tpot_ms"])
        assert p10[side] == round(L.percentile(tpot, 10, True), 3)
    assert p10["ci95"][0] <= p10["ratio"] <= p10["ci95"][1]
    q = copy.deepcopy(p)
    q["metrics"].append({**p10, "ratio": p10["ratio"] + 0.1})
    assert any("tpot_p10_ms" in m for m in C.mismatches(q))


def test_cpu_counters_read_this_host_and_shares_come_from_two_readings():
    """device.conditions() carries the host's CPU ticks by state and its CPU pressure; cpu_shares turns a before and
    an after reading into the pass's steal and pressure shares, None where a reading lacks them."""
    from scripts.kit import device
    c = device.cpu_counters()
    assert set(c["cpu_ticks"]) == set(device.CPU_TICK_FIELDS) and c["cpu_ticks"]["idle"] >= 0
    before = {"t": 100.0, "host": {"cpu_ticks": dict.fromkeys(device.CPU_TICK_FIELDS, 0), "cpu_pressure_some_us": 0}}
    after = {"t": 102.0, "host": {"cpu_ticks": dict(dict.fromkeys(device.CPU_TICK_FIELDS, 0), user=80, idle=15, steal=5),
                                  "cpu_pressure_some_us": 500_000}}
    assert device.cpu_shares(before, after) == {"steal_pct": 5.0, "cpu_pressure_pct": 25.0}
    old = {"t": 100.0, "host": {"loadavg_1m": 0.5, "cpus": 2}}  # a record made before the counters
    assert device.cpu_shares(old, after) == {"steal_pct": None, "cpu_pressure_pct": None}


def test_cpu_pressure_rises_while_more_processes_spin_than_there_are_cpus():
    """Real counters: between two conditions() readings, four times as many spinning processes as this process may
    use CPUs make some task wait for a CPU for much of the wall time."""
    import multiprocessing as mp
    import os
    import time
    from scripts.kit import device
    if device.cpu_counters()["cpu_pressure_some_us"] is None:
        pytest.skip("this kernel exposes no /proc/pressure/cpu")
    stop = mp.Event()
    procs = [mp.get_context("fork").Process(target=_spin, args=(stop,), daemon=True)
             for _ in range(4 * len(os.sched_getaffinity(0)))]
    for p in procs:
        p.start()
    try:
        before = device.conditions()
        time.sleep(1.0)  # the window measured, not a wait for anything
        after = device.conditions()
    finally:
        stop.set()
        for p in procs:
            p.join(10)
    assert device.cpu_shares(before, after)["cpu_pressure_pct"] > 30


def _spin(stop):
    while not stop.is_set():
        pass


def test_cpu_shares_reach_the_summary_and_warn_only_past_their_levels():
    from scripts.kit import device
    ticks = lambda **kw: dict(dict.fromkeys(device.CPU_TICK_FIELDS, 0), **kw)
    def cond(t, steal, psi_us):
        return {"t": t, "gpu": None, "host": {"loadavg_1m": 1.0, "cpus": 16, "cpu_ticks": ticks(user=1000 * t, steal=steal),
                                              "cpu_pressure_some_us": psi_us}}
    quiet = {"before": cond(1, 0, 0), "after": cond(2, 0, 10_000)}          # 0% steal, 1% pressure
    busy = {"before": cond(1, 0, 0), "after": cond(2, 30, 400_000)}         # 3% steal of 1030 ticks, 40% pressure
    legacy = {"before": {"t": 1, "gpu": None, "host": {"loadavg_1m": 1.0}}, "after": {"t": 2, "gpu": None, "host": {}}}
    passes = [{"side": "a", "conditions": quiet}, {"side": "a", "conditions": legacy},
              {"side": "b", "conditions": quiet}, {"side": "b", "conditions": busy}]
    cs = C.conditions_summary(passes)
    assert cs["a"]["steal_pct"] == [0.0, 0.0] and cs["a"]["cpu_pressure_pct"] == [1.0, 1.0]
    assert cs["b"]["steal_pct"] == [0.0, 2.91] and cs["b"]["cpu_pressure_pct"] == [1.0, 40.0]
    payload = {"conditions": cs, "passes": []}
    w = C.warnings(payload, 2)
    assert [x.split(":")[0] for x in w] == ["side b", "side b"]
    assert "up to 2.91% of the host's CPU time" in w[0] and "up to 40% of a pass" in w[1]
    assert "steal_pct" not in C.conditions_summary([{"side": "a", "conditions": legacy}])["a"]


def test_host_speed_that_moved_between_a_sides_passes_is_warned_and_old_passes_say_nothing():
    def cond(*loops):  # a pass's before and after readings of python_loop_ms (None: a reading without it)
        return {"conditions": {w: {"host": {} if x is None else {"python_loop_ms": x}} for w, x in zip(("before", "after"), loops)}}
    steady = [{"side": "a", **cond(9.0, 9.4)}, {"side": "a", **cond(9.8, 10.2)}]  # 9.2 and 10.0: 9% apart
    moved = [{"side": "b", **cond(8.9, 9.1)}, {"side": "b", **cond(17.0, None)}]  # 9.0 and 17.0
    w = C.host_speed_warnings({"passes": steady + moved})
    assert w == ["side b: the host's single-thread speed moved between passes (python_loop_ms 9.00-17.00, lower is "
                 "faster): a host-bound step moves with it"]
    old = [{"side": s, **cond(None, None)} for s in "aabb"]  # records made before the reading
    assert C.host_speed_warnings({"passes": old}) == []
