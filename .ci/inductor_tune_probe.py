"""Probe (issue 29, the H100 step): do Inductor's own tuners shorten the small fused kernels of a 5-row verify step?

Times three functions shaped like the Inductor kernels that dominate v4's non-GEMM GPU time on an H100 (session
20261205T1617Z's trace: SiLU-and-mul + per-token FP8 cast 4.7 us x 32 a step, the GDN gated RMSNorm + cast 4.4 us x 24,
residual add + RMSNorm + cast 2.3-2.5 us x 64), compiled by torch.compile at a static 5 rows, as vLLM compiles a
`compile_sizes` entry, under three Inductor settings: default (the settings vLLM compiles a dynamic-shape graph
with), coordinate-descent tuning, and max-autotune with it (vLLM 0.26 turns both on for a single compile size:
compiler_interface.py, set_inductor_config). Each is timed as CUDA-graph replays of 200 calls. The kit's INDUCTOR_PERSISTENT_MAX=16384 rule is
on, as in v4. Not a record: its output is a log the session README cites. At tree 9362460 it also timed a kit kernel
that split SiLU-and-mul's rows over many programs (scripts/patches/silu_mul_fp8_kernel.py there): no faster
(session 20261205T1702Z), so the kernel was removed.
Usage: [PROBE_SETTINGS=default,...] python3 .ci/inductor_tune_probe.py [OUTFILE]
"""
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("KIT_INDUCTOR_PERSISTENT_MAX", "16384")
from scripts.patches import inductor_persistent  # noqa: E402

inductor_persistent.install()
import torch  # noqa: E402
import torch._inductor.config as icfg  # noqa: E402
from graph_time import time_graph  # noqa: E402  (.ci/, this script's folder)

FP8 = torch.float8_e4m3fn
M = 5


def quant(y):
    amax = y.abs().amax(-1, keepdim=True).float().clamp(min=1e-12)
    scale = amax / 448.0
    return (y.float() / scale).clamp(-448.0, 448.0).to(FP8), scale


def silu_mul_quant(x):
    d = x.shape[-1] // 2
    return quant(torch.nn.functional.silu(x[:, :d]) * x[:, d:])


def add_norm_quant(x, res, w):
    r = x + res
    v = r.float().pow(2).mean(-1, keepdim=True)
    y = (r.float() * torch.rsqrt(v + 1e-6)).to(x.dtype) * w
    q, s = quant(y)
    return q, s, r


def gated_norm_quant(x, z, w):
    v = x.float().pow(2).mean(-1, keepdim=True)
    y = (x.float() * torch.rsqrt(v + 1e-6)) * w.float() * torch.nn.functional.silu(z.float())
    return quant(y.to(x.dtype).reshape(x.shape[0], -1))


def cases():
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
    return {"silu_mul_quant (5x18432)": (silu_mul_quant, (r(M, 18432),)),
            "add_rmsnorm_quant (5x2560)": (add_norm_quant, (r(M, 2560), r(M, 2560), r(2560))),
            "gated_rmsnorm_quant (5x32x128)": (gated_norm_quant, (r(M, 32, 128), r(M, 32, 128), r(128)))}


SETTINGS = {"default": {}, "coordinate_descent": {"coordinate_descent_tuning": True},
            "max_autotune+coordinate_descent": {"max_autotune": True, "coordinate_descent_tuning": True}}


def main():
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": M,
           "persistent_max": int(os.environ["KIT_INDUCTOR_PERSISTENT_MAX"]), "results": []}
    only = os.environ.get("PROBE_SETTINGS")  # e.g. "default": the tuned settings lost in session 20261205T1655Z
    settings = {k: v for k, v in SETTINGS.items() if not only or k in only.split(",")}
    for name, (fn, args) in cases().items():
        ref = None
        for setting, cfg in settings.items():
            torch._dynamo.reset()
            t0 = time.time()
            with icfg.patch(cfg):
                cf = torch.compile(fn, dynamic=False, fullgraph=True)
                res = cf(*args)
                torch.cuda.synchronize()
            compile_s = round(time.time() - t0, 1)
            q = res[0].float()
            if ref is None:
                ref = q
            same = bool(torch.equal(q, ref))
            row = {"function": name, "setting": setting, "compile_s": compile_s, "fp8_out_equal_default": same,
                   **time_graph(cf, args)}
            out["results"].append(row)
            print(json.dumps(row), flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
