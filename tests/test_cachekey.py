"""The baked-cache manifest (scripts/kit/cachekey.py) and the pure parts of scripts/bake.py: key inputs,
match/mismatch reasons, artifact snapshots, the startup phase budget, warm-up shapes and the export layout.
"""
from __future__ import annotations

import copy
import json
import os
import tarfile

import pytest

from scripts import bake
from scripts.kit import cachekey
from scripts.kit.errors import KitError
from scripts.kit.paths import ROOT
from scripts.kit.variant import Variant, load

H100_SXM, H100_PCIE = "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"


@pytest.fixture
def variant(tree, tmp_path, monkeypatch):
    """A variant in a tmp tree whose cache root is in tmp too (weights/cache/ is shared)."""
    tree("cachev", "MODEL=org/m\nSERVE_MAX_NUM_SEQS=8\nVLLM_USE_V2_MODEL_RUNNER=0\n")
    monkeypatch.setattr(Variant, "cache_root", property(lambda self: tmp_path / "cache" / self.name))
    # Importing vLLM in this process (other tests do) puts TORCHINDUCTOR_* into os.environ; the key
    # reads the kit process's environment, so each test starts from one without those keys.
    for k in list(os.environ):
        if k.startswith(("VLLM_", "TORCHINDUCTOR_")):
            monkeypatch.delenv(k)
    return load("cachev")


def fake_gpu(monkeypatch, name=H100_SXM, cc="9.0"):
    monkeypatch.setattr(cachekey, "gpu_facts", lambda: [{"name": name, "driver": "580", "compute_capability": cc,
                                                         "memory_mib": 81559}])


def key(variant, monkeypatch, env_extra=None, **gpu):
    fake_gpu(monkeypatch, **gpu)
    env = {**variant.to_env("gpu"), **(env_extra or {})}
    return cachekey.key_inputs(variant, "gpu", variant.to_argv("gpu"), env)


# -- key inputs ------------------------------------------------------------------------------
def test_key_inputs_hold_what_vllm_hashes(variant, monkeypatch):
    k = key(variant, monkeypatch, {"VLLM_SERVER_DEV_MODE": "1", "PATH": "/bin"})
    assert set(k) == {"versions", "vllm_path", "model_path", "flags", "env", "speculative", "gpu"}
    assert set(k["versions"]) >= {"python", "vllm", "torch", "cuda", "triton"}
    assert k["model_path"] == str(variant.weights_dir)
    assert "--max-num-seqs" in k["flags"] and "--port" not in k["flags"] and "--model" not in k["flags"]
    assert k["env"]["VLLM_USE_V2_MODEL_RUNNER"] == "0" and "PATH" not in k["env"]
    assert k["speculative"] == {"method": "none", "k": 0}
    assert k["gpu"] == {"kind": "gpu", "name": H100_SXM, "compute_capability": "9.0", "nvml_name": H100_SXM}


def test_key_flags_drop_listen_address_name_and_model():
    argv = ["py", "-m", "mod", "--model", "/m", "--served-model-name", "v", "--host", "h", "--port", "1",
            "--max-num-seqs", "8", "--enforce-eager"]
    assert cachekey.key_flags(argv) == ["--max-num-seqs", "8", "--enforce-eager"]


def test_flashinfer_autotune_switch_is_outside_the_key_as_in_vllms():
    """vLLM 0.26 leaves enable_flashinfer_autotune out of KernelConfig.compute_hash: a start with it off hits a
    cache baked with it on, and the manifest says the same. The flag after it is still kept."""
    base = ["py", "-m", "mod", "--max-num-seqs", "8"]
    for flag in ("--no-enable-flashinfer-autotune", "--enable-flashinfer-autotune"):
        assert cachekey.key_flags(base[:3] + [flag] + base[3:]) == ["--max-num-seqs", "8"]


def test_chat_template_content_format_is_outside_the_key():
    """An API-server flag (vLLM's FrontendArgs), not in VllmConfig: a start that sets it hits a cache baked
    without it (qwen3-4b-bf16-quickstart sets it; its legs compare it against auto on one bake)."""
    base = ["py", "-m", "mod", "--max-num-seqs", "8"]
    for v in ("string", "auto"):
        assert cachekey.key_flags(base[:3] + ["--chat-template-content-format", v] + base[3:]) == ["--max-num-seqs", "8"]


def test_presented_gpu_applies_the_shim_only_on_same_compute_capability(variant, monkeypatch):
    assert key(variant, monkeypatch, {"KIT_DEVICE_NAME": H100_PCIE})["gpu"]["name"] == H100_PCIE
    assert key(variant, monkeypatch, {"KIT_DEVICE_NAME": "NVIDIA A10G"})["gpu"]["name"] == H100_SXM


