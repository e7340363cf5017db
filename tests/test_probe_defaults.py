"""What a newcomer tripped on (issue 20, item 5): the probe's defaults on a small-context variant and a
CPU host, make eval-latency's PROBE= options, and Ctrl-C ending the probe at once. The Ctrl-C tests
stream from a FAKE server (tests/fake_openai_stream.py) whose tokens come seconds apart, so a probe
that waited for its requests would take far longer than the bounds here."""
from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest

from scripts import probe
from scripts.kit import latency as L
from scripts.kit.errors import KitError
from scripts.kit.paths import ROOT
from scripts.kit.variant import load
from tests.fake_openai_stream import FakeOpenAIStream


def planned(a) -> int:
    """Requests the probe sends for parsed flags `a` (as main counts them for its progress bar)."""
    return (sum((a.warmup_waves + a.repeats) * max(a.requests, c) for c in a.concurrency)
            + (a.prefix_requests if a.prefix_tokens else 0))


def fits(d: dict, n: int) -> bool:
    return (max(d["input_lens"]) + d["output_max"] <= n
            and (not d["prefix_tokens"] or d["prefix_tokens"] + d["prefix_suffix_tokens"] + d["output_min"] <= n))


# -- item 1: defaults that fit the variant and the host ------------------------------------------
def test_defaults_fit_the_variant_context_and_keep_the_gpu_plan_where_it_fits():
    tiny, qwen = load("tiny"), load("qwen3-4b-bf16")
    assert L.max_model_len(tiny) == 2048
    for platform in ("gpu", "cpu"):
        assert fits(L.defaults_for(tiny, platform), 2048), platform
    # tiny's GPU plan: the 4096-token class and the 2048-token prefix no longer overrun its context...
    g = L.defaults_for(tiny, "gpu")
    assert g["input_lens"] == (128, 1024, 1536) and g["prefix_tokens"] == 1856
    # ... while a 16k-context variant keeps the plan its records were measured with (same hash).
    q = L.defaults_for(qwen, "gpu")
    assert q["concurrency"] == L.CONCURRENCY and q["repeats"] == L.REPEATS
    assert L.Workload(**{f.name: q[f.name] for f in L.workload_fields()}).sha256 == L.Workload().sha256


def test_cpu_host_defaults_end_in_minutes_and_flags_win(monkeypatch):
    monkeypatch.setenv("KIT_PLATFORM", "cpu")
    a = probe.parser().parse_args(["--variant", "tiny"])
    assert planned(a) <= 30  # the GPU plan was 488 requests
    assert max(a.input_lens) + a.output_max <= 64 * 8 and a.concurrency == (1, 2)
    assert fits(vars(a), 2048)
    probe.workload(a)  # a consistent workload
    a = probe.parser().parse_args(["--variant", "tiny", "--concurrency", "4", "--repeats", "5",
                                   "--input-lens", "1000", "--class-weights", "1", "--output-max", "900"])
    assert (a.concurrency, a.repeats, a.input_lens, a.output_max) == ((4,), 5, (1000,), 900)
    # A length left out makes room for one given: the default prompts shrink under a long output.
    a = probe.parser().parse_args(["--variant", "tiny", "--output-max", "2000"])
    assert max(a.input_lens) + 2000 <= 2048 and a.output_min == 8
    # One output bound given: the other default follows it rather than contradict it.
    assert probe.parser().parse_args(["--variant", "tiny", "--output-max", "4"]).output_min == 4
    monkeypatch.setenv("KIT_PLATFORM", "gpu")
    assert probe.parser().parse_args(["--variant", "qwen3-4b-bf16"]).concurrency == L.CONCURRENCY


def test_lengths_given_beyond_the_context_are_refused_up_front(monkeypatch):
    monkeypatch.setenv("KIT_PLATFORM", "gpu")
    with pytest.raises(KitError, match=r"--input-lens 16,2040 with --output-max 512 \(default\).*"
                                       r"2552 > tiny's max_model_len 2048 \(SERVE_MAX_MODEL_LEN"):
        probe.main(["--variant", "tiny", "--url", "http://127.0.0.1:1", "--input-lens", "16,2040",
                    "--class-weights", "1,1"])
    with pytest.raises(KitError, match=r"--prefix-tokens 2000 \+ .* > tiny's max_model_len 2048"):
        probe.main(["--variant", "tiny", "--url", "http://127.0.0.1:1", "--prefix-tokens", "2000"])
    # The same lengths fit a 16k variant.
    assert probe.parser().parse_args(["--variant", "qwen3-4b-bf16", "--input-lens", "16,2040",
                                      "--class-weights", "1,1"]).input_lens == (16, 2040)


