"""`make gemm VARIANT=...`: each linear layer of VARIANT's architecture timed alone, per kernel and batch
size M, against its byte floor; one `gemm` record (schemas/payloads/gemm.schema.json).

Why: decode at a few sequences is bounded by how fast each GEMM reads its weights. A step's GEMM time is
the sum over the layers a token meets, so a kernel that reads half the bytes but reaches a third of the
bandwidth loses (issue 29: W4A16 on Marlin lost to BF16 at MTP's 5-token verify on an H100). This puts
a number on each kernel and shape.

How: the layers are vLLM's own (ColumnParallelLinear with the kit's compressed-tensors configs, or vLLM's
online FP8 config), filled with random values, prepared by vLLM's process_weights_after_loading, so the
kernel is the one `make serve` gets (the record names it). Each measurement replays a CUDA graph that
calls enough copies of the layer to stream >= 256 MB of weights (no copy stays in L2), timed with CUDA
events, median of the replays. The floor divides the GEMM's fewest bytes (scripts/kit/gemm.py) by a
device-to-device copy measured in the same run. Needs a CUDA GPU and vLLM; `--dry-run` prints the plan.

    python -m scripts.gemm --variant qwen3.5-4b-bf16 --m 1,2,4,5,8
    python -m scripts.gemm --variant qwen3-4b-bf16 --kernels bf16,fp8,w4a16_g32 --dry-run
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from scripts.kit import gemm
from scripts.kit.errors import KitError, run_main
from scripts.kit.paths import ROOT
from scripts.kit.record import make_record, write_record
from scripts.kit.variant import load
from scripts.serve import add_variant_args

STREAM_BYTES = 256 * 2**20  # weights streamed per graph replay: 5x the H100's 50 MB L2
_CONTEXT: list = []  # the vLLM config context, held for the process's life


def _quant_config(kernel: str, prefix: str):
    """vLLM's quantization config for a kernel, built the way a served checkpoint builds it."""
    if gemm.scheme(kernel) == "bf16":
        return None
    if gemm.scheme(kernel) == "fp8_online":
        from vllm.model_executor.layers.quantization.fp8 import Fp8Config
        return Fp8Config(is_checkpoint_fp8_serialized=False, activation_scheme="dynamic")
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig
    from scripts.kit.quant import dummy_quantization_config
    if gemm.scheme(kernel) == "fp8":
        quant = {"QUANT": "fp8_dynamic", "QUANT_SCOPE": "linear", "QUANT_GROUP_SIZE": 32}
    else:
        quant = {"QUANT": "awq_w4a16", "QUANT_SCOPE": "linear", "QUANT_GROUP_SIZE": gemm.KERNELS[kernel]["group"]}
    return CompressedTensorsConfig.from_config(dummy_quantization_config(quant, {}))


def _fill(layer, n: int, k: int, gen) -> None:
    """Random values in every parameter (meta ones materialized), then vLLM's own repacking."""
    import torch
    for name, p in list(layer.named_parameters(recurse=False)):
        shape, dtype = p.shape, p.dtype
        if dtype == torch.int32:
            data = torch.randint(-2**31, 2**31 - 1, shape, dtype=torch.int32, device="cuda", generator=gen)
        elif dtype == torch.int64:  # compressed-tensors' weight_shape
            data = torch.tensor([n, k], dtype=torch.int64, device="cuda")
        elif "scale" in name:
            data = (torch.rand(shape, device="cuda", generator=gen) * 0.01 + 1e-3).to(dtype)
        else:
            data = (torch.randn(shape, device="cuda", generator=gen) * 0.02).to(dtype)
        if p.device.type == "meta":
            setattr(layer, name, torch.nn.Parameter(data, requires_grad=False))
        else:
            p.data.copy_(data)
    layer.quant_method.process_weights_after_loading(layer)


def _backend(layer) -> str:
    if isinstance(layer, _Kit):
        return layer.backend()
    if isinstance(layer, _GemmOnly):
        return f"{type(layer.kernel).__name__} (GEMM alone, the activations cast beforehand)"
    qm = layer.quant_method
    scheme = getattr(layer, "scheme", None) or getattr(qm, "scheme", None)  # compressed-tensors keeps it on the layer
    for obj in (getattr(scheme, "kernel", None), getattr(scheme, "fp8_linear", None),
                getattr(qm, "fp8_linear", None), getattr(qm, "kernel", None), qm):
        if obj is not None:
            return type(obj).__name__
    return type(qm).__name__


