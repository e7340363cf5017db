"""Immutable records: the ledger catches edited and unlisted records, git_commit must be a real commit
no newer than its record, corrections are applied by load_record and fail when stale. Each test builds
its own git repository in tmp_path."""
import json
import os
import subprocess
from types import SimpleNamespace

import pytest

from scripts.kit import ledger
from scripts.kit.errors import KitError
from scripts.kit.paths import RESULTS
from scripts.kit.record import load_record, write_record

# The smallest committed serve_smoke record: a real shape that validates.
TEMPLATE = json.loads((RESULTS / "qwen3-4b-bf16" / "20261123T091302Z-serve_smoke.json").read_text())
REC = "results/v/20261121T000000Z-serve_smoke.json"


def git(root, *args, date="2026-11-20T00:00:00Z"):
    env = {**os.environ, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date, "GIT_AUTHOR_NAME": "t",
           "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(root), *args], env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def record(sha, utc="2026-11-21T00:00:00Z", **prov):
    rec = json.loads(json.dumps(TEMPLATE))
    rec["provenance"].update(git_commit=sha, utc=utc, **prov)
    return rec


def put(root, rel, rec):
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(rec, indent=2, sort_keys=True) + "\n")
    return p


def commit(root, msg, date):
    git(root, "add", "-A")
    git(root, "commit", "-qm", msg, date=date)
    return git(root, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path):
    """A repository whose code commit c0 (2026-11-20) made one record, committed a day later."""
    git(tmp_path, "init", "-q")
    (tmp_path / "README.md").write_text("code\n")
    c0 = commit(tmp_path, "code", "2026-11-20T00:00:00Z")
    put(tmp_path, REC, record(c0))
    c1 = commit(tmp_path, "records", "2026-11-21T01:00:00Z")
    assert [l.split("  ")[1] for l in ledger.update(tmp_path)] == [REC]
    return SimpleNamespace(root=tmp_path, c0=c0, c1=c1)


def test_clean_tree_has_no_problems(repo):
    assert ledger.problems(repo.root) == []
    assert ledger.update(repo.root) == []


def test_edited_record_is_flagged_even_when_the_ledger_is_rebuilt(repo):
    put(repo.root, REC, record(repo.c0, git_dirty=not TEMPLATE["provenance"]["git_dirty"]))
    commit(repo.root, "silent edit", "2026-11-22T00:00:00Z")
    want = f"{REC}: bytes differ from those first committed ({repo.c1[:12]})"
    assert [p for p in ledger.problems(repo.root) if p.startswith(want)]
    assert [p for p in ledger.problems(repo.root) if p.startswith(f"{REC}: bytes differ from the ledger")]
    # The ledger hashes the bytes as first committed, not the edited ones.
    (repo.root / "results" / "ledger.tsv").unlink()
    ledger.update(repo.root)
    assert [p for p in ledger.problems(repo.root) if p.startswith(want)]


def rehash(root, rel):
    """The careless fix: the ledger line rewritten to the record's present bytes."""
    f = root / "results" / "ledger.tsv"
    f.write_text("".join(f"{ledger.sha256((root / rel).read_bytes())}  {rel}\n" if l.endswith(f"  {rel}") else l + "\n"
                         for l in f.read_text().splitlines()))


@pytest.mark.parametrize("committed", [False, True], ids=["in-the-tree", "committed"])
def test_edit_with_its_ledger_line_rehashed_is_caught_by_git(repo, committed):
    commit(repo.root, "ledger", "2026-11-21T02:00:00Z")
    put(repo.root, REC, record(repo.c0, git_dirty=not TEMPLATE["provenance"]["git_dirty"]))
    rehash(repo.root, REC)
    if committed:
        commit(repo.root, "records and ledger together", "2026-11-22T00:00:00Z")
    got = ledger.problems(repo.root)
    assert [p for p in got if p.startswith(f"{REC}: bytes differ from those first committed ({repo.c1[:12]})")]
    assert [p for p in got if p.startswith(f"results/ledger.tsv: the line for {REC} as first committed is gone")]
    assert not [p for p in got if "differ from the ledger" in p]  # the ledger alone would have passed it


