"""`make eval-latency`: stream a fixed, seeded workload through the variant's OpenAI endpoint and
record TTFT / TPOT / ITL / end-to-end percentiles, tok/s, goodput under an SLO, prefix-cache and
speculative-acceptance counters, and validity checks, per concurrency level.

Per level: --warmup-waves untimed waves at that level's shape, then --repeats timed passes, each
after POST /reset_prefix_cache (the probe starts its server with VLLM_SERVER_DEV_MODE=1; for --url
a missing endpoint is recorded) with /metrics read before and after. Then a prefix-cache run:
--prefix-requests prompts sharing --prefix-tokens, one at a time, first one cold.
Defaults depend on the host and the variant (L.defaults_for): the GPU plan (levels 1-32, prompts up
to 4096 tokens, 488 requests) on a GPU host, a minutes-long one on a CPU host (levels 1,2, prompts
16-256 tokens, 26 requests); both shrunk to fit the variant's SERVE_MAX_MODEL_LEN. Flags given win;
lengths given that exceed the context are refused before anything starts.
Output: one `latency` record (schemas/payloads/latency.schema.json) under results/<variant>/,
and the plot experiments/<variant>/latency.png (variant vs its baseline). Exit 1 when the run is
invalid (failed requests, TPOT below the bandwidth floor): the record says why, the summary skips it.
A dead server mid-probe or an unreachable --url is an error (exit 2) and writes nothing.

    python -m scripts.probe --variant qwen3-4b-awq --set WEIGHTS=dummy
    python -m scripts.probe --variant tiny --url http://127.0.0.1:8000 --concurrency 1,2 --repeats 1 \\
        --input-lens 16,48,96 --output-min 4 --output-max 8 --requests 3 --prefix-tokens 256
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from urllib.parse import urlsplit

from scripts.kit import latency as L
from scripts.kit import weights
from scripts.kit.device import conditions, device_provenance, gpu_compute_processes, host_platform
from scripts.kit.errors import KitError, run_main
from scripts.kit.paths import EXPERIMENTS, RESULTS, ROOT, rel as _rel
from scripts.kit.procs import ServerProcess, check_serves, stop_on_signals
from scripts.kit.record import make_record, records, write_record
from scripts.kit.variant import load
from scripts.report import refresh_after_write
from scripts.serve import add_variant_args, describe

_local = threading.local()


def _session():
    import requests
    if not hasattr(_local, "s"):
        _local.s = requests.Session()
    return _local.s


class Streams:
    """The streams of one pass, so Ctrl-C cuts them at once instead of waiting for their last token
    (issue 20: a Ctrl-C in warm-up waited ~9 minutes). abort(): streams stop at their next chunk, and
    the sockets of those in flight are shut down, which wakes a worker blocked on a silent stream."""

    def __init__(self):
        self.stop, self.open, self.lock = threading.Event(), set(), threading.Lock()

    def abort(self) -> None:
        import socket
        self.stop.set()
        with self.lock:
            live = list(self.open)
        for r in live:
            conn = getattr(r.raw, "connection", None)  # urllib3's HTTPConnection while streaming
            sock = getattr(conn, "sock", None)
            try:
                if sock is not None:
                    sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed: that stream has ended


def stream_one(url: str, body: dict, timeout_s: float, streams: Streams | None = None) -> L.Result:
    """One streaming completion, every chunk that carries a choice timestamped as it arrives.

    A choice, not its text: vLLM sends one chunk per engine step that produced tokens, with empty
    text when the detokenizer holds the text back (an incomplete UTF-8 sequence, a token with no
    text). Random weights decoding greedily can repeat one such token for a whole request: on
    2026-11-23 one Qwen3.5-4B BF16 dummy request in 24 streamed no text at all, twice, and the
    probe, then timing text, failed the run (results/qwen3.5-4b-bf16/20261123T115721Z-latency.json)."""
    import requests
    res = L.Result(sent=time.perf_counter(), expected_tokens=body["max_tokens"])
    if streams is not None and streams.stop.is_set():
        res.error, res.end = "interrupted", res.sent
        return res
    r = None
    try:
        with _session().post(url + "/v1/completions", json=body, stream=True, timeout=(10, timeout_s)) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {r.text[:200]}"
                return res
            if streams is not None:
                with streams.lock:
                    streams.open.add(r)
            # chunk_size=None: yield bytes as they arrive; the default (512) would hold lines back.
            for line in r.iter_lines(chunk_size=None):
                now = time.perf_counter()
                if streams is not None and streams.stop.is_set():
                    res.error = "interrupted"
                    break
                if not line.startswith(b"data: "):
                    continue
                data = line[6:]
                if data == b"[DONE]":
                    break
                obj = json.loads(data)
                if "error" in obj:
                    res.error = f"stream error: {str(obj['error'])[:200]}"
                    break
                if obj.get("choices"):  # the usage-only chunk at the end has none
                    res.chunk_times.append(now)
                if obj.get("usage"):
                    res.output_tokens = obj["usage"]["completion_tokens"]
    except (requests.RequestException, ValueError) as e:
        res.error = f"{type(e).__name__}: {str(e)[:200]}"
    finally:
        if streams is not None and r is not None:
            with streams.lock:
                streams.open.discard(r)
    res.end = time.perf_counter()
    return res


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a pass; `where` names it (e.g. "warm-up c=8")."""

    def __init__(self, where: str):
        super().__init__(where)
        self.where = where


