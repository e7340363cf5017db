"""Immutable records: results/ledger.tsv, results/corrections/, and provenance that names real code.

A committed record is never edited. results/ledger.tsv keeps one `<sha256>  <path>` line per record
file (the format of `sha256sum`, so `cd <repo> && sha256sum -c results/ledger.tsv` checks it too):
the hash of the bytes as first committed to git, or as written for a record git has not seen yet.
Git is the ledger's witness: where history exists, check-schemas compares each record and correction
with the blob of the commit that first added it, and the ledger with its committed versions.
What a record got wrong is fixed by a correction beside it, results/corrections/<UTC>-<slug>.json
(schemas/correction.schema.json): RFC 6901 pointers with the value `was` and the value `now`, which
record.load_record applies in utc order. The original's bytes stay as measured; the ledger proves it.

    python -m scripts.kit ledger     # add lines for records not in the ledger (never changes one)
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from .errors import KitError
from .paths import ROOT, atomic_write
from .schema import first_error, json_path, load_schema

LEDGER = "ledger.tsv"
CORRECTIONS = "corrections"
LINE_RE = re.compile(r"([0-9a-f]{64})  (\S.*)")
CORRECTION_NAME_RE = re.compile(r"[0-9]{8}T[0-9]{6}Z-[A-Za-z0-9][A-Za-z0-9._-]*\.json")
SHA_RE = re.compile(r"[0-9a-f]{40}")
CLOCK_TOLERANCE_S = 120  # the GPU machine's clock against the committer's


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def record_files(root: Path = ROOT) -> list[str]:
    """Every record file under root/results, as 'results/...' paths, sorted."""
    return sorted(rel for p in (root / "results").rglob("*.json")
                  if _is_record(rel := p.relative_to(root).as_posix()))


def _is_record(rel: str) -> bool:
    """Whether 'results/...' names a record file: not a correction, log, hidden file or derived sweep."""
    from .summaries.sweep import K_SWEEP_FILE  # derived by make report, not a record
    parts = rel.split("/")[1:]
    return rel.endswith(".json") and parts[0] != CORRECTIONS and "logs" not in parts \
        and not any(x.startswith(".") for x in parts) and parts != [K_SWEEP_FILE]


def _locate(path) -> tuple[Path | None, str]:
    """(the results/ folder above path, path as 'results/...'); (None, '') outside any."""
    p = Path(path).resolve()
    for d in p.parents:
        if d.name == "results":
            return d, p.relative_to(d.parent).as_posix()
    return None, ""


# -- the ledger -------------------------------------------------------------------------------

def read_ledger(root: Path = ROOT) -> tuple[dict[str, set[str]], list[str]]:
    """({path: hashes}, problem lines). A path has two hashes only after a bad merge or hand edit."""
    f = root / "results" / LEDGER
    got: dict[str, set[str]] = {}
    bad = []
    if not f.is_file():
        return got, [f"results/{LEDGER}: missing (run: python -m scripts.kit ledger)"]
    for n, line in enumerate(f.read_text().splitlines(), 1):
        m = LINE_RE.fullmatch(line)
        if m:
            got.setdefault(m[2], set()).add(m[1])
        elif line.strip():
            bad.append(f"results/{LEDGER}:{n}: not '<sha256>  <path>': {line[:80]!r}")
    return got, bad


def append(path: Path) -> None:
    """Add a just-written record's line to its results/ledger.tsv, if that exists (a test's scratch
    results/ has none). One O_APPEND write of one line: concurrent writers (tune --jobs) interleave
    whole lines; `ledger` sorts them later, the checker does not care about order."""
    results, rel = _locate(path)
    if results is None or not (results / LEDGER).is_file():
        return
    fd = os.open(results / LEDGER, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, f"{sha256(Path(path).read_bytes())}  {rel}\n".encode())
    finally:
        os.close(fd)


def _git(root: Path, *args: str, data: bytes | None = None) -> bytes:
    r = subprocess.run(["git", "-C", str(root), "-c", "core.quotePath=false", *args], input=data,
                       capture_output=True)
    if r.returncode:
        raise KitError(f"git {args[0]} in {root}: {r.stderr.decode(errors='replace').strip()}")
    return r.stdout


def _has_history(root: Path) -> bool:
    return (root / ".git").exists()


def _is_correction(rel: str) -> bool:
    return rel.startswith(f"results/{CORRECTIONS}/") and rel.endswith(".json") and rel.count("/") == 2


@dataclass
class History:
    """What git witnessed under results/, from one `git log --raw` pass: `first` maps each path ever
    added to (the commit that first added it, that blob's id); `ledgers` are the blob ids of every
    committed results/ledger.tsv, oldest first."""
    first: dict[str, tuple[str, str]]
    ledgers: list[str]


def history(root: Path = ROOT) -> tuple[History | None, str]:
    """(History, ''), or (None, why not) where git cannot witness: no .git (a tarball), or a shallow
    clone, whose oldest commit is not where a file was first added."""
    if not _has_history(root):
        return None, f"{root} has no .git"
    if _git(root, "rev-parse", "--is-shallow-repository").strip() == b"true":
        return None, "shallow clone (git fetch --unshallow)"
    first: dict[str, tuple[str, str]] = {}
    ledgers: list[str] = []
    commit = ""
    log = _git(root, "log", "--raw", "--no-abbrev", "--no-renames", "--format=%x00%H", "--", "results")
    for line in log.decode().splitlines():
        if line.startswith("\0"):
            commit = line[1:]
        elif line.startswith(":"):
            meta, rel = line.split("\t", 1)
            blob, status = meta.split()[3:5]
            if status == "A":
                first[rel] = (commit, blob)  # newest first: the last one seen is the first add
            if rel == f"results/{LEDGER}" and status != "D":
                ledgers.append(blob)
    return History(first, ledgers[::-1]), ""


def _blob_id(data: bytes, like: str) -> str:
    """git's object id of data as a blob, in the repository's hash (sha1, or sha256 where ids are 64 long)."""
    h = hashlib.sha256() if len(like) == 64 else hashlib.sha1()
    h.update(b"blob %d\0" % len(data) + data)
    return h.hexdigest()


def _blobs(root: Path, specs: list[str]) -> list[bytes | None]:
    """Contents of objects (`<commit>:<path>`, `<sha>^{commit}`), None where missing; one
    `git cat-file --batch` call."""
    raw = _git(root, "cat-file", "--batch", data="".join(s + "\n" for s in specs).encode())
    out, i = [], 0
    for _ in specs:
        nl = raw.index(b"\n", i)
        head = raw[i:nl].split()
        if len(head) != 3:  # "<name> missing" / "ambiguous"
            out.append(None)
            i = nl + 1
            continue
        size = int(head[2])
        out.append(raw[nl + 1:nl + 1 + size])
        i = nl + 1 + size + 1
    return out


def update(root: Path = ROOT) -> list[str]:
    """Add a line for every record file the ledger lacks, hashed as first committed (as it is now if
    git has not seen it); existing lines stay as they are, where they are: the new ones go at the end,
    sorted by path among themselves, so a diff against any earlier commit shows additions only (a
    re-sort moved committed lines, 2026-11-26). Returns the added lines."""
    have, bad = read_ledger(root)
    if bad and (root / "results" / LEDGER).is_file():
        raise KitError("; ".join(bad))
    todo = [r for r in record_files(root) if r not in have]
    if not todo:
        return []
    hist = history(root)[0]
    added = hist.first if hist else {}
    known = [r for r in todo if r in added]
    first = dict(zip(known, _blobs(root, [added[r][1] for r in known]))) if known else {}
    new = [f"{sha256(first[r] if first.get(r) is not None else (root / r).read_bytes())}  {r}" for r in todo]
    path = root / "results" / LEDGER
    old = path.read_text() if path.is_file() else ""
    if old and not old.endswith("\n"):
        old += "\n"
    atomic_write(path, old + "".join(l + "\n" for l in sorted(new, key=lambda l: (l[66:], l))))
    return new


# -- corrections ------------------------------------------------------------------------------

_INDEX: dict[Path, tuple[tuple, dict]] = {}


def _pointer_tokens(pointer: str) -> list[str]:
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer.split("/")[1:]]


def _load_correction(f: Path) -> dict:
    name = f"results/{CORRECTIONS}/{f.name}"
    try:
        doc = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise KitError(f"{name}: not JSON ({e})") from None
    err = first_error(doc, load_schema("correction.schema.json"))
    if err:
        raise KitError(f"{name}: {json_path(err)}: {err.message}")
    return doc


def _index(results: Path) -> dict[str, list[dict]]:
    """{'results/...': its changes in utc order}. Read once per process and per state of
    results/corrections/ (names, sizes, mtimes), so check-schemas' ~200 loads stay cheap."""
    d = results / CORRECTIONS
    files = sorted(d.glob("*.json")) if d.is_dir() else []
    key = tuple((f.name, f.stat().st_mtime_ns, f.stat().st_size) for f in files)
    hit = _INDEX.get(results)
    if hit and hit[0] == key:
        return hit[1]
    docs = sorted(((_load_correction(f), f) for f in files), key=lambda df: (df[0]["utc"], df[1].name))
    idx: dict[str, list[dict]] = {}
    for doc, f in docs:
        for c in doc["changes"]:
            idx.setdefault(c["record"], []).append({**c, "file": f"results/{CORRECTIONS}/{f.name}"})
    _INDEX[results] = (key, idx)
    return idx


def corrections_for(path) -> list[dict]:
    """The changes that apply to the record at path, in utc order (each with its correction 'file')."""
    results, rel = _locate(path)
    return _index(results).get(rel, []) if results else []


def _canon(v) -> str:
    return json.dumps(v, sort_keys=True)  # 1 != 1.0 != true, as JSON sees them


def apply_corrections(rec: dict, path) -> dict:
    """rec with every correction of path applied; KitError when a change's `was` is not what the
    record holds there (the correction is stale, or names the wrong field)."""
    changes = corrections_for(path)
    if not changes:
        return rec
    rec = copy.deepcopy(rec)
    for c in changes:
        where = f"{c['file']}: {c['record']} {c['pointer']}"
        node, tokens = rec, _pointer_tokens(c["pointer"])
        for i, t in enumerate(tokens):
            if isinstance(node, list) and t.isdigit() and int(t) < len(node):
                t = int(t)
            elif not (isinstance(node, dict) and t in node):
                raise KitError(f"{where}: stale correction: the record has no such value")
            if i == len(tokens) - 1:
                if _canon(node[t]) != _canon(c["was"]):
                    raise KitError(f"{where}: stale correction: was {_canon(c['was'])}, "
                                   f"the record holds {_canon(node[t])}")
                node[t] = copy.deepcopy(c["now"])
            else:
                node = node[t]
    return rec


# -- checks -----------------------------------------------------------------------------------

def ledger_problems(root: Path = ROOT) -> list[str]:
    """Each record has one ledger line, and its bytes hash to it."""
    have, out = read_ledger(root)
    files = record_files(root)
    for rel in files:
        hs = have.get(rel)
        if not hs:
            out.append(f"{rel}: not in results/{LEDGER} (run: python -m scripts.kit ledger)")
        elif len(hs) > 1:
            out.append(f"{rel}: {len(hs)} different lines in results/{LEDGER}; a record has one")
        elif sha256((root / rel).read_bytes()) not in hs:
            out.append(f"{rel}: bytes differ from the ledger (sha256 {next(iter(hs))[:12]}); a committed record "
                       f"is never edited: restore its bytes and write a correction (results/{CORRECTIONS}/)")
    out += [f"{rel}: in results/{LEDGER} but the file is gone" for rel in sorted(set(have) - set(files))]
    return out


def history_problems(root: Path = ROOT) -> list[str]:
    """Git is the ledger's witness. Every record and correction git has seen is still here with the
    bytes of its first commit (so an edit cannot be hidden by rehashing its ledger line, 2026-11-26),
    and the ledger keeps every line as first committed and every line of HEAD's: it only grows."""
    hist, why = history(root)
    if hist is None:
        print(f"check-schemas: {why}: records not checked against git history", file=sys.stderr)
        return []
    out = []
    for rel, (commit, blob) in sorted(hist.first.items()):
        if not (_is_record(rel) or _is_correction(rel)):
            continue
        what = "record" if _is_record(rel) else "correction"
        f = root / rel
        if not f.is_file():
            out.append(f"{rel}: a committed {what} (first added in {commit[:12]}) is gone: one is never deleted "
                       f"(restore it: git show {commit[:12]}:{rel})")
        elif _blob_id(f.read_bytes(), blob) != blob:
            out.append(f"{rel}: bytes differ from those first committed ({commit[:12]}): a committed {what} is "
                       f"never edited, nor its ledger line: restore it (git show {commit[:12]}:{rel}) and write "
                       f"a correction (results/{CORRECTIONS}/)")
    ledger = root / "results" / LEDGER
    now = set(ledger.read_text().splitlines()) if ledger.is_file() else set()
    specs = hist.ledgers + ([f"HEAD:results/{LEDGER}"] if hist.ledgers else [])
    versions = [(b or b"").decode(errors="replace").splitlines() for b in _blobs(root, specs)] if specs else []
    first_line: dict[str, str] = {}
    for lines in versions[:-1]:
        for line in lines:
            m = LINE_RE.fullmatch(line)
            if m:
                first_line.setdefault(m[2], line)
    gone = {m[2]: "as first committed" for m in map(LINE_RE.fullmatch, first_line.values()) if m[0] not in now}
    for m in map(LINE_RE.fullmatch, versions[-1] if versions else []):
        if m and m[0] not in now:
            gone.setdefault(m[2], "at HEAD")
    out += [f"results/{LEDGER}: the line for {rel} {when} is gone or changed: the ledger only grows "
            f"(restore the line: git log -p -- results/{LEDGER})" for rel, when in sorted(gone.items())]
    return out


# The commit from which the probe keeps every request's samples in latency records (check-schemas then
# recomputes their percentiles). A latency record without samples is one git saw before it, or made up.
SAMPLES_SINCE = "2c2e49bf7cd64a998b01b1a1e1d9c6f5cc81eef2"


def unsampled_problems(rels: list[str], root: Path = ROOT, since: str = SAMPLES_SINCE) -> list[str]:
    """rels: latency records that keep no per-request samples. Each must have been first committed no
    later than `since` (issue 30: a made-up record with no samples, once in the ledger, reached
    docs/results.md). Without git history (history_problems says so) nothing is checked."""
    hist, _ = history(root)
    if not rels or hist is None:
        return []
    firsts = sorted({hist.first[r][0] for r in rels if r in hist.first} | {since})
    when = _commits(root, firsts)
    if since not in when:
        return [f"{since[:12]} (ledger.SAMPLES_SINCE) is not a commit of this repository: latency records without "
                f"samples cannot be dated"]
    return [f"{rel}: keeps no per-request samples, and " + (
            f"was first committed after {since[:12]}, since which the probe keeps them" if rel in hist.first
            else "git has not seen it: a new latency record keeps them (a record without them is not a measurement)")
            for rel in rels if rel not in hist.first or when.get(hist.first[rel][0], 0) > when[since]]


def correction_problems(root: Path = ROOT) -> list[str]:
    d = root / "results" / CORRECTIONS
    records = set(record_files(root))
    out = []
    for f in sorted(d.glob("*.json")):
        rel = f"results/{CORRECTIONS}/{f.name}"
        if not CORRECTION_NAME_RE.fullmatch(f.name):
            out.append(f"{rel}: a correction is named <UTC stamp>-<slug>.json (e.g. 20261125T180000Z-git-commit.json)")
        try:
            doc = _load_correction(f)
        except KitError as e:
            out.append(str(e))
            continue
        out += [f"{rel}: changes[{i}].record {c['record']} is not a record file"
                for i, c in enumerate(doc["changes"]) if c["record"] not in records]
    return out


def _commits(root: Path, shas: list[str]) -> dict[str, int]:
    """{sha: committer time} for the shas that are commits here; one `git cat-file --batch` call."""
    raw = _blobs(root, [f"{s}^{{commit}}" for s in shas])
    out = {}
    for s, body in zip(shas, raw):
        m = body and re.search(rb"^committer .* (\d+) [+-]\d{4}$", body, re.M)
        if m:
            out[s] = int(m[1])
    return out


def commit_problems(root: Path = ROOT) -> list[str]:
    """provenance.git_commit (after corrections) is a full commit of this repository, no newer than
    the record. "unknown" passes only where a correction set it, saying why."""
    if not _has_history(root):
        print(f"check-schemas: {root} has no .git: records' git_commit not checked", file=sys.stderr)
        return []
    if _git(root, "rev-parse", "--is-shallow-repository").strip() == b"true":
        print("check-schemas: shallow clone: records' git_commit not checked (git fetch --unshallow)", file=sys.stderr)
        return []
    prov, code = {}, {}
    for rel in record_files(root):
        try:
            p = apply_corrections(json.loads((root / rel).read_text()), root / rel)["provenance"]
            prov[rel] = (str(p["git_commit"]), str(p["utc"]))
            if p.get("code_sha256"):
                code[rel] = str(p["code_sha256"])
        except (KitError, ValueError, KeyError, TypeError):
            continue  # check.py's load_record names what is wrong with it
    shas = sorted({c for c, _ in prov.values() if SHA_RE.fullmatch(c)})
    when = _commits(root, shas) if shas else {}
    out = []
    for rel, (sha, utc) in prov.items():
        if sha == "unknown" and any(c["pointer"] == "/provenance/git_commit" and c["now"] == "unknown"
                                    for c in corrections_for(root / rel)):
            continue
        if not SHA_RE.fullmatch(sha):
            out.append(f"{rel}: provenance.git_commit {sha!r} is not a full commit sha "
                       f"(if git history tells the commit, write a correction: results/{CORRECTIONS}/)")
        elif sha not in when:
            out.append(f"{rel}: provenance.git_commit {sha[:12]} is not a commit of this repository")
        else:
            try:
                t = datetime.strptime(utc, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
            except ValueError:
                continue  # the schema's pattern reports it
            if t + CLOCK_TOLERANCE_S < when[sha]:
                made = datetime.fromtimestamp(when[sha], timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
                out.append(f"{rel}: provenance.utc {utc} is older than its git_commit {sha[:12]} (committed "
                           f"{made}): a record cannot come from code that did not exist yet")
    digests: dict[str, str] = {}
    for rel, have in code.items():
        sha = prov[rel][0]
        if sha not in when:
            continue  # named above
        if sha not in digests:
            digests[sha] = commit_code_sha256(root, sha)
        if digests[sha] != have:
            out.append(f"{rel}: provenance.code_sha256 is not the code of its git_commit {sha[:12]}: the tree that ran "
                       f"differed from that commit (a stale .git on the copy, or uncommitted code); if another commit's "
                       f"code matches, write a correction naming it (results/{CORRECTIONS}/)")
    return out


def commit_code_sha256(root: Path, sha: str) -> str:
    """record.code_digest of a commit's code files, read from git (one ls-tree, one cat-file --batch)."""
    from .record import code_digest, is_code
    names = [n for n in _git(root, "ls-tree", "-r", "--name-only", sha, "--", "scripts", "sitecustomize.py")
             .decode().splitlines() if is_code(n)]
    return code_digest(zip(names, (b or b"" for b in _blobs(root, [f"{sha}:{n}" for n in names]))))


def problems(root: Path = ROOT) -> list[str]:
    """check-schemas' immutability checks: ledger, corrections, git_commit. One line per problem."""
    return ledger_problems(root) + history_problems(root) + correction_problems(root) + commit_problems(root)
