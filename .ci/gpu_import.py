"""Bring a GPU session's results into the repo, here, after its calls: python3 .ci/gpu_import.py SESSION DIR [DIR...]

SESSION is the session's folder name under results/gpu-sessions/ (its UTC start, e.g. 20261129T0735Z). Each DIR is
a folder a device call's files came back in (/work/.device/N/), holding gpu-session.sh collect's r.tgz (results/ and
experiments/), logs.tgz (jobs/) and srvlogs.tgz (results/*/logs/), or a leftover call's own tarball. Later DIRs
win: collect's tarballs hold everything so far.

What it does, and refuses:
- records (results/<variant>/*.json) the repo lacks are copied; one the repo holds must be byte-identical there,
  else it stops before writing anything (a committed record keeps its first bytes: never replace one);
- the ledger's new lines are appended only if the repo's ledger is, byte for byte, the start of the device's (a
  device that ran from another tree, or an import run twice, would otherwise rewrite history or add lines twice), or,
  for a second lease from one tree after a first one's import, if both start with that tree's committed ledger (the
  records' git_commit, read with git): then the device's lines past it that the repo lacks;
  each appended line's sha256 must match its record;
- server logs and traces go gzipped into results/gpu-sessions/SESSION/logs/<variant>/, job logs into logs/,
  `vllm bench serve` results (jobs/bench/*.json) as they are into logs/bench/, and
  py-spy start profiles (jobs/startprof-<variant>-HHMMSS.json) into results/profiles/ as
  <date>T<HHMMSS>Z-<variant>-startprof.speedscope.json.gz, and `make profile`'s traces (collect brings them
  back loose beside the tarballs, <stamp>-<variant>.trace.json.gz) into results/profiles/ as they are; files
  already there are left as they are; `make profile --host`'s samples (results/profiles/*.host.txt.gz, in r.tgz)
  come in as they are, and their raw copy beside the server log (*.host.txt) is left out. torch's own trace folders
  under results/*/logs/ (profile-<stamp>/) are
  left out: each holds the same trace as the loose file (session 20261129T1836Z's import stopped on one);
- experiments/ and derived files the device regenerated (measurements.json, mtp_k_sweep.json, docs/) are not taken:
  `make report` rebuilds them here from the records.
Then write the session's README, `make report`, `make check-schemas`, and commit.
"""
from __future__ import annotations

import gzip
import hashlib
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = re.compile(r"^results/[^/]+/\d{8}T\d{6}Z-[\w.-]+\.json$")
PROFILE = re.compile(r"^startprof-(?P<variant>.+)-(?P<hms>\d{6})\.json$")
TRACE = re.compile(r"^\d{8}T\d{6}Z-[\w.-]+\.trace\.json\.gz$")


class ImportRefused(Exception):
    pass


def stage(dirs: list[Path], into: Path) -> None:
    for d in dirs:
        tars = sorted(d.glob("*.tgz")) + sorted(d.glob("*.tar.gz"))
        # A call that brought back only traces is a DIR too (session 20261130T0158Z: a collect's 8 files were traces)
        if not tars and not any(TRACE.match(f.name) for f in d.iterdir()):
            raise ImportRefused(f"{d}: no .tgz or trace to import")
        for t in tars:
            with tarfile.open(t) as tf:
                tf.extractall(into, filter="data")
        for f in d.iterdir():
            if TRACE.match(f.name):
                (into / "traces").mkdir(exist_ok=True)
                shutil.copyfile(f, into / "traces" / f.name)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree_ledger(staged: Path, root: Path) -> bytes | None:
    """The ledger as committed in the tree the device ran (the one git_commit the records that came back name, from
    git here); None where they name none, or more than one, or git does not know it."""
    import json
    import subprocess
    commits = set()
    for f in staged.glob("results/*/*.json"):
        if not RECORD.match(f.relative_to(staged).as_posix()):
            continue
        try:
            commits.add((json.loads(f.read_text()).get("provenance") or {}).get("git_commit"))
        except (ValueError, AttributeError):
            return None
    if len(commits) != 1 or None in commits:
        return None
    r = subprocess.run(["git", "-C", str(root), "show", f"{commits.pop()}:results/ledger.tsv"], capture_output=True)
    return r.stdout if r.returncode == 0 else None