@pytest.mark.parametrize("committed", [False, True], ids=["in-the-tree", "committed"])
def test_deleted_record_and_ledger_line_are_caught(repo, committed):
    put(repo.root, "results/v/other.json", record(repo.c0))
    ledger.update(repo.root)
    commit(repo.root, "ledger", "2026-11-21T02:00:00Z")
    (repo.root / REC).unlink()
    f = repo.root / "results" / "ledger.tsv"
    f.write_text("".join(l + "\n" for l in f.read_text().splitlines() if not l.endswith(REC)))
    if committed:
        commit(repo.root, "drop an uncited record", "2026-11-22T00:00:00Z")
    got = ledger.problems(repo.root)
    assert [p for p in got if p.startswith(f"{REC}: a committed record (first added in {repo.c1[:12]}) is gone")]
    assert [p for p in got if p.startswith(f"results/ledger.tsv: the line for {REC} as first committed is gone")]
    assert not [p for p in got if "other.json" in p]


def test_ledger_line_of_head_must_stay(repo):
    commit(repo.root, "ledger", "2026-11-21T02:00:00Z")
    f = repo.root / "results" / "ledger.tsv"
    f.write_text("")
    got = ledger.problems(repo.root)
    assert f"{REC}: not in results/ledger.tsv (run: python -m scripts.kit ledger)" in got
    assert [p for p in got if p.startswith(f"results/ledger.tsv: the line for {REC} as first committed is gone")]


def test_record_restored_to_its_first_bytes_passes(repo):
    """Session 20261125T0748Z's records were edited in place and later restored: first bytes are what count."""
    commit(repo.root, "ledger", "2026-11-21T02:00:00Z")
    first = (repo.root / REC).read_bytes()
    put(repo.root, REC, record(repo.c0, git_dirty=not TEMPLATE["provenance"]["git_dirty"]))
    rehash(repo.root, REC)
    commit(repo.root, "edit in place", "2026-11-22T00:00:00Z")
    (repo.root / REC).write_bytes(first)
    rehash(repo.root, REC)
    commit(repo.root, "restored", "2026-11-22T01:00:00Z")
    assert ledger.problems(repo.root) == []


def test_committed_correction_is_neither_deleted_nor_edited(repo):
    put(repo.root, "results/v/bad.json", record("HEAD"))
    ledger.update(repo.root)
    correction(repo.root, [{"record": "results/v/bad.json", "pointer": "/provenance/git_commit", "was": "HEAD",
                            "now": repo.c0}])
    c = commit(repo.root, "correction", "2026-11-25T18:00:00Z")
    name = "results/corrections/20261125T180000Z-fix.json"
    assert ledger.problems(repo.root) == []
    correction(repo.root, [{"record": "results/v/bad.json", "pointer": "/provenance/git_commit", "was": "HEAD",
                            "now": repo.c1}])
    assert [p for p in ledger.problems(repo.root) if p.startswith(f"{name}: bytes differ from those first committed ({c[:12]})")]
    (repo.root / name).unlink()
    commit(repo.root, "drop it", "2026-11-25T19:00:00Z")
    assert [p for p in ledger.problems(repo.root) if p.startswith(f"{name}: a committed correction (first added in {c[:12]}) is gone")]


def test_git_commit_not_in_repository(repo):
    put(repo.root, "results/v/b.json", record("0" * 40))
    put(repo.root, "results/v/c.json", record("HEAD"))
    ledger.update(repo.root)
    got = ledger.problems(repo.root)
    assert got == [f"results/v/b.json: provenance.git_commit {'0' * 12} is not a commit of this repository",
                   f"results/v/c.json: provenance.git_commit 'HEAD' is not a full commit sha "
                   f"(if git history tells the commit, write a correction: results/corrections/)"]


def test_record_older_than_its_commit(repo):
    put(repo.root, "results/v/old.json", record(repo.c1, utc="2026-11-21T00:57:00Z"))  # 3 min before c1
    put(repo.root, "results/v/skew.json", record(repo.c1, utc="2026-11-21T00:59:00Z"))  # within the clock tolerance
    ledger.update(repo.root)
    got = ledger.problems(repo.root)
    assert len(got) == 1 and got[0].startswith(f"results/v/old.json: provenance.utc 2026-11-21T00:57:00Z is older "
                                               f"than its git_commit {repo.c1[:12]}")


