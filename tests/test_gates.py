"""Gate logic without a server: floors, cut-off rate, bootstrap intervals, recovery, verdicts,
baseline matching, and the eval/ data files (gates, samples, IFBench subset, kit task data)."""
from __future__ import annotations

import json
import math

import pytest
import yaml

from scripts import evaluate
from scripts.kit import gates as G
from scripts.kit.errors import KitError
from scripts.kit.paths import EVAL

GATE = {"floor": 0.5, "max_cutoff_rate": 0.02}


def test_floor_pass_and_fail():
    assert G.judge(GATE, [1, 1, 0, 1], ["stop"] * 4, seed=1, iters=200)["verdict"] == "pass"
    r = G.judge(GATE, [1, 0, 0, 0], ["stop"] * 4, seed=1, iters=200)
    assert r["verdict"] == "fail" and r["score"] == 0.25 and r["reasons"] == ["score 0.2500 < floor 0.5"]


def test_cutoff_fails_a_gate_whatever_the_score():
    finish = ["stop"] * 97 + ["length"] * 3
    r = G.judge(GATE, [1.0] * 100, finish, seed=1, iters=200)
    assert r["cutoff_rate"] == 0.03 and r["cut_off"] == 3 and r["verdict"] == "fail"
    assert "cut off by the token cap: 3.0%" in r["reasons"][0]
    assert G.judge(GATE, [1.0] * 100, ["stop"] * 98 + ["length"] * 2, seed=1, iters=200)["verdict"] == "pass"


def test_no_floor_is_report_but_cutoff_still_fails():
    assert G.judge({**GATE, "floor": None}, [0, 0], ["stop"] * 2, 1, 100)["verdict"] == "report"
    assert G.judge({**GATE, "floor": None}, [0, 0], ["length"] * 2, 1, 100)["verdict"] == "fail"


def test_unknown_cutoff_and_empty_gate_fail():
    r = G.judge(GATE, [], [], 1, 100)
    assert r["verdict"] == "fail" and math.isnan(r["score"]) and len(r["reasons"]) == 2


def test_bootstrap_is_seeded_and_brackets_the_mean():
    scores = [1.0] * 30 + [0.0] * 70
    a, b = G.bootstrap_ci(scores, 7, 2000), G.bootstrap_ci(scores, 7, 2000)
    assert a == b and a[0] < 0.3 < a[1]
    # binomial sd at p=0.3, n=100 is 0.046: the 95% interval is about +-0.09
    assert 0.06 < a[1] - 0.3 < 0.12 and 0.06 < 0.3 - a[0] < 0.12
    assert G.bootstrap_ci([1.0] * 10, 7, 500) == [1.0, 1.0]


def test_recovery_and_min_recovery():
    assert G.recovery(0.6, 0.8) == pytest.approx(75.0)
    assert G.recovery(0.6, None) is None and G.recovery(0.6, 0.0) is None
    gate = {**GATE, "floor": None, "min_recovery_pct": 99.0}
    r = G.judge(gate, [1, 1, 1, 0], ["stop"] * 4, 1, 100, baseline_score=0.8)
    assert r["recovery_pct"] == pytest.approx(93.75) and r["verdict"] == "fail"
    assert G.judge(gate, [1, 1, 1, 1], ["stop"] * 4, 1, 100, baseline_score=0.8)["verdict"] == "pass"
    assert "no comparable baseline" in G.judge(gate, [1], ["stop"], 1, 100)["reasons"][0]


def test_overall_ignores_report_only():
    assert G.overall({"a": {"verdict": "pass"}, "b": {"verdict": "report"}})
    assert not G.overall({"a": {"verdict": "pass"}, "b": {"verdict": "fail"}})


def test_comparable_baseline_needs_same_sample_and_settings():
    how = {"tasks": ["t"], "api": "chat", "metric": "m,none", "thinking": False, "max_gen_toks": 64,
           "task_versions": {"t": "1.0"}}
    payload = {"mode": "sample", "sample_sha256": "s", "gates": {"g": {**how, "n": 5, "score": 0.5}}}
    assert G.comparable(payload, "sample", "s", "g", how)
    assert not G.comparable(payload, "full", "s", "g", how)
    assert not G.comparable(payload, "sample", "other", "g", how)
    assert not G.comparable(payload, "sample", "s", "missing", how)
    for key, val in [("max_gen_toks", 128), ("thinking", True), ("task_versions", {"t": "2.0"})]:
        assert not G.comparable(payload, "sample", "s", "g", {**how, key: val})
    assert not G.comparable({**payload, "mode": "limit"}, "limit", "s", "g", how)


def test_draw_indices_deterministic_stratified():
    a = G.draw_indices(717, 0.1, 1234, "mmlu_pro_biology")
    assert a == G.draw_indices(717, 0.1, 1234, "mmlu_pro_biology")
    assert len(a) == 72 and a == sorted(set(a)) and 0 <= a[0] and a[-1] < 717
    assert a != G.draw_indices(717, 0.1, 1234, "mmlu_pro_business")
    assert G.draw_indices(3, 0.1, 1, "t") and len(G.draw_indices(3, 1.0, 1, "t")) == 3


@pytest.mark.parametrize("path", sorted((EVAL / "samples").glob("*.yaml")), ids=lambda p: p.stem)
def test_committed_samples_match_the_generator(path):
    _, doc, _ = evaluate.load_sample(str(path))  # raises if any index list drifted
    assert doc["tasks"]


