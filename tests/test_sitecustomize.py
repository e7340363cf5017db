"""The device-name shim: sitecustomize.py (gated, lazy, idempotent, loud) and its pure guard in device.py.

There is no GPU here, so every process-level test runs `python -c` in a subprocess against a fake
CUDA device-properties object: either a fake `torch` package (fast, tests the import hook and the
Inductor cache clearing contract) or the real CPU torch with its CUDA internals faked (slower,
proves the wrapper sits where torch.cuda.get_device_name and Inductor's get_system read the name).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from scripts.kit.device import GPU_TABLE, baked_cc, lookup_gpu, normalize_cc, shim_decision
from scripts.kit.paths import ROOT

H100_SXM, H100_PCIE = "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"

# A stand-in for torch with the three things the shim touches: torch.cuda.get_device_properties,
# torch.cuda.get_device_name (which reads the name through it, as torch's does) and Inductor's
# functools.cache'd CacheBase.get_system.
FAKE_TORCH = {
    "torch/__init__.py": "from . import cuda\nimport sys\nsys.modules[__name__].imported_for_real = True\n",
    "torch/cuda.py": textwrap.dedent("""
        class _CudaDeviceProperties:
            def __init__(self, name, major, minor):
                self.name, self.major, self.minor, self.multi_processor_count = name, major, minor, 132
            def __repr__(self):
                return f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor})"
        import os
        _NAME = os.environ.get("FAKE_GPU_NAME", "NVIDIA H100 80GB HBM3")
        _CC = tuple(int(x) for x in os.environ.get("FAKE_GPU_CC", "9.0").split("."))
        calls = []
        def get_device_properties(device=None):
            calls.append(device)
            return _CudaDeviceProperties(_NAME, *_CC)
        def get_device_name(device=None):
            return get_device_properties(device).name
        def current_device():
            return 0
    """),
    "torch/_inductor/__init__.py": "",
    "torch/_inductor/codecache.py": textwrap.dedent("""
        import functools
        import torch
        class CacheBase:
            @staticmethod
            @functools.cache
            def get_system():
                return {"device": {"name": torch.cuda.get_device_properties(torch.cuda.current_device()).name}}
    """),
}


@pytest.fixture
def fake_torch(tmp_path) -> Path:
    for rel, text in FAKE_TORCH.items():
        p = tmp_path / "fake" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path / "fake"


def run_py(code: str, env: dict, pythonpath: list[Path]) -> subprocess.CompletedProcess:
    """`python -c code` as vLLM's children start: PYTHONPATH carries the repo root (and sitecustomize)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("KIT_DEVICE_", "VLLM_CACHE_ROOT", "FAKE_GPU_"))}
    full.update(env, PYTHONPATH=os.pathsep.join(str(p) for p in [*pythonpath, ROOT]))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full, capture_output=True,
                          text=True, timeout=120, cwd="/")


def kit_lines(stderr: str) -> list[str]:
    return [l for l in stderr.splitlines() if l.startswith("kit:")]


# -- sitecustomize.py itself -----------------------------------------------------------------
def test_sitecustomize_is_under_30_lines_and_the_shim_is_a_row_gated_on_its_variable():
    from scripts.patches import PATCHES
    assert len((ROOT / "sitecustomize.py").read_text().splitlines()) < 30
    assert [p.module for p in PATCHES if p.switch == "KIT_DEVICE_NAME"] == ["device_name"]


def test_without_variable_nothing_is_imported_or_hooked(fake_torch):
    r = run_py("""
        import sys
        print(sorted(m for m in sys.modules if m.startswith("scripts")))
        print([type(f).__name__ for f in sys.meta_path])
        import torch
        print(torch.cuda.get_device_name(0))
    """, {}, [fake_torch])
    assert r.returncode == 0, r.stderr
    mods, finders, name = r.stdout.splitlines()
    assert mods == "['scripts', 'scripts.patches']" and "AfterImport" not in finders  # the table only
    assert name == H100_SXM and kit_lines(r.stderr) == []