def test_record_missing_from_ledger_then_added_without_touching_existing_lines(repo):
    f = repo.root / "results" / "ledger.tsv"
    before = f.read_text()
    put(repo.root, "results/a/new.json", record(repo.c0))
    assert ledger.problems(repo.root) == ["results/a/new.json: not in results/ledger.tsv (run: python -m scripts.kit ledger)"]
    added = ledger.update(repo.root)
    assert [l.split("  ")[1] for l in added] == ["results/a/new.json"]
    assert f.read_text() == before + added[0] + "\n"  # appended: the committed lines keep their bytes and places
    assert ledger.problems(repo.root) == []
    (repo.root / "results/a/new.json").unlink()
    assert ledger.problems(repo.root) == ["results/a/new.json: in results/ledger.tsv but the file is gone"]


def test_write_record_appends_its_ledger_line(repo):
    path = write_record(record(repo.c0, utc="2026-11-22T00:00:00Z"), root=repo.root / "results")
    last = (repo.root / "results" / "ledger.tsv").read_text().splitlines()[-1]
    assert last == f"{ledger.sha256(path.read_bytes())}  {path.relative_to(repo.root).as_posix()}"
    assert ledger.problems(repo.root) == []


def correction(root, changes, name="20261125T180000Z-fix.json", utc="2026-11-25T18:00:00Z"):
    d = root / "results" / "corrections"
    d.mkdir(exist_ok=True)
    (d / name).write_text(json.dumps({"kind": "correction", "utc": utc, "why": "the commit was made up; " * 3,
                                      "changes": changes}))


def test_correction_is_applied_and_the_original_stays(repo):
    put(repo.root, "results/v/bad.json", record("HEAD"))
    ledger.update(repo.root)
    correction(repo.root, [{"record": "results/v/bad.json", "pointer": "/provenance/git_commit", "was": "HEAD",
                            "now": repo.c0}])
    assert load_record(repo.root / "results/v/bad.json")["provenance"]["git_commit"] == repo.c0
    assert json.loads((repo.root / "results/v/bad.json").read_text())["provenance"]["git_commit"] == "HEAD"
    assert ledger.problems(repo.root) == []
    # A later correction of the same field applies on top (utc order), here to "unknown": accepted
    # only because a correction set it.
    correction(repo.root, [{"record": "results/v/bad.json", "pointer": "/provenance/git_commit", "was": repo.c0,
                            "now": "unknown"}], name="20261125T190000Z-unknown.json", utc="2026-11-25T19:00:00Z")
    assert load_record(repo.root / "results/v/bad.json")["provenance"]["git_commit"] == "unknown"
    assert ledger.problems(repo.root) == []
    put(repo.root, "results/v/unk.json", record("unknown"))
    ledger.update(repo.root)
    assert [p for p in ledger.problems(repo.root) if p.startswith("results/v/unk.json: provenance.git_commit 'unknown'")]


def test_stale_correction_raises(repo):
    correction(repo.root, [{"record": REC, "pointer": "/provenance/git_commit", "was": "HEAD", "now": repo.c1}])
    with pytest.raises(KitError, match="stale correction"):
        load_record(repo.root / REC)
    correction(repo.root, [{"record": REC, "pointer": "/provenance/no_such", "was": 1, "now": 2}])
    with pytest.raises(KitError, match="stale correction"):
        load_record(repo.root / REC)


def test_correction_files_are_checked(repo):
    correction(repo.root, [{"record": "results/v/gone.json", "pointer": "/provenance/git_commit", "was": "x", "now": "y"}])
    correction(repo.root, [{"record": REC, "pointer": "provenance", "was": "x", "now": "y"}], name="20261125T180001Z-b.json")
    got = ledger.correction_problems(repo.root)
    assert got[0] == "results/corrections/20261125T180000Z-fix.json: changes[0].record results/v/gone.json is not a record file"
    assert got[1].startswith("results/corrections/20261125T180001Z-b.json: $.changes[0].pointer:")


