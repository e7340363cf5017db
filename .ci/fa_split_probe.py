"""Probe (issue 29, the H100 step): how long vLLM 0.26's FlashAttention 3 takes for one full-attention layer of
Qwen3.5-4B at decode shapes, by the number of KV splits it is told to use.

Why: in session 20261206T0237Z's trace of qwen3.5-4b-fp8-v4-nocopy-vocab at acceptance 0 (prompts of a few hundred
tokens), the FA3 forward took 13.8 us a call (12 calls a step: 8 target layers, 4 draft passes) and its split
combine 2.6-4.6 us more, about 0.2 ms of the step's 3.45 ms of kernels, to read well under a megabyte of KV a call.
vLLM captures decode with `num_splits` = attention_config.flash_attn_max_num_splits_for_cuda_graph (32), which a
variant can set (SERVE_ATTENTION_CONFIG). This times the forward alone for each split count and KV length, so a
variant is chosen on numbers, not a guess.

How: 16 query heads, 4 KV heads, head_dim 256, bf16, one request, a paged KV cache; 5 query tokens (the verify
step) and 1 (a draft pass); the scheduler metadata made the way vLLM 0.26's builder makes it
(v1/attention/backends/flash_attn.py: get_scheduler_metadata with the actual KV length, causal, the same
num_splits), once, outside the timing. Each case is 100 calls captured in one CUDA graph and replayed 20 times;
the median replay over 100 is the time a call, launch gaps included, as in a served step's graph. Splits 0 is
FA3's own heuristic. Not a record: its output is a log the session README cites.
Usage: python3 .ci/fa_split_probe.py [OUTFILE]
"""
import json
import sys

import torch
from graph_time import time_graph  # .ci/, this script's folder
from vllm.vllm_flash_attn import flash_attn_varlen_func, get_scheduler_metadata

HQ, HKV, D = 16, 4, 256
SPLITS = (0, 1, 2, 4, 8, 16, 32)
LENS = (256, 512, 1024, 2048, 4096, 16000)
CALLS, REPLAYS = 100, 20


def case(q_len: int, kv_len: int, splits: int, page: int) -> float:
    dev, bf16, i32 = "cuda", torch.bfloat16, torch.int32
    blocks = -(-kv_len // page)
    kc = torch.randn(blocks, page, HKV, D, dtype=bf16, device=dev)
    vc = torch.randn_like(kc)
    table = torch.arange(blocks, dtype=i32, device=dev)[None]
    q = torch.randn(q_len, HQ, D, dtype=bf16, device=dev)
    out = torch.empty_like(q)
    cu_q = torch.tensor([0, q_len], dtype=i32, device=dev)
    used = torch.tensor([kv_len], dtype=i32, device=dev)
    meta = get_scheduler_metadata(batch_size=1, max_seqlen_q=q_len, max_seqlen_k=kv_len, num_heads_q=HQ,
                                  num_heads_kv=HKV, headdim=D, cache_seqlens=used, qkv_dtype=bf16, cu_seqlens_q=cu_q,
                                  page_size=page, causal=True, num_splits=splits)

    def call():
        flash_attn_varlen_func(q, kc, vc, max_seqlen_q=q_len, cu_seqlens_q=cu_q, max_seqlen_k=kv_len, seqused_k=used,
                               softmax_scale=D ** -0.5, causal=True, block_table=table, out=out,
                               scheduler_metadata=meta, num_splits=splits, fa_version=3)
    return time_graph(call, (), CALLS, REPLAYS)["us_median"]


def main() -> None:
    rows = []
    print(f"FA3, {HQ} q heads, {HKV} kv heads, head_dim {D}, one request; us a call (median of {REPLAYS} replays "
          f"of {CALLS})", flush=True)
    for page in (16, 64):
        for q_len in (5, 1):
            print(f"page {page}, {q_len} query tokens: splits {SPLITS}", flush=True)
            for kv_len in LENS:
                line = []
                for sp in SPLITS:
                    try:
                        us = round(case(q_len, kv_len, sp, page), 2)
                    except Exception as e:  # a split count or page FA3 refuses: say so, go on
                        us = None
                        print(f"  page {page} q {q_len} kv {kv_len} splits {sp}: {type(e).__name__}: {e}"[:300])
                    rows.append({"page": page, "q_len": q_len, "kv_len": kv_len, "splits": sp, "us": us})
                    line.append("-" if us is None else f"{us:7.2f}")
                print(f"  kv {kv_len:6}: " + " ".join(line), flush=True)
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "heads_q": HQ, "heads_kv": HKV,
           "head_dim": D, "calls": CALLS, "replays": REPLAYS, "rows": rows}
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
