"""`make gemm`'s CPU side: the layer shapes against the real architectures as transformers builds them, the
byte floors, the step sums, and the entry point's plan and refusals. The timing itself needs a CUDA GPU."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scripts.kit import gemm
from scripts.kit.paths import ROOT


def _linear_params(arch_name: str) -> int:
    """Weights of every decoder nn.Linear transformers builds for the architecture (on the meta device),
    lm_head, vision tower and MTP left out."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    arch = json.loads((ROOT / "weights" / "configs" / f"{arch_name}.json").read_text())
    config = transformers.AutoConfig.for_model(**arch)
    cls = getattr(transformers, arch["architectures"][0])
    with torch.device("meta"):
        model = cls._from_config(config)
    return sum(m.weight.numel() for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and "lm_head" not in name and "visual" not in name and "mtp" not in name)


@pytest.mark.parametrize("arch_name", ["qwen3-4b", "qwen3.5-4b"])
def test_shapes_cover_every_decoder_linear_of_the_real_architecture(arch_name):
    arch = json.loads((ROOT / "weights" / "configs" / f"{arch_name}.json").read_text())
    shapes = gemm.layer_shapes(arch)
    assert sum(s["n"] * s["k"] * s["count"] for s in shapes) == _linear_params(arch_name)
    t = arch.get("text_config", arch)
    assert gemm.lm_head_shape(arch) == {"layer": "lm_head", "n": t["vocab_size"], "k": t["hidden_size"], "count": 1}
    # Every layer has one MLP; Qwen3.5 splits the rest between full attention and Gated DeltaNet.
    by = {s["layer"]: s["count"] for s in shapes}
    assert by["mlp.down_proj"] == t["num_hidden_layers"]
    assert by["self_attn.o_proj"] + by.get("linear_attn.out_proj", 0) == t["num_hidden_layers"]


def test_fused_gdn_in_proj_is_one_gemm_with_both_projections_outputs():
    arch = json.loads((ROOT / "weights" / "configs" / "qwen3.5-4b.json").read_text())
    two, one = gemm.layer_shapes(arch), gemm.layer_shapes(arch, fused_in_proj=True)
    by2, by1 = ({s["layer"]: s for s in x} for x in (two, one))
    assert "linear_attn.in_proj_ba" in by2 and not {"linear_attn.in_proj_ba", "linear_attn.in_proj_qkvz"} & set(by1)
    f = by1["linear_attn.in_proj_qkvzba"]
    assert f["n"] == by2["linear_attn.in_proj_qkvz"]["n"] + by2["linear_attn.in_proj_ba"]["n"] == 12352
    assert f["count"] == by2["linear_attn.in_proj_ba"]["count"] == 24
    # the same weights a step, one GEMM fewer per GDN layer
    assert sum(s["n"] * s["k"] * s["count"] for s in one) == sum(s["n"] * s["k"] * s["count"] for s in two)
    assert len(one) == len(two) - 1
    assert gemm.layer_shapes(json.loads((ROOT / "weights" / "configs" / "qwen3-4b.json").read_text()),
                             fused_in_proj=True) == gemm.layer_shapes(
        json.loads((ROOT / "weights" / "configs" / "qwen3-4b.json").read_text()))  # no GDN layers: nothing to fuse


def test_bytes_and_floor():
    n, k = 4096, 2048
    assert gemm.gemm_bytes("bf16", n, k, 1) == n * k * 2 + 2 * k + 2 * n
    assert gemm.gemm_bytes("fp8", n, k, 1) == n * k + 4 * n + 2 * k + 2 * n
    # 4-bit weights: half a byte each, one 2-byte scale per 32 weights.
    assert gemm.gemm_bytes("w4a16_g32", n, k, 5) == n * k // 2 + n * (k // 32) * 2 + 2 * 5 * k + 2 * 5 * n
    assert gemm.gemm_bytes("w4a16_g128", n, k, 1) < gemm.gemm_bytes("w4a16_g32", n, k, 1)
    assert gemm.floor_ms(3_000_000_000, 3000.0) == pytest.approx(1.0)


def test_step_totals_weight_each_shape_by_its_layers():
    rows = [{"kernel": "bf16", "m": 1, "layer": "a", "count": 3, "ms": 0.1, "floor_ms": 0.05, "bytes": 100},
            {"kernel": "bf16", "m": 1, "layer": "b", "count": 1, "ms": 0.2, "floor_ms": 0.2, "bytes": 50},
            {"kernel": "bf16", "m": 5, "layer": "a", "count": 3, "ms": 0.2, "floor_ms": 0.05, "bytes": 120}]
    s = {(x["kernel"], x["m"]): x for x in gemm.step_totals(rows)}
    assert s[("bf16", 1)]["ms"] == pytest.approx(0.5) and s[("bf16", 1)]["floor_ms"] == pytest.approx(0.35)
    assert s[("bf16", 1)]["bytes"] == 350 and s[("bf16", 1)]["pct_of_floor"] == pytest.approx(70.0)
    assert s[("bf16", 5)]["ms"] == pytest.approx(0.6)


