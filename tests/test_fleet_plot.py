"""docs/scale-out.png's data (scripts/kit/summaries/fleet_plot.py), from the committed GPU fleet records."""
from __future__ import annotations

import copy
import json

from scripts.kit.paths import ROOT
from scripts.kit.summaries import comparison, fleet_plot

LONG = "results/qwen3-4b-bf16/20261127T114850Z-comparison.json"  # cache_aware -> round_robin, 16 x 6144 tokens
ONE4 = "results/qwen3-4b-bf16/20261127T080642Z-comparison.json"  # 1 -> 4 replicas (A corrected from 2 to 1)
LEVER = "results/qwen3.5-4b-bf16-tuned-dvg/20261126T092233Z-comparison.json"  # SPEC_DRAFT_VOCAB, no fleet key


def rec(path: str) -> tuple:
    return ROOT / path, json.loads((ROOT / path).read_text())


def test_each_fleet_record_is_one_line_of_its_panel_with_the_records_own_ratios():
    data = fleet_plot.series([rec(LONG), rec(ONE4), rec(LEVER)])
    (policy,), (replicas,) = data["FLEET_POLICY"], data["FLEET_REPLICAS"]
    assert policy["points"] == [(16, 0.3641, 0.3465, 0.3777), (32, 0.138, 0.1093, 0.1707), (64, 0.3784, 0.3469, 0.4044)]
    assert "cache_aware → round_robin, 16 shared prompts of 6144 tokens (NVIDIA H200 x4, 2026-11-27)" in policy["label"]
    assert [p[0] for p in replicas["points"]] == [8, 64, 256] and "catalog mix" in replicas["label"]
    assert replicas["points"][1][1] == 4.4791  # goodput at c=64, the measure


def test_the_plot_reads_records_as_corrected_and_leaves_out_cpu_and_invalid_ones():
    corrected = [(f, r) for f, r in comparison._comparisons() if str(f).endswith(ONE4)]
    assert "1 → 4" in fleet_plot.series(corrected)["FLEET_REPLICAS"][0]["label"]  # the raw record says 2
    assert "2 → 4" in fleet_plot.series([rec(ONE4)])["FLEET_REPLICAS"][0]["label"]
    f, r = rec(LONG)
    cpu, bad = copy.deepcopy(r), copy.deepcopy(r)
    cpu["provenance"]["device"]["kind"] = "cpu"
    bad["payload"]["validity"]["valid"] = False
    assert fleet_plot.series([(f, cpu), (f, bad)]) == {"FLEET_POLICY": [], "FLEET_REPLICAS": []}
    assert fleet_plot.plot_png([(f, cpu)]) is None  # nothing to draw: no file


def test_the_png_depends_on_the_records_only():
    recs = [rec(LONG), rec(ONE4)]
    a, b = fleet_plot.plot_png(recs), fleet_plot.plot_png(recs)
    assert a[:8] == b"\x89PNG\r\n\x1a\n" and a == b
    assert fleet_plot.plot_png([rec(LONG)]) != a
    (path, png), = comparison.artifacts({}).items()  # make report's hook: one file, docs/scale-out.png
    assert path == ROOT / "docs" / "scale-out.png" and png[:8] == b"\x89PNG\r\n\x1a\n"
