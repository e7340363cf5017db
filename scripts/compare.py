"""`make compare A=... B=...`: is B faster than A, on this host, by how much, and how sure is that?

Serves A and B side by side on the same GPU (or uses two running servers, --url-a/--url-b), warms
both at every level, then times them interleaved: ROUNDS rounds, each one pass of every concurrency
level per side, in alternating order (A B, B A, A B, ...), the same request shapes for both (prompts
drawn afresh per round). Every pass keeps its per-request samples and the GPU's clocks, power,
throttle reasons, GPU processes and host load read before and after it.

Output: one `comparison` record under results/<B>/ (schemas/payloads/comparison.schema.json): per
level and metric, A's and B's value, the ratio (> 1 means B is better), its bootstrap 95% interval
and a verdict that names a winner only when the interval excludes 1. Exit 1 when a request failed
(the record says why); a server that dies mid-run is an error (exit 2) and writes nothing.

    python -m scripts.compare --a qwen3-4b-bf16 --b qwen3-4b-awq --set WEIGHTS=dummy \\
        --set SERVE_KV_CACHE_MEMORY_BYTES=4294967296 --set SERVE_GPU_MEMORY_UTILIZATION=0.3
    python -m scripts.compare --a tiny --b tiny --url-a http://127.0.0.1:8000 --url-b http://127.0.0.1:8001
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

from scripts import probe as P
from scripts.kit import compare as C
from scripts.kit import latency as L
from scripts.kit import procstat
from scripts.kit import weights
from scripts.kit.device import host_platform
from scripts.kit.errors import KitError, run_main
from scripts.kit.paths import RESULTS, rel as _rel
from scripts.kit.procs import ServerProcess, check_serves, free_port, port_free, server_slots, stop_on_signals
from scripts.kit.record import facts_from_argv, make_record, write_record
from scripts.kit.variant import load
from scripts.report import refresh_after_write


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="make compare", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    # Checked in main, not by argparse: `make compare` without A= passes no --a, and argparse's
    # "the following arguments are required: --a" names a flag the make user never typed.
    p.add_argument("--a", metavar="VARIANT", help="the reference (e.g. the BF16 baseline); make: A=")
    p.add_argument("--b", metavar="VARIANT", help="the candidate; the record goes under results/<B>/; make: B=")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override for both sides (repeatable)")
    p.add_argument("--set-a", action="append", default=[], metavar="KEY=VALUE", help="override for A only (repeatable)")
    p.add_argument("--set-b", action="append", default=[], metavar="KEY=VALUE", help="override for B only (repeatable)")
    p.add_argument("--url-a", help="time a running server as A instead of starting one")
    p.add_argument("--url-b", help="time a running server as B instead of starting one")
    for k in "ab":
        p.add_argument(f"--metrics-url-{k}", action="append", default=[], metavar="URL",
                       help=f"read {k.upper()}'s /metrics here, summed (repeatable): the replicas behind a router")
    p.add_argument("--rounds", type=int, default=C.ROUNDS, help=f"interleaved rounds (default: {C.ROUNDS}; at least 5)")
    P.add_workload_args(p, per_variant=True)
    p.add_argument("--results-dir", type=Path, default=RESULTS, help="where the record goes (default: results/)")
    p.add_argument("--lock", type=Path, metavar="FILE", help="exclusive lock held while timing ($KIT_PROBE_LOCK wins)")
    return p


class Side:
    """One side of the comparison: its variant, and the server timed as it (started here, or --url)."""

    def __init__(self, key: str, variant, url: str | None, platform: str, results_dir: Path):
        self.key, self.v, self.url, self.proc = key, variant, url, None
        # For a --url side this is the command `make serve` builds from the same variant and overrides:
        # what that server ran when it was started that way (started_here says which).
        self.argv = variant.to_argv(platform)
        if url is None:
            weights.require(variant)
            env = {**variant.to_env(platform), "VLLM_SERVER_DEV_MODE": "1"}
            log = results_dir / variant.name / "logs" / f"compare-{key}-{time.strftime('%Y%m%dT%H%M%S')}.log"
            self.proc = ServerProcess(self.argv, env, variant["HOST"], variant["PORT"], variant["READY_TIMEOUT_S"],
                                      log_path=log)
        self.srv, self.ready_s = None, None
        self.pids: list[int] = []  # the server's processes when it runs on this host (procstat), read once ready

    def describe(self) -> dict:
        return {"variant": self.v.name, "config_sha256": self.v.config_sha256, "config": dict(sorted(self.v.config.items())),
                "argv": self.argv, "started_here": self.proc is not None, "url": self.url, "ready_s": self.ready_s,
                **({"metrics_urls": self.srv.metrics_urls} if self.srv and self.srv.metrics_urls != [self.srv.url] else {})}


def fill_defaults(a) -> None:
    """The probe's per-host, per-variant defaults (scripts/probe.py resolve_defaults) from A, then the
    same values checked against B's context: both sides get one workload, and it must fit both."""
    import argparse as _ap
    for key, sets in (("a", a.set + a.set_a), ("b", a.set + a.set_b)):
        ns = _ap.Namespace(**vars(a))
        ns.variant, ns.set = getattr(a, key), sets
        P.resolve_defaults(ns)
        for f in [*(f.name for f in L.workload_fields()), "concurrency", "warmup_waves"]:
            setattr(a, f, getattr(ns, f))


