"""The target's linear layers as decode runs them: shapes, bytes and floors (pure; no torch).

Decode at a few sequences is a string of GEMMs with M = tokens in the step (1 at one sequence, 1+K when
MTP verifies K drafts) against weights read once per step. Each GEMM's floor is its bytes (weights with
their scales, the activations in, the output out) over the device's copy bandwidth; `make gemm`
(scripts/gemm.py) times each kernel against that floor, and the step's GEMM share is the sum over the
layers a token goes through.

    from scripts.kit.gemm import layer_shapes, gemm_bytes
    layer_shapes(json.load(open("weights/configs/qwen3.5-4b.json")))
"""
from __future__ import annotations

# kernel -> how its weights are stored: bits a weight, bytes of scale per group of `group` weights
# (None: one scale per output channel, or per tensor for online FP8), and the activations' width.
KERNELS = {
    "bf16": {"bits": 16, "group": None, "scale_bytes": 0, "desc": "16-bit weights (cuBLAS)"},
    "fp8": {"bits": 8, "group": None, "scale_bytes": 4, "desc": "compressed-tensors FP8 dynamic: "
            "per-channel weight scales, per-token FP8 activations (the fp8_dynamic checkpoint)"},
    "fp8_online": {"bits": 8, "group": None, "scale_bytes": 4, "desc": "vLLM's online FP8 (SERVE_QUANTIZATION=fp8): "
                   "one weight scale a tensor, activations cast per tensor"},
    "w4a16_g32": {"bits": 4, "group": 32, "scale_bytes": 2, "desc": "W4A16 group 32 (vLLM picks Marlin)"},
    "w4a16_g128": {"bits": 4, "group": 128, "scale_bytes": 2, "desc": "W4A16 group 128 (vLLM picks Machete on Hopper)"},
    "w4a16_g128_marlin": {"bits": 4, "group": 128, "scale_bytes": 2,
                          "desc": "W4A16 group 128 with Machete disabled (Marlin)"},
    "w4a16_g32_kit": {"bits": 4, "group": 32, "scale_bytes": 2,
                      "desc": "W4A16 group 32, the kit's Triton kernel (scripts/patches/w4a16_kernel.py)"},
    "w4a16_g32_kit_il": {"bits": 4, "group": 32, "scale_bytes": 2,
                         "desc": "W4A16 group 32, the kit's third Triton kernel: weights repacked so a slice of 32 "
                                 "inputs is a group, split-K (scripts/patches/w4a16_il_kernel.py)"},
    # vLLM's FP8 op is a per-token cast of the activations and then CUTLASS's GEMM; in a compiled step Inductor fuses
    # the cast into the norm before it, so the GEMM alone is what a served step pays for the layer. Session
    # 20261201T2308Z: FP8_GEMM=pick chose Marlin by the fp8 rows (cast included) and gained nothing served.
    "fp8_mm": {"bits": 8, "group": None, "scale_bytes": 4,
               "desc": "the fp8 row's kernel, its GEMM alone: the activations cast to FP8 once, outside the timed "
                       "graph (a compiled step fuses that cast into the norm before the layer)"},
    # The same GEMM with its weights already in L2: one copy of the layer replayed, not 256 MB of copies streamed. The
    # most a prefetch of the next layer's weights into L2 (made while the norms, GDN and attention kernels leave DRAM
    # idle) could give each GEMM; a shape over the L2's size gets little of it. Not a kernel a server can pick.
    "fp8_mm_l2": {"bits": 8, "group": None, "scale_bytes": 4, "l2": "warm",
                  "desc": "fp8_mm with its weights in L2 (one copy replayed): the bound an L2 prefetch could reach"},
    "fp8_kit": {"bits": 8, "group": None, "scale_bytes": 4,
                "desc": "FP8 weights, 16-bit activations, the kit's Triton kernel (scripts/patches/w8a16_kernel.py)"},
    # The same weights on the other kernels vLLM 0.26 can pick on a CUDA host, chosen as a server chooses them with
    # SERVE_LINEAR_BACKEND (vLLM's --linear-backend narrows its kernel list to one family; `env` is what else that
    # family needs). vLLM's own order puts CUTLASS and Marlin first, and both read half their byte floor or less at
    # decode's M on an H100 (the rows above, session 20261126T1550Z); these are the rest of its list that an H100 can
    # run (FlashInfer's FP8 GEMM asks for compute capability 10.0).
    "fp8_humming": {"bits": 8, "group": None, "scale_bytes": 4, "backend": "humming",
                    "desc": "the FP8 checkpoint on humming's JIT kernels (SERVE_LINEAR_BACKEND=humming)"},
    "fp8_marlin": {"bits": 8, "group": None, "scale_bytes": 4, "backend": "marlin",
                   "env": {"VLLM_TEST_FORCE_FP8_MARLIN": "1"},
                   "desc": "the FP8 checkpoint weight-only on FP8 Marlin: 16-bit activations, no per-token cast "
                           "(SERVE_LINEAR_BACKEND=marlin VLLM_TEST_FORCE_FP8_MARLIN=1; vLLM keeps it for GPUs before 8.9)"},
    "fp8_torch": {"bits": 8, "group": None, "scale_bytes": 4, "backend": "torch",
                  "desc": "the FP8 checkpoint on torch._scaled_mm (cuBLASLt; SERVE_LINEAR_BACKEND=torch)"},
    "w4a16_g32_humming": {"bits": 4, "group": 32, "scale_bytes": 2, "backend": "humming",
                          "desc": "W4A16 group 32 on humming's JIT kernels (SERVE_LINEAR_BACKEND=humming)"},
    "w4a16_g32_triton": {"bits": 4, "group": 32, "scale_bytes": 2, "backend": "triton",
                         "desc": "W4A16 group 32 on vLLM's Triton W4A16 kernel (SERVE_LINEAR_BACKEND=triton)"},
    "w4a16_g128_humming": {"bits": 4, "group": 128, "scale_bytes": 2, "backend": "humming",
                           "desc": "W4A16 group 128 on humming's JIT kernels (SERVE_LINEAR_BACKEND=humming)"},
}
# Machete is vLLM's pick for group 128 on Hopper; its Marlin twin disables it for the same layers.
KERNELS["w4a16_g128_marlin"]["env"] = {"VLLM_DISABLED_KERNELS": "MacheteLinearKernel"}