class Server:
    """The endpoint under test: a ServerProcess this probe owns, or a --url it does not."""

    def __init__(self, url: str, proc: ServerProcess | None = None, metrics_urls: list[str] | None = None):
        self.url, self.proc = url.rstrip("/"), proc
        # Where /metrics is read, summed: the server itself, or the replicas behind a router (the router's
        # own /metrics has no engine counters, so a fleet's prefix-cache hits are its replicas').
        self.metrics_urls = [u.rstrip("/") for u in metrics_urls] if metrics_urls else [self.url]

    def get(self, path: str, timeout: float = 10):
        import requests
        return requests.get(self.url + path, timeout=timeout)

    def alive(self) -> bool:
        import requests
        if self.proc is not None and not self.proc.alive():
            return False
        try:
            return self.get("/health", 5).status_code == 200
        except requests.RequestException:
            return False

    def _each_metrics(self, parse, timeout: float):
        """parse(/metrics text) of every metrics_url; None when one does not answer 200 or parses to None."""
        import requests
        out = []
        for u in self.metrics_urls:
            try:
                r = requests.get(u + "/metrics", timeout=timeout)
            except requests.RequestException:
                return None
            got = parse(r.text) if r.status_code == 200 else None
            if got is None:
                return None
            out.append(got)
        return out

    def metrics(self) -> dict | None:
        """The engine counters summed over metrics_urls; None when one of them does not answer 200."""
        each = self._each_metrics(L.parse_metrics, 30)
        return None if each is None else L.add_deltas(each)

    def gauges(self) -> dict | None:
        """Requests running and waiting and the KV cache's fill now (latency.parse_gauges), over metrics_urls;
        None when one of them does not answer or has no request gauges."""
        each = self._each_metrics(L.parse_gauges, 5)
        return None if each is None else L.add_gauges(each)

    def reset_prefix_cache(self) -> bool:
        """True when the server reset its prefix cache; False when it has no such endpoint."""
        import requests
        r = requests.post(self.url + "/reset_prefix_cache", timeout=60)
        return r.status_code == 200


def run_pass(srv: Server, model: str, reqs: list, concurrency: int, timeout_s: float, bar, where: str):
    """Closed loop: `concurrency` requests in flight until the list is done. (results, seconds).
    A multi-turn request (Request.turn > 0) is queued when its conversation's previous turn ends, behind
    the requests already queued: conversations interleave across the slots. Results keep the list's order.
    Ctrl-C (or SIGTERM) ends it at once: queued requests are cancelled, in-flight streams cut, and
    Interrupted says where."""
    t0 = time.perf_counter()
    streams = Streams()
    ex = ThreadPoolExecutor(max_workers=concurrency)
    after = {}  # index of a turn -> index of its conversation's next turn
    last = {}
    for i, r in enumerate(reqs):
        if r.conversation is not None:
            if r.conversation in last:
                after[last[r.conversation]] = i
            last[r.conversation] = i
    follows = set(after.values())

    def submit(i):
        f = ex.submit(stream_one, srv.url, L.completion_body(model, reqs[i]), timeout_s, streams)
        f.index = i
        return f

    futs = [None] * len(reqs)
    try:
        pending = set()
        for i in range(len(reqs)):
            if i not in follows:
                futs[i] = submit(i)
                pending.add(futs[i])
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                bar.update(1)
                if f.index in after:
                    futs[after[f.index]] = submit(after[f.index])
                    pending.add(futs[after[f.index]])
    except KeyboardInterrupt:
        ex.shutdown(wait=False, cancel_futures=True)
        streams.abort()
        raise Interrupted(where) from None
    except BaseException:
        ex.shutdown(wait=False, cancel_futures=True)
        streams.abort()
        raise
    ex.shutdown(wait=True)
    dt = time.perf_counter() - t0
    results = [f.result() for f in futs]
    for r, q in zip(results, reqs):
        if q.conversation is not None:
            r.turn = q.turn
    if any(not r.ok for r in results) and not srv.alive():
        raise KitError(f"the server at {srv.url} stopped answering during {where} "
                       f"({sum(not r.ok for r in results)} of {len(results)} requests failed: "
                       f"{next(r.failure() for r in results if not r.ok)}); no record written"
                       + (srv.proc._log_hint() if srv.proc else ""))
    return results, dt


