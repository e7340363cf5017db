"""make report's gemm summary and docs/gemm.png, from the committed H100 records: each kernel's newest record that
timed it without error (the first run of 2026-11-26 15:48 failed both FP8 kernels; the 16:01 rerun timed them and
BF16 again), and a plot drawn from exactly that. The summary is given those two and no later record, so a new
`make gemm` record changes what the report shows, not this test."""
from __future__ import annotations

from scripts.kit.paths import ROOT
from scripts.kit.record import records
from scripts.kit.summaries import gemm as S
from scripts.kit.variant import load


def test_each_kernel_from_its_newest_clean_record_and_a_plot_of_them():
    first, rerun = "results/qwen3.5-4b-bf16/20261126T154801Z-gemm.json", "results/qwen3.5-4b-bf16/20261126T160142Z-gemm.json"
    recs = [(str(p.relative_to(ROOT)), r) for p, r in records("qwen3.5-4b-bf16", "gemm")]
    recs = [(p, r) for p, r in recs if p in (first, rerun)]
    assert len(recs) == 2
    out = S.summarize(load("qwen3.5-4b-bf16"), recs)["kernels"]
    assert out["fp8"]["record"] == rerun and out["bf16"]["record"] == rerun  # the rerun replaced bf16, added fp8
    older = next(r for p, r in recs if p == first)["payload"]
    assert out["w4a16_g32"]["record"] == first and out["w4a16_g32"]["backend"] == older["backends"]["w4a16_g32"]
    fp8 = next(r for p, r in recs if p == rerun)["payload"]
    want = [s for s in fp8["step"] if s["kernel"] == "fp8"]
    assert [(s["m"], s["ms"], s["pct_of_floor"]) for s in out["fp8"]["step"]] == [
        (s["m"], s["ms"], s["pct_of_floor"]) for s in sorted(want, key=lambda s: s["m"])]
    png = S.plot_png({"qwen3.5-4b-bf16": {"results": {"gemm": {"kernels": out}}}})
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert S.plot_png({"tiny": {"results": {}}}) is None
