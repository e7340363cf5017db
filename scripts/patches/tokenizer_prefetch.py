"""KIT_TOKENIZER_PREFETCH=1: the API server reads its tokenizer pickle ahead, in a thread, while it still imports (issue 32).

Why: with KIT_TOKENIZER_CACHE (tokenizer_cache.py) the API process still reads the pickle on the start's path, before
it launches the engine: 0.91-1.05 s for Qwen3.5 on an H200 (session 20261128T1236Z, the server logs), inside the
1.57 s "API: tokenizer, engine launch" phase of the best warm start. The read is mostly the tokenizers library
rebuilding its Rust tokenizer from the JSON the pickle holds, and that work runs outside Python's lock (a quick check on
this kit's CPU host, not a record: a thread unpickling Qwen3.5's tokenizer barely slowed the main thread). The API process
imports for 9 s before it needs the tokenizer, on a host with cores to spare.

What changes, in the API server process only (the `-m vllm.entrypoints.openai.api_server` or `vllm serve` one; the
engine and its workers never load the tokenizer this way):
1. When vLLM's tokenizer module (vllm.tokenizers.hf) has been imported, late in the API process's imports,
   the kit reads <KIT_TOKENIZER_CACHE>/last.json: the pickle the last start's load read, and the modules its classes
   come from. The main thread imports those modules (so the thread never imports: two threads importing at once
   can deadlock) and starts a daemon thread that unpickles the pickle, resolving classes from sys.modules only.
2. vLLM's tokenizer load (tokenizer_cache.load) computes its key as before. If it is last.json's key, it waits for
   the thread and returns that tokenizer; otherwise, or if the read-ahead failed, it reads the pickle as before.
   The tokenizer is the same object a read in place would give; only when it is read changes.
No last.json (the first start after a bake writes the pickle; the next hit notes it), a pickle gone, or a key that
moved: the start loads as KIT_TOKENIZER_CACHE does, and says why on stderr.
"""
from __future__ import annotations

import importlib
import json
import os
import pickle
import sys
import threading
import time
from pathlib import Path

from scripts.kit.variant import SERVER_MAINS
from scripts.patches import tokenizer_cache as TC

ENV = "KIT_TOKENIZER_PREFETCH"
TRIGGER = "vllm.tokenizers.hf"


def is_api_server(orig_argv: list[str]) -> bool:
    """True for the API server's command line: `python -m <module>` for a module the kit starts servers with
    (scripts/kit/variant.py SERVER_MAINS: vLLM's API server or the kit's wrapper of it), or `vllm serve ...`."""
    for i, a in enumerate(orig_argv[:-1]):
        if a == "-m" and orig_argv[i + 1] in SERVER_MAINS.values():
            return True
    return any(os.path.basename(a) == "vllm" and orig_argv[i + 1:i + 2] == ["serve"] for i, a in enumerate(orig_argv))


class _FromLoaded(pickle.Unpickler):
    """Resolves a pickle's classes from modules already imported, never importing one (from a thread)."""

    def find_class(self, module, name):
        mod = sys.modules.get(module)
        obj = vars(mod).get(name) if mod is not None else None  # vars: no module __getattr__ (lazy imports)
        if obj is None:
            raise pickle.UnpicklingError(f"{module}.{name} is not loaded")
        return obj


def _read(job: dict, f: Path) -> None:
    t0 = time.monotonic()
    try:
        with open(f, "rb") as fh:
            job["tok"] = _FromLoaded(fh).load()
    except Exception as e:  # whatever it is, the load in place reads the pickle as before and says so
        job["error"] = f"{type(e).__name__}: {e}"
    job["read_s"] = time.monotonic() - t0


def start(cache_dir: Path) -> str:
    """Start the read-ahead of last.json's pickle; returns what happened, in words (also on stderr where it did not)."""
    try:
        last = json.loads((cache_dir / TC.LAST).read_text())
        k, modules = last["key"], list(last["modules"])
        f = cache_dir / f"{k}.pkl"
        if not f.is_file():
            raise FileNotFoundError(f"{f} is gone")
        for m in modules:
            importlib.import_module(m)
    except FileNotFoundError as e:
        why = f"nothing to read ahead ({e})"
        print(f"kit: {ENV}: {why}", file=sys.stderr)
        return why
    except Exception as e:
        why = f"no read-ahead ({cache_dir / TC.LAST}: {type(e).__name__}: {e})"
        print(f"kit: {ENV}: {why}", file=sys.stderr)
        return why
    job = {"key": k}
    job["thread"] = threading.Thread(target=_read, args=(job, f), name="kit-tokenizer-prefetch", daemon=True)
    TC._ahead["job"] = job
    job["thread"].start()
    return f"reading {f} ahead"


def install() -> None:
    if not os.environ.get(TC.ENV):
        print(f"kit: {ENV} is set without {TC.ENV}: there is no pickle to read ahead", file=sys.stderr)
        return
    if not is_api_server(list(getattr(sys, "orig_argv", sys.argv))):
        return
    from scripts.patches.on_import import after_import
    after_import(TRIGGER, lambda module: start(Path(os.environ[TC.ENV])))
