"""What machine we are on, without importing torch: host platform, GPU facts for provenance, and
the GPU-name table used by the compile-cache shim (sitecustomize.py -> scripts/patches/device_name.py).
"""
from __future__ import annotations

import functools
import os
import platform as _platform
import shutil
import subprocess
import time


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


def _smi(*query: str) -> str | None:
    """nvidia-smi's stdout for one query, None without nvidia-smi or when it fails."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, *query], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def gpu_compute_processes() -> int | None:
    """Processes holding GPU memory now (nvidia-smi's compute apps); None without nvidia-smi."""
    out = _smi("--query-compute-apps=pid", "--format=csv,noheader")
    return None if out is None else len([x for x in out.split() if x.strip().isdigit()])


def gpu_used_mib() -> int | None:
    """GPU memory in use now, summed over the visible GPUs (every process on them); None without nvidia-smi."""
    out = _smi("--query-gpu=memory.used", "--format=csv,noheader,nounits")
    try:
        return None if out is None else sum(int(x) for x in out.split())
    except ValueError:
        return None


# What the level shifts could come from (issue 18: the same config moved between sessions):
# clocks, power, temperature and throttle reasons, read before and after every timed pass.
# nvidia-smi names, not pynvml: no extra package on the GPU host. Drivers since 535 call the
# throttle reasons "clocks_event_reasons"; older ones only "clocks_throttle_reasons".
GPU_STATE_FIELDS = ("clocks.sm", "clocks.mem", "power.draw", "temperature.gpu", "utilization.gpu", "pstate",
                    "clocks_event_reasons.active")
GPU_STATE_KEYS = ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temperature_c", "utilization_pct", "pstate",
                  "throttle_reasons")
# Bits of clocks_event_reasons that mean the GPU slowed itself (idle and app-clock settings are not
# slowdowns): SW power cap, HW slowdown, SW thermal, HW thermal, HW power brake.
THROTTLE_BITS = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal",
                 0x80: "hw_power_brake"}


def _num(x: str):
    try:
        return float(x)
    except ValueError:
        return None


def parse_gpu_state(line: str) -> dict:
    """One nvidia-smi CSV line (GPU_STATE_FIELDS order, nounits) -> the state dict of a record."""
    parts = [p.strip() for p in line.split(",")]
    out = dict(zip(GPU_STATE_KEYS, parts + [None] * (len(GPU_STATE_KEYS) - len(parts))))
    for k in ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temperature_c", "utilization_pct"):
        out[k] = _num(out[k]) if out[k] is not None else None
    raw = out["throttle_reasons"]
    try:
        bits = int(raw, 16) if raw else None
    except ValueError:
        bits = None
    out["throttle_reasons"] = raw
    out["slowdowns"] = sorted(n for b, n in THROTTLE_BITS.items() if bits is not None and bits & b)
    return out