def test_help_tells_both_hosts_defaults_and_make_passes_probe_options():
    r = subprocess.run([sys.executable, "-m", "scripts.probe", "--help"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0
    flat = " ".join(r.stdout.split())
    assert "(default: GPU 1,4,8,16,32, CPU 1,2)" in flat
    assert "(default: GPU 128,1024,4096, CPU 16,64,256)" in flat
    assert "SERVE_MAX_MODEL_LEN" in flat
    r = subprocess.run(["make", "--no-print-directory", "-n", "eval-latency", "VARIANT=tiny", 'PROBE=--concurrency 1,2 --repeats 1',
                        "SET=PORT=8001 WEIGHTS=dummy"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "--set PORT=8001 --set WEIGHTS=dummy" in r.stdout and r.stdout.rstrip().endswith("--concurrency 1,2 --repeats 1")
    r = subprocess.run(["make", "--no-print-directory", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "PROBE=" in next(line for line in r.stdout.splitlines() if "eval-latency" in line)


# -- item 2: Ctrl-C ends the probe at once -------------------------------------------------------
SLOW = ["--concurrency", "2", "--repeats", "1", "--warmup-waves", "2", "--input-lens", "8",
        "--class-weights", "1", "--output-min", "10", "--output-max", "10", "--requests", "6",
        "--prefix-tokens", "0"]  # 2 x 6 warm-up requests of 10 tokens 2 s apart: over a minute


def _pool_threads():
    return [t for t in threading.enumerate() if t.name.startswith("ThreadPoolExecutor") and t.is_alive()]


@pytest.fixture
def ctrl_c_raises():
    """Ctrl-C as a terminal delivers it. A test run started in the background (nohup, `&`) inherits
    SIGINT ignored, and Python then installs no KeyboardInterrupt handler."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def test_ctrl_c_in_warm_up_returns_130_at_once_and_cuts_the_streams(tmp_path, capsys, ctrl_c_raises):
    main = threading.main_thread().ident
    with FakeOpenAIStream("tiny", ttft_s=0.05, itl_s=2.0) as fake:
        def ctrl_c():
            deadline = time.monotonic() + 30
            while fake.completions < 2 and time.monotonic() < deadline:  # both streams in flight
                time.sleep(0.05)
            time.sleep(1.0)
            signal.pthread_kill(main, signal.SIGINT)
        threading.Thread(target=ctrl_c, daemon=True).start()
        t0 = time.monotonic()
        rc = probe.main(["--variant", "tiny", "--url", fake.url, "--results-dir", str(tmp_path / "results"),
                         "--plot", str(tmp_path / "latency.png"), *SLOW])
        took = time.monotonic() - t0
        assert rc == 130
        assert took < 8, f"the probe waited {took:.1f} s for its requests"
        assert fake.completions == 2  # the queued ones were cancelled, never sent
        # The in-flight streams were cut (each had ~18 s to go), so no worker is left reading one.
        deadline = time.monotonic() + 2
        while _pool_threads() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _pool_threads()
    assert "interrupted during warm-up c=2: no record written" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.json"))


def test_ctrl_c_ends_the_probe_process_at_once(tmp_path):
    """As a user sees it: SIGINT to the process; it exits 130 within seconds (threads joined at exit)."""
    with FakeOpenAIStream("tiny", ttft_s=0.05, itl_s=2.0) as fake:
        # SIG_DFL in the child: Python then installs its KeyboardInterrupt handler even when this test
        # runs with SIGINT ignored (started in the background).
        p = subprocess.Popen(preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), args=[
                             sys.executable, "-m", "scripts.probe", "--variant", "tiny", "--url", fake.url,
                              "--results-dir", str(tmp_path / "results"), *SLOW],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while fake.completions < 2 and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.05)
        time.sleep(1.0)
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        try:
            _, err = p.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            raise
        took = time.monotonic() - t0
    assert p.returncode == 130, err
    assert took < 5, f"exit took {took:.1f} s after SIGINT"
    assert "interrupted during warm-up c=2: no record written" in err


def test_shared_prefixes_count_in_the_prompt_that_must_fit_the_context():
    """tiny serves 2048 tokens: 2000-token shared prefixes + 256-token prompts cannot fit, and are refused up
    front naming both flags; 1500 fit."""
    from scripts import probe
    from scripts.kit.errors import KitError
    with pytest.raises(KitError, match=r"--shared-prefixes 2 of --prefix-tokens 2000 \+ --input-lens .*2256-token prompt"):
        probe.parser().parse_args(["--variant", "tiny", "--shared-prefixes", "2", "--prefix-tokens", "2000"])
    a = probe.parser().parse_args(["--variant", "tiny", "--shared-prefixes", "2", "--prefix-tokens", "1500"])
    assert probe.workload(a).shared_prefixes == 2