def test_torch_cuda_version_read_without_importing_torch(tmp_path, monkeypatch):
    (tmp_path / "version.py").write_text("__version__ = '2.11.0+cu130'\ncuda: Optional[str] = '13.0'\n")
    monkeypatch.setattr(cachekey, "_package_dir", lambda name: str(tmp_path))
    assert cachekey.torch_cuda_version() == "13.0"
    (tmp_path / "version.py").write_text("cuda = None\n")
    assert cachekey.torch_cuda_version() is None


# -- match / mismatch reasons ----------------------------------------------------------------
def test_identical_keys_match_and_hash_equal(variant, monkeypatch):
    a, b = key(variant, monkeypatch), key(variant, monkeypatch)
    assert cachekey.differences(a, b) == []
    assert cachekey.key_sha256(a) == cachekey.key_sha256(b)


def test_gpu_name_change_same_cc_is_a_miss_that_names_the_shim(variant, monkeypatch):
    baked = key(variant, monkeypatch, name=H100_PCIE)
    here = key(variant, monkeypatch, name=H100_SXM)
    (why,) = cachekey.differences(baked, here)
    assert "GPU differs" in why and f"KIT_DEVICE_NAME={H100_PCIE!r}" in why
    assert cachekey.key_sha256(baked) != cachekey.key_sha256(here)
    # The shim presenting the baked name makes it a match again.
    assert cachekey.differences(baked, key(variant, monkeypatch, {"KIT_DEVICE_NAME": H100_PCIE}, name=H100_SXM)) == []


def test_compute_capability_change_is_a_miss_without_shim_hint(variant, monkeypatch):
    baked = key(variant, monkeypatch)
    (why,) = cachekey.differences(baked, key(variant, monkeypatch, name="NVIDIA A10G", cc="8.6"))
    assert "GPU differs" in why and "KIT_DEVICE_NAME" not in why


def test_hashed_env_flag_version_and_path_changes_are_misses(variant, monkeypatch):
    baked = key(variant, monkeypatch)
    cases = {
        "env VLLM_USE_V2_MODEL_RUNNER": lambda k: k["env"].update(VLLM_USE_V2_MODEL_RUNNER="1"),
        "torch version": lambda k: k["versions"].update(torch="9.9"),
        "model_path differs": lambda k: k.update(model_path="/elsewhere"),
        "vllm_path differs": lambda k: k.update(vllm_path="/opt/other/vllm"),
        "flags differ": lambda k: k["flags"].append("--enforce-eager"),
        "speculation differs": lambda k: k["speculative"].update(k=3),
    }
    for expect, change in cases.items():
        here = copy.deepcopy(baked)
        change(here)
        whys = cachekey.differences(baked, here)
        assert len(whys) == 1 and expect in whys[0], (expect, whys)


def test_unhashed_env_does_not_break_a_match(variant, monkeypatch):
    baked = key(variant, monkeypatch)
    here = key(variant, monkeypatch, {"VLLM_PORT": "9", "VLLM_FORCE_AOT_LOAD": "1", "VLLM_LOGGING_LEVEL": "DEBUG"})
    assert cachekey.differences(baked, here) == []


