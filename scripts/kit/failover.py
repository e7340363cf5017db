"""A replica lost under load: the figures of a `failover` record from what it keeps.

scripts/failover.py loads a fleet through its router, SIGKILLs one replica's process group and lets
the fleet's supervisor restart it. The record keeps every request (client times, outcome), the
router's per-worker counters as they changed, the fleet's events and the victim's own queue just
before the kill; summarize() turns those into the figures, and `make check-schemas` recomputes them
(mismatches). Times are seconds from the start of the load on the client's clock; kill_s is when
SIGKILL was sent: from kill_after_s, at the first reading of the victim holding a request, else once
kill_when_busy_s has passed (kill_point); validity() warns when the kill found it idle.

Windows of a request, by when it was sent: before (sent before the kill), down (from the kill until
the router has the restarted replica back: its health gauge at 1 again, else the replica's own ready
time), after (from then on).

    from scripts.kit.failover import summarize
    figures = summarize(payload)   # payload: requests, kill_s, router, events, victim
"""
from __future__ import annotations

import json
import re

from .latency import stats

_LINE = re.compile(r'^(vllm_router_[a-z_]+)\{([^}]*)\}\s+(\S+)')
_WORKER = re.compile(r'worker="([^"]+)"')
# The router's gauges and counters the record follows, per worker (vllm-router 0.1.17's names).
ROUTER_SERIES = {"vllm_router_processed_requests_total": "processed", "vllm_router_worker_health": "healthy",
                 "vllm_router_running_requests": "running"}


def parse_router(text: str) -> dict:
    """vllm-router's Prometheus text -> {"processed"|"healthy"|"running": {worker url: value}}."""
    out = {k: {} for k in ROUTER_SERIES.values()}
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m or m.group(1) not in ROUTER_SERIES:
            continue
        w = _WORKER.search(m.group(2))
        if w:
            out[ROUTER_SERIES[m.group(1)]][w.group(1)] = float(m.group(3))
    return out


def first_poll(series: list[dict], key: str, worker: str, after: float, want) -> float | None:
    """Time of the first router poll at or after `after` whose `key` for `worker` satisfies want(value)."""
    for s in series:
        v = s[key].get(worker)
        if s["t_s"] >= after and v is not None and want(v):
            return s["t_s"]
    return None


def _event_t(p: dict, event: str) -> float | None:
    """Seconds from the load's start of the victim's first `event` after the kill (events carry unix times)."""
    for e in p["events"]:
        t = round(e["t_unix"] - p["load_started_unix"], 3)
        if e["replica"] == p["victim"]["replica"] and e["event"] == event and t >= p["kill_s"]:
            return t
    return None


def victim_at_kill(engine: int | None, router: int | None) -> dict:
    """What the victim holds, as its engine counts (running + waiting) and as the router does (None: not
    read): the engine misses a request still in its API server, so the larger is the most a kill may cost."""
    held = max((n for n in (engine, router) if n is not None), default=None)
    return {"engine_at_kill": engine, "router_at_kill": router, "in_flight_at_kill": held,
            "busy_at_kill": bool(held)}


def kill_due(t: float, held: int | None, kill_after_s: float, when_busy_s: float) -> bool:
    """Kill now, at t s of load, the victim holding `held` requests (None: not read)? From kill_after_s on:
    once it holds one, or once when_busy_s more have passed with it idle; when_busy_s 0: at once."""
    return t >= kill_after_s and (when_busy_s <= 0 or bool(held) or t >= kill_after_s + when_busy_s)


def kill_point(readings, kill_after_s: float, when_busy_s: float) -> tuple[float, dict] | None:
    """The first of `readings` ((t, engine, router), the victim's counts as victim_at_kill takes them) to
    kill at, as (t, victim_at_kill); None when they end before one is due."""
    for t, engine, router in readings:
        v = victim_at_kill(engine, router)
        if kill_due(t, v["in_flight_at_kill"], kill_after_s, when_busy_s):
            return t, v
    return None