def require_sides(a) -> None:
    missing = [k.upper() + "=" for k in "ab" if not getattr(a, k)]
    if missing:
        raise KitError(f"{' and '.join(missing)} not given: make compare A=<reference variant> B=<candidate variant>, "
                       f"e.g. `make compare A=tiny B=tiny` (python -m scripts.compare --a tiny --b tiny)")


def load_sides(a) -> tuple:
    """A and B resolved. Ports, when this run starts both servers (they are resident at once): A keeps
    its PORT (SET or SET_A, else config.env or the schema default); B keeps its own when it differs, else takes the
    next free port above A's (its config records it; SET_B=PORT=N chooses it). SET_A and SET_B naming one
    port for both is refused."""
    va = load(a.a, a.set + a.set_a)
    vb = load(a.b, a.set + a.set_b)
    if a.url_a is None and a.url_b is None and va["PORT"] == vb["PORT"]:
        if any(s.startswith("PORT=") for s in a.set_b):
            raise KitError(f"SET_B=PORT={vb['PORT']}: A has port {va['PORT']} too, and both servers run at once; "
                           f"give B another port")
        port = next_free_port(vb["HOST"], va["PORT"] + 1)
        vb = load(a.b, a.set + a.set_b + [f"PORT={port}"])
        print(f"compare: B ({vb.name}) on port {port}, the next free one above A's {va['PORT']} "
              f"(SET_B=PORT=N chooses it)", file=sys.stderr)
    return va, vb


def next_free_port(host: str, start: int) -> int:
    for port in range(start, min(start + 100, 65536)):
        if port_free(host, port):
            return port
    return free_port(host)


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    require_sides(a)
    if a.rounds < 5:
        raise KitError(f"--rounds {a.rounds}: a comparison needs at least 5 interleaved rounds")
    fill_defaults(a)
    w = P.workload(a)
    va, vb = load_sides(a)
    platform = host_platform()
    sides = {"a": Side("a", va, a.url_a, platform, a.results_dir), "b": Side("b", vb, a.url_b, platform, a.results_dir)}
    where = {k: s.url or f"{s.v['HOST']}:{s.v['PORT']}" for k, s in sides.items()}
    print(f"compare: A = {va.name} ({where['a']}), B = {vb.name} ({where['b']}); {a.rounds} rounds, levels {','.join(map(str, a.concurrency))}; "
          f"workload sha256 {w.sha256[:12]}", file=sys.stderr)
    started = time.time()
    stop_on_signals()
    from tqdm import tqdm
    try:
        with contextlib.ExitStack() as stack:
            starts = [s for s in sides.values() if s.proc]
            with server_slots(len(starts), "compare's two sides"):
                for s in starts:  # both start at once: their start-ups overlap, timing never does
                    stack.callback(s.proc.stop)
                    s.proc.start()
            for s in sides.values():
                if s.proc:
                    s.ready_s = round(s.proc.wait_ready_shown(f"starting {s.v.name} ({s.key.upper()})"), 2)
                    s.srv = P.Server(s.proc.url, s.proc, getattr(a, f"metrics_url_{s.key}"))
                else:
                    s.srv = P.Server(s.url, metrics_urls=getattr(a, f"metrics_url_{s.key}"))
                    if not s.srv.alive():
                        raise KitError(f"--url-{s.key} {s.url}: GET /health does not answer 200")
                check_serves(s.srv.url, s.v.name, f"side {s.key.upper()}")
                s.pids = procstat.server_pids(s.srv.url)
            per_level = sum(L.level_size(w, c) for c in a.concurrency)
            total = 2 * per_level * (a.warmup_waves + a.rounds)
            with P.exclusive(P.probe_lock(a.lock)), tqdm(total=total, unit="req", file=sys.stderr) as bar:
                passes = run_rounds(sides, w, a, bar)
    except KeyboardInterrupt:
        print("interrupted: no record written", file=sys.stderr)
        return 130
    payload = build_payload(sides, w, a, passes)
    rec = make_record("comparison", vb, payload, started=started, server_argv=sides["b"].argv)
    # A and B may differ in what ran (BF16 vs synthetic-acceptance speculation): say so.
    facts = [facts_from_argv(s.argv, {}) for s in sides.values()]
    for k in ("weights", "acceptance"):
        rec["provenance"][k] = facts[0][k] if facts[0][k] == facts[1][k] else "mixed"
    path = write_record(rec, a.results_dir)
    print(report_text(payload), file=sys.stderr)
    print(f"record: {_rel(path)}", file=sys.stderr)
    for s in sides.values():
        if s.proc:
            print(f"server log {s.key.upper()}: {_rel(s.proc.log_path)}", file=sys.stderr)
    refresh_after_write(path)
    if not payload["validity"]["valid"]:
        print("INVALID comparison:\n  " + "\n  ".join(payload["validity"]["errors"]), file=sys.stderr)
        return 1
    return 0


