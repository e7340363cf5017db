"""Issue 30, end to end: `make check-schemas` (python -m scripts.check) in a real git clone of this
repository, with each tamper an audit got through: every one fails the check with a line naming its file.
One clone, all six tampers at once (the check reports every problem it finds), so the tree is checked once."""
import json
import os
import subprocess
import sys

import pytest

from scripts.kit.paths import ROOT

EDITED = "results/qwen3-4b-bf16/20261125T132152Z-serve_smoke.json"
REPEATS = "results/qwen3-4b-bf16/20261123T091447Z-latency.json"
DELETED = "results/qwen3-4b-bf16/20261123T172248Z-startup.json"
DUMMY = "results/qwen3-4b-bf16/20261123T091302Z-serve_smoke.json"  # its argv has --load-format dummy
MADE_UP = "results/qwen3-4b-bf16/20261126T120000Z-latency.json"


def sh(cwd, *args, env=None):
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout


def rehash(root, rel, new_bytes=None):
    f = root / "results" / "ledger.tsv"
    lines = [l for l in f.read_text().splitlines() if not l.endswith(f"  {rel}")]
    if new_bytes is not None:
        import hashlib
        lines.append(f"{hashlib.sha256(new_bytes).hexdigest()}  {rel}")
    f.write_text("".join(l + "\n" for l in lines))


@pytest.mark.slow
def test_each_tamper_fails_check_schemas_naming_its_file(tmp_path):
    if sh(ROOT, "git", "status", "--porcelain", "--", "results", "docs", "README.md").strip():
        pytest.skip("results/, docs/ or README.md has uncommitted changes: the clone would not hold them")
    root = tmp_path / "kit"
    sh(tmp_path, "git", "clone", "-q", str(ROOT), str(root))
    env = {**os.environ, "PYTHONPATH": str(root), "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    # 1. A record edited and its ledger line rehashed to match, committed together.
    rec = json.loads((root / EDITED).read_text())
    rec["payload"]["ready_s"] = round(rec["payload"]["ready_s"] / 2, 2)
    data = (json.dumps(rec, indent=2) + "\n").encode()
    (root / EDITED).write_bytes(data)
    rehash(root, EDITED, data)
    # 2. An uncited record and its ledger line deleted, committed.
    (root / DELETED).unlink()
    rehash(root, DELETED)
    sh(root, "git", "commit", "-qam", "tidy records", env=env)
    # 3. A made-up latency record with no samples, with its ledger line (not committed).
    fake = json.loads((root / REPEATS).read_text())
    fake["provenance"]["utc"] = "2026-11-26T12:00:00Z"
    from scripts.kit.record import load_record
    fake["provenance"]["git_commit"] = load_record(ROOT / REPEATS)["provenance"]["git_commit"]  # a valid one
    fake["payload"]["levels"][0]["tpot_ms"]["p50"] = 1.209
    data = (json.dumps(fake, indent=2) + "\n").encode()
    (root / MADE_UP).write_bytes(data)
    rehash(root, MADE_UP, data)
    # 4. Latency repeats edited against their median (and the ledger line rehashed).
    rec = json.loads((root / REPEATS).read_text())
    rec["payload"]["levels"][0]["repeats"][0]["output_tok_per_s"] += 40
    data = (json.dumps(rec, indent=2) + "\n").encode()
    (root / REPEATS).write_bytes(data)
    rehash(root, REPEATS, data)
    # 5. Dummy weights relabelled real through a new correction, against the record's own argv.
    (root / "results" / "corrections" / "20261126T160000Z-weights-real.json").write_text(json.dumps({
        "kind": "correction", "utc": "2026-11-26T16:00:00Z", "why": "these were the real weights, I am told. " * 2,
        "changes": [{"record": DUMMY, "pointer": "/provenance/weights", "was": "dummy", "now": "real"}]}))
    # 6. A figure in prose with no record marker.
    with open(root / "docs" / "measurement.md", "a") as f:
        f.write("\nOn an H100 the step now takes 1.209 ms.\n")
    r = subprocess.run([sys.executable, "-m", "scripts.check"], cwd=root, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 1, r.stderr[-2000:]
    err = r.stderr
    want = [f"{EDITED}: bytes differ from those first committed",
            f"results/ledger.tsv: the line for {EDITED} as first committed is gone",
            f"{DELETED}: a committed record (first added in",
            f"{MADE_UP}: keeps no per-request samples, and git has not seen it",
            f"{REPEATS}: concurrency 1: output_tok_per_s.min is",
            f"{DUMMY}: provenance.weights is 'real' but its server argv (payload.argv) says 'dummy'",
            "docs/measurement.md:"]
    missing = [w for w in want if w not in err]
    assert not missing, err[-3000:]
    assert "1.209 ms carries no record marker" in err
