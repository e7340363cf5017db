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
