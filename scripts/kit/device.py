"""What machine we are on, without importing torch: host platform, GPU facts for provenance, and
the GPU-name table used by the compile-cache shim (sitecustomize.py -> scripts/_cache_patch.py).
"""
from __future__ import annotations

import functools
import os
import platform as _platform
import shutil
import subprocess


@functools.cache
def gpu_facts() -> list[dict]:
    """One dict per visible NVIDIA GPU (name, driver, compute capability, memory), [] without one."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=name,driver_version,compute_cap,memory.total",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    gpus = []
    for line in out.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4:
            gpus.append({"name": parts[0], "driver": parts[1], "compute_capability": parts[2],
                         "memory_mib": int(float(parts[3])) if parts[3].replace(".", "").isdigit() else None})
    return gpus


def gpu_compute_processes() -> int | None:
    """Processes holding GPU memory now (nvidia-smi's compute apps); None without nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return len([x for x in out.stdout.split() if x.strip().isdigit()]) if out.returncode == 0 else None


def host_platform() -> str:
    """'gpu' or 'cpu'. KIT_PLATFORM overrides (goldens and tests pin it)."""
    forced = os.environ.get("KIT_PLATFORM")
    if forced in ("cpu", "gpu"):
        return forced
    return "gpu" if gpu_facts() else "cpu"


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _platform.processor() or "unknown"


def device_provenance() -> dict:
    """The `device` block of every record."""
    gpus = gpu_facts()
    if not gpus:
        return {"kind": "cpu", "name": cpu_model(), "count": os.cpu_count() or 1}
    g = gpus[0]
    shim = os.environ.get("KIT_DEVICE_NAME")
    return {"kind": "gpu", "name": g["name"], "count": len(gpus), "driver": g["driver"],
            "compute_capability": g["compute_capability"], "memory_mib": g["memory_mib"],
            "shimmed_name": shim or None}


# -- device-name shim (sitecustomize.py -> scripts/_cache_patch.py) ---------------------------
# torch puts the GPU's marketing name into its compile-cache keys (Inductor's CacheBase.get_system
# and the AOT SystemInfo check), so a cache baked on an "H100 PCIe" misses on an "H100 80GB HBM3"
# although both run the same sm90 cubins. The shim presents the baked name, but only where the
# compute capability is the same: cubins are arch-specific, so anything else must compile fresh.
#
# Ordered (pattern, canonical NVML name, compute capability). Order matters: more specific
# patterns first ("GH200" before "H200", "H100 PCIe" before the bare "H100").
GPU_TABLE: tuple[tuple[str, str, str], ...] = (
    (r"GH200", "NVIDIA GH200 480GB", "9.0"),
    (r"H200.*NVL", "NVIDIA H200 NVL", "9.0"),
    (r"H200", "NVIDIA H200", "9.0"),
    (r"H100.*PCIe", "NVIDIA H100 PCIe", "9.0"),
    (r"H100.*NVL", "NVIDIA H100 NVL", "9.0"),
    (r"H100", "NVIDIA H100 80GB HBM3", "9.0"),
    (r"H800", "NVIDIA H800", "9.0"),
    (r"B200", "NVIDIA B200", "10.0"),
    (r"L40S", "NVIDIA L40S", "8.9"),
    (r"L40", "NVIDIA L40", "8.9"),
    (r"\bL4\b", "NVIDIA L4", "8.9"),
    (r"RTX 4090", "NVIDIA GeForce RTX 4090", "8.9"),
    (r"A100.*PCIE.*40GB|A100-PCIE-40GB", "NVIDIA A100-PCIE-40GB", "8.0"),
    (r"A100.*80GB.*PCIe", "NVIDIA A100 80GB PCIe", "8.0"),
    (r"A100.*80GB", "NVIDIA A100-SXM4-80GB", "8.0"),
    (r"A100", "NVIDIA A100-SXM4-40GB", "8.0"),
    (r"A10G", "NVIDIA A10G", "8.6"),
    (r"\bA10\b", "NVIDIA A10", "8.6"),
    (r"RTX 3090", "NVIDIA GeForce RTX 3090", "8.6"),
    (r"V100", "Tesla V100-SXM2-16GB", "7.0"),
    (r"T4\b", "Tesla T4", "7.5"),
)


def lookup_gpu(name: str) -> tuple[str, str] | None:
    """(canonical name, compute capability) of the first table row whose pattern matches, else None."""
    import re
    for pattern, canonical, cc in GPU_TABLE:
        if re.search(pattern, name or "", re.IGNORECASE):
            return canonical, cc
    return None


def normalize_cc(cc) -> str | None:
    """'9.0', '90', 'sm90', 'sm_90', (9, 0) -> '9.0'; None or junk -> None."""
    if cc is None:
        return None
    if isinstance(cc, (tuple, list)) and len(cc) == 2:
        return f"{int(cc[0])}.{int(cc[1])}"
    s = str(cc).strip().lower().removeprefix("sm_").removeprefix("sm")
    if "." in s:
        major, _, minor = s.partition(".")
        return f"{int(major)}.{int(minor)}" if major.isdigit() and minor.isdigit() else None
    # Two or three digits without a dot: the last one is the minor ("90" -> 9.0, "100" -> 10.0).
    return f"{int(s[:-1])}.{int(s[-1])}" if s.isdigit() and len(s) in (2, 3) else None


def baked_cc(baked_name: str, declared: str | None = None, manifest_cc: str | None = None) -> tuple[str | None, str]:
    """The compute capability the cache was baked for, and where it came from.

    Precedence: an explicit KIT_DEVICE_CC, then the bake manifest, then the GPU table by name.
    """
    for value, source in ((declared, "KIT_DEVICE_CC"), (manifest_cc, "manifest")):
        cc = normalize_cc(value)
        if cc:
            return cc, source
    hit = lookup_gpu(baked_name)
    return (hit[1], "GPU table") if hit else (None, "unknown")


def shim_decision(baked_name: str, baked: str | None, real_name: str, real_cc) -> tuple[bool, str]:
    """Whether to present `baked_name` instead of `real_name`, and the one line that says so.

    Pure: the same-compute-capability guard of the shim, unit-tested in tests/test_sitecustomize.py.
    """
    real = normalize_cc(real_cc)
    if real_name == baked_name:
        return False, f"kit: device name {real_name} already matches KIT_DEVICE_NAME; shim not needed"
    if baked is None:
        return False, (f"kit: REFUSING device-name shim: compute capability of the baked GPU {baked_name!r} is "
                       f"unknown (set KIT_DEVICE_CC); {real_name} keeps its name, vLLM compiles fresh")
    if real != baked:
        return False, (f"kit: REFUSING device-name shim: this GPU {real_name} has compute capability {real}, the cache "
                       f"was baked on {baked_name} ({baked}); cubins are arch-specific, so vLLM compiles fresh")
    return True, f"kit: device name {real_name} -> {baked_name} (KIT_DEVICE_NAME, same compute capability {real})"