def run_rounds(sides: dict, w: L.Workload, a, bar) -> list[dict]:
    """Warm-up waves for both sides at every level, then the interleaved rounds; one pass dict each."""
    for c in a.concurrency:
        for wave in range(a.warmup_waves):
            for s in sides.values():
                bar.set_description(f"warm-up {s.key.upper()} c={c} {wave + 1}/{a.warmup_waves}")
                P.run_pass(s.srv, s.v.name, L.level_requests(w, c, wave, warmup=True), c, a.request_timeout_s, bar,
                           f"warm-up of {s.v.name} at c={c}")
    passes = []
    can_reset = {k: None for k in sides}
    for r, order in enumerate(C.round_order(a.rounds)):
        for key in order:
            s = sides[key]
            for c in a.concurrency:
                bar.set_description(f"round {r + 1}/{a.rounds} {key.upper()} c={c}")
                if can_reset[key] is not False:
                    can_reset[key] = s.srv.reset_prefix_cache()
                conds, queues = [], []
                sched0 = procstat.snapshot(s.pids)
                results, dt, delta = P.measured_pass(s.srv, s.v.name, L.level_requests(w, c, r), c, a, bar,
                                                     f"round {r + 1} of {s.v.name} at c={c}", conds, queues)
                sched = procstat.pass_summary(sched0, procstat.snapshot(s.pids), dt)
                samples = L.request_samples([{"results": results}])
                passes.append({"round": r, "side": key, "concurrency": c, "duration_s": round(dt, 4),
                               "samples": samples, "failures": sorted({x.failure() for x in results if not x.ok})[:5],
                               "conditions": conds[0], "metrics_delta": P._delta_json(delta),
                               "prefix_cache_reset": bool(can_reset[key]), "server_queue": queues[0],
                               "server_sched": sched})
    return passes


