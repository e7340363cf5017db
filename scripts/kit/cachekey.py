"""The baked compile cache's manifest: what vLLM's cache key depends on, and whether this host matches.

`make bake` writes weights/cache/<variant>/kit-cache-manifest.json (schemas/cache_manifest.schema.json)
after a server has filled the cache; `make serve` and `make verify-cache` compare it with this host.
The key inputs are the ones ../shared/notes/vllm-0.26.md §6 lists as hashed or checked at load:
Python x.y.z, torch, CUDA, triton, vLLM version and install path (sources are hashed by path), the
model path string, every VLLM_* value in the server env, the flags, the speculative method and K
(vLLM's key misses K: vllm#53366), and the GPU name torch reports plus its compute capability.

No torch/vLLM import here: versions come from package metadata and torch/version.py, so a serve
start pays milliseconds for the check.

    from scripts.kit.cachekey import check_manifest, describe_cache
    ok, reason = check_manifest(variant)     # (False, "no baked cache ...") / (True, "baked cache matches ...")
    print(describe_cache(variant))            # one line for `make serve`
"""
from __future__ import annotations

import ast
import hashlib
import importlib.metadata as md
import importlib.util
import json
import os
import platform as _platform
import re
from pathlib import Path

from .device import baked_cc, cpu_model, gpu_facts, host_platform, shim_decision
from .errors import KitError
from .paths import rel as _rel