def validity(p: dict) -> dict:
    """A payload with figures -> {valid, errors, warnings}. Invalid: a request lost that was not in flight at
    the kill, a replica that did not come back, or a restart that served nothing. A kill that found the
    victim idle is a warning: nothing could be lost, so lost_only_in_flight holds whatever the router does."""
    f, held, errors, warnings = p["figures"], p["victim"]["in_flight_at_kill"], [], []
    if not f["lost_only_in_flight"]:
        errors.append(f"{f['failed']} request(s) failed, {f['failed_not_in_flight_at_kill']} of them not in flight at "
                      f"the kill (the victim held {held})")
    if f["down_s"] is None:
        errors.append("the killed replica did not come back (see events)")
    if not p["victim_served_after_restart"]:
        errors.append("the restarted replica served no request")
    if not held:
        what = "it held no request" if held == 0 else "neither its engine nor the router answered"
        wait = p.get("kill_when_busy_s")  # absent in records from before the flag
        how = (f", after waiting {wait:g} s for one (--kill-when-busy-s)" if wait else
               " (--kill-when-busy-s 0: no wait)" if wait == 0 else "")
        warnings.append(f"the kill found the victim idle: {what}{how}; with no request in flight on it to lose, "
                        "'lost only in flight' proves nothing")
    return {"valid": not errors, "errors": errors, "warnings": warnings}


def served(url: str) -> int | None:
    """Requests a vLLM server has finished since it started (vllm:request_success_total, all reasons);
    None when its /metrics does not answer."""
    import requests
    try:
        text = requests.get(url + "/metrics", timeout=10).text
    except requests.RequestException:
        return None
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("vllm:request_success_total")))


def summarize(p: dict) -> dict:
    """The record's figures from its kept data (see the module docstring)."""
    kill, reqs, victim = p["kill_s"], p["requests"], p["victim"]["url"]
    rows = [dict(zip(reqs, vals)) for vals in zip(*reqs.values())]
    failed = [r for r in rows if not r["ok"]]
    in_flight = [r for r in rows if r["sent_s"] <= kill < r["end_s"]]
    outside = [r for r in failed if not r["sent_s"] <= kill < r["end_s"]]
    ready = _event_t(p, "ready")
    series = p["router"]
    unhealthy = first_poll(series, "healthy", victim, kill, lambda v: v == 0)
    back = first_poll(series, "healthy", victim, ready, lambda v: v == 1) if ready is not None else None
    # The router's processed-requests counter for the victim, while it was down: its last increase says
    # when the router last chose it (a request it then retried elsewhere, or one that failed).
    last_sent = None
    prev = None
    for s in series:
        v = s["processed"].get(victim)
        if prev is not None and v is not None and v > prev and kill <= s["t_s"] and (ready is None or s["t_s"] < ready):
            last_sent = s["t_s"]
        prev = v if v is not None else prev
    up_again = back if back is not None else ready

    def window(lo, hi):
        mine = [r for r in rows if r["sent_s"] >= lo and (hi is None or r["sent_s"] < hi)]
        ok = [r for r in mine if r["ok"]]
        return {"requests": len(mine), "failed": len(mine) - len(ok), "ttft_ms": stats(r["ttft_ms"] for r in ok)}

    r3 = lambda x: None if x is None else round(x, 3)
    limit = p["victim"]["in_flight_at_kill"]
    return {
        "requests": len(rows), "failed": len(failed),
        "in_flight_at_kill": len(in_flight),
        "failed_not_in_flight_at_kill": len(outside),
        # Only requests the victim held may fail: every failure was in flight at the kill, and no more
        # failed than the victim held just before it (victim.in_flight_at_kill).
        "lost_only_in_flight": not outside and (limit is None or len(failed) <= limit),
        "router_marked_down_s": r3(unhealthy - kill) if unhealthy is not None else None,
        "router_last_chose_victim_s": r3(last_sent - kill) if last_sent is not None else None,
        "restart_ready_s": next((e["ready_s"] for e in p["events"] if e["replica"] == p["victim"]["replica"]
                                 and e["event"] == "ready"), None),
        "down_s": r3(ready - kill) if ready is not None else None,
        "router_back_s": r3(back - kill) if back is not None else None,
        "windows": {"before": window(0.0, kill), "down": window(kill, up_again),
                    "after": window(up_again, None) if up_again is not None else None},
    }


def mismatches(p: dict) -> list[str]:
    """Each figure of a failover payload that its kept requests, series and events do not give back; and
    victim.busy_at_kill (records since --kill-when-busy-s) where its counts say otherwise."""
    again = summarize(p)
    out = [f"figures.{k} is {json.dumps(p['figures'].get(k))[:120]} but its data give {json.dumps(v)[:120]}"
           for k, v in again.items() if p["figures"].get(k) != v]
    v = p["victim"]
    if "busy_at_kill" in v and v["busy_at_kill"] != bool(v["in_flight_at_kill"]):
        out.append(f"victim.busy_at_kill is {json.dumps(v['busy_at_kill'])} but in_flight_at_kill is {v['in_flight_at_kill']}")
    return out