class _Kit:
    """One of the kit's Triton kernels (scripts/patches/) on random weights in the layout it reads, as a callable
    layer: W4A16 in compressed-tensors' int4 layout, or FP8 [N, K] with one scale a channel."""

    def __init__(self, kernel: str, n: int, k: int, gen, device: str = "cuda", dtype=None):
        """dtype: the scales' and activations' 16-bit type (bfloat16; float16 under Triton's CPU interpreter)."""
        import torch
        dtype = dtype or torch.bfloat16
        self.group = gemm.KERNELS[kernel]["group"]
        if gemm.scheme(kernel) == "w4a16":
            from scripts.patches import w4a16_kernel as mod
            # Random words are weights in either layout; the interleaved one's reference reads them unpacked back.
            self.weight = torch.randint(-2**31, 2**31 - 1, (n, k // 8), dtype=torch.int32, device=device, generator=gen)
            self.scale = (torch.rand(n, k // self.group, device=device, generator=gen) * 0.01 + 1e-3).to(dtype)
            self.args = (self.weight, self.scale, self.group)
            if kernel.endswith("_il"):
                from scripts.patches import w4a16_il_kernel as il
                self.tuned, self.fn = il._il_tuned, il.w4a16_il_matmul
                self.ref = lambda x, w, s, g: mod.reference(x, il.unpack_il(w), s, g)
            else:
                self.tuned, self.fn, self.ref = mod._w4a16_tuned, mod.w4a16_matmul, mod.reference
        else:
            from scripts.patches import w8a16_kernel as mod
            self.weight = (torch.randn(n, k, device=device, generator=gen) * 2).to(torch.float8_e4m3fn)
            self.scale = torch.rand(n, 1, device=device, generator=gen) * 0.01 + 1e-3
            self.args, self.tuned = (self.weight, self.scale), mod._w8_tuned
            self.fn, self.ref = mod.w8a16_matmul, mod.reference

    def __call__(self, x):
        return self.fn(x, *self.args)

    def rel_err(self, x) -> float:
        """Against the float64 reference, on the GPU's own bf16 path (Triton's CPU interpreter has no bf16)."""
        ref = self.ref(x, *self.args)
        return float((self(x).double() - ref).norm() / ref.norm())

    def backend(self) -> str:
        """The kernel and the block sizes Triton's autotuner chose for this shape (it ran last)."""
        from scripts.patches.w4a16_kernel import best_config
        return "kit Triton " + json.dumps(best_config(self.tuned), sort_keys=True)


class _GemmOnly:
    """A vLLM FP8 layer's GEMM without its activation cast (the fp8_mm row): prepare(x) casts x to FP8 per token with
    the layer's own kernel's quantizer, outside the timed graph; a call then runs only that kernel's scaled GEMM on
    the cast activations (vLLM 0.26's FP8ScaledMMLinearKernel: quant_fp8, then apply_scaled_mm)."""

    def __init__(self, layer):
        self.layer = layer
        self.kernel = getattr(getattr(layer, "scheme", None), "fp8_linear", None)
        if self.kernel is None or not hasattr(self.kernel, "apply_scaled_mm"):
            raise KitError(f"fp8_mm: this vLLM's FP8 layer has no scheme.fp8_linear with apply_scaled_mm "
                           f"({type(getattr(layer, 'scheme', None)).__name__}): its GEMM cannot be timed alone")
        self.w, self.w_s, self.x_s, self.x_s_ub = self.kernel._get_layer_params(layer)

    def prepare(self, x) -> None:
        self.xq, self.xs = self.kernel.quant_fp8(x, self.x_s, self.x_s_ub)
        self.shape = [x.shape[0], self.w.shape[1]]

    def __call__(self, x):
        return self.kernel.apply_scaled_mm(A=self.xq, B=self.w, out_dtype=x.dtype, As=self.xs, Bs=self.w_s,
                                           bias=None, output_shape=self.shape)


def _layers(kernel: str, n: int, k: int, copies: int, gen) -> list:
    import torch
    # ColumnParallelLinear, as the model's own linears are: FP8 Marlin reads output_size_per_partition, which
    # ReplicatedLinear lacks (fp8_marlin failed on it, H100 2026-11-27 18:57)
    from vllm.model_executor.layers.linear import ColumnParallelLinear
    if "_kit" in kernel:
        return [_Kit(kernel, n, k, gen) for _ in range(copies)]
    # A prefix no scheme ignores (the AWQ scheme ignores linear_attn.*): every shape gets the kernel under test.
    prefix = "model.layers.0.gemm_bench"
    # vLLM picks each layer's kernel when the layer is built, from --linear-backend (vLLM's kernel_config) and its
    # environment, both read then: set them as a server given the kernel's SERVE_LINEAR_BACKEND would.
    from vllm.config import get_current_vllm_config
    get_current_vllm_config().kernel_config.linear_backend = gemm.KERNELS[kernel].get("backend", "auto")
    for key, val in gemm.kernel_env(kernel).items():
        if val is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = val
    layers = []
    for _ in range(copies):
        with torch.device("cuda"):
            lin = ColumnParallelLinear(k, n, bias=False, params_dtype=torch.bfloat16, quant_config=_quant_config(kernel, prefix),
                                       prefix=prefix, return_bias=False, disable_tp=True)
        _fill(lin, n, k, gen)
        layers.append(_GemmOnly(lin) if kernel in ("fp8_mm", "fp8_mm_l2") else lin)
    return layers


def _time_layer(kernel: str, shape: dict, ms_list: list[int], reps: int, gen) -> tuple[list[dict], str]:
    import torch
    n, k = shape["n"], shape["k"]
    wbytes = gemm.gemm_bytes(kernel, n, k, 0)
    built, copies = gemm.replays(kernel, wbytes, STREAM_BYTES)
    layers = _layers(kernel, n, k, built, gen) * (copies // built)  # fp8_mm_l2: one layer, called `copies` times
    rows = []
    for m in ms_list:
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda", generator=gen)
        err = layers[0].rel_err(x) if isinstance(layers[0], _Kit) else None
        if err is not None and not err < 1e-2:  # correct first: a wrong kernel's time is no number
            raise KitError(f"{kernel} {shape['layer']} M={m}: relative error {err:.2e} against the float64 reference")
        for lin in layers:  # fp8_mm: the activations cast once, here, not in the timed graph
            getattr(lin, "prepare", lambda _x: None)(x)
        # Warm-up outside the graph: autotuners and lazy inits run here, not in the capture.
        for lin in layers[:2]:
            lin(x)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = [lin(x) for lin in layers]
        for _ in range(3):
            graph.replay()
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); graph.replay(); b.record(); b.synchronize()
            times.append(a.elapsed_time(b) / copies)
        if any(tuple(o.shape) != (m, n) for o in outs):
            raise KitError(f"{kernel} {shape['layer']}: output shape {tuple(outs[0].shape)}, expected {(m, n)}")
        rows.append({"m": m, "ms": round(statistics.median(times), 5),
                     "ms_spread": [round(min(times), 5), round(max(times), 5)], "copies": copies,
                     **({"rel_err": float(f"{err:.3g}")} if err is not None else {})})
        del graph, outs
    backend = _backend(layers[0])
    del layers
    torch.cuda.empty_cache()
    return rows, backend


def copy_gbps() -> float:
    """Device-to-device copy of 1 GiB, bytes read + written, median of 10 (the floor's bandwidth)."""
    import torch
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); dst.copy_(src); b.record(); b.synchronize()
        times.append(a.elapsed_time(b))
    return round(2 * src.numel() / (statistics.median(times) * 1e-3) / 1e9, 1)


def _init_vllm():
    """A one-process vLLM context (config, TP group of 1), as its own kernel tests build one. No model:
    the model config is a stand-in holding the dtype, all that the online FP8 method reads of it."""
    import tempfile
    import types
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed.parallel_state import init_distributed_environment, initialize_model_parallel
    torch.set_default_dtype(torch.bfloat16)  # as the engine sets it to the model's dtype before building layers
    cfg = VllmConfig()
    ctx = set_current_vllm_config(cfg)
    ctx.__enter__()
    init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                 distributed_init_method=f"file://{tempfile.mktemp(prefix='kit-gemm-')}",
                                 backend="nccl" if torch.cuda.is_available() else "gloo")
    initialize_model_parallel(1, 1)  # reads model_config, which must still be None here
    object.__setattr__(cfg, "model_config", types.SimpleNamespace(dtype=torch.bfloat16))
    _CONTEXT.append(ctx)  # a collected context manager resets the config (the FP8 layers then found none)
    return ctx


def plan(v, kernels: list[str], ms: list[int]) -> list[dict]:
    if not v["ARCH_CONFIG"]:
        raise KitError(f"variant {v.name} has no ARCH_CONFIG: `make gemm` reads the layer shapes from it")
    arch = json.loads((ROOT / v["ARCH_CONFIG"]).read_text())
    # GDN_IN_PROJ=fused or fused_lean: the GDN layer's one input GEMM
    shapes = gemm.layer_shapes(arch, fused_in_proj=v["GDN_IN_PROJ"] != "vllm")
    # The lm_head is 16-bit in every kit scheme; under the FP8 kernels it is timed too, as what an FP8 lm_head would
    # cost (issue 29 item 3: at the 5-token verify it reads Qwen3.5's largest matrix, 248320 x 2560).
    return [{"kernel": kn, **s} for kn in kernels for s in shapes] + \
        [{"kernel": kn, **gemm.lm_head_shape(arch)} for kn in ["bf16"] + [k for k in kernels if gemm.scheme(k) == "fp8"]]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="make gemm", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_variant_args(p)
    p.add_argument("--kernels", default=",".join(gemm.KERNELS),
                   help="comma list of " + ", ".join(f"{k} ({s['desc']})" for k, s in gemm.KERNELS.items()))
    p.add_argument("--m", default="1,2,4,5,8", help="batch sizes (tokens a step): 1 one sequence, 1+K an MTP verify")
    p.add_argument("--reps", type=int, default=50, help="timed graph replays per shape and M (median kept)")
    p.add_argument("--dry-run", action="store_true", help="print the shapes, bytes and plan; time nothing")
    a = p.parse_args(argv)
    v = load(a.variant, a.set)
    kernels = [k for k in a.kernels.split(",") if k]
    bad = [k for k in kernels if k not in gemm.KERNELS]
    if bad:
        raise KitError(f"--kernels: unknown {', '.join(bad)} (known: {', '.join(gemm.KERNELS)})")
    try:
        ms = sorted({int(x) for x in a.m.split(",")})
    except ValueError:
        raise KitError(f"--m {a.m!r}: a comma list of positive integers") from None
    if not ms or ms[0] < 1:
        raise KitError(f"--m {a.m!r}: a comma list of positive integers")
    todo = plan(v, kernels, ms)
    if a.dry_run:
        for t in todo:
            print(f"{t['kernel']:18} {t['layer']:26} N={t['n']:6} K={t['k']:5} x{t['count']:2}  "
                  f"{gemm.gemm_bytes(t['kernel'], t['n'], t['k'], 1) / 1e6:8.2f} MB at M=1")
        return 0
    import torch
    if not torch.cuda.is_available():
        raise KitError("make gemm times CUDA kernels: no CUDA GPU here (--dry-run prints the plan)")
    t0 = time.time()
    _init_vllm()
    gen = torch.Generator(device="cuda").manual_seed(0)
    bw = copy_gbps()
    rows, errors, backends = [], {}, {}
    from tqdm import tqdm
    for t in tqdm(todo, desc="gemm", unit="shape", file=sys.stderr):
        if t["kernel"] in errors:
            continue
        try:
            timed, backend = _time_layer(t["kernel"], t, ms, a.reps, gen)
        except Exception as e:  # noqa: BLE001 - one kernel vLLM cannot build here must not hide the others
            errors[t["kernel"]] = f"{type(e).__name__}: {e}"[:500]
            print(f"gemm: {t['kernel']} failed on {t['layer']}: {errors[t['kernel']]}", file=sys.stderr)
            continue
        backends[t["kernel"]] = backend
        for r in timed:
            nbytes = gemm.gemm_bytes(t["kernel"], t["n"], t["k"], r["m"])
            fl = gemm.floor_ms(nbytes, bw)
            rows.append({"kernel": t["kernel"], "backend": backend, "layer": t["layer"], "n": t["n"], "k": t["k"],
                         "count": t["count"], "bytes": nbytes, "floor_ms": round(fl, 5),
                         "pct_of_floor": round(100 * fl / r["ms"], 1), **r})
    payload = {"copy_gbps": bw, "m": ms, "kernels": {k: gemm.KERNELS[k]["desc"] for k in kernels},
               "backends": backends, "errors": errors, "rows": rows,
               "step": gemm.step_totals([r for r in rows if r["layer"] != "lm_head"]),
               "device_name": torch.cuda.get_device_name(), "wall_s": round(time.time() - t0, 1)}
    path = write_record(make_record("gemm", v, payload, started=t0))
    print(f"record: {path}", file=sys.stderr)
    from scripts.report import refresh_after_write
    refresh_after_write(path)  # one rule for every record: what derives from results/ follows it
    print(f"{'kernel':18} {'M':>2} {'GEMM ms/step':>12} {'floor':>7} {'% floor':>7}")
    for s in payload["step"]:
        print(f"{s['kernel']:18} {s['m']:2} {s['ms']:12.3f} {s['floor_ms']:7.3f} {s['pct_of_floor']:7.1f}")
    return 1 if errors and not rows else 0


if __name__ == "__main__":
    run_main(main)
