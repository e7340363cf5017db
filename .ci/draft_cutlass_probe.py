"""Probe (issue 29, before SPEC_DRAFT_FP8=cutlass is served): the patch's own path on a GPU, on vLLM's real 16-bit
linear layers shaped as Qwen3.5-4B's MTP layer (fc, qkv, o, gate_up, down).

1. Each layer converted by scripts/patches/draft_fp8.convert(..., "cutlass"): its CUTLASS output at one row against
   the same FP8 numbers multiplied in float32 (the copy's layout and scales are what CUTLASS reads).
2. Time a call, as a served draft pass would see it: an RMSNorm and the linear, compiled by torch.compile (Inductor,
   static shape, CUDA-graph replay of 100 calls, median of 20 replays), for the layer converted with "cutlass" (the
   cast fused into the norm or not: the kernel count says) and with "marlin" (the key's setting today); the 16-bit layer is
   not timed: every compile costs seconds of a short lease). Not a record: its output is a log the session README cites.
Usage: PYTHONPATH=/tmp/site:$PWD python3 .ci/draft_cutlass_probe.py [OUTFILE]
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import torch  # noqa: E402

from graph_time import time_graph  # noqa: E402  (.ci/, this script's folder)
from scripts import gemm as G  # noqa: E402

SHAPES = {"fc": (2560, 5120), "qkv_proj": (10240, 2560), "o_proj": (2560, 4096), "gate_up_proj": (18432, 2560),
          "down_proj": (2560, 9216)}
CALLS, REPLAYS = 100, 20


def layer(n, k, gen):
    from vllm.model_executor.layers.linear import ReplicatedLinear
    m = ReplicatedLinear(k, n, bias=False, params_dtype=torch.bfloat16, return_bias=False, disable_tp=True).cuda()
    m.weight.data.copy_(torch.randn(n, k, generator=gen, device="cuda") * 0.02)
    return m


def timed(fn, x) -> tuple[float, int]:
    """us a call (CUDA-graph replays) and the kernels one call launches (from the profiler)."""
    us = time_graph(fn, (x,), CALLS, REPLAYS)["us_median"]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
        fn(x)
        torch.cuda.synchronize()
    kernels = [e.name for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return us, kernels


def main() -> None:
    torch.set_grad_enabled(False)  # as a server runs: no autograd through the kit's op (it registers none)
    G._init_vllm()
    from scripts.patches import draft_fp8 as P
    from scripts.patches.lm_head_w8 import quantize_rows
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for name, (n, k) in SHAPES.items():
        torch._dynamo.reset()  # each shape's functions compile afresh: no recompile limit across the five
        base = layer(n, k, gen)
        w16 = base.weight.detach().clone()
        mods = {"bf16": base}
        for how in ("cutlass", "marlin"):
            m = layer(n, k, gen)
            m.weight.data.copy_(w16)
            holder = torch.nn.Module()
            holder.lin = m
            done = P.convert(holder, how)
            assert done == ["lin"], (how, done)
            mods[how] = m
        x = torch.randn(1, k, generator=gen, device="cuda", dtype=torch.bfloat16)
        xq, xs = P.quantize_tokens(x)
        wq, ws = quantize_rows(w16, "fp8")
        ref = (xq.float() * xs) @ (wq.float() * ws[:, None]).t()
        y = mods["cutlass"](x).float()
        row = {"layer": name, "n": n, "k": k, "rel_err_vs_fp8_ref": round(((y - ref).norm() / ref.norm()).item(), 5),
               "rel_err_vs_bf16": round(((y - base(x).float()).norm() / base(x).float().norm()).item(), 5)}
        norm = torch.nn.RMSNorm(k, eps=1e-6, device="cuda", dtype=torch.bfloat16)
        for how in ("cutlass", "marlin"):  # bf16 is not timed: each compile costs seconds of a short lease
            m = mods[how]
            fn = torch.compile(lambda t, m=m: m(norm(t)), dynamic=False, fullgraph=True)
            us, kernels = timed(fn, x)
            row[how] = {"us": us, "kernels": len(kernels), "names": [kn[:60] for kn in kernels]}
        rows.append(row)
        print(f"{name:13} {n:6}x{k:5}: err {row['rel_err_vs_fp8_ref']:.5f} (vs bf16 {row['rel_err_vs_bf16']:.4f}); "
              + "; ".join(f"{h} {row[h]['us']:6.2f} us, {row[h]['kernels']} kernels {row[h]['names']}"
                          for h in ("cutlass", "marlin")), flush=True)
        doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "calls": CALLS,
               "replays": REPLAYS, "rows": rows}
        if len(sys.argv) > 1:  # after every layer: a lease that ends early keeps what was done
            with open(sys.argv[1], "w") as f:
                json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