MANIFEST_NAME = "kit-cache-manifest.json"
# Besides every VLLM_*: variables vLLM hashes (CUDA_HOME, NVCC_THREADS, VERBOSE are registered in
# vllm/envs.py) or that decide where the other caches live.
KEY_ENV = ("CUDA_HOME", "NVCC_THREADS", "VERBOSE", "TRITON_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE",
           "TORCHINDUCTOR_CACHE_DIR", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
# Recorded but not compared: vLLM keeps them out of its env hash (envs.compile_factors) and they
# say where or how to run, not what was compiled.
UNHASHED_ENV = frozenset({
    "VLLM_CACHE_ROOT", "VLLM_PORT", "VLLM_HOST_IP", "VLLM_FORCE_AOT_LOAD", "VLLM_NO_USAGE_STATS",
    "VLLM_DO_NOT_TRACK", "VLLM_USAGE_STATS_SERVER", "VLLM_SERVER_DEV_MODE", "VLLM_LOG_STATS_INTERVAL",
    "VLLM_LOGGING_LEVEL", "VLLM_LOGGING_PREFIX", "VLLM_LOGGING_STREAM", "VLLM_LOGGING_CONFIG_PATH",
    "VLLM_LOGGING_COLOR", "VLLM_ENABLE_STARTUP_PLAN", "VLLM_CPU_KVCACHE_SPACE", "VLLM_RPC_BASE_PATH",
    "VLLM_ENGINE_ITERATION_TIMEOUT_S", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "VLLM_WORKER_MULTIPROC_METHOD",
    "VLLM_ENABLE_V1_MULTIPROCESSING", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
})
# Flags that say where the server listens and under which name (not in any compile key), and
# --model, compared on its own as model_path. FlashInfer's autotune at warm-up: vLLM 0.26 keeps
# enable_flashinfer_autotune out of KernelConfig.compute_hash (vllm/config/kernel.py), so a cache baked with it
# on serves a start with it off. --chat-template-content-format is the API server's own (FrontendArgs in
# vllm/entrypoints/openai/cli_args.py), not in VllmConfig, so not in any compile key.
UNHASHED_FLAGS = {"--host": 1, "--port": 1, "--served-model-name": 1, "--model": 1,
                  "--enable-flashinfer-autotune": 0, "--no-enable-flashinfer-autotune": 0,
                  "--chat-template-content-format": 1}
# Path components of compile artifacts (Inductor/AOT tree, Triton, FlashInfer JIT); a warm start
# that adds a file under one of these compiled something.
COMPILE_DIRS = ("torch_compile_cache", "torch_aot_compile", "inductor_cache", "triton", "triton_cache", "flashinfer")
SCRATCH_SUFFIXES = (".lock", ".tmp")
# Where torch.compile's own products live (category() of a path under the cache root).
GRAPH_DIRS = ("torch_compile_cache", "torch_aot_compile", "inductor_cache")


# -- key inputs ------------------------------------------------------------------------------
def _dist_version(*names: str) -> str | None:
    for n in names:
        try:
            return md.version(n)
        except md.PackageNotFoundError:
            continue
    return None


def _package_dir(name: str) -> str | None:
    """Install directory of a top-level package, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    locs = list(spec.submodule_search_locations or [])
    return str(Path(locs[0]).resolve()) if locs else (str(Path(spec.origin).resolve().parent) if spec.origin else None)


def torch_cuda_version() -> str | None:
    """torch.version.cuda read from torch/version.py (importing torch costs seconds)."""
    d = _package_dir("torch")
    if not d:
        return None
    try:
        for line in (Path(d) / "version.py").read_text().splitlines():
            m = re.match(r"^cuda\s*(?::[^=]+)?=\s*(.+)$", line)
            if m:
                return ast.literal_eval(m.group(1).strip())
    except (OSError, ValueError, SyntaxError):
        pass
    return None


def versions() -> dict:
    return {"python": _platform.python_version(), "vllm": _dist_version("vllm", "vllm-cpu"),
            "torch": _dist_version("torch"), "cuda": torch_cuda_version(), "triton": _dist_version("triton"),
            "transformers": _dist_version("transformers"), "flashinfer": _dist_version("flashinfer-python")}


def key_env(env: dict) -> dict:
    """The part of a server environment that reaches a compile key or a cache location."""
    return {k: env[k] for k in sorted(env) if k.startswith(("VLLM_", "TORCHINDUCTOR_")) or k in KEY_ENV}


def key_flags(argv: list[str]) -> list[str]:
    """Server flags (argv after `python -m module`) minus where it listens and under which name."""
    out, skip = [], 0
    for tok in argv[3:]:
        if skip:
            skip -= 1
            continue
        if tok in UNHASHED_FLAGS:
            skip = UNHASHED_FLAGS[tok]
            continue
        out.append(tok)
    return out


def presented_gpu(env: dict) -> dict:
    """The device as torch will report it in the server: NVML facts, with the shim applied if it acts."""
    gpus = gpu_facts()
    if not gpus:
        return {"kind": "cpu", "name": cpu_model(), "compute_capability": None, "nvml_name": None}
    g = gpus[0]
    name, shim = g["name"], env.get("KIT_DEVICE_NAME")
    if shim:
        cc, _ = baked_cc(shim, env.get("KIT_DEVICE_CC"))
        act, _line = shim_decision(shim, cc, g["name"], g["compute_capability"])
        name = shim if act else name
    return {"kind": "gpu", "name": name, "compute_capability": g["compute_capability"], "nvml_name": g["name"]}


def server_env(variant, platform: str) -> dict:
    """What the server process sees: this process's environment overlaid with Variant.to_env()."""
    return {**os.environ, **variant.to_env(platform)}


def key_inputs(variant, platform: str | None = None, argv: list[str] | None = None, env: dict | None = None) -> dict:
    platform = platform or host_platform()
    argv = argv if argv is not None else variant.to_argv(platform)
    env = env if env is not None else server_env(variant, platform)
    return {
        "versions": versions(),
        "vllm_path": _package_dir("vllm"),
        "model_path": str(variant.weights_dir),
        # STANDBY_CACHE=variant (scripts/patches/sleep_key.py): sleep mode is out of vLLM's key, so out of ours
        "flags": [f for f in key_flags(argv) if not (f == "--enable-sleep-mode" and env.get("KIT_SLEEP_KEY") == "1")],
        "env": key_env(env),
        "speculative": {"method": variant["SPEC_METHOD"], "k": variant["SPEC_K"]},
        "gpu": presented_gpu(env),
    }


def _compared(key: dict) -> dict:
    """The subset of the key inputs that must be equal for a hit (what key_sha256 hashes)."""
    return {**key, "env": {k: v for k, v in key["env"].items() if k not in UNHASHED_ENV},
            "gpu": {k: key["gpu"].get(k) for k in ("kind", "name", "compute_capability")}}


def key_sha256(key: dict) -> str:
    return hashlib.sha256(json.dumps(_compared(key), sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def differences(baked: dict, now: dict) -> list[str]:
    """Human reasons why `now` would miss a cache baked under `baked`, most decisive first."""
    b, n = _compared(baked), _compared(now)
    out = []
    if b["gpu"] != n["gpu"]:
        bg, ng = b["gpu"], n["gpu"]
        why = f"GPU differs: baked on {bg['name']!r} ({bg['compute_capability']}), here {ng['name']!r} ({ng['compute_capability']})"
        if bg["compute_capability"] == ng["compute_capability"] and bg["name"] != ng["name"] and ng["kind"] == "gpu":
            why += f"; same compute capability, so KIT_DEVICE_NAME={bg['name']!r} presents the baked name"
        out.append(why)
    for k in sorted(set(b["versions"]) | set(n["versions"])):
        if b["versions"].get(k) != n["versions"].get(k):
            out.append(f"{k} version differs: baked {b['versions'].get(k)}, here {n['versions'].get(k)}")
    for k in ("vllm_path", "model_path"):
        if b[k] != n[k]:
            out.append(f"{k} differs (vLLM hashes the path string): baked {b[k]}, here {n[k]}")
    if b["speculative"] != n["speculative"]:
        out.append(f"speculation differs: baked {b['speculative']}, here {n['speculative']}")
    if b["flags"] != n["flags"]:
        gone = [f for f in b["flags"] if f not in n["flags"]]
        new = [f for f in n["flags"] if f not in b["flags"]]
        out.append(f"flags differ: baked-only {gone or '(order)'}, here-only {new or '(order)'}")
    for k in sorted(set(b["env"]) | set(n["env"])):
        if b["env"].get(k) != n["env"].get(k):
            out.append(f"env {k} differs: baked {b['env'].get(k)!r}, here {n['env'].get(k)!r}")
    return out


# -- artifacts -------------------------------------------------------------------------------
def snapshot(root: Path) -> dict[str, int]:
    """{relative path: bytes} of every file under root except the manifest itself."""
    out = {}
    if not root.is_dir():
        return out
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            rel = str(p.relative_to(root))
            if rel == MANIFEST_NAME:
                continue
            try:
                out[rel] = p.stat().st_size
            except OSError:
                continue
    return dict(sorted(out.items()))


def is_compile_artifact(rel: str) -> bool:
    parts = Path(rel).parts
    return any(p in COMPILE_DIRS for p in parts) and not rel.endswith(SCRATCH_SUFFIXES)


def is_graph_artifact(rel: str) -> bool:
    """A torch.compile product (graph, AOT artifact, Inductor code): one appearing on a warm start is
    a compile-cache miss. Triton/FlashInfer kernel files may be JIT-written and are only reported."""
    return is_compile_artifact(rel) and category(rel) in GRAPH_DIRS


def category(rel: str) -> str:
    """Coarse bucket for sizes in records: the first path component under the cache root."""
    return Path(rel).parts[0] if len(Path(rel).parts) > 1 else "(top)"


def by_category(snap: dict[str, int]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for rel, size in snap.items():
        c = out.setdefault(category(rel), {"files": 0, "bytes": 0})
        c["files"] += 1
        c["bytes"] += size
    return dict(sorted(out.items()))


def new_artifacts(before: dict[str, int], after: dict[str, int]) -> list[str]:
    """Compile artifacts that appeared or grew between two snapshots."""
    return [r for r, s in after.items() if is_compile_artifact(r) and (r not in before or s > before[r])]


# -- manifest --------------------------------------------------------------------------------
def manifest_path(variant) -> Path:
    return variant.cache_root / MANIFEST_NAME


def build_manifest(variant, key: dict, snap: dict[str, int], bake: dict, utc: str) -> dict:
    doc = {
        "schema_version": 1, "variant": variant.name, "config_sha256": variant.config_sha256,
        "baked_utc": utc, "key": key, "key_sha256": key_sha256(key),
        "artifact_count": len(snap), "total_bytes": sum(snap.values()),
        "artifacts": [{"path": p, "bytes": s} for p, s in snap.items()],
        "bake": bake,
    }
    validate_manifest(doc, "new manifest")
    return doc


def validate_manifest(doc: dict, where: str) -> None:
    from .schema import first_error, json_path, load_schema
    err = first_error(doc, load_schema("cache_manifest.schema.json"))
    if err:
        raise KitError(f"{where}: {json_path(err)}: {err.message}")


def write_manifest(variant, doc: dict) -> Path:
    """Atomic: a reader sees the old manifest, no manifest, or the whole new one."""
    path = manifest_path(variant)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def load_manifest(variant) -> dict | None:
    path = manifest_path(variant)
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise KitError(f"{path}: not JSON ({e})") from None
    validate_manifest(doc, str(path))
    return doc


def check_manifest(variant, platform: str | None = None, argv=None, env=None) -> tuple[bool, str]:
    """(True, what will be used) when the baked cache fits this host and command, else (False, why not)."""
    path = manifest_path(variant)
    try:
        doc = load_manifest(variant)
    except KitError as e:
        return False, f"baked cache manifest is unreadable: {e}"
    if doc is None:
        return False, f"no baked cache ({_rel(path)} missing; run: make bake VARIANT={variant.name})"
    diffs = differences(doc["key"], key_inputs(variant, platform, argv, env))
    if diffs:
        more = f" (+{len(diffs) - 3} more)" if len(diffs) > 3 else ""
        return False, "baked cache does not match this host/command: " + "; ".join(diffs[:3]) + more
    missing = [a["path"] for a in doc["artifacts"] if not (variant.cache_root / a["path"]).is_file()]
    if missing:
        return False, f"{len(missing)} of {doc['artifact_count']} baked artifacts are missing, e.g. {missing[0]}"
    return True, (f"baked cache matches its manifest: {doc['artifact_count']} files, "
                  f"{doc['total_bytes'] / 2**20:.0f} MiB, baked {doc['baked_utc']} for {doc['key']['gpu']['name']}")


def describe_cache(variant, platform: str | None = None) -> str:
    """One line for `make serve`: which compile cache the server will use, why it will compile, or that
    it compiles nothing (--enforce-eager, as EAGER=auto gives every CPU host)."""
    if "--enforce-eager" in variant.to_argv(platform or host_platform()):
        return (f"compile cache: not used: the server runs --enforce-eager (EAGER={variant['EAGER']}, "
                f"{variant.sources.get('EAGER', 'default')}), so vLLM compiles nothing and captures no graphs")
    ok, reason = check_manifest(variant, platform)
    where = _rel(variant.cache_root)
    if ok:
        return f"compile cache: {where} ({reason})"
    return f"compile cache: {where}, not a baked hit: {reason}; vLLM compiles on start (cold)"
