"""Draft-vocabulary trimming (issue 19 item 3): the token set (scripts/kit/draft_vocab.py) from a real
tokenizer, and the drafter patch (scripts/_draft_vocab_patch.py) on CPU tensors. The patch's speed needs
a GPU (a comparison record); its logic runs here: the trimmed argmax is the full one whenever the full
winner is in the set, and the best in-set token otherwise."""
from __future__ import annotations

import json
import sys
import types

import pytest
import torch

from scripts import _draft_vocab_patch as DP
from scripts.kit import draft_vocab as DV
from scripts.kit.errors import KitError
from scripts.kit.variant import load


@pytest.fixture(scope="module")
def tok():
    """The tiny model's real tokenizer (SmolLM2, from its weights folder: make install fetches it)."""
    from transformers import AutoTokenizer
    d = load("tiny").weights_dir
    if not (d / "tokenizer.json").is_file():
        pytest.skip(f"no tiny weights at {d} (make install)")
    return AutoTokenizer.from_pretrained(str(d))


def test_set_is_the_most_frequent_tokens_plus_specials(tok):
    texts = ["the cat sat on the mat. the end."] * 5 + ["rare zebra"]
    doc = DV.build(tok, texts, 6)
    the = tok.encode(" the", add_special_tokens=False)[0]
    assert the in doc["ids"] and set(tok.all_special_ids) <= set(doc["ids"])
    assert doc["ids"] == sorted(set(doc["ids"])) and len(doc["ids"]) <= 6 + len(tok.all_special_ids)
    assert 0 < doc["coverage"] < 1 and doc["filled_by_rank"] == 0  # "rare zebra" is left out
    wide = DV.build(tok, ["a b"], 40)  # fewer distinct tokens than N: the rest by rank, lowest ids first
    assert wide["filled_by_rank"] > 0 and 0 in wide["ids"] and len(wide["ids"]) >= 40
    assert wide["coverage"] == 1.0


@pytest.mark.parametrize("size,msg", [(0, "at least 1"), (10 ** 7, "nothing to trim")])
def test_set_size_is_checked(tok, size, msg):
    with pytest.raises(KitError, match=msg):
        DV.build(tok, ["x"], size)


def test_set_file_is_read_back_or_refused(tmp_path):
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"ids": [1, 5, 9]}))
    assert DV.load_ids(f) == [1, 5, 9]
    for bad in ({"ids": [5, 1]}, {"ids": []}, {"nope": 1}):
        f.write_text(json.dumps(bad))
        with pytest.raises(KitError, match="s.json"):
            DV.load_ids(f)


def test_trimmed_argmax_is_the_full_argmax_when_the_winner_is_in_the_set():
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(1000, 64, generator=g)
    hidden = torch.randn(32, 64, generator=g)
    full = (hidden @ weight.t()).argmax(-1)
    ids = torch.tensor(sorted(set(full.tolist()) | set(range(0, 1000, 7))))
    assert torch.equal(DP.trimmed_argmax(hidden, weight.index_select(0, ids), ids), full)
    small = torch.tensor([3, 10, 400])  # winners outside the set: the best of the three
    got = DP.trimmed_argmax(hidden, weight.index_select(0, small), small)
    assert torch.equal(got, small[(hidden @ weight[small].t()).argmax(-1)])


class FakeProposer:
    """The attributes _greedy_sample uses on vLLM 0.26's proposer: model.lm_head.weight, compute_logits."""
    use_local_argmax_reduction = False
    use_heterogeneous_vocab = False

    def __init__(self, weight):
        self.model = types.SimpleNamespace(lm_head=types.SimpleNamespace(weight=weight),
                                           compute_logits=lambda h: h @ weight.t())

    def _greedy_sample(self, hidden_states):
        return self.model.compute_logits(hidden_states).argmax(dim=-1)


