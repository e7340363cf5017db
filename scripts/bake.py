"""`make bake` / `make verify-cache`: bake a variant's compile cache, prove a cold start hits it, export it.

bake (default): start the variant exactly as `make serve` does (same argv, env and per-variant
VLLM_CACHE_ROOT, which is emptied first so the start is an empty-cache one), send requests at every
concurrency up to max_num_seqs plus long prompts (graph sizes, compile ranges, shape-specialized
Triton kernels), stop, then write weights/cache/<v>/kit-cache-manifest.json (the key inputs and
every artifact; schemas/cache_manifest.schema.json) and a `bake` record with the cold start's
per-phase budget. The manifest is written last: a cache without one was never baked.

--verify: cold-start the server offline on the baked cache, drive the same requests, and record
(`startup` record) start-to-ready and start-to-first-token against the bake's empty-cache start.
A hit means: no new torch.compile file under the cache root (Triton/FlashInfer kernel files written
on the warm start are named in the verdict, not counted), no "Compiling a graph" line and a
"Directly load" line (VLLM_FORCE_AOT_LOAD=1 makes an AOT load failure fatal). `--expect miss`
records a deliberate miss (e.g. a different GPU name without the shim). The record is written
either way; exit 2 (with the verdict) if the result is not the expected one.

--export PATH: tar.gz of the baked cache root; extracting it at the repo root recreates
weights/cache/<variant>/ (the input of `make build-import`).

    python -m scripts.bake --variant qwen3-4b-awq --set WEIGHTS=dummy
    python -m scripts.bake --variant qwen3-4b-awq --set WEIGHTS=dummy --verify
    python -m scripts.bake --variant qwen3-4b-awq --set WEIGHTS=dummy --export cache_import.tar.gz
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from scripts.kit import bytecode, cachekey, procs, startup, weights
from scripts.kit.device import host_platform
from scripts.kit.errors import KitError, run_main
from scripts.kit.paths import RESULTS, ROOT
from scripts.kit.procs import ServerProcess, first_token_at, flock, gpu_lock_path
from scripts.kit.record import log_ref, make_record, utc_now, write_record
from scripts.kit.schema import validate_record
from scripts.kit.variant import load
from scripts.kit.paths import rel as _rel

# Startup markers in the order vLLM 0.26 logs them (../shared/notes/vllm-0.26.md §8). The time a
# marker first shows up closes its phase; phases that do not occur (eager: no compile, no graphs)
# are simply absent, and "until_ready" is what remains up to GET /health == 200.
PHASES = (
    ("python_imports", r"non-default args:|vLLM (?:API )?server version"),
    ("engine_start", r"Initializing a V1 LLM engine"),
    ("weights", r"Model loading took|Loading weights took"),
    ("torch_compile", r"torch\.compile (?:took|and initial profiling)"),
    ("kv_cache", r"KV cache size: [\d,]+ tokens|Available KV cache memory"),
    ("graph_capture", r"Graph capturing finished"),
    ("engine_init", r"init engine \(profile, create kv cache, warmup model\) took"),
    ("api_startup", r"Application startup complete"),
)
# vLLM's own figures (summed when a line repeats, e.g. once per compile range or for the drafter).
REPORTED = {
    "weights_load_s": r"Loading weights took ([\d.]+) seconds",
    "model_load_s": r"Model loading took .*? and ([\d.]+) seconds",
    "model_load_gib": r"Model loading took ([\d.]+) GiB",
    "dynamo_s": r"Dynamo bytecode transform time: ([\d.]+) s",
    "torch_compile_s": r"torch\.compile took ([\d.]+) s in total",
    "compile_range_compile_s": r"Compiling a graph for compile range .* takes ([\d.]+) s",
    "compile_range_load_s": r"Directly load the compiled graph\(s\) for compile range .* took ([\d.]+) s",
    "graph_capture_s": r"Graph capturing finished in ([\d.]+) secs",
    "graph_capture_gib": r"Graph capturing finished in .* took ([\d.]+) GiB",
    "engine_init_s": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s",
    "kv_cache_tokens": r"KV cache size: ([\d,]+) tokens",
}
COUNTS = {
    "graphs_compiled": r"Compiling a graph for compile range",
    "graphs_loaded": r"Directly load the compiled graph\(s\) for compile range",
    "aot_loaded": r"Directly load AOT compilation from path",
    "aot_load_failures": r"Compiling model again due to a load failure",
    "kernel_warmups": r"Warming up (?!model for the compilation)",
}


def log_counts(text: str) -> dict:
    """vLLM's own compile-cache lines in one start's server log, counted (COUNTS)."""
    return {key: len(re.findall(rx, text)) for key, rx in COUNTS.items()}


def log_verdict(c: dict) -> str:
    """What those counts say of the cache: "compiled" (a graph compiled or an AOT load failed), "hit" (loaded,
    compiled nothing) or "none" (neither: an eager server). The bake's verify also weighs the files a start added;
    `make standby` records this alone."""
    if c["graphs_compiled"] or c["aot_load_failures"]:
        return "compiled"
    return "hit" if c["aot_loaded"] or c["graphs_loaded"] else "none"


def cache_use(text: str) -> dict:
    """A standby record's `compile_cache`: the load and compile counts of its start's log, and their verdict."""
    c = log_counts(text)
    return {**{k: c[k] for k in ("aot_loaded", "graphs_loaded", "graphs_compiled", "aot_load_failures")},
            "verdict": log_verdict(c)}


# Token ids present in every vocabulary the kit serves (SmolLM2 49k, Qwen 151k/248k) and not special.
TOKEN_BASE, TOKEN_SPAN = 1000, 1000


class LogWatcher:
    """Timestamps the first appearance of each phase marker while the server starts (ServerProcess.on_wait)."""

    def __init__(self, path: Path):
        self.path, self.offset, self.at, self.buf = path, 0, {}, ""

    def poll(self, elapsed: float) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return
        self.offset += len(chunk)
        self.buf = (self.buf + chunk.decode(errors="replace"))[-1_000_000:]
        for name, rx in PHASES:
            if name not in self.at and re.search(rx, self.buf):
                self.at[name] = round(elapsed, 1)


def parse_phases(text: str, markers_at: dict, ready_s: float) -> dict:
    """The per-phase budget of one start: marker times, gaps between them, vLLM's figures, marker counts."""
    budget, prev = {}, 0.0
    for name, _ in PHASES:
        if name in markers_at:
            t = max(markers_at[name], prev)
            budget[name] = round(t - prev, 1)
            prev = t
    budget["until_ready"] = round(max(ready_s - prev, 0.0), 1)
    reported = {}
    for key, rx in REPORTED.items():
        vals = [float(m.group(1).replace(",", "")) for m in re.finditer(rx, text)]
        if vals:
            reported[key] = vals[0] if key.endswith(("_tokens", "_gib")) else round(sum(vals), 3)
    counts = log_counts(text)
    return {"markers_at_s": dict(markers_at), "budget_s": budget, "reported": reported, "counts": counts}


