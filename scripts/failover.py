"""`make failover VARIANT=... [REPLICAS=N] [POLICY=...]`: a replica lost under load (issue 31 item 3).

Starts a fleet of the variant (scripts/kit/fleet.py: N replicas behind vllm-router), keeps
--concurrency closed-loop streams of the probe's seeded workload going through the router (after
--warmup-waves untimed waves), SIGKILLs
one replica's process group (--kill-replica; the fleet started it, so its group is known: nothing is
killed by name) --kill-after-s into the load, as soon as it holds a request (waiting at most
--kill-when-busy-s: a router that herds every request onto one replica at a time leaves the victim idle
much of the time), and keeps the load on while the fleet's supervisor
restarts it, until --after-s past the restarted replica's return (or --max-load-s in all).
Polled every 0.2 s meanwhile: the router's per-worker counters and health gauges (vllm-router names no
worker in its responses, so which replica was chosen is read from them, per poll, not per request); and
from --kill-after-s until the kill, polled faster, what the victim holds, as its engine and as the router
count it.
Output: one `failover` record (schemas/payloads/failover.schema.json) under results/<variant>/: every
request (sent/end seconds, outcome, TTFT), the kill time, the fleet's events, the router's series, and
the figures (scripts/kit/failover.py): failed vs in flight on the victim, when the router marked it
down and last chose it, TTFT p50/p99 before / while down / after, the restart's ready time.
Exit 1 when a request failed that was not in flight at the kill, or the replica did not come back; a
validity warning when the kill found the victim idle (nothing on it to lose: the loss check proves nothing).

    python -m scripts.failover --variant tiny --concurrency 2 --kill-after-s 5 --after-s 10 --warmup-waves 1 \\
        --input-lens 16 --class-weights 1 --output-min 16 --output-max 32
"""
from __future__ import annotations

import argparse
import itertools
import os
import signal
import sys
import threading
import time
from pathlib import Path

from scripts import probe as P
from scripts.kit import failover as F
from scripts.kit import latency as L
from scripts.kit import weights
from scripts.kit.errors import KitError, run_main
from scripts.kit.fleet import POLICIES, ROUTER_HEALTH, Fleet
from scripts.kit.paths import RESULTS, rel as _rel
from scripts.kit.procs import stop_on_signals
from scripts.kit.record import make_record, write_record
from scripts.kit.variant import load
from scripts.report import refresh_after_write
from scripts.serve import add_variant_args, describe

POLL_S = 0.2
# While the kill waits for the victim to hold a request: cache_aware at c=32 moved all requests from one
# replica to the other every 1-2 s (results/qwen3-4b-bf16/20261127T012000Z-failover.json), a turn on the
# victim lasting ~1.5 s; 0.05 s catches one near its start at 2 HTTP reads per poll.
BUSY_POLL_S = 0.05


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="make failover", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_variant_args(p)
    p.add_argument("--replicas", type=int, help="servers of the variant (default: its FLEET_REPLICAS)")
    p.add_argument("--policy", choices=POLICIES, help="vllm-router's policy (default: the variant's FLEET_POLICY)")
    p.add_argument("--kill-replica", type=int, default=0, help="which replica to SIGKILL (default: 0)")
    p.add_argument("--kill-after-s", type=float, default=30.0, help="seconds of load before the kill (default: 30)")
    # cache_aware's turns on a replica came every 1-2 s (BUSY_POLL_S): 10 s spans several, so a victim idle
    # that long is a finding in itself (the warning), not bad luck.
    p.add_argument("--kill-when-busy-s", type=float, default=10.0,
                   help="after --kill-after-s, hold the kill until the victim holds a request in flight (its engine's "
                        f"running + waiting or the router's count on it, read every {BUSY_POLL_S:g} s), at most this "
                        "many seconds; "
                        "then kill anyway and warn that the loss check proves nothing. 0: kill at --kill-after-s "
                        "whatever it holds (default: %(default)g)")
    p.add_argument("--after-s", type=float, default=30.0,
                   help="seconds of load after the router has the restarted replica back (default: 30)")
    p.add_argument("--max-load-s", type=float, default=900.0,
                   help="longest load in all, should the replica not come back (default: 900)")
    p.add_argument("--results-dir", type=Path, default=RESULTS, help="where records go (default: results/)")
    P.add_workload_args(p)
    return p