class QueueWatch:
    """Polls the server's request gauges from a thread while a pass runs: how many requests it held at once
    and how many waited (latency.queue_summary). A poll is one small GET every INTERVAL_S; the pass's
    requests do not wait on it."""
    INTERVAL_S = 0.1

    def __init__(self, srv: Server):
        self.srv, self.polls, self._stop = srv, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="queue-watch")

    def _run(self):
        while not self._stop.is_set():
            g = self.srv.gauges()
            if g is not None:
                self.polls.append(g)
            self._stop.wait(self.INTERVAL_S)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)

    def summary(self) -> dict | None:
        return L.queue_summary(self.polls)


def measured_pass(srv, model, reqs, c, a, bar, where, conds: list | None = None, queues: list | None = None):
    """One timed pass with /metrics read around it; `conds` gets the GPU's and host's state read just
    before and just after it (clocks, power, throttling, neighbours, load: what can move a level);
    `queues`, when given, the server's queue over the pass (QueueWatch)."""
    before = srv.metrics()
    cond = {"before": conditions()}
    if queues is None:
        results, dt = run_pass(srv, model, reqs, c, a.request_timeout_s, bar, where)
    else:
        with QueueWatch(srv) as watch:
            results, dt = run_pass(srv, model, reqs, c, a.request_timeout_s, bar, where)
        queues.append(watch.summary())
    cond["after"] = conditions()
    after = srv.metrics()
    if conds is not None:
        conds.append(cond)
    delta = L.metrics_delta(before, after) if before is not None and after is not None else None
    return results, dt, delta


def probe(srv: Server, model: str, w: L.Workload, a, bar) -> dict:
    """Every level and the prefix-cache run; returns the payload minus baseline and validity."""
    can_reset = None  # learned on the first try
    levels, notes = [], []
    # Servers sharing the GPU (gpu-session.sh parallel, sweep --jobs) are a run condition the config
    # does not show, so it is recorded. (The same variant and rates measured 2.48 and 3.06 ms TPOT at
    # c=1 in two runs of one session, results/qwen3.5-4b-awq-seq8-mtp4/20261123T115736Z and 115500Z,
    # both probed after their neighbours' probes had ended; the cause is not known yet.)
    gpu_processes = gpu_compute_processes()

    def reset():
        nonlocal can_reset
        if can_reset is not False:
            can_reset = srv.reset_prefix_cache()
        return can_reset

    for c in a.concurrency:
        for wave in range(a.warmup_waves):
            bar.set_description(f"c={c} warm-up {wave + 1}/{a.warmup_waves}")
            run_pass(srv, model, L.level_requests(w, c, wave, warmup=True), c, a.request_timeout_s, bar,
                     f"warm-up c={c}")
        reps, pooled, deltas, conds, queues = [], [], [], [], []
        for i in range(a.repeats):
            bar.set_description(f"c={c} repeat {i + 1}/{a.repeats}")
            reset()
            results, dt, delta = measured_pass(srv, model, L.level_requests(w, c, i), c, a, bar,
                                               f"concurrency {c} repeat {i + 1}", conds, queues)
            reps.append({"duration_s": dt, "results": results, "metrics_delta": _delta_json(delta)})
            pooled += results
            if delta is not None:
                deltas.append(delta)
        lv = L.summarize_level(c, reps, pooled, a.slo, a.max_spread_pct)
        total = L.add_deltas(deltas) if deltas else {}
        lv["prefix_cache"] = L.prefix_cache(total)
        lv["spec_decode"] = L.spec_decode(total)
        lv["preemptions"] = L.preemptions(total)
        lv["conditions"] = conds
        lv["server_queue"] = queues
        levels.append(lv)
    prefix_run = None
    if w.prefix_tokens and w.prefix_requests:
        bar.set_description("prefix cache")
        reset()
        results, dt, delta = measured_pass(srv, model, L.prefix_requests(w), 1, a, bar, "the prefix-cache run")
        ok = [r for r in results if r.ok]
        prefix_run = {"requests": len(results), "failed": len(results) - len(ok),
                      "cold_ttft_ms": round(results[0].ttft_ms, 3) if results[0].ok else None,
                      "warm_ttft_p50_ms": L.stats(r.ttft_ms for r in results[1:] if r.ok)["p50"],
                      "prefix_cache": L.prefix_cache(delta) if delta is not None else None}
    if can_reset is False:
        notes.append("the server has no /reset_prefix_cache (start it with VLLM_SERVER_DEV_MODE=1): "
                     "caches were not reset between repeats; prompts differ per repeat, so no repeat reuses another's")
    return {"levels": levels, "prefix_run": prefix_run, "gpu_processes": gpu_processes,
            "prefix_cache_reset": {True: "ok", False: "unavailable", None: "not attempted"}[can_reset],
            "notes": notes}