# -- requests --------------------------------------------------------------------------------
def prompt(n: int, seed: int) -> list[int]:
    """n token ids; a different seed gives a different prompt (no accidental prefix-cache hits)."""
    return [TOKEN_BASE + (i * 7 + seed * 131) % TOKEN_SPAN for i in range(n)]


def complete(url: str, model: str, ids: list[int], max_tokens: int, timeout: float = 600) -> bool:
    import requests
    r = requests.post(url + "/v1/completions", timeout=timeout, json={
        "model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True, "min_tokens": max_tokens})
    return r.status_code == 200


def plan_shapes(max_model_len: int, max_seqs: int) -> list[dict]:
    """Request groups that reach every decode batch size and the large compile range.

    Concurrency 1, 2, 4, ... up to max_seqs (the CUDA-graph sizes are batch x (1+K) tokens), a long
    prompt near max_model_len (chunked prefill, the large compile range, long-sequence Triton
    kernels), the same prompt again (prefix-cache hit path), and several prefills in one batch.
    """
    levels = sorted({c for c in (1, 2, 4, 8, 16, 32, 64, 128, 256) if c <= max_seqs} | {max_seqs})
    long_len = max(16, min(max_model_len - 64, 8192))
    shapes = [{"name": f"decode-c{c}", "concurrency": c, "prompt_tokens": 16, "max_tokens": 16 if c == 1 else 8}
              for c in levels]
    shapes += [{"name": "long-prefill", "concurrency": 1, "prompt_tokens": long_len, "max_tokens": 4, "same": True},
               {"name": "long-prefill-repeat", "concurrency": 1, "prompt_tokens": long_len, "max_tokens": 4, "same": True},
               {"name": "prefill-batch", "concurrency": min(4, max_seqs), "prompt_tokens": min(long_len, 1024),
                "max_tokens": 8}]
    return shapes


def drive(url: str, model: str, shapes: list[dict]) -> tuple[list[dict], int, int]:
    """Send each shape's requests concurrently; returns per-shape results, requests sent, failures."""
    out, sent, failed = [], 0, 0
    for i, s in enumerate(shapes):
        seeds = [1000] * s["concurrency"] if s.get("same") else [i * 1000 + j + 1 for j in range(s["concurrency"])]
        t = time.perf_counter()
        with ThreadPoolExecutor(max_workers=s["concurrency"]) as pool:
            ok = sum(pool.map(lambda seed: complete(url, model, prompt(s["prompt_tokens"], seed), s["max_tokens"]), seeds))
        sent += s["concurrency"]
        failed += s["concurrency"] - ok
        out.append({k: s[k] for k in ("name", "concurrency", "prompt_tokens", "max_tokens")} |
                   {"wall_ms": round((time.perf_counter() - t) * 1e3, 1), "ok": ok})
    return out, sent, failed


def server_limits(url: str, v, platform: str, cap: int | None) -> tuple[int, int]:
    """(max_model_len as the server reports it, concurrency ceiling for the warm-up)."""
    import requests
    models = requests.get(url + "/v1/models", timeout=30).json()["data"]
    max_len = int(models[0].get("max_model_len") or v.config.get("SERVE_MAX_MODEL_LEN") or 2048)
    seqs = int(v.config.get("SERVE_MAX_NUM_SEQS") or (256 if platform == "gpu" else 8))
    return max_len, max(1, min(seqs, cap or (64 if platform == "gpu" else 8)))


# -- one start -------------------------------------------------------------------------------
def run_server(v, argv, env, log: Path, cap: int | None, platform: str) -> dict:
    """Start, time ready and first token, drive every shape, stop. Everything bake and verify measure.
    The start is traced from inside the server (KIT_STARTUP_TRACE, scripts/patches/startup_trace.py); the raw
    events are kept beside the log and reduced into `trace` (scripts/kit/startup.py)."""
    import tempfile
    watcher = LogWatcher(log)
    tdir = Path(tempfile.mkdtemp(prefix="kit-start-trace-"))
    env = dict(env, KIT_STARTUP_TRACE=str(tdir))
    srv = ServerProcess(argv, env, v["HOST"], v["PORT"], v["READY_TIMEOUT_S"], log_path=log, on_wait=watcher.poll)
    try:
        with srv.shown(f"starting {v.name}"):
            watcher.poll(srv.ready_s)
            print(f"ready after {srv.ready_s:.1f} s; sending warm-up requests", file=sys.stderr)
            # The warm-up compiles shapes on the GPU as a start-up does: it holds the GPU lock shared too.
            with flock(gpu_lock_path(), shared=True):
                at = first_token_at(srv.url, v.name, prompt(16, 0))
                first = round(at - srv.t0, 2) if at else None
                max_len, seqs = server_limits(srv.url, v, platform, cap)
                t = time.perf_counter()
                shapes, sent, failed = drive(srv.url, v.name, plan_shapes(max_len, seqs))
                wall = round(time.perf_counter() - t, 2)
        tr = startup.reduce(tdir, srv.t0_wall, srv.t0_wall + srv.ready_s, srv.t0_wall + first if first else None)
        raw = log.with_name(log.stem + ".trace.jsonl")
        startup.keep_raw(tdir, raw)
    finally:
        shutil.rmtree(tdir, ignore_errors=True)
    print("where the start went (from inside the server):\n" + startup.text(tr), file=sys.stderr)
    text = log.read_text(errors="replace")
    return {"ready_s": round(srv.ready_s, 2), "first_token_s": first, "shapes": shapes, "sent": sent + 1,
            "failed": failed, "wall_s": wall, "phases": parse_phases(text, watcher.at, srv.ready_s),
            "trace": dict(tr, raw=log_ref(raw))}


def _log_path(v, what: str) -> Path:
    return RESULTS / v.name / "logs" / f"{what}-{time.strftime('%Y%m%dT%H%M%S')}.log"


def _is_eager(argv: list[str]) -> bool:
    return "--enforce-eager" in argv or "-O0" in argv


def settle_start(v, platform: str, argv, env, cap: int | None) -> tuple[dict, dict]:
    """A second start on the cache the cold start left, driven alike; returns (its figures, the snapshot after it).

    Why: a warm start can compile what the cold start compiled elsewhere. By vLLM 0.26's code, TORCHINDUCTOR_CACHE_DIR
    is set process-wide to the directory of the last model compiled or loaded, and the two paths set different ones:
    compiling sets the compile directory's (compilation/compiler_interface.py), loading the AOT hash directory's
    (compilation/decorators.py). The files the misses added sit in the drafter's AOT hash directory. A
    torch.compile'd function outside the model, such as vLLM 0.26's update_num_computed_tokens_for_batch_change
    (MTP), is compiled on first use into whichever one that is. The first warm start after each of three bakes of
    Qwen3.5 + MTP added files (2, 13 and 14: results/qwen3.5-4b-bf16-tuned-dvg-quick/20261126T200918Z,
    20261127T013127Z, 20261127T082425Z-startup.json), the later two that function's kernel, and every later start
    hit. Run once more here, and the manifest lists what warm starts look for. Not yet confirmed on a GPU."""
    before = cachekey.snapshot(v.cache_root)
    log = _log_path(v, "settle")
    print(f"settle: a warm start on the new cache, as `make verify-cache` will make (log: {_rel(log)})", file=sys.stderr)
    run = run_server(v, argv, env, log, cap, platform)
    if run["failed"]:
        raise KitError(f"settle start: {run['failed']} of {run['sent']} requests failed; no manifest written (log: {_rel(log)})")
    after = cachekey.snapshot(v.cache_root)
    new = cachekey.new_artifacts(before, after)
    print(f"settle: {len(new)} file(s) added by the warm start" + (f", e.g. {new[0]}" if new else ""), file=sys.stderr)
    return ({"ready_s": run["ready_s"], "first_token_s": run["first_token_s"], "new_artifacts": len(new),
             "new_graph_artifacts": sum(map(cachekey.is_graph_artifact, new)), "new_artifact_sample": new[:20],
             "log": log_ref(log)}, after)


def bake(v, platform: str, argv, env, cap: int | None, compile_bytecode: bool = True, settle: bool | None = None) -> int:
    weights.require(v)
    code = None
    if compile_bytecode:
        # Before the cold start, so neither it nor any later start compiles Python source.
        print("bytecode: checking the server interpreter's packages", file=sys.stderr)
        code = bytecode.ensure(argv[0], {**os.environ, **env})
        print(f"bytecode: compiled {code['compiled']} package(s)/module(s) lacking it in {code['seconds']} s"
              + ("" if code["ok"] else f" (some files failed: {code.get('error', 'see compileall')})"), file=sys.stderr)
    root = v.cache_root
    # An empty cache makes this start the cold reference and the artifact list exactly this bake's.
    cachekey.manifest_path(v).unlink(missing_ok=True)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    started, log = time.time(), _log_path(v, "bake")
    print(f"baking {_rel(root)} (log: {_rel(log)})", file=sys.stderr)
    run = run_server(v, argv, env, log, cap, platform)
    if run["failed"]:
        raise KitError(f"{run['failed']} of {run['sent']} warm-up requests failed; no manifest written (log: {_rel(log)})")
    snap = cachekey.snapshot(root)
    settled = None
    if (not _is_eager(argv)) if settle is None else settle:  # eager compiles nothing: nothing to settle
        settled, snap = settle_start(v, platform, argv, env, cap)
    key = cachekey.key_inputs(v, platform, argv, env)
    manifest = cachekey.build_manifest(v, key, snap, {"cold_ready_s": run["ready_s"], "cold_first_token_s": run["first_token_s"],
                                                      "requests": run["sent"], "log": _rel(log)}, utc_now())
    triton = env.get("TRITON_CACHE_DIR")
    payload = {
        "cold": {"ready_s": run["ready_s"], "first_token_s": run["first_token_s"]},
        "phases": run["phases"], "trace": run["trace"],
        "warmup": {"requests": run["sent"], "failed": run["failed"], "wall_s": run["wall_s"], "shapes": run["shapes"]},
        "cache": {"root": _rel(root), "manifest": _rel(cachekey.manifest_path(v)), "key_sha256": manifest["key_sha256"],
                  "artifact_count": manifest["artifact_count"], "total_bytes": manifest["total_bytes"],
                  "by_category": cachekey.by_category(snap), "triton_cache_dir": triton,
                  "triton_in_cache_root": bool(triton) and Path(triton).resolve().is_relative_to(root.resolve())},
        "argv": argv, "log": log_ref(log),
    }
    if code is not None:
        payload["bytecode"] = code
    if settled is not None:
        payload["settle"] = settled
    rec = make_record("bake", v, payload, started=started, server_argv=argv, server_env=env)
    validate_record(rec, "new bake record")  # before the manifest: a bad record must not leave a "baked" cache
    path = cachekey.write_manifest(v, manifest)
    rec_path = write_record(rec, RESULTS)
    from scripts.report import refresh_after_write
    refresh_after_write(rec_path)  # the bake summary in measurements.json includes this record now
    if not payload["cache"]["triton_in_cache_root"]:
        print("warning: TRITON_CACHE_DIR is not under the cache root; Triton kernels JIT-compiled outside "
              "Inductor (e.g. Qwen3.5's GDN kernels) are not in this bake", file=sys.stderr)
    print(f"baked: {manifest['artifact_count']} files, {manifest['total_bytes'] / 2**20:.1f} MiB; cold start "
          f"{run['ready_s']} s to ready, {run['first_token_s']} s to first token\nmanifest: {_rel(path)}\n"
          f"record: {_rel(rec_path)}", file=sys.stderr)
    return 0


def verify(v, platform: str, argv, env, cap: int | None, expect: str, force_aot: bool | None) -> int:
    weights.require(v)
    doc = cachekey.load_manifest(v)
    if doc is None:
        raise KitError(f"no baked cache for {v.name} ({_rel(cachekey.manifest_path(v))} missing; run: make bake VARIANT={v.name})")
    ok, reason = cachekey.check_manifest(v, platform, argv, env)
    print(("manifest matches: " if ok else "manifest MISMATCH: ") + reason, file=sys.stderr)
    eager = _is_eager(argv)
    force_aot = (expect == "hit" and not eager) if force_aot is None else force_aot
    env = dict(env, VLLM_FORCE_AOT_LOAD="1") if force_aot else dict(env)  # not in vLLM's env hash
    before = cachekey.snapshot(v.cache_root)
    started, log = time.time(), _log_path(v, "verify")
    try:
        run = run_server(v, argv, env, log, cap, platform)
    except KitError as e:
        raise KitError(f"{e}\n(with VLLM_FORCE_AOT_LOAD=1 an AOT load failure stops the server: that is a miss)"
                       if force_aot else str(e)) from None
    new = cachekey.new_artifacts(before, cachekey.snapshot(v.cache_root))
    c = run["phases"]["counts"]
    # torch.compile products decide hit/miss; a kernel file (Triton/FlashInfer JIT) written on a warm
    # start is named in the verdict but is not a compile-cache miss (the baked graphs still loaded).
    new_graphs = [r for r in new if cachekey.is_graph_artifact(r)]
    new_kernels = [r for r in new if r not in new_graphs]
    compiled = bool(new_graphs) or log_verdict(c) == "compiled"
    if eager:
        hit = None
        passed = expect == "hit" and not new
        verdict = "eager: nothing to compile" + ("" if not new else f", yet {len(new)} compile artifacts appeared")
    else:
        hit = not compiled and log_verdict(c) == "hit"
        passed = hit == (expect == "hit")
        verdict = (f"hit: loaded {c['aot_loaded']} AOT artifact(s) and {c['graphs_loaded']} graph(s), compiled no graph"
                   if hit else f"miss: {len(new_graphs)} new compile-cache files, {c['graphs_compiled']} graph compiles, "
                   f"{c['aot_load_failures']} AOT load failures")
        if new_kernels:
            verdict += f"; {len(new_kernels)} kernel file(s) written: {', '.join(new_kernels[:3])}"
    cold = {"ready_s": doc["bake"]["cold_ready_s"], "first_token_s": doc["bake"]["cold_first_token_s"]}
    warm = {"ready_s": run["ready_s"], "first_token_s": run["first_token_s"], "health_poll_s": procs.HEALTH_POLL_S}

    def ratio(a, b):
        return round(a / b, 2) if a and b else None
    payload = {
        "expected": expect, "cache_hit": hit, "passed": passed, "verdict": verdict,
        "manifest_ok": ok, "manifest_reason": reason, "cold": cold, "warm": warm,
        "speedup_ready_x": ratio(cold["ready_s"], warm["ready_s"]),
        "speedup_first_token_x": ratio(cold["first_token_s"], warm["first_token_s"]),
        "new_artifacts": len(new), "new_artifact_sample": new[:20], "phases": run["phases"], "trace": run["trace"],
        "force_aot_load": force_aot, "shim_name": env.get("KIT_DEVICE_NAME"), "argv": argv, "log": log_ref(log),
    }
    rec_path = write_record(make_record("startup", v, payload, started=started, server_argv=argv, server_env=env),
                            RESULTS)
    from scripts.report import refresh_after_write
    refresh_after_write(rec_path)  # the startup summary in measurements.json includes this record now
    print(f"{verdict}\ncold {cold['ready_s']} s -> warm {warm['ready_s']} s to ready ({payload['speedup_ready_x']}x); "
          f"first token {cold['first_token_s']} s -> {warm['first_token_s']} s\nrecord: {_rel(rec_path)}", file=sys.stderr)
    if not passed:
        raise KitError(f"cache verification failed: expected a {expect}, got: {verdict}")
    return 0


def export(v, dest: Path) -> int:
    """tar.gz whose members are weights/cache/<variant>/...: extract at the repo root to install it."""
    doc = cachekey.load_manifest(v)
    if doc is None:
        raise KitError(f"nothing to export: {v.name} has no baked cache (run: make bake VARIANT={v.name})")
    missing = [a["path"] for a in doc["artifacts"] if not (v.cache_root / a["path"]).is_file()]
    if missing:
        raise KitError(f"baked cache of {v.name} is incomplete ({len(missing)} files missing, e.g. {missing[0]}); re-bake")
    dest = dest.resolve()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    arc = str(v.cache_root.resolve().relative_to(ROOT))
    try:
        with tarfile.open(tmp, "w:gz", compresslevel=6) as tar:
            tar.add(v.cache_root, arcname=arc)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    print(f"exported {arc}/ ({doc['artifact_count']} files, {doc['total_bytes'] / 2**20:.1f} MiB) to {dest} "
          f"({dest.stat().st_size / 2**20:.1f} MiB); extract at the repo root", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    from scripts.serve import add_variant_args
    p = argparse.ArgumentParser(prog="make bake", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_variant_args(p)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--verify", action="store_true", help="cold-start on the baked cache and prove it was hit")
    mode.add_argument("--export", type=Path, metavar="PATH", help="write the baked cache as a tar.gz (extract at the repo root)")
    p.add_argument("--expect", choices=("hit", "miss"), default="hit", help="--verify: the outcome that passes (default hit)")
    p.add_argument("--force-aot-load", dest="force_aot", action=argparse.BooleanOptionalAction, default=None,
                   help="--verify: set VLLM_FORCE_AOT_LOAD=1 (default: on when expecting a hit on a compiling variant)")
    p.add_argument("--max-concurrency", type=int, default=None,
                   help="cap on warm-up concurrency (default: max_num_seqs, at most 64 on GPU, 8 on CPU)")
    p.add_argument("--settle", action=argparse.BooleanOptionalAction, default=None,
                   help="after the cold start, start once more on the new cache and list what it adds too, so the "
                        "first warm start finds the cache complete (default: on, except for an eager variant, "
                        "which compiles nothing)")
    p.add_argument("--bytecode", action=argparse.BooleanOptionalAction, default=True,
                   help="first compile the server interpreter's packages that lack bytecode (default: on; "
                        "--no-bytecode measures a cold start that also compiles Python source)")
    a = p.parse_args(argv)
    v = load(a.variant, a.set)
    if a.export:
        return export(v, a.export)
    platform = host_platform()
    cmd = v.to_argv(platform)
    env = cachekey.server_env(v, platform)
    if a.verify:
        return verify(v, platform, cmd, env, a.max_concurrency, a.expect, a.force_aot)
    return bake(v, platform, cmd, env, a.max_concurrency, a.bytecode, a.settle)


if __name__ == "__main__":
    run_main(main)
