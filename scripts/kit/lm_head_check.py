"""`python -m scripts.kit lm-head-check --variant V`: what LM_HEAD_W8 would do to V's logits, before serving it.

The patch (scripts/patches/lm_head_w8.py) computes decode logits from an 8-bit copy of the 16-bit lm_head, INT8 or
FP8, one scale a row. This loads the model's 16-bit weights with transformers (MODEL's bf16 folder: `make download`),
runs text through it (the kit's held-out text unless --text), and sets the logits of its own lm_head beside those
of each copy the patch can make, at every position: top-1 agreement, KL(16-bit || 8-bit) mean and p99, and where
the top token differs, how probable the 8-bit pick was under the 16-bit logits relative to the 16-bit top.
One `lmhead_check` record (schemas/payloads/lmhead_check.schema.json). Where the variant sets LM_HEAD_VOCAB, the record
also says what its token set costs: top-1 agreement of the trimmed copy, how often the 16-bit top token lies outside
the set, and how much probability the set holds. It measures the logits alone: a served variant with the patch still
goes through `make eval-quality`.

    python -m scripts.kit lm-head-check --variant qwen3.5-4b-fp8-dvg --device cuda
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from .errors import KitError
from .paths import rel

CHUNK = 128  # positions whose full-vocabulary logits are held at once (248320 x 128 float32 = 127 MB)


def compare_logits(hidden, weight, scheme: str) -> dict:
    """hidden [T, K] (the final norm's output), weight [V, K] the 16-bit lm_head: its logits against those of the
    scheme's 8-bit copy."""
    import torch
    from scripts.patches.lm_head_w8 import quantize_rows
    w8, scale = quantize_rows(weight, scheme)
    wq = w8.float() * scale[:, None]
    w16 = weight.float()
    agree, kls, ratios, top_at_flips = 0, [], [], []
    for i in range(0, hidden.shape[0], CHUNK):
        h = hidden[i:i + CHUNK].float()
        l16, l8 = h @ w16.T, h @ wq.T
        lp16, lp8 = torch.log_softmax(l16, -1), torch.log_softmax(l8, -1)
        kls.append((lp16.exp() * (lp16 - lp8)).sum(-1))
        a16, a8 = l16.argmax(-1), l8.argmax(-1)
        agree += int((a16 == a8).sum())
        flip = a16 != a8
        if flip.any():
            p16 = lp16.exp()
            top = p16.gather(1, a16[:, None])[:, 0]
            ratios.append((p16.gather(1, a8[:, None])[:, 0] / top)[flip])
            top_at_flips.append(top[flip])
    kl = torch.cat(kls)
    n = int(hidden.shape[0])
    med = (lambda xs: round(float(torch.cat(xs).median()), 4) if xs else None)
    return {"positions": n, "top1_agree": round(agree / n, 4), "flips": n - agree,
            "kl_mean": round(float(kl.mean()), 5), "kl_p99": round(float(kl.quantile(0.99)), 5),
            "flip_prob_ratio_median": med(ratios), "top_prob_median_at_flips": med(top_at_flips)}


def compare_set(hidden, weight, scheme: str, ids: list[int]) -> dict:
    """What LM_HEAD_VOCAB's set does on top of the scheme's copy: the 16-bit logits against the copy of only the set's
    rows (every other logit -inf, as the patch serves them). No KL: it is infinite wherever the 16-bit head gives an
    outside token any probability, so the probability mass inside the set stands for it."""
    import torch
    from scripts.patches.lm_head_w8 import quantize_rows
    sel = torch.tensor(ids, dtype=torch.long, device=weight.device)
    w8, scale = quantize_rows(weight.index_select(0, sel), scheme)
    wq, w16 = w8.float() * scale[:, None], weight.float()
    inset = torch.zeros(weight.shape[0], dtype=torch.bool, device=weight.device)
    inset[sel] = True
    agree, outside, mass = 0, 0, []
    for i in range(0, hidden.shape[0], CHUNK):
        h = hidden[i:i + CHUNK].float()
        l16 = h @ w16.T
        a16, a_set = l16.argmax(-1), sel[(h @ wq.T).argmax(-1)]
        agree += int((a16 == a_set).sum())
        outside += int((~inset[a16]).sum())
        mass.append(torch.softmax(l16, -1)[:, inset].sum(-1))
    m, n = torch.cat(mass), int(hidden.shape[0])
    return {"scheme": scheme, "size": len(ids), "positions": n, "top1_agree": round(agree / n, 4), "flips": n - agree,
            "top1_outside_set": outside, "set_mass_mean": round(float(m.mean()), 5),
            "set_mass_p01": round(float(m.quantile(0.01)), 5)}


def hidden_states(model, ids, device):
    """The final norm's output at every position, checked against the model's own logits (a model whose last
    hidden state is not what its lm_head reads is refused, not measured)."""
    import torch
    with torch.no_grad():
        out = model(ids.to(device), output_hidden_states=True)
        h = out.hidden_states[-1][0]
        w = model.get_output_embeddings().weight
        probe = (h[:8].float() @ w.float().T)
        ref = out.logits[0, :8].float()
    err = float((probe - ref).norm() / ref.norm())
    if err > 1e-2:
        raise KitError(f"the model's last hidden state is not its lm_head's input (logits differ by {err:.2e}): "
                       "lm-head-check supports models that apply the final norm before the last hidden state")
    return h, err


def main(a) -> int:
    import torch
    import transformers
    from . import weights
    from .quant import kit_texts, texts_sha256
    from .record import make_record, write_record
    from .variant import load
    v = load(a.variant, a.set)
    src = load(v.name, [*a.set, "QUANT=none"])  # the 16-bit folder: the patch copies the lm_head the server holds
    d = src.weights_dir
    if src["WEIGHTS"] != "real" or not weights.is_complete(d):
        raise KitError(f"{v.name}: no 16-bit weights at {rel(d)} (run: make download VARIANT={v.name})")
    if a.text:
        missing = [str(f) for f in a.text if not Path(f).is_file()]
        if missing:
            raise KitError(f"--text: no such file: {', '.join(missing)}")
        texts = [Path(f).read_text(errors="replace") for f in a.text]
        source = "files: " + ", ".join(str(f) for f in a.text)
    else:
        texts = kit_texts("heldout")
        source = f"the kit's held-out text (scripts/kit/quant.py kit_texts('heldout'), sha256 {texts_sha256(texts)[:12]})"
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.time()
    tok = transformers.AutoTokenizer.from_pretrained(d)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=dtype).to(device).eval()
    ids = tok("\n\n".join(texts), return_tensors="pt").input_ids[:, :a.tokens]
    if ids.shape[1] < 2:
        raise KitError(f"the text gave {ids.shape[1]} token(s): pass more --text")
    h, err = hidden_states(model, ids, device)
    # The lm_head as the server holds it: the checkpoint's 16-bit dtype (bfloat16), whatever this run computes in.
    weight = model.get_output_embeddings().weight.detach().to(torch.bfloat16)
    from scripts.patches.lm_head_w8 import SCHEMES
    schemes = {sch: compare_logits(h, weight, sch) for sch in SCHEMES}
    vocab_set = None
    if v["LM_HEAD_VOCAB"]:  # the variant trims the copy: what its set costs, beside the whole copies
        from .draft_vocab import path_for, require
        require(v)  # or the error naming the command that makes the set
        f = path_for(v["MODEL"], v["LM_HEAD_VOCAB"])
        from scripts.patches.lm_head_w8 import set_ids
        vocab_set = {"file": rel(f), **compare_set(h, weight, v["LM_HEAD_W8"], set_ids(str(f), int(weight.shape[0])))}
    payload = {"schemes": schemes, "positions": int(h.shape[0]), "logits_rel_err": round(err, 6), "weights": rel(d),
               "text": source, "tokens": int(ids.shape[1]), "device": device,
               "compute_dtype": str(dtype).replace("torch.", ""), "scale": "one a row: the row's absmax over the "
               "scheme's largest value (int8 127, fp8 e4m3 448)", "vocab": int(weight.shape[0]),
               "hidden": int(weight.shape[1]), "wall_s": round(time.time() - t0, 1)}
    if vocab_set:
        payload["vocab_set"] = vocab_set
    path = write_record(make_record("lmhead_check", v, payload, started=t0), a.results_dir)
    print(f"record: {rel(path)}", file=sys.stderr)
    from scripts.report import refresh_after_write
    refresh_after_write(path)  # one rule for every record: what derives from results/ follows it
    print(f"{v.name}: the 8-bit lm_head copies against the 16-bit one over {h.shape[0]} positions")
    for sch, r in schemes.items():
        print(f"  LM_HEAD_W8={sch}: top-1 agreement {100 * r['top1_agree']:.1f}%, KL mean {r['kl_mean']:.5f} "
              f"(p99 {r['kl_p99']:.5f})" + (f"; at the {r['flips']} flips the 8-bit pick had "
                                            f"{r['flip_prob_ratio_median']:.2f} of the top's probability (median)"
                                            if r["flips"] else ""))
    if vocab_set:
        r = vocab_set
        print(f"  LM_HEAD_W8={r['scheme']} LM_HEAD_VOCAB={v['LM_HEAD_VOCAB']} ({r['size']} ids, {r['file']}): top-1 "
              f"agreement {100 * r['top1_agree']:.1f}%; the 16-bit top token was outside the set at "
              f"{r['top1_outside_set']} of {r['positions']} positions; probability inside the set "
              f"{r['set_mass_mean']:.4f} on average, {r['set_mass_p01']:.4f} at the 1st percentile")
    return 0
