""".ci/gpu_import.py: a GPU session's tarballs into the repo, append-only.

Stood in: the device's tarballs (a GPU session cannot run here), built here in gpu-session.sh collect's layout
(r.tgz: results/; logs.tgz: jobs/; srvlogs.tgz: results/*/logs/). Real: the import, on a repo tree of its own.
"""
from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import tarfile
from pathlib import Path

from scripts.kit.paths import ROOT

_spec = importlib.util.spec_from_file_location("gpu_import", ROOT / ".ci" / "gpu_import.py")
gpu_import = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_import)

V = "qwen3.5-4b-bf16-tuned-dvg-quick6"
OLD, NEW = f"results/{V}/20261129T074222Z-bake.json", f"results/{V}/20261129T074300Z-startup.json"


def line(rel: str, data: bytes) -> str:
    return f"{hashlib.sha256(data).hexdigest()}  {rel}\n"


def tgz(path: Path, files: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def setup(tmp_path: Path, device_ledger: str | None = None, new_bytes: bytes = b'{"new": 1}\n'):
    repo, dev = tmp_path / "repo", tmp_path / "device"
    (repo / f"results/{V}").mkdir(parents=True)
    dev.mkdir()
    old = b'{"old": 1}\n'
    (repo / OLD).write_bytes(old)
    (repo / "results/ledger.tsv").write_text(line(OLD, old))
    ledger = device_ledger if device_ledger is not None else line(OLD, old) + line(NEW, new_bytes)
    tgz(dev / "r.tgz", {OLD: old, NEW: new_bytes, "results/ledger.tsv": ledger.encode(),
                        f"experiments/{V}/measurements.json": b"{}", "results/mtp_k_sweep.json": b"{}"})
    tgz(dev / "logs.tgz", {"jobs/main.log": b"job\n", f"jobs/startprof-{V}-075238.json": b'{"profiles": []}',
                           "jobs/bench/bench-headline-1-a-x.json": b'{"median_tpot_ms": 3.4}'})
    tgz(dev / "srvlogs.tgz", {f"results/{V}/logs/verify-20261129T074236.log": b"server\n"})
    return repo, dev


def test_new_records_ledger_lines_and_logs_come_in_once(tmp_path, capsys):
    repo, dev = setup(tmp_path)
    ledger_before = (repo / "results/ledger.tsv").read_text()
    assert gpu_import.main(["20261129T0735Z", str(dev)], root=repo) == 0
    assert (repo / NEW).read_bytes() == b'{"new": 1}\n'
    assert (repo / "results/ledger.tsv").read_text() == ledger_before + line(NEW, b'{"new": 1}\n')
    sess = repo / "results/gpu-sessions/20261129T0735Z/logs"
    assert gzip.decompress((sess / V / "verify-20261129T074236.log.gz").read_bytes()) == b"server\n"
    assert gzip.decompress((sess / "main.log.gz").read_bytes()) == b"job\n"
    assert (repo / f"results/profiles/20261129T075238Z-{V}-startprof.speedscope.json.gz").exists()
    assert (sess / "bench/bench-headline-1-a-x.json").read_bytes() == b'{"median_tpot_ms": 3.4}'
    assert not (repo / "experiments").exists() and not (repo / "results/mtp_k_sweep.json").exists()
    assert "1 record(s), 1 ledger line(s), 4 log/profile file(s)" in capsys.readouterr().out
    # The same tarballs again (run twice, or a later collect of the same session): nothing more.
    snapshot = {p: p.read_bytes() for p in repo.rglob("*") if p.is_file()}
    assert gpu_import.main(["20261129T0735Z", str(dev)], root=repo) == 0
    assert {p: p.read_bytes() for p in repo.rglob("*") if p.is_file()} == snapshot


def test_make_profiles_loose_trace_comes_in_as_is_and_torchs_trace_folder_stays_out(tmp_path, capsys):
    # Session 20261129T1836Z: the server-log tarball held torch's own trace folder (profile-<stamp>/), and the import
    # stopped on it after copying the records; collect also brings each profile's trace back loose.
    repo, dev = setup(tmp_path)
    trace = gzip.compress(b'{"traceEvents": []}')
    tgz(dev / "srvlogs.tgz", {f"results/{V}/logs/profile-20261129T183751.log": b"server\n",
                              f"results/{V}/logs/profile-20261129T183751/rank0.1.pt.trace.json.gz": trace})
    (dev / f"20261129T184526Z-{V}.trace.json.gz").write_bytes(trace)
    (dev / "notes.json").write_bytes(b"{}")  # not a trace: not taken
    assert gpu_import.main(["20261129T0735Z", str(dev)], root=repo) == 0
    assert (repo / f"results/profiles/20261129T184526Z-{V}.trace.json.gz").read_bytes() == trace
    sess = repo / "results/gpu-sessions/20261129T0735Z/logs" / V
    assert sorted(p.name for p in sess.iterdir()) == ["profile-20261129T183751.log.gz"]
    assert not list(repo.rglob("notes.json"))
    assert "1 record(s), 1 ledger line(s), 5 log/profile file(s)" in capsys.readouterr().out


def test_a_call_that_brought_back_only_traces_is_imported_beside_the_others(tmp_path, capsys):
    # Session 20261130T0158Z: one collect's 8 files were all traces, and the import refused that folder.
    repo, dev = setup(tmp_path)
    only = tmp_path / "traces-only"
    only.mkdir()
    trace = gzip.compress(b'{"traceEvents": [1]}')
    (only / f"20261130T022610Z-{V}.trace.json.gz").write_bytes(trace)
    assert gpu_import.main(["20261129T0735Z", str(dev), str(only)], root=repo) == 0
    assert (repo / f"results/profiles/20261130T022610Z-{V}.trace.json.gz").read_bytes() == trace


def _refused(repo: Path, dev: Path, capsys, why: str) -> None:
    snapshot = {p: p.read_bytes() for p in repo.rglob("*") if p.is_file()}
    assert gpu_import.main(["20261129T0735Z", str(dev)], root=repo) == 1
    err = capsys.readouterr().err
    assert why in err and "nothing written" in err
    assert {p: p.read_bytes() for p in repo.rglob("*") if p.is_file()} == snapshot


def test_a_record_the_repo_holds_with_other_bytes_stops_the_import(tmp_path, capsys):
    repo, dev = setup(tmp_path)
    (repo / OLD).write_bytes(b'{"old": 2}\n')
    _refused(repo, dev, capsys, "records are never replaced")


def test_a_ledger_the_repos_is_not_the_start_of_stops_the_import(tmp_path, capsys):
    repo, dev = setup(tmp_path, device_ledger=line(NEW, b'{"new": 1}\n'))
    _refused(repo, dev, capsys, "is not the start of the device's")


def test_a_second_lease_from_the_same_tree_brings_its_own_lines_after_the_first_ones(tmp_path, capsys):
    """Two leases ran one tree (the first taken back mid-job): the first's import added its line, so the repo's ledger
    is no longer the start of the second device's. Both start with the tree's committed ledger (real git here): the
    second's new line comes in after the first's, once; a device whose ledger is not the tree's is still refused."""
    import json
    import subprocess
    repo, dev = setup(tmp_path)
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True, text=True).stdout
    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "tree")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "tree")
    sha = git("rev-parse", "HEAD").strip()
    old = (repo / OLD).read_bytes()
    first = f"results/{V}/20261129T074100Z-bake.json"
    first_bytes = json.dumps({"provenance": {"git_commit": sha}}).encode()
    (repo / first).write_bytes(first_bytes)  # the first lease's import
    with open(repo / "results/ledger.tsv", "a") as f:
        f.write(line(first, first_bytes))
    second = json.dumps({"provenance": {"git_commit": sha}, "n": 2}).encode()
    tgz(dev / "r.tgz", {NEW: second, "results/ledger.tsv": (line(OLD, old) + line(NEW, second)).encode()})
    before = (repo / "results/ledger.tsv").read_text()
    assert gpu_import.main(["20261129T0735Z", str(dev)], root=repo) == 0
    assert (repo / "results/ledger.tsv").read_text() == before + line(NEW, second)
    assert gpu_import.main(["20261129T0735Z", str(dev)], root=repo) == 0  # again: nothing more
    assert (repo / "results/ledger.tsv").read_text() == before + line(NEW, second)
    third = f"results/{V}/20261129T074500Z-bake.json"
    other = json.dumps({"provenance": {"git_commit": sha}, "n": 3}).encode()
    tgz(dev / "r.tgz", {third: other, "results/ledger.tsv": line(third, other).encode()})  # not the tree's ledger
    _refused(repo, dev, capsys, "nor do both start with the ledger of the tree the device ran")


