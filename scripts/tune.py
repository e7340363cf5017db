"""`make tune BASE=<variant> SLO=ttft=MS,tpot=MS [BUDGET=N|20m|N,20m]`: search the levers BASE
exposes, under the SLO and the quality gate, and write the winner as a new variant.

Levers (scripts/kit/tune.py levers()): existing weight folders, speculation method/K (K=0 = off),
the per-batch-size K schedule (when the variant schema has SPEC_SCHEDULE), --max-num-seqs,
--max-num-batched-tokens, KV dtype, prefix caching, CUDA-graph sizes, compilation passes.
Each candidate is BASE + `--set` overrides. Per candidate: one server (ServerProcess, dev mode for
/reset_prefix_cache), the latency probe through --url, and, only when the candidate would win,
the sampled quality gate on the same server. Coordinate descent; a candidate wins only beyond the
noise bands (scripts/kit/tune.py Rule). Budget: candidates and/or wall clock; what was cut is listed.

`--jobs N` (GPU: with a fixed SERVE_KV_CACHE_MEMORY_BYTES) measures up to N of a lever's values at
once, with the probe's own --barrier and --lock, as `make sweep --jobs` does: their servers start
together (a Qwen3.5 cold start is minutes), probes wait until all are up, take turns, and every
server stays up until the last probe is done. Candidates sharing a compile cache are not started
together (one compiles, the others start warm after it). The search itself is unchanged: it reads
those candidates from their records.

Records (append-only, never under results/<BASE>/, so BASE's measurements stay its own):
  results/<tune>/tune/<BASE>/*-latency.json, *-quality.json   probe and gate of each candidate
  results/<tune>/tune/<BASE>/*-tune.json                      one scope=candidate record per trial
Resume: a re-run with the same settings answers every candidate it has a record for from that
record, so the search replays and continues where it stopped (kill it at any point).
Output: experiments/<tune>/config.env (BASE=<BASE> + only the changed keys), README.md (generated
from the records), then the winner re-measured as itself: probe + final gate -> results/<tune>/,
a scope=session tune record, and `python -m scripts.report` (measurements.json, tune_pareto.png).
Exit 0 done, 1 the final gate failed (variant written, marked not shippable), 2 usage error.

    python -m scripts.tune --base qwen3.5-4b-awq-seq8 --slo ttft=500,tpot=30 --budget 6,25m
    python -m scripts.tune --base tiny --name tiny-tuned --budget 2 --levers max_num_seqs \\
        --values max_num_seqs=2 --gates ci --search-gate limit:1 --final-gate limit:1 \\
        --probe-args "--concurrency 1,2 --repeats 1 --requests 3 --input-lens 16 --class-weights 1 \\
                      --output-min 4 --output-max 8 --prefix-tokens 0"
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from scripts.kit import latency as L
from scripts.kit import tune as T
from scripts.kit import weights
from scripts.kit.device import device_provenance, host_platform
from scripts.kit.errors import KitError, run_main
from scripts.kit.paths import EXPERIMENTS, RESULTS, ROOT, WEIGHTS
from scripts.kit.procs import ServerProcess, free_port, run_logged, server_slots, stop_on_signals
from scripts.kit.record import load_record, make_record, records, write_record
from scripts.kit.variant import CONDITION_KEYS, NAME_RE, load
from scripts.kit.paths import rel as _rel

# Settings vLLM does not hash into its compile cache (shared/notes/vllm-0.26.md section 4): candidates
# differing only in these share one VLLM_CACHE_ROOT and start warm after the first.
UNHASHED = ("SERVE_ENABLE_PREFIX_CACHING", "SERVE_GPU_MEMORY_UTILIZATION", "PORT", "HOST", "READY_TIMEOUT_S")


def _sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def settings_hashes(settings: dict) -> tuple[str, str]:
    """(the hash records are matched by, the pre-2026-11-25 one, still accepted). The run's synthetic
    rates stay out of the first: a candidate that speculates is checked against its record's own
    rates (Tuner._rates_match), and one that does not measured the same under any rates. So a tune
    can add a seed that needs rates (Qwen3 + DFlash's 15) without measuring BASE and the weight
    folders again."""
    rateless = {**settings, "conditions": [c for c in settings.get("conditions", []) if not c.startswith("SPEC_ACCEPTANCE=")]}
    return _sha(rateless), _sha(settings)


def gate_mode(text: str) -> list[str]:
    """'sample' / 'full' / 'limit:N' -> evaluate.py flags; 'none' -> []."""
    if text in ("sample", "full"):
        return ["--" + text]
    if text.startswith("limit:") and text[6:].isdigit():
        return ["--limit", text[6:]]
    if text == "none":
        return []
    raise KitError(f"gate mode {text!r}: use sample, full, limit:N or none")


def compile_key(v) -> str:
    """Compile-cache sharing key: the identity minus what vLLM leaves out of its hash."""
    return _sha({k: val for k, val in v.identity.items() if k not in UNHASHED})[:12]


def newest(root: Path, variant: str, kind: str, sha: str, before: set) -> tuple[Path, dict] | tuple[None, None]:
    got = [(p, r) for p, r in records(variant, kind, root) if r["config_sha256"] == sha and p not in before]
    return got[-1] if got else (None, None)


class Tuner:
    def __init__(self, a, base, name: str, platform: str, settings: dict):
        self.a, self.base, self.name, self.platform, self.settings = a, base, name, platform, settings
        self.settings_sha, self.legacy_sha = settings_hashes(settings)
        self.state = a.state_dir or RESULTS / name / "tune"
        self.logs = RESULTS / name / "logs"
        self.t0 = time.time()
        self.walls: list[float] = []
        self.readies: list[float] = []  # cold start-to-ready of the candidates that started
        self.winner_sets: list[str] = []  # run conditions the winner carried (confirm serves it with them)
        self.cached = self._load_cached()
        self.measured: list[str] = []  # ids trialed by this run, in order (filled slots included)

    # -- records ----------------------------------------------------------------------------
    def _still_measures(self, rec: dict) -> bool:
        """A candidate record from before a schema key was added (BASE's hash then differed) still
        answers for the candidate if today's candidate, under today's defaults, is what it measured."""
        try:
            return load(self.base.name, self.a.set + T.as_sets(rec["payload"]["candidate"]["overrides"])).describes(rec)
        except KitError:
            return False

    def _rates_match(self, rec: dict) -> bool:
        """A speculating candidate's record answers only if it ran at this run's rates cut to its K
        (what every candidate of this run gets), so records at other rates never join the contest."""
        c = rec["config"]
        k = int(c.get("SPEC_K") or 0)
        if c.get("SPEC_METHOD") in (None, "none") or not k:
            return True
        want = T.cut_acceptance(self.base.config, {"SPEC_K": k}).get("SPEC_ACCEPTANCE") or ""
        return str(c.get("SPEC_ACCEPTANCE") or "") == want

    def _load_cached(self) -> dict:
        """{candidate id: candidate payload} of earlier trials under the same base config and settings."""
        out = {}
        self.recs = {}  # candidate id -> its record (trial adds its own): the session record's facts are theirs
        for _, rec in records(self.base.name, "tune", self.state):
            p = rec["payload"]
            if p["scope"] == "candidate" and p["settings_sha256"] in (self.settings_sha, self.legacy_sha) \
                    and (p["base_config_sha256"] == self.base.config_sha256 or self._still_measures(rec)) \
                    and self._rates_match(rec):
                # Keyed as the search names it: a record whose overrides repeat a BASE value (the
                # 2026-11-25 DFlash seed's rates) answers for the same server under the canonical id.
                cid = T.candidate_id(T.canonical(self.base.config, p["candidate"]["overrides"]))
                out[cid], self.recs[cid] = p["candidate"], rec
                self.walls.append(p["candidate"]["wall_s"])
                if p["candidate"].get("ready_s"):
                    self.readies.append(p["candidate"]["ready_s"])
        return out

    def common(self) -> dict:
        return {"tune": self.name, "base": self.base.name, "base_config_sha256": self.base.config_sha256,
                "settings": self.settings, "settings_sha256": self.settings_sha}

    # -- server -----------------------------------------------------------------------------
    def server(self, v, cache_dir: Path, log: Path) -> ServerProcess:
        env = {**v.to_env(self.platform), "VLLM_SERVER_DEV_MODE": "1", "VLLM_CACHE_ROOT": str(cache_dir),
               # Triton kernels are content-addressed: one cache serves every candidate.
               "TRITON_CACHE_DIR": str(WEIGHTS / "cache" / "_tune" / self.base.name / "triton")}
        return ServerProcess(v.to_argv(self.platform), env, v["HOST"], v["PORT"], v["READY_TIMEOUT_S"], log_path=log)

    def probe(self, variant: str, sets: list[str], url: str, results_dir: Path | None, plot: Path | None,
              log: Path, batch: tuple[Path, int, Path] | None = None) -> int:
        argv = [sys.executable, "-m", "scripts.probe", "--variant", variant, *(x for s in sets for x in ("--set", s)),
                "--url", url, "--slo", self.a.slo, *self.settings["probe_args"]]
        if batch:  # (barrier dir, batch size, lock file): see prefetch
            argv += ["--barrier", f"{batch[0]}:{batch[1]}", "--lock", str(batch[2])]
        if results_dir:
            argv += ["--results-dir", str(results_dir)]
        if plot:
            argv += ["--plot", str(plot)]
        return run_logged(argv, log, ROOT)

    def gate(self, variant: str, sets: list[str], url: str, mode: str, into: Path | None, log: Path) -> int:
        args = ["--variant", variant, *(x for s in sets for x in ("--set", s)), "--url", url, *gate_mode(mode)]
        if self.a.gates:
            args += ["--gates", self.a.gates]
        if into:
            # A candidate's record must not land beside BASE's (it would read as BASE's stale record).
            args += ["--results-dir", str(into)]
        return run_logged([sys.executable, "-m", "scripts.evaluate"] + args, log, ROOT)

    # -- one candidate ----------------------------------------------------------------------
    def check_time(self) -> None:
        b = self.a.budget_parsed
        if b.seconds is None:
            return
        est = statistics.median(self.walls) if self.walls else 0.0
        reserve = self.remeasure_estimate(est) if self.a.confirm else 0.0
        spent = time.time() - self.t0
        if spent + est + reserve > b.seconds:
            raise T.BudgetExhausted(f"time budget ({b.seconds:.0f} s): {spent:.0f} s spent, next candidate "
                                    f"~{est:.0f} s + {reserve:.0f} s kept for the winner's re-measurement")

    # A warm start over a cold one, on the H100 on 2026-11-23: 66/226 s, 86/256 s and 75/345 s
    # (0.22-0.34; the startup records and results/gpu-sessions/). 0.4 leaves a margin.
    WARM_SHARE = 0.4

    def remeasure_estimate(self, est: float) -> float:
        """The winner's re-measurement starts from its own compile cache: a candidate's time with its
        cold start replaced by a warm one. Budgeting a whole candidate for it stopped a GPU tune with
        over 500 s of its 870 s budget left (2026-11-23)."""
        if not self.readies:
            return est
        ready = statistics.median(self.readies)
        return max(est - ready, 0.0) + self.WARM_SHARE * ready

    def __call__(self, overrides: dict, wants_gate) -> T.Outcome:
        cid = T.candidate_id(overrides)
        c = self.cached.get(cid)
        if c is not None:
            needs_gate = c["status"] == "ok" and c["gate"] is None and self.a.search_gate != "none" \
                and wants_gate(c["score"])
            if not needs_gate:
                print(f"  [record] {c['label']}: {c['status']}", file=sys.stderr)
                return T.Outcome(overrides, c["status"], c["score"], c["gate"], c["note"], cached=True)
        self.check_time()
        return self.trial(overrides, wants_gate)

    def prefetch(self, cands: list[dict], fill: list[dict] = ()) -> None:
        """--jobs: measure a lever's uncached candidates side by side, N at a time (the search then
        answers them from their records). The gate is left to the search: a would-be winner that
        needs one is served again with it. `fill` (later levers' values on the same incumbent) takes
        the last wave's empty slots: the same cold-start time measures them too (2026-11-25 the Qwen3
        tune's waves held 1 and 2 of --jobs slots, one cold start each)."""
        if self.a.jobs < 2:
            return
        todo, keys, ids = [], set(), set()

        def add(c) -> None:
            cid = T.candidate_id(c)
            if cid in self.cached or cid in ids:
                return
            ids.add(cid)
            try:
                key = compile_key(load(self.base.name, self.a.set + T.as_sets(c)))
            except KitError:
                key = T.candidate_id(c)  # fails fast in its trial
            if key not in keys:  # two cold compiles into one cache dir at once: keep one
                keys.add(key)
                todo.append(c)
        for c in cands:
            add(c)
        if not todo:
            return
        for c in fill:
            if len(todo) % self.a.jobs == 0:
                break
            add(c)
        for b0 in range(0, len(todo), self.a.jobs):
            group = todo[b0:b0 + self.a.jobs]
            if len(group) < 2:
                return  # a lone candidate runs in the search's own order
            self.check_time()
            stamp = f"{time.strftime('%Y%m%dT%H%M%S')}-{b0 // self.a.jobs}"
            batch = (self.logs / f"batch-{stamp}.barrier", len(group), self.logs / f"batch-{stamp}.lock")
            print(f"  [batch] {len(group)} candidates side by side: {', '.join(T.label(c) for c in group)}",
                  file=sys.stderr)
            with server_slots(len(group), f"tune's batch of {len(group)}"), ThreadPoolExecutor(max_workers=len(group)) as pool:
                list(pool.map(lambda c: self.trial(c, lambda s: False, batch), group))

    def trial(self, overrides: dict, wants_gate, batch: tuple[Path, int, Path] | None = None) -> T.Outcome:
        started = time.time()
        cid, sets = T.candidate_id(overrides), self.a.set + T.as_sets(overrides)
        print(f"  [trial] {T.label(overrides)} ({cid})", file=sys.stderr)
        cand = {"id": cid, "label": T.label(overrides), "overrides": overrides, "status": "failed", "note": "",
                "score": None, "gate": None, "latency_record": None, "ready_s": None, "cache_dir": None}
        port = free_port()
        try:
            return self._trial(overrides, wants_gate, batch, started, cid, sets, cand, port)
        finally:
            if batch:  # a candidate that never probed must not hold the others at the barrier
                from scripts.probe import leave
                leave(batch[:2], str(port))

    def _trial(self, overrides, wants_gate, batch, started, cid, sets, cand, port) -> T.Outcome:
        try:
            v = load(self.base.name, sets + [f"PORT={port}"])
        except KitError as e:
            v, cand["note"] = load(self.base.name, self.a.set + [f"PORT={port}"]), f"invalid config: {e}"
        srv = None  # no server for an invalid config: its record falls back to the config's facts
        if not cand["note"]:
            cache = WEIGHTS / "cache" / "_tune" / self.base.name / compile_key(v)
            cand["cache_dir"] = _rel(cache)
            log = self.logs / f"tune-{cid}-{time.strftime('%Y%m%dT%H%M%S')}"
            srv = self.server(v, cache, log.with_suffix(".server.log"))
            try:
                srv.start()
                cand["ready_s"] = round(srv.wait_ready(), 2)
                before = {p for p, _ in records(self.base.name, None, self.state)}
                rc = self.probe(self.base.name, sets + [f"PORT={port}"], srv.url, self.state,
                                self.logs / f"tune-{cid}.png", log.with_suffix(".probe.log"), batch)
                path, rec = newest(self.state, self.base.name, "latency", v.config_sha256, before)
                if rc not in (0, 1) or rec is None:
                    cand["note"] = f"probe exited {rc} without a record (see {_rel(log.with_suffix('.probe.log'))})"
                else:
                    cand["latency_record"] = _rel(path)
                    cand["score"] = T.score(rec["payload"])
                    if rc == 1:
                        cand["status"], cand["note"] = "invalid", "; ".join(rec["payload"]["validity"]["errors"])[:300]
                    else:
                        cand["status"] = "ok"
                if cand["status"] == "ok" and self.a.search_gate != "none" and wants_gate(cand["score"]):
                    rc = self.gate(self.base.name, sets + [f"PORT={port}"], srv.url, self.a.search_gate, self.state,
                                   log.with_suffix(".gate.log"))
                    qpath, _ = newest(self.state, self.base.name, "quality", v.config_sha256, before)
                    cand["gate"] = {"mode": self.a.search_gate, "passed": {0: True, 1: False}.get(rc),
                                    "record": _rel(qpath) if qpath else None}
                    if rc != 0:
                        cand["status"] = "gate_failed" if rc == 1 else "failed"
                        cand["note"] = ("quality gate failed" if rc == 1 else f"gate exited {rc}") + \
                            f" (see {_rel(log.with_suffix('.gate.log'))})"
            except KitError as e:
                cand["note"] = str(e).splitlines()[0][:300]
            finally:
                srv.stop()
        cand["wall_s"] = round(time.time() - started, 2)
        self.walls.append(cand["wall_s"])
        if cand.get("ready_s"):
            self.readies.append(cand["ready_s"])
        rec = make_record("tune", v, {**self.common(), "scope": "candidate", "candidate": cand}, started=started,
                          server_argv=srv.argv if srv else None, server_env=srv.env if srv else None)
        write_record(rec, self.state)
        self.recs[cid] = rec
        print(f"    -> {cand['status']}" + (f": goodput {cand['score']['goodput_req_per_s']:g} req/s, TPOT c=1 "
                                           f"{cand['score']['tpot_c1_ms']} ms" if cand["score"] else "")
              + (f" ({cand['note']})" if cand["note"] else ""), file=sys.stderr)
        self.cached[cid] = cand
        self.measured.append(cid)
        return T.Outcome(overrides, cand["status"], cand["score"], cand["gate"], cand["note"])

    # -- the winner as its own variant --------------------------------------------------------
    def confirm(self, v, winner_cache: str | None) -> dict:
        """Start the written variant as itself, probe it and run the final gate: its own records."""
        src = ROOT / winner_cache if winner_cache else None
        if src and src.is_dir() and not v.cache_root.exists():
            shutil.copytree(src, v.cache_root, symlinks=True)  # the winner's compile cache: a warm start
        port = free_port()
        sets = self.a.set + self.winner_sets + [f"PORT={port}"]
        v = load(v.name, sets)
        out = {"latency_record": None, "latency_valid": None, "quality_record": None,
               "quality_mode": self.a.final_gate, "quality_passed": None, "score": None}
        log = self.logs / f"tune-confirm-{time.strftime('%Y%m%dT%H%M%S')}"
        srv = self.server(v, v.cache_root, log.with_suffix(".server.log"))
        srv.env.update(TRITON_CACHE_DIR=str(v.cache_root / "triton"))
        print(f"  [confirm] {v.name} as itself", file=sys.stderr)
        with srv:
            before = {p for p, _ in records(v.name)}
            rc = self.probe(v.name, sets, srv.url, None, None, log.with_suffix(".probe.log"))
            path, rec = newest(RESULTS, v.name, "latency", v.config_sha256, before)
            if path:
                out.update(latency_record=_rel(path), latency_valid=rc == 0, score=T.score(rec["payload"]))
            if self.a.final_gate != "none":
                rc = self.gate(v.name, sets, srv.url, self.a.final_gate, None, log.with_suffix(".gate.log"))
                qpath, _ = newest(RESULTS, v.name, "quality", v.config_sha256, before)
                out.update(quality_record=_rel(qpath) if qpath else None, quality_passed={0: True, 1: False}.get(rc))
        return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="make tune", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="the variant to start from")
    p.add_argument("--name", help="the variant to write (default: <base>-tuned)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help=f"a run condition for every server ({', '.join(CONDITION_KEYS)}), e.g. WEIGHTS=dummy")
    p.add_argument("--slo", default="ttft=500,tpot=30", help="p99 bounds, ttft=MS,tpot=MS (default: MLPerf interactive)")
    p.add_argument("--budget", default="8", help="N candidates and/or wall clock (90s, 20m, 2h), e.g. 6,20m (default: 8)")
    p.add_argument("--objective", choices=("goodput", "tpot"), default="goodput",
                   help="what wins: goodput at the SLO, or single-stream TPOT (default: goodput)")
    p.add_argument("--min-gain-pct", type=float, default=3.0, help="smallest gain that counts, beyond the noise (default: 3)")
    p.add_argument("--levers", help="comma list, in this order (default: every lever the variant exposes)")
    p.add_argument("--values", action="append", default=[], metavar="LEVER=V1,V2",
                   help="values of a one-key lever (max_num_seqs, max_num_batched_tokens, kv_cache_dtype), "
                        "or speculation depths in order: spec=0,2,4 (0 = off)")
    p.add_argument("--probe-args", default="", help="extra scripts.probe arguments (workload, levels, --repeats; default repeats 3)")
    p.add_argument("--gates", help="gates file for the quality gate (default: the variant's)")
    p.add_argument("--search-gate", default="sample", help="gate of a would-be winner: sample | limit:N | none (default: sample)")
    p.add_argument("--final-gate", default="full", help="gate of the written variant: full | sample | limit:N | none (default: full)")
    p.add_argument("--no-confirm", dest="confirm", action="store_false",
                   help="write the variant without re-measuring it as itself")
    p.add_argument("--seeds", default="auto", metavar="auto|none|V1,V2",
                   help="hand-made variants measured right after BASE, the best of which (beyond the noise) the "
                        "descent starts from; auto: every variant of BASE's MODEL not written by make tune "
                        "(default: auto)")
    p.add_argument("--state-dir", type=Path, help="candidate records (default: results/<name>/tune)")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="measure up to N of a lever's values side by side on one GPU (needs --set "
                        "SERVE_KV_CACHE_MEMORY_BYTES=<bytes> there); probes still take turns (default: 1)")
    return p


ONE_KEY = {"max_num_seqs": "SERVE_MAX_NUM_SEQS", "max_num_batched_tokens": "SERVE_MAX_NUM_BATCHED_TOKENS",
           "kv_cache_dtype": "SERVE_KV_CACHE_DTYPE"}


def spec_values(lever, text: str) -> tuple:
    """`--values spec=0,3,5`: speculation depths in the given order (0 = off), with the method the
    lever found. Order matters under --jobs: values are measured in batches of N, first ones first."""
    method = next(v["SPEC_METHOD"] for v in lever.values if v["SPEC_METHOD"] != "none")
    out = []
    for x in filter(None, (t.strip() for t in text.split(","))):
        if not x.isdigit():
            raise KitError(f"--values spec={text}: {x!r} is not a speculation depth (0 = off, 1..7)")
        k = int(x)
        out.append({"SPEC_METHOD": "none", "SPEC_K": 0} if k == 0 else {"SPEC_METHOD": method, "SPEC_K": k})
    return tuple(out)


def select(lever_list: list, names: str | None, values: list[str]) -> list:
    by = {lv.name: lv for lv in lever_list}
    if names:
        order = [n.strip() for n in names.split(",") if n.strip()]
        bad = [n for n in order if n not in by]
        if bad:
            raise KitError(f"--levers {','.join(bad)}: not exposed here (available: {', '.join(by)})")
        lever_list = [by[n] for n in order]
    out = []
    for lv in lever_list:
        for item in values:
            name, _, vals = item.partition("=")
            if name == lv.name and name == "spec":
                lv = T.Lever(lv.name, spec_values(lv, vals), lv.doc + " (--values)")
            elif name == lv.name:
                if name not in ONE_KEY:
                    raise KitError(f"--values {name}: only for spec, {', '.join(ONE_KEY)}")
                lv = T.Lever(lv.name, tuple({ONE_KEY[name]: x} for x in vals.split(",") if x), lv.doc + " (--values)")
        out.append(lv)
    return out


PARALLEL_KEYS = ("SERVE_TENSOR_PARALLEL_SIZE", "SERVE_DATA_PARALLEL_SIZE", "SERVE_PIPELINE_PARALLEL_SIZE")


def pick_seeds(a, base, name: str, weights_ok) -> tuple[list[tuple[str, dict]], list[str]]:
    """(name, overrides) of the seeds --seeds names, and why auto left other variants out.
    Explicit seeds that cannot run here are an error; auto skips them and says why."""
    from scripts.kit.variant import discover
    if a.seeds == "none":
        return [], []
    auto = a.seeds == "auto"
    names = discover() if auto else [n.strip() for n in a.seeds.split(",") if n.strip()]
    out, skipped = [], []
    for n in names:
        if n in (base.name, name):
            continue
        cfg_path = EXPERIMENTS / n / "config.env"
        if auto and cfg_path.is_file() and T.written_by_tune(cfg_path.read_text()):
            continue
        try:  # the run's rates are cut to the seed's K by seed_overrides, not validated against it here
            v = load(n, [x for x in a.set if not x.startswith("SPEC_ACCEPTANCE=")])
        except KitError as e:
            if auto:
                skipped.append(f"{n}: {str(e).splitlines()[0]}")
                continue
            raise KitError(f"--seeds {n}: {e}") from None
        why = None
        if v["MODEL"] != base["MODEL"]:
            why = f"another model ({v['MODEL']}, BASE serves {base['MODEL']})"
        elif any(int(v.config.get(k) or 1) > 1 for k in PARALLEL_KEYS):
            why = "needs more than one GPU (tensor/data/pipeline parallel)"
        o = T.seed_overrides(base.config, v.config) if why is None else {}
        if why is None and not o:
            why = "the same config as BASE"
        if why is None and not weights_ok(o):
            why = f"its weights are missing ({_rel(v.weights_dir)}; make download / make quantize)"
        if why is None:
            out.append((n, o))
        elif auto:
            if v["MODEL"] == base["MODEL"]:
                skipped.append(f"{n}: {why}")
        else:
            raise KitError(f"--seeds {n}: {why}")
    return out, skipped


def session_candidates(on_path: list[str], measured: list[str], cached: dict, win: str, seed_names: dict) -> list[dict]:
    """The session record's candidates: the search's path in order, then the candidates this run
    measured to fill a --jobs wave that the search never reached (the incumbent moved): their time was
    spent, and every measured candidate is evidence. Pareto over all of them; ids canonical (an older
    record may carry the id of a spelling since canonicalized)."""
    off_path = [i for i in dict.fromkeys(measured) if i not in on_path and i in cached]
    shown = [(i, cached[i]) for i in on_path + off_path]
    front = T.pareto([(i, c["score"]["goodput_req_per_s"], c["score"]["tpot_c1_ms"]) for i, c in shown
                      if c["status"] == "ok" and c["score"]["tpot_c1_ms"] is not None])
    out = []
    for i, c in shown:
        c = {**c, "id": i, "pareto": i in front, "winner": i == win}
        if i in off_path:
            c["off_path"] = True
        if i in seed_names:
            c["seed_of"] = seed_names[i]
        out.append(c)
    return out


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    try:
        a.budget_parsed = T.parse_budget(a.budget)
        slo = L.parse_slo(a.slo)
    except ValueError as e:
        raise KitError(str(e)) from None
    gate_mode(a.search_gate), gate_mode(a.final_gate)
    bad = [x for x in a.set if x.split("=", 1)[0] not in CONDITION_KEYS]
    if bad:
        raise KitError(f"--set {', '.join(bad)}: only run conditions ({', '.join(CONDITION_KEYS)}); "
                       "levers are the search's to set")
    base = load(a.base, a.set)
    from scripts.sweep import check_jobs
    check_jobs(a.jobs, base, host_platform())
    name = a.name or f"{a.base}-tuned"
    if not NAME_RE.match(name) or name == a.base:
        raise KitError(f"--name {name!r}: a new variant name ([a-z0-9._-], not BASE)")
    cfg_path = EXPERIMENTS / name / "config.env"
    if cfg_path.exists() and not T.written_by_tune(cfg_path.read_text()):
        raise KitError(f"{_rel(cfg_path)} exists and was not written by make tune; choose another --name")
    from scripts import probe as P
    probe_args = shlex.split(a.probe_args)
    if "--repeats" not in probe_args:
        probe_args += ["--repeats", "3"]  # a noise band needs repeats
    pa = P.parser().parse_args(["--variant", a.base, *probe_args])  # validates them here, not mid-search
    weights.require(base)
    platform = host_platform()
    settings = {"conditions": sorted(a.set), "slo": {"ttft_p99_ms": slo.ttft_p99_ms, "tpot_p99_ms": slo.tpot_p99_ms}, "probe_args": probe_args,
                "search_gate": a.search_gate, "gates": a.gates, "objective": a.objective,
                "min_gain_pct": a.min_gain_pct, "platform": platform, "device": device_provenance()["name"]}

    def weights_ok(o: dict) -> bool:
        try:
            return weights.is_complete(load(a.base, a.set + T.as_sets(o)).weights_dir)
        except KitError:
            return False
    lever_list, skipped = T.levers(base.config, platform, weights_ok, P.weights_config(base), pa.concurrency)
    lever_list = select(lever_list, a.levers, a.values)
    seeds, seed_skips = pick_seeds(a, base, name, weights_ok)
    tuner = Tuner(a, base, name, platform, settings)
    tuner.seed_names = {}
    for n, o in seeds:
        tuner.seed_names.setdefault(T.candidate_id(o), []).append(n)
    print(f"tune {a.base} -> {name}: seeds {', '.join(n for n, _ in seeds) or 'none'}; levers "
          f"{', '.join(lv.name for lv in lever_list)}; budget {a.budget}; "
          f"{len(tuner.cached)} candidate record(s) to resume from ({_rel(tuner.state)})", file=sys.stderr)
    for why in seed_skips:
        print(f"  seed skipped: {why}", file=sys.stderr)
    stop_on_signals()
    try:
        recorded = tuple(c["overrides"] for c in tuner.cached.values() if c["status"] == "ok")
        res = T.search(base.config, lever_list, tuner, T.Rule(a.objective, a.min_gain_pct), a.budget_parsed.candidates,
                       seeds=tuple(seeds), recorded=recorded)
    except KeyboardInterrupt:
        print("interrupted: finished candidates are recorded; run the same command to resume", file=sys.stderr)
        return 130
    from scripts.kit.summaries import tune as S
    win = T.candidate_id(res.incumbent)
    cands = session_candidates([o.id for o in res.outcomes], tuner.measured, tuner.cached, win, tuner.seed_names)
    session = {"levers": [{"name": lv.name, "doc": lv.doc, "values": [T.label(x) for x in lv.values]} for lv in lever_list],
               "skipped_levers": skipped, "seeds": [{"variant": n, "id": T.candidate_id(o)} for n, o in seeds],
               "skipped_seeds": seed_skips, "candidates": cands, "decisions": res.decisions,
               "untried": [{"label": l, "lever": lv} for l, lv in res.untried], "stop_reason": res.stop_reason,
               "schedule": res.schedule, "winner": {"id": win, "overrides": res.incumbent}, "confirm": None}
    keep, conds = T.split_conditions(res.incumbent)
    tuner.winner_sets = T.as_sets(conds)
    title = f"{name}: {a.base} tuned for {a.objective} under SLO {a.slo} ({T.label(keep)})"
    (EXPERIMENTS / name).mkdir(parents=True, exist_ok=True)
    cfg_path.write_text(T.config_env(a.base, keep, title))
    v = load(name)  # the writer's output must load; an error here is a bug in the writer
    payload = {**tuner.common(), "scope": "session", "session": session}
    readme = EXPERIMENTS / name / "README.md"

    def sources() -> list[dict]:
        """The records this session summarizes: its candidates' and, once done, the re-measurement's.
        The written variant `v` carries none of the run's conditions (WEIGHTS=dummy, the rates), so
        its config cannot say what ran: all 21 session records before 2026-11 said weights "real"."""
        out = [tuner.recs[c["id"]] for c in cands if c["id"] in tuner.recs]
        conf = (session["confirm"] or {}).get("latency_record")
        return out + ([load_record(ROOT / conf)] if conf else [])
    readme.write_text(S.readme(name, payload))
    if a.confirm:
        # On record before the re-measurement, so a cut one still leaves a session record that matches
        # the variant files just written (2026-11-23 a cut confirm left config.env ahead of every record).
        # The record written after it supersedes this one.
        write_record(make_record("tune", v, payload, started=tuner.t0, sources=sources()))
    try:
        if a.confirm:
            session["confirm"] = tuner.confirm(v, tuner.cached[win].get("cache_dir"))
    except KeyboardInterrupt:
        print("interrupted during the re-measurement: run the same command to redo it (the search's "
              "outcome is on record, not yet re-measured)", file=sys.stderr)
        return 130
    path = write_record(make_record("tune", v, payload, started=tuner.t0, sources=sources()))
    readme.write_text(S.readme(name, payload))
    from scripts.report import main as report_main
    report_main([])
    print(S.summary_text(payload) + f"\nvariant: {_rel(cfg_path)}\nrecord: {_rel(path)}\n"
          "to commit the variant, also run `make golden` (tests pin every variant's server argv)", file=sys.stderr)
    return 1 if (session["confirm"] or {}).get("quality_passed") is False else 0


if __name__ == "__main__":
    run_main(main)
