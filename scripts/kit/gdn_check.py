"""The kit's GDN verify kernel (scripts/patches/gdn_spec_kernel.py, served by GDN_SPEC_PACKED) against vLLM's own path
for the same step: vLLM's q/k/v split (`rearrange_mixed_qkv`) and its `fused_sigmoid_gating_delta_rule_update` kernel
source, run by the same Triton, then copied into the output buffer as 0.26's `_forward_core` does; and both against
a float64 reference. Outputs of every live sequence and every state slot must agree; rows of a sequence whose
starting slot is the null block must be left as they were, and no other slot written.

    python -m scripts.kit.gdn_check cuda    # on a GPU host with vLLM 0.26: real Triton, float32, float16, bfloat16
    python -m scripts.kit.gdn_check cpu     # Triton's interpreter (no bfloat16 there)
    python -m scripts.kit.gdn_check cuda --variant qwen3.5-4b-fp8-v2-gdn   # and one gdn_check record under its results

Exit status 0 when every case agrees. With --variant, the cases, their errors and tolerances are also written as one
`gdn_check` record (schemas/payloads/gdn_check.schema.json), so the check a variant's key rests on is a record like
any measurement, whether it passed or not. tests/test_gdn_spec_kernel.py runs the CPU cases in `make test` and the GPU
cases under the `gpu` marker; this module needs no pytest, which a GPU host may not have.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from scripts.kit.paths import ROOT

CHECK = r'''
import json, os, sys, types
D = os.environ.get("KIT_CHECK_DEVICE", "cpu")  # cuda: real Triton on the GPU (main() below)
if D == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"
import torch, triton, triton.language as tl
import vllm.third_party.flash_linear_attention.ops.fused_sigmoid_gating as F
import vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn as M
from scripts.patches.gdn_spec_kernel import gdn_spec_packed, reference

# vLLM's kernel as its file has it, with Triton itself where vllm.triton_utils (which turns Triton off on a host
# without a Triton CPU backend) would be.
src = open(F.__file__).read()
line = "from vllm.triton_utils import tl, triton"
assert line in src
ns = {"__name__": "vllm_fused_sigmoid_gating"}
exec(compile(src.replace(line, "import triton\nimport triton.language as tl"), F.__file__, "exec"), ns)
vllm_update = ns["fused_sigmoid_gating_delta_rule_update"]
(cls,) = [c for c in vars(M).values() if isinstance(c, type) and "rearrange_mixed_qkv" in c.__dict__]

out = []
for case in json.loads(sys.argv[1]):
    H, HV, K, V, lens, acc, dt, seed, dead, strided = (case[k] for k in
        ("H", "HV", "K", "V", "lens", "acc", "dtype", "seed", "dead", "strided"))
    torch.manual_seed(seed)
    dt = getattr(torch, dt)
    n, L = len(lens), max(lens)
    T = sum(lens)
    width = 2 * H * K + HV * V
    x = torch.randn(T, width + 16 * strided).to(dt).to(D)[:, :width]  # strided: rows further apart than the width
    a = torch.randn(T, HV).to(dt).to(D)
    b = torch.randn(T, HV).to(dt).to(D)
    A_log = (torch.rand(HV) * 2 - 1).to(D)
    dt_bias = (torch.rand(HV) - 0.5).to(D)
    slots = 1 + n * L
    state = (torch.randn(slots, HV, V, K) * 0.1).to(dt)
    idx = torch.arange(1, 1 + n * L, dtype=torch.int32).view(n, L)
    for i in dead:
        idx[i] = 0  # a padded row of a CUDA graph: the null block
    nacc = torch.tensor(acc, dtype=torch.int32)
    cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(n)], dtype=torch.int32)
    state, idx_d, nacc_d, cu_d = state.to(D), idx.to(D), nacc.to(D), cu.to(D)
    # a starting state in each live sequence's slot of its last accepted token
    sentinel = 7.0
    kw = dict(num_k_heads=H, head_k_dim=K, head_v_dim=V)

    s_kit, s_vllm, s_ref = state.clone(), state.clone(), state.clone()
    o_kit = torch.full((T, HV, V), sentinel, dtype=dt, device=D)
    gdn_spec_packed(x, a, b, A_log, dt_bias, s_kit, idx_d, nacc_d, cu_d, o_kit, **kw,
                    tile=tuple(case["tile"]) if case.get("tile") else None, overlap=case.get("overlap", False))
    s_ref = s_ref.cpu()
    o_ref = torch.full((T, HV, V), sentinel, dtype=torch.float64)
    reference(*(t.cpu() for t in (x, a, b, A_log, dt_bias)), s_ref, idx, nacc, cu, o_ref, **kw)

    # vLLM 0.26's spec path: split q, k, v out of the packed conv output, run the kernel, copy into the buffer
    layer = types.SimpleNamespace(key_dim=H * K, value_dim=HV * V, tp_size=1, head_k_dim=K, head_v_dim=V)
    q, k, v = cls.rearrange_mixed_qkv(layer, x.contiguous())
    o_v, _ = vllm_update(A_log=A_log, a=a, b=b, dt_bias=dt_bias, q=q, k=k, v=v, initial_state=s_vllm,
                         inplace_final_state=True, cu_seqlens=cu_d, ssm_state_indices=idx_d,
                         num_accepted_tokens=nacc_d, use_qk_l2norm_in_kernel=True)
    o_vllm = o_v.squeeze(0).cpu()
    o_kit, s_kit, s_vllm, state = o_kit.cpu(), s_kit.cpu(), s_vllm.cpu(), state.cpu()

    live = torch.ones(T, dtype=torch.bool)
    for i in dead:
        live[cu[i]:cu[i + 1]] = False
    def err(p, r):
        p, r = p.double(), r.double()
        return ((p - r).norm() / r.norm().clamp_min(1e-12)).item()
    written = sorted({int(s) for i in range(n) if i not in dead for s in idx[i].tolist() if s > 0})
    untouched = [s for s in range(slots) if s not in written]
    out.append({
        "kit_vs_vllm": err(o_kit[live], o_vllm[live]), "kit_vs_ref": err(o_kit[live], o_ref[live]),
        "vllm_vs_ref": err(o_vllm[live], o_ref[live]),
        "state_kit_vs_vllm": err(s_kit[written], s_vllm[written]), "state_kit_vs_ref": err(s_kit[written], s_ref[written]),
        "dead_rows_kept": bool((o_kit[~live] == sentinel).all()),
        "other_slots_kept": bool(torch.equal(s_kit[untouched], state[untouched])),
        "finite": bool(torch.isfinite(o_kit[live]).all()), "dtype": str(o_kit.dtype)})
print(json.dumps(out))
'''

CASES = [  # H, HV, K, V: q/k heads, v heads, head dims; lens: tokens a sequence; acc: accepted tokens before the step
    ({"H": 2, "HV": 4, "K": 32, "V": 32, "lens": [5, 5, 5], "acc": [1, 3, 5], "dtype": "float32", "seed": 0,
      "dead": [], "strided": 0}, 1e-5),
    # grouped heads 1:2 as Qwen3.5's, a padded sequence (null block), rows further apart than the width
    ({"H": 2, "HV": 4, "K": 64, "V": 64, "lens": [5, 5, 5, 5], "acc": [2, 1, 4, 5], "dtype": "float32", "seed": 1,
      "dead": [2], "strided": 1}, 1e-5),
    # V past one block of 32 values, uneven lengths (a sequence with fewer drafts), float16
    ({"H": 1, "HV": 3, "K": 16, "V": 48, "lens": [3, 5, 1], "acc": [1, 2, 1], "dtype": "float16", "seed": 2,
      "dead": [], "strided": 0}, 3e-3),
    # Qwen3.5-4B's own layer: 16 q/k heads, 32 v heads, 128-wide heads, K=4 (5 tokens), two sequences
    ({"H": 16, "HV": 32, "K": 128, "V": 128, "lens": [5, 5], "acc": [3, 1], "dtype": "float32", "seed": 3,
      "dead": [], "strided": 0}, 1e-5),
    # other tiles (GDN_SPEC_TILE): V in blocks of 16 values, and one block wider than V, on fewer warps
    ({"H": 2, "HV": 4, "K": 64, "V": 48, "lens": [5, 3], "acc": [2, 1], "dtype": "float32", "seed": 5,
      "dead": [], "strided": 1, "tile": [16, 1]}, 1e-5),
    ({"H": 1, "HV": 2, "K": 32, "V": 32, "lens": [5, 5, 5], "acc": [5, 2, 1], "dtype": "float16", "seed": 6,
      "dead": [1], "strided": 0, "tile": [64, 2]}, 3e-3),
    # GDN_SPEC_OVERLAP: the next token's loads early, both state reductions from the state before the update
    ({"H": 2, "HV": 4, "K": 64, "V": 64, "lens": [5, 5, 5, 5], "acc": [2, 1, 4, 5], "dtype": "float32", "seed": 7,
      "dead": [2], "strided": 1, "overlap": True}, 1e-5),
    ({"H": 1, "HV": 3, "K": 16, "V": 48, "lens": [3, 5, 1], "acc": [1, 2, 1], "dtype": "float16", "seed": 8,
      "dead": [], "strided": 0, "overlap": True, "tile": [16, 2]}, 3e-3),
]

# On a GPU also bfloat16, the dtype Qwen3.5's served layers run in (the interpreter has none)
GPU_CASES = CASES + [
    ({"H": 16, "HV": 32, "K": 128, "V": 128, "lens": [5, 5, 5], "acc": [3, 1, 5], "dtype": "bfloat16", "seed": 4,
      "dead": [1], "strided": 1}, 2e-2),
    ({"H": 16, "HV": 32, "K": 128, "V": 128, "lens": [5, 5, 5], "acc": [3, 1, 5], "dtype": "bfloat16", "seed": 10,
      "dead": [1], "strided": 1, "overlap": True}, 2e-2),
    # (Qwen3.5-4B's shape with the overlapped loop in float32: on the GPU only, where it takes no time)
    ({"H": 16, "HV": 32, "K": 128, "V": 128, "lens": [5, 5], "acc": [3, 1], "dtype": "float32", "seed": 9,
      "dead": [], "strided": 0, "overlap": True}, 1e-5),
]


def run_check(cases, device="cpu") -> list[dict]:
    """Each case's errors and checks, computed in a fresh interpreter (Triton's interpreter mode is set at import)."""
    r = subprocess.run([sys.executable, "-c", CHECK, json.dumps([c for c, _ in cases])], cwd=ROOT,
                       capture_output=True, text=True, timeout=900, env={**os.environ, "KIT_CHECK_DEVICE": device})
    if r.returncode != 0:
        raise RuntimeError(f"the GDN kernel check stopped ({device}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def failures(got: dict, tol: float) -> list[str]:
    """What a case's result breaks: both kernels against the reference and each other, every written slot, and
    nothing else written."""
    bad = [k for k in ("kit_vs_ref", "vllm_vs_ref", "kit_vs_vllm", "state_kit_vs_vllm", "state_kit_vs_ref")
           if not got[k] < tol]
    return bad + [k for k in ("finite", "dead_rows_kept", "other_slots_kept") if not got[k]]


def parse_args(argv: list[str]):
    import argparse
    ap = argparse.ArgumentParser(prog="python -m scripts.kit.gdn_check", description=(
        "The kit's GDN verify kernel (GDN_SPEC_PACKED) against vLLM 0.26's split, kernel and copy, and both against a "
        "float64 reference. Exit status 0 when every case agrees."))
    ap.add_argument("device", nargs="?", default="cuda", choices=("cuda", "cpu"),
                    help="cuda: real Triton on the GPU, bfloat16 included (default); cpu: Triton's interpreter")
    ap.add_argument("--variant", help="also write one gdn_check record under results/<variant>/ (the variant whose "
                    "key the check is for, e.g. qwen3.5-4b-fp8-v2-gdn)")
    ap.add_argument("--results-dir", default=None, help="where records go (default: results/)")
    return ap.parse_args(argv)


def main(argv: list[str]) -> int:
    import time
    a = parse_args(argv)
    device = a.device
    v = None
    if a.variant:  # a wrong name fails here, before the minutes of the check
        from scripts.kit.variant import load
        v = load(a.variant)
    cases = GPU_CASES if device == "cuda" else CASES
    t0 = time.time()
    rows, bad = [], 0
    for got, (case, tol) in zip(run_check(cases, device), cases):
        f = failures(got, tol)
        bad += bool(f)
        rows.append({"case": case, "tolerance": tol, "result": got, "failures": f})
        print(("FAIL " + ",".join(f) if f else "ok"), case["dtype"], f"H={case['H']} HV={case['HV']} K={case['K']} "
              f"V={case['V']} lens={case['lens']}", json.dumps({k: got[k] for k in got if k.endswith("ref")
                                                               or k.endswith("vllm")}))
    print(f"gdn spec kernel on {device}: {len(cases) - bad} of {len(cases)} cases agree")
    if v is not None:
        from pathlib import Path
        from scripts.kit.paths import rel
        from scripts.kit.record import make_record, write_record
        payload = {"device": device, "cases": rows, "agree": len(cases) - bad, "total": len(cases),
                   "kernel": "scripts/patches/gdn_spec_kernel.py", "against": "vLLM's rearrange_mixed_qkv and "
                   "fused_sigmoid_gating_delta_rule_update (its source, run by the same Triton), then the copy "
                   "into the output buffer; both against a float64 reference", "wall_s": round(time.time() - t0, 1)}
        path = write_record(make_record("gdn_check", v, payload, started=t0),
                            Path(a.results_dir) if a.results_dir else None)
        print(f"record: {rel(path)}", file=sys.stderr)
        from scripts.report import refresh_after_write
        refresh_after_write(path)  # one rule for every record: what derives from results/ follows it
    return 1 if bad else 0


if __name__ == "__main__":
    from scripts.kit.errors import run_main
    run_main(main, sys.argv[1:])