def _gemm(*args):
    return subprocess.run([sys.executable, "-m", "scripts.gemm", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_dry_run_plans_every_kernel_and_shape():
    r = _gemm("--variant", "qwen3.5-4b-bf16", "--kernels", "bf16,fp8,w4a16_g32", "--dry-run")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 3 * 7 + 2  # 7 Qwen3.5 shapes per kernel; the lm_head 16-bit and under FP8
    assert [x.split()[0] for x in lines if "lm_head" in x] == ["bf16", "fp8"]
    assert any(line.startswith("w4a16_g32") and "linear_attn.in_proj_qkvz" in line and "N= 12288" in line for line in lines)


def test_bad_input_is_refused_with_the_flag_named():
    r = _gemm("--variant", "qwen3.5-4b-bf16", "--kernels", "bf16,marlin", "--dry-run")
    assert r.returncode == 2 and "--kernels: unknown marlin" in r.stderr, r.stderr
    r = _gemm("--variant", "qwen3.5-4b-bf16", "--m", "0,1", "--dry-run")
    assert r.returncode == 2 and "--m" in r.stderr, r.stderr
    r = _gemm("--variant", "tiny", "--dry-run")
    assert r.returncode == 2 and "ARCH_CONFIG" in r.stderr, r.stderr


def test_no_gpu_is_one_clear_error_and_no_record(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here")
    before = sorted((ROOT / "results").glob("qwen3-4b-bf16/*-gemm*.json"))
    r = _gemm("--variant", "qwen3-4b-bf16", "--kernels", "bf16", "--m", "1")
    assert r.returncode == 2 and "no CUDA GPU" in r.stderr, r.stderr
    assert sorted((ROOT / "results").glob("qwen3-4b-bf16/*-gemm*.json")) == before


def test_each_kernel_names_its_weights_and_the_backend_a_server_would_pick():
    """Every kernel reads one of the kit's weight schemes; a kernel that names a vLLM --linear-backend names one
    the installed vLLM accepts (the value SERVE_LINEAR_BACKEND passes), and its environment is set alone: timing
    FP8 Marlin must not leave Machete disabled for the next kernel, nor the reverse."""
    from typing import get_args
    kernel_cfg = pytest.importorskip("vllm.config.kernel")
    known = set(get_args(kernel_cfg.LinearBackend))
    for name, spec in gemm.KERNELS.items():
        assert gemm.scheme(name) in ("bf16", "fp8", "fp8_online", "w4a16"), name
        assert spec.get("backend", "auto") in known, name
        assert (gemm.scheme(name) == "w4a16") == (spec["bits"] == 4), name
    assert gemm.scheme("fp8_marlin") == "fp8" and gemm.scheme("w4a16_g128_humming") == "w4a16"
    assert gemm.kernel_env("fp8_marlin") == {"VLLM_DISABLED_KERNELS": None, "VLLM_TEST_FORCE_FP8_MARLIN": "1"}
    assert gemm.kernel_env("w4a16_g128_marlin") == {"VLLM_DISABLED_KERNELS": "MacheteLinearKernel",
                                                     "VLLM_TEST_FORCE_FP8_MARLIN": None}
    assert set(gemm.kernel_env("bf16").values()) == {None}


def test_dry_run_plans_the_other_backends():
    r = _gemm("--variant", "qwen3-4b-bf16", "--kernels", "fp8_humming,fp8_marlin,w4a16_g32_triton", "--dry-run")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 3 * 4 + 3  # 4 Qwen3 shapes per kernel; the lm_head 16-bit and under each FP8 kernel
    assert [x.split()[0] for x in lines if "lm_head" in x] == ["bf16", "fp8_humming", "fp8_marlin"]
    # FP8 reads one byte a weight and 4 bytes of scale a row: gate_up of Qwen3-4B (N 19456, K 2560) at M=1.
    row = next(x for x in lines if x.startswith("fp8_marlin") and "mlp.gate_up_proj" in x)
    assert f"{(19456 * 2560 + 19456 * 4 + 2 * 2560 + 2 * 19456) / 1e6:8.2f} MB" in row, row


KIT_LAYER = r'''
import os, json
os.environ["TRITON_INTERPRET"] = "1"
import torch
from scripts import gemm as G
gen = torch.Generator().manual_seed(0)
out = {}
for kernel in ("w4a16_g32_kit", "w4a16_g32_kit_il", "fp8_kit"):
    layer = G._Kit(kernel, 48, 256, gen, device="cpu", dtype=torch.float16)
    x = torch.randn(5, 256, generator=gen).half()
    out[kernel] = {"err": layer.rel_err(x), "shape": list(layer(x).shape), "backend": G._backend(layer)}
print(json.dumps(out))
'''


def test_the_kit_kernels_layer_checks_itself_against_its_reference_on_cpu():
    """`make gemm`'s wrapper of the kit's kernels (what it checks before timing, and names in the record), run here
    under Triton's interpreter with float16 (the GPU run uses bfloat16): a wrong harness wastes GPU minutes."""
    r = subprocess.run([sys.executable, "-c", KIT_LAYER], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    for kernel, o in out.items():
        assert o["err"] < 1e-3 and o["shape"] == [5, 48], (kernel, o)
        assert o["backend"] == "kit Triton null", o  # no autotuner on a CPU: the record would name its choice


def test_fp8_mm_times_the_layers_gemm_on_activations_cast_beforehand_stand_in_kernel():
    """The fp8_mm row's layer (scripts/gemm.py _GemmOnly) on a stand-in for vLLM's FP8 kernel (CUTLASS runs only on a
    CUDA GPU): prepare() casts with the kernel's own quantizer once; each call runs only apply_scaled_mm on that cast,
    with the layer's weights and scales, for an output of (M, N). A vLLM whose FP8 layer has no such kernel is one
    clear error naming the row."""
    import types
    torch = pytest.importorskip("torch")
    from scripts import gemm as G
    from scripts.kit.errors import KitError
    calls = {"quant": 0, "mm": []}
    w, w_s = torch.zeros(256, 96), torch.ones(96)  # B is [K, N], as vLLM keeps it after loading

    class StandInKernel:  # the surface of vLLM 0.26's FP8ScaledMMLinearKernel the row uses
        def _get_layer_params(self, layer):
            return layer.weight, layer.weight_scale, None, None

        def quant_fp8(self, x, scale, scale_ub):
            calls["quant"] += 1
            return x * 2, torch.ones(x.shape[0], 1)

        def apply_scaled_mm(self, *, A, B, out_dtype, As, Bs, bias, output_shape):
            calls["mm"].append((A, B is w, Bs is w_s, bias, out_dtype))
            return (A.float() @ B).to(out_dtype).view(*output_shape)

    layer = types.SimpleNamespace(weight=w, weight_scale=w_s, scheme=types.SimpleNamespace(fp8_linear=StandInKernel()))
    g = G._GemmOnly(layer)
    x = torch.randn(5, 256, dtype=torch.bfloat16)
    g.prepare(x)
    out1, out2 = g(x), g(x)
    assert calls["quant"] == 1 and len(calls["mm"]) == 2
    a, b_is_w, bs_is_ws, bias, dtype = calls["mm"][0]
    assert torch.equal(a, x * 2) and b_is_w and bs_is_ws and bias is None and dtype == torch.bfloat16
    assert out1.shape == (5, 96) and torch.equal(out1, out2)
    assert G._backend(g) == "StandInKernel (GEMM alone, the activations cast beforehand)"
    with pytest.raises(KitError, match="fp8_mm: .*no scheme.fp8_linear"):
        G._GemmOnly(types.SimpleNamespace(scheme=types.SimpleNamespace()))
    r = _gemm("--variant", "qwen3.5-4b-bf16", "--kernels", "fp8,fp8_mm", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert sum(x.startswith("fp8_mm ") for x in r.stdout.splitlines()) == 7 + 1  # every shape and the lm_head


def test_replays_stream_past_l2_on_their_own_copies_except_the_l2_warm_kernel():
    """A cold kernel's graph calls one copy a call, enough of them to stream 256 MB (none is still in L2 when it
    runs); fp8_mm_l2 makes the same number of calls on one copy, so a layer that fits stays in L2: the bound a
    prefetch of the next layer's weights into L2 could reach."""
    mb = 2**20
    assert gemm.replays("fp8_mm", 10 * mb, 256 * mb) == (26, 26)  # o_proj's 10.5 MB: 26 copies, 26 calls
    assert gemm.replays("fp8_mm_l2", 10 * mb, 256 * mb) == (1, 26)
    assert gemm.replays("fp8_mm", 600 * mb, 256 * mb) == (2, 2)  # at least two calls, at most 64
    assert gemm.replays("fp8_mm_l2", mb // 4, 256 * mb) == (1, 64)
    assert gemm.scheme("fp8_mm_l2") == "fp8"  # the FP8 checkpoint's layers, timed as fp8_mm times them


def test_dry_run_plans_the_l2_warm_kernel_beside_the_cold_one():
    r = _gemm("--variant", "qwen3.5-4b-bf16", "--kernels", "fp8_mm,fp8_mm_l2", "--m", "1,5", "--dry-run")
    assert r.returncode == 0, r.stderr
    kernels = [x.split()[0] for x in r.stdout.splitlines()]
    assert kernels.count("fp8_mm") == kernels.count("fp8_mm_l2") == 7 + 1  # 7 shapes and the lm_head each