def test_patched_proposer_drafts_from_the_set_only(capfd):
    weight = torch.randn(500, 16, generator=torch.Generator().manual_seed(1))
    hidden = torch.randn(8, 16, generator=torch.Generator().manual_seed(2))
    cls = type("P", (FakeProposer,), {"_greedy_sample": FakeProposer._greedy_sample})
    ids = list(range(0, 500, 5))
    assert DP.patch_class(cls, ids) and not DP.patch_class(cls, ids)  # once
    got = cls(weight)._greedy_sample(hidden)
    assert set(got.tolist()) <= set(ids)
    sub = torch.tensor(ids)
    assert torch.equal(got, sub[(hidden @ weight[sub].t()).argmax(-1)])
    assert "draft vocabulary 100 of 500 lm_head rows" in capfd.readouterr().err
    p = cls(weight)
    p.use_heterogeneous_vocab = True  # vLLM's own path is left alone
    assert torch.equal(p._greedy_sample(hidden), (hidden @ weight.t()).argmax(-1))


@pytest.mark.parametrize("model,why", [(types.SimpleNamespace(lm_head=types.SimpleNamespace()), "AttributeError"),
                                        (None, "largest id is 499")])
def test_a_set_that_cannot_apply_drafts_over_the_full_vocabulary(capfd, model, why):
    """No lm_head weight (a pipeline stage), or a head with fewer rows than the set needs (a tensor-parallel
    shard): one line says so, and the draft is vLLM's own."""
    weight = torch.randn(100, 8, generator=torch.Generator().manual_seed(3))
    hidden = torch.randn(4, 8, generator=torch.Generator().manual_seed(4))
    cls = type("P", (FakeProposer,), {"_greedy_sample": FakeProposer._greedy_sample})
    DP.patch_class(cls, [0, 10, 499])
    p = cls(weight)
    if model is not None:
        p.model = types.SimpleNamespace(lm_head=model.lm_head, compute_logits=lambda h: h @ weight.t())
    assert torch.equal(p._greedy_sample(hidden), (hidden @ weight.t()).argmax(-1))
    assert torch.equal(p._greedy_sample(hidden), (hidden @ weight.t()).argmax(-1))  # decided once
    err = capfd.readouterr().err
    assert err.count("draft vocabulary NOT active") == 1 and why in err


def test_install_patches_the_module_when_it_is_imported(tmp_path, monkeypatch):
    """The import hook, as in vLLM's engine process: the module is patched right after its import."""
    (tmp_path / "fake_proposer_mod.py").write_text(
        "class Proposer:\n"
        "    use_local_argmax_reduction = False\n"
        "    def _greedy_sample(self, hidden_states):\n"
        "        return 'full'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    f = tmp_path / "set.json"
    f.write_text(json.dumps({"ids": [0, 2]}))
    monkeypatch.setenv(DV.ENV, str(f))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    DP.install("fake_proposer_mod")
    import fake_proposer_mod
    try:
        assert getattr(fake_proposer_mod.Proposer._greedy_sample, DP._MARK)
    finally:
        sys.modules.pop("fake_proposer_mod", None)


def test_variant_key_reaches_the_server_env_and_needs_mtp_and_its_set(tmp_path, monkeypatch):
    v = load("qwen3.5-4b-bf16-tuned", ["SPEC_DRAFT_VOCAB=64"])
    env = v.to_env("gpu")
    assert env[DV.ENV].endswith("Qwen--Qwen3.5-4B/draft-vocab-64.json")
    assert DV.ENV not in load("qwen3.5-4b-bf16-tuned").to_env("gpu")
    with pytest.raises(KitError, match="needs SPEC_METHOD=mtp"):
        load("qwen3-4b-bf16-tuned", ["SPEC_DRAFT_VOCAB=64"])
    monkeypatch.setattr(DV, "WEIGHTS", tmp_path)
    with pytest.raises(KitError, match=r"draft vocabulary .* missing.*draft-vocab --variant qwen3.5-4b-bf16-tuned "
                                       r"--set SPEC_DRAFT_VOCAB=64"):
        DV.require(v)
    target = DV.path_for("Qwen/Qwen3.5-4B", 64)
    target.parent.mkdir(parents=True)
    target.write_text(json.dumps({"ids": [1, 2, 3]}))
    assert DV.require(v) == target