class Load:
    """`c` closed-loop streams through the router, each taking the next request of the workload's passes
    (level_requests at this level, pass 0, 1, ...: seeded, so two runs send the same requests)."""

    def __init__(self, url: str, model: str, w: L.Workload, c: int, timeout_s: float):
        self.url, self.model, self.timeout_s = url, model, timeout_s
        self.reqs = (r for i in itertools.count() for r in L.level_requests(w, c, i))
        self.lock, self.stop, self.done = threading.Lock(), threading.Event(), []
        self.streams = P.Streams()
        self.threads = [threading.Thread(target=self._slot, args=(i,), daemon=True) for i in range(c)]

    def _slot(self, slot: int) -> None:
        while not self.stop.is_set():
            with self.lock:
                req = next(self.reqs)
            res = P.stream_one(self.url, L.completion_body(self.model, req), self.timeout_s, self.streams)
            with self.lock:
                self.done.append((slot, res))

    def start(self) -> float:
        self.t0 = time.perf_counter()
        self.t0_unix = time.time()
        for t in self.threads:
            t.start()
        return self.t0

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def finish(self) -> None:
        """No new requests; those in flight end (each within its timeout)."""
        self.stop.set()
        for t in self.threads:
            t.join()

    def abort(self) -> None:
        self.stop.set()
        self.streams.abort()

    def columns(self) -> dict:
        """Every request, column-wise, by send time."""
        r3 = lambda x: round(x, 3)
        rows = sorted(self.done, key=lambda sr: sr[1].sent)
        return {"slot": [s for s, _ in rows], "sent_s": [r3(r.sent - self.t0) for _, r in rows],
                "end_s": [r3(r.end - self.t0) for _, r in rows], "ok": [r.ok for _, r in rows],
                "ttft_ms": [r3(r.ttft_ms) if r.chunk_times else None for _, r in rows],
                "output_tokens": [r.output_tokens for _, r in rows],
                "error": [None if r.ok else r.failure()[:200] for _, r in rows]}


def router_poll(metrics_url: str) -> dict | None:
    import requests
    try:
        r = requests.get(metrics_url + "/metrics", timeout=2)
    except requests.RequestException:
        return None
    return F.parse_router(r.text) if r.status_code == 200 else None


