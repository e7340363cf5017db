"""FP8_GEMM=kit: the kit's 8-bit-weight kernel (w8a16_kernel.py) serves FP8 linears at decode's batch sizes (issue 29).

$KIT_FP8_GEMM=1 in the server's processes (Variant.to_env sets it): install() puts `KitFP8Kernel` first in vLLM's
list of FP8 linear kernels, for FP8 weights with one scale a channel or a tensor (the kit's FP8 checkpoint, vLLM's
online FP8). The kernel keeps the one vLLM would have chosen without it, and one custom op, kit::fp8_gemm
(decode_gemm.py), picks between the two at run time: the kit's kernel at M <= 16 tokens, vLLM's choice above.
Block sizes are autotuned per layer shape when the weights load, so no tuning runs inside a CUDA graph capture.
Under a --linear-backend other than auto, vLLM's filter leaves the kernel out.

FP8_GEMM=pick ($KIT_FP8_GEMM=pick): each FP8 layer serves batches of up to 16 rows with the kernel that a committed
`gemm` record of this GPU (`make gemm`, results/*/*-gemm.json: the same name as torch.cuda.get_device_name()) timed
fastest for its N x K at the batch size nearest $KIT_FP8_PICK_M (Variant.to_env: the verify's 1+K rows, or 1 without
speculation): vLLM's own kernel (the record's fp8), the kit's (fp8_kit) or FP8 Marlin (fp8_marlin) on a repacked copy
of the weights, made only for the layers that pick it. Larger batches keep vLLM's kernel. A shape no record has keeps
vLLM's kernel; a GPU no record names is an error at load that names the directory and `make gemm`. Several records
of one GPU pool, the newest deciding a shape. Each shape's pick is printed once, with its record. The picks are
saved beside the compile cache (VLLM_CACHE_ROOT/kit-fp8-picks.json), so a baked cache carries them into an image,
which has no records: there they are read back for the same device name.
Why from a record and not timed at load: `make gemm` times each kernel as a served step runs it (CUDA-graph replays
over enough weight copies to stream from HBM); one call at a time on one layer's weights, as a load-time timer would,
measures launch overhead and L2-resident weights instead (an H200's L2 holds a 47 MB gate_up). No one kernel wins
every shape at 5 rows: on an H200 (results/qwen3.5-4b-bf16/20261129T111821Z-gemm.json) Marlin beat CUTLASS on gate_up,
qkv and in_proj_qkvz, CUTLASS won o_proj and out_proj, the kit's kernel the 64-row in_proj_ba. A layer that keeps
vLLM's kernel is traced as without the patch, so Inductor still fuses its input's FP8 cast into the kernel before;
the others call one op, kit::fp8_gemm_pick, which reads the layer's pick when it runs. Picks are fixed at load, before
anything is traced.

Why: at the 5-token verify the FP8 checkpoint's GEMMs on vLLM's pick (CUTLASS, after a per-token FP8 cast) read
about half their byte floor on an H100 (results/qwen3.5-4b-bf16/20261126T160142Z-gemm.json). `make gemm` times the
kit's kernel as fp8_kit; this puts it in a server, for `make compare --set-b FP8_GEMM=kit`.

Read at every interpreter's start (sitecustomize.py): torch, Triton and vLLM are imported only in the hook.
Tested on CPU (tests/test_gemm_patches.py): a real vLLM FP8 layer takes the kernel, both sides of the branch
match their references, eager and compiled.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

ENV = "KIT_FP8_GEMM"
PICK_M_ENV = "KIT_FP8_PICK_M"
PICK_RECORDS_ENV = "KIT_FP8_PICK_RECORDS"  # the directory of records (Variant.to_env: the kit's results/)
TARGET = "vllm.model_executor.kernels.linear"
# A gemm record's kernel -> the pick. vLLM's is fp8_mm where the record has it: its GEMM alone, since a compiled step
# fuses the activations' FP8 cast into the norm before the layer (the fp8 row, cast included, made Marlin look faster
# than it was served: session 20261201T2308Z); older records have only fp8.
RECORD_KERNELS = {"fp8": "vllm", "fp8_mm": "vllm", "fp8_kit": "kit", "fp8_marlin": "marlin"}
_PICK: dict = {}  # layer index (decode_gemm.remember) -> the kernel it serves M <= 16 with
_PICKS: list = []  # this process's {(n, k): pick row}, read once
_SHAPES_SAID: set = set()


class PickError(RuntimeError):
    pass


def mode() -> str | None:
    """'kit', 'pick' or None, from $KIT_FP8_GEMM ("1" is kit)."""
    return {"1": "kit", "pick": "pick"}.get(os.environ.get(ENV, ""))


def record_picks(payload: dict, m: int) -> tuple[int, dict]:
    """From one gemm record's payload: the batch size it measured nearest m (the larger on a tie), and for each
    (n, k) it timed there with an FP8 candidate, {"pick": the fastest, "ms": {pick: ms}}. Layers of one shape (Qwen3.5's
    o_proj and out_proj) are one GEMM: a kernel's time for the shape is the mean of its rows, weighted by how many
    such layers a step has. vLLM's time is its fp8_mm row (the GEMM alone) where the record has one for the shape."""
    rows = [r for r in payload.get("rows", []) if r.get("kernel") in RECORD_KERNELS and r.get("ms") is not None]
    if not rows:
        return m, {}
    near = min({r["m"] for r in rows}, key=lambda x: (abs(x - m), -x))
    alone = {(r["n"], r["k"]) for r in rows if r["m"] == near and r["kernel"] == "fp8_mm"}
    sums: dict = {}
    for r in rows:
        if r["m"] == near and not (r["kernel"] == "fp8" and (r["n"], r["k"]) in alone):
            t = sums.setdefault((r["n"], r["k"]), {}).setdefault(RECORD_KERNELS[r["kernel"]], [0.0, 0])
            c = r.get("count") or 1
            t[0], t[1] = t[0] + r["ms"] * c, t[1] + c
    shapes = {nk: {p: round(a / c, 5) for p, (a, c) in ms.items()} for nk, ms in sums.items()}
    return near, {nk: {"pick": min(ms, key=ms.get), "ms": ms} for nk, ms in shapes.items()}