def plan(staged: Path, root: Path, session: str) -> dict:
    """What would be written, after every check; raises ImportRefused before anything is."""
    records = []
    for f in sorted(staged.glob("results/*/*.json")):
        rel = f.relative_to(staged).as_posix()
        if not RECORD.match(rel):
            continue
        mine = root / rel
        if mine.exists():
            if mine.read_bytes() != f.read_bytes():
                raise ImportRefused(f"{rel}: the repo's record differs from the device's; records are never replaced")
        else:
            records.append(rel)
    ledger, theirs = root / "results/ledger.tsv", staged / "results/ledger.tsv"
    new_lines: list[str] = []
    if theirs.exists():
        have, got = ledger.read_bytes() if ledger.exists() else b"", theirs.read_bytes()
        if got.startswith(have):
            new_lines = [line for line in got[len(have):].decode().splitlines() if line]
        else:
            # A second lease from the same tree (the first taken back mid-job, 2026-12-03): the repo's ledger has the
            # first lease's lines, the device's this one's, both after the tree's own ledger.
            base = tree_ledger(staged, root)
            if base is None or not got.startswith(base) or not have.startswith(base):
                raise ImportRefused("results/ledger.tsv: the repo's ledger is not the start of the device's, nor do both "
                                    "start with the ledger of the tree the device ran (another tree, or imported "
                                    "already and committed since?)")
            mine = set(have.decode().splitlines())
            new_lines = [line for line in got[len(base):].decode().splitlines() if line and line not in mine]
        for line in new_lines:
            digest, _, rel = line.partition("  ")
            src = staged / rel
            if not src.exists() or sha(src) != digest:
                raise ImportRefused(f"ledger line for {rel}: no record with that sha256 came back")
    logs = []
    sess = root / "results/gpu-sessions" / session / "logs"
    for f in sorted(staged.glob("results/*/logs/*")):
        # `make profile --host` leaves its raw py-spy samples beside the server log (<name>.host.txt) and keeps them
        # gzipped under results/profiles/, the path its host_profile record names (taken below): the raw copy would be
        # the same samples twice. Session 20261206T1931Z's first import took only the raw copies.
        if f.is_file() and not f.name.endswith(".host.txt"):
            logs.append((f, sess / f.parent.parent.name / (f.name + ".gz")))
    for f in sorted(staged.glob("jobs/*.log")):
        logs.append((f, sess / (f.name + ".gz")))
    # `vllm bench serve`'s result files (gpu-session.sh bs): a headline's upstream cross-check, kept as written (small
    # JSON, read by the session README). Session 20261202T0238Z's six came back in logs.tgz and were left there.
    for f in sorted(staged.glob("jobs/bench/*.json")):
        logs.append((f, sess / "bench" / f.name))
    day = session[:8]
    for f in sorted(staged.glob("jobs/startprof-*.json")):
        m = PROFILE.match(f.name)
        if m:
            name = f"{day}T{m['hms']}Z-{m['variant']}-startprof.speedscope.json.gz"
            logs.append((f, root / "results/profiles" / name))
    for f in sorted(staged.glob("traces/*")):
        logs.append((f, root / "results/profiles" / f.name))
    for f in sorted(staged.glob("results/profiles/*.host.txt.gz")):
        logs.append((f, root / "results/profiles" / f.name))
    return {"records": records, "ledger": new_lines, "logs": [(s, d) for s, d in logs if not d.exists()]}


def apply(p: dict, staged: Path, root: Path) -> None:
    for rel in p["records"]:
        dst = root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(staged / rel, dst)
    if p["ledger"]:
        with open(root / "results/ledger.tsv", "a") as f:
            f.write("".join(line + "\n" for line in p["ledger"]))
    for src, dst in p["logs"]:
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.parent.name in ("traces", "bench", "profiles"):  # gzipped already; bench JSON as the client wrote it
            shutil.copyfile(src, dst)
            continue
        with open(src, "rb") as i, gzip.open(dst, "wb") as o:
            shutil.copyfileobj(i, o)


def main(argv: list[str], root: Path = ROOT) -> int:
    if len(argv) < 2 or not re.fullmatch(r"\d{8}T\d{4}Z", argv[0]):
        print(__doc__.splitlines()[0], file=sys.stderr)
        print("SESSION: the session's UTC start as YYYYMMDDTHHMMZ, then one or more folders", file=sys.stderr)
        return 2
    session, dirs = argv[0], [Path(d) for d in argv[1:]]
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp)
        try:
            stage(dirs, staged)
            p = plan(staged, root, session)
        except (ImportRefused, OSError, tarfile.TarError) as e:
            print(f"gpu_import: {e}; nothing written", file=sys.stderr)
            return 1
        apply(p, staged, root)
    print(f"{len(p['records'])} record(s), {len(p['ledger'])} ledger line(s), {len(p['logs'])} log/profile file(s)")
    for rel in p["records"]:
        print("  " + rel)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