def _delta_json(delta):
    if delta is None:
        return None
    out = {k.removeprefix("vllm:"): v for k, v in delta.items() if k != L.SPEC_PER_POS}
    if L.SPEC_PER_POS in delta:
        out["spec_decode_num_accepted_tokens_per_pos"] = [delta[L.SPEC_PER_POS][p] for p in sorted(delta[L.SPEC_PER_POS])]
    return out


def weights_config(v) -> dict | None:
    """The served architecture: the weights folder's config.json, else ARCH_CONFIG (a --url
    server whose weights live elsewhere); byte counts take QUANT from the variant either way."""
    for p in (v.weights_dir / "config.json", ROOT / v["ARCH_CONFIG"] if v["ARCH_CONFIG"] else None):
        if p and p.is_file():
            return json.loads(p.read_text())
    return None


def validity(payload: dict, v, gpu_name: str | None, repeats: int) -> dict:
    errors, warnings = [], []
    for lv in payload["levels"]:
        if lv["failed"]:
            errors.append(f"concurrency {lv['concurrency']}: {lv['failed']} of {lv['requests']} requests failed "
                          f"({'; '.join(lv['failures'])})")
    warnings += L.repeat_warnings(payload["levels"])
    warnings += L.preemption_warnings(payload["levels"])
    warnings += [w for lv in payload["levels"]
                 if (w := L.queue_warning(f"concurrency {lv['concurrency']}", lv["concurrency"], lv.get("server_queue") or []))]
    warnings += [w for lv in payload["levels"]
                 if (w := L.herd_warning(f"concurrency {lv['concurrency']}", lv.get("server_queue") or []))]
    warnings += L.condition_warnings(payload["levels"])
    if payload["prefix_run"] and payload["prefix_run"]["failed"]:
        errors.append(f"prefix-cache run: {payload['prefix_run']['failed']} requests failed")
    warnings += L.prefix_warnings(payload["prefix_run"], v.config.get("SERVE_ENABLE_PREFIX_CACHING"))
    c1 = next((lv for lv in payload["levels"] if lv["concurrency"] == 1), payload["levels"][0])
    spec = c1.get("spec_decode")
    # Under speculation a step may emit several tokens: divide by the measured acceptance length,
    # or by 1+K (the most a step can emit) when the server exposes no counters.
    tokens_per_step = spec["acceptance_length"] if spec else (1 + v["SPEC_K"])
    rf = L.roofline(weights_config(v), v.config, gpu_name, c1["tpot_ms"]["p50"] if c1["concurrency"] == 1 else None,
                    tokens_per_step, L.spec_arch_config(v.config, ROOT), L.context_tokens(payload["workload"]))
    if rf["status"] != "skipped":
        below = L.floor_violations(payload["levels"], rf["weights_floor_tpot_ms"])
        errors += below
        rf["status"] = "violated" if below else "ok"
    if repeats < 3:
        warnings.append(f"{repeats} repeat(s): spread is not meaningful below 3")
    own = int(v.config.get("SERVE_TENSOR_PARALLEL_SIZE") or 1) * int(v.config.get("SERVE_DATA_PARALLEL_SIZE") or 1)
    n = (payload.get("server") or {}).get("gpu_processes")
    if n is not None and n > own:
        warnings.append(f"{n} processes held GPU memory while timing (this server's own: {own}): "
                        f"co-resident servers; compare only with runs made beside as many")
    warnings += payload.pop("notes")
    return rf, {"valid": not errors, "errors": errors, "warnings": warnings}


def write_plot(v, root: Path, path: Path) -> Path:
    """Regenerate the variant's plot from its records (and its baseline's) under root."""
    from scripts.kit.summaries import latency as S
    docs = {}
    for name in {v.name, v["BASELINE"]} - {None}:
        cur = load(name)
        recs = [(_rel(p), r) for p, r in records(name, "latency", root) if cur.describes(r)]
        docs[name] = {"results": {"latency": S.summarize(cur, recs)}} if recs else {"results": {}}
    from scripts.kit.summaries import save_plot
    return save_plot(lambda: S.plot_png(v.name, docs), path)


def csv_ints(text: str) -> tuple:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return vals