def read_picks(device_name: str, m: int, records: Path) -> dict:
    """{(n, k): {"pick", "ms", "m", "record"}} from every gemm record under `records` that names `device_name`, oldest
    first, so the newest decides a shape. PickError when none names it."""
    picks, seen = {}, []
    for path in sorted(Path(records).glob("*/*-gemm.json"), key=lambda p: p.name):
        try:
            payload = json.loads(path.read_text()).get("payload") or {}
        except (OSError, ValueError):
            continue
        if payload.get("device_name") != device_name:
            continue
        near, shapes = record_picks(payload, m)
        if shapes:
            seen.append(path)
        for nk, row in shapes.items():
            picks[nk] = {**row, "m": near, "record": f"{path.parent.name}/{path.name}"}
    if not seen:
        raise PickError(f"FP8_GEMM=pick: no gemm record with FP8 kernels names this GPU ({device_name}) under "
                        f"{records}; measure one here first (make gemm VARIANT=<the variant's BF16 parent> "
                        f"KERNELS=fp8,fp8_mm,fp8_kit,fp8_marlin M=1,2,4,5,8), or serve with FP8_GEMM=vllm")
    return picks


def device_name() -> str:
    import torch
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


PICKS_FILE = "kit-fp8-picks.json"  # in VLLM_CACHE_ROOT: the picks travel with the baked cache, into an image


def save_picks(path: Path, device: str, m: int, picks: dict) -> None:
    """The picks as resolved, beside the compile cache (atomic; left alone when it already says the same)."""
    doc = {"device_name": device, "m": m,
           "picks": [{"n": n, "k": k, **row} for (n, k), row in sorted(picks.items())]}
    text = json.dumps(doc, indent=1, sort_keys=True) + "\n"
    from scripts.kit.paths import atomic_write
    try:
        if path.is_file() and path.read_text() == text:
            return
        atomic_write(path, text)
    except OSError:  # a read-only cache: the records still decided
        pass