def run(fleet: Fleet, victim, w: L.Workload, c: int, a) -> dict:
    """The load, the kill and the restart; returns the payload's kept data (figures are added after)."""
    metrics_url = f"http://{fleet.host if fleet.host not in ('0.0.0.0', '') else '127.0.0.1'}:{fleet.metrics_port}"
    from tqdm import tqdm
    for wave in range(a.warmup_waves):  # untimed: a fresh server's first requests are not what the kill costs
        P.run_pass(P.Server(fleet.url), fleet.variant.name, L.level_requests(w, c, wave, warmup=True), c,
                   a.request_timeout_s, tqdm(disable=True), f"warm-up wave {wave + 1}")
    load_ = Load(fleet.url, fleet.variant.name, w, c, a.request_timeout_s)
    series, last = [], None
    victim_at = None
    kill_s = None

    def poll() -> tuple[float, dict | None]:
        nonlocal last
        t = load_.now()
        got = router_poll(metrics_url)
        if got is not None and got != last:
            series.append({"t_s": round(t, 3), **got})
            last = got
        return t, got

    def readings():
        """(t, engine, router): what the victim holds as its engine and the router count it, the router last
        (it counts a request still in the engine's API server), every BUSY_POLL_S until the load's end."""
        while True:
            engine = P.Server(victim.url).gauges()
            t, got = poll()
            yield (t, None if engine is None else int(engine["running"] + engine["waiting"]),
                   None if got is None else int(got["running"].get(victim.url, 0)))
            fleet.supervise()
            if load_.now() >= a.max_load_s:
                return
            time.sleep(BUSY_POLL_S)

    load_.start()
    try:
        while True:
            t, _ = poll()
            if kill_s is None and t >= a.kill_after_s:
                hit = F.kill_point(readings(), a.kill_after_s, a.kill_when_busy_s)
                if hit is None:
                    break
                kill_s = round(load_.now(), 3)
                os.killpg(victim.proc.pid, signal.SIGKILL)
                victim_at = hit[1]
                fleet.say(f"failover: SIGKILL to replica {victim.index}'s process group {victim.proc.pid} at "
                          f"{kill_s:.1f} s of load, {kill_s - a.kill_after_s:.1f} s past --kill-after-s (it held "
                          f"{victim_at['engine_at_kill']} requests, the router counted {victim_at['router_at_kill']} on it)")
                t = load_.now()
            fleet.supervise()
            if kill_s is not None:
                ready = next((e["t_unix"] - load_.t0_unix for e in fleet.events
                              if e["replica"] == victim.index and e["event"] == "ready"), None)
                back = F.first_poll(series, "healthy", victim.url, ready, lambda v: v == 1) if ready is not None else None
                gone = victim.index in fleet.given_up
                if (back is not None and t >= back + a.after_s) or gone or t >= a.max_load_s:
                    break
            elif t >= a.max_load_s:
                break
            time.sleep(POLL_S)  # a poll interval
        load_.finish()
    except BaseException:
        load_.abort()
        raise
    return {"load_started_unix": round(load_.t0_unix, 3), "kill_s": kill_s,
            "kill_waited_s": None if kill_s is None else round(max(kill_s - a.kill_after_s, 0.0), 3),
            "requests": load_.columns(), "router": series, "events": list(fleet.events),
            "victim": {"replica": victim.index, "url": victim.url, **(victim_at or {})}}