def test_default_sample_covers_the_real_datasets():
    doc = yaml.safe_load((EVAL / "samples" / "default.yaml").read_text())["tasks"]
    assert sum(t["n"] for k, t in doc.items() if k.startswith("mmlu_pro_")) == 12032
    assert len([k for k in doc if k.startswith("mmlu_pro_")]) == 14
    assert doc["ifeval"]["n"] == 541 and doc["gpqa_diamond_cot_zeroshot"]["n"] == 198


def test_tampered_sample_is_refused(tmp_path):
    doc = yaml.safe_load((EVAL / "samples" / "ci.yaml").read_text())
    doc["tasks"]["kit_ifbench_ci"]["indices"][0] = 1
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(KitError, match="differ from the generator"):
        evaluate.load_sample(str(p))


@pytest.mark.parametrize("path", sorted((EVAL / "gates").glob("*.yaml")), ids=lambda p: p.stem)
def test_gates_files_valid_and_samples_exist(path):
    _, doc, _ = evaluate.load_gates(str(path))
    sample = yaml.safe_load((EVAL / "samples" / f"{doc['sample']}.yaml").read_text())["tasks"]
    if path.stem == "ci":  # kit tasks are leaf tasks: each must have indices
        assert {t for g in doc["gates"].values() for t in g["tasks"]} == set(sample)


def test_gates_file_typos_are_errors():
    doc = {"sample": "ci", "seed": 1, "bootstrap_iters": 10, "max_cutoff_rate": 0.02,
           "gates": {"g": {"tasks": ["t"], "api": "completions", "metric": "acc", "max_gen_toks": 8,
                           "flor": 0.5, "thinking": True}}}
    errs = "\n".join(G.check_gates(doc, "x.yaml"))
    assert "unknown key 'flor'" in errs and "thinking needs api: chat" in errs and "name,filter" in errs


def test_ifbench_subset_is_real_ifbench_data():
    import importlib.util
    from pathlib import Path
    src = Path(importlib.util.find_spec("ifbench").origin).parent / "data" / "IFBench_test.jsonl"
    real = set(src.read_text().splitlines())
    ours = (EVAL / "data" / "ifbench_ci.jsonl").read_text().splitlines()
    assert len(ours) == 20 and all(line in real for line in ours)


def test_ifbench_checkers_score_real_responses():
    """IFBench's own checkers, offline: a compliant and a non-compliant answer to one CI prompt."""
    doc = next(json.loads(l) for l in (EVAL / "data" / "ifbench_ci.jsonl").read_text().splitlines()
               if json.loads(l)["instruction_id_list"] == ["format:quotes"])
    nested = 'He said "she said \'they said "hi" twice\' once" and left.'  # 3 alternating levels
    assert evaluate.ifbench_process_results(doc, ["no quotes at all"]) == {
        "prompt_level_strict_acc": False, "prompt_level_loose_acc": False}
    assert evaluate.ifbench_process_results(doc, [nested]) == {
        "prompt_level_strict_acc": True, "prompt_level_loose_acc": True}


def test_ifbench_checkers_run_offline_from_the_installed_punkt_tab(monkeypatch):
    """Issue #20: words:keywords_specific_position raised LookupError (nltk's punkt_tab missing) where
    the network is not reachable. With the network cut, every CI prompt's checkers run from the
    punkt_tab `make install` put in .venv/nltk_data, and nothing tries to connect anywhere."""
    import socket
    tried = []

    def no_network(self, addr, *a):
        tried.append(addr)
        raise OSError("network disabled by the test")
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket.socket, "connect_ex", no_network)
    monkeypatch.delenv("NLTK_DATA", raising=False)
    evaluate.offline_nltk()  # what `make eval-quality` does first (IFBench's loader does it too)
    docs = [json.loads(l) for l in (EVAL / "data" / "ifbench_ci.jsonl").read_text().splitlines()]
    for doc in docs:  # scores of an unhelpful answer: what matters is that every checker runs
        assert set(evaluate.ifbench_process_results(doc, ["One. Two three."])) == {
            "prompt_level_strict_acc", "prompt_level_loose_acc"}
    doc = next(d for d in docs if d["instruction_id_list"] == ["words:keywords_specific_position"])
    kw = doc["kwargs"][0]  # keyword giggle as word 33 of sentence 22: tokenized by punkt_tab
    filler = " ".join(f"w{i}" for i in range(1, kw["m"]))
    answer = "Mr. Smith waited. " * (kw["n"] - 1) + f"{filler} {kw['keyword']} and more words."
    assert evaluate.ifbench_process_results(doc, [answer])["prompt_level_strict_acc"] is True
    wrong = answer.replace(kw["keyword"], "laugh")
    assert evaluate.ifbench_process_results(doc, [wrong])["prompt_level_strict_acc"] is False
    import os
    assert str(G.NLTK_DATA) in os.environ["NLTK_DATA"].split(os.pathsep)
    assert tried == []


def test_mmlu_pro_mini_data_shape():
    for f in sorted((EVAL / "data" / "mmlu_pro_mini").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            d = json.loads(line)
            assert len(d["options"]) == 10 and "ABCDEFGHIJ"[d["answer_index"]] == d["answer"]
            if f.name.endswith(".validation.jsonl"):
                assert f"The answer is ({d['answer']})." in d["cot_content"]