def test_no_history_skips_the_commit_check(repo, capsys):
    put(repo.root, "results/v/b.json", record("0" * 40))
    ledger.update(repo.root)
    os.rename(repo.root / ".git", repo.root / "git.moved")
    assert ledger.problems(repo.root) == []
    err = capsys.readouterr().err
    assert "no .git: records' git_commit not checked" in err and "no .git: records not checked against git history" in err


def test_latency_record_without_samples_must_be_older_than_samples(repo):
    """Issue 30: a made-up latency record with no samples, once in the ledger, reached docs/results.md.
    Only records git saw before the probe kept samples (ledger.SAMPLES_SINCE; here c1) may lack them."""
    old = json.loads((RESULTS / "qwen3-4b-bf16" / "20261123T091447Z-latency.json").read_text())
    put(repo.root, "results/v/20261121T000001Z-latency.json", old)
    c2 = commit(repo.root, "an old latency record", "2026-11-21T02:00:00Z")
    put(repo.root, "results/v/20261122T000000Z-latency.json", old)
    commit(repo.root, "a new one without samples", "2026-11-22T00:00:00Z")
    put(repo.root, "results/v/20261123T000000Z-latency.json", old)  # not committed
    rels = [f"results/v/2026112{d}-latency.json" for d in ("1T000001Z", "2T000000Z", "3T000000Z")]
    assert ledger.unsampled_problems(rels, repo.root, since=c2) == [
        f"{rels[1]}: keeps no per-request samples, and was first committed after {c2[:12]}, since which the probe keeps them",
        f"{rels[2]}: keeps no per-request samples, and git has not seen it: a new latency record keeps them "
        f"(a record without them is not a measurement)"]
    assert ledger.unsampled_problems(rels[:1], repo.root, since=repo.c0) == [
        f"{rels[0]}: keeps no per-request samples, and was first committed after {repo.c0[:12]}, since which the probe keeps them"]


def test_code_sha256_must_be_the_code_of_git_commit(tmp_path):
    """A record carries the digest of the code it ran (read from disk); check-schemas recomputes it from its
    git_commit's blobs. On 2026-11-28 a device's stale .git named d60777e for tree bc2857c: this catches that."""
    from scripts.kit.record import tree_code_sha256
    git(tmp_path, "init", "-q")
    (tmp_path / "scripts" / "kit").mkdir(parents=True)
    (tmp_path / "scripts" / "kit" / "a.py").write_text("A = 1\n")
    (tmp_path / "scripts" / "run.sh").write_text("not code the digest reads\n")
    (tmp_path / "sitecustomize.py").write_text("# hook\n")
    old = commit(tmp_path, "code v1", "2026-11-20T00:00:00Z")
    (tmp_path / "scripts" / "kit" / "a.py").write_text("A = 2\n")
    new = commit(tmp_path, "code v2", "2026-11-20T01:00:00Z")
    ran = tree_code_sha256(tmp_path)  # the tree of `new`, as a copy on a device has it
    (tmp_path / "scripts" / "kit" / "__pycache__").mkdir()
    (tmp_path / "scripts" / "kit" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    assert tree_code_sha256(tmp_path) == ran  # bytecode is no code
    put(tmp_path, "results/v/right.json", record(new, code_sha256=ran))
    put(tmp_path, "results/v/stale.json", record(old, code_sha256=ran))  # the stale .git's commit
    commit(tmp_path, "records", "2026-11-21T01:00:00Z")
    ledger.update(tmp_path)
    got = [p for p in ledger.commit_problems(tmp_path) if "code_sha256" in p]
    assert got == [f"results/v/stale.json: provenance.code_sha256 is not the code of its git_commit {old[:12]}: the tree "
                   "that ran differed from that commit (a stale .git on the copy, or uncommitted code); if another "
                   "commit's code matches, write a correction naming it (results/corrections/)"]
    correction(tmp_path, [{"record": "results/v/stale.json", "pointer": "/provenance/git_commit", "was": old,
                           "now": new}])
    assert [p for p in ledger.commit_problems(tmp_path) if "code_sha256" in p] == []