def test_a_ledger_line_without_its_record_stops_the_import(tmp_path, capsys):
    repo, dev = setup(tmp_path, new_bytes=b'{"new": 1}\n')
    tgz(dev / "r.tgz", {OLD: b'{"old": 1}\n', NEW: b'{"new": "other"}\n',
                        "results/ledger.tsv": (line(OLD, b'{"old": 1}\n') + line(NEW, b'{"new": 1}\n')).encode()})
    _refused(repo, dev, capsys, "no record with that sha256")


def test_a_bad_session_name_or_no_folder_is_a_usage_error(tmp_path, capsys):
    assert gpu_import.main(["2026-11-29", str(tmp_path)], root=tmp_path) == 2
    assert gpu_import.main(["20261129T0735Z"], root=tmp_path) == 2
    assert gpu_import.main(["20261129T0735Z", str(tmp_path)], root=tmp_path) == 1  # no tarball there
    assert "no .tgz or trace to import" in capsys.readouterr().err


def test_host_profile_samples_come_in_at_the_records_path_and_their_raw_copy_stays_out(tmp_path, capsys):
    # Session 20261206T1931Z: `make profile --host` keeps its py-spy samples gzipped under results/profiles/ (the path
    # its host_profile record names) and leaves the raw file beside the server log; the first import took only the raw
    # copy, so the records named files the repo lacked.
    repo, dev = setup(tmp_path)
    kept = gzip.compress(b"thread (1): MainThread;run_busy_loop (vllm/v1/engine/core.py:1) 3\n")
    name = f"20261206T194047Z-{V}.host.txt.gz"
    tgz(dev / "r.tgz", {f"results/profiles/{name}": kept})
    tgz(dev / "srvlogs.tgz", {f"results/{V}/logs/profile-20261206T193259.log": b"server\n",
                              f"results/{V}/logs/profile-20261206T193259.host.txt": gzip.decompress(kept),
                              f"results/{V}/logs/profile-20261206T193259.py-spy.log": b"py-spy\n"})
    assert gpu_import.main(["20261206T1931Z", str(dev)], root=repo) == 0
    assert (repo / "results/profiles" / name).read_bytes() == kept
    sess = repo / "results/gpu-sessions/20261206T1931Z/logs" / V
    assert sorted(p.name for p in sess.iterdir()) == ["profile-20261206T193259.log.gz",
                                                      "profile-20261206T193259.py-spy.log.gz"]