def gpu_state() -> dict | None:
    """Clocks, power, temperature, throttle reasons of GPU 0 now, GPU processes and host load; None
    without nvidia-smi (a CPU host records only the host part through host_load). On a host of several
    GPUs, `per_gpu` holds each one's state too: a TP or DP server spans them all, and a neighbour may
    sit on any."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    out = None
    for fields in (GPU_STATE_FIELDS, GPU_STATE_FIELDS[:-1] + ("clocks_throttle_reasons.active",)):
        try:
            r = subprocess.run([smi, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if r.returncode == 0 and r.stdout.strip():
            lines = r.stdout.strip().splitlines()
            out = parse_gpu_state(lines[0])
            if len(lines) > 1:
                out["per_gpu"] = [parse_gpu_state(line) for line in lines]
            break
    if out is None:
        return None
    out["gpu_processes"] = gpu_compute_processes()
    return out


def host_load() -> dict:
    """Host CPU load now: the speculating decode path is host-bound, so a busy host can move it."""
    try:
        load1 = round(os.getloadavg()[0], 2)
    except OSError:
        load1 = None
    return {"loadavg_1m": load1, "cpus": os.cpu_count() or 1}


CPU_TICK_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def cpu_counters() -> dict:
    """The host's CPU time so far by state (/proc/stat's first line, clock ticks) and the microseconds in which some
    runnable task waited for a CPU (/proc/pressure/cpu, "some total"); None where the kernel has neither.

    Why: read before and after a timed pass, their differences say whether the hypervisor gave this guest's CPUs to
    another (steal) or tasks queued for a CPU while the pass ran. The speculating step is host-bound, and on an H200
    its per-request TPOT fell into two modes, ~20% apart, each lasting seconds, while the GPU's clocks stayed at
    their maximum (session 20261129T2159Z); nothing recorded said what the host was doing then."""
    out: dict = {"cpu_ticks": None, "cpu_pressure_some_us": None, "cpu_t": round(time.time(), 4)}
    try:
        with open("/proc/stat") as f:
            head = f.readline().split()
        if head and head[0] == "cpu":
            out["cpu_ticks"] = dict(zip(CPU_TICK_FIELDS, (int(x) for x in head[1:1 + len(CPU_TICK_FIELDS)])))
    except (OSError, ValueError):
        pass
    try:
        with open("/proc/pressure/cpu") as f:
            for line in f:
                if line.startswith("some "):
                    out["cpu_pressure_some_us"] = int(line.rsplit("total=", 1)[1])
    except (OSError, ValueError, IndexError):
        pass
    return out


def cpu_shares(before: dict, after: dict) -> dict:
    """Percent of the CPU time between two conditions() readings that the hypervisor took (steal_pct), and percent
    of the wall time in which some task waited for a CPU (cpu_pressure_pct); None where either reading lacks it."""
    hb, ha = before.get("host") or {}, after.get("host") or {}
    out = {"steal_pct": None, "cpu_pressure_pct": None}
    tb, ta = hb.get("cpu_ticks"), ha.get("cpu_ticks")
    if tb and ta:
        total = sum(ta.get(k, 0) - tb.get(k, 0) for k in CPU_TICK_FIELDS)
        if total > 0:
            out["steal_pct"] = round(100.0 * (ta.get("steal", 0) - tb.get("steal", 0)) / total, 2)
    pb, pa = hb.get("cpu_pressure_some_us"), ha.get("cpu_pressure_some_us")
    # the counters' own clock where the reading has it: conditions()'s "t" precedes nvidia-smi's tens of milliseconds
    wall = (ha.get("cpu_t") or after.get("t") or 0) - (hb.get("cpu_t") or before.get("t") or 0)
    if pb is not None and pa is not None and wall > 0:
        out["cpu_pressure_pct"] = round(min(100.0, (pa - pb) / (wall * 1e4)), 2)
    return out


def conditions() -> dict:
    """What a timed pass ran under, read now: the GPU's state (None on a CPU host), the host's load and its CPU
    counters (cpu_counters; cpu_shares turns two readings into shares of the pass), and one timing of the
    python_loop_ms loop (one run, ~10-20 ms: the host's single-thread speed now; a host-bound step moves with it, and
    session 20261206T1931Z's H100 host read 16.98 and 8.93 ms minutes apart)."""
    return {"t": round(time.time(), 3), "gpu": gpu_state(),
            "host": {**host_load(), **cpu_counters(), "python_loop_ms": python_loop_ms(runs=1)}}


@functools.cache
def host_facts() -> dict:
    """A stable id of this machine (records from different machines are never compared): sha256 of
    /etc/machine-id, else of the hostname; the boot id tells two boots of one machine apart. Also the CPU's model and
    python_loop_ms: at low acceptance a speculating step can be bound by the engine's Python, and GPU hosts of one kind
    differ there (session 20261206T0237Z's H100 ran vLLM's scheduler code slower than 20261205T1617Z's)."""
    import hashlib
    read = lambda p: (open(p).read().strip() if os.path.exists(p) else "")
    mid = read("/etc/machine-id") or _platform.node()
    return {"id": hashlib.sha256(mid.encode()).hexdigest()[:16], "boot_id": read("/proc/sys/kernel/random/boot_id") or None,
            "hostname": _platform.node(), "cpu_model": cpu_model(), "python_loop_ms": python_loop_ms(), **host_load()}


def python_loop_ms(n: int = 100_000, runs: int = 3) -> float:
    """The best of `runs` timings of one fixed single-threaded Python loop (dict, list and attribute work, the kind an
    engine's scheduler does a step), in ms: a figure to tell a slow host from a fast one across records, not a
    benchmark of anything served. Lower is faster; it depends on the interpreter too (a record names its version)."""
    class Req:
        __slots__ = ("i", "n")

        def __init__(self, i):
            self.i, self.n = i, 0
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        table, queue = {}, []
        for i in range(n):
            r = table.get(i & 255)
            if r is None:
                r = table[i & 255] = Req(i)
            r.n += 1
            queue.append(r.i)
            if len(queue) > 64:
                queue.clear()
        best = min(best, (time.perf_counter() - t) * 1000)
    return round(best, 2)


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


# -- device-name shim (sitecustomize.py -> scripts/patches/device_name.py) ---------------------------
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