# -- manifest --------------------------------------------------------------------------------
def bake_fake(variant, monkeypatch, files=None) -> dict:
    """A cache root with a few files and a manifest, as `make bake` would leave it (no server)."""
    root = variant.cache_root
    for rel, body in (files or {"torch_compile_cache/abc/rank_0_0/backbone/artifact": b"x" * 100,
                                "triton/KEY/kernel.cubin": b"y" * 50, "modelinfos/m.json": b"{}"}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(body)
    k = key(variant, monkeypatch)
    doc = cachekey.build_manifest(variant, k, cachekey.snapshot(root),
                                  {"cold_ready_s": 100.0, "cold_first_token_s": 100.5}, "2026-11-22T00:00:00Z")
    cachekey.write_manifest(variant, doc)
    return doc


def test_check_manifest_without_bake_says_how_to_bake(variant, monkeypatch):
    fake_gpu(monkeypatch)
    ok, why = cachekey.check_manifest(variant, "gpu")
    assert not ok and "make bake VARIANT=cachev" in why
    assert "not a baked hit" in cachekey.describe_cache(variant, "gpu")


def test_an_eager_server_is_told_it_compiles_nothing_not_to_bake():
    """Issue #33: `make serve` on a CPU host said "vLLM compiles on start (cold)" and "run: make bake"
    while the server ran --enforce-eager (EAGER=auto on CPU), which compiles nothing."""
    from scripts.kit.variant import load
    for v, platform in ((load("tiny"), "cpu"), (load("tiny", ["EAGER=on"]), "gpu")):
        line = cachekey.describe_cache(v, platform)
        assert line.startswith("compile cache: not used: the server runs --enforce-eager (EAGER=")
        assert "make bake" not in line and "compiles on start" not in line
    assert "--set" in cachekey.describe_cache(load("tiny", ["EAGER=on"]), "gpu")
    assert "not a baked hit" in cachekey.describe_cache(load("tiny"), "gpu")


def test_check_manifest_matches_after_bake_and_lists_artifacts(variant, monkeypatch):
    doc = bake_fake(variant, monkeypatch)
    assert doc["artifact_count"] == 3 and doc["total_bytes"] == 152
    assert json.loads(cachekey.manifest_path(variant).read_text())["key_sha256"] == doc["key_sha256"]
    ok, why = cachekey.check_manifest(variant, "gpu")
    assert ok, why
    assert "3 files" in why and H100_SXM in why
    assert cachekey.describe_cache(variant, "gpu").startswith("compile cache: ")


def test_check_manifest_mismatch_and_missing_artifacts(variant, monkeypatch):
    bake_fake(variant, monkeypatch)
    fake_gpu(monkeypatch, name=H100_PCIE)
    ok, why = cachekey.check_manifest(variant, "gpu")
    assert not ok and "GPU differs" in why
    fake_gpu(monkeypatch)
    (variant.cache_root / "triton/KEY/kernel.cubin").unlink()
    ok, why = cachekey.check_manifest(variant, "gpu")
    assert not ok and "1 of 3 baked artifacts are missing" in why


def test_manifest_that_breaks_its_schema_is_not_a_bake(variant, monkeypatch):
    bake_fake(variant, monkeypatch)
    path = cachekey.manifest_path(variant)
    doc = json.loads(path.read_text())
    del doc["key"]["gpu"]
    path.write_text(json.dumps(doc))
    ok, why = cachekey.check_manifest(variant, "gpu")
    assert not ok and "unreadable" in why


# -- artifact snapshots ----------------------------------------------------------------------
def test_new_artifacts_count_compile_files_only():
    before = {"torch_compile_cache/a": 10, "modelinfos/x.json": 5}
    after = {**before, "torch_compile_cache/a": 20, "torch_compile_cache/b": 1, "triton/k/k.cubin": 3,
             "triton/k/lock.lock": 0, "modelinfos/y.json": 5, "startup_plan/p.json": 1}
    assert cachekey.new_artifacts(before, after) == ["torch_compile_cache/a", "torch_compile_cache/b", "triton/k/k.cubin"]
    assert cachekey.new_artifacts(after, after) == []


def test_by_category_sums_sizes():
    cats = cachekey.by_category({"triton/a": 1, "triton/b": 2, "x.json": 4})
    assert cats == {"(top)": {"files": 1, "bytes": 4}, "triton": {"files": 2, "bytes": 3}}


# -- startup phases and warm-up shapes -------------------------------------------------------
GPU_LOG = """\
(APIServer pid=1) INFO 11-22 05:37:09 [api_utils.py:273] non-default args: {'model': '/m'}
(EngineCore pid=2) INFO [core.py:117] Initializing a V1 LLM engine (v0.26.0) with config: model='/m'
(Worker pid=3) INFO [default_loader.py:431] Loading weights took 1.50 seconds
(Worker pid=3) INFO [gpu_model_runner.py:5348] Model loading took 2.61 GiB memory and 3.250000 seconds
(Worker pid=3) INFO [backends.py:1156] Dynamo bytecode transform time: 4.10 s
(Worker pid=3) INFO [backends.py:293] Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 1.200 s
(Worker pid=3) INFO [decorators.py:312] Directly load AOT compilation from path /c/torch_aot_compile/h/rank_0_0/model
(Worker pid=3) INFO [monitor.py:20] torch.compile took 6.40 s in total
(Worker pid=3) INFO [gpu_worker.py:561] Available KV cache memory: 60.1 GiB
(EngineCore pid=2) INFO [kv_cache_utils.py:2177] GPU KV cache size: 437,552 tokens
(Worker pid=3) INFO [gpu_model_runner.py:6845] Graph capturing finished in 6 secs, took 0.55 GiB
(EngineCore pid=2) INFO [core.py:348] init engine (profile, create kv cache, warmup model) took 18.20 s
(APIServer pid=1) INFO:     Application startup complete.
"""


def test_parse_phases_budget_sums_to_ready_and_reads_vllm_figures():
    at = {"python_imports": 4.0, "engine_start": 9.0, "weights": 12.5, "torch_compile": 19.0, "kv_cache": 20.0,
          "graph_capture": 26.5, "engine_init": 27.0, "api_startup": 28.0}
    ph = bake.parse_phases(GPU_LOG, at, 28.6)
    assert ph["budget_s"]["python_imports"] == 4.0 and ph["budget_s"]["graph_capture"] == 6.5
    assert ph["budget_s"]["until_ready"] == 0.6
    assert round(sum(ph["budget_s"].values()), 1) == 28.6
    r = ph["reported"]
    assert (r["weights_load_s"], r["model_load_s"], r["torch_compile_s"], r["graph_capture_s"]) == (1.5, 3.25, 6.4, 6.0)
    assert (r["compile_range_load_s"], r["kv_cache_tokens"], r["engine_init_s"]) == (1.2, 437552, 18.2)
    assert ph["counts"] == {"graphs_compiled": 0, "graphs_loaded": 1, "aot_loaded": 1, "aot_load_failures": 0,
                            "kernel_warmups": 0}


def test_log_watcher_stamps_first_sighting(tmp_path):
    log = tmp_path / "s.log"
    log.write_text(GPU_LOG.splitlines()[0] + "\n")
    w = bake.LogWatcher(log)
    w.poll(3.0)
    with open(log, "a") as f:
        f.write("\n".join(GPU_LOG.splitlines()[1:4]) + "\n")
    w.poll(7.5)
    w.poll(9.0)
    assert w.at == {"python_imports": 3.0, "engine_start": 7.5, "weights": 7.5}


def test_plan_shapes_reach_every_concurrency_and_a_long_prompt():
    shapes = bake.plan_shapes(max_model_len=2048, max_seqs=12)
    assert [s["concurrency"] for s in shapes if s["name"].startswith("decode")] == [1, 2, 4, 8, 12]
    longest = max(s["prompt_tokens"] for s in shapes)
    assert longest == 2048 - 64
    assert all(s["prompt_tokens"] + s["max_tokens"] <= 2048 for s in shapes)
    assert bake.plan_shapes(16384, 1)[0]["concurrency"] == 1 and max(s["prompt_tokens"] for s in bake.plan_shapes(16384, 1)) == 8192


def test_prompts_differ_by_seed():
    assert bake.prompt(8, 1) != bake.prompt(8, 2) and len(bake.prompt(8, 1)) == 8


# -- export ----------------------------------------------------------------------------------
def test_export_layout_recreates_cache_dir_at_repo_root(variant, monkeypatch, tmp_path):
    monkeypatch.setattr(Variant, "cache_root", property(lambda self: ROOT / "weights" / "cache" / "_kit_test_export"))
    root = variant.cache_root
    try:
        bake_fake(variant, monkeypatch)
        out = tmp_path / "cache_import.tar.gz"
        assert bake.export(variant, out) == 0
        with tarfile.open(out) as tar:
            names = tar.getnames()
            assert all(n.startswith("weights/cache/_kit_test_export") for n in names)
            assert "weights/cache/_kit_test_export/kit-cache-manifest.json" in names
            tar.extractall(tmp_path / "repo")
        assert (tmp_path / "repo/weights/cache/_kit_test_export/triton/KEY/kernel.cubin").read_bytes() == b"y" * 50
    finally:
        import shutil
        shutil.rmtree(root, ignore_errors=True)


def test_export_refuses_without_a_bake(variant, tmp_path):
    with pytest.raises(KitError, match="no baked cache"):
        bake.export(variant, tmp_path / "x.tar.gz")
    assert not (tmp_path / "x.tar.gz").exists()


def test_only_torch_compile_products_count_as_a_miss():
    # What bake --verify and verify-image both decide a hit by (kernel files are only reported).
    assert cachekey.is_graph_artifact("torch_compile_cache/abc/rank_0_0/backbone/artifact_shape_None_subgraph_0")
    assert cachekey.is_graph_artifact("inductor_cache/fx/ab/graph.py")
    assert not cachekey.is_graph_artifact("triton/KEY/kernel.cubin")
    assert not cachekey.is_graph_artifact("flashinfer/cached_ops/x.so")
    assert not cachekey.is_graph_artifact("torch_compile_cache/abc/x.lock")  # scratch, never an artifact