def replays(kernel: str, weight_bytes: int, stream_bytes: int) -> tuple[int, int]:
    """(copies of the layer to build, calls a graph replay makes): enough calls to stream `stream_bytes` of weights
    (2 to 64), each on its own copy so none is still in L2 when it runs, or, for an `l2: warm` kernel, all on one
    copy, which stays in L2 after its first call if it fits."""
    calls = max(2, min(64, -(-stream_bytes // max(weight_bytes, 1))))
    return (1 if KERNELS[kernel].get("l2") == "warm" else calls), calls


def scheme(kernel: str) -> str:
    """The weights a kernel reads, as the kit makes them: bf16, fp8 (the FP8 checkpoint), fp8_online, w4a16."""
    return "fp8_online" if kernel == "fp8_online" else kernel.split("_")[0]


def kernel_env(kernel: str) -> dict:
    """Environment for timing `kernel`: its own variables set, every other kernel's cleared (None: unset)."""
    keys = {k for spec in KERNELS.values() for k in spec.get("env", {})}
    return {k: KERNELS[kernel].get("env", {}).get(k) for k in sorted(keys)}


def layer_shapes(arch: dict, fused_in_proj: bool = False) -> list[dict]:
    """Every distinct Linear a decoded token passes through, as (N out, K in) with how many such layers
    a token meets. Merged projections are one GEMM, as vLLM runs them (gate+up, q+k+v, GDN's q+k+v+z and
    b+a; with fused_in_proj, GDN_IN_PROJ=fused's one GEMM for all six). The lm_head is listed apart (16-bit in
    every kit scheme)."""
    t = arch.get("text_config", arch)
    h, inter, n_layers = t["hidden_size"], t["intermediate_size"], t["num_hidden_layers"]
    hd = t.get("head_dim") or h // t["num_attention_heads"]
    q = t["num_attention_heads"] * hd * (2 if t.get("attn_output_gate") else 1)
    kv = 2 * t["num_key_value_heads"] * hd
    interval = t.get("full_attention_interval")
    n_full = n_layers // interval if interval and "linear_num_value_heads" in t else n_layers
    out = [{"layer": "mlp.gate_up_proj", "n": 2 * inter, "k": h, "count": n_layers},
           {"layer": "mlp.down_proj", "n": h, "k": inter, "count": n_layers},
           {"layer": "self_attn.qkv_proj", "n": q + kv, "k": h, "count": n_full},
           {"layer": "self_attn.o_proj", "n": h, "k": t["num_attention_heads"] * hd, "count": n_full}]
    if n_full < n_layers:  # Qwen3.5's Gated DeltaNet layers
        key = t["linear_num_key_heads"] * t["linear_key_head_dim"]
        val = t["linear_num_value_heads"] * t["linear_value_head_dim"]
        n_lin = n_layers - n_full
        ba = 2 * t["linear_num_value_heads"]
        out += ([{"layer": "linear_attn.in_proj_qkvzba", "n": 2 * key + 2 * val + ba, "k": h, "count": n_lin}]
                if fused_in_proj else
                [{"layer": "linear_attn.in_proj_qkvz", "n": 2 * key + 2 * val, "k": h, "count": n_lin},
                 {"layer": "linear_attn.in_proj_ba", "n": ba, "k": h, "count": n_lin}])
        out += [{"layer": "linear_attn.out_proj", "n": h, "k": val, "count": n_lin}]
    return out


def lm_head_shape(arch: dict) -> dict:
    t = arch.get("text_config", arch)
    return {"layer": "lm_head", "n": t["vocab_size"], "k": t["hidden_size"], "count": 1}


def gemm_bytes(kernel: str, n: int, k: int, m: int) -> int:
    """Fewest bytes one GEMM moves: the weights and their scales once, 16-bit activations in and out."""
    spec = KERNELS[kernel]
    weights = n * k * spec["bits"] // 8
    groups = n * (k // spec["group"]) if spec["group"] else n
    return weights + groups * spec["scale_bytes"] + 2 * m * k + 2 * m * n


def floor_ms(nbytes: int, copy_gbps: float) -> float:
    """Time to move nbytes at the measured device-to-device copy rate (GB/s, read + write counted)."""
    return nbytes / (copy_gbps * 1e9) * 1e3


def step_totals(rows: list[dict]) -> list[dict]:
    """Per kernel and M, the GEMM time and floor of one decode step over the layers (each shape's ms x
    how many layers a token meets); rows are `make gemm`'s measured rows."""
    acc: dict = {}
    for r in rows:
        if r.get("ms") is None:
            continue
        a = acc.setdefault((r["kernel"], r["m"]), {"kernel": r["kernel"], "m": r["m"], "ms": 0.0, "floor_ms": 0.0,
                                                   "bytes": 0})
        a["ms"] += r["ms"] * r["count"]
        a["floor_ms"] += r["floor_ms"] * r["count"]
        a["bytes"] += r["bytes"] * r["count"]
    out = []
    for a in sorted(acc.values(), key=lambda x: (x["kernel"], x["m"])):
        a["pct_of_floor"] = round(100 * a["floor_ms"] / a["ms"], 1) if a["ms"] else None
        a["ms"], a["floor_ms"] = round(a["ms"], 4), round(a["floor_ms"], 4)
        out.append(a)
    return out