def csv_floats(text: str) -> tuple:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def slo_arg(text: str) -> L.SLO:
    try:
        return L.parse_slo(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _shown(x) -> str:
    return ",".join(map(str, x)) if isinstance(x, tuple) else str(x)


def _default(name: str, gpu, per_variant: bool) -> tuple:
    """(argparse default, help text) of a flag whose default the probe picks per host and variant
    (None until resolve_defaults) or, for scripts/compare.py, the GPU value."""
    if not per_variant:
        return gpu, f"default: {_shown(gpu)}"
    cpu = L.CPU_DEFAULTS.get(name, gpu)
    return None, f"default: {_shown(gpu)}" if cpu == gpu else f"default: GPU {_shown(gpu)}, CPU {_shown(cpu)}"


def add_workload_args(p: argparse.ArgumentParser, per_variant: bool = False) -> None:
    """The workload flags (one per Workload field) and the run flags a timed pass needs; shared with
    scripts/compare.py so both draw the same requests from the same flags. per_variant (the probe):
    flags left out are None, for resolve_defaults to fill from L.defaults_for."""
    d, h = _default("concurrency", L.CONCURRENCY, per_variant)
    p.add_argument("--concurrency", type=csv_ints, default=d, metavar="N,N,...", help=f"concurrency levels ({h})")
    d, h = _default("warmup_waves", L.WARMUP_WAVES, per_variant)
    p.add_argument("--warmup-waves", type=int, default=d,
                   help=f"untimed waves before a level's repeats, each with the repeats' request shapes ({h})")
    slo = L.SLO()
    p.add_argument("--slo", type=slo_arg, default=slo, metavar="ttft=MS,tpot=MS",
                   help=f"p99 bounds (default: ttft={slo.ttft_p99_ms:g},tpot={slo.tpot_p99_ms:g}, MLPerf interactive)")
    p.add_argument("--request-timeout-s", type=float, default=L.REQUEST_TIMEOUT_S,
                   help=f"longest silence on one stream before it counts as failed (default: {L.REQUEST_TIMEOUT_S:g})")
    g = p.add_argument_group("workload (hashed into the record; only equal workloads are compared)",
                             "Defaults are fitted to the variant's SERVE_MAX_MODEL_LEN (lengths shrink: scripts/kit/\n"
                             "latency.py defaults_for); lengths given that do not fit are refused."
                             if per_variant else None)
    for f in L.workload_fields():
        kind = csv_ints if f.name == "input_lens" else csv_floats if f.name == "class_weights" else \
            str if isinstance(f.default, str) else int
        d, h = _default(f.name, f.default, per_variant)
        g.add_argument("--" + f.name.replace("_", "-"), type=kind, default=d, choices=f.metadata.get("choices"),
                       help=f"{f.metadata['help']} ({h})")


def workload(a) -> L.Workload:
    """The Workload of parsed flags, checked: a bad mix or length range is named before any server starts."""
    w = L.Workload(**{f.name: getattr(a, f.name) for f in L.workload_fields()})
    if w.shared_prefixes < 0 or (w.shared_prefixes and not w.prefix_tokens):
        raise KitError(f"--shared-prefixes {w.shared_prefixes} with --prefix-tokens {w.prefix_tokens}: "
                       "need a count >= 0, and prefixes of at least one token")
    if w.prefix_scope != "pass" and not w.shared_prefixes:
        raise KitError(f"--prefix-scope {w.prefix_scope} without --shared-prefixes: there are no shared prefixes to keep")
    if w.turns < 1:
        raise KitError(f"--turns {w.turns}: need at least 1 (1 = single requests)")
    if len(w.class_weights) != len(w.input_lens):
        raise KitError(f"--class-weights has {len(w.class_weights)} values for {len(w.input_lens)} --input-lens")
    if not 1 <= w.output_min <= w.output_max:
        raise KitError(f"--output-min {w.output_min} / --output-max {w.output_max}: need 1 <= min <= max")
    return w


def resolve_defaults(a) -> None:
    """Fill the flags left out (None) with L.defaults_for(variant, host), then refuse up front any
    request that cannot fit the variant's context: vLLM would answer each with HTTP 400 (issue 20:
    tiny, 2048 tokens, was sent 4096-token prompts)."""
    v = load(a.variant, a.set)
    defaults = L.defaults_for(v, host_platform())
    given = {k for k in defaults if getattr(a, k, None) is not None}
    for k, val in defaults.items():
        if k not in given:
            setattr(a, k, val)
    # One output bound given: the other default follows it rather than contradict it.
    if "output_max" in given and "output_min" not in given:
        a.output_min = min(a.output_min, a.output_max)
    if "output_min" in given and "output_max" not in given:
        a.output_max = max(a.output_max, a.output_min)
    n = L.max_model_len(v)
    if not n:
        return
    # Lengths left out make room for those given (e.g. a long --output-max), as defaults_for does for its own.
    if "input_lens" not in given:
        a.input_lens = tuple(max(1, min(x, n - a.output_max)) for x in a.input_lens)
    if "prefix_tokens" not in given:
        a.prefix_tokens = max(0, min(a.prefix_tokens, n - a.prefix_suffix_tokens - a.output_min))
    flag = lambda k: f"--{k.replace('_', '-')} {_shown(getattr(a, k))}" + ("" if k in given else " (default)")
    ctx = f"{v.name}'s max_model_len {n} (SERVE_MAX_MODEL_LEN, {v.sources.get('SERVE_MAX_MODEL_LEN', 'default')})"
    fix = "every such request would fail; lower them, or raise the context with --set SERVE_MAX_MODEL_LEN=N"
    shared = a.prefix_tokens if getattr(a, "shared_prefixes", 0) else 0  # --shared-prefixes lengthens every prompt
    turns = getattr(a, "turns", 1) or 1  # turn k carries every earlier turn and its reply
    longest = L.longest_prompt(L.Workload(input_lens=a.input_lens, output_max=a.output_max, prefix_tokens=a.prefix_tokens,
                                          shared_prefixes=1 if shared else 0, turns=turns))
    if longest + a.output_max > n:
        what = f"{flag('shared_prefixes')} of {flag('prefix_tokens')} + " if shared else ""
        what += f"{flag('turns')} of " if turns > 1 else ""
        raise KitError(f"{what}{flag('input_lens')} with {flag('output_max')}: a {longest}-token prompt + {a.output_max} "
                       f"output tokens = {longest + a.output_max} > {ctx}; {fix}")
    need = a.prefix_tokens + a.prefix_suffix_tokens + a.output_min
    if a.prefix_tokens and a.prefix_requests and need > n:
        raise KitError(f"{flag('prefix_tokens')} + {flag('prefix_suffix_tokens')} + {flag('output_min')} "
                       f"= {need} tokens > {ctx}; {fix}")


class _Parser(argparse.ArgumentParser):
    """Resolves the per-variant defaults as it parses, so every caller of parser() (main, and
    scripts/tune.py and sweep.py, which read the levels and hash the workload) sees the values the
    probe will use."""

    def parse_known_args(self, args=None, namespace=None):
        a, rest = super().parse_known_args(args, namespace)
        resolve_defaults(a)
        return a, rest


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="make eval-latency", description=__doc__.split("\n\n")[0],
                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_variant_args(p)
    p.add_argument("--url", help="probe a server that is already running (e.g. http://127.0.0.1:8000) instead of starting one")
    p.add_argument("--metrics-url", action="append", default=[], metavar="URL",
                   help="read vLLM's /metrics here instead of at --url, summed over every one given (repeatable): "
                        "the replicas behind a router")
    p.add_argument("--baseline", help="variant to compute speedups against (default: the variant's BASELINE key)")
    d, h = _default("repeats", L.REPEATS, True)
    p.add_argument("--repeats", type=int, default=d, help=f"timed passes per level ({h})")
    p.add_argument("--max-spread-pct", type=float, default=L.MAX_SPREAD_PCT,
                   help=f"flag a repeat this far from its level's median tok/s (default: {L.MAX_SPREAD_PCT:g})")
    add_workload_args(p, per_variant=True)
    p.add_argument("--results-dir", type=Path, default=RESULTS, help="where records go (default: results/)")
    p.add_argument("--plot", type=Path, help="PNG to regenerate (default: experiments/<variant>/latency.png)")
    p.add_argument("--lock", type=Path, metavar="FILE",
                   help="hold an exclusive lock on FILE while timing, so probes of servers sharing one GPU "
                        "(make sweep --jobs) never overlap; waits for it after the server is up. $KIT_PROBE_LOCK, "
                        "when set, is taken instead: one lock for every probe on the host, whoever started it")
    p.add_argument("--barrier", metavar="DIR:N",
                   help="before timing, wait until N servers have checked in under DIR (a file per server, "
                        "named by its port; one that exits leaves the same file), so no probe times requests "
                        "while a neighbour is still compiling or capturing graphs; after timing, wait at DIR.done "
                        "for all N, so every probe of the batch is timed beside the same servers (make sweep --jobs)")
    p.add_argument("--barrier-timeout-s", type=float, default=1800.0,
                   help="longest wait at --barrier before timing anyway, with a warning (default: 1800)")
    return p


def parse_barrier(text: str | None) -> tuple[Path, int] | None:
    if not text:
        return None
    d, sep, n = text.rpartition(":")
    if not sep or not d or not n.isdigit() or int(n) < 1:
        raise KitError(f"--barrier {text!r}: expected DIR:N (N >= 1 servers)")
    return Path(d), int(n)


def done_barrier(barrier: tuple[Path, int] | None) -> tuple[Path, int] | None:
    """The second rendezvous of a --barrier: probes finished (or servers gone)."""
    return (barrier[0].with_name(barrier[0].name + ".done"), barrier[1]) if barrier else None


def leave(barrier: tuple[Path, int] | None, name: str) -> None:
    """A server that is gone (failed start, probe done or failed) counts at both rendezvous, so it
    never holds its batch to the timeout. Called by whoever started it (sweep, tune)."""
    for b in (barrier, done_barrier(barrier)):
        if b:
            b[0].mkdir(parents=True, exist_ok=True)
            (b[0] / name).touch()


def check_in(barrier: tuple[Path, int] | None, name: str, timeout_s: float, poll_s: float = 1.0) -> int:
    """Leave this server's file under the barrier dir and wait until N names are there; returns how
    many there were. A wait, not a sleep for a server: every server was health-polled by its own
    serve, and one that fails leaves its file on exit (scripts/sweep.py), so the count completes."""
    if barrier is None:
        return 0
    d, n = barrier
    d.mkdir(parents=True, exist_ok=True)
    (d / name).touch()
    deadline = time.monotonic() + timeout_s
    while (have := len(list(d.iterdir()))) < n and time.monotonic() < deadline:
        time.sleep(poll_s)
    if have < n:
        print(f"warning: --barrier {d}: {have} of {n} servers checked in after {timeout_s:g} s; timing anyway",
              file=sys.stderr)
    return have


def probe_lock(given: Path | None) -> Path | None:
    """The lock a probe times under: $KIT_PROBE_LOCK wins over --lock. A batch's own lock (sweep,
    tune --jobs) keeps its probes apart, but not from a tune, a sweep or a `parallel` run beside it
    on the same GPU; the host-wide one does both."""
    from scripts.kit.procs import gpu_lock_path
    return gpu_lock_path() or given


def exclusive(path: Path | None):
    """The exclusive GPU lock for the timed part (a no-op without one); servers starting on the same
    lock hold it shared (scripts/kit/procs.py), so timing waits for their start-ups to end."""
    from scripts.kit.procs import flock
    return flock(path, waiting=f"probe: waiting for the GPU lock {path} (another probe, or a server starting)")


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    w = workload(a)
    if a.repeats < 1:
        raise KitError(f"--repeats {a.repeats}: need at least 1")
    barrier = parse_barrier(a.barrier)
    v = load(a.variant, a.set)
    if a.baseline:
        load(a.baseline)
    platform = host_platform()
    print(describe(v, platform), file=sys.stderr)
    print(f"workload sha256 {w.sha256[:12]}: {json.dumps(w.spec(), sort_keys=True)}", file=sys.stderr)
    started = time.time()
    dev = device_provenance()
    proc = None
    if a.url:
        srv = Server(a.url, metrics_urls=a.metrics_url)
        if not srv.alive():
            raise KitError(f"--url {a.url}: GET /health does not answer 200 (start the server with "
                           f"`make serve VARIANT={v.name}`, or drop --url to let the probe start it)")
    else:
        weights.require(v)
        # Dev mode only adds /reset_prefix_cache (and /sleep); it is not in vLLM's compile hash.
        env = {**v.to_env(platform), "VLLM_SERVER_DEV_MODE": "1"}
        log = a.results_dir / v.name / "logs" / f"probe-{time.strftime('%Y%m%dT%H%M%S')}.log"
        proc = ServerProcess(v.to_argv(platform), env, v["HOST"], v["PORT"], v["READY_TIMEOUT_S"], log_path=log)
        stop_on_signals()
    from tqdm import tqdm
    stage = "the probe's start"  # what a Ctrl-C interrupts (a pass's Interrupted names its own)
    try:
        if proc:
            stage = f"{v.name}'s server start-up"
            proc.start()
            ready = proc.wait_ready_shown(f"starting {v.name}")
            srv = Server(proc.url, proc, a.metrics_url)
        stage = "the check of the served model"
        check_serves(srv.url, v.name, "probe the right server or variant")
        port = str(urlsplit(srv.url).port)
        stage = "the wait at --barrier"
        check_in(barrier, port, a.barrier_timeout_s)
        n_total = sum((a.warmup_waves + a.repeats) * L.level_size(w, c) for c in a.concurrency) + (w.prefix_requests if w.prefix_tokens else 0)
        stage = "the wait for the GPU lock"
        with exclusive(probe_lock(a.lock)), tqdm(total=n_total, unit="req", file=sys.stderr) as bar:
            stage = "timing"
            payload = probe(srv, v.name, w, a, bar)
        # Keep this server up until the batch's last probe is done, so every probe of a batch is timed
        # beside the same neighbours (2026-11-23: as servers left, later probes saw fewer, and TPOT
        # tracked that count in both sweeps).
        stage = "the wait for the batch at --barrier (timing had ended)"
        check_in(done_barrier(barrier), port, a.barrier_timeout_s)
    except KeyboardInterrupt as e:
        print(f"interrupted during {e.where if isinstance(e, Interrupted) else stage}: no record written",
              file=sys.stderr)
        return 130
    finally:
        if proc:
            proc.stop()
    gpu_name = dev["name"] if dev["kind"] == "gpu" else None
    payload = {"workload": {**w.spec(), "sha256": w.sha256},
               "slo": {"ttft_p99_ms": a.slo.ttft_p99_ms, "tpot_p99_ms": a.slo.tpot_p99_ms},
               "server": {"url": a.url, "started_by_probe": proc is not None,
                          "ready_s": round(ready, 2) if proc else None,
                          "prefix_cache_reset": payload.pop("prefix_cache_reset"),
                          "gpu_processes": payload.pop("gpu_processes"),
                          **({"metrics_urls": srv.metrics_urls} if a.metrics_url else {})},
               "repeats": a.repeats, "max_spread_pct": a.max_spread_pct, **payload}
    payload["max_concurrency_meeting_slo"] = L.max_concurrency_meeting_slo(payload["levels"])
    payload["roofline"], payload["validity"] = validity(payload, v, gpu_name, a.repeats)
    rec = make_record("latency", v, {**payload, "baseline": {"variant": None, "comparable": False, "reasons": []}},
                      started=started, server_argv=proc.argv if proc else None, server_env=proc.env if proc else None)
    rec["payload"]["baseline"] = L.find_baseline(rec, a.baseline or v["BASELINE"], a.results_dir)
    path = write_record(rec, a.results_dir)
    print(report_text(rec["payload"], rec["variant"]), file=sys.stderr)
    print(f"record: {_rel(path)}", file=sys.stderr)
    plot = write_plot(v, a.results_dir, a.plot or EXPERIMENTS / v.name / "latency.png")
    if plot:
        print(f"plot: {_rel(plot)}", file=sys.stderr)
    if proc:
        print(f"server log: {_rel(proc.log_path)}", file=sys.stderr)
    refresh_after_write(path)
    if not rec["payload"]["validity"]["valid"]:
        print("INVALID run (not reported as a result):\n  " + "\n  ".join(rec["payload"]["validity"]["errors"]),
              file=sys.stderr)
        return 1
    return 0


def report_text(p: dict, variant: str | None = None) -> str:
    """The run's table, then its baseline's figures side by side: two sessions, so no ratio (a ratio
    comes from `make compare`, which times both in one session, interleaved)."""
    rows = [f"{'conc':>5} {'TTFT p50/p99 ms':>17} {'TPOT p50/p99 ms':>17} {'ITL p99':>8} {'tok/s':>9} {'spread%':>8} {'SLO':>4}"]
    for lv in p["levels"]:
        t, o = lv["ttft_ms"], lv["tpot_ms"]
        rows.append(f"{lv['concurrency']:>5} {t['p50']!s:>8}/{t['p99']!s:<8} {o['p50']!s:>8}/{o['p99']!s:<8} "
                    f"{lv['itl_ms']['p99']!s:>8} {lv['output_tok_per_s']['median']:>9} "
                    f"{lv['output_tok_per_s']['spread_pct']!s:>8} {'yes' if lv['meets_slo'] else 'no':>4}")
    for lv in p["levels"]:
        if lv.get("turns"):
            rows.append(f"c={lv['concurrency']} TTFT p50 ms by turn: " +
                        ", ".join(f"turn {t['turn']} {t['ttft_ms']['p50']}" for t in lv["turns"]))
    rows.append(f"highest concurrency meeting the SLO: {p['max_concurrency_meeting_slo']}")
    rf = p["roofline"]
    rows.append(f"roofline: {rf['status']}" + (f" ({rf['reason']})" if "reason" in rf else
                                                f", floor {rf['floor_tpot_ms']} ms/token, {rf['roofline_pct_c1']}% at c=1"))
    b = p["baseline"]
    if b["comparable"]:
        try:
            path = Path(b["record"])
            base = json.loads((path if path.is_absolute() else ROOT / path).read_text())["payload"]["levels"]
        except (OSError, KeyError, ValueError):
            base = []
        bl = {lv["concurrency"]: lv for lv in base}
        rows.append(f"baseline {b['variant']} ({b['record']}, another run, not interleaved: figures side by side, not a ratio):")
        for lv in p["levels"]:
            o = bl.get(lv["concurrency"])
            if o:
                rows.append(f"  c={lv['concurrency']}, this run / {b['variant']}: tok/s {lv['output_tok_per_s']['median']} / "
                            f"{o['output_tok_per_s']['median']}, TPOT p50 {lv['tpot_ms']['p50']} / {o['tpot_ms']['p50']} ms, "
                            f"TTFT p50 {lv['ttft_ms']['p50']} / {o['ttft_ms']['p50']} ms")
    else:
        rows.append(f"baseline {b['variant'] or '-'} not set beside this run: {'; '.join(b['reasons'])}")
    if b["variant"] and b["variant"] != variant and "this variant is its own baseline" not in b["reasons"]:
        rows.append(f"for a ratio: make compare A={b['variant']} B={variant or '<variant>'}")
    rows += [f"warning: {x}" for x in p["validity"]["warnings"]]
    return "\n".join(rows)


if __name__ == "__main__":
    run_main(main)
