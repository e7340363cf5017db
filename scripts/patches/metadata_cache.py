"""KIT_METADATA_CACHE=<dir>: importlib.metadata.packages_distributions() is read from a file in <dir> (issue 32).

Why: transformers calls packages_distributions() at the top of transformers/utils/import_utils.py, which every
process of a vLLM server imports. It opens every installed distribution's metadata (top_level.txt, else its
RECORD) to map import names to distributions, and a GPU host's Python holds hundreds of them, torch's and vLLM's
RECORDs among the largest. In the H200 start profile of session 20261129T0735Z
(results/profiles/20261129T075238Z-qwen3.5-4b-bf16-tuned-dvg-quick6-startprof.speedscope.json.gz) it was 1.05 s of
the API process's samples and 1.20 s of the pre-started engine's, both on the start's path.

What changes: when importlib.metadata is first imported, its packages_distributions is wrapped. A call looks for
<dir>/packages-<key>.json and returns what it holds; otherwise it calls the real function and writes the file
(atomically) for the next process. The key is the Python version and every sys.path entry with its directory's
modification time and inode: installing or removing a distribution adds or removes a *.dist-info (or .egg-info)
directory in one of them, which changes that directory's mtime, so the next call misses and maps afresh. What the
key does not see: a distribution's top_level.txt or RECORD edited in place, without an install. A file that cannot
be read or written is passed over: the real function answers. A miss that writes a file keeps the newest KEEP
files in <dir> and removes the rest.

The file is the kit's product in the variant's cache root (weights/cache/<variant>/kit-metadata/), beside the
compile cache.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
from pathlib import Path

ENV = "KIT_METADATA_CACHE"
TARGET = "importlib.metadata"
_MARK = "_kit_metadata_cache"
KEEP = 8  # mappings kept in <dir>, newest first


def key(path=None) -> str:
    parts = [sys.version]
    for p in (sys.path if path is None else path):
        try:
            st = os.stat(p or ".")
            parts.append([p, st.st_mtime_ns, st.st_ino])
        except OSError:
            parts.append([p, None, None])
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


def cached(real, where: Path):
    @functools.wraps(real)
    def packages_distributions():
        f = where / f"packages-{key()}.json"
        try:
            got = json.loads(f.read_text())
            if isinstance(got, dict):
                return got
        except (OSError, ValueError):
            pass
        got = real()
        try:
            from scripts.kit.paths import atomic_write
            atomic_write(f, json.dumps(got, sort_keys=True))
            _prune(where)
        except OSError as e:
            print(f"kit: {ENV}: {f} not written ({e}); the mapping is made again next time", file=sys.stderr)
        return got
    setattr(packages_distributions, _MARK, True)
    return packages_distributions


def _prune(where: Path, keep: int = KEEP) -> None:
    """The newest `keep` files stay: a key that moves (a folder on the path touched) would otherwise add one a start."""
    files = sorted(where.glob("packages-*.json"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for old in files[keep:]:
        old.unlink(missing_ok=True)


def _patch(mod) -> None:
    fn = getattr(mod, "packages_distributions", None)
    if fn is None or getattr(fn, _MARK, False):
        return
    mod.packages_distributions = cached(fn, Path(os.environ[ENV]))


def install() -> None:
    from scripts.patches.on_import import after_import
    after_import(TARGET, _patch)