def build_payload(sides: dict, w: L.Workload, a, passes: list[dict]) -> dict:
    payload = {"workload": {**w.spec(), "sha256": w.sha256},
               "slo": {"ttft_p99_ms": a.slo.ttft_p99_ms, "tpot_p99_ms": a.slo.tpot_p99_ms},
               "rounds": a.rounds, "order": C.round_order(a.rounds), "warmup_waves": a.warmup_waves,
               "sides": {k: s.describe() for k, s in sides.items()},
               "bootstrap": {"iterations": C.BOOTSTRAP_ITERATIONS, "seed": C.BOOTSTRAP_SEED, "margin": C.MARGIN,
                             "method": "rounds resampled in pairs (a round's A and B passes together), then requests "
                                       "within each pass; 2.5th-97.5th percentile of the B-vs-A ratio"},
               "passes": passes}
    payload["metrics"] = C.metric_rows(passes, a.slo, a.rounds, margin=C.MARGIN)
    payload["prefix_cache"] = C.prefix_cache_rows(passes)
    payload["conditions"] = C.conditions_summary(passes)
    own = sum(int(s.v.config.get("SERVE_TENSOR_PARALLEL_SIZE") or 1) * int(s.v.config.get("SERVE_DATA_PARALLEL_SIZE") or 1)
              for s in sides.values())
    failed = [f"{p['side'].upper()} round {p['round'] + 1} c={p['concurrency']}: "
              f"{p['samples']['ok'].count(False)} failed ({'; '.join(p['failures'])})"
              for p in passes if not all(p["samples"]["ok"])]
    payload["validity"] = {"valid": not failed, "errors": failed, "warnings": C.warnings(payload, own)}
    return payload


def report_text(p: dict) -> str:
    a, b = p["sides"]["a"]["variant"], p["sides"]["b"]["variant"]
    rows = [f"B vs A (> 1: B better), {p['rounds']} rounds, bootstrap 95% interval:"]
    rows += ["  " + C.describe(r, a, b) for r in p["metrics"]]
    hits = [r for r in p.get("prefix_cache") or [] if r["hits_tokens"]]
    if hits:  # only where something hit: a routing comparison's figure, noise elsewhere
        rows.append("prefix-cache token hit rate (all rounds): " + ", ".join(
            f"{r['side'].upper()} c={r['concurrency']} {'-' if r['hit_rate'] is None else format(r['hit_rate'], '.1%')}"
            for r in p["prefix_cache"]))
    turns = [q for q in p["passes"] if "turn" in q["samples"]]
    if turns:  # a multi-turn workload: what the prefix cache (and the router that finds it) saves per turn
        rows.append("TTFT p50 ms by turn (all rounds):")
        for side in ("a", "b"):
            for c in sorted({q["concurrency"] for q in turns}):
                rs = [r for q in turns if q["side"] == side and q["concurrency"] == c for r in L.rows(q["samples"])]
                by = {t: L.stats(r["ttft_ms"] for r in rs if r["turn"] == t and r["ok"])["p50"]
                      for t in sorted({r["turn"] for r in rs})}
                rows.append(f"  {side.upper()} c={c}: " + ", ".join(f"turn {t} {v}" for t, v in by.items()))
    rows += host_rows(p["passes"])
    rows += [f"warning: {x}" for x in p["validity"]["warnings"]]
    return "\n".join(rows)


def host_rows(passes: list[dict]) -> list[str]:
    """One line a pass in the order they ran, where a pass has the host's counters: TPOT p50, and what the host did
    meanwhile (CPU steal and pressure, the server's busiest thread's share on a CPU and waiting for one). A step
    that moves between passes with these moving along is the host's doing."""
    from scripts.kit import device
    out = []
    for q in passes:
        c = q.get("conditions") or {}
        cpu = device.cpu_shares(c.get("before") or {}, c.get("after") or {})
        busy = (q.get("server_sched") or {}).get("busiest")
        if cpu["steal_pct"] is None and cpu["cpu_pressure_pct"] is None and not busy:
            continue  # a record made before the counters, or a host without them
        tpot = L.stats(x for x, ok in zip(q["samples"]["tpot_ms"], q["samples"]["ok"]) if ok and x is not None)["p50"]
        fmt = lambda v: "-" if v is None else f"{v:g}%"
        loops = [((c.get(w) or {}).get("host") or {}).get("python_loop_ms") for w in ("before", "after")]
        loops = [x for x in loops if x]
        out.append(f"  round {q['round'] + 1} {q['side'].upper()} c={q['concurrency']}: TPOT p50 {tpot} ms; steal "
                   f"{fmt(cpu['steal_pct'])}, CPU pressure {fmt(cpu['cpu_pressure_pct'])}"
                   + (f", python_loop_ms {'-'.join(f'{x:g}' for x in loops)}" if loops else "")
                   + (f"; busiest server thread ({busy['comm']}) on a CPU {busy['run_pct']:g}%, waiting "
                      f"{busy['wait_pct']:g}%, {busy['forced_switches']} forced switches" if busy else ""))
    return (["the host, pass by pass:"] + out) if out else []


if __name__ == "__main__":
    run_main(main)