def load_saved(path: Path, device: str, m: int) -> dict | None:
    """Picks a bake saved for this device name and batch size, or None."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if doc.get("device_name") != device or doc.get("m") != m:
        return None
    return {(r["n"], r["k"]): {key: r[key] for key in ("pick", "ms", "m", "record")} for r in doc.get("picks", [])}


def picks() -> dict:
    """This process's picks: from the gemm records when they name this GPU (and saved beside the compile cache),
    else from the picks a bake saved there for this GPU (an image carries no records), else PickError."""
    if not _PICKS:
        root = Path(os.environ.get(PICK_RECORDS_ENV) or Path(__file__).resolve().parents[2] / "results")
        cache = os.environ.get("VLLM_CACHE_ROOT")
        dev, m = device_name(), int(os.environ.get(PICK_M_ENV) or 1)
        try:
            found = read_picks(dev, m, root)
            if cache:
                save_picks(Path(cache) / PICKS_FILE, dev, m, found)
        except PickError as e:
            found = load_saved(Path(cache) / PICKS_FILE, dev, m) if cache else None
            if found is None:
                raise PickError(f"{e}; nor picks saved for it in {cache or 'the compile cache'}/{PICKS_FILE}") from None
        _PICKS.append(found)
    return _PICKS[0]


def marlin_copy(weight_nk, scale, n: int, k: int, dtype, logical_widths=()):
    """An FP8 Marlin copy of a layer's [N, K] FP8 weight and its scale, prepared as vLLM's
    MarlinFP8ScaledMMLinearKernel prepares its own layer (prepare_fp8_layer_for_marlin) but on a module of its own, so
    the layer vLLM serves larger batches from stays as it is; None where FP8 Marlin does not run."""
    import torch
    if not weight_nk.is_cuda:
        return None
    from vllm.model_executor.layers.quantization.utils import marlin_utils_fp8 as MU
    if not MU.is_fp8_marlin_supported():
        return None
    m = torch.nn.Module()
    m.weight = torch.nn.Parameter(weight_nk.t().contiguous(), requires_grad=False)  # [K, N]: size_k_first
    m.weight_scale = torch.nn.Parameter(scale.detach().clone(), requires_grad=False)
    m.output_size_per_partition, m.input_size_per_partition, m.orig_dtype = n, k, dtype
    m.logical_widths = list(logical_widths)
    MU.prepare_fp8_layer_for_marlin(m, size_k_first=True)
    return m


def marlin_apply(m, x, bias=None):
    from vllm.model_executor.layers.quantization.utils.marlin_utils_fp8 import apply_fp8_marlin_linear
    return apply_fp8_marlin_linear(input=x, weight=m.weight, weight_scale=m.weight_scale, workspace=m.workspace,
                                   size_n=m.output_size_per_partition, size_k=m.input_size_per_partition, bias=bias)


def _pick_op():
    """torch.ops.kit.fp8_gemm_pick: at M <= 16 the layer's pick, above it the layer's vLLM kernel. The pick is read
    inside the op, so the traced graph is one whatever each layer picked."""
    import torch
    from scripts.patches import decode_gemm as D
    from scripts.patches.w8a16_kernel import w8a16_matmul
    if not hasattr(torch.ops.kit, "fp8_gemm_pick"):
        def body(x, weight, scale, bias, group, index):
            kernel, layer = D._LAYERS[index]
            if x.shape[0] <= D.M_MAX:
                p = _PICK.get(index, "vllm")
                if p == "kit":
                    y = w8a16_matmul(x, weight, scale)
                    return y if bias is None else y + bias
                if p == "marlin":
                    return marlin_apply(layer.kit_fp8_marlin, x, bias)
            return kernel.apply_weights(layer, x, bias)

        def fake(x, weight, scale, bias, group, index):
            return x.new_empty((x.shape[0], weight.shape[0]))
        torch.library.custom_op("kit::fp8_gemm_pick", mutates_args=(), schema=D.SCHEMA)(body).register_fake(fake)
    return torch.ops.kit.fp8_gemm_pick


def pick(layer, index: int, dtype) -> str:
    """This layer's kernel for M <= 16, from the records (_PICK[index]); a Marlin copy is made only for a layer that
    picks it, and where Marlin cannot run the layer keeps vLLM's kernel. Printed once a shape."""
    import sys
    w, s = layer.kit_fp8_weight, layer.kit_fp8_scale
    n, k = w.shape
    row = picks().get((n, k))
    best, why = (row["pick"], None) if row else ("vllm", "no gemm record of this GPU has this shape")
    if best == "marlin":
        mar = marlin_copy(w, s, n, k, dtype, getattr(layer, "logical_widths", ()))
        if mar is None:
            best, why = "vllm", "FP8 Marlin does not run here"
        else:  # held outside the layer's submodules: not a weight vLLM loads, offloads or names
            object.__setattr__(layer, "kit_fp8_marlin", mar)
    if best == "kit" and w.is_cuda:  # autotune this shape now, never inside a graph capture
        import torch
        from scripts.patches.w8a16_kernel import w8a16_matmul
        w8a16_matmul(torch.zeros(1, k, dtype=dtype, device=w.device), w, s)
    _PICK[index] = best
    if (n, k) not in _SHAPES_SAID:
        _SHAPES_SAID.add((n, k))
        said = (f"{why}" if why and not row else
                f"M={row['m']} in {row['record']}: " + ", ".join(
                    f"{name} {ms:.5f} ms" for name, ms in sorted(row["ms"].items(), key=lambda kv: kv[1]))
                + (f"; {why}" if why else ""))
        print(f"kit: FP8 pick for {n} x {k}: {best} ({said})", file=sys.stderr, flush=True)
    return best