def checked(a) -> tuple:
    """(variant, workload, level) of parsed flags; what cannot run is refused before anything starts."""
    w = P.workload(a)
    if w.turns > 1:
        raise KitError(f"--turns {w.turns}: the failover load sends single requests (each slot takes the next one)")
    if len(a.concurrency) != 1:
        raise KitError(f"--concurrency {','.join(map(str, a.concurrency))}: one level (the load the kill lands in)")
    if a.kill_when_busy_s < 0:
        raise KitError(f"--kill-when-busy-s {a.kill_when_busy_s:g}: seconds, 0 or more (0: no wait)")
    if a.kill_after_s + a.kill_when_busy_s >= a.max_load_s:
        raise KitError(f"--kill-after-s {a.kill_after_s:g} + --kill-when-busy-s {a.kill_when_busy_s:g} >= --max-load-s "
                       f"{a.max_load_s:g}: the load could end before the kill")
    v = load(a.variant, a.set)
    n = L.max_model_len(v)
    if n and L.longest_prompt(w) + w.output_max > n:
        raise KitError(f"a {L.longest_prompt(w)}-token prompt + --output-max {w.output_max} > {v.name}'s max_model_len "
                       f"{n}; lower --input-lens / --output-max (or --prefix-tokens with --shared-prefixes)")
    return v, w, a.concurrency[0]


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    v, w, c = checked(a)
    fleet = Fleet(v, a.replicas, a.policy, log_dir=a.results_dir / v.name / "logs")
    if not 0 <= a.kill_replica < fleet.n:
        raise KitError(f"--kill-replica {a.kill_replica}: the fleet has replicas 0..{fleet.n - 1}")
    if fleet.n < 2:
        raise KitError(f"--replicas {fleet.n}: a failover needs a survivor (at least 2)")
    if fleet.max_restarts < 1:
        raise KitError("FLEET_MAX_RESTARTS=0: the killed replica would not come back; set it to 1 or more")
    weights.require(v)
    platform = fleet.platform
    print(describe(v, platform), file=sys.stderr)
    started = time.time()
    stop_on_signals()
    try:
        fleet.start()
        victim = fleet.replicas[a.kill_replica]
        kept = run(fleet, victim, w, c, a)
        served_again = F.served(victim.url) if victim.alive() else None
        if kept["kill_s"] is not None and fleet.restarting():
            say_still_starting(victim, a.max_load_s - kept["kill_s"])
    except KeyboardInterrupt:
        print("interrupted: no record written", file=sys.stderr)
        return 130
    finally:
        fleet.stop()
    if kept["kill_s"] is None:
        raise KitError(f"the load ended ({a.max_load_s:g} s) before the kill (--kill-after-s {a.kill_after_s:g}): "
                       "no kill, no record")
    payload = {"workload": {**w.spec(), "sha256": w.sha256}, "concurrency": c, "warmup_waves": a.warmup_waves,
               "fleet": {"replicas": fleet.n, "policy": fleet.policy, "max_restarts": fleet.max_restarts,
                         "router_health_args": ROUTER_HEALTH},
               "kill_after_s": a.kill_after_s, "kill_when_busy_s": a.kill_when_busy_s, "after_s": a.after_s, **kept,
               "victim_served_after_restart": served_again}
    payload["figures"] = F.summarize(payload)
    payload["validity"] = F.validity(payload)
    errors = payload["validity"]["errors"]
    rec = make_record("failover", v, payload, started=started,
                      server_argv=fleet.replicas[0].argv, server_env=fleet.replicas[0].env)
    path = write_record(rec, a.results_dir)
    print(report_text(payload), file=sys.stderr)
    print(f"record: {_rel(path)}", file=sys.stderr)
    refresh_after_write(path)
    if errors:
        print("INVALID run:\n  " + "\n  ".join(errors), file=sys.stderr)
        return 1
    return 0


def say_still_starting(victim, waited_s: float) -> None:
    """The load ended (--max-load-s) while the killed replica's restart was starting: where its start-up
    stood, from its log, before the fleet stops it (the log file stays; the record keeps only events)."""
    tail = victim.tail(12)
    print(f"replica {victim.index}: its restart was still starting when the load ended, {waited_s:.0f} s after the "
          f"kill (--max-load-s); raise --max-load-s if a start takes that long on this host. Last lines of "
          f"{victim.log_path}:\n{tail or '(empty)'}", file=sys.stderr, flush=True)


def report_text(p: dict) -> str:
    f = p["figures"]
    s = lambda x: "-" if x is None else f"{x:.1f} s"
    rows = [f"replica {p['victim']['replica']} SIGKILLed at {p['kill_s']:.1f} s of load at c={p['concurrency']} "
            f"({p['fleet']['replicas']} replicas, {p['fleet']['policy']}), {s(p.get('kill_waited_s'))} past --kill-after-s: "
            f"{f['failed']} of {f['requests']} requests failed; "
            f"{f['in_flight_at_kill']} were in flight (the victim held {p['victim']['in_flight_at_kill']})",
            f"router marked it down after {s(f['router_marked_down_s'])}, last chose it after "
            f"{s(f['router_last_chose_victim_s'])}; restart ready in {s(f['restart_ready_s'])} "
            f"(down {s(f['down_s'])}, back in the router after {s(f['router_back_s'])})"]
    for k, wdw in f["windows"].items():
        if wdw:
            t = wdw["ttft_ms"]
            rows.append(f"  {k:>6}: {wdw['requests']} requests, {wdw['failed']} failed, TTFT p50 {t['p50']} / p99 {t['p99']} ms")
    rows += [f"warning: {x}" for x in p["validity"].get("warnings", [])]
    return "\n".join(rows)


if __name__ == "__main__":
    run_main(main)