def test_shim_with_fake_cuda_properties_hooks_lazily_and_presents_baked_name(fake_torch):
    r = run_py("""
        import sys
        print("torch" in sys.modules)                        # the hook must not import torch
        import torch
        from torch._inductor.codecache import CacheBase
        props = torch.cuda.get_device_properties(0)
        print(torch.cuda.get_device_name(0), CacheBase.get_system()["device"]["name"], props.multi_processor_count,
              props.major, props.minor)
        print(repr(props))
        for _ in range(3):
            torch.cuda.get_device_name()
    """, {"KIT_DEVICE_NAME": H100_PCIE}, [fake_torch])
    assert r.returncode == 0, r.stderr
    eager, names, rep = r.stdout.splitlines()
    assert eager == "False"
    assert names == f"{H100_PCIE} {H100_PCIE} 132 9 0"
    assert H100_PCIE in rep and "major=9" in rep
    assert kit_lines(r.stderr) == [f"kit: device name {H100_SXM} -> {H100_PCIE} (KIT_DEVICE_NAME, same compute capability 9.0)"]


def test_shim_with_fake_cuda_properties_is_idempotent_and_clears_inductor_cache(fake_torch):
    r = run_py("""
        import os, torch
        from torch._inductor.codecache import CacheBase
        from scripts.patches.device_name import install, patch_torch
        # A get_system value computed with the real name (as if cached before the patch) ...
        real = torch.cuda.get_device_properties.__wrapped__
        torch.cuda.get_device_properties = real
        print(CacheBase.get_system()["device"]["name"])
        # ... is dropped when the patch is applied, and a second install/patch changes nothing.
        print(install(), patch_torch(torch), install())
        print(CacheBase.get_system()["device"]["name"])
        print(torch.cuda.get_device_properties.__wrapped__ is real)
    """, {"KIT_DEVICE_NAME": H100_PCIE}, [fake_torch])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [H100_SXM, "patched False already", H100_PCIE, "True"]


def test_shim_with_fake_cuda_properties_refuses_loudly_on_compute_capability_mismatch(fake_torch):
    r = run_py("""
        import torch
        print(torch.cuda.get_device_name(0))
        torch.cuda.get_device_name(0)
    """, {"KIT_DEVICE_NAME": "NVIDIA A10G"}, [fake_torch])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == H100_SXM
    lines = kit_lines(r.stderr)
    assert len(lines) == 1 and "REFUSING" in lines[0] and "8.6" in lines[0] and "9.0" in lines[0]


def test_shim_with_fake_cuda_properties_unknown_gpu_needs_KIT_DEVICE_CC(fake_torch):
    code = "import torch; print(torch.cuda.get_device_name(0))"
    r = run_py(code, {"KIT_DEVICE_NAME": "Prototype GPU X"}, [fake_torch])
    assert r.stdout.strip() == H100_SXM and "unknown" in kit_lines(r.stderr)[0]
    r = run_py(code, {"KIT_DEVICE_NAME": "Prototype GPU X", "KIT_DEVICE_CC": "9.0"}, [fake_torch])
    assert r.stdout.strip() == "Prototype GPU X"


def test_shim_with_fake_cuda_properties_takes_compute_capability_from_manifest(fake_torch, tmp_path):
    """The manifest beats the name table: a cache baked on sm86 is refused on this sm90 GPU."""
    root = tmp_path / "cache"
    root.mkdir()
    (root / "kit-cache-manifest.json").write_text(json.dumps({"key": {"gpu": {"compute_capability": "8.6"}}}))
    r = run_py("import torch; print(torch.cuda.get_device_name(0))",
               {"KIT_DEVICE_NAME": H100_PCIE, "VLLM_CACHE_ROOT": str(root)}, [fake_torch])
    assert r.stdout.strip() == H100_SXM and "REFUSING" in kit_lines(r.stderr)[0]


def test_shim_with_fake_cuda_properties_same_name_is_silent(fake_torch):
    r = run_py("import torch; print(torch.cuda.get_device_name(0))", {"KIT_DEVICE_NAME": H100_SXM}, [fake_torch])
    assert r.stdout.strip() == H100_SXM and kit_lines(r.stderr) == []


