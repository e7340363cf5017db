"""Labels follow facts (scripts/kit/labels.py, issue 30 item 2): a record's weights/acceptance labels are
derived again from its own bytes (server argv, else config, and the quantize record of its checkpoint),
and a label a correction sets against them fails, naming the record and the correction. Built on copies
of committed records in a scratch results/ tree, and on the committed tree itself."""
import json
import shutil

import pytest

from scripts.kit import labels
from scripts.kit.ledger import record_files
from scripts.kit.paths import ROOT
from scripts.kit.record import load_record

SMOKE = "results/qwen3-4b-bf16/20261123T091302Z-serve_smoke.json"  # argv has --load-format dummy
LATENCY = "results/qwen3-4b-bf16/20261123T091447Z-latency.json"  # a --url-less probe: config WEIGHTS=dummy
AWQ = ["results/qwen3-4b-awq/20261124T035859Z-serve_smoke-2.json", "results/qwen3-4b-awq/20261124T040220Z-latency-2.json",
       "results/qwen3.5-4b-awq/20261124T035700Z-serve_smoke-2.json", "results/qwen3.5-4b-awq/20261124T040220Z-latency-2.json"]


def scratch(tmp_path, rel, changes):
    """rel copied into tmp_path's results/ beside the committed corrections, with one more making
    `changes` ([(pointer, was, now)])."""
    (tmp_path / rel).parent.mkdir(parents=True)
    shutil.copy(ROOT / rel, tmp_path / rel)
    d = tmp_path / "results" / "corrections"
    shutil.copytree(ROOT / "results" / "corrections", d)
    (d / "20261126T150000Z-relabel.json").write_text(json.dumps({
        "kind": "correction", "utc": "2026-11-26T15:00:00Z", "why": "the weights were real, the engineer says. " * 2,
        "changes": [{"record": rel, "pointer": p, "was": w, "now": n} for p, w, n in changes]}))
    return json.loads((ROOT / rel).read_text()), load_record(tmp_path / rel)


@pytest.mark.parametrize("rel,source", [(SMOKE, "its server argv (payload.argv)"), (LATENCY, "its config")])
def test_relabel_dummy_to_real_by_correction_fails(tmp_path, rel, source):
    raw, corrected = scratch(tmp_path, rel, [("/provenance/weights", "dummy", "real")])
    assert corrected["provenance"]["weights"] == "real"  # the correction applies...
    got = labels.mismatches(rel, raw, corrected, {}, root=tmp_path)
    assert got == [f"{rel}: provenance.weights is 'real' but {source} says 'dummy': labels follow facts; the "
                   f"correction that set it contradicts them: results/corrections/20261126T150000Z-relabel.json"]
    assert labels.mismatches(rel, raw, load_record(ROOT / rel), {}) == []  # ...and the record alone passes


def test_synthetic_acceptance_cannot_be_relabelled_real(tmp_path):
    rel = "results/qwen3.5-4b-bf16-tuned-dvg/20261126T091328Z-comparison.json"  # A: none, B: synthetic -> mixed
    raw, corrected = scratch(tmp_path, rel, [("/provenance/acceptance", "mixed", "real")])
    got = labels.mismatches(rel, raw, corrected, {}, root=tmp_path)
    assert len(got) == 1 and got[0].startswith(f"{rel}: provenance.acceptance is 'real' but its sides' server argv says 'mixed'")


def test_checkpoint_quantized_from_random_weights_is_labelled_random():
    """The four AWQ records of 2026-11-24 said "real" for checkpoints quantized from random weights;
    results/corrections/20261126T150400Z-awq-random-values.json makes them "random", as the facts say."""
    raws = {rel: json.loads((ROOT / rel).read_text()) for rel in record_files()}
    index = labels.quantize_index(list(raws.values()))
    for rel in AWQ:
        assert raws[rel]["provenance"]["weights"] == "real"
        # serve_smoke-2 started its server from the checkpoint; latency-2 probed it by --url.
        want = {"random"} if "serve_smoke" in rel else {"real", "random"}
        assert labels.expected(raws[rel], index)[0]["weights"] == want
        assert load_record(ROOT / rel)["provenance"]["weights"] == "random"
    # Without a quantize record the same record is "real": the label comes from the quantize record.
    assert labels.expected(raws[AWQ[0]], {})[0]["weights"] == {"real"}
    # Every committed record's labels agree with its facts.
    assert [m for rel, raw in raws.items() for m in labels.mismatches(rel, raw, load_record(ROOT / rel), index)] == []


def test_new_record_of_a_random_source_checkpoint_says_random():
    from scripts.kit.record import _quantized_weights
    from scripts.kit.variant import load
    assert _quantized_weights(load("qwen3-4b-awq"), "2026-11-26T00:00:00Z") == "random"
    assert _quantized_weights(load("qwen3-4b-awq"), "2026-11-20T00:00:00Z") == "real"  # before any quantize record