def _op():
    from scripts.patches import decode_gemm as D
    from scripts.patches.w8a16_kernel import w8a16_matmul
    return D.op("fp8_gemm", lambda x, weight, scale, group: w8a16_matmul(x, weight, scale))


def kernel_class(mod):
    """KitFP8Kernel on `mod`'s (vLLM's kernels.linear) base class and kernel lists."""
    import torch
    from scripts.patches import decode_gemm as D
    from scripts.patches.w8a16_kernel import w8a16_matmul
    from vllm.model_executor.kernels.linear.scaled_mm.ScaledMMLinearKernel import FP8ScaledMMLinearKernel
    op = _op()  # registered here, once: the traced forward only calls it
    pick_op = _pick_op()

    class KitFP8Kernel(FP8ScaledMMLinearKernel):
        @classmethod
        def is_supported(cls, compute_capability=None):
            return D.supported("the kit's FP8 kernel", 89)

        @classmethod
        def can_implement(cls, c):
            g = c.weight_quant_key.scale.group_shape
            if not (g.is_per_tensor() or g.is_per_channel()):
                return False, "one weight scale a tensor or a channel only (no blocks or groups)"
            return True, None

        def __init__(self, c, layer_param_names):
            super().__init__(c, layer_param_names)
            import inspect
            rest = {p: [k for k in ks if k is not KitFP8Kernel] for p, ks in mod._POSSIBLE_FP8_KERNELS.items()}
            kw = {"quantization": "fp8_w8a8"} if "quantization" in inspect.signature(
                mod.choose_scaled_mm_linear_kernel).parameters else {}
            self.fallback = mod.choose_scaled_mm_linear_kernel(c, rest, **kw)(c, layer_param_names)

        def process_weights_after_loading(self, layer):
            # The FP8 [N, K] storage, taken before vLLM's kernel may repack it: the scheme hands kernels the
            # transposed [K, N] view.
            n, k = self.config.weight_shape
            w = layer.weight if tuple(layer.weight.shape) == (n, k) else layer.weight.t()
            layer.kit_fp8_weight = w if w.stride(1) == 1 else w.contiguous()
            layer.kit_fp8_scale = layer.weight_scale.detach().reshape(-1).float()
            self.fallback.process_weights_after_loading(layer)
            layer.kit_fp8_index = D.remember(self.fallback, layer)
            if mode() == "pick":
                pick(layer, layer.kit_fp8_index, self.config.input_dtype)
            elif layer.kit_fp8_weight.is_cuda:  # autotune this shape now, never inside a graph capture
                x = torch.zeros(1, k, dtype=self.config.input_dtype, device=layer.kit_fp8_weight.device)
                w8a16_matmul(x, layer.kit_fp8_weight, layer.kit_fp8_scale)

        def apply_scaled_mm(self, **kw):  # abstract in vLLM's base; apply_weights below never calls it
            return self.fallback.apply_scaled_mm(**kw)

        def apply_weights(self, layer, x, bias=None):
            if not isinstance(x, torch.Tensor):  # a quantized activation handed over by a fusion: vLLM's path
                return self.fallback.apply_weights(layer, x, bias)
            if mode() == "pick" and _PICK.get(layer.kit_fp8_index, "vllm") == "vllm":
                # vLLM's own path, traced as without the patch: inside an op, its per-token FP8 cast ran as a kernel of
                # its own (0.22 ms a step on an H200, session 20261130T0158Z) where Inductor had fused it into the
                # kernel before.
                return self.fallback.apply_weights(layer, x, bias)
            x2 = x.reshape(-1, x.shape[-1])
            run = pick_op if mode() == "pick" else op
            y = run(x2, layer.kit_fp8_weight, layer.kit_fp8_scale, bias, 0, layer.kit_fp8_index)
            return y.reshape(*x.shape[:-1], y.shape[-1])

    return KitFP8Kernel


def install(target: str = TARGET) -> bool:
    """Put the kit's kernel first in vLLM's list when `target` is imported, if $KIT_FP8_GEMM is "1" or "pick"."""
    from scripts.patches import decode_gemm as D
    return D.install(ENV, target, "_POSSIBLE_FP8_KERNELS", kernel_class, "FP8 GEMM", {
        "1": "the kit's Triton kernel at M <= 16, vLLM's choice above",
        "pick": "at M <= 16 each layer's fastest of vLLM's kernel, the kit's and FP8 Marlin by this GPU's gemm "
                "records, vLLM's choice above"})