def test_shim_with_fake_cuda_properties_on_real_cpu_torch_reaches_inductor_key():
    """Real torch (CPU build) with its CUDA internals faked: the name Inductor hashes is the baked one."""
    pytest.importorskip("torch")
    code = """
        import torch
        class Props:
            name, major, minor, multi_processor_count = "NVIDIA H100 80GB HBM3", 9, 0, 132
        torch.cuda._lazy_init = lambda: None
        torch.cuda.device_count = lambda: 1
        torch.cuda.current_device = lambda: 0
        torch.cuda._get_device_properties = lambda i: Props()
        torch.version.cuda = "13.0"
        from torch._inductor.codecache import CacheBase
        print(torch.cuda.get_device_name(0), "|", CacheBase.get_system()["device"]["name"], "|",
              torch.cuda.get_device_capability(0))
    """
    r = run_py(code, {"KIT_DEVICE_NAME": H100_PCIE}, [])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{H100_PCIE} | {H100_PCIE} | (9, 0)"
    r = run_py(code, {}, [])
    assert r.stdout.strip() == f"{H100_SXM} | {H100_SXM} | (9, 0)"


def test_named_properties_are_read_only():
    from scripts.patches.device_name import NamedProperties

    class Real:
        name, major = "A", 9
    p = NamedProperties(Real(), "B")
    assert (p.name, p.major) == ("B", 9)
    with pytest.raises(AttributeError):
        p.name = "C"


# -- the pure guard and name table -----------------------------------------------------------
@pytest.mark.parametrize("name,canonical,cc", [
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", "9.0"),
    ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe", "9.0"),
    ("NVIDIA H100 NVL", "NVIDIA H100 NVL", "9.0"),
    ("NVIDIA H200", "NVIDIA H200", "9.0"),
    ("NVIDIA GH200 480GB", "NVIDIA GH200 480GB", "9.0"),
    ("NVIDIA L40S", "NVIDIA L40S", "8.9"),
    ("NVIDIA L4", "NVIDIA L4", "8.9"),
    ("NVIDIA A10G", "NVIDIA A10G", "8.6"),
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", "8.0"),
])
def test_gpu_table_more_specific_patterns_win(name, canonical, cc):
    assert lookup_gpu(name) == (canonical, cc)


def test_gpu_table_rows_are_reachable_and_unknown_names_are_none():
    """Every row's own canonical name resolves to that row (no earlier pattern shadows it)."""
    for _pattern, canonical, cc in GPU_TABLE:
        assert lookup_gpu(canonical) == (canonical, cc), canonical
    assert lookup_gpu("Prototype GPU X") is None


@pytest.mark.parametrize("raw,want", [("9.0", "9.0"), ("90", "9.0"), ("sm_90", "9.0"), ("sm100", "10.0"),
                                      ((8, 6), "8.6"), ("8.9", "8.9"), (None, None), ("h100", None), ("9", None)])
def test_normalize_cc(raw, want):
    assert normalize_cc(raw) == want


def test_baked_cc_precedence_declared_then_manifest_then_table():
    assert baked_cc(H100_PCIE, "8.6", "8.0") == ("8.6", "KIT_DEVICE_CC")
    assert baked_cc(H100_PCIE, None, "8.0") == ("8.0", "manifest")
    assert baked_cc(H100_PCIE) == ("9.0", "GPU table")
    assert baked_cc("Prototype GPU X") == (None, "unknown")


def test_shim_decision_acts_only_on_same_compute_capability():
    act, line = shim_decision(H100_PCIE, "9.0", H100_SXM, (9, 0))
    assert act and line == f"kit: device name {H100_SXM} -> {H100_PCIE} (KIT_DEVICE_NAME, same compute capability 9.0)"
    act, line = shim_decision(H100_PCIE, "9.0", "NVIDIA A10G", "8.6")
    assert not act and "REFUSING" in line
    act, line = shim_decision("X", None, H100_SXM, "9.0")
    assert not act and "KIT_DEVICE_CC" in line
    act, _ = shim_decision(H100_SXM, "9.0", H100_SXM, "9.0")
    assert not act
